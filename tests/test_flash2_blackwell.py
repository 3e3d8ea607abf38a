"""FlashAttention-2 on Blackwell and the GB200's die speed over the B200, from cuDNN frontend's published artifacts.

The truths are the rates NVIDIA/cudnn-frontend published in ``benchmark/sdpa_benchmark_training/artifacts``, copied
here by hand from the CSV files: ``sdpa_bf16_benchmark_results_NVIDIA_B200.csv`` and ``..._GB300.csv`` @ 0b1577c
(torch nv25.09), ``..._GB200.csv`` and ``..._GB300.csv`` @ b372d39 (torch nv25.11); 128 query heads, 8 KV heads,
head dim 128, causal, batch 1. Column ``pyt_flash_attention`` (PyTorch SDPA's FlashAttention-2) unless named.
"""
from __future__ import annotations

import statistics

import pytest

from meshplan.costmodel.api import Pricer
from meshplan.costmodel.devices import catalogue
from meshplan.costmodel.ops import OpSpec

# (gpu, seq, forward TFLOP/s, backward TFLOP/s) from the later container's CSVs (b372d39)
NEWEST = [("GB200", 8192, 414.0, 338.0), ("GB200", 32768, 438.0, 360.0), ("GB300", 4096, 388.0, 316.0),
          ("GB300", 131072, 448.0, 369.0)]
# seq -> (forward, backward) TFLOP/s at 16k..128k: B200 @ 0b1577c and GB200 @ b372d39
B200_FA2 = {16384: (394.495, 319.979), 32768: (403.739, 330.801), 65536: (408.739, 335.402),
            131072: (410.988, 336.043)}
GB200_FA2 = {16384: (430.0, 352.0), 32768: (438.0, 360.0), 65536: (442.0, 363.0), 131072: (444.0, 363.0)}


@pytest.fixture(scope="module")
def pricer():
    return Pricer.shipped()


def _op(seq: int, backward: bool, impl: str = "flash2", causal: bool = True, head_dim: int = 128) -> OpSpec:
    return OpSpec("attention", (1, 128, seq, seq, head_dim), "bf16", causal=causal, backward=backward, impl=impl)


def _rate(pricer, op: OpSpec, gpu: str) -> float:
    return op.flops / pricer.predict(op, catalogue()[gpu]) / 1e12


@pytest.mark.parametrize("gpu,seq,fwd,bwd", NEWEST)
def test_a_measured_shape_prices_at_its_published_rate(pricer, gpu, seq, fwd, bwd):
    """torchtitan's attention on a GB200 or GB300 runs at what PyTorch SDPA's flash backend measured there, not at
    the roofline's 1,500 TFLOP/s it was priced at before."""
    assert _rate(pricer, _op(seq, False), gpu) == pytest.approx(fwd, rel=1e-3)
    assert _rate(pricer, _op(seq, True), gpu) == pytest.approx(bwd, rel=1e-3)


def test_the_die_speed_is_the_median_of_the_plateau_ratios():
    """The GB200 over the B200, each in its newest run, from 16k tokens on: the median of the hand-copied ratios."""
    from meshplan.costmodel.flash2_blackwell import die_speed

    for i, backward in enumerate((False, True)):
        expected = statistics.median(GB200_FA2[s][i] / B200_FA2[s][i] for s in B200_FA2)
        assert die_speed("GB200", "B200", backward) == pytest.approx(expected, rel=1e-6)
        assert 1.0 < expected < 2.5 / 2.25  # faster than the B200, slower than the datasheet peaks say


def test_the_b200_takes_the_gb200_curve_at_the_measured_die_speed(pricer):
    """Priced from the GB200's later-container curve, the B200's own earlier run at 32k comes back within 1%
    forward and backward (the two containers agree there: the next test), and its cuDNN attention takes the same
    speed."""
    fwd, bwd = B200_FA2[32768]
    assert _rate(pricer, _op(32768, False), "B200") == pytest.approx(fwd, rel=0.01)
    assert _rate(pricer, _op(32768, True), "B200") == pytest.approx(bwd, rel=0.01)
    op = OpSpec("attention", (2, 64, 8192, 8192, 128), "bf16", causal=True, impl="cudnn", backward=True)
    speed = statistics.median(GB200_FA2[s][1] / B200_FA2[s][1] for s in B200_FA2)
    ratio = pricer.predict(op, catalogue()["B200"]) / pricer.predict(op, catalogue()["GB200"])
    assert ratio == pytest.approx(speed, rel=1e-4)


