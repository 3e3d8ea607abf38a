"""``OpSpec``: one operator instance (kind, shape, dtype) — the unit the cost model prices and the graph holds.

Shape conventions per kind (all sizes in elements):
    matmul:      (m, n, k)                 C[m,n] = A[m,k] @ B[k,n]
    bmm:         (b, m, n, k)
    attention:   (b, heads, s_q, s_kv, d_head)   SDPA / flash, causal unless ``causal=False``
    layernorm, rmsnorm, softmax:  (rows, cols)
    elementwise, activation, swiglu, copy, cast, optimizer:  (numel,)   (swiglu: its n outputs; a cast or copy
                 may be (numel, backward numel): a quantize whose backward quantizes another tensor, priced apart)
    embedding:   (tokens, hidden)
    ssd:         (b, heads, seq, head_dim, state, groups, chunk)   Mamba-2 chunked SSD scan (Dao & Gu 2024)
    gdn:         (b, heads, seq, key_dim, value_dim)   Gated DeltaNet's chunked scan (Yang et al. 2025), value heads
    topk:        (tokens, experts, k)      an MoE router's eager score function and torch.topk (fp32 scores)
    auxloss:     (tokens, experts, k)      an MoE router's load-balancing loss, its second scoring pass (fp32)
    allreduce, allgather, reducescatter, alltoall, sendrecv:  (bytes,) with ``group_size`` participants
"""
from __future__ import annotations

import math
from dataclasses import dataclass

COMPUTE_KINDS = (
    "matmul", "bmm", "attention", "layernorm", "rmsnorm", "softmax",
    "elementwise", "activation", "swiglu", "embedding", "optimizer", "copy", "cast",
)
# Compute kinds the learned model holds no class for (training never sees them), priced apart (``costmodel.api``):
# the Mamba-2 scan by the calibrated roofline, the router's eager top-k from its own measurements
# (``costmodel.router_topk``), the router's load-balancing loss from the same and its bytes (``costmodel.aux_loss``),
# Gated DeltaNet's scan from FLA's published timings (``costmodel.gdn``).
ANALYTIC_KINDS = ("ssd", "topk", "auxloss", "gdn")
COLLECTIVE_KINDS = ("allreduce", "allgather", "reducescatter", "alltoall", "sendrecv")
OP_KINDS = COMPUTE_KINDS + COLLECTIVE_KINDS

# OpSpec.impl values per kind family ("" is always allowed: the kind's default implementation).
ATTENTION_IMPLS = ("flash2", "flash3", "cudnn", "flex", "sdpa")  # sdpa: PyTorch SDPA's own order, by device
FP8_RECIPES = ("tensorwise", "delayed", "rowwise", "blockwise", "mxfp8", "nvfp4")  # low-precision GEMM recipes
MEMORY_BOUND_IMPLS = ("fused", "eager")
NORM_IMPLS = MEMORY_BOUND_IMPLS + ("compiled",)  # a norm's kernel differs by who generated it (costmodel.norms)
COLLECTIVE_IMPLS = ("ring", "tree", "nvls")
IMPLS = {"attention": ATTENTION_IMPLS, "matmul": FP8_RECIPES, "bmm": FP8_RECIPES,
         **{k: MEMORY_BOUND_IMPLS for k in ("softmax", "elementwise", "activation", "swiglu", "cast", "copy",
                                             "auxloss")},
         "layernorm": NORM_IMPLS, "rmsnorm": NORM_IMPLS,
         **{k: COLLECTIVE_IMPLS for k in ("allreduce", "allgather", "reducescatter", "alltoall", "sendrecv")}}

# The MoE load-balancing loss's memory passes, bytes a [tokens, experts] score (``costmodel.aux_loss`` says which):
# eager: the routing map's fill, cast, out-of-place scatter and cast, and the two reductions; fused: TE's score kernel
# (logits read; scores, map and saved softmax written), the map's count and the loss kernel; backward: the score
# function's backward and the gradient's accumulation (fused: the loss kernel's gradient first, then read with it)
AUX_EAGER_PASS_BYTES = 4 + (4 + 4) + (4 + 4) + (4 + 1) + 1 + 4
AUX_FUSED_PASS_BYTES = (4 + 4 + 1 + 4) + 1 + 4
AUX_EAGER_BWD_BYTES = 8 + 12
AUX_FUSED_BWD_BYTES = 4 + 12 + 12

