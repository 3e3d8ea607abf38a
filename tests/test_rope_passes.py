"""RoPE is priced as the kernels the stack runs: one fused pass, or Megatron-Core's unfused chain on a YaRN model.

Truth: Megatron-Core's own ``_apply_rotary_pos_emb_bshd`` (megatron-core 0.16.1, a test dependency), the function its
``apply_rotary_pos_emb`` runs once apply_rope_fusion is off (Megatron-LM's arguments and Megatron-Bridge's providers
turn it off for YaRN; ``ops_graph.MEGATRON_UNFUSED_ROPE_PASSES`` cites them), run here on CPU with GPT-OSS's YaRN
concentration factor and every aten kernel it dispatches recorded: the kernels that write a tensor of q's size. The
op list prices them as the passes their measured time is worth (tests/test_gpu_rope.py)."""
from __future__ import annotations

import math

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from meshplan.planner.estimate.ops_graph import MEGATRON_UNFUSED_ROPE_KERNELS, MEGATRON_UNFUSED_ROPE_PASSES, layer_ops
from meshplan.planner.layout.layout import Layout
from meshplan.planner.model.config import load_model

TOKENS = 4096


class _Kernels(TorchDispatchMode):
    """The element count of what each aten op dispatched inside writes (views and aliases move no bytes)."""

    def __init__(self):
        super().__init__()
        self.numels: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and not func.is_view:
            self.numels.append(out.numel())
        return out


def test_megatron_unfused_rope_writes_q_that_many_times():
    from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd

    q = torch.randn(16, 2, 4, 64, dtype=torch.bfloat16)  # [seq, batch, heads, head dim]
    freqs = torch.randn(16, 1, 1, 64)
    mscale = 0.1 * math.log(32.0) + 1.0  # GPT-OSS: YaRN factor 32, no mscale of its own
    with _Kernels() as k:
        _apply_rotary_pos_emb_bshd(q, freqs, mscale=mscale)
    assert k.numels.count(q.numel()) == MEGATRON_UNFUSED_ROPE_KERNELS, k.numels


def _rope_ops(name: str, width) -> list:
    """The elementwise ops over q and k (``width(model)`` elements per token) of layer 0 under Megatron's kernels."""
    model = load_model(name)
    ops = layer_ops(model, 0, Layout(micro_batch=1, stack="megatron"), TOKENS).compute
    n = TOKENS * width(model)
    return [o for o in ops if o.kind == "elementwise" and o.shape[0] == n]


def _gqa_width(m) -> int:
    return m.num_heads * m.head_dim + m.num_kv_heads * m.head_dim


def test_yarn_gqa_attention_prices_the_unfused_chain():
    model = load_model("gpt-oss-120b")
    assert (model.rope_scaling_type, bool(model.kv_lora_rank)) == ("yarn", False)
    assert len(_rope_ops("gpt-oss-120b", _gqa_width)) == MEGATRON_UNFUSED_ROPE_PASSES


def test_fused_rope_stays_one_pass_elsewhere():
    # Llama 3.1 scales RoPE the llama3 way: position_embedding_type "rope", TE's fused kernel
    assert len(_rope_ops("llama-3.1-70b-instruct", _gqa_width)) == 1
    # DeepSeek-V3 is YaRN-scaled but MLA applies RoPE in its own path, on the rope dims of q and the shared key
    assert len(_rope_ops("deepseek-v3", lambda m: m.num_heads * m.qk_rope_head_dim + m.qk_rope_head_dim)) == 1
