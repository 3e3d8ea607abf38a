"""Blackwell dense GEMMs priced against the H100 through OpenXLA's measured GEMM table.

No kernel dataset here times a GEMM on a Blackwell part: the learned model prices a B200 GEMM by extrapolating
from its peak and bandwidth features. OpenXLA ships the dot throughput its latency-hiding scheduler profiled on an
H100 (sm_90) and a B200 (sm_100) at the same 375 shapes (``costmodel/data/published/xla_gemm_sm90_sm100.json``).
One harness timed both parts, so the ratio of the two times measures how much longer a B200 takes than an H100 on
the same GEMM, free of any factor the harness puts on both (a fixed overhead it adds does not cancel: it pulls the
ratio toward 1 on small GEMMs). A price on a Blackwell part is scaled so that its ratio to the same pricer's H100
price is the measured one:

    t(B) = t_model(B) * scale
    scale = median over the shapes of (measured t_B200 / t_H100) / (t_model(B200) / t_model(H100))

over the single GEMMs (b = 1, the planner's matmuls) of at least ``MIN_FLOPS``. The measured ratio falls with size
(0.70 at 2^33 FLOPs, 0.55 at 2^37-2^38, 0.47 at the largest shape, 4 x 4096^3), and the model's falls with it: the
scale, their quotient, stays 1.19-1.32 over 2^33-2^38 (1.09 at that one largest shape), so a training step's GEMMs
(1e11-1e13 FLOPs, beyond the table) take it as measured on the largest ones here. The H100 end is the part the
learned model was trained on, and the one whose step times the dev set checks (S1, S5, T). GB200 is the B200's die
(the model carries its higher clock through its peak, 1.11x the B200 on a compute-bound GEMM, where FlashAttention-2
measured the die at 1.08x: ``costmodel.api`` floors a GB200 GEMM at the B200's price over that speed,
``costmodel.flash2_blackwell``); the B300 and GB300 are Blackwell Ultra (sm_103), which the table does not hold:
the GB300 takes the B200's scale, and the source says so (``costmodel.api`` divides it, and the GB200's floor, by
the GB300's measured speed over the GB200); the B300 has its own, from Transformer Engine's benchmark
(``costmodel.te_gemm``). Batched ``bmm`` ops keep the model's price.
Held out: the batched shapes (b = 2, 4), priced as one GEMM of b*m rows, except those that coincide with a single
GEMM of the table.
"""
from __future__ import annotations

import functools
import statistics
from typing import Callable, Mapping

from meshplan.costmodel.measured import published_file
from meshplan.costmodel.ops import OpSpec

DATA_FILE = "xla_gemm_sm90_sm100.json"  # in costmodel/data/published
COMMIT = "71feeddf"
REFERENCE = "H100-SXM"  # sm_90 in the table
MEASURED = "B200"  # sm_100
# the parts whose GEMMs take the scale: the B200's die (sm_100) and Blackwell Ultra (sm_103, unmeasured)
# (the B300 is scaled by its own measurement, ``costmodel.te_gemm``)
PARTS = {"B200": "measured", "GB200": "the B200's die", "GB300": "sm_103, unmeasured here: the B200's"}
Price = Callable[[OpSpec, str], float]  # (op, part name) -> a pricer's one-shot seconds
MIN_FLOPS = 2 * 2048**3  # 1.7e10: both parts past their launch floor (the smaller shapes run 3-60 us)


@functools.lru_cache(maxsize=1)
def table() -> tuple[Mapping, ...]:
    """The packaged rows (b, m, n, k, sm_90 and sm_100 FLOP/s), read once per process."""
    return tuple(published_file(DATA_FILE)["rows"])


def _ratios(price: Price, batched: bool) -> list[float]:
    """(measured B200 / H100 time) / (priced B200 / H100 time) of the single (or the batched) GEMMs of at least
    ``MIN_FLOPS``; a batched one whose b*m x n x k is a single GEMM of the table is left out (the same price);
    ``price(op, part name)``: the model's one-shot seconds."""
    singles = {(r["m"], r["n"], r["k"]) for r in table() if r["b"] == 1}
    out = []
    for r in table():
        flops = 2.0 * r["b"] * r["m"] * r["n"] * r["k"]
        if flops < MIN_FLOPS or (r["b"] > 1) != batched or (batched and (r["b"] * r["m"], r["n"], r["k"]) in singles):
            continue
        op = OpSpec("matmul", (r["b"] * r["m"], r["n"], r["k"]), "bf16")
        measured = r["sm_90_flops_per_s"] / r["sm_100_flops_per_s"]
        out.append(measured / (price(op, MEASURED) / price(op, REFERENCE)))
    return out


def gemm_scale(price: Price, device_name: str) -> tuple[float, str]:
    """(scale, source words) of a dense GEMM price on ``device_name``: 1 and "" off ``PARTS``."""
    if device_name not in PARTS:
        return 1.0, ""
    scale = statistics.median(_ratios(price, batched=False))
    where = PARTS[device_name]
    return scale, (f"x {scale:.3f}: the B200/H100 time ratio OpenXLA measured on the same GEMMs (xla {COMMIT} "
                   f"matmul_interpolator_data.h, sm_100 / sm_90, bf16){'' if where == 'measured' else '; ' + where}")


def held_out_ratios(price: Price) -> tuple[list[float], list[float]]:
    """(in sample, held out) measured / scaled-priced B200 time ratio to the H100: the single GEMMs the scale is
    the median of, and the batched ones it never saw."""
    inside = _ratios(price, batched=False)
    scale = statistics.median(inside)
    return [r / scale for r in inside], [r / scale for r in _ratios(price, batched=True)]