def test_the_two_containers_agree_where_the_die_speed_is_read():
    """The GB300 ran in both containers: from 16k tokens on within 0.6% forward and 1.8% backward (PyTorch's
    FlashAttention-2 gained only at short lengths: 58.6 -> 165 TFLOP/s forward at 512 tokens)."""
    from meshplan.costmodel.flash2_blackwell import curves

    for pass_, bound in (("fwd", 0.006), ("bwd", 0.018)):
        old = dict(zip(*curves()[("GB300", "0b1577c", "pyt_flash_attention", pass_)]))
        new = dict(zip(*curves()[("GB300", "b372d39", "pyt_flash_attention", pass_)]))
        assert all(abs(new[s] / old[s] - 1) < bound for s in old if s >= 16384)
    assert curves()[("GB300", "0b1577c", "pyt_flash_attention", "fwd")][1][0] == pytest.approx(58.617)


def test_flash3_runs_as_flash2_and_flex_at_the_blog_shares(pricer):
    """FlashAttention-3 needs Hopper's wgmma: on a GB200 it is FlashAttention-2's price and says why; flex is 0.90 /
    0.85 of it (PyTorch FlexAttention blog, H100) and says no Blackwell measurement backs it."""
    dev = catalogue()["GB200"]
    for backward, share in ((False, 0.90), (True, 0.85)):
        fa2 = pricer.predict(_op(8192, backward), dev)
        assert pricer.predict(_op(8192, backward, "flash3"), dev) == pytest.approx(fa2, rel=1e-9)
        assert pricer.predict(_op(8192, backward, "flex"), dev) == pytest.approx(fa2 / share, rel=1e-9)
    assert "FlashAttention-3 needs Hopper" in pricer.basis(_op(8192, False, "flash3"), dev)
    assert "no Blackwell measurement of flex" in pricer.basis(_op(8192, False, "flex"), dev)


def test_explain_lists_what_the_measurement_does_not_cover(pricer):
    """``--explain``'s unmeasured lines: the measured shape on GB300 is backed (no line); the B300 (no run), an
    unmasked op and a head-dim-64 op are not."""
    from meshplan.planner.estimate.explain import unmeasured

    cls = "attention bf16 (flash2)"
    assert cls not in unmeasured(pricer, catalogue()["GB300"], {cls: _op(8192, False)})
    assert "no run on the B300" in unmeasured(pricer, catalogue()["B300"], {cls: _op(8192, False)})[cls]
    assert "no unmasked measurement" in unmeasured(pricer, catalogue()["GB300"],
                                                    {cls: _op(8192, False, causal=False)})[cls]
    assert "no head-dim-64 measurement" in unmeasured(pricer, catalogue()["GB300"],
                                                       {cls: _op(8192, False, head_dim=64)})[cls]


def test_a_torchtitan_plan_on_b200_prices_attention_by_the_kernel_that_runs(runner, tmp_path):
    """End to end: Llama 3.1 8B under torchtitan on one B200 node. Its December 2024 code (``--stack
    torchtitan@0.0.2``: SDPA with FlashAttention-2 first) names the measurement in ``--explain`` and runs its
    attention at FlashAttention-2's rate (under 450 TFLOP/s); with no profile, a current torch's SDPA order puts cuDNN
    first on a B200, and the source says why."""
    from meshplan.cli.main import app

    def explain(*args: str) -> str:
        r = runner.invoke(app, ["plan", "--model", "llama3.1-8b", "--cluster", "1x8xB200", "--global-batch", "64",
                                "--seq-len", "8192", "--top", "1", "--explain", "--out", str(tmp_path / "p.yaml"),
                                *args], terminal_width=400)
        assert r.exit_code == 0, r.output
        return r.output

    titan = explain("--stack", "torchtitan@0.0.2", "--fix", "tp=1,pp=1,mbs=1,recompute=none")
    assert "FlashAttention-2 measured on GB200" in titan and "die speed" in titan
    rates = [float(ln.split("│")[2].split("TFLOP/s")[0].replace(",", "")) for ln in titan.splitlines()
             if ln.startswith("│ attention bf16 (flash2)") and "TFLOP/s" in ln]
    assert rates and max(rates) < 450
    sdpa = explain("--fix", "stack=torchtitan,tp=1,pp=1,mbs=1,recompute=none")
    assert "attention bf16 (sdpa)" in sdpa and "check_prefer_cudnn_attention" in sdpa and "cuDNN 9.22" in sdpa


