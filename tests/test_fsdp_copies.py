"""The ZeRO-3 implementation (``fsdp``): torch FSDP2's copy passes on the compute stream, or none (Megatron-FSDP).

Truths the estimator does not compute itself: a real FSDP2 run counts its copies (tests/test_realrun_gpt.py,
``test_fsdp2_copies_every_gathered_parameter_and_gradient``: 2x the parameters copied out and 1x the gradients copied
in per micro-batch at ZeRO-3); each pass moves its bytes through device memory, so it costs at least the bytes over
the HBM bandwidth of the datasheet (the roofline bound) and, as a streaming copy, not more than twice that.
"""
from __future__ import annotations

import pytest

from meshplan.core.errors import MeshplanError
from meshplan.costmodel.ops import OpSpec
from meshplan.planner.cluster.spec import load_cluster
from meshplan.planner.estimate.base import Workload, stage_params
from meshplan.planner.estimate.select import estimator_for
from meshplan.planner.layout.layout import Layout
from meshplan.planner.layout.space import parse_fix
from meshplan.planner.model.config import load_model

MODEL, CLUSTER, SEQ, GBS = "llama-3.1-8b", "1x8xH100", 8192, 32


def _estimate(layout: Layout):
    work = Workload(load_model(MODEL), load_cluster(CLUSTER), GBS, SEQ, "bf16")
    m = work.model
    layout.validate(world_size=8, num_layers=m.num_layers, num_heads=m.num_heads, num_kv_heads=m.num_kv_heads,
                    seq_len=SEQ, global_batch=GBS)
    est = estimator_for(work.cluster)
    return work, est, est.estimate(work, layout)


def _fsdp(**kw) -> Layout:
    return Layout(dp_shard=8, micro_batch=1, zero_stage=3, recompute="full", **kw)


def test_defaults_follow_the_stack():
    assert _fsdp().fsdp_impl == "megatron"  # Megatron-Core's zero 3 is Megatron-FSDP
    assert _fsdp(stack="torchtitan").fsdp_impl == "torch" and _fsdp(stack="eager").fsdp_impl == "torch"
    assert _fsdp(fsdp="torch").fsdp_impl == "torch"
    assert parse_fix("fsdp=torch").fsdp == "torch"
    with pytest.raises(MeshplanError, match="fsdp"):
        parse_fix("fsdp=deepspeed")


def test_fsdp2_pays_two_parameter_copies_and_one_gradient_copy_per_micro_batch():
    work, est, torch_ = _estimate(_fsdp(fsdp="torch"))
    _, _, megatron = _estimate(_fsdp(fsdp="megatron"))
    m = _fsdp().num_microbatches(GBS)
    dense, expert = stage_params(est.tables(work.model), _fsdp(), 0)
    n = int(dense + expert)
    dev = work.cluster.device
    copy_s = est.op_time_s(OpSpec("copy", (n,), "bf16"), dev)
    assert torch_.other_s - megatron.other_s == pytest.approx(m * 3 * copy_s, rel=1e-9)
    assert torch_.pipeline_s == pytest.approx(megatron.pipeline_s)  # the micro-batches' own time is the same
    bound = 2 * 2 * n / dev.mem_bw_bytes_per_s  # read + write of bf16 elements at the datasheet bandwidth
    assert bound <= copy_s <= 2 * bound + 20e-6
