"""``meshplan replay``: JSON contract, summary of every shared trace, timeline file, what-if."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshplan.cli.main import app
from tests.helpers import DATA, data_path

DLRM = ("traces", "param_dlrm_8rank", "dlrm_kineto.tar.gz")


def test_replay_json_contract(runner):
    res = runner.invoke(app, ["replay", str(data_path(*DLRM)), "--json", "--what-if", "host=0.5"])
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
    root = data_path("traces")
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith((".json.gz", ".tar.gz", ".tgz")))


def _check_summaries(runner, paths) -> int:
    seen_kineto = 0
    for p in paths:
        res = runner.invoke(app, ["replay", str(p), "--summary", "--json", "--workers", "1"])
        assert res.exit_code == 0, (p, res.output)
        s = json.loads(res.output)
        if s["ranks"]:
            seen_kineto += 1
            assert sum(s["ops"].values()) > 0 and s["inputs"]["used"]
        else:  # Chakra / execution-trace samples: said clearly
            assert s["skipped"] and all(("execution trace" in k["reason"]) or ("not Kineto" in k["reason"])
                                        or ("resource-fork" in k["reason"]) for k in s["skipped"]), s
    return seen_kineto


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path / "cache"))


@pytest.mark.slow
def test_every_shared_trace_loads_with_summary(runner):
    assert _check_summaries(runner, _shared_inputs()) >= 12


def test_shared_trace_kinds_load_with_summary(runner):
    # One of each kind: old-format 8-rank tarball, modern-metadata trace, sampled pair member, Chakra tarballs,
    # an execution trace, a cuda_sync trace (the full sweep is the slow test above).
    rels = ("param_dlrm_8rank/dlrm_kineto.tar.gz", "param_dlrm_8rank/dlrm_pytorch_et.tar.gz",
            "hta_testdata/nccl_parser_config/nccl_data.json.gz", "hta_testdata/trace_filter/sampled_rank-1.json.gz",
            "chakra_et_samples/1.0.2-chakra.0.0.4.tgz", "chakra_et_samples/feeder_tests_trace.tar.gz",
            "hta_testdata/execution_trace/benchmark_simple_add_et.json.gz",
            "hta_testdata/critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz")
    root = data_path("traces")
    paths = [root / r for r in rels]
    assert all(p.is_file() for p in paths)
    assert _check_summaries(runner, paths) == 4


def test_summary_table_names_non_kineto(runner):
    res = runner.invoke(app, ["replay", str(data_path("traces", "chakra_et_samples", "feeder_tests_trace.tar.gz")),
                              "--summary"])
    assert res.exit_code == 0
    assert "no Kineto trace" in res.output and "Chakra protobuf" in res.output


def _perfetto_slices(data: bytes):
    """(track uuid -> name), begin/end pairs per track, flows: decoded with Perfetto's own protobuf classes."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent

    tr = Trace.FromString(data)
    names, open_, slices, flows = {}, {}, [], []
    last_ts = 0
    for pk in tr.packet:
        if pk.HasField("track_descriptor"):
            td = pk.track_descriptor
            names[td.uuid] = td.name or td.process.process_name
        elif pk.HasField("track_event"):
            te = pk.track_event
            assert pk.timestamp >= last_ts  # integer ns, in order
            last_ts = pk.timestamp
            stack = open_.setdefault(te.track_uuid, [])
            if te.type == TrackEvent.TYPE_SLICE_BEGIN:
                stack.append((pk.timestamp, te.name))
                flows.extend(te.flow_ids)
            elif te.type == TrackEvent.TYPE_SLICE_END:
                t0, name = stack.pop()
                # a slice only ever encloses zero-length slices (an op of its own lane cannot overlap it)
                assert not stack or pk.timestamp == t0
                slices.append((te.track_uuid, name, t0, pk.timestamp))
    assert not any(open_.values())
    return names, slices, flows


def test_timeline_perfetto_and_chrome(runner, tmp_path):
    run = DATA / "profiler" / "gloo_ddp_2rank"
    out = tmp_path / "tl" / "gloo.pftrace"
    res = runner.invoke(app, ["replay", str(run), "--timeline", str(out), "--json"])
    assert res.exit_code == 0, res.output
    names, slices, flows = _perfetto_slices(out.read_bytes())
    procs = set(names.values())
    assert {"replay rank 0", "replay rank 1", "measured rank 0 (aligned)", "critical path"} <= procs
    crit = [s for s in slices if names[s[0]] == "critical path (exposed time)"]
    assert crit and all(a[3] <= b[2] for a, b in zip(crit, crit[1:]))  # one after another, never overlapping
    assert flows  # enqueue -> collective and collective member links
    assert not list(out.parent.glob(".*.tmp"))  # written atomically, no temp left
    cj = tmp_path / "tl" / "gloo.json"
    res = runner.invoke(app, ["replay", str(run), "--timeline", str(cj), "--timeline-format", "chrome", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(cj.read_text())
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert all(isinstance(e["ts"], int) and isinstance(e["dur"], int) for e in xs)
    assert {e["ph"] for e in doc["traceEvents"]} >= {"X", "M", "s", "f"}
    replayed = [e for e in xs if e["pid"] in (0, 1)]
    measured = [e for e in xs if 1_000_000 <= e["pid"] < 2_000_000]
    assert len(replayed) == len(measured) > 600 and len(slices) >= len(replayed) + len(measured)


def test_timeline_never_overwrites_an_input(runner, tmp_path):
    src = data_path("traces", "external", "hta_triton_a100", "triton_example.json.gz")
    trace = tmp_path / "t.json.gz"
    trace.write_bytes(src.read_bytes())
    before = trace.read_bytes()
    res = runner.invoke(app, ["replay", str(trace), "--timeline", str(trace)])
    assert res.exit_code == 2 and "would overwrite" in res.output and "Traceback" not in res.output
    assert trace.read_bytes() == before


def test_bad_knob_exit_2(runner):
    res = runner.invoke(app, ["replay", str(DATA / "profiler" / "gloo_ddp_2rank"), "--what-if", "speed=2"])
    assert res.exit_code == 2 and "unknown knob" in res.output and "Traceback" not in res.output
