"""An MoE router's eager top-k: the score function and ``torch.topk`` over every token's expert scores, measured.

Megatron-Core's ``TopKRouter`` without ``moe_router_fusion`` (its ``TransformerConfig`` default, core_r0.16.0 to
core_v0.19.0; ``moe_utils.topk_routing_with_score_function`` with ``fused=False``) runs ``torch.softmax`` or
``torch.sigmoid`` over the ``[tokens, experts]`` logits in fp32 and then ``torch.topk`` over each row; with the
fusion, Transformer Engine's ``fused_topk_with_score_function`` does both in one kernel, which no published
measurement times (it is priced as the score function's memory pass, ``kind`` softmax). The eager pair was timed on
one H100 and one H200 (``bench/gpu_kernels.py``, ``costmodel/data/measured/nvidia-h100.json`` and
``nvidia-h200.json``, section ``permute``: ``router_softmax_topk`` and ``router_sigmoid_topk`` at 4,096, 16,384
and 65,536 tokens over 128 and 256 experts, top-4 and top-8): the 48 medians follow ``t0 + c x tokens x experts``
within 11% (``fit``, least squares), about 7 ns a token at 128 experts and 14 at 256. The two parts ran alike
(their HBM differs by 1.4x, their SMs and clock not), so the kernel is bound by its SMs' issue rate, not by memory:
another part's time is scaled by SM count x clock against the measured parts', an assumption no measurement checks
off Hopper, which ``source`` says. The backward is ``topk``'s scatter of the kept scores' gradients into a zeroed
``[tokens, experts]`` fp32 tensor and the score function's backward over it (read the scores and their gradient,
write the logits' gradient): its bytes (``costmodel.ops.op_bytes``) at the memory-bound kernels' share of HBM
bandwidth.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from meshplan.costmodel.devices import DeviceSpec, catalogue
from meshplan.costmodel.measured import measured_files
from meshplan.costmodel.ops import OpSpec
from meshplan.costmodel.roofline import ROOFLINE_EFFICIENCY

# measurement file -> the catalogued part it ran on (its environment.device_name: NVIDIA H100 80GB HBM3, NVIDIA H200)
MEASURED_ON = {"nvidia-h100.json": "H100-SXM", "nvidia-h200.json": "H200"}
OPS = ("router_softmax_topk", "router_sigmoid_topk")


def records() -> list[dict]:
    """The measured router records: {part, tokens, experts, topk, op, seconds}."""
    out = []
    for name, part in MEASURED_ON.items():
        data = measured_files().get(name)
        for r in (data or {}).get("sections", {}).get("permute", {}).get("records", ()):
            if r.get("op") in OPS and "median_ms" in r:
                out.append({"part": part, "tokens": r["tokens"], "experts": r["experts"], "topk": r["topk"],
                            "op": r["op"], "seconds": r["median_ms"] * 1e-3})
    return out


def _seconds(t0_per: tuple[float, float], tokens: int, experts: int) -> float:
    """The fitted form: fixed seconds plus seconds per token and expert."""
    return t0_per[0] + t0_per[1] * tokens * experts


def _fit(rows: list[dict]) -> tuple[float, float]:
    x = np.array([[1.0, r["tokens"] * r["experts"]] for r in rows])
    y = np.array([r["seconds"] for r in rows])
    (t0, per), *_ = np.linalg.lstsq(x, y, rcond=None)
    return float(t0), float(per)


@lru_cache(maxsize=1)
def fit() -> tuple[float, float]:
    """(fixed seconds, seconds per token and expert) of the measured parts, least squares over every record."""
    return _fit(records())


def held_out() -> tuple[list[float], list[float]]:
    """(priced / measured of every record under ``fit``, the same with the records of one expert count priced by
    the fit of the other's alone): the extrapolation over experts a model beyond the measured 128 and 256 needs."""
    rows = records()

    def ratio(r, t0_per):
        return _seconds(t0_per, r["tokens"], r["experts"]) / r["seconds"]

    inside = [ratio(r, fit()) for r in rows]
    held = []
    for experts in sorted({r["experts"] for r in rows}):
        others = _fit([r for r in rows if r["experts"] != experts])
        held += [ratio(r, others) for r in rows if r["experts"] == experts]
    return inside, held


def issue_rate(device: DeviceSpec) -> float:
    """SMs x clock, Hz: what the kernel's time scales with across parts (module docstring)."""
    return device.sm_count * device.clock_hz


@lru_cache(maxsize=1)
def _measured_rate() -> float:
    """The measured parts' mean SMs x clock, Hz."""
    parts = catalogue()
    return float(np.mean([issue_rate(parts[p]) for p in MEASURED_ON.values()]))


def time_s(op: OpSpec, device: DeviceSpec) -> float:
    """Seconds of the eager score function and top-k over ``op.shape`` = (tokens, experts, top-k) on ``device``,
    forward or (``op.backward``) backward."""
    if op.backward:
        return op.bytes / (device.mem_bw_bytes_per_s * ROOFLINE_EFFICIENCY["elementwise"][1])
    scale = _measured_rate() / issue_rate(device) if device.sm_count and device.clock_hz else 1.0
    return _seconds(fit(), op.shape[0], op.shape[1]) * scale


def source(device: DeviceSpec) -> str:
    """What the price of ``device`` rests on, for ``--explain``."""
    measured = ", ".join(sorted(set(MEASURED_ON.values())))
    said = (f"measured on {measured} (torch softmax / sigmoid + topk, bench/gpu_kernels.py)"
            f"{'' if device.name in MEASURED_ON.values() else f', scaled by SMs x clock to {device.name}'}")
    return f"eager router top-k {said}"