DTYPE_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "mxfp8": 1, "nvfp4": 0.5, "int8": 1, "int4": 0.5}


@dataclass(frozen=True)
class OpSpec:
    """One operator instance.

    Attributes:
        kind: One of ``OP_KINDS``.
        shape: Kind-specific tuple (see module docstring).
        dtype: Element type of the math (``bf16``, ``fp16``, ``fp32``, ``fp8``, ``nvfp4``, ``int8``, ``int4``).
        group_size: Participants of a collective (1 for compute ops).
        causal: Attention only: causal mask halves the score FLOPs.
        backward: True for the backward of the op (priced as the forward's FLOP multiple by the model).
        impl: Which implementation runs the op, when that changes its speed ("" = the kind's default). The
            vocabulary the planner emits and the cost model prices (``IMPLS``):
            attention: ``flash2`` (FlashAttention-2, PyTorch SDPA's flash backend), ``flash3`` (FlashAttention-3,
            Hopper), ``cudnn`` (cuDNN fused attention, Transformer Engine), ``flex`` (FlexAttention);
            matmul / bmm in fp8: the scaling recipe, ``tensorwise``, ``delayed``, ``rowwise``, ``blockwise``,
            ``mxfp8`` (casts and amax are priced with the GEMM);
            memory-bound kinds (norms, softmax, elementwise, activation, cast, copy): ``fused`` (Transformer Engine
            or torch.compile kernels) or ``eager`` (one PyTorch kernel per op); a norm tells the two fused ones apart:
            ``fused`` Transformer Engine's, ``compiled`` torch.compile's (``costmodel.norms``);
            collectives: the NCCL algorithm, ``ring``, ``tree``, ``nvls``.
        groups: matmul only: a grouped GEMM of ``groups`` GEMMs of ``shape`` each, in one kernel (MoE experts;
            ``costmodel.grouped``). FLOPs and bytes are the groups' total.
    """

    kind: str
    shape: tuple[int, ...]
    dtype: str = "bf16"
    group_size: int = 1
    causal: bool = True
    backward: bool = False
    impl: str = ""
    groups: int = 1

    def __post_init__(self) -> None:
        if self.impl and self.impl not in IMPLS.get(self.kind, ()):
            raise ValueError(f"OpSpec {self.kind}: impl {self.impl!r} is not one of {IMPLS.get(self.kind, ())}")
        if self.groups != 1 and (self.kind != "matmul" or self.groups < 1):
            raise ValueError(f"OpSpec {self.kind}: groups={self.groups}; only a matmul is grouped (groups >= 1)")

    def __eq__(self, other: object) -> bool:
        # field by field, no tuples built: price memos compare equal ops built apart 10^5 times a search
        if self is other:
            return True
        if other.__class__ is not OpSpec:
            return NotImplemented
        return (self.shape == other.shape and self.kind == other.kind and self.dtype == other.dtype
                and self.backward == other.backward and self.impl == other.impl and self.groups == other.groups
                and self.group_size == other.group_size and self.causal == other.causal)

    def __hash__(self) -> int:
        # cached: a layout search looks ops up in price memos 10^5-10^6 times, each hash a tuple of eight fields
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.kind, self.shape, self.dtype, self.group_size, self.causal, self.backward, self.impl,
                      self.groups))
            object.__setattr__(self, "_hash", h)
        return h

    @property
    def is_collective(self) -> bool:
        return self.kind in COLLECTIVE_KINDS

    @property
    def flops(self) -> float:
        """Floating-point operations of the forward op (multiply-add = 2 FLOPs)."""
        return op_flops(self)

    @property
    def bytes(self) -> float:
        """Bytes read + written from device memory (compute) or payload bytes (collectives)."""
        return op_bytes(self)


