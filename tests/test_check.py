"""``meshplan check``: verdicts, refusals, noise warnings, reports and the measured phase split.

Fast tests: the run folders here hold a real plan and ``run.json`` files whose step times are given, so every
expected figure (median, spread, error, exit code) is arithmetic done by hand in the comments. The real
plan -> profile -> check loop runs in tests/test_loop_real.py.
"""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from meshplan.cli.main import app
from meshplan.core.errors import MeshplanError
from meshplan.planner.plan.schema import Breakdown, ClusterRef, Degrees, DeviceGroupRef, ModelRef, Plan, Prediction
from meshplan.profiler.trace import Event, RankTrace
from meshplan.verify.breakdown import rank_step_phases, summarize
from meshplan.verify.check import check, parse_tolerance
from meshplan.verify.measured import load_measured

PRED_S = 0.200


def _plan(tmp: Path, world: int = 2, global_batch: int = 16, predicted_s: float = PRED_S) -> Path:
    model = ModelRef(name="tiny-gpt", source="examples/tiny-gpt/config.json", model_type="gpt2",
                     num_params=1088256, hidden_size=128, num_layers=4, num_attention_heads=4, num_kv_heads=4,
                     ffn_hidden_size=512, vocab_size=2048)
    plan = Plan(name="t", model=model, cluster=ClusterRef(spec=f"local:{world}", groups=(
        DeviceGroupRef(nodes=1, devices_per_node=world, device="cpu-local"),)), global_batch=global_batch,
        micro_batch=4, seq_len=256, degrees=Degrees(dp_replicate=world), dtype="fp32",
        prediction=Prediction(step_time_s=predicted_s, tokens_per_s=1.0, tflops_per_device=0.0,
                              hw_tflops_per_device=0.0, mfu=0.0, peak_memory_bytes=2**30,
                              breakdown=Breakdown(compute_s=0.15, exposed_comm_s=0.04, bubble_s=0.0, other_s=0.01)))
    return plan.save(tmp / f"plan-w{world}-b{global_batch}.yaml")


def _run(tmp: Path, steps: dict[str, list[float]], plan: Path | None = None, argv: list[str] | None = None,
         name: str = "run", **extra) -> Path:
    d = tmp / name
    d.mkdir()
    rec = {"format": "meshplan-run/1", "world_size": len(steps), "backend": "gloo", "step_times_s": steps,
           "plan": str(plan) if plan else None, "argv": argv or [], "pinned": True, **extra}
    (d / "run.json").write_text(json.dumps(rec))
    return d


def test_parse_tolerance():
    assert parse_tolerance("15%") == pytest.approx(0.15)
    assert parse_tolerance("0.2") == pytest.approx(0.2)
    assert parse_tolerance("5") == pytest.approx(0.05)
    for bad in ("abc", "0", "-3%", "150%"):
        with pytest.raises(MeshplanError, match="--tolerance"):
            parse_tolerance(bad)


def test_measured_step_is_the_slowest_rank_median(tmp_path):
    # per step max over ranks: [0.20, 0.22, 0.21, 0.30, 0.19] -> sorted 0.19 0.20 0.21 0.22 0.30, median 0.21
    run = _run(tmp_path, {"0": [0.20, 0.22, 0.20, 0.30, 0.19], "1": [0.19, 0.21, 0.21, 0.25, 0.18]})
    m = load_measured(run)
    assert m.step_s == pytest.approx((0.20, 0.22, 0.21, 0.30, 0.19))
    assert m.median_s == pytest.approx(0.21)
    # p10 = 0.19 + 0.4*(0.20-0.19) = 0.194; p90 = 0.22 + 0.6*(0.30-0.22) = 0.268; spread = 0.074/0.21
    assert m.spread == pytest.approx(0.074 / 0.21)


