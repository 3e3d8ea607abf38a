"""fp8 GEMMs by scaling recipe on Hopper: each recipe's GEMM time against the tensor-wise GEMM of the same shape.

The fp8 rule (``costmodel.api.fp8_time_share``) prices a tensor-wise fp8 GEMM from its bf16 twin. The recipes differ
in what the GEMM kernel does with its scales, measured on one H200 through the kernels the stacks call
(``bench/gpu_sustained.py``, section ``fp8gemm``: ``torch._scaled_mm`` at the projection shapes of Llama 3.1 8B and
70B at TP 8, M = 1024-16384, L2 flushed, medians; ``costmodel/data/measured/nvidia-h200-sustained.json``):

- ``rowwise`` (one scale per row of A and per column of B; torchao / torchtitan's fp8 rowwise): CUTLASS's
  ``f8f8bf16_rowwise``, about as fast as tensor-wise.
- ``blockwise`` (1x128 activation tiles, 128x128 weight blocks; DeepSeek-V3 §3.3.2, Transformer Engine's
  ``Float8BlockScaling``): cuBLASLt's block-scaled GEMM (CUDA 12.9+), which is what Transformer Engine calls on
  Hopper (``transformer_engine/common/gemm``: scale modes ``CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F`` and
  ``BLK128x128_32F`` for its 1-D and 2-D block scaling). It promotes the partial sums by the scales every 128
  K-elements inside the main loop, and runs at a median 0.84 of tensor-wise. DeepGEMM, DeepSeek's own kernel,
  reaches tensor-wise rates with the same recipe (the fp8 rule's source); no stack meshplan exports runs it.

The multiple is the median over the measured shapes of (recipe time / tensor-wise time), for the measured part and
parts of the same die and power limit (``costmodel.sustained``'s rule). Other Hopper-class parts have no
measurement: 1 there.

On Blackwell (the parts that run MXFP8) the MXFP8 GEMM takes its own multiple, measured on a B300 by Transformer
Engine's GEMM benchmark against the tensor-wise kernel at the same shapes (``costmodel.te_gemm``: 1.051), and so
does blockwise, which Transformer Engine runs there as MXFP8 ("FP8 Block is emulated via MXFP8 for backward
compatibility", ``docs/examples/gemm_profiling``); rowwise keeps 1.
"""
from __future__ import annotations

import statistics
from functools import lru_cache

from meshplan.costmodel import te_gemm
from meshplan.costmodel.devices import DeviceSpec, catalogue
from meshplan.costmodel.measured import SUSTAINED, measured_files
from meshplan.costmodel.sustained import same_part

# measured recipe (bench/gpu_sustained.py) -> OpSpec.impl of the fp8 GEMMs it prices
RECIPE_IMPL = {"fp8_rowwise": "rowwise", "fp8_block": "blockwise"}
BASELINE = "fp8_tensor_fast"  # tensor-wise, fast accumulation: the GEMM the fp8 rule was set against
MEASURED_ON = {"nvidia-h200-sustained.json": "H200"}
BLACKWELL_MXFP8 = ("mxfp8", "blockwise")  # recipes whose GEMM runs on Blackwell's block-scaled (1x32) kernels


def _times(records: list[dict]) -> dict[tuple, float]:
    """(shape, M, recipe) -> median ms of the GEMMs that ran."""
    return {(r["shape"], r["m"], r["recipe"]): r["median_ms"] for r in records if "median_ms" in r}


def multiples_of(data: dict) -> dict[str, float]:
    """impl -> median over shapes of (recipe time / tensor-wise time) in one file's ``fp8gemm`` section."""
    times = _times(data["sections"]["fp8gemm"]["records"])
    out = {}
    for recipe, impl in RECIPE_IMPL.items():
        ratios = [ms / times[(s, m, BASELINE)] for (s, m, r), ms in times.items()
                  if r == recipe and (s, m, BASELINE) in times]
        if ratios:
            out[impl] = statistics.median(ratios)
    return out


@lru_cache(maxsize=1)
def _measured() -> tuple[tuple[DeviceSpec, dict[str, float]], ...]:
    files = measured_files(SUSTAINED)
    return tuple((catalogue()[dev], multiples_of(files[name])) for name, dev in MEASURED_ON.items() if name in files)


def recipe_time_multiple(impl: str, device: DeviceSpec) -> float:
    """Time of an fp8 GEMM under recipe ``impl`` over the tensor-wise one on ``device`` (1 where not measured)."""
    if device.supports("mxfp8"):
        return te_gemm.mxfp8_multiple() if impl in BLACKWELL_MXFP8 else 1.0
    if impl not in RECIPE_IMPL.values():
        return 1.0
    for measured, multiples in _measured():
        if same_part(device, measured):
            return multiples.get(impl, 1.0)
    return 1.0


def recipe_words(impl: str, device: DeviceSpec) -> str:
    """What ``recipe_time_multiple`` rests on, for a price's source ("" where it is 1)."""
    multiple = recipe_time_multiple(impl, device)
    if multiple == 1.0:
        return ""
    where = te_gemm.SOURCE if device.supports("mxfp8") else "an H200 (bench/gpu_sustained.py fp8gemm)"
    return f"; {impl} GEMM x {multiple:.3f} of tensor-wise, measured on {where}"


def held_out_ratios(impl: str = "blockwise") -> tuple[list[float], list[float]]:
    """(in sample, one M held out): predicted / measured time of every measured ``impl`` GEMM, the prediction being
    the tensor-wise time times the recipe's multiple; held out, the multiple of the other M values."""
    recipe = {v: k for k, v in RECIPE_IMPL.items()}[impl]
    files = measured_files(SUSTAINED)
    inside, held = [], []
    for name in MEASURED_ON:
        if name not in files:
            continue
        recs = [r for r in files[name]["sections"]["fp8gemm"]["records"] if "median_ms" in r]
        times = _times(recs)
        every = multiples_of(files[name])[impl]
        for m in sorted({r["m"] for r in recs}):
            rest = {"sections": {"fp8gemm": {"records": [r for r in recs if r["m"] != m]}}}
            other = multiples_of(rest).get(impl)
            for (s, mm, r), ms in times.items():
                if r == recipe and mm == m and (s, m, BASELINE) in times:
                    inside.append(every * times[(s, m, BASELINE)] / ms)
                    if other is not None:
                        held.append(other * times[(s, m, BASELINE)] / ms)
    return inside, held
