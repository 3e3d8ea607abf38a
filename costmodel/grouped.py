"""Grouped GEMMs (MoE experts): how fast one grouped kernel runs against the dense GEMM of the same total size.

A grouped GEMM (``OpSpec.groups`` > 1) runs ``groups`` GEMMs of ``m x n x k`` in one kernel: torch ``_grouped_mm`` /
``_scaled_grouped_mm`` (torchtitan ``MoEArgs.use_grouped_mm``, NeMo AutoModel), Transformer Engine's
``GroupedLinear`` (Megatron-Core ``--moe-grouped-gemm``, which every NeMo / Megatron-Bridge MoE recipe and meshplan's
Megatron export set). It is priced as the dense GEMM of ``(groups * m) x n x k`` divided by the grouped kernel's
measured efficiency at ``m`` rows per group: ``dense time / grouped time`` of the same M x K x N.

The efficiencies are meshplan's own kernel measurements (``bench/gpu_kernels.py``; ``data/measured/*.json``, one
file per GPU, with its README): Qwen3-30B-A3B, Qwen3-235B-A22B, DeepSeek-V3 and GPT-OSS-120b expert shapes x
8/16/32 local experts x gate_up and down, balanced routing, 128-8192 rows per expert, on one H200 and one H100
(CUDA events, L2 flushed, medians). The median over every case and device at each width is the rate; between the
measured widths it is interpolated in log2(m), and held at the end values outside them (fewer than 128 rows: the
dense GEMM's own price already falls with m, the grouped kernel's share is the narrowest measured one's).

- bf16 forward and dgrad: ``_grouped_mm`` (3-D weights); wgrad: ``_grouped_mm`` 2-D x 2-D, measured on its own.
- fp8 (any scaling recipe): ``_scaled_grouped_mm`` rowwise, forward. No fp8 wgrad was measured: its backward takes
  the forward's share for dgrad and, for wgrad, the forward's share scaled by bf16's wgrad / forward ratio.
- nvfp4: no grouped NVFP4 kernel has been measured; the fp8 shares stand in (``--explain`` says so).
Both GPUs are Hopper parts with the same SMs and clocks; Blackwell and Ampere take the same shares (no measurement).
"""
from __future__ import annotations

import math
import statistics
from collections import defaultdict
from functools import lru_cache

from meshplan.costmodel.measured import measured_files

SOURCE = "grouped/dense ratio measured on H200 + H100 (costmodel/data/measured, bench/gpu_kernels.py)"


def curves_of(files: list[dict]) -> dict[tuple[str, str], tuple[tuple[float, float], ...]]:
    """(pass, dtype) -> ((log2 rows per group, median dense/grouped time ratio), ...) over ``files``' GEMMs."""
    ratios: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    for data in files:
        for r in data["sections"]["gemm"]["records"]:
            if "grouped" in r and "dense" in r:
                key = (r["pass"], r["dtype"], int(r["tokens_per_expert"]))
                ratios[key].append(r["dense"]["median_ms"] / r["grouped"]["median_ms"])
    curves: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for (pass_, dtype, m), vals in sorted(ratios.items()):
        curves[(pass_, dtype)].append((math.log2(m), statistics.median(vals)))
    return {k: tuple(v) for k, v in curves.items()}


@lru_cache(maxsize=1)
def _curves() -> dict[tuple[str, str], tuple[tuple[float, float], ...]]:
    return curves_of(list(measured_files().values()))


def _at(curve: tuple[tuple[float, float], ...], rows: int) -> float:
    x = math.log2(max(1, rows))
    if x <= curve[0][0]:
        return curve[0][1]
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return curve[-1][1]


def grouped_efficiency(rows_per_group: int, dtype: str, backward: bool, curves: dict | None = None) -> float:
    """Dense time / grouped time for a grouped GEMM of ``rows_per_group`` rows per group (forward; backward: the
    mean time of dgrad and wgrad, so the harmonic mean of their shares), from ``curves`` (``curves_of``; default:
    every measured GPU)."""
    curves = curves or _curves()
    lowp = dtype in ("fp8", "nvfp4", "mxfp8")
    fwd = _at(curves[("fwd", "fp8" if lowp else "bf16")], rows_per_group)
    if not backward:
        return fwd
    wgrad_bf16 = _at(curves[("wgrad", "bf16")], rows_per_group)
    wgrad = fwd * wgrad_bf16 / _at(curves[("fwd", "bf16")], rows_per_group) if lowp else wgrad_bf16
    return 2.0 / (1.0 / fwd + 1.0 / wgrad)


# The catalogue device each measurement file was taken on (``environment.device_name`` in the file: "NVIDIA H200",
# "NVIDIA H100 80GB HBM3").
MEASURED_ON = {"nvidia-h200.json": "H200", "nvidia-h100.json": "H100-SXM"}


def priced_over_measured(pricer, data: dict, device, curves: dict | None = None) -> dict[tuple[str, int], list[float]]:
    """(dtype, rows per expert) -> predicted / measured time of each grouped forward call in one measurement file,
    priced by ``pricer`` with the shares of ``curves`` (default: every measured GPU)."""
    from meshplan.costmodel.ops import OpSpec

    out: dict[tuple[str, int], list[float]] = defaultdict(list)
    for r in data["sections"]["gemm"]["records"]:
        if r["pass"] != "fwd" or "grouped" not in r:
            continue
        impl = "rowwise" if r["dtype"] == "fp8" else ""
        dense = OpSpec("matmul", (r["m_total"], r["n"], r["k"]), r["dtype"], impl=impl)
        share = grouped_efficiency(r["tokens_per_expert"], r["dtype"], False, curves)
        out[(r["dtype"], r["tokens_per_expert"])].append(
            pricer.predict(dense, device) / share * 1e3 / r["grouped"]["median_ms"])
    return dict(out)
