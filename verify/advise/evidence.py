"""What one rank's trace shows about the layout it ran: its phases, its collectives and their groups, the shapes of
its GEMMs and attention, the dtypes its kernels name.

Phases: a host op runs in *backward* when an autograd node (``autograd::engine::evaluate_function: ...``, which
PyTorch's engine records around every node it runs) is open on the same thread; otherwise in forward (or the
optimizer, ``Optimizer.step*``). A forward op that runs inside a backward node is a recomputed forward
(``torch.utils.checkpoint`` and Megatron's ``CheckpointFunction`` rerun the layer's forward from the node of their
backward).
"""
from __future__ import annotations

import bisect
import re
from collections import Counter
from dataclasses import dataclass, field

from meshplan.profiler.trace import RankTrace

BACKWARD_NODE = "autograd::engine::evaluate_function: "
# Ops only a forward pass calls (autograd's backward formulas call aten::mm / convolution_backward, never these).
FORWARD_OPS = ("aten::linear", "aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::convolution")
ATTENTION_OPS = ("aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention",
                 "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention",
                 "aten::_flash_attention_forward", "aten::_efficient_attention_forward", "FlashAttnFunc",
                 "FlashAttnVarlenFunc", "FusedAttnFunc")
# Kernel name fragments that name the math dtype (CUTLASS/cuBLAS: f16, bf16, e4m3; ATen templates: c10::Half ...).
_DTYPE_TOKENS = (("fp8", re.compile(r"fp8|e4m3|e5m2|f8f8")), ("bf16", re.compile(r"bf16|bfloat16")),
                 ("fp16", re.compile(r"f16|fp16|c10::half|(?<![a-z])half")), ("fp32", re.compile(r"f32|fp32|sgemm")))
_GEMM_KERNEL = re.compile(r"gemm|cutlass|xmma|matmul|s16816|s1688", re.IGNORECASE)


@dataclass(frozen=True)
class Collective:
    """One collective the rank issued: its type, phase (forward | backward | optimizer), group size (None when the
    trace does not say), and payload bytes (0 when unknown)."""

    coll: str
    phase: str
    group_size: int | None
    nbytes: float
    name: str
    peer: int | None = None


@dataclass
class RankEvidence:
    """What one rank's trace shows. Counts are per traced step (totals divided by the number of steps)."""

    rank: int
    steps: int
    collectives: list[Collective] = field(default_factory=list)
    backward_nodes: int = 0
    graph_roots: float = 0.0  # backward passes started (a forward GEMM followed by an autograd node)
    forward_ops: float = 0.0  # FORWARD_OPS and autograd Functions with a Backward node, outside backward
    recomputed_ops: float = 0.0  # the same ops inside a backward node
    recomputed_kinds_ops: float = 0.0  # forward ops of the (name, shapes) that are recomputed at all, outside backward
    attention_ops: float = 0.0  # ATTENTION_OPS outside backward
    recomputed_attention: float = 0.0  # ATTENTION_OPS inside a backward node (selective recompute re-runs them)
    linear_shapes: Counter = field(default_factory=Counter)  # ((tokens dims...), (out, in)) of forward linears
    attention_shapes: Counter = field(default_factory=Counter)  # Input Dims of forward attention ops
    bmm_shapes: Counter = field(default_factory=Counter)  # baddbmm/bmm inputs (unfused attention)
    gemm_dtypes: Counter = field(default_factory=Counter)  # dtype -> GEMM kernels naming it
    deepep_kernels: int = 0
    graph_launches: float = 0.0  # cudaGraphLaunch runtime calls (CUDA-graph replays)
    fp8_recipes: Counter = field(default_factory=Counter)  # scaling the fp8 cast kernels name
    has_gpu: bool = False
    sends: float = 0.0
    recvs: float = 0.0
    peers: set = field(default_factory=set)
    dtensor: bool = False  # ops ran on DTensors (their recorded shapes are global)
    mesh: dict = field(default_factory=dict)  # DeviceMesh dimension -> size, from pg_config's "mesh_<dim>" groups


