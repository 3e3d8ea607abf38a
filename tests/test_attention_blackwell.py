"""cuDNN attention on Blackwell, priced from cuDNN's own published training-attention benchmark.

The truths are the times NVIDIA/cudnn-frontend publishes in ``benchmark/sdpa_benchmark_training/results`` @ 3929da2
(cudnn-frontend 1.21.1, cuDNN 9.22, 2026-04-24), copied here from the CSV files by hand: a price of the measured
shape must be the measured time, whatever path the cost model takes to it.
"""
from __future__ import annotations

import pytest

from meshplan.costmodel.api import Pricer
from meshplan.costmodel.devices import catalogue
from meshplan.costmodel.ops import OpSpec


@pytest.fixture(scope="module")
def pricer():
    return Pricer.shipped()


def _window_op_keys(seq: int, window: int) -> int:
    """Keys of the causal op a 128-key window is listed as (ops_graph: twice the mean keys a query sees)."""
    mean = (window * (window + 1) / 2 + (seq - window) * window) / seq
    return round(2 * mean)


# (gpu, shape (b, heads, s, s_kv, d), causal, forward ms, backward ms): rows of the published CSVs
# llama3.1/gb300/llama3.1_20260424_100757.csv, llama3.1/gb200/llama3.1_20260424_100750.csv (64 query heads,
# 8 KV heads, head dim 128, batch 2), gpt_oss/gb300/gpt_oss_20260424_100022.csv and gpt_oss/gb200/...100011.csv
# (128 heads, head dim 64, sliding window 128, batch 2), dsv3 (128 heads, q/k head dim 192, v 128, batch 2; priced at
# its q/k head dim as ops_graph lists MLA); deterministic_bwd False
CASES = [
    ("GB300", (2, 64, 4096, 4096, 128), True, 0.323, 1.101),
    ("GB300", (2, 64, 16384, 16384, 128), False, 8.734, 28.638),
    ("GB200", (2, 64, 8192, 8192, 128), True, 1.397, 4.127),
    ("GB300", (2, 128, 4096, _window_op_keys(4096, 128), 64), True, 0.202, 0.442),
    ("GB300", (2, 128, 4096, 4096, 192), True, 0.864, 3.127),  # dsv3/gb300/dsv3_20260424_101002.csv
    ("GB200", (2, 128, 8192, _window_op_keys(8192, 128), 64), True, 0.414, 0.911),
]


def _assert_published_time(pricer, gpu, shape, dtype, causal, fwd_ms, bwd_ms) -> None:
    """A measured shape prices at its published forward and backward times."""
    dev = catalogue()[gpu]
    fwd = OpSpec("attention", shape, dtype, causal=causal, impl="cudnn")
    bwd = OpSpec("attention", shape, dtype, causal=causal, impl="cudnn", backward=True)
    assert pricer.predict(fwd, dev) * 1e3 == pytest.approx(fwd_ms, rel=1e-6)
    assert pricer.predict(bwd, dev) * 1e3 == pytest.approx(bwd_ms, rel=1e-6)


@pytest.mark.parametrize("gpu,shape,causal,fwd_ms,bwd_ms", CASES)
def test_measured_shapes_price_at_the_published_time(pricer, gpu, shape, causal, fwd_ms, bwd_ms):
    _assert_published_time(pricer, gpu, shape, "bf16", causal, fwd_ms, bwd_ms)


def test_between_measured_lengths_the_rate_lies_between_theirs(pricer):
    """6k tokens on GB300: the causal d128 rate between the 4k (1702 TFLOP/s) and 8k (1856) measurements."""
    dev = catalogue()["GB300"]
    op = OpSpec("attention", (2, 64, 6144, 6144, 128), "bf16", causal=True, impl="cudnn")
    rate = op.flops / pricer.predict(op, dev) / 1e12
    assert 1702 < rate < 1856


