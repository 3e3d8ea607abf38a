"""FLOP counters (planner.model.flops) against hand derivations and published figures."""
from __future__ import annotations

import pytest

from meshplan.core.errors import MeshplanError
from meshplan.planner.model.config import load_model
from meshplan.planner.model.flops import (
    hardware_flops_per_token,
    megatron_flops_per_iteration,
    narayanan_flops_per_iteration,
    recompute_flops_per_token,
)
from tests.helpers import data_path


def _shared(name):
    return load_model(str(data_path("model_configs", name)))


def test_llama_3_1_8b_at_8k_is_51_47_gflop_per_token():
    # models.md §4.4, worked by hand: 33.8 (FFN) + 8.1 (attention projections) + 3.2 (logits) + 6.4 (core
    # attention) = 51.47 GFLOP per token at s = 8192.
    spec = _shared("llama-3.1-8b-instruct.json")
    assert spec.model_flops_per_token(8192) == pytest.approx(51.47e9, abs=0.005e9)
    h, f, L, V, s = 4096, 14336, 32, 128256, 8192
    ffn = 6 * 3 * h * f * L
    proj = 6 * (h * (4096 + 2 * 1024) + 4096 * h) * L
    logits = 6 * h * V
    core = 6 * 4096 * s * L
    assert spec.model_flops_per_token(8192) == ffn + proj + logits + core


@pytest.mark.parametrize("filename", ["llama-3.1-8b-instruct.json", "llama-3.1-70b-instruct.json",
                                      "mistral-7b-instruct-v0.3.json", "qwen3-8b.json"])
def test_dense_identity_six_n_plus_attention(filename):
    # models.md §4.4: for dense models the counter equals 6 * N_nonembedding + 6 * L * d_q * s, up to the norm
    # parameters (and Qwen3's q/k norms), which the counter does not count. N_nonembedding keeps the LM head.
    spec = _shared(filename)
    s = 4096
    norms = spec.num_layers * (2 * spec.hidden_size + (2 * spec.head_dim if spec.qk_norm else 0)) + spec.hidden_size
    n = spec.num_params - spec.embedding_params - norms
    assert spec.model_flops_per_token(s) == 6 * n + 6 * spec.num_layers * spec.q_dim * s


@pytest.mark.parametrize("filename", ["mixtral-8x7b-v0.1.json", "qwen3-30b-a3b.json", "deepseek-v3.json"])
def test_moe_counts_active_experts_only(filename):
    # For MoE the same identity holds with the *active* parameters (k experts), minus the router, which
    # Megatron does not count. MLA's core attention uses head_dim for QK^T and v_head_dim for AV.
    spec = _shared(filename)
    s = 4096
    h = spec.hidden_size
    moe = len(spec.moe_layers)
    norms = spec.num_layers * (2 * h + (2 * spec.head_dim if spec.qk_norm else 0)) + h
    router = moe * h * spec.num_experts
    n_active = spec.active_params - spec.embedding_params - norms - router
    core = 6 * spec.num_layers * spec.num_heads * s * (spec.head_dim + spec.v_head_dim) / 2
    assert spec.model_flops_per_token(s) == pytest.approx(6 * n_active + core, rel=1e-12)
    assert spec.model_flops_per_token(s) < 6 * (spec.num_params - spec.embedding_params) / 2


def test_deepseek_v3_mtp_adds_a_layer_and_a_logits_head():
    # Megatron counts an MTP module as one more layer of the last layer's kind (MoE here), plus its norms (3h),
    # eh_proj (2h^2) and one more logits head. The MoE layer's matmul FLOPs are 6x its active parameters minus
    # norms and router (checked against the golden counts in test_model_spec.py), plus core attention.
    path = str(data_path("model_configs", "deepseek-v3.json"))
    base, mtp = load_model(path), load_model(path, mtp=True)
    s, h, V, E, a = 4096, base.hidden_size, base.vocab_size, base.num_experts, base.num_heads
    layer = 6 * (base.layer_active_params(60) - 2 * h - h * E) + 6 * a * s * (base.head_dim + base.v_head_dim) / 2
    extra = mtp.model_flops_per_token(s) - base.model_flops_per_token(s)
    assert extra == pytest.approx(layer + 6 * (3 * h + 2 * h * h) + 6 * h * V, rel=1e-12)


