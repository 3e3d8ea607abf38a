"""Norms priced from the kernel each stack runs (``costmodel.norms``): Transformer Engine's and torch.compile's from
cuDNN's published norm benchmark (``costmodel/data/published/cudnn_norms.json``), eager code's RMSNorm formula from
our own H100 / H200 runs (``costmodel/data/measured``)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.costmodel import norms
from meshplan.costmodel.api import Pricer
from meshplan.costmodel.devices import catalogue
from meshplan.costmodel.measured import measured_files, published_file
from meshplan.costmodel.ops import OpSpec
from meshplan.planner.estimate.gpu import GpuEstimator
from meshplan.planner.estimate.ops_graph import head_ops, layer_ops
from meshplan.planner.layout.layout import Layout
from meshplan.planner.model.config import load_model

ROWS = published_file(norms.DATA_FILE)["rows"]


def _bench_bytes(row: dict, backward: bool) -> float:
    """The benchmark script's own byte count (benchmark_single_norm.py compute_bandwidth_bytes, rms_norm, no bias,
    bf16): forward x and the scale read, y and a float32 inverse RMS a row written; backward dy, x, the scale and the
    inverse RMS read, dx and the scale's gradient written."""
    n, c = row["N"], row["C"]
    if backward:
        return (2 * n * c + c) * 2 + n * 4 + (n * c + c) * 2
    return (n * c + c) * 2 + n * c * 2 + n * 4


def test_the_transcribed_times_give_the_published_bandwidths():
    """Each row's GB/s column, with the script's byte count, gives back the time it printed (to its 3 decimals of a
    millisecond): the two columns were transcribed together."""
    rms = [r for r in ROWS if r["norm_type"] == "rms_norm"]
    assert len(rms) == 120 and {r["device"] for r in rms} == {"H200", "GB200", "GB300"}
    for r in rms:
        for backward, ms, gbps in ((False, r["fwd_ms"], r["fwd_GBps"]), (True, r["bwd_ms"], r["bwd_GBps"])):
            assert abs(_bench_bytes(r, backward) / (gbps * 1e9) * 1e3 - ms) <= 0.0005 + 1e-9


@pytest.mark.parametrize("part", ["H200", "GB200", "GB300"])
def test_a_fused_norm_at_a_measured_shape_takes_the_measured_time(part):
    """At a size the benchmark timed once (N x C elements), the price is its cuDNN time, forward and backward."""
    device = catalogue()[part]
    timed = [r for r in ROWS if (r["device"], r["backend"], r["norm_type"]) == (part, "cudnn", "rms_norm")]
    sizes = [r["N"] * r["C"] for r in timed]
    for r in timed:
        if sizes.count(r["N"] * r["C"]) == 1:
            for backward, ms in ((False, r["fwd_ms"]), (True, r["bwd_ms"])):
                op = OpSpec("rmsnorm", (r["N"], r["C"]), "bf16", backward=backward, impl="fused")
                assert norms.measured_s(op, device) == pytest.approx(ms * 1e-3, rel=1e-9)


def test_other_parts_take_their_familys_rate_by_hbm_bandwidth():
    """An H100 runs the H200's rate times 3.35 / 4.8 TB/s; a B200 the GB200's times its 7.67 / 8 TB/s."""
    cat = catalogue()
    op = OpSpec("rmsnorm", (16384, 4096), "bf16", backward=True, impl="fused")
    assert norms.measured_s(op, cat["H100-SXM"]) == pytest.approx(norms.measured_s(op, cat["H200"]) * 4.8 / 3.35)
    assert norms.measured_s(op, cat["B200"]) == pytest.approx(norms.measured_s(op, cat["GB200"]) * 8.0 / 7.672)
    assert norms.measured_s(op, cat["A100-80GB"]) is None  # no timing of that family
    assert norms.measured_s(OpSpec("rmsnorm", (16384, 4096), "bf16"), cat["H200"]) is None  # not a fused norm


@pytest.mark.parametrize("ours, part", [("nvidia-h200.json", "H200"), ("nvidia-h100.json", "H100-SXM")])
def test_the_benchmark_and_its_bandwidth_scaling_hold_against_our_own_runs(ours, part):
    """PyTorch's ``F.rms_norm`` forward at the benchmark's rate (on an H100: the H200's scaled by 3.35 / 4.8 TB/s)
    against the same kernel timed by ``bench/gpu_kernels.py`` on our lent H200 and H100
    (``costmodel/data/measured``, 2026-11-26), at the sizes inside the benchmark's range: within 10% (0.99x on the
    H200, 1.07x on the H100)."""
    records = measured_files()[ours]["sections"]["memory"]["records"]
    largest = norms.curve("H200", "rmsnorm", False, "pytorch")[-1][0]
    inside = [r for r in records if (r["op"], r["variant"]) == ("rms_norm", "F.rms_norm")
              and OpSpec("rmsnorm", tuple(r["shape"]), "bf16").bytes <= largest]
    assert inside
    for r in inside:
        priced = norms.backend_s(OpSpec("rmsnorm", tuple(r["shape"]), "bf16"), catalogue()[part], "pytorch")
        assert priced / (r["median_ms"] * 1e-3) == pytest.approx(1.0, abs=0.10)


