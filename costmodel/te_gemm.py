"""Transformer Engine's own GEMM benchmark on a B300: what each low-precision recipe's GEMM costs there.

NVIDIA/TransformerEngine PR #2863 (``docs/examples/gemm_profiling``, ``benchmarks/gemm/benchmark_gemm.py``) timed
the twelve GEMMs of one transformer layer (hidden 4096, intermediate 16384, M = 15,872 tokens; fprop, dgrad and wgrad
shapes) on a B300 in BF16 (``torch.matmul``), FP8 current scaling, FP8 delayed scaling, MXFP8 and NVFP4, each once
through ``te.Linear`` under autocast (input and weight quantized on every call) and once on inputs quantized before
the timed loop (the GEMM kernel alone). One harness, one part, the same shapes: the ratios between recipes are
measurements, and ``costmodel/data/published/te_gemm_profiling.json`` keeps them as published. Under autocast the
script's ``te.Linear`` quantizes its input rowwise and columnwise (the weight needs grad) and its weight rowwise
only (the input does not); the dgrad and wgrad rows are forward calls at the swapped shapes, so no sum measures a
backward's quantize work. Identical paths differ between the two runs by 2.7% (BF16) and 4.1% (delayed scaling,
autocast in both): the noise the constants carry. Three constants rest on them:

- ``mxfp8_multiple``: the MXFP8 GEMM kernel's time over the tensor-wise fp8 one's, the ratio of the two recipes'
  pre-quantized sums over the twelve GEMMs (1.051; per pass 1.03-1.10). The 1x32 block scales cost the GEMM this
  much; MXFP8's cheaper quantize (no amax pass) gives it back under autocast (the measured sums: 8.98 ms against
  9.15 ms), which the op list prices as its own cast. It holds on every Blackwell part (the B200's sm_100 and
  Blackwell Ultra's sm_103 run the same block-scaled tensor-core instructions); no other part runs MXFP8.
- ``nvfp4_mains``: the NVFP4 main loop per pass on the B300 (``costmodel.fp4_gemm`` takes their median for Blackwell
  Ultra), from the pre-quantized NVFP4 and BF16 sums of the same run.
- ``bf16_scale``: the B300's own dense GEMM scale (``costmodel.xla_gemm`` gives the B200's), measured over model
  price of the twelve bf16 GEMMs, both runs. Priced at the B200's scale they came out 7-10% slow, and every recipe's
  pre-quantized sum by the same 7% (fp8 6.9%, MXFP8 6.9%, NVFP4 6.9% after the two constants above): the part, not a
  recipe. The script holds the GPU in a 5 s matmul warm-up (``warmup_gpu``) and then runs the cases back to back,
  100 calls each (0.03-0.14 s); how far the B300's clock had settled is not recorded. The rates themselves say: they
  are one-shot rates, at or near the boost clock. At the same datasheet peaks the B300's GEMMs ran 9-12% faster
  than the B200's one-shot scale prices them (1.11-1.13 against 1.21-1.26); had they run throttled, at the B200's
  measured 0.853 of its boost rate, the B300's boost rate would be 1.28-1.31x the B200's, where their SMs times
  clocks differ by 1.00 (the catalogue) to 1.12 (160 SMs at 2,032 MHz against 148 at 1,965, the clocks
  sgl-project/sglang PR #28460 reads). So the planner divides them by the B300's sustained share
  (``costmodel.sustained``: the B200's, the same SM design at the same watts per SM) like every other part's one-shot
  rates (``tests/test_sustained.py``). The GB300 keeps the B200's scale over its measured speed against the GB200
  (1.050): one-shot, it prices a bf16 GEMM 16% faster than the B300, 11% from its larger datasheet peak and the rest
  from its 1,400 W against 1,100 W.
"""
from __future__ import annotations

import statistics
from functools import lru_cache
from typing import Callable

from meshplan.costmodel.measured import published_file
from meshplan.costmodel.ops import OpSpec

DATA_FILE = "te_gemm_profiling.json"  # in costmodel/data/published
SOURCE = ("Transformer Engine's GEMM benchmark on a B300 (NVIDIA/TransformerEngine PR #2863, "
          "docs/examples/gemm_profiling; costmodel/data/published/te_gemm_profiling.json)")