def test_unprofiled_steps_are_judged_when_every_rank_has_enough(tmp_path):
    plan = _plan(tmp_path)
    traced = {"0": [0.26] * 6, "1": [0.25] * 6}
    # slowest rank per step: [0.22, 0.21, 0.23, 0.21] -> median 0.215; traced median 0.26: profiler 0.045 s
    free = {"0": [0.22, 0.20, 0.23, 0.21], "1": [0.21, 0.21, 0.22, 0.20]}
    run = _run(tmp_path, traced, plan=plan, unprofiled_step_times_s=free)
    m = load_measured(run)
    assert m.unprofiled and m.median_s == pytest.approx(0.215) and m.traced_median_s == pytest.approx(0.26)
    assert m.profiler_overhead_s == pytest.approx(0.045)
    res = check(plan, run, 0.15, breakdown=False)
    assert res.measured_s == pytest.approx(0.215) and res.error == pytest.approx(0.075)  # 0.215 / 0.200 - 1
    assert res.traced_s == pytest.approx(0.26) and any("profiler stopped" in w for w in res.warnings)
    # traced steps 0.40 s against unprofiled 0.25 s (+60%): more than the profiler costs, the host changed between
    # the windows, so the traced steps are judged and the check says why
    moved = _run(tmp_path, {"0": [0.40] * 6, "1": [0.40] * 6}, plan=plan, name="moved",
                 unprofiled_step_times_s={"0": [0.25] * 4, "1": [0.25] * 4})
    m = load_measured(moved)
    assert not m.unprofiled and m.median_s == pytest.approx(0.40) and "+60%" in m.window_note
    assert any("load changed" in w for w in check(plan, moved, 0.15, breakdown=False).warnings)
    # a rank with fewer than 3 unprofiled steps: the traced steps are judged, nothing is taken off
    short = _run(tmp_path, traced, plan=plan, name="short", unprofiled_step_times_s={"0": [0.2] * 4, "1": [0.2] * 2})
    m = load_measured(short)
    assert not m.unprofiled and m.median_s == pytest.approx(0.26) and m.profiler_overhead_s == 0.0


