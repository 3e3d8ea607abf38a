"""How fast a 4-bit block-scaled GEMM's main loop runs on Blackwell, from published B200 measurements.

The low-precision GEMM rule (``costmodel.api.fp8_time_share``) prices an NVFP4 GEMM from its bf16 twin as
``t_bf16 * (main + FP8_FIXED_K / k)``, the main loop at the part's bf16 / nvfp4 peak ratio (a quarter on a B200).
Measured, it is slower than that: ``costmodel/data/published/fp4_gemm_b200.json`` keeps the training-sized rows of
vLLM PR #20646 (its CUTLASS NVFP4 GEMM against torch bf16 in the same run, M 4096-16384) and DeepGEMM PR #348
(cuBLASLt's MXFP4 GEMM, the library Transformer Engine calls, at 4096 x 4096 x 7168 and 8192^3). Each row gives
``main = t_fp4 / t_bf16 - FP8_FIXED_K / k``, with t_bf16 the same run's bf16 GEMM or, for the cuBLASLt rows (no bf16
column), the median of the vLLM rows' bf16 rates (B200 cuBLAS at M >= 4096); the multiple is the median main over
the B200's peak ratio. The GB200 is the B200's die and takes it.

Blackwell Ultra (B300, GB300: sm_103, a sixth of the bf16 time on the datasheet) has its own: Transformer Engine's
GEMM benchmark on a B300 (``costmodel.te_gemm``) ran the twelve GEMMs of one layer pre-quantized in NVFP4 and in
BF16 in one run, and each pass gives a main loop the same way (its fixed part the FLOP-weighted mean over the pass's
K values); the multiple is their median over the B300's peak ratio, 1.61: the part's 1.5x larger fp4 datasheet peak
buys 1.22x over the B200 at these shapes.
"""
from __future__ import annotations

import statistics
from functools import lru_cache

from meshplan.costmodel import te_gemm
from meshplan.costmodel.devices import catalogue
from meshplan.costmodel.measured import published_file

DATA_FILE = "fp4_gemm_b200.json"  # in costmodel/data/published
SOURCE = ("vLLM PR #20646 (CUTLASS NVFP4) and DeepGEMM PR #348 (cuBLASLt MXFP4) on a B200, "
          "costmodel/data/published/fp4_gemm_b200.json")
ULTRA = ("B300", "GB300")  # Blackwell Ultra (sm_103): measured on a B300 by Transformer Engine's benchmark


def source(device_name: str) -> str:
    """The measurement ``device_name``'s NVFP4 main loop rests on."""
    return f"{te_gemm.SOURCE}, NVFP4 against BF16" if device_name in ULTRA else SOURCE


def _data() -> dict:
    return published_file(DATA_FILE)


def row_mains(fixed_k: float) -> list[float]:
    """Each published row's main-loop share of its bf16 twin's time (``t_fp4 / t_bf16 - fixed_k / k``)."""
    rows = _data()["rows"]
    plateau = statistics.median(r["bf16_tflops"] for r in rows if "bf16_tflops" in r)
    return [r.get("bf16_tflops", plateau) / r["fp4_tflops"] - fixed_k / r["k"] for r in rows]


def _peak_ratio(name: str) -> float:
    """``name``'s datasheet bf16 / nvfp4 peak ratio."""
    dev = catalogue()[name]
    return dev.peak("bf16") / dev.peak("nvfp4")


@lru_cache(maxsize=8)
def main_loop_multiple(fixed_k: float, device_name: str = "") -> float:
    """The measured NVFP4 main loop over the measured part's bf16 / nvfp4 peak ratio: the median B200 row, or on
    Blackwell Ultra the median pass of the B300 benchmark."""
    if device_name in ULTRA:
        return statistics.median(te_gemm.nvfp4_mains(fixed_k)) / _peak_ratio(te_gemm.PART)
    return statistics.median(row_mains(fixed_k)) / _peak_ratio(_data()["device"])


def held_out_ratios(fixed_k: float, device_name: str = "") -> tuple[list[float], list[float]]:
    """(in sample, one held out): priced / measured fp4-over-bf16 time of every measurement behind
    ``device_name``'s main loop (the B200's rows, or on Blackwell Ultra the B300's passes), the main loop the median
    of every one, or of the others."""
    if device_name in ULTRA:
        mains = te_gemm.nvfp4_mains(fixed_k)
        fixed = [fixed_k * te_gemm.fixed_share(p) for p in te_gemm.PASSES]
    else:
        mains, fixed = row_mains(fixed_k), [fixed_k / r["k"] for r in _data()["rows"]]
    every = statistics.median(mains)
    inside = [(every + f) / (m + f) for m, f in zip(mains, fixed)]
    held = [(statistics.median(mains[:i] + mains[i + 1:]) + f) / (m + f) for i, (m, f) in enumerate(zip(mains, fixed))]
    return inside, held
