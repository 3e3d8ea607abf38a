"""Training FLOP counters: Megatron-LM's per-token counter for any :class:`ModelSpec`, and Narayanan et al.'s
closed form for GPT (models.md §4).

All results are floating-point operations (a multiply-add is 2 FLOPs), forward + backward of one training
step. "Model FLOPs" (MFU numerator) exclude recomputation; "hardware FLOPs" (HFU) include it.
"""
from __future__ import annotations

from meshplan.core.errors import MeshplanError
from meshplan.costmodel.ops import OpSpec
from meshplan.planner.layout.decisions import RECOMPUTE


def _check_seq(seq_len: int) -> None:
    if not isinstance(seq_len, int) or isinstance(seq_len, bool) or seq_len <= 0:
        raise MeshplanError(f"seq_len: must be a positive integer, got {seq_len!r}")


def _attention_terms(spec, seq_len: int) -> tuple[float, float]:
    """(projection multiply-adds per token per layer, core-attention multiply-adds per token per layer).

    Core attention is QK^T plus AV, halved by the causal mask (each token attends to s/2 keys on average).
    """
    h, a = spec.hidden_size, spec.num_heads
    if spec.is_mla:
        # Megatron-LM transformer_flops, MLA branch: q LoRA (+ q norm), kv LoRA (+ kv norm) + shared rope key,
        # output projection; core attention uses the q/k head width for QK^T and v_head_dim for AV.
        if spec.q_lora_rank:
            q = spec.q_lora_rank * (h + a * spec.head_dim + 1)
        else:
            q = h * a * spec.head_dim
        nope = spec.head_dim - spec.qk_rope_head_dim
        kv = spec.kv_lora_rank * (h + a * (nope + spec.v_head_dim) + 1) + h * spec.qk_rope_head_dim
        proj = q + kv + a * spec.v_head_dim * h
        core = seq_len * a * spec.head_dim / 2 + seq_len * a * spec.v_head_dim / 2
        return proj, core
    # MHA/GQA: h*(d_q + 2*d_kv) for QKV and d_q*h for the output projection.
    d_v = spec.num_kv_heads * spec.v_head_dim
    proj = h * (spec.q_dim + spec.kv_dim + d_v) + a * spec.v_head_dim * h
    if spec.attn_output_gate:  # q_proj's gate half (Qwen3-Next)
        proj += h * spec.q_dim
    core = spec.q_dim * seq_len / 2 + a * spec.v_head_dim * seq_len / 2
    return proj, core


def window_keys(seq_len: int, window: int) -> float:
    """Keys one query attends to on average under a causal sliding window of ``window`` keys: query t sees
    min(t, w) of them, (w (w + 1) / 2 + (s - w) w) / s on average; the whole causal sequence (s / 2, Megatron's
    count) when the window covers it."""
    if not window or window >= seq_len:
        return seq_len / 2
    return (window * (window + 1) / 2 + (seq_len - window) * window) / seq_len


def mamba_macs_per_token(spec, seq_len: int) -> float:
    """Multiply-adds per token of one Mamba-2 mixer's forward (megatron-core ``MambaMixer``): in_proj
    h -> 2 d_inner + 2 G N + H, the depthwise conv1d of width K over x, B, C, the chunked SSD scan
    (``costmodel.ops.ssd_flops``: Dao & Gu 2024 §6) and out_proj d_inner -> h."""
    h, di = spec.hidden_size, spec.mamba_inner
    gn = spec.mamba_groups * spec.mamba_state
    ssd = OpSpec("ssd", (1, spec.mamba_heads, seq_len, spec.mamba_head_dim, spec.mamba_state, spec.mamba_groups,
                         spec.mamba_chunk)).flops / 2 / seq_len
    return h * (2 * di + 2 * gn + spec.mamba_heads) + spec.mamba_conv_kernel * (di + 2 * gn) + ssd + di * h


def gdn_macs_per_token(spec) -> float:
    """Multiply-adds per token of one Gated DeltaNet mixer's forward, as Megatron-Bridge counts them
    (``training/utils/flop_utils.py`` @ v0.5.1, ``gdn_layer_flops``): in_proj h -> (q, k, v, z) and h -> (b, a), the
    depthwise conv1d of width K over q, k, v, the scan at four d_k x d_v products per value head (the recurrent
    form's state update and readout), out_proj v -> h. The kernel's own chunked work is the cost model's
    (``costmodel.ops.gdn_flops``)."""
    h, kd, vd, hv = spec.hidden_size, spec.gdn_key_dim, spec.gdn_value_dim, spec.gdn_value_heads
    scan = 4 * hv * spec.gdn_key_head_dim * spec.gdn_value_head_dim
    return h * (2 * kd + 2 * vd + 2 * hv) + spec.gdn_conv_kernel * (2 * kd + vd) + scan + vd * h


