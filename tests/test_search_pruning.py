"""The pruned layout search (branch and bound, ``planner.search.exact`` module notes) finds what pricing every candidate
finds: the same best layout and the same top-K, on spaces small enough to price in full here (issue 12 item 7).

Each case covers decisions of issue 12: recompute variants with full:N, cp_kind (CP over a 32k sequence), MoE
etp / ep / moe_overlap, fp8 recipes, uneven interleaved pipelines (pp=3 over 80 layers).
"""
from __future__ import annotations

import pytest

from meshplan.core.errors import MeshplanError
from meshplan.planner.cluster.spec import load_cluster
from meshplan.planner.estimate.base import Workload
from meshplan.planner.estimate.select import estimator_for
from meshplan.planner.model.config import load_model
from meshplan.planner.search.exact import search

CASES = [  # model, cluster, global batch, seq, dtype, pins
    ("llama-3.1-8b", "2x8xH100", 16, 8192, "bf16", {}),
    ("llama-3.1-8b", "2x8xH100", 8, 32768, "bf16", {}),
    ("mixtral-8x7b", "4x8xH100", 32, 4096, "bf16", {"pp": 1, "cp": 1}),
    ("qwen3-30b-a3b", "4x8xH100", 32, 4096, "fp8", {"tp": 2, "pp": 4, "cp": 1, "mbs": 1}),
    ("llama-3.1-70b", "3x8xH100", 48, 4096, "bf16", {"pp": 3}),
    # MoE over 16 nodes with ZeRO-3 gathers that compute hides: here recomputation makes some steps shorter (more
    # compute to hide the gathers behind), which the bounds must not assume away
    ("qwen3-30b-a3b", "16x8xH100", 128, 4096, "bf16", {"tp": 1, "pp": 1, "cp": 1, "mbs": 1}),
    # MoE and dense layers over an uneven pipeline (pp=3 over 32 layers: 11+11+10 by Megatron's split)
    ("mixtral-8x7b", "3x8xH100", 48, 4096, "bf16", {"pp": 3, "cp": 1, "tp": 2}),
    # layers kept in bf16 under MXFP8 (bf16_first_layers / bf16_last_layers): priced apart from the recipe's
    ("llama-3.1-8b", "2x8xB200", 16, 8192, "fp8", {"fp8": "mxfp8", "bf16_first_layers": 2, "bf16_last_layers": 3}),
    # the fp8 recipe free on Blackwell (tensor-wise and MXFP8 bounded by their delayed twin) with moe_overlap free
    ("qwen3-30b-a3b", "2x4xGB200-NVL72", 64, 4096, "fp8", {"pp": 1, "cp": 1, "mbs": 1}),
    # FSDP2 under torch.distributed.pipelining (NeMo AutoModel's MoE runs): a stage held whole beside its shards, so
    # an unsharded part holds less than a sharded one (HSDP 4x4 at ep 8: experts unsharded) and memory does not grow
    # as sharding falls; the search prices those members rather than falling back to pricing the whole space
    ("mixtral-8x7b", "8x8xH100", 512, 4096, "bf16", {"fsdp": "torch", "zero": 3, "pp": 2, "vpp": 2, "cp": 2, "tp": 1,
                                                     "ep": 8, "mbs": 1, "optim_dtype": "bf16", "reduce_dtype": "fp32",
                                                     "moe_dispatcher": "deepep", "moe_impl": "automodel",
                                                     "pp_overlap": False}),
]


@pytest.mark.parametrize("model,cluster,gb,seq,dtype,fix", CASES, ids=[f"{c[0]}-{c[1]}-{c[3]}" for c in CASES])
def test_pruned_search_equals_exhaustive(model, cluster, gb, seq, dtype, fix):
    work = Workload(load_model(model), load_cluster(cluster), gb, seq, dtype)
    est = estimator_for(work.cluster)
    full = search(work, fix, top=10, estimator=est, prune=False)
    seen: list[int] = []
    fast = search(work, fix, top=10, estimator=est, prune=True, progress=seen.append)
    assert fast.pruned and not fast.fallback, fast.fallback
    # the progress line counts every layout looked at, priced or timed out of the ranking, and ends on the total
    assert seen == sorted(seen) and seen[-1] == fast.evaluated + fast.timed
    assert not full.pruned
    assert fast.candidates == full.candidates
    assert fast.evaluated + fast.bound_evals < full.evaluated / 2, (fast.evaluated, fast.bound_evals, full.evaluated)
    assert fast.ranked[0][0] == full.ranked[0][0]
    assert [e.step_time_s for _, e in fast.ranked] == [e.step_time_s for _, e in full.ranked]
    assert [lay for lay, _ in fast.ranked] == [lay for lay, _ in full.ranked]


