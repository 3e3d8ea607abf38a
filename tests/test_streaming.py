"""The streaming floor of memory-bound ops (``costmodel.streaming``) against the published timings it rests on.

Truth: ai-dynamo/aiconfigurator's scale_matrix tables (``costmodel/data/published/aic_streaming.json``), read
here row by row without the module's binning.
"""
from __future__ import annotations

import json
import statistics

import pytest

from meshplan.costmodel import streaming
from meshplan.costmodel.api import Pricer
from meshplan.costmodel.devices import catalogue
from meshplan.costmodel.measured import published_file
from meshplan.costmodel.ops import OpSpec
from tests.helpers import load_bench

DATA = published_file(streaming.DATA_FILE)


def rows_rate(part: str, kernel: str, lo_bytes: float, hi_bytes: float) -> float:
    """Median bytes/s of one kernel's rows moving [lo, hi) bytes, straight from the file."""
    bpe = DATA["bytes_per_element"]
    rates = [m * k * bpe / (ms * 1e-3) for m, k, ms in DATA["parts"][part][kernel]["rows"]
             if lo_bytes <= m * k * bpe < hi_bytes]
    return statistics.median(rates)


def test_the_file_holds_both_kernels_on_six_parts_as_their_cards_name_themselves():
    """933 shapes a kernel and part moving 1 MiB or more (of the tables' 1,628)."""
    names = {part: {k["device_name"] for k in kernels.values()} for part, kernels in DATA["parts"].items()}
    assert names == {"H100-SXM": {"NVIDIA H100 80GB HBM3"}, "H200": {"NVIDIA H200"}, "B200": {"NVIDIA B200"},
                     "GB200": {"NVIDIA GB200"}, "B300": {"NVIDIA B300 SXM6 AC"}, "GB300": {"NVIDIA GB300"}}
    assert all(len(k["rows"]) == 933 for kernels in DATA["parts"].values() for k in kernels.values())


@pytest.mark.parametrize("part", ["B200", "GB200", "B300", "GB300"])
def test_blackwell_streams_a_training_sized_tensor_well_below_its_hbm_peak(part):
    """The docstring's claim: at 34-67 MB moved the faster kernel reaches 65-75% of HBM bandwidth on Blackwell,
    where Hopper reaches 80% or more; past 1 GB both reach 80-90%."""
    peak = catalogue()[part].mem_bw_bytes_per_s
    mid = max(rows_rate(part, k, 2 ** 25, 2 ** 26) for k in ("trtllm", "vllm")) / peak
    big = max(rows_rate(part, k, 2 ** 30, 2 ** 34) for k in ("trtllm", "vllm")) / peak
    assert 0.60 < mid < 0.76 and 0.80 < big < 0.92
    for hopper in ("H100-SXM", "H200"):
        hop = max(rows_rate(hopper, k, 2 ** 25, 2 ** 26) for k in ("trtllm", "vllm"))
        assert hop / catalogue()[hopper].mem_bw_bytes_per_s > 0.80


def test_the_floor_is_the_faster_kernels_median_at_an_octaves_centre():
    part, octave = "GB300", 27  # 128-256 MiB moved
    want = max(rows_rate(part, k, 2 ** octave, 2 ** (octave + 1)) for k in ("trtllm", "vllm"))
    nbytes = 2 ** (octave + 0.5)
    op = OpSpec("copy", (int(nbytes / 4),), "bf16")  # a bf16 copy moves 4 B an element
    assert streaming.floor_s(op, catalogue()[part]) == pytest.approx(op.bytes / want, rel=1e-6)


def test_an_elementwise_op_on_a_blackwell_part_prices_at_the_floor_and_says_so():
    dev, pricer = catalogue()["GB300"], Pricer.shipped()
    op = OpSpec("elementwise", (33_554_432,), "bf16")  # a residual add of 8192 tokens x 4096: 201 MB
    sec, source = pricer.predict_with_source(op, dev)
    assert sec == pytest.approx(streaming.floor_s(op, dev))
    assert op.bytes / sec < 0.85 * dev.mem_bw_bytes_per_s  # was 95% of peak: the learned class clipped to ideal
    assert streaming.FLOOR_WORDS in source and "aiconfigurator" in source
    assert not [w for w in pricer.warnings if "elementwise" in w]  # the clipped price is not the one used


def test_no_floor_off_the_measured_parts_or_below_a_mebibyte_or_for_compute_bound_ops():
    cat = catalogue()
    assert streaming.floor_s(OpSpec("elementwise", (33_554_432,), "bf16"), cat["A100-80GB"]) is None
    assert streaming.floor_s(OpSpec("elementwise", (1000,), "bf16"), cat["GB300"]) is None
    assert streaming.floor_s(OpSpec("matmul", (8192, 8192, 8192), "bf16"), cat["GB300"]) is None


def test_the_batch_path_prices_memory_bound_ops_as_the_single_path():
    dev, pricer = catalogue()["B200"], Pricer.shipped()
    ops = [OpSpec(kind, (n,), "bf16") for kind in ("elementwise", "cast", "activation") for n in (2 ** 22, 2 ** 26)]
    ops.append(OpSpec("rmsnorm", (8192, 4096), "bf16"))
    batch = pricer.predict_batch(ops, dev)
    assert list(batch) == pytest.approx([pricer.predict(o, dev) for o in ops], rel=1e-9)


def test_the_bench_prints_the_curve_as_shares_of_hbm_bandwidth(capsys):
    bench = load_bench("aic_vs_costmodel", "streaming_rows")
    assert bench.main(["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    b200 = next(r for r in out["streaming"] if r["part"] == "B200")
    peak = catalogue()["B200"].mem_bw_bytes_per_s
    want = {f"{b / 1e6:.0f}": round(r / peak, 2) for b, r in streaming.curve("B200")}
    assert b200["shares"] == want and out["gemm"] == []  # the GEMM tables need a checkout; none given