def test_pass_and_fail_exit_codes(tmp_path, runner):
    plan = _plan(tmp_path)
    ok = _run(tmp_path, {"0": [0.21] * 6, "1": [0.20] * 6}, plan=plan, name="ok")  # +5% of 0.200
    bad = _run(tmp_path, {"0": [0.26] * 6, "1": [0.25] * 6}, plan=plan, name="bad")  # +30%
    r = runner.invoke(app, ["check", str(plan), str(ok), "--no-breakdown", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["error"] == pytest.approx(0.05) and d["passed"] and not d["noisy"]
    r = runner.invoke(app, ["check", str(plan), str(bad), "--no-breakdown", "--tolerance", "15%"])
    assert r.exit_code == 1
    assert "+30.0%" in r.output and "outside" in r.output
    r = runner.invoke(app, ["check", str(plan), str(bad), "--no-breakdown", "--tolerance", "35%"])
    assert r.exit_code == 0


def test_refuses_a_run_of_another_world_size_or_batch(tmp_path, runner):
    plan = _plan(tmp_path)
    four = _run(tmp_path, {str(r): [0.2] * 5 for r in range(4)}, name="w4")
    r = runner.invoke(app, ["check", str(plan), str(four), "--no-breakdown"])
    assert r.exit_code == 2
    assert "world size: plan 2, run 4" in r.output and "Traceback" not in r.output
    other = _plan(tmp_path, global_batch=32)
    r2 = _run(tmp_path, {"0": [0.2] * 5, "1": [0.2] * 5}, plan=other, name="b32")
    r = runner.invoke(app, ["check", str(plan), str(r2), "--no-breakdown"])
    assert r.exit_code == 2 and "global batch: plan 16, run 32" in r.output
    r3 = _run(tmp_path, {"0": [0.2] * 5, "1": [0.2] * 5}, argv=["--seq-len", "128", "--hidden", "64"], name="flags")
    r = runner.invoke(app, ["check", str(plan), str(r3), "--no-breakdown"])
    assert r.exit_code == 2 and "seq len: plan 256, run 128" in r.output and "hidden size: plan 128, run 64" in r.output


def test_bad_inputs_are_one_line(tmp_path, runner):
    plan = _plan(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    r = runner.invoke(app, ["check", str(plan), str(empty)])
    assert r.exit_code == 2 and "run.json: not found" in r.output
    nosteps = _run(tmp_path, {"0": [], "1": []}, name="nosteps")
    r = runner.invoke(app, ["check", str(plan), str(nosteps)])
    assert r.exit_code == 2 and "no measured step times" in r.output
    r = runner.invoke(app, ["check", str(tmp_path / "missing.yaml"), str(nosteps)])
    assert r.exit_code == 2 and "plan file not found" in r.output


def test_noise_warning_and_reports(tmp_path, runner):
    plan = _plan(tmp_path)
    # steps 0.15 .. 0.30: median 0.20, p10-p90 spread far above 15%
    noisy = _run(tmp_path, {"0": [0.15, 0.18, 0.20, 0.20, 0.22, 0.30], "1": [0.15, 0.18, 0.2, 0.2, 0.22, 0.3]},
                 plan=plan, name="noisy")
    junit, md = tmp_path / "out" / "report.xml", tmp_path / "out" / "summary.md"
    r = runner.invoke(app, ["check", str(plan), str(noisy), "--no-breakdown", "--junit", str(junit),
                            "--summary", str(md)])
    assert r.exit_code == 0  # median 0.20 == predicted
    assert "vary" in r.output and "not reliable" in r.output
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite.get("failures") == "0" and suite.find("testcase").get("name") == "step_time"
    assert "not reliable" in suite.find("testcase").find("system-out").text
    text = md.read_text()
    assert "## meshplan check: PASS" in text and "| step time (ms) | 200.0 | 200.0 |" in text
    bad = _run(tmp_path, {"0": [0.4] * 5, "1": [0.4] * 5}, plan=plan, name="slow")
    r = runner.invoke(app, ["check", str(plan), str(bad), "--no-breakdown", "--junit", str(junit)])
    assert r.exit_code == 1
    case = ET.parse(junit).getroot().find("testsuite").find("testcase")
    assert case.find("failure") is not None and "+100.0%" in case.find("failure").get("message")


def test_memory_compared_when_recorded(tmp_path):
    plan = _plan(tmp_path)
    run = _run(tmp_path, {"0": [0.2] * 5, "1": [0.2] * 5}, plan=plan, max_rss_bytes={"0": 3 * 2**29, "1": 2**30})
    res = check(plan, run, 0.15, breakdown=False)
    assert res.measured_peak_bytes == 3 * 2**29
    assert not any("no peak memory" in w for w in res.warnings)


def _ev(lane, kind, name, ts, dur, coll=None):
    return Event(0, lane, kind, "cpu_op" if kind == "host" else "user_annotation", name, ts, dur, coll=coll)


def test_phase_split_of_a_step():
    # One 1000 us step: main-thread ops cover [0,300) and [500,900); an all-reduce is in flight [250,550).
    # compute = |main - comm| = 250 + 350 = 600; comm = 300; idle [900,1000) = 100 -> compute (no p2p).
    evs = [_ev("t:1", "host", "aten::mm", 0, 300), _ev("t:1", "host", "aten::add", 500, 400),
           _ev("t:2", "comm", "gloo:all_reduce", 250, 300, coll="allreduce")]
    tr = RankTrace("x", 0, 2, "gloo", 0, evs, {7: (0.0, 1000.0)}, "t:1")
    ph = rank_step_phases(tr, 7)
    assert (ph.compute_s, ph.exposed_comm_s, ph.bubble_s) == pytest.approx((700e-6, 300e-6, 0.0))
    # With a pipeline recv in the step the idle 100 us is bubble instead.
    tr.events.append(_ev("t:3", "comm", "gloo:recv", 880, 100, coll="recv"))
    ph = rank_step_phases(tr, 7)
    assert (ph.compute_s, ph.exposed_comm_s, ph.bubble_s) == pytest.approx((600e-6, 300e-6, 100e-6))
    assert rank_step_phases(tr, 8) is None


def test_breakdown_reports_the_critical_rank():
    from meshplan.verify.breakdown import StepPhases

    rows = [StepPhases(0, s, 1.0, 0.5, 0.5, 0.0) for s in range(3)] + \
           [StepPhases(1, s, 1.0, 0.9, 0.1, 0.0) for s in range(3)]
    b = summarize(rows)
    assert b.rank == 1 and b.compute_s == pytest.approx(0.9) and b.exposed_comm_s == pytest.approx(0.1)


def test_junit_holds_any_path_and_is_written_with_the_users_umask(tmp_path, runner):
    """A run folder named with XML's special characters and a control character: the JUnit file still parses and
    says which run it judged; it is written with the user's umask (0o022 -> 0644), not mkstemp's 0600."""
    import os

    plan = _plan(tmp_path)
    run = _run(tmp_path, {"0": [0.2] * 5, "1": [0.2] * 5}, plan=plan, name='r<&">\x01un')
    junit = tmp_path / "report.xml"
    old = os.umask(0o022)
    try:
        r = runner.invoke(app, ["check", str(plan), str(run), "--no-breakdown", "--junit", str(junit)])
    finally:
        os.umask(old)
    assert r.exit_code == 0, r.output
    props = {p.get("name"): p.get("value") for p in ET.parse(junit).getroot().iter("property")}
    assert props["run"] == str(run).replace("\x01", "\ufffd")
    assert junit.stat().st_mode & 0o777 == 0o644