def test_a_gb200_gemm_runs_no_faster_than_the_b200s_at_the_measured_die_speed(pricer):
    """The model carries the datasheet peaks' 1.11 into a compute-bound GB200 GEMM; the die runs 1.08x the B200's
    (the pooled median of the hand-copied plateau ratios), so an 8192^3 GEMM is priced at the B200's over that
    speed, and the GB300 at the GB200's over its measured GEMM speed. A small GEMM, which the model prices within
    the die speed of the B200, keeps the model's price."""
    from meshplan.costmodel.flash2_blackwell import gemm_die_speed

    pooled = [GB200_FA2[s][i] / B200_FA2[s][i] for s in B200_FA2 for i in (0, 1)]
    assert gemm_die_speed() == pytest.approx(statistics.median(pooled), rel=1e-9)
    cat = catalogue()
    big = OpSpec("matmul", (8192, 8192, 8192), "bf16")
    b200, gb200 = pricer.one_shot_s(big, cat["B200"]), pricer.one_shot_s(big, cat["GB200"])
    assert b200 / gb200 == pytest.approx(statistics.median(pooled), rel=1e-9)
    assert "die speed FlashAttention-2 measured" in pricer.basis(big, cat["GB200"])
    assert gb200 / pricer.one_shot_s(big, cat["GB300"]) == pytest.approx(pricer._blackwell("speed"), rel=1e-9)
    small = OpSpec("matmul", (2048, 2048, 2048), "bf16")
    assert pricer.one_shot_s(small, cat["B200"]) / pricer.one_shot_s(small, cat["GB200"]) < gemm_die_speed()
    assert "die speed" not in pricer.basis(small, cat["GB200"])


def test_the_die_speed_is_reported_held_out_one_length_at_a_time():
    """``bench/dev_set.py``'s table of constants lists the die speed with its held-out error, fitted on no step
    time: each plateau length priced from the other lengths' median ratio."""
    from meshplan.costmodel.fitted import die_speed_rows
    from meshplan.costmodel.flash2_blackwell import held_out_ratios

    inside, held = held_out_ratios()
    assert len(inside) == len(held) == 2 * len(B200_FA2)
    fwd = {s: GB200_FA2[s][0] / B200_FA2[s][0] for s in B200_FA2}
    left_out = statistics.median(v for t, v in fwd.items() if t != 16384)
    assert held[0] == pytest.approx(fwd[16384] / left_out, rel=1e-3)
    (row,) = die_speed_rows()
    assert row["step_times_used"] == 0 and row["held_out_error_pct"] >= row["in_sample_error_pct"]


@pytest.mark.parametrize("gpu,runs", [("A100-80GB", "flash2"), ("H100-SXM", "cudnn"), ("B200", "cudnn"),
                                      ("GB300", "cudnn")])
def test_sdpa_runs_the_backend_its_own_order_puts_first(pricer, gpu, runs):
    """PyTorch SDPA with no kernel named (torchtitan and HF code without a profile): cuDNN first on sm90, sm100 and
    sm103 once its cuDNN is above 9.15 (sdp_utils.cpp check_prefer_cudnn_attention), FlashAttention-2 first on an
    A100 (sm80): the same price as the kernel named, and the source says SDPA chose it."""
    dev = catalogue()[gpu]
    for backward in (False, True):
        sdpa = _op(8192, backward, "sdpa")
        assert pricer.predict(sdpa, dev) == pytest.approx(pricer.predict(_op(8192, backward, runs), dev), rel=1e-12)
    assert "check_prefer_cudnn_attention" in pricer.basis(_op(8192, False, "sdpa"), dev)


def test_the_solvers_batch_path_prices_as_one_op_does(pricer):
    """``predict_batch`` (the solvers' fast path) gives what ``predict`` gives: SDPA resolved by device, the GB200's
    and GB300's GEMM floor (fp8 through its bf16 twin), on the parts either rule touches."""
    ops = [_op(8192, False, "sdpa"), _op(4096, True, "sdpa"), OpSpec("matmul", (8192, 8192, 8192), "bf16"),
           OpSpec("matmul", (8192, 8192, 8192), "fp8", impl="mxfp8"), OpSpec("matmul", (2048, 2048, 2048), "bf16")]
    for gpu in ("A100-80GB", "H100-SXM", "B200", "GB200", "GB300"):
        dev = catalogue()[gpu]
        assert list(pricer.predict_batch(ops, dev)) == pytest.approx([pricer.predict(o, dev) for o in ops],
                                                                     rel=1e-9), gpu
