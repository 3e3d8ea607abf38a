"""Per-device memory model: model states under mixed precision and ZeRO, activations, pipeline in-flight.

Sources:
  * Model states: Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
    Models", §3.1 and Figure 1: mixed-precision Adam keeps 2 (fp16/bf16 params) + 2 (grads) + K=12 (fp32 master,
    momentum, variance) bytes per parameter; ZeRO-1 shards the 12, ZeRO-2 also the grads, ZeRO-3 everything.
  * Activations: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
    (arXiv:2205.05198), §4, Table 2: per layer s*b*h*(34 + 5*a*s/h) bytes without parallelism, with the TP,
    SP, selective- and full-recompute variants; 1F1B keeps L layers' worth on the first stage, interleaving
    multiplies by (1 + (p-1)/(p*v)). Modern-LLM terms (no dropout, FlashAttention, GQA, SwiGLU, MoE) follow the
    same per-tensor accounting (see ../shared/notes/models.md §5).
Units: bytes. ``s`` is the local sequence length (seq_len / cp), ``b`` the micro-batch.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

from meshplan.costmodel.ops import GDN_CHUNK
from meshplan.planner.layout.decisions import GRAD_BYTES_BY_DTYPE, OPTIMIZER_BYTES_BY_DTYPE
from meshplan.planner.layout.layout import Layout
from meshplan.planner.layout.schedules import inflight_microbatches, parameter_copies

GiB = 1024**3
PARAM_BYTES = 2  # bf16/fp16 weights
GRAD_BYTES = 2  # gradients in the param dtype (ZeRO paper; FSDP2/DDP default reduce dtype)
OPTIMIZER_BYTES = 12  # Adam: fp32 master + m + v (ZeRO paper K = 12)


def param_bytes(dtype: str) -> int:
    """Bytes of one weight as the step holds it: 4 in fp32 runs, else the 16-bit weight (fp8 runs keep it beside
    Transformer Engine's fp8 copies, counted by ``planner.estimate.base.stage_memory``)."""
    return 4 if dtype == "fp32" else PARAM_BYTES


def grad_bytes_per_param(layout: Layout, dtype: str) -> int:
    """Bytes of one parameter's gradient in its buffer (and on the wire unless ``Layout.reduce_dtype`` or the stack
    sets another: ``reduce_bytes_per_param``): ``Layout.grad_dtype``, or the stack's own when it is "" (Megatron-Core,
    whose buffer takes a pinned ``reduce_dtype``; fp32 main grads for bf16/fp8 runs outside FSDP, Megatron-LM
    ``arguments.py``; fp32 runs: fp32; otherwise the ZeRO paper's 2 B)."""
    if layout.grad_dtype:
        return GRAD_BYTES_BY_DTYPE[layout.grad_dtype]
    if layout.stack == "megatron" and layout.reduce_dtype:
        # Megatron-Core keeps one dtype for the main-grad buffer and its reduction (--grad-reduce-in-bf16 makes
        # both bf16): a pinned reduction dtype is the buffer's too
        return GRAD_BYTES_BY_DTYPE[layout.reduce_dtype]
    if dtype == "fp32" or (layout.stack == "megatron" and layout.zero_stage < 3
                           and dtype in ("bf16", "fp8", "nvfp4")):
        return GRAD_BYTES_BY_DTYPE["fp32"]
    return GRAD_BYTES


def reduce_bytes_per_param(layout: Layout, dtype: str) -> int:
    """Bytes of one parameter's gradient on the data-parallel wire: ``Layout.reduce_dtype_priced`` (torchtitan's
    fp32, a pinned ``reduce_dtype``), else the gradient buffer's own (``grad_bytes_per_param``)."""
    wire = layout.reduce_dtype_priced
    return GRAD_BYTES_BY_DTYPE[wire] if wire else grad_bytes_per_param(layout, dtype)


# What a rank may allocate, term by term (the refusal margin explained term by term, not a fudge):
# - torch's ``total_memory`` reads the datasheet capacity, taken as GiB, to ~1% (H100 80GB: 79.2 of 80 GiB; the
#   convention of costmodel/data/devices.yaml), so a plan must fit in 99% of ``memory_bytes``;
# - outside PyTorch's allocator: the CUDA context with cuBLAS/cuDNN handles and workspaces (0.5-1.5 GiB measured on
#   A100/H100 processes before any tensor, the figure this model used as a whole before; 0.75 GiB taken) and NCCL's
#   buffers per communicator: NCCL_BUFFSIZE 4 MiB (NCCL's documented default) per channel and protocol, up to 32
#   channels x 2 protocols = 256 MiB for each process group the layout uses (tp, cp, dp, pp, ep, expert-dp);
# - inside it: fragmentation of the caching allocator. Model states are allocated once, in large buffers; the
#   activations of a step are allocated and freed in a different order in backward, and freed blocks are cached and
#   split, so the reserved pool outgrows them: 5% of the activation bytes is held back.
USABLE_FRACTION = 0.99
CONTEXT_BYTES = 0.75 * GiB
NCCL_COMM_BYTES = 2 * 32 * 4 * 1024**2
ACTIVATION_FRAGMENTATION = 0.05
RUNTIME_OVERHEAD_BYTES = int(CONTEXT_BYTES + 2 * NCCL_COMM_BYTES)  # a layout of two process groups (the solvers')


def runtime_overhead_bytes(layout: Layout, activation_bytes: float) -> int:
    """Bytes a rank holds beyond model states and activations: CUDA context, NCCL buffers of each process group the
    layout uses, allocator fragmentation of the activations (the terms above)."""
    groups = [layout.tp, layout.cp, layout.dp, layout.pp, layout.ep]
    if layout.ep > 1:
        groups.append(layout.expert_dp)
    comms = sum(1 for g in groups if g > 1)
    return int(CONTEXT_BYTES + comms * NCCL_COMM_BYTES + ACTIVATION_FRAGMENTATION * activation_bytes)


@dataclass(frozen=True)
class MemoryBreakdown:
    """Peak bytes on the most loaded device, by category."""

    weights_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    overhead_bytes: int

    @property
    def total_bytes(self) -> int:
        return (self.weights_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes
                + self.overhead_bytes)

    def as_dict(self) -> dict[str, int]:
        d = asdict(self)
        d["total_bytes"] = self.total_bytes
        return d


def holds_whole_stage(layout: Layout, zero_stage: Optional[int] = None) -> bool:
    """Whether a rank holds its pipeline stage's whole weights and gradients beside their FSDP2 shards over a
    schedule run (ZeRO-3 with FSDP2 under torch.distributed.pipelining: ``model_state_bytes``): there, sharding a
    part less can hold less (n/d + n for d > 1 shards, n unsharded). ``zero_stage``: judge ``layout`` at this stage
    instead of its own (a search group's members differ only in their sharding)."""
    z = layout.zero_stage if zero_stage is None else zero_stage
    return z >= 3 and layout.pp > 1 and layout.fsdp_impl == "torch"


def model_state_bytes(dense_params: float, expert_params: float, layout: Layout,
                      dtype: str = "bf16") -> tuple[float, float, float]:
    """(weights, grads, optimizer) bytes on one rank.

    Args:
        dense_params: parameters held by this rank outside routed experts (already divided by tp and pp).
        expert_params: routed-expert parameters held by this rank (already divided by ep, etp and pp).
        layout: ZeRO stage applies over dp_shard*cp for dense parameters and over the expert-data-parallel part of
            dp_shard*cp*tp / (ep*etp) for experts (``Layout.expert_shard_group``).
    """
    z = layout.zero_stage
    shard = layout.dp_shard * layout.cp if z > 0 else 1
    eshard = layout.expert_shard_group.size if z > 0 else 1
    w = g = o = 0.0
    copies = parameter_copies(layout.schedule)  # DualPipe keeps two stages' states per rank
    grad_b, optim_b = grad_bytes_per_param(layout, dtype), OPTIMIZER_BYTES_BY_DTYPE[layout.optim_dtype]
    param_b = param_bytes(dtype)
    if dtype == "fp32":  # the fp32 weights are their own master: Adam adds its two fp32 moments only
        optim_b = 8
    # torch.distributed.pipelining keeps a pipelined FSDP2 stage gathered, its gradients unreduced, over a schedule
    # run (PipelineStage.backward_maybe_with_nosync: reshard_after_backward and gradient sync off until a chunk's
    # last backward): the stage's whole weights and gradients beside their shards. Megatron-FSDP under Megatron-Core's
    # own schedules reduce-scatters on every backward when it shards gradients (MegatronFSDP's
    # grad_reduce_every_bprop for optim_grads and optim_grads_params) and gathers a module's weights for its own use
    run_whole = holds_whole_stage(layout)
    for n, d in ((dense_params * copies, shard), (expert_params * copies, eshard)):
        whole = run_whole and d > 1
        w += n * param_b / (d if z >= 3 else 1) + (n * param_b if whole else 0.0)
        g += n * grad_b / (d if z >= 2 else 1) + (n * grad_b if whole else 0.0)
        o += n * optim_b / (d if z >= 1 else 1)
    return w, g, o


@dataclass(frozen=True)
class LayerShape:
    """What the activation formula needs of one decoder layer (sizes in elements); built by :func:`layer_shape`."""

    hidden: int
    heads: int
    q_dim: int  # heads * head_dim
    kv_dim: int  # width of K: kv_heads * head_dim (MLA: heads * head_dim, K is per head after up-projection)
    v_dim: int  # width of V: kv_heads * v_head_dim (GQA shares V across a group; MLA: heads * v_head_dim)
    ffn: int  # dense FFN width, or per-expert width for MoE layers
    gated: bool
    dropout: bool
    experts_per_token: int = 0  # 0 = dense layer
    shared_ffn: int = 0  # total width of shared experts
    blocks: str = "*-"  # ``ModelSpec.layer_kind``: the blocks of the layer
    expert_width: int = 0  # width the routed experts' tokens travel at (a LatentMoE's latent; 0: hidden)
    mamba_in: int = 0  # Mamba-2 in_proj output, 2 d_inner + 2 G N + H
    mamba_inner: int = 0  # d_inner
    mla: bool = False  # multi-latent attention (its input norm stands alone; Q, K, V come from up-projections)
    post_norms: bool = False  # a norm on each block's output too (``ModelSpec.post_norms``): its input kept
    softcap: bool = False  # soft-capped attention scores (``ModelSpec.attn_softcap``): unfused, tanh's output kept
    out_gate: bool = False  # gated attention output (``ModelSpec.attn_output_gate``): the gate and ungated output kept
    gdn_key: int = 0  # Gated DeltaNet: width of q (and of k), key heads x key head dim
    gdn_value: int = 0  # width of v (and of the gate z)
    gdn_heads: int = 0  # value heads, the heads of its scan
    gdn_repeated_key: int = 0  # width of q (and of k) repeated to the value heads


def has_dropout(model) -> bool:
    """GPT-2 style configs (incl. the Megatron GPT presets) train with dropout 0.1; Llama/Qwen/Mistral/DeepSeek
    and GPT-NeoX (hidden_dropout 0) train without."""
    return model.model_type == "gpt2"


def layer_shape(model, layer: int) -> LayerShape:
    """The activation-relevant shape of decoder layer ``layer`` of ``model`` (a ``planner.model.spec.ModelSpec``).

    K and V are as wide as the tensors the layer saves for backward: with grouped-query attention (Ainslie et al.
    2023) the K/V projections produce ``num_kv_heads`` heads, shared by a group of query heads, so V is
    ``num_kv_heads * v_head_dim`` wide (Llama-3.1-70B: 8 x 128 = 1024, not the 8192 of its 64 query heads). MLA
    (DeepSeek-V2 §2.1) up-projects K and V per query head, so they are ``num_heads`` wide.
    """
    kind = model.layer_kind(layer)
    moe = "E" in kind
    kv_heads = model.num_heads if model.kv_lora_rank else model.num_kv_heads
    return LayerShape(
        hidden=model.hidden_size, heads=model.num_heads, q_dim=model.num_heads * model.head_dim,
        kv_dim=kv_heads * model.head_dim, v_dim=kv_heads * model.v_head_dim,
        ffn=model.moe_ffn_hidden_size if moe else model.ffn_hidden_size, gated=model.gated_mlp,
        dropout=has_dropout(model), experts_per_token=model.experts_per_token if moe else 0,
        shared_ffn=model.shared_expert_ffn_hidden_size if moe else 0, blocks=kind,
        expert_width=model.moe_latent_size,
        mamba_in=2 * model.mamba_inner + 2 * model.mamba_groups * model.mamba_state + model.mamba_heads,
        mamba_inner=model.mamba_inner, mla=bool(model.q_lora_rank or model.kv_lora_rank),
        post_norms=model.post_norms, softcap=bool(model.attn_softcap), out_gate=model.attn_output_gate,
        gdn_key=model.gdn_key_dim, gdn_value=model.gdn_value_dim, gdn_heads=model.gdn_value_heads,
        gdn_repeated_key=model.gdn_value_heads * model.gdn_key_head_dim,
    )


# Block scales: MXFP8 one E8M0 byte per 32 elements; NVFP4 one E4M3 byte per 16 (1x16 blocks) or per 256 (16x16
# weight blocks). TE docs/features/low_precision_training/{mxfp8,nvfp4} (TransformerEngine 2.20.0.dev0, d0067d0).
MXFP8_BYTES = 1.0 + 1.0 / 32
NVFP4_BYTES = 0.5 + 1.0 / 16
NVFP4_WEIGHT_BYTES = 0.5 + 1.0 / 256


def saved_input_bytes(recipe: str, block_scaled: bool = False) -> float:
    """Bytes per element of a linear layer's input kept for its weight gradient under the low-precision ``recipe``
    (``planner.layout.decisions.lowp_recipe``): the bf16 input (2) without one; TE keeps the quantized columnwise
    copy the wgrad GEMM reads otherwise: fp8 1, MXFP8 1 + 1/32 (32x1 blocks, quantized apart from the rowwise copy),
    NVFP4 0.5 + 1/16 (the random-Hadamard-transformed 1x16-block copy). ``block_scaled``: every device has
    block-scaled tensor cores (Blackwell), where TE runs blockwise fp8 as MXFP8 (fp8_blockwise_scaling.rst)."""
    if recipe == "blockwise" and block_scaled:
        recipe = "mxfp8"
    return {"none": 2.0, "mxfp8": MXFP8_BYTES, "nvfp4": NVFP4_BYTES}.get(recipe, 1.0)


def lowp_weight_bytes(recipe: str, shared_layout: bool) -> float:
    """Bytes per decoder linear parameter of the quantized weight copies TE caches for a step's GEMMs.

    Hopper's fp8 GEMMs take only the TN layout, so the backward needs a transposed copy: 2 x 1 B. Blackwell
    (``shared_layout``: every device has the block-scaled kinds) runs TN, NT and NN, so tensor-scaled fp8 keeps one
    copy (1 B; TE fp8_current_scaling.rst: "On Blackwell, rowwise and columnwise usages share the same memory
    layout"). MXFP8 quantizes rowwise and columnwise copies apart (2 x (1 + 1/32)), as does blockwise fp8, which TE
    emulates with MXFP8 there (fp8_blockwise_scaling.rst); NVFP4's GEMM takes only TN, so its 16x16-block weight
    is kept rowwise and transposed (2 x (0.5 + 1/256)).
    """
    if recipe == "nvfp4":
        return 2.0 * NVFP4_WEIGHT_BYTES
    if not shared_layout:
        return 2.0
    return 2.0 * MXFP8_BYTES if recipe in ("mxfp8", "blockwise") else 1.0


def activation_bytes_per_layer(ls: LayerShape, s: int, b: int, layout: Layout, lin_bytes: float = 2.0,
                               recompute: str | None = None, adapted: tuple[str, ...] | None = None) -> float:
    """Activation bytes one layer keeps for backward for one micro-batch (Korthikanti et al. 2022, §4.1).

    With the GPT layer of the paper (q=kv=v=h, ffn=4h, dropout, unfused attention) this reduces exactly to
    sbh(34 + 5as/h) for t=1, sbh(10 + 24/t + 5as/(ht)) under TP and sbh/t(34 + 5as/h) under TP+SP.

    ``recompute``: ``full`` keeps the layer input only (``full:N`` applies per layer: the caller counts which
    layers are recomputed, ``recompute_layer_bytes``); ``op`` keeps what torchtitan's op-level policy saves
    (``op_saved_bytes``). ``lin_bytes``: bytes per element of each linear layer's saved input (QKV, projection,
    FC1 and FC2 inputs): 2 in bf16, what ``saved_input_bytes`` gives under a low-precision recipe.
    ``adapted``: LoRA over a frozen base (``planner.model.peft``), the linears that carry adapters (None = full
    training). Transformer Engine saves a linear's input only for its weight gradient ("backward_needs_input =
    is_grad_enabled and weight.requires_grad", ``module/linear.py``, ``layernorm_linear.py``): a frozen linear keeps
    none, an adapted one its adapter's bf16 copy (LoRA's A reads the same input); the attention output stays, the
    fused attention's own saved O. Routed experts are left as in full training.
    MoE: routed token copies scale with the busiest rank's load (``moe_imbalance`` or ``moe_capacity``) and, under
    expert tensor parallelism, are gathered over etp (``etp / tp`` of the tokens at ``1 / etp`` of the width).
    """
    t = layout.tp
    sp = layout.sequence_parallel
    h = ls.hidden
    sbh = s * b * h
    rep = t if sp else 1  # tensors outside the TP region: sharded only under sequence parallelism
    kind = layout.recompute_kind if recompute is None else recompute  # ``recompute``: the layout's, overridden
    if kind == "full":
        return 2.0 * sbh / rep  # only the layer input is kept
    if kind == "op":
        return op_saved_bytes(ls, s, b, layout)
    lin = lin_bytes  # bytes per element of a saved linear-layer input
    modules = layout.recomputed_modules if kind == "selective" else frozenset()
    saved = ({m: lin for m in ("qkv", "proj", "fc1", "fc2")} if adapted is None else
             {m: 2.0 if m in adapted else 0.0 for m in ("qkv", "fc1", "fc2")}
             | {"proj": 2.0 if "proj" in adapted or layout.attention != "unfused" else 0.0})
    out = 2.0 * sbh / rep * len(ls.blocks) * (2 if ls.post_norms else 1)  # the norm inputs, one or two a block
    if "*" in ls.blocks or "S" in ls.blocks:
        out += _attention_bytes(ls, s, b, layout, saved["qkv"], "selective" if "core_attn" in modules else "none",
                                saved["proj"])
    if "M" in ls.blocks:
        out += _mamba_bytes(ls, s, b, layout, lin)
    if "G" in ls.blocks:
        out += _gdn_bytes(ls, s, b, layout, lin)
    if "-" in ls.blocks or "E" in ls.blocks:
        out += _mlp_bytes(ls, s, b, layout, lin, None if adapted is None else (saved["fc1"], saved["fc2"]))
    return out - module_freed_bytes(ls, s, b, layout, lin, modules)


def module_freed_bytes(ls: LayerShape, s: int, b: int, layout: Layout, lin: float, modules: frozenset) -> float:
    """Bytes of one layer's saved activations that Megatron-Core's ``recompute_modules`` free (megatron-core 0.16.1;
    core_attn is ``_attention_bytes``' selective case). A checkpointed module keeps its input and frees what its
    inside saves; an output-discarding one (``CheckpointWithoutOutput``) frees its output, which the next op saved
    (under fp8 that op is told to save its original input, ``set_save_original_input``, so ``lin`` bytes):

    - mla_up_proj: ``qkv_up_proj_and_rope_apply``'s outputs, the query, key and value core attention saved;
    - layernorm: the output of each norm not fused into a linear, which the linears after it saved: MLA's input
      norm (two down-projections read it) and an MoE layer's pre-MLP norm (router and experts read it); Transformer
      Engine fuses the others into ``linear_qkv`` / ``linear_fc1``, where ``input_layernorm`` is an ``IdentityOp``;
    - mlp: a dense layer's MLP (fused norm and all) but its input, the residual stream the norm-input term counts;
    - moe: an MoE layer's MLP but its input (the pre-MLP norm's output; freed by layernorm); within it moe_act and
      shared_experts free nothing more;
    - moe_act: the routed experts' activation output (linear_fc2's input);
    - shared_experts: the shared experts' FC1 outputs and activation output (their input is the router's too).
    """
    if not modules - {"core_attn"}:
        return 0.0
    t = layout.tp
    rep = t if layout.sequence_parallel else 1
    sbh = s * b * ls.hidden
    attention = "*" in ls.blocks or "S" in ls.blocks
    out = 0.0
    if ls.mla and attention and "mla_up_proj" in modules:
        out += 2.0 * s * b * (ls.q_dim + ls.kv_dim + ls.v_dim) / t
    if "layernorm" in modules:
        out += lin * sbh / rep * ((ls.mla and attention) + bool(ls.experts_per_token))
    drop = (1.0 if ls.dropout else 0.0) * sbh / rep  # the bias-dropout-add's mask sits outside the MLP
    if "mlp" in modules and "-" in ls.blocks and not ls.experts_per_token:
        out += _mlp_bytes(ls, s, b, layout, lin) - drop
    if ls.experts_per_token and "moe" in modules:
        return out + _mlp_bytes(ls, s, b, layout, lin) - drop - lin * sbh / rep
    if ls.experts_per_token and "moe_act" in modules:
        out += lin * ls.experts_per_token * _moe_load(layout) * s * b * ls.ffn / t
    if ls.experts_per_token and "shared_experts" in modules:
        out += ((4.0 if ls.gated else 2.0) + lin) * s * b * ls.shared_ffn / t
    return out


def _attention_bytes(ls: LayerShape, s: int, b: int, layout: Layout, lin: float, kind: str,
                     proj_in: float | None = None) -> float:
    """What an attention block keeps for backward (Korthikanti et al. 2022, §4.1), its norm input aside; ``lin``
    and ``proj_in`` the bytes per element the QKV and projection inputs are saved in (``proj_in`` None: ``lin``)."""
    t = layout.tp
    rep = t if layout.sequence_parallel else 1
    sbh = s * b * ls.hidden
    drop = 1.0 if ls.dropout else 0.0
    out = lin * sbh / rep  # QKV input
    # Q, K and V: fp8 attention keeps its quantized copies (TE FusedAttnFunc saves q_fp8, k_fp8, v_fp8): 1 B
    # per-tensor; row- and column-wise under MXFP8 (get_attention_quantizers sets columnwise_usage for the backward)
    qkv = 2.0
    if layout.attention_dtype == "fp8" and layout.attention != "unfused":
        qkv = 2.0 * MXFP8_BYTES if layout.fp8 == "mxfp8" else 1.0
    out += qkv * s * b * (ls.q_dim + ls.kv_dim) / t  # Q, K
    out += qkv * s * b * ls.v_dim / t  # V
    if layout.attention == "unfused" and kind != "selective":
        a_sq = ls.heads * s * s * b / t  # the whole s x s scores (a sliding window is a mask over them)
        # softmax out (2) [+ a soft-cap's tanh out (2)] [+ dropout mask (1) + dropout out (2)]
        out += a_sq * (2.0 + 2.0 * ls.softcap + 3.0 * drop)
    elif layout.attention != "unfused":
        out += 4.0 * ls.heads * s * b / t  # fp32 log-sum-exp; output O is the projection input below
    out += (lin if proj_in is None else proj_in) * s * b * ls.q_dim / t  # projection input (attention output)
    if ls.out_gate:  # its product's inputs: the gate and the ungated output
        out += 2.0 * 2.0 * s * b * ls.q_dim / t
    out += drop * sbh / rep  # attention dropout mask
    return out


def _gdn_bytes(ls: LayerShape, s: int, b: int, layout: Layout, lin: float) -> float:
    """What a Gated DeltaNet mixer keeps for backward, its norm input aside (megatron-core ``GatedDeltaNet``,
    core_v0.16.0): in_proj its input; causal_conv1d its input (q, k, v channels-first); FLA's l2norm of q and k their
    outputs; FLA's ``ChunkGatedDeltaRuleFunction`` (``ctx.save_for_backward``) q and k repeated to the value heads, v,
    the fp32 gate g, beta and the within-chunk inverse A (one chunk's width per token and head), recomputing the
    chunk states; the gated norm its input and the gate z; out_proj its input. All bf16 but ``lin``'s linear
    inputs."""
    t = layout.tp
    rep = t if layout.sequence_parallel else 1
    tokens = s * b
    out = lin * tokens * ls.hidden / rep  # in_proj input
    out += 2.0 * tokens * (2 * ls.gdn_key + ls.gdn_value) / t  # the conv's input
    out += 2.0 * tokens * 2 * ls.gdn_key / t  # l2norm outputs
    out += 2.0 * tokens * (2 * ls.gdn_repeated_key + ls.gdn_value) / t  # the scan's q, k, v
    out += (4.0 + 2.0 + 2.0 * GDN_CHUNK) * tokens * ls.gdn_heads / t  # g, beta, A: a chunk's width a token
    out += 2.0 * 2.0 * tokens * ls.gdn_value / t  # the gated norm's input and z
    out += lin * tokens * ls.gdn_value / t  # out_proj input
    return out


def _mamba_bytes(ls: LayerShape, s: int, b: int, layout: Layout, lin: float) -> float:
    """What a Mamba-2 mixer keeps for backward, its norm input aside: megatron-core runs mamba_ssm's
    ``mamba_split_conv1d_scan_combined`` (``MambaSplitConv1dScanCombinedFn.forward`` saves its input ``zxbcdt`` and
    the scan's output ``out_x`` and recomputes the conv1d output and the chunk states in backward), then the
    grouped RMSNorm (its input, the gated output) and out_proj (its input); in_proj keeps its input. The SSM
    state itself (N x P per head) is never saved: the chunk states are recomputed."""
    t = layout.tp
    rep = t if layout.sequence_parallel else 1
    out = lin * s * b * ls.hidden / rep  # in_proj input
    out += 2.0 * s * b * ls.mamba_in / t  # zxbcdt
    out += 2.0 * 2.0 * s * b * ls.mamba_inner / t  # out_x and the norm's input
    out += lin * s * b * ls.mamba_inner / t  # out_proj input
    return out


def _mlp_bytes(ls: LayerShape, s: int, b: int, layout: Layout, lin: float,
               dense_in: tuple[float, float] | None = None) -> float:
    """What an MLP or MoE block keeps for backward, its norm input aside; ``dense_in``: the bytes per element a dense
    MLP's FC1 and FC2 inputs are saved in, where they differ from ``lin`` (LoRA's frozen base)."""
    t = layout.tp
    rep = t if layout.sequence_parallel else 1
    h = ls.hidden
    sbh = s * b * h
    drop = 1.0 if ls.dropout else 0.0
    out = lin * sbh / rep  # MLP input
    # SwiGLU: FC1's gate and up outputs (the activation's input) and the product (FC2's input); eager code also keeps
    # SiLU(gate), a separate kernel's output (fused kernels, TE's / Megatron's bias_swiglu or inductor's, recompute
    # it). GeLU: input and output (FC2's input).
    per_ffn = (4.0 + lin + (2.0 if layout.stack == "eager" else 0.0)) if ls.gated else (2.0 + lin)
    if ls.experts_per_token:
        k = ls.experts_per_token
        load = _moe_load(layout)
        etp = layout.expert_tp
        width = ls.expert_width or h
        if ls.expert_width:  # LatentMoE: the down projection's output is the dispatched tensor; up's input
            out += 2.0 * s * b * width / rep + lin * s * b * width / rep
        out += 2.0 * k * load * s * b * width * etp / t  # dispatched token copies at full width (FC1's input)
        out += per_ffn * k * load * s * b * ls.ffn / t
        out += per_ffn * s * b * ls.shared_ffn / t
    elif dense_in is not None:  # a frozen dense MLP: its FC1 and FC2 inputs as LoRA leaves them
        fc1_in, fc2_in = dense_in
        out += (fc1_in - lin) * sbh / rep
        out += (per_ffn - lin + fc2_in) * s * b * ls.ffn / t
    else:
        out += per_ffn * s * b * ls.ffn / t
    out += drop * sbh / rep  # MLP dropout mask
    return out


def _moe_load(layout: Layout) -> float:
    """The busiest expert rank's tokens over the balanced share (capacity when dropping, else imbalance)."""
    return layout.moe_capacity if layout.moe_capacity > 0 else layout.moe_imbalance


def op_saved_bytes(ls: LayerShape, s: int, b: int, layout: Layout) -> float:
    """Bytes torchtitan's op-level selective checkpointing keeps per layer (``selective_ac_option='op'``).

    Its policy (``_save_list`` in ``torchtitan/models/llama3/infra/parallelize.py``) saves the outputs of SDPA and of
    every second ``mm`` of a layer, and recomputes the rest from the layer input. A Llama layer runs wq, wk, wv,
    wo, then w1, w3, w2, so the outputs of wq, wv, w1, w2 are saved with SDPA's output and log-sum-exp.
    """
    t = layout.tp
    rep = t if layout.sequence_parallel else 1
    sbh = s * b * ls.hidden
    out = 2.0 * sbh / rep  # the layer input
    out += 2.0 * s * b * (ls.q_dim + ls.v_dim) / t  # wq and wv outputs
    out += 2.0 * s * b * ls.q_dim / t + 4.0 * ls.heads * s * b / t  # SDPA output and log-sum-exp
    out += 2.0 * sbh / rep  # wo's output is recomputed; w2's (the block output) is saved
    if ls.experts_per_token:
        k = ls.experts_per_token * _moe_load(layout)
        out += 2.0 * k * s * b * ls.hidden * layout.expert_tp / t  # routed token copies (all-to-all outputs)
        out += 2.0 * k * s * b * ls.ffn / t + 2.0 * s * b * ls.shared_ffn / t  # w1 outputs
    else:
        out += 2.0 * s * b * ls.ffn / t  # w1 output
    return out


def inflight_factor(layout: Layout, num_microbatches: int, stage: int = 0) -> float:
    """Micro-batches whose activations stage ``stage`` holds at once, in units of the stage's layers.

    1F1B: stage i holds min(pp - i, m) micro-batches (Narayanan et al. 2021 §2.2.1). Interleaved adds
    (1 + (p-1)/(p*v)) on the first stage (Korthikanti et al. 2022 §4.2.3).
    """
    return inflight_microbatches(layout.schedule, layout.pp, layout.vpp, num_microbatches, stage)