@pytest.mark.parametrize("part,measured", [("B300", "GB300")])
def test_the_air_cooled_parts_take_their_siblings_curve_at_their_bf16_peak(pricer, part, measured):
    """The B300 runs the GB300's die at a lower clock, and no attention run of it is published: 2.25 against 2.5
    PFLOP/s dense bf16 (``costmodel/data/devices.yaml``). The B200 has one, and takes the die speed measured on it
    (``tests/test_flash2_blackwell.py``)."""
    op = OpSpec("attention", (4, 64, 4096, 4096, 64), "bf16", causal=True, impl="cudnn", backward=True)
    ratio = pricer.predict(op, catalogue()[part]) / pricer.predict(op, catalogue()[measured])
    assert ratio == pytest.approx(2.5 / 2.25, rel=1e-9)


def test_explain_names_the_measurement_and_what_it_lacks(pricer):
    """GPT-OSS's full-attention layers (head dim 64) have no published full-mask d64 cuDNN time: the source says the
    d128 rate stands in, scaled by the H100's d64 / d128 ratio; its window layers name the GPT-OSS measurement."""
    dev = catalogue()["B300"]
    full = OpSpec("attention", (4, 64, 4096, 4096, 64), "bf16", causal=True, impl="cudnn")
    window = OpSpec("attention", (4, 64, 4096, 252, 64), "bf16", causal=True, impl="cudnn")
    src_full = pricer.basis(full, dev)
    assert "cudnn-frontend" in src_full and "GB300" in src_full and "scaled by bf16 peak to B300" in src_full
    assert "no head-dim-64 measurement" in src_full and "d64 / d128 ratio" in src_full
    assert "GPT-OSS sliding window" in pricer.basis(window, dev)


# FlashAttention-3 paper (Shah et al. 2024, arXiv:2407.08608), H100 SXM5, 16k tokens a batch, hidden 2048: TFLOP/s
# labelled on the bars of Fig. 5 (d) (forward, causal, head dim 64), Fig. 5 (e) (forward, causal, head dim 128),
# Fig. 6 (a) and (b) (backward, head dims 64 and 128), at 4k tokens
FA3_PAPER_4K = {("cudnn", 64, "fwd"): 363, ("cudnn", 128, "fwd"): 518, ("cudnn", 64, "bwd"): 417,
                ("cudnn", 128, "bwd"): 499, ("flash2", 64, "fwd"): 284, ("flash3", 64, "fwd"): 420}


@pytest.mark.parametrize("impl,head_dim,pass_", list(FA3_PAPER_4K))
def test_a_hopper_attention_runs_at_its_head_dims_published_rate(pricer, impl, head_dim, pass_):
    """At a published length an H100 attention prices at the paper's rate for its head dim: a d64 head runs slower
    than a d128 one (cuDNN forward 363 against 518 TFLOP/s), where it used to take the d128 rate. The backward bars
    are unmasked; a causal backward takes the forward's causal / unmasked ratio, so it is checked unmasked."""
    causal = pass_ == "fwd"
    op = OpSpec("attention", (4, 16, 4096, 4096, head_dim), "bf16", causal=causal, impl=impl,
                backward=pass_ == "bwd")
    rate = op.flops / pricer.predict(op, catalogue()["H100-SXM"]) / 1e12
    assert rate == pytest.approx(FA3_PAPER_4K[(impl, head_dim, pass_)], rel=1e-6)


# The FA3 paper's cuDNN bars at 4k tokens (H100 SXM5): causal forward d64 363 / d128 518 (Fig. 5 (d), (e)),
# unmasked forward 408 / 609 (Fig. 5 (a), (b)), unmasked backward 417 / 499 (Fig. 6 (a), (b)). The paper shows the
# backward unmasked only; a causal backward takes the forward's causal / unmasked ratio at its head dim.
D64_OVER_D128_4K = {(True, False): 363 / 518, (False, False): 408 / 609,
                    (True, True): (417 * 363 / 408) / (499 * 518 / 609)}


