"""The operators of one decoder layer (and of the embedding / LM head) for a given layout, as ``OpSpec`` lists.

One place knows which GEMMs, attention and memory-bound ops a transformer layer runs under tensor, context,
sequence and expert parallelism, and which collectives go with them. The estimator prices these lists with
the estimator's pricer (``costmodel.api.Pricer.predict``); nothing else builds op lists for plans.

Shapes follow Megatron-LM's layer (Shoeybi et al. 2019, Fig. 3; Narayanan et al. 2021 §3.2): column-parallel
QKV / FC1, row-parallel output / FC2, one all-reduce (or all-gather + reduce-scatter with sequence
parallelism, Korthikanti et al. 2022 §4.2.2) after attention and after the MLP, in forward and again in backward.
"""
from __future__ import annotations

from dataclasses import dataclass

from meshplan.costmodel.ops import OpSpec
from meshplan.planner.layout import Layout
from meshplan.planner.memory import has_dropout


@dataclass(frozen=True)
class LayerOps:
    """Forward compute ops, and the collectives of one layer, for one micro-batch on one rank.

    Attributes:
        compute: forward compute ops.
        core_attention: the subset recomputed by selective recompute.
        tp_comm: (kind, bytes) collectives over the TP group in forward (backward mirrors them).
        ep_comm: (kind, bytes) all-to-alls over the EP group in forward (backward mirrors them).
        cp_comm: (kind, bytes) KV exchange over the CP group in forward (backward: reduce-scatter of dKV).
    """

    compute: tuple[OpSpec, ...]
    core_attention: tuple[OpSpec, ...]
    tp_comm: tuple[tuple[str, float], ...]
    ep_comm: tuple[tuple[str, float], ...]
    cp_comm: tuple[tuple[str, float], ...]


