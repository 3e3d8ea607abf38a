"""The model's shape from the GEMMs and attention a trace recorded (``record_shapes``): hidden size, layers, heads,
MLP width, vocabulary, sequence length and micro-batch, as a decoder's weights show them under tensor parallelism.

A decoder layer's linears read the hidden size ``h`` (QKV, MLP up) or write it (attention out, MLP down); the one
``h``-reading linear that runs once per forward pass, with the widest output, is the LM head. Under tensor
parallelism each weight holds its 1/tp slice (Megatron-LM, Shoeybi et al. 2019 §3): the attention out-projection
reads ``heads * head_dim / tp`` columns, which gives tp where the trace names no group.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True)
class ShapeGuess:
    """What the GEMM and attention shapes say (per rank, before multiplying by tp / pp)."""

    hidden: int
    layers_per_pass: int  # decoder layers one forward pass of this rank runs
    qkv_out: int | None  # fused QKV output columns on this rank (None: separate projections)
    attn_in: int | None  # attention out-projection input columns on this rank
    ffn_local: int | None  # MLP width on this rank
    gated: bool
    head_out: int | None  # LM head output columns on this rank
    seq_len: int | None
    micro_batch: int | None
    heads_local: int | None
    head_dim: int | None
    kv_heads_local: int | None


def _mode(counter: Counter) -> int | None:
    return counter.most_common(1)[0][0] if counter else None


def _attention(attn: Counter, bmm: Counter) -> tuple[int | None, int | None, int | None, int | None, int | None]:
    """(micro_batch, heads_local, seq_len, head_dim, kv_heads_local) from fused attention (q, k, v as
    [b, heads, s, d]) or from the unfused scores bmm ([b * heads, s, s])."""
    if attn:
        q, *rest = attn.most_common(1)[0][0]
        if len(q) == 4:
            kv = rest[0][1] if rest and len(rest[0]) == 4 else q[1]
            return q[0], q[1], q[2], q[3], kv
    if bmm:
        for shapes, _ in bmm.most_common():
            scores = shapes[0]
            if len(scores) == 3 and scores[1] == scores[2] and len(shapes) > 1 and len(shapes[1]) == 3:
                return None, None, scores[1], shapes[1][2], None  # b * heads folded together
    return None, None, None, None, None


def guess_shape(linears: Counter, attn: Counter, bmm: Counter, passes: float) -> ShapeGuess | None:
    """The shape from forward linears ``{((input dims), (out, in)): count per step}``; None without linears.

    Args:
        passes: Forward passes this rank runs per step (micro-batches), to turn counts into layers.
    """
    if not linears:
        return None
    reads = Counter()
    for (_, (_, k)), n in linears.items():
        reads[k] += n
    h = _mode(reads)
    from_h = {(o, k): n for (_, (o, k)), n in linears.items() if k == h}
    to_h = {(o, k): n for (_, (o, k)), n in linears.items() if o == h}
    per_pass = max(1.0, passes)
    most = max(from_h.values()) if from_h else 0
    # once per pass while the layers' linears run many times: the LM head (its vocabulary slice may be < h)
    heads = [w for w, n in from_h.items() if n <= 1.5 * per_pass < most / 2]
    head_out = max(w[0] for w in heads) if heads else None
    body = {w: n for w, n in from_h.items() if w[0] != head_out}
    ins = sorted({k for _, k in to_h})
    attn_in = ins[0] if ins else None
    ffn_local = ins[-1] if len(ins) > 1 else None
    # one attention and one MLP down-projection per layer and pass
    per_layer = sum(attn.values()) or sum(n for s, n in bmm.items() if len(s) == 3) \
        or sum(n for (_, k), n in to_h.items() if k == ffn_local) or max(body.values(), default=0)
    layers = round(per_layer / per_pass)
    gated = False
    qkv_out = None
    for (o, _), n in body.items():
        if ffn_local and o == 2 * ffn_local:
            gated = True
        elif ffn_local and o == ffn_local and round(n / per_pass) >= 2 * layers:
            gated = True  # separate gate and up projections of the same width
        elif attn_in and o > attn_in and o != ffn_local and o != 2 * (ffn_local or 0):
            qkv_out = o
    tokens = Counter(dims for (dims, _), _ in linears.items())
    mb, heads_local, seq, head_dim, kv_local = _attention(attn, bmm)
    dims = _mode(tokens)
    if seq is not None and dims is not None and mb is None and len(dims) == 3:
        mb = dims[1] if dims[0] == seq else dims[0]  # Megatron's [s, b, h] or PyTorch's [b, s, h]
    if heads_local is None and head_dim and attn_in:
        heads_local = attn_in // head_dim
    return ShapeGuess(h, layers, qkv_out, attn_in, ffn_local, gated, head_out, seq, mb, heads_local, head_dim,
                      kv_local)


def tp_from_shape(g: ShapeGuess) -> int | None:
    """Tensor parallelism the weights' slices show: h over the attention out-projection's input columns (heads *
    head_dim = h in GPT and Llama models), when it divides evenly."""
    if g.head_dim and g.attn_in and g.hidden % g.attn_in == 0:  # a decoder: its attention was seen
        return g.hidden // g.attn_in
    return None


def hf_config(g: ShapeGuess, tp: int, pp: int, vocab_parallel: bool, global_linears: bool = False) -> dict:
    """An HF ``config.json`` of the model the shapes show (GPT-2 for a plain MLP, Llama for a gated one).

    ``global_linears``: the linears ran on DTensors, whose recorded shapes are the whole weight's, not the rank's
    slice (attention ran on the local heads)."""
    lin_tp = 1 if global_linears else tp
    heads = (g.heads_local or (g.attn_in // g.head_dim if g.attn_in and g.head_dim else 1)) * tp
    ffn = (g.ffn_local or 4 * g.hidden // lin_tp) * lin_tp
    layers = g.layers_per_pass * pp
    vocab = (g.head_out or 50257) * (lin_tp if vocab_parallel else 1)
    seq = g.seq_len or 2048
    if g.gated:
        kv = (g.kv_heads_local or g.heads_local or heads // tp) * tp
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": g.hidden,
                "intermediate_size": ffn, "num_hidden_layers": layers, "num_attention_heads": heads,
                "num_key_value_heads": kv, "vocab_size": vocab, "max_position_embeddings": seq,
                "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "hidden_act": "silu"}
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": g.hidden, "n_layer": layers,
            "n_head": heads, "n_inner": ffn, "vocab_size": vocab, "n_positions": seq, "n_ctx": seq,
            "activation_function": "gelu_new", "tie_word_embeddings": True}
