"""The shortcuts that make a layout search fast change no answer (issue 27): a layer built from a block memo is the
layer built afresh, its prices summed block by block are its ops' prices summed one by one, a group's bound is below
the step time of every member of the group (checked against every member's own step time), and the copies and
parsers the hot path uses are the slow ones' values."""
from __future__ import annotations

import dataclasses
from importlib import resources

import pytest
import yaml

from meshplan.core.yamlio import load_packaged
from meshplan.planner.cluster.spec import load_cluster
from meshplan.planner.estimate.base import Workload, time_key
from meshplan.planner.estimate.ops_graph import kind_ops
from meshplan.planner.estimate.select import estimator_for
from meshplan.planner.layout.layout import Layout
from meshplan.planner.layout.space import Pins, enumerate_groups, fp8_recipe_choices
from meshplan.planner.model.config import load_model

# MLA + MoE, sliding windows + sinks + MoE, hybrid Mamba-2 + attention + MoE (LatentMoE), dense, and an MoE whose
# eager stack loops over its experts
MODELS = ["deepseek-v3", "gpt-oss-120b", "nemotron-3-super-120b-a12b", "llama-3.1-8b", "mixtral-8x7b"]


def _layouts(model) -> list[Layout]:
    """Layouts over the fields the blocks read: tp, cp (ring and Ulysses), micro-batch, sequence parallelism, fp8,
    the stack, the expert mesh, the routing load and the dispatcher."""
    out = []
    for tp, cp, mbs in ((1, 1, 1), (2, 2, 1), (4, 1, 2), (8, 2, 2)):
        for ep in ((1, 2, 8) if model.num_experts else (1,)):
            for extra in ({}, {"sequence_parallel": tp > 1, "fp8": "blockwise"}, {"cp_kind": "a2a"},
                          {"stack": "eager"}, {"moe_capacity": 1.25, "moe_dispatcher": "deepep", "etp": 1},
                          {"recompute": "selective", "moe_imbalance": 1.3}):
                out.append(Layout(tp=tp, cp=cp, ep=ep, micro_batch=mbs, **extra))
    return out


def _fields(lo) -> tuple:
    return (lo.compute, lo.core_attention, lo.tp_comm, lo.ep_comm, lo.cp_comm, lo.op_recompute, lo.experts,
            lo.expert_copies, lo.shared, lo.modules)


@pytest.mark.parametrize("name", MODELS)
def test_a_layer_from_the_block_memo_is_the_layer_built_afresh(name):
    model = load_model(name)
    memo: dict = {}
    kinds = sorted({model.layer_kind(i) for i in range(model.num_layers)})
    checked = slots = 0
    for lay in _layouts(model):
        for kind in kinds:
            try:
                fresh = kind_ops(model, kind, lay, 8192)
            except Exception as exc:  # a layout the model cannot take: the memo must refuse it the same way
                with pytest.raises(type(exc)):
                    kind_ops(model, kind, lay, 8192, memo=memo)
                continue
            memoed = kind_ops(model, kind, lay, 8192, memo=memo)
            assert _fields(memoed) == _fields(fresh), (kind, lay)
            assert tuple(op for blk in memoed.blocks for op in blk) == memoed.compute
            assert memoed.weighted() == fresh.weighted()
            checked += 1
            slots += len(kind)
    assert checked >= 20
    blocks = [k for k in memo if k is not None]
    assert len(blocks) < slots  # layers and layouts shared blocks