def test_recompute_terms():
    spec = _shared("llama-3.1-8b-instruct.json")
    s, L, h, V = 8192, 32, 4096, 128256
    mfu = spec.model_flops_per_token(s)
    # Full recompute: one extra forward (1/3) of the layers, not of the logits (Narayanan et al. Appendix).
    assert recompute_flops_per_token(spec, s, "full") == pytest.approx((mfu - 6 * h * V) / 3)
    # Selective (core attention only): forward of QK^T and AV with the causal mask = 2 * d_q * s per token-layer.
    assert recompute_flops_per_token(spec, s, "selective") == 2 * 4096 * s * L
    assert hardware_flops_per_token(spec, s, "none") == mfu
    with pytest.raises(MeshplanError, match="recompute: must be one of"):
        recompute_flops_per_token(spec, s, "some")


def test_narayanan_expanded_form_table1_145b_row():
    # Narayanan et al. SC'21 Table 1, 145.6B row: l=80, h=12288, B=2304; s=2048, V=51200 (paper §5.1).
    B, s, l, h, V = 2304, 2048, 80, 12288, 51200
    by_hand = 96 * B * s * l * h**2 + 16 * B * s**2 * l * h + 6 * B * s * h * V  # Appendix derivation, expanded
    assert narayanan_flops_per_iteration(B, s, l, h, V, recompute=True) == pytest.approx(by_hand, rel=1e-12)
    assert narayanan_flops_per_iteration(B, s, l, h, V, recompute=False) == pytest.approx(0.75 * by_hand, rel=1e-12)


@pytest.mark.parametrize("params_b,l,h,tokens,gpus,tflops,days", [
    # Narayanan et al. SC'21 §5.1 "end-to-end training time": GPT-3 175B, 300B tokens, 1024 A100s at
    # 140 TFLOP/s -> 34 days; 1T model, 450B tokens, 3072 A100s at 163 TFLOP/s -> 84 days.
    (175, 96, 12288, 300e9, 1024, 140e12, 34),
    (1008, 128, 25600, 450e9, 3072, 163e12, 84),
])
def test_narayanan_end_to_end_days(params_b, l, h, tokens, gpus, tflops, days):
    s, V, B = 2048, 51200, 1
    flops_per_token = narayanan_flops_per_iteration(B, s, l, h, V, recompute=True) / (B * s)
    # The paper approximates flops_per_token by 8P; the closed form is within 3% of that.
    assert flops_per_token == pytest.approx(8 * params_b * 1e9, rel=0.03)
    assert tokens * flops_per_token / (gpus * tflops) / 86400 == pytest.approx(days, abs=1.0)


def test_megatron_vs_narayanan_on_gpt():
    # On a Table 1 GPT (MHA, 4h GeLU MLP, tied V) the two counters differ only in the causal halving of core
    # attention (Megatron: 6 l h s per token; Narayanan's 72 form: 12 l h s) and the 72 form's 4.5 h V logits.
    spec = load_model("megatron-gpt-7.5b")
    B, s, l, h, V = 512, 2048, 36, 4096, 51200
    meg = megatron_flops_per_iteration(spec, B, s)
    nar = narayanan_flops_per_iteration(B, s, l, h, V, recompute=False)
    assert nar - meg == pytest.approx(B * s * (6 * l * h * s - 1.5 * h * V), rel=1e-12)


def test_bad_inputs():
    spec = load_model("gpt2")
    with pytest.raises(MeshplanError, match="seq_len: must be a positive integer, got 0"):
        spec.model_flops_per_token(0)
    with pytest.raises(MeshplanError, match="hidden: must be a positive integer"):
        narayanan_flops_per_iteration(1, 2048, 2, -1, 10, recompute=True)