def _block_macs(spec, kind: str, seq_len: int) -> float:
    """Forward multiply-adds per token of one block (``planner.model.spec.LAYER_KINDS``)."""
    h, m = spec.hidden_size, spec.mlp_matrices
    if kind == "M":
        return mamba_macs_per_token(spec, seq_len)
    if kind == "G":
        return gdn_macs_per_token(spec)
    if kind in "*S":
        proj, core = _attention_terms(spec, seq_len)
        if kind == "S":  # the core scales with the keys each query sees
            core *= window_keys(seq_len, spec.sliding_window) / (seq_len / 2)
        return proj + core
    if kind == "-":
        return h * spec.ffn_hidden_size * m
    width = spec.moe_latent_size or h  # LatentMoE: routed experts in the latent width, two projections around them
    latent = 2 * h * spec.moe_latent_size
    routed = spec.moe_ffn_hidden_size * spec.experts_per_token * m * width
    return routed + latent + spec.shared_expert_ffn_hidden_size * m * h


def _per_layer_flops(spec, seq_len: int) -> float:
    """Model FLOPs per token summed block by block: hybrids (one block per layer) and sliding-window models.
    MTP modules are the last layer's blocks, or a hybrid's ``mtp_pattern``, each applied ``num_mtp_layers``
    times with its eh_proj (2h -> h) and one more pass of the output head."""
    h = spec.hidden_size
    layers = sum(_block_macs(spec, k, seq_len) for i in range(spec.num_layers) for k in spec.layer_kind(i))
    mtp_kinds = spec.mtp_pattern or spec.layer_kind(spec.num_layers - 1)
    mtp = spec.num_mtp_layers * (2 * h * h + 3 * h + sum(_block_macs(spec, k, seq_len) for k in mtp_kinds))
    logits = h * spec.vocab_size * (1 + spec.num_mtp_layers)
    return 6.0 * (layers + mtp + logits)


def _layer_counts(spec) -> tuple[int, int]:
    """(dense MLP layers, MoE layers), MTP modules included with the kind of the last layer (as Megatron does)."""
    moe = len(spec.moe_layers)
    dense = spec.num_layers - moe
    if spec.num_mtp_layers:
        if spec.is_moe_layer(spec.num_layers - 1):
            moe += spec.num_mtp_layers
        else:
            dense += spec.num_mtp_layers
    return dense, moe


def megatron_flops_per_token(spec, seq_len: int) -> float:
    """Model FLOPs per token, forward + backward, causal attention, no recompute.

    Mirrors ``num_floating_point_operations`` / ``transformer_flops`` in NVIDIA/Megatron-LM
    ``megatron/training/training.py`` (models.md §4.4): 3 (fwd, wgrad, dgrad) x 2 (FLOPs per multiply-add) x
    [MLP (dense width f, or k routed experts + shared experts) + attention projections + core attention +
    MTP norms/projection + logits (1 + MTP heads)]. MoE layers count ``experts_per_token`` experts, never all.
    Like Megatron it ignores norms, the router and the softmax. It uses the model's vocabulary as is (HF
    embeddings are already padded); Megatron pads to a multiple of 128 x TP.

    Args:
        spec: The model.
        seq_len: Training sequence length in tokens (sets the core-attention cost).

    Returns:
        FLOPs per token.
    """
    _check_seq(seq_len)
    if spec.is_hybrid or spec.sliding_window or spec.moe_latent_size:
        return _per_layer_flops(spec, seq_len)
    h, m = spec.hidden_size, spec.mlp_matrices
    dense, moe = _layer_counts(spec)
    layers = spec.num_layers + spec.num_mtp_layers
    mlp = h * (spec.ffn_hidden_size * m * dense
               + (spec.moe_ffn_hidden_size * spec.experts_per_token * m + spec.shared_expert_ffn_hidden_size * m) * moe)
    proj, core = _attention_terms(spec, seq_len)
    mtp = spec.num_mtp_layers * (3 * h + 2 * h * h)
    logits = h * spec.vocab_size * (1 + spec.num_mtp_layers)
    return 6.0 * (mlp + layers * (proj + core) + mtp + logits)


def _core_attention_macs(spec, seq_len: int) -> float:
    """Core-attention multiply-adds per token over every attention block (MTP modules included): what selective
    recomputation runs again."""
    core = _attention_terms(spec, seq_len)[1]
    if not (spec.is_hybrid or spec.sliding_window):
        return (spec.num_layers + spec.num_mtp_layers) * core
    kinds = [k for i in range(spec.num_layers) for k in spec.layer_kind(i)]
    kinds += list(spec.mtp_pattern or spec.layer_kind(spec.num_layers - 1)) * spec.num_mtp_layers
    share = window_keys(seq_len, spec.sliding_window) / (seq_len / 2)
    return core * (kinds.count("*") + share * kinds.count("S"))


