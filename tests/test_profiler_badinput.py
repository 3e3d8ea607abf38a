"""Bad input (issue 3, item 9): broken inputs made in tmp_path from real traces; one clear line or a warning."""
from __future__ import annotations

import gzip
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from meshplan.cli.main import app
from meshplan.core.errors import MeshplanError
from meshplan.profiler.report import analyze_run, replay_report
from meshplan.profiler.runs import load_run
from tests.helpers import DATA, data_path

DLRM = ("traces", "param_dlrm_8rank", "dlrm_kineto.tar.gz")


def _dlrm_files(dest: Path, ranks) -> dict[int, Path]:
    out = {}
    with tarfile.open(data_path(*DLRM)) as tf:
        for m in tf.getmembers():
            name = Path(m.name).name
            if m.isfile() and name.startswith("worker"):
                r = int(name[len("worker")])
                if r in ranks:
                    p = dest / name
                    p.write_bytes(tf.extractfile(m).read())
                    out[r] = p
    return out


def _cli_error(runner, args) -> str:
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    text = " ".join(ln.strip() for ln in lines)
    assert text.startswith("error:")
    return text


def test_truncated_gzip(tmp_path, runner):
    src = data_path("traces", "hta_testdata", "trace_filter", "sampled_rank-0.json.gz")
    bad = tmp_path / "rank0.json.gz"
    bad.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    with pytest.raises(MeshplanError, match="truncated or corrupt gzip"):
        load_run(bad)
    msg = _cli_error(runner, ["replay", str(bad)])
    assert "rank0.json.gz" in msg and "truncated" in msg


def test_truncated_plain_json(tmp_path):
    src = _dlrm_files(tmp_path, {0})[0]
    bad = tmp_path / "cut" / "rank0.json"
    bad.parent.mkdir()
    bad.write_text(src.read_text()[:300_000])
    with pytest.raises(MeshplanError, match="truncated"):
        load_run(bad)


def test_json_that_is_not_kineto(tmp_path, runner):
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"model_type": "llama", "hidden_size": 4096}))
    msg = _cli_error(runner, ["replay", str(bad)])
    assert "config.json" in msg and "not a Kineto trace" in msg
    not_json = tmp_path / "notes.json"
    not_json.write_text("hello, this is not JSON")
    with pytest.raises(MeshplanError, match="not a Kineto/Chrome trace JSON"):
        load_run(not_json)


def test_execution_trace_is_named_as_such(runner):
    et = data_path("traces", "hta_testdata", "execution_trace", "benchmark_simple_add_et.json.gz")
    msg = _cli_error(runner, ["replay", str(et)])
    assert "execution trace" in msg


def test_different_runs_mixed_by_time(tmp_path, runner):
    # DLRM ranks 0-2 (recorded 2023-09) + HTA trace_diff control (rank 3 of 8, recorded 2022-08): same world size,
    # distinct ranks, but their time windows are a year apart.
    _dlrm_files(tmp_path, {0, 1, 2})
    shutil.copy(data_path("traces", "hta_testdata", "trace_diff", "control", "control.json.gz"),
                tmp_path / "control.json.gz")
    msg = _cli_error(runner, ["replay", str(tmp_path)])
    assert "different runs mixed" in msg and "control.json.gz" in msg and "rank 3" in msg


def test_different_runs_mixed_by_world_size(tmp_path, runner):
    _dlrm_files(tmp_path, {0, 2})
    shutil.copy(data_path("traces", "hta_testdata", "trace_diff", "test", "test.json.gz"), tmp_path / "t.json.gz")
    msg = _cli_error(runner, ["replay", str(tmp_path)])
    assert "world size 2" in msg and "world size 8" in msg


def test_duplicated_rank(tmp_path, runner):
    f = _dlrm_files(tmp_path, {4})[4]
    shutil.copy(f, tmp_path / "copy_of_rank4.json")
    msg = _cli_error(runner, ["replay", str(tmp_path)])
    assert "rank 4 appears twice" in msg


def test_missing_rank_in_run_folder_is_an_error(tmp_path, runner):
    src = DATA / "profiler" / "gloo_ddp_2rank"
    for r in (0, 1):
        shutil.copy(src / f"rank{r}.trace.json.gz", tmp_path / f"rank{r}.trace.json.gz")
    (tmp_path / "run.json").write_text(json.dumps({
        "format": "meshplan-run/1", "world_size": 2, "backend": "gloo", "step_times_s": {"0": [], "1": []},
        "traces": {"0": "rank0.trace.json.gz", "1": "rank1.trace.json.gz"}}))
    assert sorted(load_run(tmp_path).ranks) == [0, 1]
    (tmp_path / "rank1.trace.json.gz").unlink()
    msg = _cli_error(runner, ["replay", str(tmp_path)])
    assert "run.json" in msg and "rank(s) [1]" in msg


def test_missing_rank_in_plain_folder_warns_and_replays(tmp_path):
    _dlrm_files(tmp_path, set(range(8)) - {5})
    a = analyze_run(tmp_path)
    rep = replay_report(a)
    assert any("partial run: rank(s) 0-4,6-7 of world size 8" in w for w in rep["warnings"])
    comm = [d for _, d in a.graph.nodes(data=True) if d["kind"] == "comm"]
    assert len(comm) == 7 * 8 and all(d["partial"] for d in comm)  # every collective lacks rank 5
    assert rep["steps"][0]["replayed_s"] > 0


def test_unmatched_collective_warns_and_replays(tmp_path, runner):
    files = _dlrm_files(tmp_path, set(range(8)))
    doc = json.loads(files[2].read_text())
    ev = doc["traceEvents"]
    last_ar = max(i for i, e in enumerate(ev) if e.get("cat") == "kernel" and "AllReduce" in e.get("name", ""))
    del ev[last_ar]
    files[2].write_text(json.dumps(doc))
    res = runner.invoke(app, ["replay", str(tmp_path), "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    hit = [w for w in rep["warnings"] if "no peer on rank(s) [2]" in w]
    assert len(hit) == 1 and "allreduce" in hit[0] and "measured duration" in hit[0]
    assert abs(rep["steps"][0]["error"]) < 0.05


def test_folder_with_only_execution_traces(tmp_path, runner):
    with gzip.open(data_path("traces", "hta_testdata", "execution_trace", "benchmark_simple_add_et.json.gz")) as fh:
        (tmp_path / "host_et.json").write_bytes(fh.read())
    msg = _cli_error(runner, ["replay", str(tmp_path)])
    assert "no Kineto trace found" in msg and "host_et.json" in msg
    res = runner.invoke(app, ["replay", str(tmp_path), "--summary", "--json"])
    assert res.exit_code == 0
    assert json.loads(res.output)["skipped"][0]["file"].endswith("host_et.json")