def test_fp8_workload_tries_every_recipe():
    """``--dtype fp8``: the free search prices Transformer Engine's three recipes (no MXFP8 on an H100)."""
    from meshplan.planner.layout.space import Pins, enumerate_layouts, fp8_recipe_choices

    work = Workload(load_model("llama-3.1-8b"), load_cluster("1x8xH100"), 8, 4096, "fp8")
    recipes = fp8_recipe_choices(work.dtype, work.cluster.device)
    assert recipes == ("tensorwise", "delayed", "blockwise")
    assert fp8_recipe_choices("bf16", work.cluster.device) == ("none",)
    seen = {lay.fp8 for lay in enumerate_layouts(work.model, 8, 8, 8, 4096, Pins(tp=8, pp=1), recipes)}
    assert seen == set(recipes)
    # the stack's own checkpointing (issue 12 item 5, defaults follow the stack): Megatron-Core's (selective is
    # core attention; no op-level policy), torchtitan's (op-level, whole layers; no Megatron selective)
    kinds = {lay.recompute for lay in enumerate_layouts(work.model, 8, 8, 8, 4096, Pins(tp=8, pp=1), recipes)}
    assert kinds == {"none", "selective", "full", "full:8", "full:16"}
    titan = {(lay.recompute, lay.fp8) for lay in enumerate_layouts(
        work.model, 8, 8, 8, 4096, Pins(tp=8, pp=1, stack="torchtitan"), recipes)}
    assert {r for r, _ in titan} == {"none", "op", "full", "full:8", "full:16"}
    assert {f for _, f in titan} == {"tensorwise"}  # torchao's float8: no delayed or block-wise recipe


def test_a_broken_assumption_falls_back_to_pricing_everything():
    """An estimator under which recomputation saves time (contradicting what the bounds assume) is caught on the
    first pair priced that shows it: the search prices every candidate and says why, and the answer is still
    exhaustive search's."""
    from dataclasses import replace

    class Cheating:
        def __init__(self, inner):
            self.inner, self.name = inner, inner.name

        def estimate(self, work, layout):
            est = self.inner.estimate(work, layout)
            return est if layout.recompute == "none" else replace(est, step_time_s=est.step_time_s / 2,
                                                                    bubble_s=est.bubble_s / 2)

    work = Workload(load_model("llama-3.1-8b"), load_cluster("1x8xH100"), 16, 4096)
    est = Cheating(estimator_for(work.cluster))
    fast = search(work, {}, top=5, estimator=est, prune=True)
    full = search(work, {}, top=5, estimator=est, prune=False)
    assert not fast.pruned and "recompute" in fast.fallback
    assert [(lay, e.step_time_s) for lay, e in fast.ranked] == [(lay, e.step_time_s) for lay, e in full.ranked]


@pytest.mark.parametrize("model,cluster,gb,seq,dtype,fix", [CASES[3], CASES[5], CASES[6]],
                         ids=["qwen3-fp8-pp4", "qwen3-zero3-16-nodes", "mixtral-uneven-pp3"])
def test_step_times_by_parts_are_the_estimates(model, cluster, gb, seq, dtype, fix):
    """What the search reads before pricing a layout in full, the pipeline part + bubble of a group
    (``pipeline_bound_s``) and each member's step time alone (``shard_step_times_s``), are the very floats the full
    estimate of every member gives."""
    from meshplan.core.errors import MeshplanError
    from meshplan.planner.layout.space import Pins, enumerate_groups, fp8_recipe_choices

    work = Workload(load_model(model), load_cluster(cluster), gb, seq, dtype)
    est = estimator_for(work.cluster)
    checked = 0
    for g in enumerate_groups(work.model, work.cluster.world_size, 8, gb, seq, Pins(**fix),
                              fp8_recipe_choices(dtype, work.cluster.device)):
        for r in range(len(g.recomputes)):
            try:
                g.member(r, 0).validate(world_size=work.cluster.world_size, num_layers=work.model.num_layers,
                                        num_heads=work.model.num_heads, num_kv_heads=work.model.num_kv_heads,
                                        seq_len=seq, global_batch=gb, num_experts=work.model.num_experts)
            except MeshplanError:
                continue
            steps = est.shard_step_times_s(work, g.member(r, 0), g.shards)
            for s in range(len(g.shards)):
                full = est.estimate(work, g.member(r, s))
                assert steps[s] == full.step_time_s
                assert est.pipeline_bound_s(work, g.member(r, s)) == full.pipeline_s + full.bubble_s
                checked += 1
    assert checked > 500