def _backward_windows(t: RankTrace) -> dict[str, list[tuple[float, float]]]:
    """Per lane, the merged [start, end) windows of autograd nodes."""
    raw: dict[str, list[tuple[float, float]]] = {}
    for e in t.events:
        if e.cat == "cpu_op" and e.name.startswith(BACKWARD_NODE):
            raw.setdefault(e.lane, []).append((e.ts_us, e.end_us))
    out = {}
    for lane, ws in raw.items():
        ws.sort()
        merged = [list(ws[0])]
        for a, b in ws[1:]:
            if a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        out[lane] = [(a, b) for a, b in merged]
    return out


def _inside(windows: list[tuple[float, float]] | None, ts_us: float) -> bool:
    if not windows:
        return False
    i = bisect.bisect_right(windows, (ts_us, float("inf"))) - 1
    return i >= 0 and windows[i][0] <= ts_us < windows[i][1]


def _forward_function_names(t: RankTrace) -> set[str]:
    """Autograd Functions whose backward node also ran (``LinearWithGradAccumulation...`` and its ``...Backward``)
    plus the forward-only ATen ops."""
    names = {e.name for e in t.events if e.cat == "cpu_op"}
    funcs = {n[:-len("Backward")] for n in names if n.endswith("Backward") and "::" not in n}
    # Megatron's tensor-parallel linears are autograd Functions (LinearWithGradAccumulationAndAsyncCommunication):
    # forward GEMMs even in a forward-only trace
    linears = {n for n in names if n.startswith("LinearWith") and not n.endswith("Backward")}
    return (funcs & names) | linears | set(FORWARD_OPS)


def _group_size(t: RankTrace, e, kernel_sizes: dict[str, int]) -> int | None:
    """The group's size: the ranks the event names, its process group in ``pg_config``, the group the device's
    kernels of the same collective name, or the one process group a trace lists."""
    if e.group_ranks:
        return len(e.group_ranks)
    sizes = {str(pg.get("pg_name")): pg.get("pg_size") for pg in t.pg_config if isinstance(pg.get("pg_size"), int)}
    if e.pg is not None and str(e.pg) in sizes:
        return sizes[str(e.pg)]
    if e.coll in kernel_sizes:
        return kernel_sizes[e.coll]
    return next(iter(sizes.values())) if len(sizes) == 1 else None


def _kernel_group_sizes(t: RankTrace) -> dict[str, int]:
    """Per collective type, the one group size its device kernels name (types with several sizes left out)."""
    seen: dict[str, set[int]] = {}
    for e in t.events:
        if e.kind == "comm" and e.cat == "kernel" and e.coll and e.group_ranks:
            seen.setdefault(e.coll, set()).add(len(e.group_ranks))
    return {k: next(iter(v)) for k, v in seen.items() if len(v) == 1}


def _phase(e, windows, optimizer: list[tuple[float, float]]) -> str:
    if _inside(windows.get(e.lane), e.ts_us):
        return "backward"
    if _inside(optimizer, e.ts_us):
        return "optimizer"
    return "forward"


def _collectives(events: list, t: RankTrace, windows) -> list[Collective]:
    """Host-issued collectives (c10d ops; one per call, nested duplicates dropped), else the device's comm kernels
    (DeepEP and NCCL kernels of traces whose host side records none)."""
    optimizer = sorted((e.ts_us, e.end_us) for e in events if e.cat == "cpu_op"
                       and e.name.startswith("Optimizer.step"))
    host = [e for e in events if e.cat == "cpu_op" and e.coll is not None]
    host.sort(key=lambda e: (e.lane, e.ts_us, -e.dur_us))
    kept, open_until = [], {}
    for e in host:
        if e.ts_us < open_until.get(e.lane, -1.0):
            continue  # record_param_comms inside c10d::allreduce_: the same call
        open_until[e.lane] = e.end_us
        kept.append(e)
    if not kept:
        kept = [e for e in events if e.kind == "comm" and e.cat == "kernel"]
    sizes = _kernel_group_sizes(t)
    return [Collective(e.coll or "collective", _phase(e, windows, optimizer), _group_size(t, e, sizes), e.bytes,
                       e.name, e.peer) for e in kept]


def _kernel_dtype(name: str) -> str | None:
    low = name.lower()
    for dtype, pat in _DTYPE_TOKENS:
        if pat.search(low):
            return dtype
    return None