def test_the_solvers_batch_path_prices_the_measured_time():
    """``predict_batch`` (the solvers' fast path) prices a fused norm at a size the benchmark timed once on the GB200
    at its published cuDNN times, forward and backward, and ``predict`` names the measurement."""
    p, dev = Pricer.shipped(), catalogue()["GB200"]
    timed = [r for r in ROWS if (r["device"], r["backend"], r["norm_type"]) == ("GB200", "cudnn", "rms_norm")]
    sizes = [r["N"] * r["C"] for r in timed]
    r = next(r for r in timed if sizes.count(r["N"] * r["C"]) == 1)
    ops = [OpSpec("rmsnorm", (r["N"], r["C"]), "bf16", backward=b, impl="fused") for b in (False, True)]
    assert list(p.predict_batch(ops, dev)) == pytest.approx([r["fwd_ms"] * 1e-3, r["bwd_ms"] * 1e-3])
    assert "cuDNN's fused rmsnorm on GB200" in p.predict_with_source(ops[0], dev)[1]


def test_each_stack_runs_its_own_norm_kernel():
    """The megatron stack's pre-norms and final norm are Transformer Engine's (``fused``), torchtitan's are
    torch.compile's (``compiled``), eager code's RMSNorm is its formula (``eager``) and its LayerNorm one PyTorch
    kernel (the default); a Mamba mixer's gated norm (mamba_ssm's Triton kernel) is none of them."""
    model = load_model("nemotron-3-nano-30b-a3b")
    hybrid = next(i for i in range(model.num_layers) if "M" in model.layer_kind(i))
    for stack, impl in (("megatron", "fused"), ("torchtitan", "compiled"), ("eager", "eager")):
        lay = Layout(micro_batch=1, stack=stack)
        norm_ops = [o for o in layer_ops(model, hybrid, lay, 4096).compute if o.kind == "rmsnorm"]
        assert norm_ops[0].impl == impl and norm_ops[0].shape[1] == model.hidden_size  # the pre-norm
        assert all(o.impl == "" for o in norm_ops if o.shape[1] != model.hidden_size)  # the gated norm
        assert head_ops(model, lay, 4096)[0].impl == impl
    gpt = load_model("gpt2")  # a LayerNorm model
    assert head_ops(gpt, Layout(micro_batch=1, stack="eager"), 1024)[0].impl == ""


def test_a_compiled_norm_takes_the_torch_compile_rows():
    """torch.compile's norm at a size timed once on the GB200 is the benchmark's torch_compile time there."""
    dev = catalogue()["GB200"]
    timed = [r for r in ROWS if (r["device"], r["backend"], r["norm_type"]) == ("GB200", "torch_compile", "rms_norm")]
    sizes = [r["N"] * r["C"] for r in timed]
    r = next(r for r in timed if sizes.count(r["N"] * r["C"]) == 1)
    op = OpSpec("rmsnorm", (r["N"], r["C"]), "bf16", backward=True, impl="compiled")
    assert norms.measured_s(op, dev) == pytest.approx(r["bwd_ms"] * 1e-3)


@pytest.mark.parametrize("ours, part", [("nvidia-h200.json", "H200"), ("nvidia-h100.json", "H100-SXM")])
def test_eager_codes_rmsnorm_formula_is_priced_at_our_runs_of_it(ours, part):
    """Eager code's RMSNorm formula at the two sizes ``bench/gpu_kernels.py`` timed it on our H100 and H200 is that
    time; the estimator prices its backward as twice the bytes at the rate the formula reaches at that size."""
    p, dev = Pricer.shipped(), catalogue()[part]
    records = [r for r in measured_files()[ours]["sections"]["memory"]["records"]
               if (r["op"], r["variant"]) == ("rms_norm", "eager")]
    assert len(records) == 2
    for r in records:
        fwd = OpSpec("rmsnorm", tuple(r["shape"]), "bf16", impl="eager")
        assert p.predict(fwd, dev) == pytest.approx(r["median_ms"] * 1e-3)
        bwd = GpuEstimator(p)._bwd_s(fwd, dev)
        assert bwd == pytest.approx(p.predict(replace(fwd, backward=True), dev))
        assert 1.8 < bwd / (r["median_ms"] * 1e-3) < 2.2


def test_without_a_run_the_eager_formula_is_the_norm_and_three_passes():
    """On a part no run stands for (an A100), the formula is the norm kernel's price plus three elementwise passes
    over the tensor (upcast, scale, weight; counted from the modelling code)."""
    p, dev = Pricer.shipped(), catalogue()["A100-80GB"]
    op = OpSpec("rmsnorm", (8192, 4096), "bf16", impl="eager")
    plain = p.predict(OpSpec("rmsnorm", (8192, 4096), "bf16"), dev)
    ew = p.predict(OpSpec("elementwise", (8192 * 4096,), "bf16"), dev)
    assert p.predict(op, dev) == pytest.approx(plain + norms.EAGER_EXTRA_PASSES * ew)
