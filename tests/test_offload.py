"""Activation offloading (``offload_layers``: Megatron-Core ``cpu_offloading_num_layers``, Transformer Engine's
offload schedule) checked against independent truths: the schedule's exposed time against a longest path through
the same dependencies built as a graph, the fully synchronous case (N = L - 1) in closed form, the memory against
TE's own statement of what a stage holds ("(num_layers - num_offloaded_layers) * T"), the layout rules against
megatron-core's ``TransformerConfig`` itself, and the export against the flags megatron-core reads."""
from __future__ import annotations

import random

import networkx as nx
import pytest

from meshplan.core.errors import MeshplanError
from meshplan.planner.cluster.spec import load_cluster
from meshplan.planner.estimate.base import Workload
from meshplan.planner.estimate.memory import activation_bytes_per_layer, layer_shape, saved_input_bytes
from meshplan.planner.estimate.offload import offload_exposed_s
from meshplan.planner.estimate.select import estimator_for
from meshplan.planner.export import render
from meshplan.planner.layout.layout import Degrees, Layout
from meshplan.planner.model.config import load_model
from tests.test_export_golden import ALL_PLANS
from tests.test_export_parsers import BASH, _argv, _megatron_args, _torchrun_parse


def _longest_path(fwd, bwd, copy, n):
    """Finish times of the forward and backward as the longest path of a dependency graph: compute in order,
    one copy stream in order, each copy after its layer's compute (forward) or at its start point (backward), and
    the compute waiting for a copy at its deadline (TE ``OffloadSynchronizer._default_offload_sync_init``)."""
    L, keep = len(fwd), len(fwd) - n
    g = nx.DiGraph()

    def chain(nodes):  # start and end of each item in order: each item starts after the one before it ends
        for a, b in zip(nodes[1::2], nodes[2::2]):
            g.add_edge(a, b, w=0.0)

    # forward: node ("f", j, "s"/"e") start and end of layer j; ("o", i, ...) its copy
    for j in range(L):
        g.add_edge(("f", j, "s"), ("f", j, "e"), w=fwd[j])
    chain([x for j in range(L) for x in (("f", j, "s"), ("f", j, "e"))])
    for i in range(n):
        g.add_edge(("o", i, "s"), ("o", i, "e"), w=copy[i])
        g.add_edge(("f", i, "e"), ("o", i, "s"), w=0.0)
        g.add_edge(("o", i, "e"), ("f", keep + i, "s"), w=0.0)
    chain([x for i in range(n) for x in (("o", i, "s"), ("o", i, "e"))])
    # backward, layers L-1 .. 0; the reload of i starts when layer L-1-N+i's backward does
    # ("b", k, "t"): layer k's backward step is reached (reloads start here), "s": its compute starts
    order = list(range(L - 1, -1, -1))
    for k in order:
        g.add_edge(("b", k, "t"), ("b", k, "s"), w=0.0)
        g.add_edge(("b", k, "s"), ("b", k, "e"), w=bwd[k])
    chain([x for k in order for x in (("b", k, "t"), ("b", k, "e"))])
    for i in range(n - 1, -1, -1):
        g.add_edge(("r", i, "s"), ("r", i, "e"), w=copy[i])
        g.add_edge(("b", keep - 1 + i, "t"), ("r", i, "s"), w=0.0)
        g.add_edge(("r", i, "e"), ("b", i, "s"), w=0.0)
    chain([x for i in range(n - 1, -1, -1) for x in (("r", i, "s"), ("r", i, "e"))])

    def finish(kind, last):
        sub = g.subgraph([v for v in g if v[0] in kind])
        dist = {}
        for v in nx.topological_sort(sub):
            dist[v] = max((dist[u] + sub.edges[u, v]["w"] for u in sub.predecessors(v)), default=0.0)
        return dist[last]

    return finish(("f", "o"), ("f", L - 1, "e")), finish(("b", "r"), ("b", 0, "e"))


def test_schedule_matches_the_dependency_graph() -> None:
    rng = random.Random(7)
    for _ in range(200):
        L = rng.randint(2, 12)
        n = rng.randint(1, L - 1)
        fwd = [rng.uniform(0.5, 2.0) for _ in range(L)]
        bwd = [rng.uniform(1.0, 4.0) for _ in range(L)]
        copy = [rng.uniform(0.0, 5.0) for _ in range(L)]
        f_end, b_end = _longest_path(fwd, bwd, copy, n)
        got = offload_exposed_s(fwd, bwd, copy, n)
        assert got == pytest.approx((f_end - sum(fwd), b_end - sum(bwd)), abs=1e-9)


