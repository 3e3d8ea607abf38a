"""``meshplan replay``: JSON contract, summary of every shared trace, timeline file, what-if."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshplan.cli.main import app
from tests.helpers import DATA, shared_path

DLRM = ("traces", "param_dlrm_8rank", "dlrm_kineto.tar.gz")


def test_replay_json_contract(runner):
    res = runner.invoke(app, ["replay", str(shared_path(*DLRM)), "--json", "--what-if", "host=0.5"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    assert set(rep) >= {"steps", "median_error", "critical_path", "warnings"}
    (s,) = rep["steps"]
    assert set(s) >= {"step", "measured_s", "replayed_s", "error", "whatif_s"}
    assert abs(s["error"]) < 0.05 and rep["median_error"] == pytest.approx(abs(s["error"]))
    # DLRM is host-bound (its critical path is Python/host work): halving host time shortens the step
    assert s["whatif_s"] < 0.9 * s["replayed_s"]
    assert rep["critical_path"] and all({"kind", "name", "exposed_s", "share"} <= set(o) for o in rep["critical_path"])


def test_replay_table_output(runner):
    res = runner.invoke(app, ["replay", str(DATA / "profiler" / "gloo_ddp_2rank")])
    assert res.exit_code == 0, res.output
    assert "measured vs replayed" in res.output and "critical path" in res.output


def _shared_inputs() -> list[Path]:
    root = shared_path("traces")
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith((".json.gz", ".tar.gz", ".tgz")))


def _check_summaries(runner, paths) -> int:
    seen_kineto = 0
    for p in paths:
        res = runner.invoke(app, ["replay", str(p), "--summary", "--json"])
        assert res.exit_code == 0, (p, res.output)
        s = json.loads(res.output)
        if s["ranks"]:
            seen_kineto += 1
            assert sum(s["ops"].values()) > 0
        else:  # Chakra / execution-trace samples: said clearly
            assert s["skipped"] and all(("execution trace" in k["reason"]) or ("not Kineto" in k["reason"])
                                        or ("resource-fork" in k["reason"]) for k in s["skipped"]), s
    return seen_kineto


@pytest.mark.slow
def test_every_shared_trace_loads_with_summary(runner):
    assert _check_summaries(runner, _shared_inputs()) >= 12


def test_shared_trace_kinds_load_with_summary(runner):
    # One of each kind: old-format 8-rank tarball, modern-metadata trace, ns-resolution trace, Chakra tarballs,
    # an execution trace (the full sweep is the slow test above).
    names = ("dlrm_kineto.tar.gz", "dlrm_pytorch_et.tar.gz", "nccl_data.json.gz", "sampled_rank-1.json.gz",
             "1.0.2-chakra.0.0.4.tgz", "feeder_tests_trace.tar.gz", "benchmark_simple_add_et.json.gz",
             "event_sync_trace.json.gz")
    paths = [p for p in _shared_inputs() if p.name in names]
    assert len(paths) == len(names)
    assert _check_summaries(runner, paths) == 4


def test_summary_table_names_non_kineto(runner):
    res = runner.invoke(app, ["replay", str(shared_path("traces", "chakra_et_samples", "feeder_tests_trace.tar.gz")),
                              "--summary"])
    assert res.exit_code == 0
    assert "no Kineto trace" in res.output and "Chakra protobuf" in res.output


def test_timeline_file(runner, tmp_path):
    out = tmp_path / "tl" / "gloo.json"
    res = runner.invoke(app, ["replay", str(DATA / "profiler" / "gloo_ddp_2rank"), "--timeline", str(out), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert {"replay rank 0", "replay rank 1", "measured rank 0 (aligned)", "critical path"} <= names
    replayed = [e for e in xs if e["pid"] in (0, 1)]
    measured = [e for e in xs if e["pid"] >= 1_000_000 and e["pid"] < 2_000_000]
    assert len(replayed) == len(measured) > 600
    assert any(e["args"].get("critical") for e in replayed)
    assert not list(out.parent.glob(".*.tmp"))  # written atomically, no temp left


def test_bad_knob_exit_2(runner):
    res = runner.invoke(app, ["replay", str(DATA / "profiler" / "gloo_ddp_2rank"), "--what-if", "speed=2"])
    assert res.exit_code == 2 and "unknown knob" in res.output and "Traceback" not in res.output
