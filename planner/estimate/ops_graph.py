"""The operators of one decoder layer (and of the embedding / LM head) for a given layout, as ``OpSpec`` lists.

One place knows which GEMMs, attention and memory-bound ops a transformer layer runs under tensor, context,
sequence and expert parallelism, and which collectives go with them. The estimator prices these lists with
the estimator's pricer (``costmodel.api.Pricer.predict``); nothing else builds op lists for plans.

Shapes follow Megatron-LM's layer (Shoeybi et al. 2019, Fig. 3; Narayanan et al. 2021 §3.2): column-parallel
QKV / FC1, row-parallel output / FC2, one all-reduce (or all-gather + reduce-scatter with sequence
parallelism, Korthikanti et al. 2022 §4.2.2) after attention and after the MLP, in forward and again in backward.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field, replace

from meshplan.core.errors import MeshplanError
from meshplan.costmodel.ops import OpSpec
from meshplan.planner.estimate.memory import has_dropout, saved_input_bytes
from meshplan.planner.layout.decisions import LOWP_DEFAULT_RECIPE, RECOMPUTE_MODULES, lowp_recipe
from meshplan.planner.layout.layout import Layout
from meshplan.planner.model.flops import window_keys

# Memory-bound kernels per stack (``Layout.stack``). Megatron-Core + Transformer Engine and torch.compile fuse a norm
# into one kernel, SwiGLU / GeLU into one, RoPE into one pass over q and k (TE ``fused_apply_rotary_pos_emb``;
# inductor fuses the same chains). Eager PyTorch (HF modelling code, e.g. ``LlamaRMSNorm``: ``to(float32)``,
# ``pow(2).mean``, ``rsqrt``, ``mul``, ``to(dtype)``, ``weight *``) launches one kernel per op: the RMSNorm is one op
# of impl ``eager`` that ``costmodel.norms`` prices as that whole formula, SiLU-and-multiply is 2 kernels,
# ``apply_rotary_pos_emb`` (``q * cos + rotate_half(q) * sin``, rotate_half = slice, neg, cat) 4 passes each over
# q and k. Counted from the modelling code (transformers ``models/llama/modeling_llama.py``).
EAGER_ROPE_PASSES = 4
# Megatron-Core's attention (not MLA's) runs RoPE unfused on a YaRN-scaled model: Megatron-LM's arguments.py
# (core_r0.16.0 lines 994-995) and Megatron-Bridge's providers (``validate_rope_fusion_compatibility``,
# utils/fusions.py v0.2.0 line 53 / v0.4.2 line 71, called from gpt_provider.py line 199 / 221) turn
# apply_rope_fusion off for any position_embedding_type but "rope", and from core_r0.16.0 on apply_rotary_pos_emb
# also leaves TE's fused kernel wherever YaRN's concentration factor is not 1 (rope_utils.py lines 279-284; GPT-OSS:
# 0.1 ln 32 + 1). Its ``_apply_rotary_pos_emb_bshd`` is the eager chain (t * cos, rotate_half's neg and cat, * sin,
# the add) plus a final cat with the dimensions it passes through: five kernels that write q's size.
MEGATRON_UNFUSED_ROPE_KERNELS = EAGER_ROPE_PASSES + 1
# Those kernels run slower than the elementwise pass the op list prices each at: the broadcast multiplies and the
# rotate-half cat take PyTorch's non-vectorised paths. Measured on an H200 at GPT-OSS's shapes (bench/gpu_rope.py,
# costmodel/data/measured/nvidia-h200-rope.json), forward and backward took 6.7 such passes at micro-batch 4 and 10.2
# at 1, a pass priced as the estimator prices one (its backward twice its forward, ``GpuEstimator._bwd_s``; no faster
# than the streaming floor, ``costmodel.streaming``). Each eager chain measured there is priced at the whole number of
# its passes the measurement at the dev set's shape exceeds, never above what it took (also ``GLU_CLAMP_PASSES``,
# ``EXPERT_BIAS_PASSES``).
MEGATRON_UNFUSED_ROPE_PASSES = 6


@dataclass(frozen=True)
class LayerOps:
    """Forward compute ops, and the collectives of one layer, for one micro-batch on one rank.

    Attributes:
        compute: forward compute ops.
        core_attention: the subset recomputed by selective recompute.
        tp_comm: (kind, bytes) collectives over the TP group in forward (backward mirrors them; what Transformer
            Engine hides of them under sequence parallelism: ``estimate_gpu.te_sp_backward_tp_s``); its all-gathers
            move a low-precision recipe's quantized input (``_tp_comm``).
        ep_comm: (kind, bytes) all-to-alls over the EP group in forward (backward mirrors them), for the busiest
            rank (routing imbalance or capacity included).
        cp_comm: (kind, bytes) KV exchange over the CP group in forward (backward mirrors it: dKV); with
            ``cp_kind`` ring the exchange overlaps the attention blocks, otherwise it is exposed.
        op_recompute: what torchtitan's op-level selective checkpointing (``recompute='op'``) runs again in
            backward: every memory-bound op and every second matmul of the layer (its ``_save_list`` policy saves
            the outputs of SDPA and of alternate ``mm`` calls).
        experts: the routed experts' ops (overlappable with the all-to-all when ``moe_overlap``).
        shared: the shared experts' forward ops (overlappable with the dispatch/combine when ``shared_overlap``).
        modules: ``(module, forward ops)`` for each Megatron-Core ``recompute_modules`` entry the layer has: what
            selective recomputation of that module runs again in backward (``_LayerBuild.modules``). The "moe"
            module also runs the dispatch and combine again (``ep_comm``).
    """

    compute: tuple[OpSpec, ...]
    core_attention: tuple[OpSpec, ...]
    tp_comm: tuple[tuple[str, float], ...]
    ep_comm: tuple[tuple[str, float], ...]
    cp_comm: tuple[tuple[str, float], ...]
    op_recompute: tuple[OpSpec, ...] = ()
    experts: tuple[OpSpec, ...] = ()
    expert_copies: int = 1  # the routed experts' ops stand in ``compute`` this many times (one per local expert)
    shared: tuple[OpSpec, ...] = ()
    modules: tuple[tuple[str, tuple[OpSpec, ...]], ...] = ()
    tp_grad_gathers: tuple[float, ...] = ()
    """Bytes of each block's backward all-gather of a row-parallel layer's grad output under sequence parallelism
    (``_tp_grad_gathers``), which ``tp_comm``'s mirror prices otherwise."""
    blocks: tuple[tuple[OpSpec, ...], ...] = ()
    """``compute`` cut into its blocks in order (norm + attention, Mamba mixer, MLP or MoE): with a block memo
    (``kind_ops``), one tuple per distinct block that every layer holding it shares, so that a caller pricing op
    lists prices each block once."""

    def weighted(self) -> dict[OpSpec, int]:
        """``compute`` as {op: times it runs}: equal ops summed (an eager stack lists its local experts' ops once per
        expert, ``expert_copies``)."""
        out: dict[OpSpec, int] = {}
        for op in self.compute:
            out[op] = out.get(op, 0) + 1
        return out


