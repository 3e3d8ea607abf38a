"""Scale benchmark of the profiler core (issue 3, item 8). Not part of the test suite.

1. Replay speed: a synthetic data-parallel graph of ``--ranks`` ranks and >= ``--ops`` ops (per rank a host lane
   launching a compute kernel per layer, and a gradient all-reduce across all ranks every ``--bucket-every``
   layers) is built with :class:`profiler.dataflow_graph.GraphBuilder`, compiled and replayed; ops/s = ops / replay
   time.
2. Ingest memory: a ``--trace-mb`` Kineto trace is made by repeating the real events of one rank of the 8-rank
   DLRM trace (``data/traces/param_dlrm_8rank``) with shifted timestamps and fresh ids, then parsed by
   :func:`profiler.trace.load_trace` in a fresh subprocess, whose peak RSS (``resource.getrusage``) is reported.

3. Scale (issue 14, item 4): a synthetic job of ``--job-ranks`` (>= 256) ranks made from the 8 real DLRM rank
   traces, rank r a copy of rank r mod 8 with its own rank, world size and a shifted clock (r x 37 µs), written
   as plain JSON. Reported: ingest MB/s per worker (JSON parse + columnar table + per-rank reductions, no cache),
   the speed-up from 1 to 2 workers, a cached re-analysis (the same summary read from the Parquet cache) against
   the first one, each worker's peak RSS against a fresh process parsing the largest single trace, and the
   projected time for 1,024 ranks x 500 MB on N workers (measured MB/s per worker x N x the measured parallel
   efficiency).

Usage: ``python bench/replay_speed.py [--ops 1000000] [--ranks 64] [--trace-mb 500] [--skip-ingest]
[--job-ranks 256] [--skip-scale]``
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from meshplan.profiler.dataflow_graph import GraphBuilder  # noqa: E402
from meshplan.profiler.replay import replay  # noqa: E402

DLRM = REPO / "data" / "traces" / "param_dlrm_8rank" / "dlrm_kineto.tar.gz"


def synthetic_graph(ranks: int, ops: int, bucket_every: int = 10, seed: int = 0) -> GraphBuilder:
    """Data-parallel step: per layer a host launch + a compute kernel; an all-reduce every ``bucket_every``."""
    rng = random.Random(seed)
    per_layer = 2 + 1 / bucket_every
    layers = int(ops / ranks / per_layer) + 1
    b = GraphBuilder()
    for r in range(ranks):
        last = None
        for layer in range(layers):
            h = b.add_op(r, "thread:main", "host", "launch", rng.uniform(5e-6, 15e-6))
            last = b.add_op(r, "stream:compute", "compute", f"gemm{layer % 7}", rng.uniform(20e-6, 200e-6),
                            deps=[h], dep_type="launch")
            if layer % bucket_every == bucket_every - 1:
                b.add_op(r, "stream:comm", "comm", "allreduce", 300e-6, deps=[last], coll=f"ar{layer}",
                         coll_type="allreduce", nbytes=25e6)
    return b


def bench_replay(ranks: int, ops: int) -> dict:
    t0 = time.perf_counter()
    b = synthetic_graph(ranks, ops)
    t1 = time.perf_counter()
    cg = b.compile()
    t2 = time.perf_counter()
    tl = replay(cg)
    t3 = time.perf_counter()
    return {"ranks": ranks, "ops": cg.n, "edges": len(cg.succ_idx), "build_s": t1 - t0, "compile_s": t2 - t1,
            "replay_s": t3 - t2, "ops_per_s": cg.n / (t3 - t2), "step_s": tl.steps[0]}


def make_big_trace(dest: Path, target_mb: float) -> tuple[int, int]:
    """Write a Kineto JSON of about ``target_mb`` MB by repeating one DLRM rank's events. Returns (bytes, events)."""
    with tarfile.open(DLRM) as tf:
        member = next(m for m in tf.getmembers() if "worker0_" in m.name)
        doc = json.load(tf.extractfile(member))
    events = doc.pop("traceEvents")
    span = max(e.get("ts", 0) + e.get("dur", 0) for e in events) - min(e["ts"] for e in events if "ts" in e)
    n_events = 0
    with open(dest, "w", encoding="utf-8") as fh:
        head = json.dumps(doc)[:-1]
        fh.write(head + ', "traceEvents": [\n')
        first = True
        rep = 0
        while fh.tell() < target_mb * 1e6:
            shift = rep * (span + 1000)
            id_shift = rep * 10_000_000
            for e in events:
                e2 = dict(e)
                if "ts" in e2:
                    e2["ts"] = e2["ts"] + shift
                if isinstance(e2.get("id"), int):
                    e2["id"] += id_shift
                if e2.get("name", "").startswith("ProfilerStep#"):
                    e2["name"] = f"ProfilerStep#{10 + rep}"
                args = e2.get("args")
                if isinstance(args, dict) and ("correlation" in args or "External id" in args):
                    args = dict(args)
                    for k in ("correlation", "External id"):
                        if isinstance(args.get(k), int):
                            args[k] += id_shift
                    e2["args"] = args
                fh.write(("" if first else ",\n") + json.dumps(e2))
                first = False
                n_events += 1
            rep += 1
        fh.write("\n]}\n")
    return dest.stat().st_size, n_events


