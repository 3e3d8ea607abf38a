"""Shared experts beside the token dispatch (``shared_overlap``; Megatron-Core ``--moe-shared-expert-overlap``).

Truths the estimator does not compute itself: NeMo AutoModel's ``MoE.forward`` (components/moe/layers.py
@ 89e3a9fdd) launches the shared experts on a side stream before the routed experts' dispatch and joins them after
the combine; Megatron-Core's ``moe_shared_expert_overlap`` does the same and ``TransformerConfig`` accepts it only
with the alltoall dispatcher (read back by megatron-core in tests/test_export_megatron_core.py, the
``moe-shared-overlap`` variant). The saving is bounded on both sides: never more than the shared experts' forward
(once more under full recompute), never more than the all-to-all time it hides behind, and a model without shared
experts (Qwen3-30B-A3B) does not move.
"""
from __future__ import annotations

import pytest

from meshplan.core.errors import MeshplanError
from meshplan.planner.cluster.spec import load_cluster
from meshplan.planner.estimate.base import Workload
from meshplan.planner.estimate.ops_graph import layer_ops
from meshplan.planner.estimate.select import estimator_for
from meshplan.planner.export import render
from meshplan.planner.layout.layout import Layout
from meshplan.planner.layout.space import parse_fix
from meshplan.planner.model.config import load_model

SEQ, GBS = 4096, 256


def _estimate(model: str, layout: Layout):
    work = Workload(load_model(model), load_cluster("8x8xH100"), GBS, SEQ, "bf16")
    m = work.model
    layout.validate(world_size=64, num_layers=m.num_layers, num_heads=m.num_heads, num_kv_heads=m.num_kv_heads,
                    seq_len=SEQ, global_batch=GBS, num_experts=m.num_experts)
    return work, estimator_for(work.cluster).estimate(work, layout)


def _ep(**kw) -> Layout:
    return Layout(dp_shard=64, ep=64, micro_batch=1, zero_stage=3, recompute="full", **kw)


def test_saving_is_bounded_by_the_shared_forward_and_the_all_to_all():
    model = "deepseek-v3"
    work, inline = _estimate(model, _ep())
    _, hidden = _estimate(model, _ep(shared_overlap=True))
    m = work.model
    moe_layer = m.moe_layers[0]
    lo = layer_ops(m, moe_layer, _ep(), SEQ)
    assert lo.shared and lo.ep_comm  # DeepSeek-V3: one shared expert per MoE layer
    est = estimator_for(work.cluster)
    shared_fwd = sum(est.op_time_s(op, work.cluster.device) for op in lo.shared)
    n_moe = len(m.moe_layers)
    mbs = _ep().num_microbatches(GBS)
    saved = inline.step_time_s - hidden.step_time_s
    assert saved > 0
    # forward + the full recompute's forward, every MoE layer, every micro-batch
    assert saved <= 2 * shared_fwd * n_moe * mbs * 1.05  # (the slowest-rank factor scales it by a few %)
    assert hidden.exposed_comm_s < inline.exposed_comm_s  # the same work, less of the all-to-all exposed


def test_a_model_without_shared_experts_does_not_move():
    _, a = _estimate("qwen3-30b-a3b", _ep())
    _, b = _estimate("qwen3-30b-a3b", _ep(shared_overlap=True))
    assert a.step_time_s == pytest.approx(b.step_time_s, rel=1e-12)


def test_fix_key_and_the_pair_megatron_refuses():
    assert parse_fix("shared_overlap=true").shared_overlap is True
    with pytest.raises(MeshplanError, match="pick one"):
        _estimate("deepseek-v3", _ep(shared_overlap=True, moe_overlap=True))


def test_megatron_export_flag_and_refusal_with_deepep():
    from tests.test_export_golden import _moe_variant

    assert "--moe-shared-expert-overlap" in render(_moe_variant(shared_overlap=True), "megatron").text
    assert "--moe-shared-expert-overlap" not in render(_moe_variant(), "megatron").text
    with pytest.raises(MeshplanError, match="alltoall dispatcher"):
        render(_moe_variant(shared_overlap=True, moe_dispatcher="deepep"), "megatron")
    with pytest.raises(MeshplanError, match="beside moe_overlap"):  # a plan file that never went through validate
        render(_moe_variant(shared_overlap=True, moe_overlap=True), "megatron")
    assert any("shared_overlap" in w for w in render(_moe_variant(shared_overlap=True), "torchtitan").warnings)
