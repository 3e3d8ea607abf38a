"""Parallel ingestion (process pool, Ray), the Parquet cache, sampled ranks, and old/vendor trace vintages.

The vintage tests rewrite a real current trace into the 2021 category names (``Operator``, ``Runtime``,
``Kernel``, ``Memcpy``, ``Memset``, ``async`` flows, kernels on ``tid: "stream N"``; names from kineto's
tb_plugin ``EventTypeMap`` of 2021) or into MTIA's (``mtia_runtime``, ``mtia_ccp_events``): the loaded ops and the
replayed step must equal those of the original, an independent truth.
"""
from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

import pytest

from meshplan.profiler.ingest import run_tasks, task_for
from meshplan.profiler.report import analyze_run, replay_report
from meshplan.profiler.runs import load_run
from meshplan.profiler.summary import summarize_run
from tests.helpers import DATA, data_path

DLRM = ("traces", "param_dlrm_8rank", "dlrm_kineto.tar.gz")
_OLD = {"cpu_op": "Operator", "cuda_runtime": "Runtime", "kernel": "Kernel", "gpu_memcpy": "Memcpy",
        "gpu_memset": "Memset", "ac2g": "async"}
_MTIA = {"cuda_runtime": "mtia_runtime", "kernel": "mtia_ccp_events"}


def _signature(run) -> list:
    return [(r, t.counts_by_kind(), sorted(t.steps), sorted(e.coll or "" for e in t.events if e.kind == "comm"))
            for r, t in sorted(run.ranks.items())]


def _dlrm_rank0() -> dict:
    with tarfile.open(data_path(*DLRM)) as tf:
        m = next(m for m in tf.getmembers() if "worker0_" in m.name)
        return json.load(tf.extractfile(m))


def _rename(doc: dict, table: dict, stream_tid: bool) -> dict:
    out = dict(doc)
    evs = []
    for e in doc["traceEvents"]:
        e = dict(e)
        if e.get("cat") in table:
            e["cat"] = table[e["cat"]]
            if stream_tid and e["cat"] in ("Kernel", "Memcpy", "Memset"):
                e["tid"] = f"stream {e.get('args', {}).get('stream', e.get('tid'))}"
                e["args"] = {k: v for k, v in e.get("args", {}).items() if k != "stream"}
        if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("ProfilerStep#"):
            e["cat"] = table.get("cpu_op", "user_annotation")  # 2021: the step marker is an Operator
        evs.append(e)
    out["traceEvents"] = evs
    return out


@pytest.mark.parametrize("table,stream_tid", [(_OLD, True), (_MTIA, False)], ids=["2021", "mtia"])
def test_old_and_vendor_category_names_load_like_current_ones(tmp_path, table, stream_tid):
    doc = _dlrm_rank0()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "worker0.json").write_text(json.dumps(doc))
    (tmp_path / "b" / "worker0.json").write_text(json.dumps(_rename(doc, table, stream_tid)))
    ref, got = analyze_run(tmp_path / "a"), analyze_run(tmp_path / "b")
    assert _signature(got.run) == _signature(ref.run)
    assert got.timeline.steps == pytest.approx(ref.timeline.steps)
    used = {c for c, v in got.run.ranks[0].categories.items() if v["used"]}
    present = {e.get("cat") for e in doc["traceEvents"]}
    assert {v for k, v in table.items() if k in present and k != "ac2g"} <= used and "async" not in used


def test_parallel_and_cached_ingest_equal_serial(tmp_path):
    serial = load_run(data_path(*DLRM), workers=1)
    pooled = load_run(data_path(*DLRM), workers=2, cache_dir=tmp_path)
    assert _signature(pooled) == _signature(serial)
    assert len(list(tmp_path.glob("*.parquet"))) == 8
    res = run_tasks([task_for(f, str(f)) for f in sorted((DATA / "profiler" / "gloo_ddp_2rank").glob("*.gz"))],
                    cache_dir=tmp_path, workers=2, want="reductions")
    again = run_tasks([task_for(f, str(f)) for f in sorted((DATA / "profiler" / "gloo_ddp_2rank").glob("*.gz"))],
                      cache_dir=tmp_path, workers=1, want="reductions")
    assert not any(r.cached for r in res) and all(r.cached for r in again)
    assert [r.reductions for r in res] == [r.reductions for r in again]
    cached = load_run(data_path(*DLRM), workers=1, cache_dir=tmp_path)  # Parquet, no JSON parse
    assert _signature(cached) == _signature(serial)
    a, b = analyze_run(cached), analyze_run(load_run(data_path(*DLRM), workers=1))
    assert a.timeline.steps == pytest.approx(b.timeline.steps)