def _fp8_recipe(low: str) -> str:
    """The scaling an fp8 cast kernel's name says: DeepSeek-V3's per-token 1x128 tiles are block-wise (§3.3.2),
    MX blocks mxfp8, else one scale per tensor."""
    if "mxfp8" in low or "mx_" in low:
        return "mxfp8"
    if "per_token" in low or "per_channel" in low or "block" in low or "128" in low:
        return "blockwise"
    return "tensorwise"


def rank_evidence(t: RankTrace) -> RankEvidence:
    """The evidence of one rank's trace (every traced step)."""
    steps = max(1, len(t.steps))
    ev = RankEvidence(rank=t.rank, steps=steps, has_gpu=t.has_gpu)
    windows = _backward_windows(t)
    events = [e for e in t.events if e.step is not None] if t.steps else t.events  # warm-up steps left out
    ev.collectives = _collectives(events, t, windows)
    ev.mesh = {str(pg["pg_desc"])[5:]: pg["pg_size"] for pg in t.pg_config if str(pg.get("pg_desc", "")).startswith(
        "mesh_") and isinstance(pg.get("pg_size"), int)}
    fwd_names = _forward_function_names(t)
    ev.dtensor = any(e.cat == "cpu_op" and e.name in ("Redistribute", "_FromTorchTensor") for e in events)
    fwd = rec = roots = nodes = att = att_rec = 0
    fwd_by, rec_by = Counter(), Counter()  # the same ops by (name, input shapes)
    order: list[tuple[float, bool]] = []  # (start, is a backward node) of forward GEMMs and autograd nodes
    for e in events:
        if e.cat == "cpu_op":
            if e.name.startswith(BACKWARD_NODE):
                nodes += 1
                order.append((e.ts_us, True))
                continue
            inside = _inside(windows.get(e.lane), e.ts_us)
            if e.name in fwd_names:
                rec += inside
                fwd += not inside
                (rec_by if inside else fwd_by)[(e.name, e.shapes)] += 1
                if not inside:
                    order.append((e.ts_us, False))
                weight = e.shapes[1] if e.shapes and len(e.shapes) >= 2 else None
                if not inside and isinstance(weight, tuple) and len(weight) == 2 and e.shapes[0]:
                    ev.linear_shapes[(tuple(e.shapes[0]), tuple(weight))] += 1
            elif e.name in ATTENTION_OPS:
                att_rec += inside
                att += not inside
                if not inside and e.shapes:
                    ev.attention_shapes[tuple(tuple(s) for s in e.shapes[:3] if isinstance(s, tuple))] += 1
            elif e.name in ("aten::baddbmm", "aten::bmm") and not inside and e.shapes:
                ev.bmm_shapes[tuple(tuple(s) for s in e.shapes[:3] if isinstance(s, tuple))] += 1
            elif e.name in ("c10d::send", "c10d::recv_") or e.name.startswith(("c10d::send", "c10d::recv")):
                ev.sends += e.name.startswith("c10d::send")
                ev.recvs += e.name.startswith("c10d::recv")
                if e.peer is not None:
                    ev.peers.add(e.peer)
        elif e.cat == "cuda_runtime" and e.name.startswith("cudaGraphLaunch"):
            ev.graph_launches += 1
        elif e.cat == "kernel":
            low = e.name.lower()
            if "dpsk::ep::" in low or "deep_ep::" in low:
                ev.deepep_kernels += 1
            elif "fp8" in low and ("cast" in low or "quant" in low):
                ev.fp8_recipes[_fp8_recipe(low)] += 1
            elif e.kind != "comm" and _GEMM_KERNEL.search(e.name):
                dtype = _kernel_dtype(e.name)
                if dtype:
                    ev.gemm_dtypes[dtype] += 1
    order.sort()
    roots = sum(1 for a, b in zip(order, order[1:]) if not a[1] and b[1])  # forward, then a backward pass starts
    ev.backward_nodes, ev.graph_roots = nodes, roots / steps
    ev.forward_ops, ev.recomputed_ops = fwd / steps, rec / steps
    ev.attention_ops, ev.recomputed_attention = att / steps, att_rec / steps
    ev.recomputed_kinds_ops = sum(fwd_by[k] for k in rec_by) / steps
    ev.sends, ev.recvs = ev.sends / steps, ev.recvs / steps
    ev.graph_launches /= steps
    return ev