@pytest.mark.parametrize("gpu,causal,backward", [("GB300", True, False), ("GB200", True, True),
                                                  ("GB300", False, False)])
def test_a_blackwell_d64_full_mask_takes_the_d128_curve_at_the_hopper_ratio(pricer, gpu, causal, backward):
    """No full-mask d64 cuDNN case is published for Blackwell: its rate is the measured d128 one times the H100 cuDNN
    d64 / d128 ratio at the same length and pass, read off the FA3 paper's bars (``D64_OVER_D128_4K``). The window
    layers keep their own measured d64 curve (``CASES``)."""
    dev = catalogue()[gpu]
    d64 = OpSpec("attention", (2, 64, 4096, 4096, 64), "bf16", causal=causal, impl="cudnn", backward=backward)
    d128 = OpSpec("attention", (2, 64, 4096, 4096, 128), "bf16", causal=causal, impl="cudnn", backward=backward)
    ratio = (d64.flops / pricer.predict(d64, dev)) / (d128.flops / pricer.predict(d128, dev))
    assert ratio == pytest.approx(D64_OVER_D128_4K[(causal, backward)], rel=1e-9)


def test_other_kernels_and_devices_keep_their_own_prices(pricer):
    """FlashAttention-2 (SDPA) on Blackwell takes its own measured curve, not cuDNN's
    (``tests/test_flash2_blackwell.py``); a Hopper cuDNN op keeps the FA3 paper's."""
    op = OpSpec("attention", (2, 64, 4096, 4096, 128), "bf16", causal=True, impl="flash2")
    basis = pricer.basis(op, catalogue()["GB300"])
    assert "FlashAttention-2 measured on GB300" in basis and "cuDNN 9.22" not in basis
    hop = OpSpec("attention", (2, 64, 4096, 4096, 128), "bf16", causal=True, impl="cudnn")
    assert "FlashAttention-3 paper" in pricer.basis(hop, catalogue()["H100-SXM"])


def test_the_held_out_error_is_one_gpus_curve_pricing_the_other():
    """``costmodel.fitted`` reports the curves held out one GPU at a time: GB300's causal d128 forward at 4k priced
    from GB200's curve (same bf16 peak) is off by the published time ratio, 0.391 / 0.323 ms."""
    from meshplan.costmodel.attention import blackwell_held_out_ratios
    from meshplan.costmodel.fitted import attention_rows

    inside, held = blackwell_held_out_ratios()
    assert all(r == pytest.approx(1.0) for r in inside)
    assert any(r == pytest.approx(0.391 / 0.323, rel=1e-3) for r in held)
    (row,) = attention_rows()
    assert row["step_times_used"] == 0 and row["held_out_error_pct"] > 0


def test_explain_lists_attention_as_unmeasured_only_where_the_curve_stands_in(pricer):
    """``--explain``'s unmeasured lines: GPT-OSS's window on GB300 is measured there (no line); on B300 the GB300 curve
    stands in (a line naming it); a d64 full-mask op on GB300 takes the d128 rate times the H100's d64 / d128 ratio
    (a line saying so)."""
    from meshplan.planner.estimate.explain import unmeasured

    window = OpSpec("attention", (4, 64, 4096, 252, 64), "bf16", causal=True, impl="cudnn")
    full = OpSpec("attention", (4, 64, 4096, 4096, 64), "bf16", causal=True, impl="cudnn")
    cls = "attention bf16 (cudnn)"
    assert cls not in unmeasured(pricer, catalogue()["GB300"], {cls: window})
    assert "scaled by bf16 peak to B300" in unmeasured(pricer, catalogue()["B300"], {cls: window})[cls]
    assert "no head-dim-64 measurement" in unmeasured(pricer, catalogue()["GB300"], {cls: full})[cls]
    # a class holding both (GPT-OSS alternates window and full layers) is noted by its unmeasured op, whichever
    # came first
    both = {cls: {window: None, full: None}}
    assert "no head-dim-64 measurement" in unmeasured(pricer, catalogue()["GB300"], {cls: window}, both)[cls]