def test_every_layer_but_one_offloaded_waits_for_every_copy() -> None:
    """N = L - 1: each copy's deadline is the next layer, each reload starts at its own layer's backward, so every
    copy is exposed in both directions."""
    fwd, bwd, copy = [1.0] * 6, [2.0] * 6, [0.3, 0.1, 0.2, 0.4, 0.5, 9.0]
    assert offload_exposed_s(fwd, bwd, copy, 5) == pytest.approx((1.5, 1.5))


def test_copies_shorter_than_a_layer_hide() -> None:
    assert offload_exposed_s([1.0] * 8, [2.0] * 8, [0.9] * 8, 4) == (0.0, 0.0)


def _work(cluster: str, dtype: str = "bf16") -> Workload:
    return Workload(load_model("llama-3.1-8b-instruct"), load_cluster(cluster), 64, 8192, dtype)


def _layout(**kw) -> Layout:
    return Layout.of(Degrees(dp_shard=8), micro_batch=1, zero_stage=3, **kw)


def test_stage_holds_the_layers_not_offloaded() -> None:
    """TE: "peak memory usage of saving activations is (num_layers - num_offloaded_layers) * T"."""
    work = _work("2x4xGB200-NVL72")
    est = estimator_for(work.cluster)
    base = est.estimate(work, _layout())
    off = est.estimate(work, _layout(offload_layers=20))
    model = work.model
    t = activation_bytes_per_layer(layer_shape(model, 0), 8192, 1, _layout(), saved_input_bytes("none"), "none")
    # the runtime terms hold back a share of the activations for fragmentation: compare the activations alone
    assert base.memory.activations_bytes - off.memory.activations_bytes == pytest.approx(20 * t, rel=1e-6)
    assert off.step_time_s >= base.step_time_s


def test_slower_host_link_exposes_more() -> None:
    """The same job on a PCIe Gen5 host link (B200) waits at least as long for its copies as on NVLink-C2C."""
    times = []
    for cluster in ("1x8xB200", "2x4xGB200-NVL72"):
        work = _work(cluster)
        est = estimator_for(work.cluster)
        times.append(est.estimate(work, _layout(offload_layers=31)).exposed_comm_s
                     - est.estimate(work, _layout()).exposed_comm_s)
    assert times[0] > times[1] >= 0.0


def test_a_part_without_a_catalogued_host_link_is_refused_by_name() -> None:
    """The copies are priced on the part's host link: an A100's (PCIe Gen4 x16, the A100 datasheet's 64 GB/s both
    ways) prices them; a part whose host link the catalogue lacks (T4) is refused in one line naming the part."""
    from meshplan.costmodel.devices import get_device

    assert get_device("A100-80GB").host_bw_bytes_per_s == 64e9 / 2  # "PCIe Gen4: 64GB/s", both directions
    work = _work("1x8xA100-80GB")
    assert estimator_for(work.cluster).estimate(work, _layout(offload_layers=4)).step_time_s > 0
    work = _work("1x8xT4", dtype="fp16")
    with pytest.raises(MeshplanError, match="host link of T4 is not in the device catalogue"):
        estimator_for(work.cluster).estimate(work, _layout(offload_layers=4))


@pytest.mark.parametrize("model, cluster, batch, seq, dtype, task, stack", [
    # three requests bench/plan_fuzz.py (seeds 10, 11, 14, --per-model 30) found crashing: the search's bounds
    # priced pipelined layouts (pp=24: a stage of one layer; a stage of two; interleaved chunks of one layer) with two
    # layers offloaded, more than a stage or its first chunk holds; validation refuses every pipelined layout with
    # offload, but the bounds come first
    ("gpt-oss-20b", "3x8xB200", 4096, 131072, "nvfp4", "pretrain", None),
    ("mixtral-8x7b-v0.1", "20x4xGB300-NVL72", 240, 4096, "fp8", "sft", None),
    ("gpt-oss-120b", "3x4xGB200-NVL72", 240, 2048, "bf16", "pretrain", "megatron-lm"),
])
def test_a_pinned_offload_plans_or_is_refused_in_one_line(tmp_path, model, cluster, batch, seq, dtype, task,
                                                          stack) -> None:
    from meshplan.planner.search.job import PlanRequest, plan_job

    try:
        out = plan_job(PlanRequest.of(model, cluster, batch, seq, fix="offload_layers=2", dtype=dtype, task=task,
                                      stack=stack, out=tmp_path / "plan.yaml"))
    except MeshplanError as exc:
        assert "\n" not in str(exc) and "offload_layers=2 with pp=" in str(exc)
        return
    assert out.plan.offload_layers == 2 and out.plan.degrees.pp == 1