def recompute_flops_per_token(spec, seq_len: int, recompute: str, layer_fraction: float = 1.0) -> float:
    """Extra FLOPs per token that activation recomputation adds (the HFU - MFU difference).

    ``full``: one more forward of every decoder layer (1/3 of the layer FLOPs; Narayanan et al. §5 / Appendix:
    "one additional forward pass"), not of the logits; ``full:N`` the same for the ``layer_fraction`` of layers it
    checkpoints. ``selective``: the forward of core attention only (Korthikanti et al. 2022, §5),
    ``2 * 2 * s * d_q / 2`` per token and layer with the causal mask. ``op`` (torchtitan's op-level selective
    checkpointing, ``_save_list`` policy of ``torchtitan/models/llama3/parallelize.py``): every second matmul of a
    layer is recomputed and attention (SDPA) is saved, i.e. half the forward of the linear layers.

    Args:
        spec: The model.
        seq_len: Sequence length, tokens.
        recompute: ``"none"``, ``"selective"``, ``"full"``, ``"full:N"`` or ``"op"``.
        layer_fraction: the share of decoder layers ``full:N`` checkpoints (N / layers per pipeline chunk).
    """
    _check_seq(seq_len)
    kind = recompute.split(":", 1)[0]
    if kind not in RECOMPUTE:
        raise MeshplanError(f"recompute: must be one of {RECOMPUTE} or full:N, got {recompute!r}")
    if kind == "none":
        return 0.0
    core = _core_attention_macs(spec, seq_len)
    if kind == "selective":
        return 2.0 * core
    logits = 6.0 * spec.hidden_size * spec.vocab_size * (1 + spec.num_mtp_layers)
    if kind == "op":  # forward = 2 x (MLP + projections + core); half the GEMMs of MLP and projections again
        return (megatron_flops_per_token(spec, seq_len) - logits) / 3.0 / 2.0 - core
    return (megatron_flops_per_token(spec, seq_len) - logits) / 3.0 * layer_fraction


def hardware_flops_per_token(spec, seq_len: int, recompute: str = "none") -> float:
    """Model FLOPs plus recomputation FLOPs per token (the HFU numerator)."""
    return megatron_flops_per_token(spec, seq_len) + recompute_flops_per_token(spec, seq_len, recompute)


def megatron_flops_per_iteration(spec, batch: int, seq_len: int) -> float:
    """Model FLOPs of one step over ``batch`` sequences of ``seq_len`` tokens (fwd + bwd, no recompute)."""
    if not isinstance(batch, int) or batch <= 0:
        raise MeshplanError(f"batch: must be a positive integer, got {batch!r}")
    return batch * seq_len * megatron_flops_per_token(spec, seq_len)


def narayanan_flops_per_iteration(batch: int, seq_len: int, num_layers: int, hidden: int, vocab: int,
                                  recompute: bool) -> float:
    """FLOPs per iteration of a GPT model, Narayanan et al. SC'21, eq. (3) of the Appendix.

    With full activation recompute: ``96 B s l h^2 (1 + s/(6h) + V/(16 l h))`` (= 96Bslh^2 + 16Bs^2lh + 6BshV:
    per layer 24Bsh^2 + 4Bs^2h forward, backward 2x, recompute 1x; logits 2BshV forward, 4BshV backward).
    Without recompute the common ``72 ...`` form scales the whole bracket by 3/4 (as Megatron-DeepSpeed's
    throughput report does), which also scales the logits term to 4.5BshV. Attention is counted without the
    causal halving and for MHA with a 4h MLP: use :func:`megatron_flops_per_token` for other architectures.

    Args:
        batch: Global batch size B, sequences.
        seq_len: Sequence length s, tokens.
        num_layers: Transformer layers l.
        hidden: Hidden size h.
        vocab: Vocabulary size V.
        recompute: Full activation recomputation (96 form) or none (72 form).

    Returns:
        FLOPs of one iteration.
    """
    for label, value in (("batch", batch), ("seq_len", seq_len), ("num_layers", num_layers), ("hidden", hidden),
                         ("vocab", vocab)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise MeshplanError(f"{label}: must be a positive integer, got {value!r}")
    factor = 96 if recompute else 72
    b, s, l, h, v = (float(x) for x in (batch, seq_len, num_layers, hidden, vocab))
    return factor * b * s * l * h * h * (1.0 + s / (6.0 * h) + v / (16.0 * l * h))