@dataclass
class _LayerBuild:
    """One layer's op list as it is built: the shapes every block reads, and the ops so far."""

    model: object
    layout: Layout
    seq_len: int
    dtype: str
    ops: list = field(default_factory=list)
    blocks: list = field(default_factory=list)
    modules: dict = field(default_factory=dict)
    """``{recompute module: its forward ops}`` (megatron-core 0.16.1: ``mla_up_proj`` is MLA's
    ``qkv_up_proj_and_rope_apply``; ``layernorm`` the norms ``TransformerLayer`` checkpoints, those not fused into
    the next linear: MLA's input norm and an MoE layer's pre-MLP norm (``gpt_layer_specs``); ``mlp`` a dense
    layer's ``self.mlp`` with its fused norm; ``moe`` the MoE layer after its norm; ``moe_act`` the experts'
    activation; ``shared_experts`` theirs)."""

    def module(self, name: str, first: int) -> None:
        """Record ``ops[first:]`` as (more of) recompute module ``name``'s forward."""
        self.modules.setdefault(name, []).extend(self.ops[first:])

    def requantized(self, name: str, n: float) -> None:
        """What recomputing module ``name`` adds to the backward under an fp8 or fp4 recipe but delayed scaling:
        the linears that read its output save their original input instead of its quantized copy (Megatron-Core
        core_v0.16.1 ``set_save_original_input``: MLA's down-projections under the input norm's recompute, the
        shared experts' fc1 under the pre-MLP norm's, the grouped MLP's fc2 under ``moe_act``'s), so their backward
        quantizes those ``n`` elements again, column-wise only: 2 B read and 1 B written an element, three quarters
        of the ``cast`` class's 4 (TE's ``_Linear.backward``). Priced with the module's recomputation."""
        if self.saves_original_input():
            self.modules.setdefault(name, []).append(OpSpec("cast", (int(3 * n // 4),), self.act))

    def saves_original_input(self) -> bool:
        """Whether Megatron-Core's ``set_save_original_input`` takes effect: its stack under an fp8 recipe but
        delayed scaling (which Transformer Engine refuses it) or fp4."""
        return self.layout.stack == "megatron" and lowp_recipe(self.layout.fp8, self.dtype) not in ("none", "delayed")

    def __post_init__(self) -> None:
        lay = self.layout
        self.t, self.cp, self.b = lay.tp, lay.cp, lay.micro_batch
        self.s = self.seq_len // self.cp
        self.T = self.b * self.s  # tokens on this rank
        self.h = self.model.hidden_size
        self.a_t = max(1, self.model.num_heads // self.t)
        self.d = self.model.head_dim
        self.Tn = self.T // self.t if lay.sequence_parallel else self.T  # rows of the ops outside the TP region
        self.act, self.mm = _precisions(self.dtype, lay.fp8)
        self.drop = has_dropout(self.model)
        self.eager = lay.stack == "eager"

    def ew(self, n: float) -> OpSpec:
        return OpSpec("elementwise", (int(n),), self.act)

    def col_mm(self, n: int, k: int) -> list[OpSpec]:
        """A column-parallel GEMM of this rank's ``T`` rows (``sp_quantized``: its input quantized before the
        gather)."""
        return sp_quantized(self.mm(self.T, n, k), self.layout, gathered_input=True)

    def row_mm(self, n: int, k: int) -> list[OpSpec]:
        """A row-parallel GEMM (``sp_quantized``: its output gradient quantized before the backward's gather)."""
        return sp_quantized(self.mm(self.T, n, k), self.layout, gathered_input=False)

    def norm(self, rows: int, width: int) -> None:
        self.ops.append(norm_op(self.model, self.layout, rows, width, self.act))

    def post_norm(self) -> None:
        """A block's post-norm (``ModelSpec.post_norms``, Gemma): its output normed before the residual add, over
        the rows outside the TP region (after the row-parallel linear's reduce-scatter under sequence parallelism:
        Megatron-Bridge's ``TERowParallelLinearLayerNorm`` norms the linear's output)."""
        if self.model.post_norms:
            self.norm(self.Tn, self.h)

    def activation(self, n: float, gated: bool) -> None:
        self.ops.extend(activation_ops(n, gated, self.eager, self.act))


def norm_op(model, layout: Layout, rows: int, width: int, act: str) -> OpSpec:
    """A model's pre-norm (or final norm) over ``rows`` x ``width``: one fused kernel a pass under Transformer
    Engine (the megatron stack: ``impl`` fused, priced from cuDNN's measured norms), or by torch.compile (the
    torchtitan stack: ``compiled``); eager model code's RMSNorm formula (``impl`` eager: upcast, square, mean, scale,
    downcast, weight, one kernel each), and its ``nn.LayerNorm`` (one PyTorch kernel, the kind's default).
    ``costmodel.norms`` prices them."""
    kind = "rmsnorm" if model.norm == "rmsnorm" else "layernorm"
    impl = {"megatron": "fused", "torchtitan": "compiled", "eager": "eager" if kind == "rmsnorm" else ""}[layout.stack]
    return OpSpec(kind, (int(rows), int(width)), act, impl=impl)


def layer_ops(model, layer: int, layout: Layout, seq_len: int, dtype: str = "bf16",
              memo: dict | None = None) -> LayerOps:
    """Ops of decoder layer ``layer`` for one micro-batch on one rank: its blocks (``ModelSpec.layer_kind``) in
    order, attention (full or sliding-window), Mamba-2, Gated DeltaNet, dense MLP or MoE, each behind its own
    pre-norm (``memo``: ``kind_ops``)."""
    return kind_ops(model, model.layer_kind(layer), layout, seq_len, dtype, memo)


def kind_ops(model, kind: str, layout: Layout, seq_len: int, dtype: str = "bf16",
             memo: dict | None = None) -> LayerOps:
    """The ops of one layer made of the blocks ``kind`` (``planner.model.spec.LAYER_KINDS``). ``memo``: a dict the
    caller keeps for ``model`` (and only it), in which each block's ops are built once per value of the fields the
    block reads (``_BLOCK_FIELDS``) and shared by every layer, and layout, that holds it."""
    problem = model.split_problem(layout.tp, layout.cp) if "M" in kind or "G" in kind else ""
    if problem:
        raise MeshplanError(f"model {model.name}: {problem}")
    lb = _LayerBuild(model, layout, seq_len, dtype)
    attn_core: list[OpSpec] = []
    experts: list[OpSpec] = []
    shared: tuple[OpSpec, ...] = ()
    ep_comm: list[tuple[str, float]] = []
    cp_comm: list[tuple[str, float]] = []
    for block in kind:
        if block in "*S":
            window = model.sliding_window if block == "S" else 0
            core, v_out, kv_bytes = _block(lb, memo, "A", _attention_block, window)
            attn_core += core
            cp_comm += _cp_comm(lb, v_out, kv_bytes)
        elif block == "M":
            cp_comm += _block(lb, memo, "M", _mamba_block)
        elif block == "G":
            cp_comm += _block(lb, memo, "G", _gdn_block)
        else:
            e, sh, ep = _block(lb, memo, "E" if block == "E" else "D", _mlp_block, block == "E")
            experts, shared, ep_comm = e, sh, ep
    if attn_core:
        lb.modules["core_attn"] = list(attn_core)
    if shared:
        lb.modules["shared_experts"] = list(shared)
    return LayerOps(tuple(lb.ops), tuple(attn_core), tuple(_tp_comm(lb, kind)), tuple(ep_comm),
                    tuple(cp_comm), _op_recompute(lb.ops, attn_core), tuple(experts),
                    expert_copies(model, layout) if experts else 1, shared,
                    tuple((m, tuple(lb.modules[m])) for m in RECOMPUTE_MODULES if m in lb.modules),
                    _tp_grad_gathers(lb, kind), tuple(lb.blocks))


# What each block's ops read (besides the model, the sequence length and the dtype): a block memo's key
# (``kind_ops``). Attention reads the tokens and heads on the rank (tp, cp, micro-batch), sequence parallelism's rows
# outside the TP region, the GEMM precision, the stack's kernels, the attention kernel and Ulysses CP; the Mamba mixer
# the same but the attention's, and the model code's activation order; an MLP only the rank's tokens (inside and
# outside the TP region), tp, the precision and the stack, and an MoE block also the expert mesh, the routing load,
# the dispatcher (its token sorts), whether its experts' MLP is fused, how its router scores (fused or not) and
# whether it computes a load-balancing loss.
_COMMON_FIELDS = ("tp", "cp", "micro_batch", "sequence_parallel", "fp8", "stack")
_MAMBA_FIELDS = _COMMON_FIELDS + ("sequence_first",)
_MLP_FIELDS = ("tp", "fp8", "stack")
_BLOCK_FIELDS = {"A": _COMMON_FIELDS + ("attention", "attention_dtype"), "M": _MAMBA_FIELDS, "G": _COMMON_FIELDS,
                 "D": _MLP_FIELDS,
                 "E": _MLP_FIELDS + ("ep", "expert_tp", "moe_capacity", "moe_imbalance", "moe_dispatcher",
                                       "moe_fused_mlp", "moe_router", "moe_router_fusion", "moe_aux_loss")}
_block_fields_of = {tag: operator.attrgetter(*fields_) for tag, fields_ in _BLOCK_FIELDS.items()}


def _block(lb: _LayerBuild, memo: dict | None, tag: str, build, *args):
    """Append block ``tag``'s ops (``build(lb, *args)``) to ``lb`` and return what ``build`` returns, from ``memo``
    when it holds the block for these fields (its ops, the recompute modules it adds to, its return)."""
    if memo is None:
        first = len(lb.ops)
        out = build(lb, *args)
        lb.blocks.append(tuple(lb.ops[first:]))
        return out
    lay = lb.layout
    key = (tag, args, lb.seq_len, lb.dtype, _block_fields_of[tag](lay),
           lay.cp_kind == "a2a" if tag == "A" else (lb.T, lb.Tn) if tag in "DE" else None)
    hit = memo.get(key)
    if hit is None:
        first, before = len(lb.ops), {m: len(ops) for m, ops in lb.modules.items()}
        out = build(lb, *args)
        # each op as the memo's one object of its value: equal ops of different blocks compare by identity in the
        # caller's price tables (a search merges them 10^5 times)
        canon, ids = memo.setdefault(None, {}), {}
        for op in lb.ops[first:]:
            ids[id(op)] = canon.setdefault(op, op)
        lb.ops[first:] = [ids[id(op)] for op in lb.ops[first:]]
        for m, ops in lb.modules.items():
            ops[before.get(m, 0):] = [ids.get(id(op), op) for op in ops[before.get(m, 0):]]
        out = _same_ops(out, ids)
        added = tuple((m, tuple(ops[before.get(m, 0):])) for m, ops in lb.modules.items()
                      if len(ops) > before.get(m, 0))
        hit = memo[key] = (tuple(lb.ops[first:]), added, out)
        lb.blocks.append(hit[0])
        return out
    ops, added, out = hit
    lb.ops.extend(ops)
    for m, more in added:
        lb.modules.setdefault(m, []).extend(more)
    lb.blocks.append(ops)
    return out


def _same_ops(value, ids: dict):
    """``value`` (ops, and lists and tuples of them and of other things) with each op ``o`` replaced by
    ``ids[id(o)]`` where it has one."""
    if isinstance(value, OpSpec):
        return ids.get(id(value), value)
    if isinstance(value, (list, tuple)):
        return type(value)(_same_ops(v, ids) for v in value)
    return value


def _attention_block(lb: _LayerBuild, window: int = 0) -> tuple[list[OpSpec], int, float]:
    """The attention block's ops, appended to ``lb.ops``: (core attention ops, output projection width, KV bytes
    of this rank)."""
    model, ops, mm, T, h, a_t, d = lb.model, lb.ops, lb.mm, lb.T, lb.h, lb.a_t, lb.d
    mla = bool(model.q_lora_rank or model.kv_lora_rank)
    first = len(ops)
    lb.norm(lb.Tn, h)
    if mla:  # DeepSeek MLA (DeepSeek-V2 paper §2.1.2)
        lb.module("layernorm", first)  # MLA's input norm feeds two down-projections: not fused into either
        lb.requantized("layernorm", T * h * (2 if model.q_lora_rank else 1))  # their saved inputs
        qk = model.head_dim
        rope = model.qk_rope_head_dim
        nope = qk - rope
        if model.q_lora_rank:
            ops.extend(mm(T, model.q_lora_rank, h))
            up = len(ops)
            ops.extend(mm(T, a_t * qk, model.q_lora_rank))
            lb.module("mla_up_proj", up)
        else:
            ops.extend(mm(T, a_t * qk, h))
        ops.extend(mm(T, model.kv_lora_rank + rope, h))
        up = len(ops)
        ops.extend(mm(T, a_t * (nope + model.v_head_dim), model.kv_lora_rank))
        lb.module("mla_up_proj", up)
        v_out = a_t * model.v_head_dim
        kv_bytes = 2.0 * T * (model.kv_lora_rank + rope)
        rope_width = a_t * rope + rope
    else:
        kv = max(1, model.num_kv_heads // lb.t) * d
        gate = a_t * d if model.attn_output_gate else 0  # q_proj's output-gate half (Qwen3-Next)
        ops.extend(lb.col_mm(a_t * d + gate + 2 * kv, h))
        v_out = a_t * d
        kv_bytes = 2.0 * T * 2 * kv
        rope_width = a_t * d + kv
    if not model.position_embeddings:  # rotary embeddings on q and k
        first = len(ops)
        ops.extend(lb.ew(T * rope_width) for _ in range(_rope_passes(lb, mla)))
        if mla:  # RoPE is applied inside the up-projection's checkpoint
            lb.module("mla_up_proj", first)
    attn_core = _core_attention(lb, window)
    ops.extend(attn_core)
    if model.attn_output_gate and not mla:  # the output times sigmoid(gate): one eager pass over both
        ops.append(lb.ew(T * v_out))
    ops.extend(_proj_gemm(lb, v_out))
    lb.post_norm()
    ops.append(lb.ew(lb.Tn * h * (2 if lb.drop else 1)))  # (dropout +) residual add
    return attn_core, v_out, kv_bytes


def _rope_passes(lb: _LayerBuild, mla: bool) -> int:
    """Elementwise passes over q and k that apply the rotary embedding: one fused kernel, else the eager chain."""
    if lb.eager:
        return EAGER_ROPE_PASSES
    if not mla and lb.layout.stack == "megatron" and lb.model.rope_scaling_type == "yarn":
        return MEGATRON_UNFUSED_ROPE_PASSES
    return 1


def _mamba_block(lb: _LayerBuild) -> list[tuple[str, float]]:
    """A Mamba-2 mixer's ops (megatron-core ``MambaMixer._ssm_training``), appended to ``lb.ops``; returns its CP
    all-to-alls.

    Pre-norm, in_proj (column-parallel: z, x, B, C, dt for this rank's H/tp heads and G/tp groups), the depthwise
    causal conv1d + SiLU over x, B, C (``causal_conv1d_fn``: one read and one write of its channels, the unary
    activation class), the chunked SSD scan with the z gate (``mamba_chunk_scan_combined``: op ``ssd``, priced
    from the Mamba-2 paper's FLOPs and the kernels' bytes), the grouped RMSNorm over d_inner (groups split over
    tp, no collective), out_proj (row-parallel) and the residual. Under context parallelism
    (``MambaContextParallel``) z, x, B, C and dt go from sequence- to head-parallel by all-to-all before the conv
    and y comes back after the scan: conv and scan see the whole sequence and H/(tp cp) heads.

    The scan runs batch-first while Megatron-Core's activations are sequence-first: ``_ssm_training`` takes
    ``rearrange(zxBCdt, "l b d -> b l d").contiguous()`` before ``mamba_split_conv1d_scan_combined`` and
    ``rearrange(y, "b l d -> l b d").contiguous()`` after it (megatron-core ``ssm/mamba_mixer.py``, core_r0.16.0 to
    core_v0.19.0): at a micro-batch above 1 each is a copy (at 1 the permuted view is already contiguous, and
    ``.contiguous()`` returns it), priced as one ``copy`` of both widths; its backward, the gradients' way back,
    takes the estimator's rule for memory-bound ops. Batch-first model code (``Layout.sequence_first`` false: NeMo
    AutoModel's NemotronV3 mixer) feeds the kernel without them.
    """
    model, T, h, t, cp = lb.model, lb.T, lb.h, lb.t, lb.cp
    heads, groups, n = model.mamba_heads // t, model.mamba_groups // t, model.mamba_state
    di = heads * model.mamba_head_dim
    lb.norm(lb.Tn, h)
    lb.ops.extend(lb.col_mm(2 * di + 2 * groups * n + heads, h))
    repeat = max(1, cp // groups) if cp > 1 else 1  # groups repeated when cp exceeds them
    g_cp = max(1, groups // cp)
    if lb.b > 1 and lb.layout.stack == "megatron" and lb.layout.sequence_first:  # the scan's layout change
        lb.ops.append(OpSpec("copy", (int(T * (2 * di + 2 * groups * n * repeat + heads + di)),), lb.act))
    lb.ops.append(OpSpec("activation", (int(T * (di + 2 * groups * n)),), lb.act))  # conv1d + SiLU, T*cp/cp
    lb.ops.append(OpSpec("ssd", (lb.b, max(1, heads // cp), lb.seq_len, model.mamba_head_dim, n, g_cp,
                                 model.mamba_chunk), lb.act))
    lb.ops.append(OpSpec("rmsnorm", (int(T), di), lb.act))
    lb.ops.extend(lb.row_mm(h, di))
    lb.ops.append(lb.ew(lb.Tn * h))  # residual add
    if cp == 1:
        return []
    pre = 2.0 * T * (2 * di + 2 * groups * n * repeat + heads)
    return [("alltoall", pre), ("alltoall", 2.0 * T * di)]


def _gdn_block(lb: _LayerBuild) -> list[tuple[str, float]]:
    """A Gated DeltaNet mixer's ops (megatron-core ``GatedDeltaNet.forward``, core_v0.16.0
    ``ssm/gated_delta_net.py``), appended to ``lb.ops``; no CP collectives (it has no context parallelism:
    ``ModelSpec.gdn_split_problem``).

    Pre-norm; in_proj (column-parallel: q, k, v, the gate z, beta and alpha for this rank's heads); q, k, v made
    contiguous channels-first (a copy) for the depthwise causal conv1d + SiLU (``causal_conv1d_fn``: the unary
    activation class over its channels); FLA's l2norm of q and of k (one pass each); q and k repeated to the value
    heads (``repeat_interleave``: a copy of both at the value heads' count) and v and z made contiguous (a copy);
    g and beta from alpha and beta (a pass over two values a head); the chunked scan over the value heads (op
    ``gdn``, FLA's ``chunk_gated_delta_rule``: ``costmodel.gdn``); the gated RMSNorm over each value head (a norm and
    the SiLU gate's product, fused by ``jit_fuser``), the output back to sequence-first (a copy), out_proj
    (row-parallel) and the residual."""
    model, T, h, t = lb.model, lb.T, lb.h, lb.t
    hk, hv = model.gdn_key_heads // t, model.gdn_value_heads // t
    kd, vd = hk * model.gdn_key_head_dim, hv * model.gdn_value_head_dim
    lb.norm(lb.Tn, h)
    lb.ops.extend(lb.col_mm(2 * kd + 2 * vd + 2 * hv, h))
    lb.ops.append(OpSpec("copy", (int(T * (2 * kd + vd)),), lb.act))  # qkv channels-first for the conv
    lb.ops.append(OpSpec("activation", (int(T * (2 * kd + vd)),), lb.act))  # conv1d + SiLU
    lb.ops.append(OpSpec("activation", (int(T * 2 * kd),), lb.act))  # l2norm of q and k
    repeated = 2 * hv * model.gdn_key_head_dim if hv > hk else 0
    lb.ops.append(OpSpec("copy", (int(T * (repeated + 2 * vd)),), lb.act))  # q, k repeated; v, z contiguous
    lb.ops.append(lb.ew(T * 2 * hv))  # g = -exp(A_log) softplus(alpha + dt_bias), beta = sigmoid(beta)
    lb.ops.append(OpSpec("gdn", (lb.b, hv, lb.seq_len, model.gdn_key_head_dim, model.gdn_value_head_dim), lb.act))
    lb.ops.append(OpSpec("rmsnorm", (int(T * hv), model.gdn_value_head_dim), lb.act))
    lb.ops.append(lb.ew(T * vd))  # times SiLU(z)
    lb.ops.append(OpSpec("copy", (int(T * vd),), lb.act))  # back to sequence-first
    lb.ops.extend(lb.row_mm(h, vd))
    lb.ops.append(lb.ew(lb.Tn * h))  # residual add
    return []


def sp_quantized(ops, layout: Layout, gathered_input: bool) -> list[OpSpec]:
    """A tensor-parallel GEMM's quantize ops under sequence parallelism, where Transformer Engine quantizes on this
    rank's ``1 / tp`` of the rows and all-gathers the fp8 copy: a column-parallel layer's input in the forward
    (``LayerNormLinear``: the norm's quantized output, then ``gather_along_first_dim(ln_out, quantizer=...)``; TE
    2.16), a row-parallel layer's output gradient in the backward (``grad_output_preprocess``: quantize, then gather,
    NCCL's or Userbuffers'). Each quantize op is a ``cast`` or ``copy`` of (forward, backward) elements (``gemm_ops``);
    without sequence parallelism every rank quantizes the whole tensor."""
    t = layout.tp
    if t <= 1 or not layout.sequence_parallel:
        return list(ops)
    at = 0 if gathered_input else 1
    return [replace(op, shape=tuple(n // t if i == at else n for i, n in enumerate(op.shape)))
            if op.kind in ("cast", "copy") and len(op.shape) == 2 else op for op in ops]


def _proj_gemm(lb: _LayerBuild, v_out: int) -> list[OpSpec]:
    """The attention's output projection. Megatron-Core sets it to save its original input under fp8 recipes but
    delayed scaling and under fp4 (``set_save_original_input(self.linear_proj)``, core_v0.16.1 attention.py, TE 2.6
    and later): the forward quantizes that input row-wise only and the backward quantizes it again column-wise for
    the weight gradient, beside the output gradient (TE's ``_Linear``: the input quantizer's column-wise usage is
    ``backward_needs_input and not save_original_input``). The backward's extra pass reads 2 B and writes 1 B an
    element, three quarters of the ``cast`` class's 4; under current scaling and NVFP4 its amax reads the input
    once more (the ``copy`` of half its elements)."""
    ops = lb.row_mm(lb.h, v_out)
    if not lb.saves_original_input():
        return ops
    again = {"cast": lambda x: 3 * x // 4, "copy": lambda x: x}
    return [replace(op, shape=(op.shape[0], op.shape[1] + again[op.kind](op.shape[0])))
            if op.kind in again and len(op.shape) == 2 else op for op in ops]


def _core_attention(lb: _LayerBuild, window: int = 0) -> list[OpSpec]:
    """Scores, softmax and the weighted sum: one fused kernel, or the materialised s x s ops (Megatron 2021).

    A sliding window of ``window`` keys (GPT-OSS: 128 on every other layer) is a causal band: each query sees
    ``planner.model.flops.window_keys`` keys on average, priced as causal attention over twice that many keys
    (the same FLOPs, and the fused kernels' efficiency at that short length, where the tiles on the band's
    diagonal edge cost as under the causal mask); unfused, the window is a mask over the whole s x s scores. The
    sinks are one logit per head added to the softmax's denominator: no FLOPs to speak of."""
    layout, seq_len, b, d = lb.layout, lb.seq_len, lb.b, lb.d
    attn_heads, attn_s = lb.a_t, lb.s
    if layout.cp > 1 and layout.cp_kind == "a2a":  # Ulysses: full sequence, heads split over the CP group
        attn_heads, attn_s = max(1, lb.a_t // lb.cp), seq_len
    keys = seq_len if not window or window >= seq_len else max(1, round(2 * window_keys(seq_len, window)))
    if layout.attention != "unfused":
        dtype = _attention_dtype(lb) if layout.attention_dtype == "fp8" else lb.act
        kernel = OpSpec("attention", (b, attn_heads, attn_s, keys, d), dtype, causal=True,
                        impl=attention_impl(layout))
        return [kernel] if dtype == lb.act else [_qkv_cast(lb), kernel]
    # materialised scores: full s x s, the causal mask (and a sliding window's band: Megatron-Bridge's ``get_swa``
    # mask, HF's eager attention) applied, not skipped; a soft-cap is three eager passes over them
    # (``cap * tanh(scores / cap)``: Megatron-Bridge ``logit_softcapping``, HF ``eager_attention_forward``)
    bh, keys = b * attn_heads, seq_len
    core = [OpSpec("bmm", (bh, attn_s, keys, d), lb.act)]
    core += [lb.ew(bh * attn_s * keys) for _ in range(SOFTCAP_PASSES if lb.model.attn_softcap else 0)]
    core.append(OpSpec("softmax", (bh * attn_s, keys), lb.act))
    if lb.drop:
        core.append(lb.ew(bh * attn_s * keys))
    core.append(OpSpec("bmm", (bh, attn_s, d, keys), lb.act))
    return core


# Elementwise kernels of an eager soft-cap ``cap * tanh(x / cap)``: divide, tanh, multiply
SOFTCAP_PASSES = 3


def _attention_dtype(lb: _LayerBuild) -> str:
    """The dtype fp8 attention runs in: MXFP8 blocks under the MXFP8 recipe, per-tensor fp8 otherwise (Transformer
    Engine's qkv_type, ``Layout.attention_dtype``)."""
    return "mxfp8" if lowp_recipe(lb.layout.fp8, lb.dtype) == "mxfp8" else "fp8"


def _qkv_cast(lb: _LayerBuild) -> OpSpec:
    """fp8 attention's quantize passes: forward, Q, K and V of this rank's tokens cast from the activation dtype;
    backward, the output's gradient dO (Transformer Engine 2.16 ``FusedAttnFunc``: ``combine_and_quantize`` of Q, K,
    V before cuDNN's fp8 kernel, ``dO_quantizer`` on ``d_out`` in its backward; dQ, dK and dV come back in bf16).
    One kernel per tensor reads it once and writes every copy its quantizer asks for: under MXFP8 in training the
    row- and column-wise copies together (``MXFP8Quantizer`` with both usages: ``used_in_backward=is_training``), 2 B
    read and 1 + 1 B written an element, which is the ``cast`` class's 4 B an element; per-tensor fp8 writes one copy
    (3 B an element, priced at the class's 4). A ``cast`` of (forward elements, backward elements):
    ``GpuEstimator._bwd_s`` prices its backward as the cast of the second."""
    model = lb.model
    kv_heads = max(1, model.num_kv_heads // lb.t)
    if model.q_lora_rank or model.kv_lora_rank:  # MLA: full-width K and V out of the up-projection
        width, v_dim = lb.a_t * (2 * model.head_dim + model.v_head_dim), model.v_head_dim
    else:
        width, v_dim = lb.a_t * lb.d + 2 * kv_heads * lb.d, lb.d
    return OpSpec("cast", (int(lb.T * width), int(lb.T * lb.a_t * v_dim)), lb.act)


def _mlp_block(lb: _LayerBuild, moe: bool) -> tuple[list[OpSpec], tuple[OpSpec, ...], list[tuple[str, float]]]:
    """The MLP or MoE block's ops, appended to ``lb.ops``: (routed expert ops, shared expert ops, expert
    all-to-alls). A LatentMoE (``moe_latent_size``) projects the tokens down to the latent width before the
    dispatch and back up after the combine (megatron-core ``MoELayer`` fc1_latent_proj / fc2_latent_proj,
    replicated over tp): the all-to-alls and the experts run at the latent width."""
    model, layout, ops, mm, T, h, t = lb.model, lb.layout, lb.ops, lb.mm, lb.T, lb.h, lb.t
    first = len(ops)
    lb.norm(lb.Tn, h)
    gate = 2 if model.gated_mlp else 1
    ep_comm: list[tuple[str, float]] = []
    experts: list[OpSpec] = []
    shared: tuple[OpSpec, ...] = ()
    if moe:
        lb.module("layernorm", first)  # the router and the experts read it: not fused into a linear
        if model.shared_expert_ffn_hidden_size:  # the shared experts' fc1 saves the norm's output
            lb.requantized("layernorm", T * h)
        start = len(ops)
        k = model.experts_per_token
        ops.append(OpSpec("matmul", (T, model.num_experts, h), lb.act))  # router: tiny, kept in 16 bits
        ops.append(_router_scores(layout, T, model.num_experts, k))
        ops.extend(_aux_loss(layout, T, model.num_experts, k))
        width = model.moe_latent_size or h
        if model.moe_latent_size:
            ops.extend(mm(T, width, h))
        moves = _token_moves(lb, T * k * layout.expert_tp / t, width)
        experts = expert_ops(model, layout, T * k, lb.dtype)
        rows = T * k * layout.expert_tp / t * _expert_load(layout)  # the routed rows this rank's experts compute
        lb.modules["moe_act"] = [op for op in experts if op.kind in ("swiglu", "activation", "elementwise")]
        if not layout.moe_fused_mlp:  # fc2 saves the activation's output
            lb.requantized("moe_act", rows * model.moe_ffn_hidden_size / layout.expert_tp)
        if layout.stack == "megatron" and not layout.moe_fused_mlp:  # Megatron-Core's (and AutoModel's) eager
            # bias path (the fused grouped MLP adds fc2's bias in its GEMM); others not read
            experts += expert_bias_ops(model, rows * width)
        experts = quantization_padding_ops(layout, lb.dtype, rows * width, lb.act, experts)
        ops.extend(moves[:-1])
        ops.extend(experts)
        ops.append(moves[-1])
        if model.moe_latent_size:
            ops.extend(mm(T, h, width))
        if model.shared_expert_ffn_hidden_size:
            fs = model.shared_expert_ffn_hidden_size
            first = len(ops)
            ops.extend(lb.col_mm(gate * fs // t, h))
            lb.activation(T * fs // t, model.gated_mlp)
            ops.extend(lb.row_mm(h, fs // t))
            shared = tuple(ops[first:])
        if layout.ep > 1:
            # dispatch + combine of the token copies this rank sends (under folding, the T*k*etp/tp its experts
            # process: expert_ops), bf16; the busiest rank receives its share scaled by the routing imbalance
            # (dropless) or the capacity it pads to (token dropping)
            a2a = 2.0 * T * k * layout.expert_tp / t * width * _expert_load(layout)  # the copies this rank computes
            ep_comm = [("alltoall", a2a), ("alltoall", a2a)]
        lb.module("moe", start)
    else:
        f = model.ffn_hidden_size
        ops.extend(lb.col_mm(gate * f // t, h))
        lb.activation(T * f // t, model.gated_mlp)
        ops.extend(lb.row_mm(h, f // t))
        lb.module("mlp", first)
    lb.post_norm()
    ops.append(lb.ew(lb.Tn * h * (2 if lb.drop else 1)))
    return experts, shared, ep_comm


def _router_scores(layout: Layout, tokens: int, experts: int, topk: int) -> OpSpec:
    """The router's score function and top-k over its ``[tokens, experts]`` fp32 logits: fused
    (``moe_router_fusion``: Transformer Engine's ``fused_topk_with_score_function``), or a contiguous router's scores
    (AutoModel's fake balanced gate picks no top-k), one memory pass priced as a softmax; unfused, torch's score
    function and ``torch.topk`` at their measured time (``topk``, ``costmodel.router_topk``)."""
    if layout.moe_router_fusion or layout.moe_router == "contiguous":
        return OpSpec("softmax", (tokens, experts), "fp32")
    return OpSpec("topk", (tokens, experts, topk), "fp32")


def _aux_loss(layout: Layout, tokens: int, experts: int, topk: int) -> list[OpSpec]:
    """The router's load-balancing loss (``moe_aux_loss``): Megatron-Core's second scoring pass over the
    ``[tokens, experts]`` logits and its reductions, fused under ``moe_router_fusion`` (``costmodel.aux_loss``);
    none without one, or under a contiguous router, which scores nothing."""
    if layout.moe_aux_loss == "none" or layout.moe_router == "contiguous":
        return []
    return [OpSpec("auxloss", (tokens, experts, topk), "fp32", impl="fused" if layout.moe_router_fusion else "eager")]


def _token_moves(lb: _LayerBuild, copies: float, width: int) -> list[OpSpec]:
    """The token copies' moves around the routed experts, forward: the permute (each token gathered once per chosen
    expert into expert order), the sort of the received copies by local expert after the dispatch, its inverse
    before the combine (Megatron-Core ``MoEAlltoAllTokenDispatcher``: ``sort_chunks_by_idxs`` when a rank holds
    more than one expert and the dispatch crosses ranks; not under DeepEP), and the unpermute (each token's copies
    weighted by their router probabilities and summed), last in the list.

    A permute writes and reads every copy: a ``copy`` of ``copies x hidden`` elements (measured on one H200 at
    65536 tokens, ``bench/gpu_kernels.py``: argsort + gather 1.26 / 2.41 / 4.28 / 1.00 ms for Qwen3-30B-A3B /
    Qwen3-235B / DeepSeek-V3 / GPT-OSS-120b, which the copy class prices at 0.79-0.93x). The unpermute reads every
    copy and its probability and writes one row per token: priced as a fused pass (Transformer Engine's
    ``moe_unpermute``, Megatron-Bridge's ``moe_permute_fusion``), an ``elementwise`` op over the copies. The eager
    ``index_add_`` / ``scatter_add_`` fallback measures 8-11x slower than that price (atomics); it is not priced.
    The router's score function and top-k are priced with the router (``_router_scores``)."""
    model, layout = lb.model, lb.layout
    n = int(copies * width)  # the hidden size, or a LatentMoE's latent width
    local = max(1, model.num_experts // layout.ep)
    received = int(n * _expert_load(layout))
    alltoall = layout.moe_dispatcher == "alltoall"  # DeepEP's dispatch lands the copies by source rank, and the
    # flex dispatcher permutes them once into expert order: no second sort (``MoEFlexTokenDispatcher``)
    sort = [OpSpec("copy", (received,), lb.act)] if alltoall and layout.ep > 1 and local > 1 else []
    return [OpSpec("copy", (n,), lb.act), *sort, *sort, OpSpec("elementwise", (n,), lb.act)]


def _tp_comm(lb: _LayerBuild, kind: str) -> list[tuple[str, float]]:
    """Tensor parallelism's collectives per layer, one pair (or all-reduce) per block of ``kind`` (a transformer
    layer has two, a hybrid's layer one), over the full sequence's activations. Under sequence parallelism
    Transformer Engine all-gathers a linear's input quantized: the local shard cast by the input quantizer, then
    ``gather_along_first_dim`` on the quantized rowwise data (TE ``pytorch/module/linear.py`` forward "All-gather
    input tensor"; userbuffers gather the same quantized buffer), so the gather moves the recipe's bytes per element
    (``memory.saved_input_bytes``: fp8 1, MXFP8 1 + 1/32, NVFP4 0.5 + 1/16); the reduce-scatters carry the GEMMs'
    bf16 output, and a routed-expert block's token gather stays bf16 (Megatron's token dispatcher). Other stacks
    gather bf16. The backward's grad-output gathers: ``_tp_grad_gathers``."""
    if lb.t == 1:
        return []
    full = 2.0 * lb.T * lb.h
    if not lb.layout.sequence_parallel:
        return [("allreduce", full)] * len(kind)
    recipe = _gather_recipe(lb)
    out = []
    for block in _tp_blocks(lb, kind):
        gathered = full if block == "E" else saved_input_bytes(recipe) * lb.T * lb.h
        out += [("allgather", gathered), ("reducescatter", full)]
    return out


def _gather_recipe(lb: _LayerBuild) -> str:
    """The low-precision recipe a TP all-gather moves its data in: the layer's own on the megatron stack (Transformer
    Engine quantizes before gathering), none elsewhere."""
    return lowp_recipe(lb.layout.fp8, lb.dtype) if lb.layout.stack == "megatron" else "none"


def _tp_blocks(lb: _LayerBuild, kind: str) -> str:
    """The blocks of ``kind`` with a TP collective pair under sequence parallelism. A routed-expert block has none at
    expert TP 1: Megatron-Core's token dispatchers gather and reduce-scatter over the expert-TP group
    (``MoETokenDispatcher.tp_group = pg_collection.expt_tp``; ``MoEAlltoAllTokenDispatcher`` gathers only when its
    size is above 1, the flex dispatcher folds it into the all-to-all), and each TP rank routes its own sequence
    shard. At expert TP > 1 the pair stays priced over the full sequence, an upper bound on the routed tokens'."""
    return kind if lb.layout.expert_tp > 1 else kind.replace("E", "")


def _tp_grad_gathers(lb: _LayerBuild, kind: str) -> tuple[float, ...]:
    """Bytes of each block's backward all-gather of its row-parallel layer's grad output under sequence parallelism,
    without userbuffers. Transformer Engine quantizes the grad output before gathering it (``linear.py`` backward,
    ``gather_along_first_dim(grad_output, quantizer=grad_output_quantizer)``); the block-scaled recipes ask for both
    usages, dgrad's rowwise and wgrad's columnwise copy, and ``_all_gather_mxfp8`` / ``_all_gather_nvfp4`` move both
    (MXFP8 2 x (1 + 1/32), NVFP4 2 x (0.5 + 1/16) B per element), while tensor-scaled fp8 gathers its rowwise copy and
    transposes locally (1 B). Empty without sequence parallelism or TP."""
    if lb.t == 1 or not lb.layout.sequence_parallel:
        return ()
    recipe = _gather_recipe(lb)
    per_elem = saved_input_bytes(recipe) * (2 if recipe in ("mxfp8", "nvfp4") else 1)
    return tuple((2.0 if block == "E" else per_elem) * lb.T * lb.h for block in _tp_blocks(lb, kind))


def _cp_comm(lb: _LayerBuild, v_out: int, kv_bytes: float) -> list[tuple[str, float]]:
    """Context parallelism's collectives per layer."""
    if lb.cp == 1:
        return []
    if lb.layout.cp_kind == "a2a":  # q, k, v in and the output back, each an all-to-all of this rank's share
        qkv_bytes = 2.0 * lb.T * (lb.a_t * lb.d + 2 * max(1, lb.model.num_kv_heads // lb.t) * lb.d)
        return [("alltoall", qkv_bytes), ("alltoall", 2.0 * lb.T * v_out)]
    # ring: cp - 1 KV chunks pass each rank; allgather: the whole KV gathered at once (same bytes)
    return [("allgather", kv_bytes * lb.cp)]


STACK_ATTENTION = {"megatron": "cudnn", "torchtitan": "sdpa", "eager": "sdpa"}


def attention_impl(layout: Layout) -> str:
    """The fused attention kernel that runs: the one named, or the stack's. Megatron-Core calls Transformer Engine's
    ``DotProductAttention``, which picks cuDNN fused attention on Hopper and Blackwell; torchtitan and HF code call
    PyTorch SDPA ("sdpa"), whose own backend order the cost model resolves by device (``costmodel.attention.
    sdpa_backend``: cuDNN on Hopper and Blackwell in a current torch, FlashAttention-2 elsewhere); a stack profile
    that names the kernel pins it (torchtitan 0.2.2 cuDNN first everywhere, its December 2024 code FlashAttention-2).
    FlexAttention ("flex") takes FlashAttention-2's rate times the blog's shares (``costmodel.attention``)."""
    if layout.attention == "flex":
        return "flex"
    return layout.attention if layout.attention != "flash" else STACK_ATTENTION[layout.stack]


def _expert_load(layout: Layout) -> float:
    """Tokens the busiest expert rank handles over its balanced share: the capacity factor when tokens are dropped
    (Megatron pads each expert to its capacity, ``--moe-pad-expert-input-to-capacity``), else the routing
    imbalance of dropless routing."""
    return layout.moe_capacity if layout.moe_capacity > 0 else layout.moe_imbalance


def activation_ops(n: float, gated: bool, eager: bool, act: str) -> list[OpSpec]:
    """The MLP activation over ``n`` = tokens x FFN width output elements.

    Fused gated (Megatron-Core's bias-SwiGLU, torch.compile, TE): one "swiglu" kernel over its n outputs, reading
    gate and up and writing their product, the cost model's class for measured fused SwiGLU kernels (Vidur's
    ``mlp_act``: H100 139 us at 4096 x 11008, 1.95 TB/s over its 3n reads and writes). Eager SwiGLU runs SiLU
    (n -> n) and then the multiply (2n -> n): two kernels. Plain (bias-)GeLU / squared ReLU: one unary
    "activation", reading n and writing n. (Before 2026-11-26 a fused gated kernel was priced as a binary op over
    2n elements, 6n reads and writes for a kernel that moves 3n, and the gated kernels' measurements sat in the
    unary class.)"""
    if not gated:
        return [OpSpec("activation", (int(n),), act)]
    if eager:
        return [OpSpec("activation", (int(n),), act), OpSpec("elementwise", (int(n),), act)]
    return [OpSpec("swiglu", (int(n),), act)]


def expert_ops(model, layout: Layout, token_copies: float, dtype: str) -> list[OpSpec]:
    """The routed experts' GEMMs on one rank, for ``token_copies`` = tokens x top-k routed on this rank.

    Under MoE parallel folding the expert mesh is etp x ep x expert-dp over the stage's tp x cp x dp ranks: per rank
    the balanced work is ``token_copies / tp`` token-expert pairs at full width, i.e. ``token_copies * etp / tp``
    pairs at width ``moe_ffn / etp``. They are split over the rank's ``E / ep`` local experts (small for
    fine-grained MoE: DeepSeek-V3 at EP64 gets 4 local experts). Load imbalance or capacity scale the busiest rank.

    Every stack but plain PyTorch runs each projection of all local experts as one grouped GEMM (``groups`` = local
    experts, ``tokens per local expert`` rows each; priced by ``costmodel.grouped`` from measured grouped kernels):
    Megatron-Core's ``--moe-grouped-gemm`` (meshplan's Megatron export sets it), torchtitan's ``use_grouped_mm``
    (``MoEArgs`` default True @ 0.2.2), AutoModel's grouped experts; the activation is one kernel over all of them.
    Plain PyTorch (HF modelling code) loops over the experts: ``local`` separate GEMMs and activations, each set
    listed once per expert (``expert_copies``). Under Megatron-Core's fused grouped MLP (``moe_fused_mlp``) the
    activation, its clamp, the router-probability scale and fc2's input quantize run in the grouped GEMMs' epilogues,
    forward and backward: only the GEMMs and fc1's input quantize are listed. cuDNN frontend timed the fused kernels
    at 0.90-0.95x the priced grouped GEMM alone forward and 0.94-1.09x backward, against 0.98-1.34x of the GEMM and
    the memory-bound ops this list holds otherwise (``costmodel/data/published/cudnn_moe_grouped_blackwell.json``,
    ``tests/test_fused_moe_mlp.py``).
    """
    etp = layout.expert_tp
    fe, h = model.moe_ffn_hidden_size, model.moe_latent_size or model.hidden_size
    gate = 2 if model.gated_mlp else 1
    local = max(1, model.num_experts // layout.ep)
    rows = token_copies * etp / layout.tp * _expert_load(layout)
    per_expert = max(1, int(round(rows / local)))
    act, mm = _precisions(dtype, layout.fp8)
    eager = layout.stack == "eager"
    if eager:
        return [*mm(per_expert, gate * fe // etp, h),
                *activation_ops(per_expert * fe // etp, model.gated_mlp, True, act),
                *mm(per_expert, h, fe // etp)] * local
    if layout.moe_fused_mlp:  # activation, probability scale and fc2's input quantize in fc1's GEMM epilogue
        # backward: fc2's output gradient is quantized (its dgrad's dGLU epilogue quantizes fc1's): one cast of
        # per_expert x h, carried by fc1's input quantize
        fc1 = [replace(op, shape=(op.shape[0], op.shape[0])) if op.kind in ("cast", "copy") else op
               for op in mm(per_expert, gate * fe // etp, h)]
        fc2 = [op for op in mm(per_expert, h, fe // etp) if op.kind == "matmul"]
        return [*_grouped(fc1, local), *_grouped(fc2, local)]
    n_act = per_expert * local * fe // etp
    return [*_grouped(mm(per_expert, gate * fe // etp, h), local),
            *(glu_clamp_ops(model, n_act, act) if layout.stack == "megatron" else ()),
            *activation_ops(n_act, model.gated_mlp, False, act),
            *_grouped(mm(per_expert, h, fe // etp), local)]


# The GPT-OSS expert chains measured on an H200 (bench/gpu_rope.py, section experts; 65,536 routed rows a rank, the
# B1 GB300 / GB200 rows' shape), forward and backward: the fc1 clamp took 4.24 ms, 3.6 of its unary passes over the
# fc1 output (1.19 ms each as the estimator prices one); the fc2 bias 4.69 ms with 2 local experts (EP 64), 5.02 with
# 8 and 5.50 with 16: 1.7-2.0 of its fp32 add and cast (2.80 ms). Whole passes below each: 3 and 1 (see
# ``MEGATRON_UNFUSED_ROPE_PASSES``).
GLU_CLAMP_PASSES = 3
EXPERT_BIAS_PASSES = 1


def glu_clamp_ops(model, n_out: float, act: str) -> list[OpSpec]:
    """A clamped gated activation (GPT-OSS ``swiglu_limit``) as Megatron-Core runs it before its fused kernel
    (``weighted_bias_quick_geglu_impl`` with ``activation_func_clamp_value``, core r0.15 to main): eager PyTorch
    clamps the gate half and the linear half of the fc1 output (two unary kernels over half of it each) and
    ``torch.cat``s them back: unary passes over the ``2 n_out`` elements, as many as it measured (``GLU_CLAMP_PASSES``).
    AutoModel (meshplan's megatron stack too) compiles its clamp into the activation but adds the fc1 bias in eager
    PyTorch first (``GroupedExpertsDeepEP._apply_bias``: ``t + b`` per expert, ``torch.cat``), priced alike."""
    if not model.glu_clamp or not model.gated_mlp:
        return []
    return [OpSpec("activation", (int(2 * n_out),), act)] * GLU_CLAMP_PASSES


def expert_bias_ops(model, n_out: float) -> list[OpSpec]:
    """The routed experts' second bias (GPT-OSS) over the ``n_out`` = rows x hidden fc2 output, as Megatron-Core adds
    it: fc2 skips its bias (``skip_bias_add``) and ``TEGroupedMLP._apply_bias`` adds it weighted by the router's
    fp32 probabilities in eager PyTorch (core r0.15-r0.17: per expert ``t + b * p``, ``torch.cat``, ``.to(bf16)``;
    main's packed path since 2026-08, ``_apply_packed_bias``, the same chain over a ``repeat_interleave``d bias).
    Bytes per element: forward 28 (the broadcast product written in fp32, the add reading bf16 and fp32 and writing
    fp32, the cat, the cast down), backward 36 (the gradient cast up, the input's gradient cast down, and for the
    bias and the probabilities a product and a sum each). Priced as fp32 binary ops and fp32 casts (20 bytes an
    element a pair), as many pairs as the chain measured (``EXPERT_BIAS_PASSES``)."""
    if not model.expert_bias:
        return []
    return [OpSpec("elementwise", (int(n_out),), "fp32"), OpSpec("cast", (int(n_out),), "fp32")] * EXPERT_BIAS_PASSES


def expert_copies(model, layout: Layout) -> int:
    """How many times ``expert_ops``' list repeats one expert's ops: once per local expert when the experts run in
    a loop (plain PyTorch), once when they run as grouped GEMMs."""
    return max(1, model.num_experts // layout.ep) if layout.stack == "eager" else 1


def quantization_padding_ops(layout: Layout, dtype: str, n: float, act: str, experts: list[OpSpec]) -> list[OpSpec]:
    """``experts`` between the row padding and unpadding Megatron-Core's grouped MLP runs under fp8 and fp4, where
    each local expert's rows must be a multiple of the quantization block: ``TEGroupedMLP.forward`` (core_v0.16.1
    experts.py) pads the permuted tokens (``Fp8Padding``: TE's ``fused_multi_row_padding``, a copy of the ``n``
    elements) and unpads the output (``Fp8Unpadding``), and their backward runs the inverse copies. TE skips them
    when every count is already aligned: Hybrid-EP's dispatch pads in its kernel (``pad_multiple``), dropping and
    padding to capacity fixes the counts, and the router can pad its map (``moe_router_padding_for_quantization``,
    off by default and in every Megatron-Bridge recipe the dev set runs). Each copy is a ``copy`` of (forward,
    backward) elements: one read and one write each way."""
    if (lowp_recipe(layout.fp8, dtype) == "none" or layout.stack != "megatron" or layout.moe_fused_mlp
            or layout.moe_capacity or layout.moe_dispatcher == "hybridep"):
        return experts
    pad = OpSpec("copy", (int(n), int(n)), act)
    return [pad, *experts, pad]


def _grouped(gemm_ops, groups: int) -> list[OpSpec]:
    """One expert's GEMM ops (its input casts, the GEMM) as the grouped call over ``groups`` experts: the GEMM
    grouped, each cast one pass over all the groups' inputs."""
    return [replace(op, groups=groups) if op.kind == "matmul"
            else replace(op, shape=tuple(n * groups for n in op.shape)) for op in gemm_ops]


def _op_recompute(ops: list[OpSpec], attn_core: list[OpSpec]) -> tuple[OpSpec, ...]:
    """torchtitan ``selective_ac_option='op'``: memory-bound ops and every second matmul run again; attention
    (SDPA) and the alternate matmuls' outputs are saved (``_save_list`` in ``parallelize_llama.py``)."""
    out, n_mm = [], 0
    core = set(id(o) for o in attn_core)
    for op in ops:
        if id(op) in core:
            continue
        if op.kind == "matmul":
            n_mm += 1
            if n_mm % 2 == 0:
                out.append(op)
        elif op.kind != "bmm":
            out.append(op)
    return tuple(out)


def head_ops(model, layout: Layout, seq_len: int, dtype: str = "bf16") -> tuple[OpSpec, ...]:
    """LM head (vocab-parallel logits) and cross-entropy for one micro-batch, forward."""
    t = layout.tp
    T = layout.micro_batch * seq_len // layout.cp
    v_t = model.vocab_size // t
    act = _precisions(dtype)[0]
    # Gemma 2's final soft-cap: three eager passes over the logits (Megatron-Bridge ``Gemma2OutputLayer``, HF
    # ``Gemma2ForCausalLM.forward``)
    cap = tuple(OpSpec("elementwise", (T * v_t,), act) for _ in range(SOFTCAP_PASSES if model.logit_softcap else 0))
    return (
        norm_op(model, layout, T, model.hidden_size, act),
        OpSpec("matmul", (T, v_t, model.hidden_size), act),  # output layer: not an fp8 GEMM
        *cap,
        OpSpec("softmax", (T, v_t), "fp32"),  # cross-entropy in fp32 (Megatron vocab-parallel CE)
    ) + ((OpSpec("copy", (T * v_t,), "fp32"),) if layout.stack == "eager" else ())  # eager: logits upcast to fp32


def mtp_kinds(model) -> tuple[str, ...]:
    """The layer kinds of one MTP module: the last layer's (DeepSeek-V3), or a hybrid's ``mtp_pattern`` blocks one
    per layer (Nemotron 3 Super: "*", "E")."""
    return tuple(model.mtp_pattern) if model.mtp_pattern else (model.layer_kind(model.num_layers - 1),)


def mtp_ops(model, layout: Layout, seq_len: int, dtype: str = "bf16") -> dict[OpSpec, int]:
    """Forward ops of the multi-token-prediction modules on the last stage, {op: times it runs} (DeepSeek-V3 §2.2,
    megatron-core ``MultiTokenPredictionLayer``): per module enorm and hnorm, eh_proj (2h -> h, column-parallel),
    its transformer block(s), the final norm, and the shared output head and loss once more. Empty with MTP off."""
    out: dict[OpSpec, int] = {}
    if not model.num_mtp_layers:
        return out
    T = layout.micro_batch * seq_len // layout.cp
    act, mm = _precisions(dtype, layout.fp8)
    one = [norm_op(model, layout, T, model.hidden_size, act)] * 2 + list(mm(T, model.hidden_size // layout.tp,
                                                                     2 * model.hidden_size))
    one += head_ops(model, layout, seq_len, dtype)
    for op in one:
        out[op] = out.get(op, 0) + model.num_mtp_layers
    for kind in mtp_kinds(model):
        for op, n in kind_ops(model, kind, layout, seq_len, dtype).weighted().items():
            out[op] = out.get(op, 0) + n * model.num_mtp_layers
    return out


def embedding_ops(model, layout: Layout, seq_len: int, dtype: str = "bf16") -> tuple[OpSpec, ...]:
    T = layout.micro_batch * seq_len // layout.cp
    return (OpSpec("embedding", (T, model.hidden_size), _precisions(dtype)[0]),)


def gemm_ops(dtype: str, recipe: str, m: int, n: int, k: int) -> tuple[OpSpec, ...]:
    """The ops of one decoder ``m x n x k`` GEMM under ``dtype`` and fp8 ``recipe`` (``_precisions``): its input's
    quantize passes (none in bf16), then the GEMM."""
    return _precisions(dtype, recipe)[1](m, n, k)


def _precisions(dtype: str, recipe: str = "none"):
    """(the dtype of everything but the decoder GEMMs, a function giving the ops of one GEMM ``(m, n, k)``).

    fp8 training (Transformer Engine's recipes, as Megatron-Core and NeMo run them; DeepSeek-V3 report §3.3) runs
    the linear layers' GEMMs in fp8 and everything else in bf16: attention (FlashAttention in bf16 unless fp8
    attention is asked for), norms, activations, residuals, embedding and the output layer. Each fp8 GEMM first
    casts its bf16 input to fp8 with its scale (a read of 2 B and a write of 1 B per element): priced as a ``cast``
    of the ``m x k`` input. Per recipe (``Layout.fp8``; ``dtype='fp8'`` alone means TE's default, delayed):
    delayed scaling folds the amax into that cast (the scale comes from the amax history); tensor-wise current
    scaling needs the amax of the tensor before casting it, one more read of the input (priced as a copy of half
    its elements: the same bytes); block-wise (1x128 tiles) and MXFP8 (1x32 blocks) compute their scales inside
    the cast kernel. The GEMM carries the recipe (``OpSpec.impl``) for the cost model. The weights' casts are per
    step, not per micro-batch (TE caches them across micro-batches), and are priced by the estimator. In the
    backward the GEMM quantizes its output's gradient, ``m x n`` (TE 2.16 ``_Linear.backward``: ``grad_output``
    through its quantizer, row- and column-wise for dgrad and wgrad, its amax first under current scaling), while
    the input's column-wise copy for wgrad was written by the forward's cast: each quantize op carries those
    elements as its backward's (``GpuEstimator._bwd_s``).

    NVFP4 (``dtype='nvfp4'`` or recipe ``nvfp4``; TE ``NVFP4BlockScaling``) runs fprop, dgrad and wgrad in NVFP4
    (``matmul`` in ``nvfp4``) with the same bf16 rest. Quantizing a GEMM input takes two passes (TE 2.20
    ``transformer_engine/pytorch/csrc/quantizer.cpp`` ``NVFP4Quantizer::quantize_impl``): the amax of the input and
    of its Hadamard-rotated transpose, which set the FP32 tensor scales (``nvte_hadamard_transform_amax``, one read:
    priced as a copy of half the elements, as the tensor-wise amax), then one fused kernel writing the rowwise
    1x16-block copy for fprop and the random-Hadamard-transformed columnwise copy for wgrad (the ``cast``);
    stochastic rounding of gradients is done by the Blackwell convert instruction inside that cast.
    """
    recipe = lowp_recipe(recipe, dtype)
    if recipe == "none":
        return dtype, lambda m, n, k: (OpSpec("matmul", (m, n, k), dtype),)
    act = "bf16" if dtype in LOWP_DEFAULT_RECIPE else dtype
    gemm_dtype = "nvfp4" if recipe == "nvfp4" else "fp8"

    def gemm(m, n, k):
        x, dy = int(m) * int(k), int(m) * int(n)  # forward: the input quantized; backward: the output's gradient
        out = (OpSpec("cast", (x, dy), act), OpSpec("matmul", (m, n, k), gemm_dtype, impl=recipe))
        if recipe in ("tensorwise", "nvfp4"):
            return (OpSpec("copy", (x // 2, dy // 2), act),) + out
        return out

    return act, gemm