PASSES = ("fprop", "dgrad", "wgrad")
PART = "B300"
Price = Callable[[OpSpec], float]  # a pricer's model seconds of a bf16 GEMM on the B300


def _data() -> dict:
    return published_file(DATA_FILE)


def pass_ms(mode: str, recipe: str, device: str = PART) -> dict[str, float]:
    """{pass: ms} of the four GEMMs of one pass (``mode``: "autocast" or "prequantized") as published."""
    return dict(_data()["devices"][device]["pass_ms"][mode][recipe])


def shapes(which: str) -> list[tuple[int, int, int]]:
    """The (M, K, N) of the four GEMMs of pass ``which`` (the benchmark writes M x K x N)."""
    return [tuple(s) for s in _data()["shapes_mkn"][which]]


def _ratio(num: str, den: str, passes: tuple[str, ...] = PASSES) -> float:
    """Pre-quantized time of recipe ``num`` over recipe ``den``, summed over ``passes``."""
    a, b = pass_ms("prequantized", num), pass_ms("prequantized", den)
    return sum(a[p] for p in passes) / sum(b[p] for p in passes)


@lru_cache(maxsize=1)
def mxfp8_multiple() -> float:
    """The MXFP8 GEMM kernel's time over the tensor-wise fp8 kernel's at the same shapes (B300, pre-quantized)."""
    return _ratio("MXFP8", "FP8Current")


def mxfp8_held_out() -> tuple[list[float], list[float]]:
    """(in sample, one pass held out): priced / measured MXFP8 time of each pass, priced as its tensor-wise time
    times the multiple of every pass, or of the other two."""
    inside, held = [], []
    for p in PASSES:
        measured = _ratio("MXFP8", "FP8Current", (p,))
        inside.append(mxfp8_multiple() / measured)
        held.append(_ratio("MXFP8", "FP8Current", tuple(q for q in PASSES if q != p)) / measured)
    return inside, held


def fixed_share(which: str) -> float:
    """The FLOP-weighted mean of 1 / K over pass ``which``'s GEMMs: what the low-precision rule's fixed per-tile
    part (``FP8_FIXED_K / K``) adds to a pass summed over shapes of one M and different K."""
    flops = [m * k * n for m, k, n in shapes(which)]
    return sum(f / k for f, (_, k, _) in zip(flops, shapes(which))) / sum(flops)


def nvfp4_mains(fixed_k: float) -> list[float]:
    """Each pass's NVFP4 main-loop share of its bf16 time on the B300: ``t_nvfp4 / t_bf16 - fixed_k * <1/K>``."""
    fp4, bf16 = pass_ms("prequantized", "NVFP4"), pass_ms("prequantized", "BF16")
    return [fp4[p] / bf16[p] - fixed_k * fixed_share(p) for p in PASSES]


def _bf16_ratios(price: Price, passes: tuple[str, ...] = PASSES) -> list[float]:
    """Measured / priced bf16 time of each (run, pass) in ``passes``: both runs time ``torch.matmul`` (BF16 has no
    quantize), ``price(op)`` the pricer's model seconds on the B300 before any scale."""
    priced_s = {p: sum(price(OpSpec("matmul", (m, n, k), "bf16")) for m, k, n in shapes(p)) for p in passes}
    return [pass_ms(mode, "BF16")[p] * 1e-3 / priced_s[p] for mode in ("autocast", "prequantized") for p in passes]


def bf16_scale(price: Price) -> float:
    """The B300's dense GEMM scale: the median over both runs and passes of measured / model-priced bf16 time."""
    return statistics.median(_bf16_ratios(price))


def bf16_held_out(price: Price) -> tuple[list[float], list[float]]:
    """(in sample, one pass of both runs held out): scaled-priced / measured bf16 time of each (run, pass)."""
    every = bf16_scale(price)
    inside = [every / r for r in _bf16_ratios(price)]
    held = []
    for p in PASSES:
        rest = statistics.median(_bf16_ratios(price, tuple(q for q in PASSES if q != p)))
        held += [rest / r for r in _bf16_ratios(price, (p,))]
    return inside, held