def op_flops(op: OpSpec) -> float:
    s = op.shape
    k = op.kind
    mult = 2.0 if op.backward and k in ("matmul", "bmm") else 1.0  # dX and dW: 2x the forward GEMM
    if k == "matmul":
        return mult * 2.0 * s[0] * s[1] * s[2] * op.groups
    if k == "bmm":
        return mult * 2.0 * s[0] * s[1] * s[2] * s[3]
    if k == "attention":
        b, heads, sq, skv, d = s
        f = 4.0 * b * heads * sq * skv * d  # QK^T and AV
        if op.causal:
            f /= 2.0
        return f * (2.5 if op.backward else 1.0)  # flash backward: 5 GEMMs vs 2 forward (FA2 paper)
    if k in ("layernorm", "rmsnorm", "softmax"):
        return 5.0 * s[0] * s[1]
    if k in ("elementwise", "activation", "cast", "copy"):
        return float(s[0])
    if k == "swiglu":
        return 5.0 * s[0]  # SiLU (sigmoid: exp, add, divide; times x) and the product, per output
    if k == "optimizer":
        return 12.0 * s[0]  # Adam: ~12 flops / element
    if k == "embedding":
        return 0.0
    if k == "ssd":
        return ssd_flops(op)
    if k == "gdn":
        return gdn_flops(op) * (2.0 if op.backward else 1.0)
    return 0.0


# Chunk length of FLA's chunked gated delta rule (fla.ops.gated_delta_rule.chunk: BT = 64)
GDN_CHUNK = 64


def gdn_flops(op: OpSpec) -> float:
    """FLOPs of the chunked gated delta rule's forward (Yang, Kautz & Hatamizadeh, ICLR 2025, arXiv:2412.06464
    §3.3, the WY form over chunks of ``GDN_CHUNK`` tokens; FLA's ``chunk_gated_delta_rule``), per token and head, in
    multiply-adds: the within-chunk Gram of the keys (C d_k), its triangular solve (C^2 / 3), w and u from it
    (C (d_k + d_v)), the state's correction and update (2 d_k d_v), the output's inter-chunk (d_k d_v) and
    intra-chunk parts (C (d_k + d_v)). Its backward is counted at twice that (as a GEMM's dX and dW); the price does
    not read it (``costmodel.gdn`` counts work in forward FLOPs)."""
    b, heads, seq, dk, dv = op.shape[:5]
    c = GDN_CHUNK
    macs = 3 * dk * dv + c * (3 * dk + 2 * dv) + c * c / 3
    return 2.0 * b * heads * seq * macs


def ssd_flops(op: OpSpec) -> float:
    """FLOPs of the chunked SSD algorithm (Dao & Gu 2024, arXiv:2405.21060, §6 and Listing 1 ``ssd_minimal``) over
    chunks of length Q, per token: the diagonal blocks' ``C B^T`` per group (Q N multiply-adds, half of them
    under the causal mask) and their ``(L o C B^T) X`` per head (Q P, half), the chunk states ``B^T X`` (N P per
    head) and the states' contribution to the output ``C h`` (N P per head); the state passing between chunks
    (N P per chunk) is negligible. Linear in the sequence: O(T N Q + T N P) against attention's O(T^2).

    The backward is mamba_ssm's ``_mamba_chunk_scan_combined_bwd`` (``ssd_combined.py``) kernel by kernel: it
    recomputes ``C B^T`` (all Q x Q, G Q N) and the chunk states (H P N), then the states' gradient (H P N), dx
    (causal Q P and the states' H P N), dB and dC (H P N each), dCB (causal Q P), its two products back to dB and
    dC (G Q N each) and the stable dA cumsum gradient (causal Q P): 3 G Q N + 5 H P N + 1.5 H Q P."""
    b, heads, seq, p_dim, n, groups, q = op.shape
    if op.backward:
        macs = 3 * groups * q * n + 5 * heads * p_dim * n + 1.5 * heads * q * p_dim
    else:
        macs = groups * q * n / 2 + heads * q * p_dim / 2 + 2 * heads * n * p_dim
    return 2.0 * b * seq * macs


