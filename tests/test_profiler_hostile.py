"""Hostile and broken input to the trace / run.json readers and the replay command (issue 16, items 2-5).

Every case ends in one line naming the file and the field, exit 2, never a traceback; nothing an input names is
overwritten; decompression is bounded and its temporary folder removed.
"""
from __future__ import annotations

import gzip
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

import pytest

import meshplan.profiler.archive as archive
import meshplan.profiler.jsonstream as jsonstream
from meshplan.cli.main import app
from meshplan.core.errors import MeshplanError
from meshplan.profiler.capture import load_run_json
from meshplan.profiler.runs import load_run
from tests.helpers import DATA, REPO, data_path

GLOO = DATA / "profiler" / "gloo_ddp_2rank"


def _doc() -> dict:
    """A real small trace (HTA's cuda_event_sync, one step, 4 kernels) to break."""
    src = data_path("traces", "external", "hta_cuda_event_sync_a100", "event_sync_trace.json.gz")
    return json.loads(gzip.decompress(src.read_bytes()))


def _write(tmp_path: Path, doc, name: str = "rank0.trace.json") -> Path:
    p = tmp_path / name
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return p


def _refused(runner, args: list[str], *needles: str) -> str:
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    out = " ".join(res.output.split())
    assert "Traceback" not in res.output and all(n in out for n in needles), out
    return out


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("field,value,needle", [
    ("rank", -3, "distributedInfo.rank"), ("world_size", -4, "distributedInfo.world_size"),
    ("world_size", "many", "distributedInfo.world_size"), ("world_size", 1e8, "distributedInfo.world_size"),
    ("rank", "x", "distributedInfo.rank"), ("pg_config", 5, "distributedInfo.pg_config"),
])
def test_bad_distributed_info(runner, tmp_path, field, value, needle):
    doc = _doc()
    doc["distributedInfo"] = {"rank": 0, "world_size": 1, field: value}
    _refused(runner, ["replay", str(_write(tmp_path, doc)), "--json"], needle, "rank0.trace.json")


@pytest.mark.parametrize("raw", ['"abc"', "1e309", "-5", "[1]"])
def test_bad_base_time(runner, tmp_path, raw):
    text = json.dumps(_doc())
    text = text.replace('{"schemaVersion"', '{"baseTimeNanoseconds": ' + raw + ', "schemaVersion"', 1) \
        if '"schemaVersion"' in text else '{"baseTimeNanoseconds": ' + raw + ", " + text[1:]
    _refused(runner, ["replay", str(_write(tmp_path, text)), "--json"], "baseTimeNanoseconds")


@pytest.mark.parametrize("field,value,needle", [
    ("args", [1, 2], "args: expected an object, got list"), ("args", "x", "args: expected an object, got str"),
    ("ts", "abc", "ts: expected a finite number"), ("dur", -7, "dur: expected >= 0"),
    ("name", {"a": 1}, "name: expected a string"), ("ts", 10**1000, "ts: expected a finite number of microseconds, "
                                                                   "got an integer past 64 bits"),
    ("args.correlation", "7", "args.correlation: expected an integer, got a str"),
    ("args.Input Dims", "[[1]]", "args.Input Dims: expected a list"),
])
def test_events_with_wrong_field_types_refuse_the_trace(runner, tmp_path, field, value, needle):
    """A timed event's field of the wrong type is one line naming the file, the event and the field, exit 2."""
    doc = _doc()
    i, ev = next((i, e) for i, e in enumerate(doc["traceEvents"]) if e.get("ph") == "X" and e.get("cat") == "cpu_op")
    if field.startswith("args."):
        ev.setdefault("args", {})[field[5:]] = value
    else:
        ev[field] = value
    sys.set_int_max_str_digits(0)
    try:
        p = _write(tmp_path, json.dumps(doc))
    finally:
        sys.set_int_max_str_digits(4300)
    _refused(runner, ["replay", str(p), "--json"], f"traceEvents[{i}]")
    _refused(runner, ["replay", str(p), "--json"], needle)


