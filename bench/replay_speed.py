"""Scale benchmark of the profiler core (issue 3, item 8). Not part of the test suite.

1. Replay speed: a synthetic data-parallel graph of ``--ranks`` ranks and >= ``--ops`` ops (per rank a host lane
   launching a compute kernel per layer, and a gradient all-reduce across all ranks every ``--bucket-every``
   layers) is built with :class:`profiler.graph.GraphBuilder`, compiled and replayed; ops/s = ops / replay time.
2. Ingest memory: a ``--trace-mb`` Kineto trace is made by repeating the real events of one rank of the 8-rank
   DLRM trace (``../shared/traces/param_dlrm_8rank``) with shifted timestamps and fresh ids, then parsed by
   :func:`profiler.trace.load_trace` in a fresh subprocess, whose peak RSS (``resource.getrusage``) is reported.

Usage: ``python bench/replay_speed.py [--ops 1000000] [--ranks 64] [--trace-mb 500] [--skip-ingest]``
"""
from __future__ import annotations

import argparse
import json
import os
import random
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

from meshplan.profiler.graph import GraphBuilder  # noqa: E402
from meshplan.profiler.replay import replay  # noqa: E402

SHARED = Path(os.environ.get("MESHPLAN_SHARED") or REPO.parent / "shared")
DLRM = SHARED / "traces" / "param_dlrm_8rank" / "dlrm_kineto.tar.gz"


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=1_000_000)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--trace-mb", type=float, default=500.0)
    ap.add_argument("--skip-ingest", action="store_true")
    args = ap.parse_args()
    con = Console(width=140)
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
