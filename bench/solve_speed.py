"""Speed of the CP-SAT solvers on real model/cluster problems.

Targets: partition + precision for 80 layers x 4 device groups x 4 precisions under 2 s; compression choice
for 300 buckets under 100 ms. Each row is the median of ``--repeats`` solves (problem building excluded and
reported apart). Rows whose solve stops on its time limit show status FEASIBLE with the proven bound.

Run: ``python bench/solve_speed.py [--repeats 3] [--workers N]``
"""
from __future__ import annotations

import argparse
import statistics
import time

from rich.console import Console
from rich.table import Table

from meshplan.planner.cluster.spec import load_cluster, parse_bandwidth
from meshplan.planner.model.config import load_model
from meshplan.planner.search.solve.compression import solve_compression_problem
from meshplan.planner.search.solve.partition import solve_partition
from meshplan.planner.search.solve.problems import compression_problem, serve_partition_problem, train_partition_problem


def _time(fn, repeats: int):
    walls, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        walls.append(time.perf_counter() - t0)
    return statistics.median(walls), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=None, help="CP-SAT workers (default: cores, at most 8)")
    args = ap.parse_args()
    rows = []
    llama70 = load_model("llama-3.1-70b-instruct")  # 80 decoder layers
    cases = [
        ("serve partition+precision", "2xH100+2xA100+2xL4+2xT4", 2.0),
        ("serve partition+precision", "1x8xH100+1x8xA100+2x4xL4+2x4xT4", 2.0),
    ]
    for name, spec, limit in cases:
        cluster = load_cluster(spec)
        t0 = time.perf_counter()
        pb = serve_partition_problem(llama70, cluster, batch=16, prompt_len=512, gen_len=128, quality_budget=1.0,
                                     micro_batches=(1, 2))
        build = time.perf_counter() - t0
        wall, sol = _time(lambda: solve_partition(pb, time_limit_s=limit, num_workers=args.workers), args.repeats)
        size = (f"{pb.num_layers} layers x {len(pb.groups)} groups x {len(pb.precisions)} precisions "
                f"({'/'.join(pb.precisions)}), {sum(g.max_stages for g in pb.groups)} stage units, "
                f"{len(pb.options)} micro-batch options")
        rows.append((name, spec, size, build, wall, sol.status))
    cluster = load_cluster("2x8xA100+4x4xL4")
    t0 = time.perf_counter()
    pb = train_partition_problem(llama70, cluster, 64, 4096, quality_budget=0.05)
    build = time.perf_counter() - t0
    wall, sol = _time(lambda: solve_partition(pb, time_limit_s=10.0, num_workers=args.workers), args.repeats)
    rows.append(("train partition+precision", "2x8xA100+4x4xL4", f"{pb.num_layers} layers x {len(pb.groups)} groups "
                 f"x {len(pb.precisions)} precisions, {len(pb.options)} options", build, wall, sol.status))
    llama8 = load_model("llama-3.1-8b-instruct")
    total = (llama8.num_params) * 4
    for net in ("25Gbps", "100Gbps"):
        for budget in (None, 0.01):
            t0 = time.perf_counter()
            cp = compression_problem(llama8, load_cluster("4x8xA100"), 256, 4096, error_budget=budget,
                                     bucket_bytes=-(-total // 300), net_bytes_per_s=parse_bandwidth(net))
            build = time.perf_counter() - t0
            wall, sol = _time(lambda: solve_compression_problem(cp, time_limit_s=10.0, num_workers=args.workers),
                              args.repeats)
            rows.append(("compression", f"4x8xA100 @ {net}", f"{len(cp.sizes_bytes)} buckets, error budget {budget}",
                         build, wall, sol.status))
    table = Table(title="meshplan CP-SAT solve speed (median of %d)" % args.repeats)
    for col in ("problem", "cluster", "size", "build s", "solve s", "status", "objective s", "bound s", "gap"):
        table.add_column(col)
    for name, spec, size, build, wall, st in rows:
        table.add_row(name, spec, size, f"{build:.3f}", f"{wall:.3f}", st.status, f"{st.objective:.6g}",
                      f"{st.best_bound:.6g}", f"{st.gap:.2%}")
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
