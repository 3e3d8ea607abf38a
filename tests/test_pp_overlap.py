"""Pipeline sends overlapped with compute (``pp_overlap``; Megatron-Core ``overlap_p2p_comm``).

Truths the estimator does not compute itself: Megatron-LM's training CLI overlaps the interleaved schedule's sends
and receives unless ``--no-overlap-p2p-communication`` is given (``arguments.py``: store_false, dest
``overlap_p2p_comm``; ``validate_args`` forces it off for the non-interleaved 1F1B and sets ``batch_p2p_comm`` to its
opposite; shared/notes/exports.md (b): with VPP and overlap off, PP must be > 2), which megatron-core's own
``ModelParallelConfig`` reads back in tests/test_export_megatron_core.py; and an overlapped transfer costs at most
the SMs it holds while compute runs (the in-line price is an upper bound, never exceeded, and the overlapped one is
what the compute cannot cover).
"""
from __future__ import annotations

import pytest

from meshplan.core.errors import MeshplanError
from meshplan.costmodel.collectives import collective_time_s
from meshplan.planner.cluster.spec import load_cluster
from meshplan.planner.estimate.base import Workload
from meshplan.planner.estimate.gpu import comm_sm_share, straggler_slowdown
from meshplan.planner.estimate.select import estimator_for
from meshplan.planner.export import render
from meshplan.planner.layout.layout import Layout
from meshplan.planner.layout.space import parse_fix
from meshplan.planner.model.config import load_model

MODEL, CLUSTER, SEQ, GBS = "llama-3.1-70b", "8x8xH100", 4096, 128


def _work() -> Workload:
    return Workload(load_model(MODEL), load_cluster(CLUSTER), GBS, SEQ, "bf16")


def _estimate(layout: Layout):
    work = _work()
    m = work.model
    layout.validate(world_size=work.cluster.world_size, num_layers=m.num_layers, num_heads=m.num_heads,
                    num_kv_heads=m.num_kv_heads, seq_len=SEQ, global_batch=GBS)
    return estimator_for(work.cluster).estimate(work, layout)


def _interleaved(**kw) -> Layout:
    # tp 8 within a node, pp 4 across nodes (dp 2): every chunk boundary crosses InfiniBand
    return Layout(dp_shard=2, tp=8, pp=4, vpp=4, micro_batch=1, zero_stage=1, recompute="selective",
                  sequence_parallel=True, **kw)


def test_megatron_overlaps_interleaved_sends_by_default_and_no_other_schedule():
    assert _interleaved().p2p_overlapped  # Megatron-LM's default for the interleaved schedule
    assert not _interleaved(pp_overlap=False).p2p_overlapped
    assert not Layout(dp_shard=8, tp=8, pp=4, zero_stage=1).p2p_overlapped  # 1F1B: overlap_p2p_comm forced off
    assert not _interleaved(stack="torchtitan").p2p_overlapped  # torch pipelining waits in line
    assert _interleaved(stack="torchtitan", pp_overlap=True).p2p_overlapped


def test_overlapped_sends_cost_only_the_sms_they_hold():
    """In line, each micro-batch waits for 2 x vpp sends of its activations (tp-sharded under SP); overlapped, the
    compute covers them and pays the SM share: the step difference is m x raw x (1 - share) exactly."""
    work = _work()
    inline, hidden = _estimate(_interleaved(pp_overlap=False)), _estimate(_interleaved())
    lay = _interleaved()
    link = work.cluster.collective_link(*lay.pp_neighbours)
    raw = collective_time_s("sendrecv", 2.0 * SEQ * work.model.hidden_size / lay.tp, 2, link) * lay.vpp * 2
    m = lay.num_microbatches(GBS)
    share = comm_sm_share(work.cluster.device)
    assert raw > 0 and m == 64
    assert hidden.step_time_s < inline.step_time_s
    # the micro-batches' own time (pipeline_s: m x the slowest stage's, paced by the slowest rank)
    slow = 1 + straggler_slowdown(lay.world_size)
    assert (inline.pipeline_s - hidden.pipeline_s) / slow == pytest.approx(m * raw * (1 - share), rel=1e-6)


def test_fix_and_validation_say_what_is_wrong():
    assert parse_fix("pp_overlap=false").pp_overlap is False
    with pytest.raises(MeshplanError, match="pp_overlap"):
        parse_fix("pp_overlap=sometimes")
    lay = Layout(dp_shard=8, tp=8, pp=4, zero_stage=1, pp_overlap=True)
    m = load_model(MODEL)
    with pytest.raises(MeshplanError, match="an interleaved pipeline"):
        lay.validate(world_size=256, num_layers=m.num_layers, num_heads=m.num_heads, num_kv_heads=m.num_kv_heads,
                     seq_len=SEQ, global_batch=GBS)


def test_megatron_export_carries_in_line_sends_and_refuses_what_validate_args_refuses():
    from tests.test_export_golden import _variant

    off = _variant(pp_overlap=False)
    assert "--no-overlap-p2p-communication" in render(off, "megatron").text
    assert "--no-overlap-p2p-communication" not in render(_variant(), "megatron").text  # Megatron's default
    from meshplan.planner.plan.schema import Degrees

    with pytest.raises(MeshplanError, match="needs pp > 2"):
        render(off.model_copy(update={"degrees": Degrees(dp_shard=8, tp=8, pp=2, vpp=2)}), "megatron")
    # another stack's in-line default at pp=2: Megatron refuses in-line sends there, so the job keeps its overlap
    # and the export says the plan priced otherwise
    titan2 = _variant(stack="torchtitan").model_copy(update={"degrees": Degrees(dp_shard=8, tp=8, pp=2, vpp=2)})
    res = render(titan2, "megatron")
    assert "--no-overlap-p2p-communication" not in res.text
    assert any("priced the pipeline's sends in line" in w for w in res.warnings)
    # targets whose pipeline waits in line say so when the plan priced overlap
    assert any("pp_overlap" in w for w in render(_variant(), "torchtitan").warnings)
    assert not any("pp_overlap" in w for w in render(off, "torchtitan").warnings)
