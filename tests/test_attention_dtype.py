"""The ``attention_dtype`` decision (Transformer Engine's fp8 dot-product attention): what it needs, what it
prices and what it holds.

Truths: the memory model's own count of what the attention block saves (Q, K and V at 2 B each in bf16, the fp8
copies TE's ``FusedAttnFunc`` saves at 1 B), the recipes TE's fp8 attention runs under (``qkv_type`` delayed,
current, mxfp8), and the cuDNN benchmark's GPT-OSS window rows (tests/test_attention_blackwell.py), whose fp8
backward is slower than bf16: a plan with fp8 attention there must be slower, not faster.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshplan.core.errors import MeshplanError
from meshplan.costmodel.api import Pricer
from meshplan.costmodel.ops import OpSpec
from meshplan.planner.cluster.spec import load_cluster
from meshplan.planner.estimate.base import Workload
from meshplan.planner.estimate.gpu import GpuEstimator
from meshplan.planner.estimate.memory import LayerShape, _attention_bytes
from meshplan.planner.estimate.ops_graph import layer_ops
from meshplan.planner.layout.layout import Layout
from meshplan.planner.layout.space import Pins, fp8_attention_recipes
from meshplan.planner.model.config import load_model

PRESETS = Path(__file__).resolve().parents[1] / "planner" / "presets" / "models"  # the HF configs, as shipped


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


@pytest.mark.parametrize("model_name,tp", [("deepseek-v3", 1), ("gpt-oss-120b", 2)])
def test_fp8_attention_quantizes_q_k_v_forward_and_do_backward_once(model_name: str, tp: int) -> None:
    """Transformer Engine 2.16's ``FusedAttnFunc`` quantizes Q, K and V once each in the forward (one kernel per
    tensor writing the row- and column-wise MXFP8 copies together: 2 B read, 1 + 1 B written an element) and the
    output gradient dO once in the backward (dQ, dK, dV come back in bf16). Counted here from the HF config's head
    widths, not from meshplan's model spec: DeepSeek-V3's MLA Q and K are 128 heads of 128 + 64, V 128 of 128;
    GPT-OSS's Q is 64 heads of 64 and K, V 8 heads of 64 each; at TP ``tp`` a rank holds its share of the heads."""
    cfg = json.loads((PRESETS / f"{model_name}.json").read_text(encoding="utf-8"))
    heads = cfg["num_attention_heads"] // tp
    if "kv_lora_rank" in cfg:
        qk, v = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"], cfg["v_head_dim"]
        qkv_width, do_width = heads * (2 * qk + v), heads * v
    else:
        d, kv = cfg["head_dim"], cfg["num_key_value_heads"] // tp
        qkv_width, do_width = heads * d + 2 * kv * d, heads * d
    seq = 4096
    model = load_model(model_name)
    lay = Layout(tp=tp, dp_replicate=8 // tp, micro_batch=1, fp8="mxfp8", attention_dtype="fp8",
                 sequence_parallel=tp > 1)
    ops = layer_ops(model, model.num_layers - 1, lay, seq, "fp8").compute
    casts = [op for op, nxt in zip(ops, ops[1:]) if op.kind == "cast" and nxt.kind == "attention"]
    assert [op.shape for op in casts] == [(seq * qkv_width, seq * do_width)]
    est, dev = GpuEstimator(Pricer.shipped()), load_cluster("1x8xB200").device
    cast = casts[0]
    # 4 B an element either way (the cast class's read of 2 B and write of 2): forward over Q, K, V, backward over dO
    assert cast.bytes == 4 * seq * qkv_width
    assert est._bwd_s(cast, dev) == pytest.approx(est.op_time_s(OpSpec("cast", (seq * do_width,)), dev))
    assert est._bwd_s(cast, dev) < est.op_time_s(cast, dev)