_CHILD = """
import resource, sys, time
sys.path.insert(0, {repo!r})
from meshplan.profiler.trace import load_trace
t = time.perf_counter()
tr = load_trace({path!r})
dt = time.perf_counter() - t
print(len(tr.events), len(tr.steps), dt, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def bench_ingest(target_mb: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="meshplan-bench-") as tmp:
        path = Path(tmp) / "rank0.big.trace.json"
        size, n = make_big_trace(path, target_mb)
        out = subprocess.run([sys.executable, "-c", _CHILD.format(repo=str(REPO), path=str(path))],
                             capture_output=True, text=True, check=True).stdout.split()
    kept, steps, secs, rss_kb = int(out[0]), int(out[1]), float(out[2]), int(out[3])
    return {"file_mb": size / 1e6, "events_in_file": n, "events_kept": kept, "steps": steps, "ingest_s": secs,
            "events_per_s": n / secs, "peak_rss_gb": rss_kb * 1024 / 1e9}


def make_job(dest: Path, ranks: int) -> tuple[int, int]:
    """Write ``ranks`` rank traces (``rank{r}.json``) from the 8 DLRM ranks. Returns (total bytes, largest bytes)."""
    with tarfile.open(DLRM) as tf:
        docs = {}
        for m in tf.getmembers():
            if m.isfile() and "worker" in m.name:
                r = int(m.name.split("worker")[1].split("_")[0])
                docs[r] = json.load(tf.extractfile(m))
    total = largest = 0
    for r in range(ranks):
        doc = dict(docs[r % 8])
        doc["distributedInfo"] = {"backend": "nccl", "rank": r, "world_size": ranks}
        shift = r * 37  # µs: every rank its own clock offset
        doc["traceEvents"] = [dict(e, ts=e["ts"] + shift) if "ts" in e else e for e in docs[r % 8]["traceEvents"]]
        p = dest / f"rank{r}.json"
        p.write_text(json.dumps(doc))
        size = p.stat().st_size
        total += size
        largest = max(largest, size)
    return total, largest


_SINGLE = """
import resource, sys
sys.path.insert(0, {repo!r})
from meshplan.profiler.ingest import ingest_one, task_for
from pathlib import Path
ingest_one(task_for(Path({path!r}), "largest"), None, None, "reductions")  # what a worker does per file
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def bench_scale(ranks: int, repeats: int = 1) -> dict:
    from meshplan.profiler.ingest import run_tasks, task_for

    with tempfile.TemporaryDirectory(prefix="meshplan-job-") as tmp:
        root = Path(tmp) / "job"
        root.mkdir()
        total, largest = make_job(root, ranks)
        tasks = [task_for(root / f"rank{r}.json", f"rank{r}.json") for r in range(ranks)]
        out: dict = {"ranks": ranks, "job_mb": total / 1e6, "largest_mb": largest / 1e6}
        times: dict[int, list[float]] = {1: [], 2: []}
        for _ in range(repeats):  # 1 and 2 workers alternated, so a change of load hits both alike
            for w in (1, 2):
                t0 = time.perf_counter()
                res = run_tasks(tasks, workers=w, want="reductions")
                times[w].append(time.perf_counter() - t0)
                out[f"peak_rss_worker_mb_{w}"] = max(r.peak_rss_bytes for r in res) / 1e6
        for w in (1, 2):
            dt = statistics.median(times[w])
            out[f"ingest_s_{w}"] = dt
            out[f"ingest_runs_s_{w}"] = [round(x, 2) for x in times[w]]
            out[f"mb_s_per_worker_{w}"] = total / 1e6 / dt / w
        out["speedup_1_to_2"] = out["ingest_s_1"] / out["ingest_s_2"]
        cache = Path(tmp) / "cache"
        t0 = time.perf_counter()
        run_tasks(tasks, workers=2, want="reductions", cache_dir=cache)
        out["first_analysis_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        res = run_tasks(tasks, workers=2, want="reductions", cache_dir=cache)
        out["cached_analysis_s"] = time.perf_counter() - t0
        assert all(r.cached for r in res)
        out["cached_speedup"] = out["first_analysis_s"] / out["cached_analysis_s"]
        big = max(root.glob("rank*.json"), key=lambda p: p.stat().st_size)
        kb = subprocess.run([sys.executable, "-c", _SINGLE.format(repo=str(REPO), path=str(big))],
                            capture_output=True, text=True, check=True).stdout.split()[-1]
        out["single_trace_rss_mb"] = int(kb) * 1024 / 1e6
    return out


def projection(mb_s_per_worker: float, efficiency: float, workers: int, ranks: int = 1024,
               mb_per_rank: float = 500.0) -> float:
    """Hours to ingest ``ranks`` x ``mb_per_rank`` on ``workers`` workers at the measured rate and efficiency."""
    return ranks * mb_per_rank / (mb_s_per_worker * workers * efficiency) / 3600


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=1_000_000)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--trace-mb", type=float, default=500.0)
    ap.add_argument("--skip-ingest", action="store_true")
    ap.add_argument("--job-ranks", type=int, default=256)
    ap.add_argument("--skip-scale", action="store_true")
    ap.add_argument("--repeats", type=int, default=1, help="scale: 1- and 2-worker runs each (medians)")
    ap.add_argument("--skip-replay", action="store_true")
    args = ap.parse_args()
    con = Console(width=140)
    if not args.skip_scale:
        sc = bench_scale(args.job_ranks, args.repeats)
        t = Table(title=f"scale: {sc['ranks']} ranks from the 8 real DLRM traces ({sc['job_mb']:.0f} MB JSON, largest "
                        f"{sc['largest_mb']:.2f} MB)")
        for c in ("measure", "value"):
            t.add_column(c, justify="left" if c == "measure" else "right")
        eff = sc["speedup_1_to_2"] / 2
        rows = [("ingest, 1 worker (s)", f"{sc['ingest_s_1']:.1f}"), ("ingest, 2 workers (s)",
                                                                      f"{sc['ingest_s_2']:.1f}"),
                ("MB/s per worker (1 worker)", f"{sc['mb_s_per_worker_1']:.1f}"),
                ("MB/s per worker (2 workers)", f"{sc['mb_s_per_worker_2']:.1f}"),
                ("speed-up 1 -> 2 workers", f"{sc['speedup_1_to_2']:.2f}x"),
                ("first analysis, 2 workers, writing the cache (s)", f"{sc['first_analysis_s']:.1f}"),
                ("cached re-analysis, 2 workers (s)", f"{sc['cached_analysis_s']:.2f}"),
                ("cached re-analysis speed-up", f"{sc['cached_speedup']:.1f}x"),
                ("peak RSS per worker, 2 workers (MB)", f"{sc['peak_rss_worker_mb_2']:.0f}"),
                ("peak RSS, fresh process parsing the largest trace (MB)", f"{sc['single_trace_rss_mb']:.0f}")]
        for n in (1, 2, 16, 64, 256):
            rows.append((f"projected 1,024 ranks x 500 MB on {n} workers (h)",
                         f"{projection(sc['mb_s_per_worker_1'], eff if n > 1 else 1.0, n):.2f}"))
        for a, b in rows:
            t.add_row(a, b)
        con.print(t)
        print(json.dumps(sc))
    if args.skip_replay:
        return
    r = bench_replay(args.ranks, args.ops)
    t = Table(title="replay speed (synthetic data-parallel graph)")
    for c in ("ranks", "ops", "edges", "build s", "compile s", "replay s", "ops/s (replay)", "step ms"):
        t.add_column(c, justify="right")
    t.add_row(str(r["ranks"]), f"{r['ops']:,}", f"{r['edges']:,}", f"{r['build_s']:.2f}", f"{r['compile_s']:.2f}",
              f"{r['replay_s']:.2f}", f"{r['ops_per_s']:,.0f}", f"{r['step_s'] * 1e3:.2f}")
    con.print(t)
    if not args.skip_ingest:
        if not DLRM.exists():
            con.print(f"[yellow]ingest skipped: {DLRM} not found[/yellow]")
            return
        i = bench_ingest(args.trace_mb)
        t = Table(title="trace ingest (streamed; repeated real DLRM events)")
        for c in ("file MB", "events", "kept", "steps", "ingest s", "events/s", "peak RSS GB"):
            t.add_column(c, justify="right")
        t.add_row(f"{i['file_mb']:.0f}", f"{i['events_in_file']:,}", f"{i['events_kept']:,}", str(i["steps"]),
                  f"{i['ingest_s']:.1f}", f"{i['events_per_s']:,.0f}", f"{i['peak_rss_gb']:.2f}")
        con.print(t)


if __name__ == "__main__":
    main()
