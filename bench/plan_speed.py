"""Full layout search speed on the benchmark corpus: every decision free, one process per run.

Run: python bench/plan_speed.py [--repeat N] [--exhaustive] [--case NAME] [--json FILE]
(prints a table; figures go to BENCHMARKS.md, "Planner: search speed")

Each run is a fresh process (cold caches, as ``meshplan plan`` is), timed from loading the model to the ranked
top 10: model + cluster + estimator + search. Its peak memory is the process's maximum resident set
(``resource.getrusage``), imports included. ``--exhaustive`` also prices every candidate (``search(prune=False)``,
minutes for the MoE cases) and says whether the best plan and the top 10 (layouts and step times) agree.
``BEFORE`` holds the same cases measured on the commit this speed-up started from (same host, same harness).
"""
from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout, not an installed meshplan

CASES = [  # name, model, cluster, global batch (sequences), seq len, dtype
    ("405b", "llama-3.1-405b", "2048x8xH100", 2048, 8192, "bf16"),
    ("dsv3-16k", "deepseek-v3", "2048x8xH100", 16384, 4096, "bf16"),
    ("dsv3-8k", "deepseek-v3", "2048x8xH100", 2048, 8192, "bf16"),
    ("kimi-k2", "kimi-k2", "2048x8xH100", 4096, 4096, "bf16"),
    ("qwen3-30b", "qwen3-30b-a3b", "16x8xH100", 1024, 4096, "bf16"),
    ("qwen3-235b", "qwen3-235b-a22b", "32x8xH100", 1024, 4096, "bf16"),
    ("70b-128k", "llama-3.1-70b", "8x8xH100", 64, 131072, "bf16"),
    # eight NVL72 racks (576 GB200): the batch carries the 9 of 576 = 64 x 9; in fp8 with the recipe free, three
    # recipes per layout (tensor-wise, delayed, MXFP8)
    ("dsv3-nvl72", "deepseek-v3", "144x4xGB200-NVL72", 4608, 4096, "bf16"),
    ("dsv3-nvl72-fp8", "deepseek-v3", "144x4xGB200-NVL72", 4608, 4096, "fp8"),
]

# Wall s (median of 3 fresh processes), layouts priced and peak RSS MiB on the commit before the speed-up
# (8164e85, 2026-11-26, this 2-core host at load average 19-26: other sessions' jobs; BENCHMARKS.md), same harness:
# the ratio column divides these by today's, meaningful only under a like load.
BEFORE: dict[str, tuple[float, int, float]] = {
    "405b": (13.12, 5731, 109),
    "dsv3-16k": (49.93, 23720, 167),
    "dsv3-8k": (246.51, 280670, 413),
    "kimi-k2": (235.97, 236025, 363),
    "qwen3-30b": (97.78, 47586, 314),
    "qwen3-235b": (31.31, 16275, 161),
    "70b-128k": (27.53, 15916, 130),
}


def run_one(name: str, exhaustive: bool) -> dict:
    """One case in this process: the timed search, its figures and its top 10 rows."""
    from meshplan.planner.cluster.spec import load_cluster
    from meshplan.planner.estimate.base import Workload
    from meshplan.planner.model.config import load_model
    from meshplan.planner.search.exact import layout_row, search

    _, model, cluster, gb, seq, dtype = next(c for c in CASES if c[0] == name)
    t0 = time.perf_counter()
    work = Workload(load_model(model), load_cluster(cluster), gb, seq, dtype)
    res = search(work, {}, top=10)
    wall = time.perf_counter() - t0
    out = {"wall_s": wall, "candidates": res.candidates, "priced": res.evaluated, "bound_evals": res.bound_evals,
           "timed": res.timed, "unfit": res.unfit,
           "feasible": res.feasible, "fallback": res.fallback, "pruned": res.pruned,
           "rows": [layout_row(lay, est) for lay, est in res.ranked]}
    if exhaustive:
        full = search(work, {}, top=10, prune=False)
        out["exhaustive_same"] = ([(lay, e.step_time_s) for lay, e in full.ranked]
                                  == [(lay, e.step_time_s) for lay, e in res.ranked])
        out["exhaustive_priced"] = full.evaluated
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def main(argv: list[str]) -> None:
    if "--one" in argv:
        print(json.dumps(run_one(argv[argv.index("--one") + 1], "--exhaustive" in argv)))
        return
    from rich.console import Console
    from rich.table import Table

    repeat = int(argv[argv.index("--repeat") + 1]) if "--repeat" in argv else 1
    only = argv[argv.index("--case") + 1].split(",") if "--case" in argv else [c[0] for c in CASES]
    table = Table(title="meshplan plan: full search, all decisions free, top 10 (wall s: model + cluster + "
                  "estimator + search, fresh process; median of --repeat runs)")
    for col in ("case", "model", "cluster", "batch x seq x dtype", "layouts in space", "priced", "pruned", "feasible",
                "wall s (runs)", "before s", "ratio", "peak MiB", "best layout", "MFU"):
        table.add_column(col, overflow="fold")
    record = {}
    for name, model, cluster, gb, seq, dtype in CASES:
        if name not in only:
            continue
        runs = []
        for i in range(repeat):
            cmd = [sys.executable, __file__, "--one", name] + (["--exhaustive"] if "--exhaustive" in argv and i == 0
                                                               else [])
            runs.append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout))
        r, walls = runs[0], [x["wall_s"] for x in runs]
        wall = statistics.median(walls)
        record[name] = {**{k: v for k, v in r.items() if k != "wall_s"}, "walls_s": walls, "wall_s": wall,
                        "peak_rss_mib": max(x["peak_rss_mib"] for x in runs)}
        if r["fallback"]:
            print(f"{name}: the pruned search fell back to pricing everything: {r['fallback']}")
        if "exhaustive_same" in r:
            print(f"{name}: exhaustive priced {r['exhaustive_priced']:,}; best plan and top 10 "
                  f"{'identical' if r['exhaustive_same'] else 'DIFFER'}")
        before = BEFORE.get(name)
        best = r["rows"][0]
        table.add_row(name, model, cluster, f"{gb} x {seq} x {dtype}", f"{r['candidates']:,}", f"{r['priced']:,}",
                      f"{r['candidates'] - r['priced']:,}", f"{r['feasible']:,}",
                      f"{wall:.3f} ({', '.join(f'{w:.3f}' for w in walls)})",
                      f"{before[0]:.2f}" if before else "-", f"{before[0] / wall:.1f}x" if before else "-",
                      f"{record[name]['peak_rss_mib']:.0f}", best["layout"], f"{100 * best['mfu']:.1f}%")
    Console(width=250).print(table)
    if "--json" in argv:
        Path(argv[argv.index("--json") + 1]).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
