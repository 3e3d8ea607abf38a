"""A free search tries activation offloading (``offload_layers``) beside recompute=none, checked against
independent truths: its best equals the brute-force best over the same choices pinned one by one, every offload
member it enumerates is one megatron-core's own ``TransformerConfig`` accepts, and where offloading saves no time
the simpler layout wins the tie."""
from __future__ import annotations

import itertools

import pytest

from meshplan.core.errors import MeshplanError
from meshplan.planner.cluster.spec import load_cluster
from meshplan.planner.estimate.base import Workload
from meshplan.planner.estimate.select import estimator_for
from meshplan.planner.layout.space import Pins, enumerate_groups, offload_choices, offload_priced
from meshplan.planner.model.config import load_model
from meshplan.planner.search.exact import search

# Megatron-Bridge's own Llama 3 70B preset on GB200 offloads 40 of 80 layers at this mesh
# (LLAMA3_70B_PRETRAIN_CONFIG_GB200_FP8_CS_V1, llama3_workload_base_configs.py v0.3.1 to v0.5.0)
MESH = {"dp": 64, "tp": 1, "pp": 1, "cp": 1, "mbs": 2, "zero": 3}
GB, SEQ = 256, 8192


@pytest.fixture(scope="module")
def gb200():
    cluster = load_cluster("16x4xGB200-NVL72")
    work = Workload(load_model("llama-3.1-70b"), cluster, GB, SEQ, "fp8")
    return work, estimator_for(cluster)


def test_search_best_is_the_brute_force_best(gb200):
    """The free search's best against every (recompute, offload) choice pinned in turn and priced on its own."""
    work, est = gb200
    best, best_est = search(work, fix=MESH, estimator=est, top=1).ranked[0]
    tried, unfit = [], []
    for rc, n in itertools.chain((("none", n) for n in (0, 20, 40)), ((r, 0) for r in ("selective", "full"))):
        try:
            res = search(work, fix={**MESH, "recompute": rc, "offload_layers": n}, estimator=est, top=1)
        except MeshplanError:  # fits nowhere
            unfit.append((rc, n))
            continue
        tried.append((res.ranked[0][1].step_time_s, rc, n))
    brute = min(tried)
    assert best_est.step_time_s == pytest.approx(brute[0], rel=1e-9)
    assert (best.recompute, best.offload_layers) == brute[1:]
    # the preset's choice: recompute=none holds no whole 80 layers' activations here, offloading makes it fit
    assert best.offload_layers > 0 and best.recompute == "none"
    assert ("none", 0) in unfit


def test_no_offload_where_it_saves_nothing():
    """Llama 3.1 8B on two GB200 trays fits without offloading: its offloaded twin prices the same step (the copies
    hide under the layers' compute on NVLink-C2C), and the search keeps the layout that does not offload."""
    cluster = load_cluster("2x4xGB200-NVL72")
    work = Workload(load_model("llama-3.1-8b"), cluster, 32, 4096, "bf16")
    est = estimator_for(cluster)
    best, best_est = search(work, estimator=est, top=1).ranked[0]
    assert best.offload_layers == 0 and best.recompute == "none" and best.pp == 1
    twin = best.with_(offload_layers=8)
    assert est.estimate(work, twin).step_time_s == pytest.approx(best_est.step_time_s, rel=1e-3)


def test_offload_searched_on_grace_hosts_only():
    """The free search offloads behind NVLink-C2C (Grace), not behind PCIe, whose node-shared DRAM and switches the
    copies' price leaves out: on H100 nodes Llama 3.1 70B at 128k tokens gets no offloading member at all."""
    assert offload_priced(load_cluster("1x4xGB200-NVL72").device)
    assert offload_priced(load_cluster("1x4xGB300-NVL72").device)
    for spec in ("1x8xH100", "1x8xB200", "1x8xB300"):
        assert not offload_priced(load_cluster(spec).device)
    cluster = load_cluster("8x8xH100")
    work = Workload(load_model("llama-3.1-70b"), cluster, 64, 131072, "bf16")
    res = search(work, estimator=estimator_for(cluster), top=5)
    assert all(lay.offload_layers == 0 for lay, _ in res.ranked)


@pytest.mark.parametrize("fix,pp,stack,expect", [
    ({}, 1, "megatron", (20, 40)),
    ({}, 2, "megatron", ()),                       # no CPU offloading under pipeline parallelism
    ({}, 1, "torchtitan", ()),                     # Megatron-Core's, not torchtitan's
    ({"recompute": "full"}, 1, "megatron", ()),    # nor with recomputation
    ({"offload_layers": 10}, 1, "megatron", ()),   # a pinned count is the user's
])
def test_offload_choices(fix, pp, stack, expect):
    assert offload_choices(Pins.of(fix), 80, pp, stack) == expect


def test_enumerated_offload_is_what_megatron_core_accepts():
    """Every offloading member a free search enumerates (any mesh, any recompute variant beside it) is accepted by
    megatron-core's ``TransformerConfig``, with its recomputation and pipeline size."""
    pytest.importorskip("megatron.core")
    from megatron.core.transformer import TransformerConfig

    model = load_model("llama-3.1-8b")
    members = [lay for g in enumerate_groups(model, 16, 8, 64, 4096, Pins.of({}), offload=True) for lay in g.layouts()
               if lay.offload_layers]
    assert members, "a free search on a node with a host link tries offloading"
    for lay in {(m.offload_layers, m.pp, m.recompute, m.cuda_graphs) for m in members}:
        n, pp, rc, graphs = lay
        assert rc == "none" and graphs == "none"
        TransformerConfig(num_layers=model.num_layers, hidden_size=64, num_attention_heads=4, cpu_offloading=True,
                          cpu_offloading_num_layers=n, pipeline_model_parallel_size=pp)