def test_summary_from_reductions_matches_loaded_counts(tmp_path):
    s = summarize_run(data_path(*DLRM), workers=2, cache_dir=tmp_path)
    run = load_run(data_path(*DLRM), workers=1)
    assert s["ranks"] == list(range(8)) and s["steps"] == [10]
    assert [r["ops"] for r in s["per_rank"]] == [t.counts_by_kind() for t in run.ranks.values()]


def test_damaged_cache_file_is_a_miss(tmp_path):
    load_run(GLOO := DATA / "profiler" / "gloo_ddp_2rank", workers=1, cache_dir=tmp_path)
    for p in tmp_path.glob("*.parquet"):
        p.write_bytes(b"not parquet")
    run = load_run(GLOO, workers=1, cache_dir=tmp_path)
    assert sorted(run.ranks) == [0, 1]


def test_sampled_ranks(runner, tmp_path):
    from meshplan.cli.main import app

    res = runner.invoke(app, ["replay", str(data_path(*DLRM)), "--ranks", "0-1,6,128-135", "--json", "--workers",
                              "1"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    assert rep["ranks"] == [0, 1, 6] and rep["world_size"] == 8
    assert rep["partial_collectives"] > 0
    assert any("sampled with --ranks 0-1,6,128-135" in w and "keep their measured durations" in w
               for w in rep["warnings"])
    assert any("128-135 asked for with --ranks are not in this run" in w for w in rep["warnings"])


# A local Ray instance starts its own GCS, raylet and workers: 5 s alone, 21-23 s beside another job on 2 cores (the
# suite's bound). It runs with -m slow; the default suite keeps the process-pool ingest it must equal
# (test_parallel_and_cached_ingest_equal_serial).
@pytest.mark.slow
def test_ray_local_instance(tmp_path):
    ray = pytest.importorskip("ray")
    try:
        files = sorted((DATA / "profiler" / "gloo_ddp_2rank").glob("*.gz"))
        res = run_tasks([task_for(f, str(f)) for f in files], ray="local", want="both")
        ref = run_tasks([task_for(f, str(f)) for f in files], workers=1, want="both")
        assert [r.reductions for r in res] == [r.reductions for r in ref]
    finally:
        ray.shutdown()


def test_held_out_prediction_is_separate_from_consistency():
    a = analyze_run(DATA / "profiler" / "gloo_ddp_2rank")
    rep = replay_report(a, fit_steps=2)
    p = rep["prediction"]
    assert p["available"] and p["fit_steps"] == [2, 3] and p["held_out_steps"] == [4, 5]
    assert [r["step"] for r in p["steps"]] == [4, 5] and p["unfitted_share"] < 0.05
    assert rep["consistency"]["median_abs_error"] == rep["median_error"]
    # a prediction from other steps is not the measured step replayed: it differs from the consistency replay
    cons = {r["step"]: r["replayed_s"] for r in rep["steps"]}
    assert any(abs(r["predicted_s"] - cons[r["step"]]) > 1e-9 for r in p["steps"])


def test_gzip_stream_members_of_archives_load(tmp_path):
    # a .tar.gz of gzip traces (archive of compressed members): both layers streamed
    tar = tmp_path / "run.tgz"
    with tarfile.open(tar, "w:gz") as tf:
        for f in sorted((DATA / "profiler" / "gloo_ddp_2rank").glob("*.gz")):
            data = gzip.decompress(f.read_bytes())
            info = tarfile.TarInfo(Path(f.name).stem)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    assert sorted(load_run(tar, workers=2).ranks) == [0, 1]
