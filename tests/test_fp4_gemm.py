"""The NVFP4 GEMM main loop from published B200 measurements (``costmodel.fp4_gemm``): the multiple recomputed from
the transcribed rows, the measured rates priced back, and the held-out error of the rule."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from meshplan.costmodel.api import FP8_FIXED_K, Pricer
from meshplan.costmodel.devices import catalogue
from meshplan.costmodel.fp4_gemm import held_out_ratios, main_loop_multiple
from meshplan.costmodel.ops import OpSpec

DATA = Path(__file__).resolve().parents[1] / "costmodel" / "data" / "published" / "fp4_gemm_b200.json"


@pytest.fixture(scope="module")
def data() -> dict:
    return json.loads(DATA.read_text(encoding="utf-8"))


def test_the_multiple_is_the_median_rows_main_loop_over_the_b200_peak_ratio(data):
    """vLLM's rows carry their own bf16 run; cuBLASLt's take the median of those bf16 rates (1365 TFLOP/s)."""
    rows = data["rows"]
    assert [r["m"] for r in rows] == [4096, 8192, 16384, 4096, 8192] and min(r["m"] for r in rows) >= 4096
    bf16 = [1365.255495, 1420.966950, 1360.143047, 1365.255495, 1365.255495]
    mains = [b / r["fp4_tflops"] - 150.0 / r["k"] for b, r in zip(bf16, rows)]
    b200 = catalogue()["B200"]
    want = statistics.median(mains) / (b200.peak("bf16") / b200.peak("nvfp4"))
    assert main_loop_multiple(FP8_FIXED_K) == pytest.approx(want, rel=1e-12)
    assert 1.25 < want < 1.35  # measured fp4 GEMMs keep about 3/4 of the speed-up the datasheet promises


def test_measured_fp4_rates_price_back_within_the_spread(data):
    """Every row priced from the shipped bf16 model on a B200 by the rule: the vLLM and the 4096 x 4096 x 7168
    cuBLASLt rows within 5%; cuBLASLt's 8192^3, the fastest row, 25-35% slower than measured (the median)."""
    pricer, dev = Pricer.shipped(), catalogue()["B200"]
    for r in data["rows"]:
        m, n, k = r["m"], r["n"], r["k"]
        sec = pricer.predict(OpSpec("matmul", (m, n, k), "nvfp4", impl="nvfp4"), dev)
        measured = 2.0 * m * n * k / (r["fp4_tflops"] * 1e12)
        if (m, n, k) == (8192, 8192, 8192):
            assert 1.25 < sec / measured < 1.35
        else:
            assert abs(sec / measured - 1) < 0.05, r


def test_held_out_one_row_at_a_time(data):
    inside, held = held_out_ratios(FP8_FIXED_K)
    assert len(inside) == len(held) == len(data["rows"])
    assert statistics.median(abs(r - 1) for r in held) < 0.06
    assert statistics.median(abs(r - 1) for r in inside) < 0.05
