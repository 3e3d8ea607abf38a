"""Full layout search speed: every decision free, DeepSeek-V3 and Llama-3.1-405B on 16384 H100.

Run: python bench/plan_speed.py [--repeat N] [--exhaustive]   (prints a table; figures go to BENCHMARKS.md)

``--exhaustive`` also prices every candidate (``search(prune=False)``, about a minute for DeepSeek-V3) and says
whether the top 10 agree.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, not an installed meshplan

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from meshplan.planner.cluster.spec import load_cluster  # noqa: E402
from meshplan.planner.estimate.base import Workload  # noqa: E402
from meshplan.planner.model.config import load_model  # noqa: E402
from meshplan.planner.search.exact import describe, search  # noqa: E402

CASES = [  # model, cluster, global batch (sequences), seq len
    ("deepseek-v3", "2048x8xH100", 16384, 4096),
    ("llama-3.1-405b", "2048x8xH100", 2048, 8192),
]


def main(argv: list[str]) -> None:
    repeat = int(argv[argv.index("--repeat") + 1]) if "--repeat" in argv else 1
    table = Table(title="meshplan plan: full search, all decisions free (wall s: model + cluster + estimator + "
                  "search; with --repeat N the median of N)")
    for col in ("model", "cluster", "batch x seq", "candidates", "priced (+bound)", "feasible", "wall s",
                "best layout", "MFU"):
        table.add_column(col)
    for model, cluster, gb, seq in CASES:
        walls = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            work = Workload(load_model(model), load_cluster(cluster), gb, seq)
            res = search(work, {}, top=1)
            walls.append(time.perf_counter() - t0)
        if res.fallback:
            print(f"{model}: the pruned search fell back to pricing everything: {res.fallback}")
        lay, est = res.ranked[0]
        wall = f"{statistics.median(walls):.2f}" + (f" ({', '.join(f'{w:.2f}' for w in walls)})" if repeat > 1 else "")
        table.add_row(model, cluster, f"{gb} x {seq}", f"{res.candidates:,}",
                      f"{res.evaluated:,} (+{res.bound_evals:,})", f"{res.feasible:,}", wall, describe(lay),
                      f"{100 * est.mfu:.1f}%")
        if "--exhaustive" in argv:
            t0 = time.perf_counter()
            full = search(Workload(load_model(model), load_cluster(cluster), gb, seq), {}, top=10, prune=False)
            fast = search(work, {}, top=10)
            same = [(l, e.step_time_s) for l, e in full.ranked] == [(l, e.step_time_s) for l, e in fast.ranked]
            print(f"{model}: exhaustive {full.evaluated:,} priced in {time.perf_counter() - t0:.1f} s; top 10 "
                  f"{'identical' if same else 'DIFFER'}")
    Console(width=220).print(table)


if __name__ == "__main__":
    main(sys.argv[1:])
