"""Gated DeltaNet's chunked scan, priced from FLA's published timings of its kernels.

Gated DeltaNet (Yang, Kautz & Hatamizadeh, "Gated Delta Networks: Improving Mamba2 with Delta Rule", ICLR 2025,
arXiv:2412.06464) is the linear-attention mixer of Qwen3-Next's three layers in four. Training stacks run FLA's
Triton kernels for it (``fla.ops.gated_delta_rule.chunk_gated_delta_rule``: transformers' ``Qwen3NextGatedDeltaNet``
and Megatron-Core's ``GatedDeltaNet``, core_v0.16.0 ``ssm/gated_delta_net.py``), which no op-level dataset of ours
measures. FLA publishes the kernel's forward and forward+backward at six shapes on one GB200
(``data/published/fla_chunk_gdn_gb200.json``). Every row fits ``t = t0 + flops x s`` (least squares, forward and
forward+backward apart): ``flops`` those of the chunked algorithm (``costmodel.ops.gdn_flops``), ``s`` seconds per
forward FLOP of GPU work, ``t0`` a per-call constant the same from 0.07 M to 1.05 M token-heads (0.64 ms forward,
1.57 ms forward+backward): the benchmark times back-to-back calls of one Python function that launches some ten
Triton kernels forward and twenty backward, and FLA's maintainers write that "in many cases, FLA kernels are
bottlenecked by kernel launch overhead" (fla-org/flash-linear-attention issue 471, 2025-06), so ``t0`` is read as
the host's time, which a training step's host spends ahead of the GPU, and is not priced (each kernel keeps the cost
model's launch floor; ``--explain`` says so). Leave-one-shape-out, the fit prices each held-out row within 11%
forward and 27% forward+backward (the tiny D 64 shape; ``tests/test_gdn.py``). On another part the GPU work takes the
GB200's seconds scaled by its dense bf16 peak over the part's: the kernels are tensor-core tiles bound by neither unit
alone, as the Mamba-2 scan's (``costmodel.roofline``, "ssd"), and no timing on another part is published.
"""
from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

import numpy as np

from meshplan.costmodel.devices import DeviceSpec, get_device
from meshplan.costmodel.ops import OpSpec, gdn_flops
from meshplan.costmodel.roofline import KERNEL_LAUNCH_S

GDN_FILE = "data/published/fla_chunk_gdn_gb200.json"
# Kernels FLA launches per call (fla.ops.gated_delta_rule.chunk: the l2norms of q and k, the gate's chunk cumsum,
# the within-chunk Gram, its triangular solve, w and u, the state recurrence and the output; the backward runs them
# again and their gradients), each given the cost model's launch floor
FWD_KERNELS, BWD_KERNELS = 9, 20

SOURCE = ("FLA's chunk_gated_delta_rule forward and forward+backward timed on a GB200 at six shapes "
          "(fla-org/flash-linear-attention README 'Benchmarks' @ bc3b101d; costmodel/data/published/"
          "fla_chunk_gdn_gb200.json): the GPU seconds per FLOP of the fit over them, scaled by the part's dense "
          "bf16 peak over the GB200's; the fit's per-call constant (0.64 ms forward, 1.57 ms forward+backward, "
          "read as FLA's Python launching its kernels) is not priced")


def published_rows() -> list[dict]:
    """The file's rows, as transcribed."""
    text = resources.files("meshplan.costmodel").joinpath(GDN_FILE).read_text(encoding="utf-8")
    return json.loads(text)["rows"]


def row_op(row: dict, backward: bool = False) -> OpSpec:
    """The op one published row timed: B sequences of T tokens, H heads of width D for keys and values."""
    return OpSpec("gdn", (row["B"], row["H"], row["T"], row["D"], row["D"]), backward=backward)


def fit(rows: list[dict], column: str) -> tuple[float, float]:
    """(per-call seconds, GPU seconds per forward FLOP) of ``t = t0 + flops x s`` over ``rows``' ``column``
    (milliseconds), least squares."""
    x = np.array([[1.0, gdn_flops(row_op(r))] for r in rows])
    y = np.array([r[column] for r in rows]) * 1e-3
    t0, s = np.linalg.lstsq(x, y, rcond=None)[0]
    return float(t0), float(s)


@lru_cache(maxsize=1)
def gb200_seconds_per_flop() -> tuple[float, float]:
    """(forward, backward) GPU seconds per forward FLOP on the GB200: the forward fit's slope, and the
    forward+backward fit's less it."""
    rows = published_rows()
    fwd = fit(rows, "chunk_gdn_fwd_ms")[1]
    return fwd, fit(rows, "chunk_gdn_fwdbwd_ms")[1] - fwd


def time_s(op: OpSpec, device: DeviceSpec) -> float:
    """Seconds of one ``gdn`` op (forward, or its backward with ``op.backward``) on ``device``: its forward FLOPs
    (``gdn_flops``, the fit's unit either way) at the GB200's seconds per FLOP, scaled by dense peak (bf16, else fp32
    on a part without it), plus each kernel's launch floor."""
    fwd, bwd = gb200_seconds_per_flop()
    dtype = "bf16" if device.supports("bf16") else "fp32"
    scale = get_device("GB200").peak("bf16") / device.peak(dtype)
    if op.backward:
        return gdn_flops(op) * bwd * scale + BWD_KERNELS * KERNEL_LAUNCH_S
    return gdn_flops(op) * fwd * scale + FWD_KERNELS * KERNEL_LAUNCH_S


def unmeasured(device: DeviceSpec) -> str:
    """What no measurement covers when a ``gdn`` op runs on ``device``, for ``--explain``."""
    where = "" if device.name == "GB200" else (
        f"no timing on {device.name} is published: the GB200's seconds scaled by dense bf16 peak; ")
    return (f"{where}FLA's per-call host time (0.64 ms forward, 1.57 ms forward+backward on the GB200's host) is not "
            "priced: a step whose host cannot run ahead of these kernels takes it too")
