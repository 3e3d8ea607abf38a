"""Predicted gain of the solvers' plans over simple baselines (issue 5, "Gain, shown side by side").

For each heterogeneous cluster and network speed (per-GPU inter-node bandwidth, ``--net``):

- partition + precision (training pipeline, or LLM-PQ serving) vs the even-partition uniform-16-bit plan
  (every stage unit used, layers split evenly, one precision) and vs the best all-16-bit plan (same solver,
  precision fixed), with the quality cost (summed indicator) of each;
- gradient compression (ByteComp) for data-parallel training of a model that fits every device, vs no
  compression (flat all-reduce of every bucket), with the compression error of the plan.

All numbers are predictions of meshplan's cost model (``costmodel.predict``) and formulas, not measurements.
Run: ``python bench/solve_gain.py [--time-limit 20]``
"""
from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from meshplan.core.errors import MeshplanError
from meshplan.planner.cluster.spec import load_cluster, parse_bandwidth
from meshplan.planner.model.config import load_model
from meshplan.planner.search.solve.compression import solve_compression
from meshplan.planner.search.solve.precision import solve_hetero_train, solve_serve

CASES = [
    # cluster, workload, model, args, quality budget
    ("2x8xA100+4x4xL4", "train", "llama-3.1-70b-instruct", dict(global_batch=64, seq_len=4096), 0.05),
    ("1x8xH100+2x8xA100", "train", "llama-3.1-70b-instruct", dict(global_batch=64, seq_len=4096), 0.05),
    ("4xT4+1xA100", "serve", "qwen2.5-7b", dict(batch=16, prompt_len=512, gen_len=128), 0.2),
]
NETS = ("10Gbps", "25Gbps", "100Gbps")
DP_MODEL = "gpt2-large"  # fits every device as a data-parallel replica (0.77B params x 16 B = 12.4 GB)


def _fmt(tps_q) -> str:
    tps, q = tps_q
    return "does not fit" if tps <= 0 else f"{tps:,.0f} (q {q:.3g})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=20.0)
    args = ap.parse_args()
    table = Table(title="Predicted tokens/s (quality cost q = summed indicator; e = compression error)")
    for col in ("cluster", "net", "workload", "solver plan", "even uniform 16-bit", "best all-16-bit",
                "gain vs even", "gain vs all-16", "DP compression plan", "no compression", "gain"):
        table.add_column(col)
    dp_model = load_model(DP_MODEL)
    for spec, workload, model_name, kw, budget in CASES:
        model = load_model(model_name)
        for net in NETS:
            cluster = load_cluster(spec).with_inter_bandwidth(parse_bandwidth(net))
            try:
                if workload == "train":
                    res = solve_hetero_train(model, cluster, quality_budget=budget, strategy="pipeline",
                                             time_limit_s=args.time_limit, **kw)
                else:
                    res = solve_serve(model, cluster, quality_budget=budget, time_limit_s=args.time_limit, **kw)
            except MeshplanError as exc:
                table.add_row(spec, net, workload, f"error: {exc}", "", "", "", "", "", "", "")
                continue
            (even_name, even), (all_name, all16) = list(res.baselines.items())[:2]
            tag = "" if res.status.status == "OPTIMAL" else f" [{res.status.status}, bound gap {res.status.gap:.1%}]"
            world = cluster.world_size
            comp = solve_compression(dp_model, cluster, 2 * world, 1024, error_budget=0.01,
                                     time_limit_s=args.time_limit)
            ctag = "" if comp.solution.status.status == "OPTIMAL" else f" [{comp.solution.status.status}]"
            table.add_row(
                spec, net, f"{workload} {model_name}", f"{res.tokens_per_s:,.0f} (q {res.quality:.3g}){tag}",
                _fmt(even), _fmt(all16),
                f"{res.tokens_per_s / even[0]:.2f}x" if even[0] > 0 else "-",
                f"{res.tokens_per_s / all16[0]:.2f}x" if all16[0] > 0 else "-",
                f"{comp.tokens_per_s:,.0f} (e {comp.solution.error:.3g}){ctag}", f"{comp.baseline_tokens_per_s:,.0f}",
                f"{comp.tokens_per_s / comp.baseline_tokens_per_s:.2f}x")
    Console(width=240).print(table)


if __name__ == "__main__":
    main()