def ssd_bytes(op: OpSpec, l2_bytes: float = math.inf) -> float:
    """HBM bytes of the SSD as mamba_ssm runs it, per token (16-bit tensors ``e`` bytes, fp32 scratch 4), on a part
    whose L2 holds ``l2_bytes`` (``ssd_group_rereads``: what the heads of a group read again once their group's
    tensors outgrow it; the default, an unbounded L2, prices each group's tensors read once).

    Forward: five kernels (chunk cumsum, chunk-state bmm ``C B^T``, chunk state, state passing, chunk scan) that
    write and read their intermediates in fp32 ("mostly bottlenecked by memory bandwidth and latency ... writing
    and reading intermediate data", PyTorch blog "Accelerating Mamba2 with Kernel Fusion", 2025): x read twice, z
    once, B and C twice each, dt once, y written and, with the z gate, the ungated y too (``_chunk_scan_fwd``
    returns ``out_x``, which the backward reads); C B^T written and read (G Q per token), the chunk states
    written, read and written by the state passing, read by the scan (4 H P N / Q), dA cumsum and dt written once
    and read three times.

    Backward: ``_mamba_chunk_scan_combined_bwd``'s fourteen kernels, each reading its inputs from HBM and writing
    its outputs (``ssd_bwd_bytes``)."""
    b, heads, seq, p_dim, n, groups, q = op.shape
    e = DTYPE_BYTES.get(op.dtype, 2)
    rereads = ssd_group_rereads(op, l2_bytes)
    if op.backward:
        return b * seq * ssd_bwd_bytes_per_token(heads, p_dim, n, groups, q, e) + rereads
    io = e * (5 * heads * p_dim + 4 * groups * n + heads)
    scratch = 4.0 * (2 * groups * q + 4 * heads * p_dim * n / q + 8 * heads)
    return b * seq * (io + scratch) + rereads


def ssd_group_rereads(op: OpSpec, l2_bytes: float) -> float:
    """HBM bytes the heads of a group read again from their group's shared tensors, over the batch.

    mamba_ssm's chunk-state and chunk-scan kernels, forward and backward, run one program per head (the head is the
    outermost axis of their grids) and each reads its group's tiles: ``C B^T`` (fp32, Q a token) and B or C (N
    each). Forward, the chunk scan reads C B^T and C, the chunk state B: 4 Q + 2 e N a token and head. Backward,
    dx reads B and C B^T, the dA gradient C B^T, the states' gradient and dC read C, dB and the chunk-state
    recompute B: 8 Q + 5 e N. Between two heads of a group the kernels sweep that group's tensors over the whole
    batch, b T (4 Q + 2 e N) bytes; the share L2 does not hold, ``1 - L2 / that``, comes again from HBM for each
    head past the first. With a group per head nothing is shared. Checked against mamba_ssm's own forward timed on
    an H200 (20 shapes, one group of 24-128 heads, 2k-32k tokens) and a B200 (22 shapes, a group a head):
    ``bench/ssd_vs_costmodel.py``."""
    b, heads, seq, p_dim, n, groups, q = op.shape
    if heads <= groups or math.isinf(l2_bytes):
        return 0.0
    e = DTYPE_BYTES.get(op.dtype, 2)
    miss = max(0.0, 1.0 - l2_bytes / ssd_group_tensor_bytes(op))
    per_head = (8 * q + 5 * e * n) if op.backward else (4 * q + 2 * e * n)
    return b * seq * (heads - groups) * per_head * miss


def ssd_group_tensor_bytes(op: OpSpec) -> float:
    """Bytes of one group's tensors that its heads' kernels sweep over the batch: ``C B^T`` (fp32, Q a token) and B
    and C (N each)."""
    b, heads, seq, p_dim, n, groups, q = op.shape
    return b * seq * (4 * q + 2 * DTYPE_BYTES.get(op.dtype, 2) * n)