def test_explain_of_gpt_oss_on_gb300_names_its_unmeasured_full_layers(runner, tmp_path):
    """GPT-OSS's first layer is a sliding-window one (measured on GB300); its full-mask d64 layers are not, and
    ``--explain`` says so."""
    from meshplan.cli.main import app

    r = runner.invoke(app, ["plan", "--model", "gpt-oss-120b", "--cluster", "16x4xGB300-NVL72", "--global-batch",
                            "1280", "--seq-len", "4096", "--fix", "tp=1,pp=1,ep=64,mbs=4,zero=1,recompute=none",
                            "--top", "1", "--explain", "--out", str(tmp_path / "p.yaml")], terminal_width=400)
    assert r.exit_code == 0, r.output
    line = next(ln for ln in r.output.splitlines() if ln.startswith("unmeasured: attention"))
    assert "no head-dim-64 measurement" in line


# The same CSVs' fp8 rows (per-tensor-scaled E4M3, what Transformer Engine's fp8 dot-product attention runs): the
# sliding-window backward is 3.3x slower than bf16 at 4k on GB300 (1.48 vs 0.442 ms), so fp8 is not priced as bf16.
FP8_CASES = [
    ("GB300", (2, 64, 4096, 4096, 128), True, 0.217, 0.985),
    ("GB200", (2, 64, 8192, 8192, 128), True, 1.074, 3.781),
    ("GB300", (2, 128, 4096, 4096, 192), True, 0.493, 1.803),
    ("GB300", (2, 128, 4096, _window_op_keys(4096, 128), 64), True, 0.167, 1.48),
]


@pytest.mark.parametrize("gpu,shape,causal,fwd_ms,bwd_ms", FP8_CASES)
def test_fp8_measured_shapes_price_at_the_published_fp8_time(pricer, gpu, shape, causal, fwd_ms, bwd_ms):
    _assert_published_time(pricer, gpu, shape, "fp8", causal, fwd_ms, bwd_ms)


# The same CSVs' MXFP8 rows (E4M3 in 1x32 blocks: Transformer Engine's fp8 attention under the MXFP8 recipe):
# llama3.1/gb300 at 4k, gpt_oss/gb200 (the 128-key window) at 4k, whose backward is 4.5x the bf16 one (2.080 vs
# 0.465 ms).
MXFP8_CASES = [
    ("GB300", (2, 64, 4096, 4096, 128), True, 0.242, 1.203),
    ("GB200", (2, 128, 4096, _window_op_keys(4096, 128), 64), True, 0.210, 2.080),
]


@pytest.mark.parametrize("gpu,shape,causal,fwd_ms,bwd_ms", MXFP8_CASES)
def test_mxfp8_measured_shapes_price_at_the_published_mxfp8_time(pricer, gpu, shape, causal, fwd_ms, bwd_ms):
    _assert_published_time(pricer, gpu, shape, "mxfp8", causal, fwd_ms, bwd_ms)


@pytest.mark.parametrize("dtype", ["fp8", "mxfp8"])
def test_fp8_attention_without_a_measurement_takes_the_bf16_rate_and_says_so(pricer, dtype):
    """No fp8 attention timing is published for Hopper: an H100 prices it at the cuDNN bf16 curve, and the source
    says that no measurement exists."""
    dev = catalogue()["H100-SXM"]
    shape = (2, 64, 8192, 8192, 128)
    low = OpSpec("attention", shape, dtype, causal=True, impl="cudnn", backward=True)
    bf16 = OpSpec("attention", shape, "bf16", causal=True, impl="cudnn", backward=True)
    sec, src = pricer.predict_with_source(low, dev)
    assert sec == pricer.predict(bf16, dev)
    assert f"no {dtype} attention measurement on H100-SXM: its bf16 rate" in src