def test_infinite_ts_refuses_the_trace(runner, tmp_path):
    doc = _doc()
    ev = next(e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op")
    p = _write(tmp_path, json.dumps(doc).replace(f'"ts": {ev["ts"]}', '"ts": 1e309', 1))
    _refused(runner, ["replay", str(p), "--json"], "ts: expected a finite number of microseconds, got inf")


@pytest.mark.parametrize("text,needle", [
    ('{"traceEvents": []}', "no Kineto trace"),
    ('{"traceEvents": [' + "[" * 100_000 + "]" * 100_000 + "]}", "nested too deeply"),
    ('{"traceEvents": [{"ph": "X", "cat": "kernel", "args": ' + "[" * 50_000 + "]" * 50_000 + "}]}",
     "nested too deeply"),
    ("[]", "no Kineto trace"), ("null", "not a Kineto/Chrome trace"), ('{"traceEvents": 5}', "traceEvents"),
])
def test_degenerate_documents(runner, tmp_path, text, needle):
    _refused(runner, ["replay", str(_write(tmp_path, text)), "--json"], needle)


def test_swapped_step_timestamps(runner, tmp_path):
    doc = _doc()
    st = next(e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#"))
    twin = dict(st, name="ProfilerStep#99", ts=st["ts"] - st["dur"] / 2)  # step 99 starts inside step 100
    doc["traceEvents"].append(twin)
    _refused(runner, ["replay", str(_write(tmp_path, doc)), "--json"], "out of order")


@pytest.mark.parametrize("args,needles", [
    (["--what-if", "name~sortt=0.25"], ("matches no op", "closest op names")),
    (["--what-if", "name~allreduce=0.5,name~zzzz=2"], ("name~zzzz=2", "matches no op")),
    (["--what-if", "memcpy=0.5"], ("matches no op", "op kinds present")),
    (["--what-if", "compute=inf"], ("finite",)), (["--what-if", "compute=nan"], ("finite",)),
    (["--what-if", "compute@7=2"], ("matches no op", "rank(s) [7]")),
    (["--step", "99999"], ("--step 99999", "not a step")),
    (["--ranks", "-3"], ("--ranks",)), (["--ranks", "0-x"], ("--ranks",)), (["--ranks", "5-2"], ("--ranks",)),
    (["--steps-at", "no_such_op"], ("--steps-at", "occurrence")),
    (["--timeline-format", "svg"], ("--timeline-format",)), (["--ray", "auto", "--summary"], ("--ray",)),
])
def test_replay_options_refused(runner, args, needles):
    _refused(runner, ["replay", str(GLOO), "--json", *args], *needles)


def test_comma_separated_knobs_both_apply(runner):
    res = runner.invoke(app, ["replay", str(GLOO), "--json", "--what-if", "name~allreduce=0.5,compute@0,1=0.9"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    assert rep["what_if"] == ["name~allreduce=0.5", "compute@0,1=0.9"]
    assert all(n > 0 for n in rep["what_if_ops"].values()) and all("whatif_s" in s for s in rep["steps"])


# --- run.json --------------------------------------------------------------------------------------------------

def _run_folder(tmp_path: Path, run: dict | bytes) -> Path:
    d = tmp_path / "run"
    d.mkdir()
    for f in GLOO.glob("rank*.trace.json.gz"):
        (d / f.name).write_bytes(f.read_bytes())
    (d / "run.json").write_bytes(run if isinstance(run, bytes) else json.dumps(run).encode())
    return d


def _good_run() -> dict:
    return {"format": "meshplan-run/1", "world_size": 2, "backend": "gloo",
            "step_times_s": {"0": [0.1, 0.11], "1": [0.1, 0.12]},
            "traces": {"0": "rank0.trace.json.gz", "1": "rank1.trace.json.gz"}}


@pytest.mark.parametrize("patch,needle", [
    ({"world_size": "many"}, "world_size"), ({"world_size": 1e8}, "world_size"), ({"world_size": 0}, "world_size"),
    ({"step_times_s": {"0": [0.1, -1.0]}}, "step_times_s"), ({"step_times_s": {"0": [0.0]}}, "step_times_s"),
    ({"step_times_s": {"0": [float("nan")]}}, "step_times_s"), ({"step_times_s": [1, 2]}, "step_times_s"),
    ({"step_times_s": {"9": [0.1]}}, "rank '9'"), ({"traces": {"0": "../../etc/passwd"}}, "traces"),
    ({"traces": 5}, "traces"), ({"hostnames": {"x": "h"}}, "hostnames"),
])
def test_bad_run_json(runner, tmp_path, patch, needle):
    run = dict(_good_run(), **patch)
    d = _run_folder(tmp_path, json.dumps(run, allow_nan=True).encode())
    with pytest.raises(MeshplanError, match=needle):
        load_run_json(d)
    _refused(runner, ["replay", str(d), "--json"], "run.json")


@pytest.mark.parametrize("raw,needle", [
    (b"\xff\xfe{\x00", "UTF-8"), (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"), (b"[1, 2]", "not an object"),
    (b"{", "malformed JSON"),
])
def test_run_json_unreadable(runner, tmp_path, raw, needle):
    d = _run_folder(tmp_path, raw)
    _refused(runner, ["replay", str(d), "--json"], needle)


def test_good_run_json_loads(tmp_path):
    d = _run_folder(tmp_path, _good_run())
    rec = load_run_json(d)
    assert rec["world_size"] == 2 and rec["step_times_s"]["1"] == [0.1, 0.12]
    assert sorted(load_run(d, workers=1).ranks) == [0, 1]


# --- bombs -----------------------------------------------------------------------------------------------------

@pytest.fixture
def small_budget(monkeypatch, tmp_path):
    """1 MiB floor, 20x ratio: the bombs below stay a few MB."""
    monkeypatch.setattr(jsonstream, "MIN_BUDGET_BYTES", 1 << 20)
    monkeypatch.setattr(jsonstream, "MAX_RATIO", 20)
    monkeypatch.setattr(archive, "MIN_BUDGET_BYTES", 1 << 20)
    monkeypatch.setattr(archive, "MAX_RATIO", 20)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp


def test_gzip_bomb_bounded(runner, tmp_path, small_budget):
    p = tmp_path / "bomb.json.gz"
    body = b'{"traceEvents": [' + b'{"ph": "i"}, ' * 400_000 + b'{"ph": "i"}]}'  # 5 MB of valid events
    p.write_bytes(gzip.compress(body, 9))
    _refused(runner, ["replay", str(p), "--json"], "decompression bomb", "bomb.json.gz")


def test_one_huge_string_bounded(runner, tmp_path, monkeypatch):
    monkeypatch.setattr(jsonstream, "MAX_VALUE_CHARS", 1 << 20)
    p = tmp_path / "str.json.gz"
    p.write_bytes(gzip.compress(b'{"traceEvents": [{"name": "' + b"a" * (4 << 20) + b'"}]}', 9))
    _refused(runner, ["replay", str(p), "--json"], "larger than")


@pytest.mark.parametrize("kind", ["zip", "tar.gz"])
def test_archive_bomb_bounded_and_cleaned(runner, tmp_path, small_budget, kind):
    stale = small_budget / "meshplan-run-999999999-old"  # left by a killed process (no such pid)
    stale.mkdir()
    payload = b"0" * (8 << 20)
    p = tmp_path / f"bomb.{kind}"
    if kind == "zip":
        with zipfile.ZipFile(p, "w", zipfile.ZIP_DEFLATED) as zf:
            zf.writestr("rank0.json", payload)
    else:
        with tarfile.open(p, "w:gz") as tf:
            info = tarfile.TarInfo("rank0.json")
            info.size = len(payload)
            tf.addfile(info, io.BytesIO(payload))
    _refused(runner, ["replay", str(p), "--json"], "decompression bomb")
    assert not list(small_budget.iterdir())  # this run's folder and the stale one are gone


def test_sigterm_during_extraction_removes_the_folder(tmp_path):
    tar = tmp_path / "run.tar.gz"
    with tarfile.open(tar, "w:gz") as tf:
        for f in GLOO.glob("*.gz"):
            tf.add(f, arcname=f.name)
    code = (f"import sys, time; sys.path.insert(0, {str(REPO)!r})\n"
            "from pathlib import Path\n"
            "from meshplan.cli.replay import _terminate_cleanly\n"
            "from meshplan.profiler.archive import extracted\n"
            "_terminate_cleanly()\n"
            f"with extracted(Path({str(tar)!r})) as d:\n"
            "    print(d, flush=True)\n"
            "    time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    folder = Path(proc.stdout.readline().strip())
    assert folder.is_dir() and list(folder.iterdir())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert not folder.exists()


def test_profile_failure_keeps_the_previous_run(tmp_path):
    from meshplan.profiler.capture_launch import LaunchConfig, launch

    out = tmp_path / "run"
    out.mkdir()
    (out / "run.json").write_text('{"kept": true}')
    script = tmp_path / "fails.py"
    script.write_text("raise ValueError('boom before any step')\n")
    with pytest.raises(MeshplanError, match="previous run"):
        launch(LaunchConfig(script=script, out_dir=out, nproc=1, warmup=0, steps=1, unprofiled=0))
    assert json.loads((out / "run.json").read_text()) == {"kept": True}
    assert (tmp_path / "run.failed" / "launch.log").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".run.")]
    assert os.environ.get("MESHPLAN_CAPTURE_OUT") is None