def layer_ops(model, layer: int, layout: Layout, seq_len: int, dtype: str = "bf16") -> LayerOps:
    """Ops of decoder layer ``layer`` for one micro-batch on one rank."""
    t, cp, b = layout.tp, layout.cp, layout.micro_batch
    s = seq_len // cp
    T = b * s  # tokens on this rank
    h = model.hidden_size
    a = model.num_heads
    a_t = max(1, a // t)
    d = model.head_dim
    norm = "rmsnorm" if model.norm == "rmsnorm" else "layernorm"
    Tn = T // t if layout.sequence_parallel else T  # rows of the ops outside the TP region
    ops: list[OpSpec] = []
    attn_core: list[OpSpec] = []
    act, mm = _precisions(dtype)
    ew = lambda n: OpSpec("elementwise", (int(n),), act)  # noqa: E731
    drop = has_dropout(model)

    # --- attention block ---
    ops.append(OpSpec(norm, (Tn, h), act))
    if model.q_lora_rank or model.kv_lora_rank:  # DeepSeek MLA (DeepSeek-V2 paper §2.1.2)
        qk = model.head_dim
        rope = model.qk_rope_head_dim
        nope = qk - rope
        if model.q_lora_rank:
            ops.extend(mm(T, model.q_lora_rank, h))
            ops.extend(mm(T, a_t * qk, model.q_lora_rank))
        else:
            ops.extend(mm(T, a_t * qk, h))
        ops.extend(mm(T, model.kv_lora_rank + rope, h))
        ops.extend(mm(T, a_t * (nope + model.v_head_dim), model.kv_lora_rank))
        v_out = a_t * model.v_head_dim
        kv_bytes = 2.0 * T * (model.kv_lora_rank + rope)
    else:
        kv = max(1, model.num_kv_heads // t) * d
        ops.extend(mm(T, a_t * d + 2 * kv, h))
        v_out = a_t * d
        kv_bytes = 2.0 * T * 2 * kv
    if layout.attention == "flash":
        attn_core.append(OpSpec("attention", (b, a_t, s, seq_len, d), act, causal=True))
    else:  # materialised scores: full s x s (the causal mask is applied, not skipped), Megatron 2021
        bh = b * a_t
        attn_core.append(OpSpec("bmm", (bh, s, seq_len, d), act))
        attn_core.append(OpSpec("softmax", (bh * s, seq_len), act))
        if drop:
            attn_core.append(ew(bh * s * seq_len))
        attn_core.append(OpSpec("bmm", (bh, s, d, seq_len), act))
    ops.extend(attn_core)
    ops.extend(mm(T, h, v_out))
    ops.append(ew(Tn * h * (2 if drop else 1)))  # (dropout +) residual add

    # --- MLP / MoE block ---
    ops.append(OpSpec(norm, (Tn, h), act))
    gate = 2 if model.gated_mlp else 1
    ep_comm: list[tuple[str, float]] = []
    if model.is_moe_layer(layer):
        k = model.experts_per_token
        fe = model.moe_ffn_hidden_size
        ops.append(OpSpec("matmul", (T, model.num_experts, h), act))  # router: tiny, kept in 16 bits
        Tk = T * k  # token-expert pairs processed on this rank (balanced routing)
        ops.extend(mm(Tk, gate * fe // t, h))
        ops.append(ew(Tk * fe // t * gate))
        ops.extend(mm(Tk, h, fe // t))
        if model.shared_expert_ffn_hidden_size:
            fs = model.shared_expert_ffn_hidden_size
            ops.extend(mm(T, gate * fs // t, h))
            ops.append(ew(T * fs // t * gate))
            ops.extend(mm(T, h, fs // t))
        if layout.ep > 1:
            ep_comm = [("alltoall", 2.0 * Tk * h), ("alltoall", 2.0 * Tk * h)]  # dispatch + combine, bf16
    else:
        f = model.ffn_hidden_size
        ops.extend(mm(T, gate * f // t, h))
        ops.append(ew(T * f // t * gate))  # activation (and gate product)
        ops.extend(mm(T, h, f // t))
    ops.append(ew(Tn * h * (2 if drop else 1)))

    tp_comm: list[tuple[str, float]] = []
    if t > 1:
        full = 2.0 * T * h  # bf16 activations of the full sequence shard
        if layout.sequence_parallel:
            tp_comm = [("allgather", full), ("reducescatter", full)] * 2
        else:
            tp_comm = [("allreduce", full)] * 2
    cp_comm = [("allgather", kv_bytes * cp)] if cp > 1 else []
    return LayerOps(tuple(ops), tuple(attn_core), tuple(tp_comm), tuple(ep_comm), tuple(cp_comm))


def head_ops(model, layout: Layout, seq_len: int, dtype: str = "bf16") -> tuple[OpSpec, ...]:
    """LM head (vocab-parallel logits) and cross-entropy for one micro-batch, forward."""
    t = layout.tp
    T = layout.micro_batch * seq_len // layout.cp
    v_t = model.vocab_size // t
    return (
        OpSpec("layernorm" if model.norm == "layernorm" else "rmsnorm", (T, model.hidden_size), _precisions(dtype)[0]),
        OpSpec("matmul", (T, v_t, model.hidden_size), _precisions(dtype)[0]),  # output layer: not an fp8 GEMM
        OpSpec("softmax", (T, v_t), "fp32"),  # cross-entropy in fp32 (Megatron vocab-parallel CE)
    )


def embedding_ops(model, layout: Layout, seq_len: int, dtype: str = "bf16") -> tuple[OpSpec, ...]:
    T = layout.micro_batch * seq_len // layout.cp
    return (OpSpec("embedding", (T, model.hidden_size), _precisions(dtype)[0]),)


def _precisions(dtype: str):
    """(the dtype of everything but the decoder GEMMs, a function giving the ops of one GEMM ``(m, n, k)``).

    fp8 training (Transformer Engine's recipes, as Megatron-Core and NeMo run them; DeepSeek-V3 report §3.3) runs
    the linear layers' GEMMs in fp8 and everything else in bf16: attention (FlashAttention in bf16 unless fp8
    attention is asked for), norms, activations, residuals, embedding and the output layer. Each fp8 GEMM first
    casts its bf16 input to fp8 with its scale (a read of 2 B and a write of 1 B per element, plus the amax
    reduction folded into it): priced as a ``cast`` of the ``m x k`` input. (The weights' casts are per step, not
    per micro-batch, and are left out.) Other dtypes: every op in that dtype, no cast.
    """
    if dtype != "fp8":
        return dtype, lambda m, n, k: (OpSpec("matmul", (m, n, k), dtype),)
    return "bf16", lambda m, n, k: (OpSpec("cast", (int(m) * int(k),), "bf16"), OpSpec("matmul", (m, n, k), "fp8"))