@pytest.mark.parametrize("model,cluster,gb,seq,dtype,fix", [
    ("llama-3.1-8b", "2x8xH100", 16, 8192, "bf16", {}),
    ("qwen3-30b-a3b", "4x8xH100", 32, 4096, "fp8", {"tp": 2, "pp": 4, "cp": 1, "mbs": 1}),
    ("mixtral-8x7b", "3x8xH100", 48, 4096, "bf16", {"pp": 3, "cp": 1, "tp": 2}),
    ("llama-3.1-8b", "1x8xB200", 16, 2048, "nvfp4", {"bf16_first_layers": 1, "bf16_last_layers": 4}),
], ids=["dense", "moe-fp8", "moe-uneven-pp", "dense-nvfp4-bf16-layers"])
def test_work_bound_is_below_every_pipeline_part(model, cluster, gb, seq, dtype, fix):
    """The first bound of a group (its micro-batch's work spread over the stages) is below the pipeline part of each
    of its recompute variants, checked on every group of the space by pricing them all."""
    from meshplan.planner.layout.space import Pins, enumerate_groups, fp8_recipe_choices

    work = Workload(load_model(model), load_cluster(cluster), gb, seq, dtype)
    est = estimator_for(work.cluster)
    c = work.cluster
    groups = list(enumerate_groups(work.model, c.world_size, c.nvlink_width, gb, seq, Pins.of(fix),
                                   fp8_recipe_choices(dtype, c.device)))
    bounds = est.work_bounds_s(work, [g.base for g in groups])
    checked = 0
    for g, bound in zip(groups, bounds):
        assert bound is not None
        for r in range(len(g.recomputes)):
            assert bound <= est.pipeline_bound_s(work, g.member(r, 0)) * (1 + 1e-9), (g.member(r, 0), bound)
            checked += 1
    assert checked >= len(groups) > 10


@pytest.mark.parametrize("model,cluster,gb,seq,fix", [
    ("qwen3-30b-a3b", "4x8xH100", 32, 4096, {"tp": 2, "pp": 4, "cp": 1, "mbs": 1}),
    ("qwen3-30b-a3b", "2x4xGB200-NVL72", 64, 4096, {"pp": 1, "cp": 1, "mbs": 1}),
    ("llama-3.1-8b", "2x8xB200", 16, 8192, {"bf16_first_layers": 2, "bf16_last_layers": 3}),
], ids=["hopper-moe", "nvl72-moe-overlap", "blackwell-bf16-layers"])
def test_recipe_twin_bound_is_below_each_recipes_own_work_bound(model, cluster, gb, seq, fix):
    """A tensor-wise, block-wise or MXFP8 group's first bound, from its delayed-scaling twin without pricing its own
    ops (``recipe_twin_bounds_s``), is below its own work bound, checked on every group of the space by pricing them
    all; delayed groups have none (they are the twins)."""
    from meshplan.planner.layout.space import Pins, enumerate_groups, fp8_recipe_choices

    work = Workload(load_model(model), load_cluster(cluster), gb, seq, "fp8")
    est = estimator_for(work.cluster)
    c = work.cluster
    lays = [g.base for g in enumerate_groups(work.model, c.world_size, c.nvlink_width, gb, seq, Pins.of(fix),
                                             fp8_recipe_choices("fp8", c.device))]
    own, twin = est.work_bounds_s(work, lays), est.recipe_twin_bounds_s(work, lays)
    for lay, w, t in zip(lays, own, twin):
        assert (t is None) == (lay.fp8 == "delayed"), lay
        assert t is None or t <= w * (1 + 1e-9), (lay, t, w)
    assert sum(t is not None for t in twin) == 2 * sum(lay.fp8 == "delayed" for lay in lays) > 20


