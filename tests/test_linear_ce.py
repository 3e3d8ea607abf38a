"""``linear_ce``: the output layer fused with its cross-entropy (Cut Cross-Entropy, NeMo AutoModel's
``FusedLinearCrossEntropy``), which never stores the logits.

Truths: the logits the unfused head holds at the backward's start are a golden count, tokens x vocab x the bytes a
logit takes (Megatron's vocab-parallel cross-entropy: the bf16 logits and its fp32 softmax in place, 6 B), once for the
main head and once per MTP module; CCE's paper (arXiv:2411.09009) reports the head's time kept, so no time moves; no
export target has the option, and each says so.
"""
from __future__ import annotations

import pytest

from meshplan.core.errors import MeshplanError
from meshplan.planner.cluster.spec import load_cluster
from meshplan.planner.estimate.base import Workload, stage_memory
from meshplan.planner.estimate.select import estimator_for
from meshplan.planner.export import render
from meshplan.planner.layout.space import enumerate_layouts, parse_fix
from meshplan.planner.model.config import load_model
from meshplan.planner.search.exact import search
from tests.test_export_checks import with_
from tests.test_export_golden import plan_llama70b

LLAMA_VOCAB = 128256  # Llama 3.1's HF config
SEQ, MBS = 4096, 2


def _estimate(model_name: str, fix: str, mtp: bool = False):
    model = load_model(model_name, mtp=mtp)
    work = Workload(model, load_cluster("2x8xH100"), 16, SEQ, "bf16")
    (layout,) = enumerate_layouts(model, work.cluster.world_size, work.cluster.devices_per_node, 16, SEQ,
                                  parse_fix(fix))
    return estimator_for(work.cluster).estimate(work, layout)


def test_the_logits_leave_the_last_stage_and_nothing_else_moves():
    base = f"dp=8,dp_shard=8,tp=2,pp=1,mbs={MBS},zero=1,recompute=none,sp=true"
    held, fused = _estimate("llama-3.1-8b", base), _estimate("llama-3.1-8b", base + ",linear_ce=true")
    logits_bytes = 6 * SEQ * MBS * LLAMA_VOCAB / 2  # tp 2 splits the vocabulary
    assert held.memory.activations_bytes - fused.memory.activations_bytes == pytest.approx(logits_bytes, rel=1e-9)
    assert (held.memory.weights_bytes, held.memory.grads_bytes, held.memory.optimizer_bytes) == (
        fused.memory.weights_bytes, fused.memory.grads_bytes, fused.memory.optimizer_bytes)
    assert held.step_time_s == fused.step_time_s


def test_each_mtp_module_drops_its_own_logits():
    """DeepSeek-V3's MTP module (one, its config's ``num_nextn_predict_layers``) runs the shared head and loss once
    more: two logits tensors leave. Its vocabulary: 129280 (HF config)."""
    base = "dp=2,dp_shard=2,tp=1,pp=8,vpp=1,cp=1,ep=2,etp=1,mbs=1,zero=1,recompute=full,mtp=1,moe_overlap=false"
    model = load_model("deepseek-v3", mtp=True)
    work = Workload(model, load_cluster("2x8xH100"), 16, SEQ, "bf16")
    est = estimator_for(work.cluster)
    (held,) = enumerate_layouts(model, 16, 8, 16, SEQ, parse_fix(base))
    (fused,) = enumerate_layouts(model, 16, 8, 16, SEQ, parse_fix(base + ",linear_ce=true"))
    tb = est.tables(model)
    m = held.num_microbatches(16)
    last = held.pp - 1
    gone = (stage_memory(work, tb, held, last, m).activations_bytes
            - stage_memory(work, tb, fused, last, m).activations_bytes)
    assert gone == pytest.approx(2 * 6 * SEQ * 1 * 129280, rel=1e-9)
    assert stage_memory(work, tb, held, 0, m) == stage_memory(work, tb, fused, 0, m)


@pytest.mark.parametrize("target", ["megatron", "megatron-bridge", "torchtitan", "torchrun", "accelerate", "deepspeed"])
def test_every_target_says_it_stores_the_logits(target):
    plan = with_(plan_llama70b(), linear_ce=True)
    out = render(plan, target)
    assert any("linear_ce" in w and "stores the logits" in w for w in out.warnings), out.warnings
    assert not any("linear_ce" in w for w in render(plan_llama70b(), target).warnings)


def test_a_refusal_whose_logits_outweigh_the_miss_names_the_fused_loss():
    """Llama 3.1 8B at 8 sequences of 8192 a rank: its logits, 6 B x 65536 x 128256 = 47.0 GiB, outweigh the miss;
    with ``linear_ce`` the same layout fits."""
    work = Workload(load_model("llama-3.1-8b"), load_cluster("1x8xH100"), 64, 8192, "bf16")
    fix = "dp=8,dp_shard=8,tp=1,pp=1,cp=1,mbs=8,zero=3,recompute=full"
    assert 6 * 65536 * LLAMA_VOCAB / 2**30 == pytest.approx(46.97, abs=0.01)
    with pytest.raises(MeshplanError, match=r"misses by .*; its logits hold 47\.0 GiB, .*--fix linear_ce=true"):
        search(work, parse_fix(fix), top=1)
    assert search(work, parse_fix(fix + ",linear_ce=true"), top=1).ranked