def test_a_stage_offloads_fewer_layers_than_it_holds() -> None:
    """Transformer Engine offloads fewer layers than a stage holds (Megatron-Core: "CPU offloading can be done
    only for layers less than num_layers"): two pinned on stages of 1, 2 and 10 layers."""
    from meshplan.planner.estimate.base import first_layers, offloaded_layers

    lay = _layout(offload_layers=2)
    assert [offloaded_layers(lay, n) for n in (1, 2, 10)] == [0, 1, 2]
    # the first two a stage runs: an interleaved stage of one-layer chunks 0 and 5 offloads both; one chunk its first
    assert first_layers((range(0, 1), range(5, 6)), 2) == (range(0, 1), range(5, 6))
    assert first_layers((range(8, 16),), 2) == (range(8, 10),)


def _megatron_refuses(**kw) -> bool:
    from megatron.core.transformer import TransformerConfig

    try:
        TransformerConfig(num_layers=8, hidden_size=64, num_attention_heads=4, cpu_offloading=True, **kw)
    except ValueError:
        return True
    return False


@pytest.mark.parametrize("n,pp,recompute", [(4, 1, "none"), (7, 1, "none"), (8, 1, "none"), (4, 2, "none"),
                                            (4, 1, "full"), (4, 1, "selective")])
def test_layout_rules_are_megatron_cores(n: int, pp: int, recompute: str) -> None:
    pytest.importorskip("megatron.core")
    kw = {"cpu_offloading_num_layers": n, "pipeline_model_parallel_size": pp}
    if recompute != "none":
        kw.update(recompute_granularity=recompute, recompute_method="uniform" if recompute == "full" else None,
                  recompute_num_layers=1 if recompute == "full" else None)
    lay = Layout.of(Degrees(dp_shard=8 // pp, pp=pp), micro_batch=1, zero_stage=1, recompute=recompute,
                    offload_layers=n)
    try:
        lay.validate(world_size=8, num_layers=8, num_heads=4, num_kv_heads=4, seq_len=1024, global_batch=64)
        refused = False
    except MeshplanError:
        refused = True
    assert refused == _megatron_refuses(**kw)


@pytest.mark.skipif(BASH is None, reason="bash not available")
def test_megatron_export_sets_the_offload_flags(tmp_path) -> None:
    """The rendered flags, as bash and torchrun's parser hand them to pretrain_gpt.py and read into megatron-core's
    config under their field names, turn offloading on for the plan's layers."""
    pytest.importorskip("megatron.core")
    from megatron.core.transformer import TransformerConfig

    plan = ALL_PLANS["fsdp8b"]().model_copy(update={"recompute": "none", "offload_layers": 12})
    ns = _torchrun_parse(_argv(render(plan, "megatron").text, tmp_path, {"HEAD_NODE": "node-a", "NODE_RANK": "0"}))
    args = _megatron_args(ns.training_script_args)
    assert args["--cpu-offloading"] is True
    cfg = TransformerConfig(num_layers=plan.model.num_layers, hidden_size=64, num_attention_heads=4,
                            cpu_offloading=True, cpu_offloading_num_layers=int(args["--cpu-offloading-num-layers"]))
    assert cfg.cpu_offloading_num_layers == 12
    with pytest.raises(MeshplanError, match="offload_layers=12"):
        render(plan.model_copy(update={"recompute": "full"}), "megatron")


@pytest.mark.parametrize("target", ["torchrun", "deepspeed", "accelerate", "torchtitan", "slurm", "kubeflow"])
def test_other_targets_name_it(target: str) -> None:
    plan = ALL_PLANS["fsdp8b"]().model_copy(update={"recompute": "none", "offload_layers": 12})
    assert any("offload_layers=12" in w for w in render(plan, target).warnings)