def test_recipe_twin_bound_holds_where_a_slower_recipe_steps_faster():
    """DeepSeek-V3 on 8 NVL72 racks (the layout issue 26's search met): with the expert all-to-all overlapped,
    tensor-wise scaling's amax passes hide more of it and shorten the wait for the host, so its micro-batch work
    prices below delayed scaling's. The twin bound takes the all-to-all at the least it exposes, and stays below."""
    from meshplan.planner.layout.layout import Layout

    work = Workload(load_model("deepseek-v3"), load_cluster("144x4xGB200-NVL72"), 4608, 4096, "fp8")
    est = estimator_for(work.cluster)
    lay = Layout(dp_replicate=72, tp=8, ep=2, micro_batch=16, sequence_parallel=True, fp8="tensorwise",
                 moe_overlap=True, moe_dispatcher="hybridep", cuda_graphs="layers")
    pair = [lay, lay.with_(fp8="delayed")]
    tensorwise, delayed = est.work_bounds_s(work, pair)
    assert tensorwise < delayed  # the case the bound must survive
    assert est.recipe_twin_bounds_s(work, pair)[0] <= tensorwise
    assert est.recipe_twin_bounds_s(work, pair[:1]) == [None]  # a twin no one asks about is not priced for it


def test_a_twin_bound_above_the_own_work_bound_falls_back():
    """An estimator whose recipe twin bound overstates a group's work is caught when that group comes up: the
    search prices every candidate, says why, and gives exhaustive search's answer."""
    class Overstating:
        def __init__(self, inner):
            self.inner, self.name = inner, inner.name

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def recipe_twin_bounds_s(self, work, layouts):
            own = self.inner.work_bounds_s(work, layouts)
            return [None if lay.fp8 == "delayed" or w is None else 1.001 * w for lay, w in zip(layouts, own)]

    work = Workload(load_model("qwen3-30b-a3b"), load_cluster("2x4xGB200-NVL72"), 64, 4096, "fp8")
    est = Overstating(estimator_for(work.cluster))
    fix = {"pp": 1, "cp": 1, "mbs": 1}
    fast = search(work, fix, top=5, estimator=est, prune=True)
    full = search(work, fix, top=5, estimator=est, prune=False)
    assert not fast.pruned and "recipe twin" in fast.fallback
    assert [(lay, e.step_time_s) for lay, e in fast.ranked] == [(lay, e.step_time_s) for lay, e in full.ranked]


def test_memory_pruning_keeps_the_exhaustive_answer_and_its_closest_miss():
    """Families whose activations alone overflow the GPU are never priced: the ranking is exhaustive search's, and
    where nothing fits the error names the same closest miss."""
    work = Workload(load_model("llama-3.1-70b"), load_cluster("2x8xH100"), 16, 8192)
    est = estimator_for(work.cluster)
    fast = search(work, {}, top=10, estimator=est, prune=True)
    full = search(work, {}, top=10, estimator=est, prune=False)
    assert fast.unfit > 0 and not fast.fallback
    assert [(lay, e.step_time_s) for lay, e in fast.ranked] == [(lay, e.step_time_s) for lay, e in full.ranked]
    big = Workload(load_model("llama-3.1-405b"), load_cluster("1x8xH100"), 8, 8192)
    msgs = []
    for prune in (True, False):
        with pytest.raises(MeshplanError, match="fits nowhere") as err:
            search(big, {}, top=10, estimator=est, prune=prune)
        msgs.append(str(err.value).split(" layouts tried")[1])  # the closest miss (the counts differ)
    assert msgs[0] == msgs[1]


def test_where_nothing_fits_memory_alone_finds_the_exhaustive_closest_miss():
    """Mixtral under FSDP2 with NeMo AutoModel's MoE at a 64k sequence on one H100 node fits nowhere: the pruned
    search finds its closest miss by each layout's memory alone (``_closest_by_memory``) and names the one pricing
    every layout names."""
    work = Workload(load_model("mixtral-8x7b"), load_cluster("1x8xH100"), 8, 65536)
    fix = {"fsdp": "torch", "pp_overlap": False, "moe_impl": "automodel", "moe_dispatcher": "deepep"}
    est = estimator_for(work.cluster)
    msgs = []
    for prune in (True, False):
        with pytest.raises(MeshplanError, match="fits nowhere") as err:
            search(work, fix, top=5, estimator=est, prune=prune)
        msgs.append(str(err.value).split(" layouts tried")[1])
    assert msgs[0] == msgs[1] and "misses by" in msgs[0]
