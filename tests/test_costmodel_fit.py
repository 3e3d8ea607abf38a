"""Calibration from real profiled runs, local micro-benchmarks, and the collective model."""
from __future__ import annotations

import json

import numpy as np
import pytest

from meshplan.costmodel.learned import LearnedModel
from tests.helpers import REPO, data_path

SHIPPED = REPO / "costmodel" / "data" / "model"


def _profiled_run(out_dir, configs: list[tuple[int, int]]) -> None:
    """A real single-process run under torch.profiler (record_shapes=True): one MLP block per (hidden, batch)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    torch.set_num_threads(1)
    blocks = [(torch.nn.Sequential(torch.nn.Linear(h, 4 * h), torch.nn.GELU(), torch.nn.Linear(4 * h, h),
                                   torch.nn.LayerNorm(h)), torch.randn(b, h)) for h, b in configs]
    with torch.no_grad():
        for block, x in blocks:
            block(x)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            for _ in range(6):
                for block, x in blocks:
                    block(x)
    out_dir.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(out_dir / "rank0.trace.json"))


def _mape(model: LearnedModel, rows, dev) -> float:
    sec, _ = model.predict_arrays(rows.op, rows.b, rows.m, rows.n, rows.k, rows.dtype, rows.device,
                                  {dev.name: dev})
    return float(np.mean(np.abs(sec - rows.latency_s) / rows.latency_s))


def _fit_and_compare(tmp_path, on: str = "run2") -> tuple[float, float]:
    """Profile two real runs of different shapes, fit on the first, return (MAPE before, after) on run ``on``."""
    from meshplan.costmodel.collect import measure_device
    from meshplan.costmodel.datasets.local import load_device
    from meshplan.verify.op_fit import fit_runs, rows_from_run

    _profiled_run(tmp_path / "run1", [(256, 32), (256, 128), (512, 32), (512, 128)])
    _profiled_run(tmp_path / "run2", [(384, 64), (320, 96)])  # shapes the first run never had
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "device.json").write_text(json.dumps(measure_device("cpu", threads=1, quick=True)))
    dev = load_device(tmp_path / "dev" / "device.json")
    summary = fit_runs([tmp_path / "run1"], SHIPPED, tmp_path / "cal", device_dir=tmp_path / "dev")
    assert summary["ops"] == {"activation": 4, "layernorm": 4, "matmul": 8}
    rows = rows_from_run(tmp_path / on, dev.name)
    assert set(rows.op) == {"activation", "layernorm", "matmul"}
    return _mape(LearnedModel.load(SHIPPED), rows, dev), _mape(LearnedModel.load(tmp_path / "cal"), rows, dev)


def test_fit_learns_the_run_it_was_shown(tmp_path):
    """In sample: the model calibrated on a run's op records prices those records better than the shipped model,
    which never saw this host. (Whatever the host's load, the records are what the fit was shown.)"""
    before, after = _fit_and_compare(tmp_path, on="run1")
    assert after < 0.7 * before, (before, after)


@pytest.mark.slow
def test_fit_on_one_run_reduces_error_on_another(tmp_path):
    """Out of sample, a measurement of this host (two runs minutes apart on a shared 2-core machine), run on demand."""
    before, after = _fit_and_compare(tmp_path)
    print(f"\nshapes run 1 never had: MAPE {100 * before:.1f}% shipped -> {100 * after:.1f}% calibrated")
    assert after < 0.7 * before, (before, after)


def test_collect_quick_writes_a_loadable_dataset(tmp_path, runner):
    from meshplan.cli.main import app
    from meshplan.costmodel.datasets import load

    r = runner.invoke(app, ["costmodel", "collect", "--out", str(tmp_path / "cpu"), "--quick", "--repeats", "2",
                            "--json"])
    assert r.exit_code == 0, r.output
    ds = load([tmp_path / "cpu"])
    t = ds.table
    assert len(t) == json.loads(r.output)["rows"] >= 20
    # A torch op call costs 0.1-100 us on any CPU (physical bounds, 1000x wide: a unit slip would break them).
    dev = json.loads((tmp_path / "cpu" / "device.json").read_text())
    assert 1e-7 < dev["launch_s"] < 1e-4 and np.all(t.latency_s > 1e-7)
    assert np.all(t.latency_s > 0) and np.all(np.isfinite(t.noise)) and np.all(t.noise >= 0)
    # Physical check of units and device vector: ops do not run faster than the measured peak / bandwidth allow
    # (a 4x margin: the quick peak is measured in 0.1 s on a shared machine; a unit slip would be 1000x).
    from meshplan.costmodel.train import prepare

    p = prepare(t, ds.measured)
    assert np.mean(p.y > np.log(0.25)) > 0.9


def test_model_trained_on_collect_prices_that_device_later(tmp_path, runner):
    """`collect` -> `train --data DIR` -> `predict --device cpu-1t --model M` in separate commands: the measured
    device travels inside the model's metadata (it is in no catalogue)."""
    from meshplan.cli.main import app
    from meshplan.costmodel.collect import collect
    collect(tmp_path / "cpu", quick=True, n_random=300, repeats=1, seed=3)
    r = runner.invoke(app, ["costmodel", "train", "--data", str(tmp_path / "cpu"), "--out", str(tmp_path / "m")])
    assert r.exit_code == 0, r.output
    meta = json.loads((tmp_path / "m" / "metadata.json").read_text())
    assert [d["name"] for d in meta["measured_devices"]] == ["cpu-1t"] and meta["measured_devices"][0]["launch_s"] > 0
    # Nothing of the training run stays behind in this process: only the model can say what cpu-1t is.
    bad = runner.invoke(app, ["costmodel", "predict", "--op", "matmul", "--shape", "64x64x64", "--device", "cpu-1t"])
    assert bad.exit_code == 2 and "unknown device 'cpu-1t'" in bad.output
    rows = [ln.split(",") for ln in (tmp_path / "cpu" / "local.csv").read_text().splitlines()[1:]]
    trained = [k for k, v in meta["kinds"].items() if v["n_train"] >= 30]
    assert "matmul" in trained, meta["kinds"].keys()
    matmuls = [r_ for r_ in rows if r_[1] == "matmul"]
    row = matmuls[0]
    r = runner.invoke(app, ["costmodel", "predict", "--op", "matmul", "--shape", f"{row[4]}x{row[5]}x{row[6]}",
                            "--dtype", "fp32", "--device", "cpu-1t", "--model", str(tmp_path / "m"), "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.output)
    # the command prices with the model it was given, as the library does in this process
    from meshplan.costmodel.query import predict_query

    want = predict_query("matmul", f"{row[4]}x{row[5]}x{row[6]}", "cpu-1t", "fp32", model=tmp_path / "m")
    assert got["source"] == "learned" and got["latency_s"] == pytest.approx(want["latency_s"], rel=1e-9)
    # Training shapes: the trees order their own measurements as measured. Over every matmul row, by rank: the rows
    # span orders of magnitude of FLOPs, while a one-repeat timing on a shared machine sits up to ~50% off its
    # neighbours when another process takes a core for part of the collect (the trees, which need two rows a leaf,
    # then miss a third of the rows by 30-45%: a lone-clone run beside another job, 2026-11-28).
    got_s = [predict_query("matmul", f"{m_[4]}x{m_[5]}x{m_[6]}", "cpu-1t", "fp32", model=tmp_path / "m")["latency_s"]
             for m_ in matmuls]
    measured_s = [float(m_[8]) for m_ in matmuls]
    rho = float(np.corrcoef(np.argsort(np.argsort(got_s)), np.argsort(np.argsort(measured_s)))[0, 1])
    assert len(matmuls) >= 30 and rho > 0.9, (rho, sorted(zip(measured_s, got_s)))
    # and at their scale: a unit slip would put the median ratio 1000x off, the noise above 1.5x at most
    assert 0.5 < float(np.median(np.array(got_s) / np.array(measured_s))) < 2.0


@pytest.mark.slow
def test_local_split_unseen_shapes_within_target(tmp_path):
    """Issue 4: on this machine, held-out shapes <= 10% MAPE per class, or within 2x the measured noise floor.

    The full ``collect`` grid (about 3.5 min on one core): each class's noise floor is the median spread of its own
    repeats, so a disturbed host raises the bar it is judged against instead of failing the test.
    """
    from meshplan.costmodel.collect import collect
    from meshplan.costmodel.eval import evaluate

    collect(tmp_path / "cpu", repeats=3)
    rows = evaluate("local", [tmp_path / "cpu"])
    assert {r["op"] for r in rows} >= {"matmul", "bmm", "attention", "layernorm", "rmsnorm", "softmax",
                                       "elementwise", "activation", "embedding", "copy", "cast"}
    for r in rows:
        assert r["fallback_frac"] == 0.0, r  # every class has a model (it had not for four classes before)
        assert r["mape"] <= max(10.0, 2.0 * r["noise_floor_pct"]), r


def test_collectives_heldout_sizes_and_two_node():
    from meshplan.costmodel.eval import evaluate

    rows = evaluate("vidur-network", [data_path("kernels", "vidur")])
    held = [r for r in rows if "held-out sizes" in r["op"]]
    assert {r["device"] for r in held} == {"a100_dgx", "h100_dgx"}
    for r in held:
        assert r["mape"] <= 10.0, r  # issue 4 target: held-out sizes <= 10% MAPE (measured 1.8-5.0%)
    two = [r for r in rows if "2-node" in r["op"]]
    assert two and two[0]["n"] > 1000  # reported; the 1-node -> 2-node target is missed (see BENCHMARKS.md)


def test_predict_collective_uses_fitted_link():
    from meshplan.costmodel.collective_model import predict_collective
    from meshplan.costmodel.collectives import collective_time_s

    m = LearnedModel.load(SHIPPED).collective_model()
    link = m.link("h100_dgx/intra")
    t = predict_collective("allreduce", 64 << 20, 8, link, model=m)
    # Vidur PROVENANCE.md: a 64 MiB all-reduce over 8xH100 takes a median of about 0.32-0.35 ms.
    assert 0.29e-3 < t < 0.38e-3
    ag = predict_collective("allgather", 64 << 20, 8, link, model=m)
    assert ag < t and ag > collective_time_s("allgather", 64 << 20, 8, link) * 0.5
    with pytest.raises(Exception, match="unknown collective"):
        predict_collective("broadcastx", 1, 2, link, model=m)


def test_gpu_run_rows_from_real_trace():
    """Op records of a real 8-rank V100 DLRM run (Kineto, record_shapes on): kernel time per op via correlation."""
    from meshplan.costmodel.datasets.devices import resolve
    from meshplan.costmodel.train import prepare
    from meshplan.verify.op_fit import rows_from_run

    t = rows_from_run(data_path("traces", "param_dlrm_8rank", "dlrm_kineto.tar.gz"), "V100-SXM2-32GB")
    assert {"matmul", "bmm"} <= set(t.op)
    assert resolve("V100-SXM2-32GB").sm_count == 80
    # Kernel times are physical: none beats the V100's ideal roofline, all pay at least a ~2 us kernel floor.
    p = prepare(t)
    assert np.all(p.y >= 0.0)
    assert np.all(t.latency_s >= 2e-6)


A100_TRACE = ("traces", "hta_testdata", "negative_queue_length_values_check", "rank0.json.gz")


def test_gpu_trace_fit_names_its_device_and_feeds_the_planner(tmp_path, runner):
    """`costmodel fit --runs` on a real A100 trace: the device comes from the trace header, the calibrated model
    moves toward the trace's measured kernel times, and `plan --costmodel` prices with it."""
    from meshplan.cli.main import app
    from meshplan.costmodel.devices import get_device
    from meshplan.verify.op_fit import rows_from_run

    trace = data_path(*A100_TRACE)
    r = runner.invoke(app, ["costmodel", "fit", "--runs", str(trace), "--out", str(tmp_path / "cal"), "--json"])
    assert r.exit_code == 0, r.output
    ops = json.loads(r.stdout)["ops"]
    assert ops["device"] == "A100-80GB"  # deviceProperties: "NVIDIA A100-SXM4-80GB"
    assert "matmul" in ops["calibrated"] and "activation" not in ops["calibrated"]  # one activation shape only
    rows = rows_from_run(trace, "A100-80GB")
    dev = get_device("A100-80GB")
    sel = rows.op == "matmul"
    shipped, fitted = LearnedModel.load(SHIPPED), LearnedModel.load(tmp_path / "cal")

    def err(model):
        sec, _ = model.predict_arrays(rows.op[sel], rows.b[sel], rows.m[sel], rows.n[sel], rows.k[sel],
                                      rows.dtype[sel], rows.device[sel], {dev.name: dev})
        return float(np.mean(np.abs(sec - rows.latency_s[sel]) / rows.latency_s[sel]))

    assert err(fitted) < err(shipped)
    common = ["plan", "--model", "llama-3.1-8b", "--cluster", "1x8xA100", "--global-batch", "64", "--seq-len",
              "4096", "--fix", "tp=2,pp=1,mbs=1", "--top", "1", "--json"]
    a = runner.invoke(app, [*common, "--out", str(tmp_path / "a.yaml")])
    b = runner.invoke(app, [*common, "--out", str(tmp_path / "b.yaml"), "--costmodel", str(tmp_path / "cal")])
    assert a.exit_code == 0 and b.exit_code == 0, (a.output, b.output)
    from meshplan.planner.plan.schema import load_plan

    pa, pb = load_plan(tmp_path / "a.yaml").prediction, load_plan(tmp_path / "b.yaml").prediction
    assert pb.costmodel == f"learned:{fitted.model_id}" != pa.costmodel
    assert pb.step_time_s != pa.step_time_s
    # --costmodel prices that plan only: nothing of it is left in the process for the next plan
    c = runner.invoke(app, [*common, "--out", str(tmp_path / "c.yaml")])
    assert c.exit_code == 0, c.output
    assert load_plan(tmp_path / "c.yaml").prediction == pa and pa.costmodel == f"learned:{shipped.model_id}"


def test_fit_usage_errors_are_one_line(tmp_path, runner):
    from meshplan.cli.main import app
    from tests.helpers import REPO as repo

    bare = repo / "tests" / "data" / "profiler" / "gloo_ddp_2rank"  # traces without run.json: no plan to fit
    r = runner.invoke(app, ["costmodel", "fit", "--runs", str(bare)])
    assert r.exit_code == 2 and "not a run of a local:N plan" in r.output and "--out" in r.output
    r = runner.invoke(app, ["costmodel", "fit", "--runs", str(tmp_path / "nope"), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "run folder not found" in r.output
    v100_16 = data_path("traces", "hta_testdata", "trace_diff", "test", "test.json.gz")  # V100-SXM2-16GB
    r = runner.invoke(app, ["costmodel", "fit", "--runs", str(v100_16), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "pass --device" in r.output and "Tesla V100-SXM2-16GB" in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_the_device_vector_keeps_each_rate_at_its_faster_reading():
    """``collect`` measures the device vector before and after its grid: a process sharing the cores during one
    reading (here the first: GEMMs at a third of their rate, the copy at half, the op call three times dearer) must
    not set it for the whole dataset, whose later rows ran without it."""
    from meshplan.costmodel.collect import fastest_device

    loaded = {"name": "cpu-1t", "peak_flops": {"fp32": 5.0e10, "bf16": 3.5e11}, "mem_bw_bytes_per_s": 5.0e9,
              "launch_s": 4.5e-6}
    quiet = {"name": "cpu-1t", "peak_flops": {"fp32": 1.5e11, "bf16": 1.1e12}, "mem_bw_bytes_per_s": 1.0e10,
             "launch_s": 1.5e-6}
    for a, b in ((loaded, quiet), (quiet, loaded)):
        dev = fastest_device(a, b)
        assert dev["peak_flops"] == quiet["peak_flops"] and dev["mem_bw_bytes_per_s"] == 1.0e10
        assert dev["launch_s"] == 1.5e-6 and dev["name"] == "cpu-1t"
