"""Full layout search speed: every decision free, DeepSeek-V3 and Llama-3.1-405B on 16384 H100.

Run: python bench/plan_speed.py   (prints a table; figures go to BENCHMARKS.md)
"""
from __future__ import annotations

import time

from rich.console import Console
from rich.table import Table

from meshplan.planner.cluster import load_cluster
from meshplan.planner.estimate import Workload
from meshplan.planner.model_spec import load_model
from meshplan.planner.search import describe, search

CASES = [  # model, cluster, global batch (sequences), seq len
    ("deepseek-v3", "2048x8xH100", 16384, 4096),
    ("llama-3.1-405b", "2048x8xH100", 2048, 8192),
]


def main() -> None:
    table = Table(title="meshplan plan: full search, all decisions free")
    for col in ("model", "cluster", "batch x seq", "evaluated", "feasible", "wall s", "best layout", "MFU"):
        table.add_column(col)
    for model, cluster, gb, seq in CASES:
        t0 = time.perf_counter()
        work = Workload(load_model(model), load_cluster(cluster), gb, seq)
        res = search(work, {}, top=1)
        wall = time.perf_counter() - t0
        lay, est = res.ranked[0]
        table.add_row(model, cluster, f"{gb} x {seq}", str(res.evaluated), str(res.feasible), f"{wall:.2f}",
                      describe(lay), f"{100 * est.mfu:.1f}%")
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