@pytest.mark.parametrize("name", ["deepseek-v3", "nemotron-3-super-120b-a12b", "mixtral-8x7b"])
def test_block_summed_prices_are_the_ops_prices(name):
    """``GpuEstimator._priced_ops`` sums each block once; summed op by op from the layer's own counts they agree
    to float rounding."""
    work = Workload(load_model(name), load_cluster("4x8xH100"), 64, 4096)
    est = estimator_for(work.cluster)
    tb, dev = est.tables(work.model), work.cluster.device
    for lay in _layouts(work.model)[::5]:
        key = time_key(lay)
        for kind in tb.rep:
            try:
                lo, prices = est._priced_ops(tb, dev, key, kind, 4096, "bf16")
            except Exception:
                continue
            counts = lo.weighted()
            fwd = sum(n * est.op_time_s(op, dev) for op, n in counts.items())
            bwd = sum(n * est._bwd_s(op, dev) for op, n in counts.items())
            assert prices["fwd"] == pytest.approx(fwd, rel=1e-12)
            assert prices["bwd"] == pytest.approx(bwd, rel=1e-12)


@pytest.mark.parametrize("model,cluster,gb,seq,fix", [
    # MoE over 16 nodes, ZeRO-3 gathers that compute hides: recomputation can make a step shorter here
    ("qwen3-30b-a3b", "16x8xH100", 128, 4096, {"tp": 1, "pp": 1, "cp": 1}),
    ("llama-3.1-8b", "2x8xH100", 16, 8192, {"pp": 1}),
], ids=["moe-zero3-16-nodes", "dense"])
def test_group_bound_and_sync_floor_are_below_every_member(model, cluster, gb, seq, fix):
    """``GpuEstimator.group_bound_s`` of a group's recompute=none member is at most the step time of each member of
    the group, every recompute variant and sharding, each priced on its own (``shard_step_times_s``: the full
    estimates' floats, tests/test_search_pruning.py), and ``sync_floor_s`` at most what each adds to its own
    pipeline part; the group bound is above the pipeline part alone for some groups (it bounds something the
    pipeline part does not)."""
    work = Workload(load_model(model), load_cluster(cluster), gb, seq)
    est = estimator_for(work.cluster)
    c = work.cluster
    checked = tighter = 0
    for g in enumerate_groups(work.model, c.world_size, c.nvlink_width, gb, seq, Pins.of(fix),
                              fp8_recipe_choices("bf16", c.device)):
        base = g.member(g.recomputes.index("none"), 0)
        bound = est.group_bound_s(work, base, g.shards)
        floor = est.sync_floor_s(work, base, g.shards)
        assert bound is not None and floor is not None
        tighter += bound > est.pipeline_bound_s(work, base) * (1 + 1e-9)
        for r in range(len(g.recomputes)):
            pipeline = est.pipeline_bound_s(work, g.member(r, 0))
            for step in est.shard_step_times_s(work, g.member(r, 0), g.shards):
                assert bound <= step * (1 + 1e-9), (g.member(r, 0), bound, step)
                # the floor: what any member adds to its own pipeline part
                assert floor <= (step - pipeline) * (1 + 1e-9) + 1e-12, (g.member(r, 0), floor, step, pipeline)
                checked += 1
    assert checked > 200 and tighter > 0


def test_layout_with_is_dataclasses_replace():
    lay = Layout(tp=2, ep=4, etp=1, recompute="full:2", micro_batch=2)
    for changes in ({"tp": 4}, {"zero_stage": 3, "dp_shard": 8, "dp_replicate": 2}, {"recompute": "selective"}):
        copied, replaced = lay.with_(**changes), dataclasses.replace(lay, **changes)
        assert copied == replaced and hash(copied) == hash(replaced) and repr(copied) == repr(replaced)
    assert lay == Layout(tp=2, ep=4, etp=1, recompute="full:2", micro_batch=2)  # the original is untouched
    with pytest.raises(TypeError, match="no field bogus"):
        lay.with_(bogus=1)


@pytest.mark.parametrize("package,path", [("meshplan.costmodel", "data/devices.yaml"),
                                          ("meshplan.planner", "presets/clusters/links.yaml")])
def test_packaged_yaml_parses_as_pyyaml_safe_load(package, path):
    text = resources.files(package).joinpath(path).read_text(encoding="utf-8")
    assert load_packaged(text) == yaml.safe_load(text)
