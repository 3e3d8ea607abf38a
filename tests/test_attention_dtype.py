"""The ``attention_dtype`` decision (Transformer Engine's fp8 dot-product attention): what it needs, what it
prices and what it holds.

Truths: the memory model's own count of what the attention block saves (Q, K and V at 2 B each in bf16, the fp8
copies TE's ``FusedAttnFunc`` saves at 1 B), the recipes TE's fp8 attention runs under (``qkv_type`` delayed,
current, mxfp8), and the cuDNN benchmark's GPT-OSS window rows (tests/test_attention_blackwell.py), whose fp8
backward is slower than bf16: a plan with fp8 attention there must be slower, not faster.
"""
from __future__ import annotations

import pytest

from meshplan.core.errors import MeshplanError
from meshplan.costmodel.api import Pricer
from meshplan.planner.cluster.spec import load_cluster
from meshplan.planner.estimate.base import Workload
from meshplan.planner.estimate.gpu import GpuEstimator
from meshplan.planner.estimate.memory import LayerShape, _attention_bytes
from meshplan.planner.layout.layout import Layout
from meshplan.planner.layout.space import Pins, fp8_attention_recipes
from meshplan.planner.model.config import load_model


def _shape() -> LayerShape:
    return LayerShape(hidden=8192, heads=64, q_dim=8192, kv_dim=1024, v_dim=1024, ffn=28672, gated=True, dropout=False)


@pytest.mark.parametrize("fp8,saved_bytes", [("tensorwise", 1.0), ("delayed", 1.0), ("mxfp8", 2 * (1 + 1 / 32))])
def test_fp8_attention_keeps_q_k_v_as_transformer_engine_saves_them(fp8: str, saved_bytes: float) -> None:
    """Llama 3.1 70B's Q (64 x 128), K and V (8 x 128 each) per token at TP 2: TE saves the fp8 copies, 1 B per
    element per-tensor, and MXFP8's row- and column-wise copies (E4M3 plus an E8M0 scale per 32) for its backward."""
    s, b, tp = 8192, 1, 2
    bf16 = _attention_bytes(_shape(), s, b, Layout(tp=tp, fp8=fp8), 1.0, "none")
    low = _attention_bytes(_shape(), s, b, Layout(tp=tp, fp8=fp8, attention_dtype="fp8"), 1.0, "none")
    assert bf16 - low == pytest.approx(s * b * (8192 + 1024 + 1024) / tp * (2.0 - saved_bytes))


@pytest.mark.parametrize("stack,attention", [("torchtitan", "flash"), ("megatron", "unfused"),
                                             ("megatron", "flash3")])
def test_fp8_attention_needs_megatron_and_its_fused_kernel(stack: str, attention: str) -> None:
    lay = Layout(dp_shard=8, zero_stage=1, stack=stack, attention=attention, attention_dtype="fp8")
    with pytest.raises(MeshplanError, match=f"got stack {stack}, attention {attention}"):
        lay.validate(world_size=8, num_layers=32, num_heads=32, num_kv_heads=8, seq_len=4096, global_batch=8)


def test_a_search_tries_only_the_recipes_fp8_attention_runs_under() -> None:
    free = ("tensorwise", "delayed", "blockwise", "mxfp8")
    assert fp8_attention_recipes(Pins.of({"attention_dtype": "fp8"}), free, "fp8") == (
        "tensorwise", "delayed", "mxfp8")
    assert fp8_attention_recipes(Pins.of({}), free, "fp8") == free
    with pytest.raises(MeshplanError, match=r"attention_dtype=fp8: .* \(--dtype bf16\) runs none"):
        fp8_attention_recipes(Pins.of({"attention_dtype": "fp8"}), ("none",), "bf16")
    with pytest.raises(MeshplanError, match="runs blockwise"):
        fp8_attention_recipes(Pins.of({"attention_dtype": "fp8", "fp8": "blockwise"}), free, "fp8")


def _gpt_oss_step(estimator: GpuEstimator, attention_dtype: str, fp8: str = "mxfp8") -> tuple[float, float]:
    work = Workload(load_model("gpt-oss-120b"), load_cluster("2x4xGB200-NVL72"), 64, 4096, "fp8")
    lay = Layout(dp_shard=8, ep=8, zero_stage=1, micro_batch=1, fp8=fp8, attention_dtype=attention_dtype)
    est = estimator.estimate(work, lay)
    return est.step_time_s, est.memory.total_bytes


def test_fp8_attention_on_the_gpt_oss_window_costs_time() -> None:
    """cuDNN's MXFP8 window backward runs at 4.5x the bf16 time at 4k on GB200 (2.080 against 0.465 ms): the step
    is slower; its row- and column-wise Q, K, V hold more than bf16's, and per-tensor fp8's less."""
    fresh = lambda: GpuEstimator(Pricer.shipped())  # noqa: E731
    t_bf16, m_bf16 = _gpt_oss_step(fresh(), "bf16")
    t_fp8, m_fp8 = _gpt_oss_step(fresh(), "fp8")
    assert t_fp8 > t_bf16 and m_fp8 > m_bf16
    _, m_tw_bf16 = _gpt_oss_step(fresh(), "bf16", "tensorwise")
    _, m_tw_fp8 = _gpt_oss_step(fresh(), "fp8", "tensorwise")
    assert m_tw_fp8 < m_tw_bf16


def test_one_estimator_prices_both_attention_dtypes_as_two_fresh_ones() -> None:
    """The estimator's caches key on the decision: pricing bf16 then fp8 on one estimator gives what two fresh
    estimators give."""
    shared = GpuEstimator(Pricer.shipped())
    both = [_gpt_oss_step(shared, a) for a in ("bf16", "fp8")]
    apart = [_gpt_oss_step(GpuEstimator(Pricer.shipped()), a) for a in ("bf16", "fp8")]
    assert both == apart and both[0] != both[1]