def ssd_bwd_bytes_per_token(heads: int, p_dim: int, n: int, groups: int, q: int, e: float) -> float:
    """HBM bytes per token of mamba_ssm's SSD backward (``ssd_combined._mamba_chunk_scan_combined_bwd``), read off
    its kernels' arguments. Per-head tensors (x, z, y, dy, dx, dz: H P elements a token) are read or written 17
    times: dz (x, z, y, dy in; dz, dy_x out), the states' gradient (dy), dx (x, dy in; dx out), dB (x), dC (dy),
    dCB (x, dy), the dA gradient (x, dy) and the chunk-state recompute (x). The chunk states (H P N / Q a token)
    pass six times in fp32 (recomputed and written, read and written by the state passing, the states' gradient
    written, read by its passing backward) and five times in 16 bits (the passing backward's two outputs, read by
    dx, dB and dC). B, C and their gradients (G N) 11 times in 16 bits and 4 in fp32 (dB and dC partials and
    their residuals in the C B^T backward); ``C B^T`` and its gradient (G Q, fp32) six times; dt and the dA
    cumsum (H, fp32) about 27 times."""
    head = 17 * e * heads * p_dim
    states = (6 * 4 + 5 * e) * heads * p_dim * n / q
    bc = (11 * e + 4 * 4) * groups * n
    cb = 6 * 4 * groups * q
    return head + states + bc + cb + (e + 108) * heads


def ssd_chunk_scan_bytes(b: int, seq: int, heads: int, p_dim: int, n: int, groups: int, q: int, e: float) -> float:
    """Unique HBM bytes of the chunk-scan forward kernel alone (``_chunk_scan_fwd``): x, C, C B^T, dt, dA cumsum
    and the previous chunk states in, y out, all ``e`` bytes an element (the measured kernel's fp16 inputs,
    ``costmodel/data/published/ssd_chunk_scan_h800.json``)."""
    per_token = e * (2 * heads * p_dim + groups * n + groups * q + 2 * heads + heads * p_dim * n / q)
    return b * seq * per_token


def op_bytes(op: OpSpec) -> float:
    s = op.shape
    k = op.kind
    e = DTYPE_BYTES.get(op.dtype, 2)
    if op.is_collective:
        return float(s[0])
    if k == "matmul":
        m, n, kk = s
        return e * (m * kk + kk * n + m * n) * (2.0 if op.backward else 1.0) * op.groups
    if k == "bmm":
        b, m, n, kk = s
        return e * b * (m * kk + kk * n + m * n) * (2.0 if op.backward else 1.0)
    if k == "attention":
        b, heads, sq, skv, d = s
        return e * b * heads * d * (2 * sq + 2 * skv) * (2.0 if op.backward else 1.0)
    if k in ("layernorm", "rmsnorm", "softmax"):
        return e * 2.0 * s[0] * s[1] * (2.0 if op.backward else 1.0)
    if k == "elementwise":
        return e * 3.0 * s[0]  # binary: two inputs, one output
    if k == "activation":
        return e * 2.0 * s[0]  # unary: read one tensor, write one
    if k == "swiglu":
        return e * 3.0 * s[0]  # fused gated activation: read gate and up, write their product
    if k in ("copy", "cast"):
        return e * 2.0 * s[0]
    if k == "optimizer":
        return 16.0 * s[0] + 2.0 * s[0]  # fp32 master, m, v, grad read+write, bf16 param write
    if k == "embedding":
        return e * 2.0 * s[0] * s[1]
    if k == "ssd":
        return ssd_bytes(op)
    if k == "gdn":  # what crosses the kernels' boundary: q, k, v, the gate and beta read, the output written
        b, heads, seq, dk, dv = s[:5]
        return e * b * heads * seq * (2 * dk + 2 * dv + 2) * (2.0 if op.backward else 1.0)
    if k == "topk":  # forward: the fp32 scores read, the kept scores and their int64 indices written; backward: the
        # zero-fill and scatter of the kept scores' gradients (4 B a score), the score function's backward (scores and
        # their gradient read, the logits' written: 12 B)
        return 4.0 * s[0] * s[1] + 12.0 * s[0] * s[2] if not op.backward else 16.0 * s[0] * s[1]
    if k == "auxloss":  # bytes a score of the load-balancing loss's passes (``costmodel.aux_loss``)
        fused = op.impl == "fused"
        per = (AUX_FUSED_BWD_BYTES if fused else AUX_EAGER_BWD_BYTES) if op.backward else (
            AUX_FUSED_PASS_BYTES if fused else AUX_EAGER_PASS_BYTES)
        return float(per * s[0] * s[1])
    return 0.0
