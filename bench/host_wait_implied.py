"""The MoE host wait meshplan prices on the dev set's Megatron-Bridge rows, beside the wait each row's published step
leaves room for.

For every priced B1 row whose MoE layers wait for the host at their token-count sync
(``planner.estimate.host_wait``), the slowest stage's priced wait is divided over the layer forwards that pay it (the
stage's layers times the step's micro-batches), and set beside the *implied* wait: the priced one less the row's
error in seconds, i.e. what the wait would be were everything else priced right. Implied over priced near 1 says the
host figures hold for that row; near 0, that the row ran as if it never waited; above 1, that something else is
under-priced too. Rows are grouped by whether the job is pipelined and by its host (Grace on GB200 / GB300 trays, x86
on B200 / B300 nodes). Nothing here is fitted or fed back: it is the table the dev set's host-wait residuals are read
from.

    python bench/host_wait_implied.py [--match qwen3] [--json]

(about a minute: each row is planned again with its breakdown, with the stack profile alone, as
``bench/dev_set.py --profile-only`` prices it).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import dev_set  # noqa: E402

WAIT_KEY = "host wait after the MoE token-count sync"  # the slowest stage's exposed-comm entry (explain_gpu)


def implied(record: dict) -> dict:
    """``record`` (published and predicted step seconds, the priced wait's seconds and the layer forwards paying
    it) with the priced and the implied wait per layer forward, milliseconds, and their ratio."""
    forwards = record["layer_forwards"]
    error_s = record["predicted_step_s"] - record["published_step_s"]
    priced_ms = 1e3 * record["wait_s"] / forwards
    implied_ms = 1e3 * (record["wait_s"] - error_s) / forwards
    return {**record, "priced_ms": priced_ms, "implied_ms": implied_ms, "implied_over_priced": implied_ms / priced_ms}


def summary(records: list[dict]) -> list[dict]:
    """Per (pipelined, host): the rows, and the medians of the priced and implied waits (ms) and of their ratio."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        groups[(r["pp"] > 1, r["host"])].append(r)
    return [{"pipelined": pipelined, "host": host, "rows": len(rs),
             "median_priced_ms": statistics.median(r["priced_ms"] for r in rs),
             "median_implied_ms": statistics.median(r["implied_ms"] for r in rs),
             "median_implied_over_priced": statistics.median(r["implied_over_priced"] for r in rs)}
            for (pipelined, host), rs in sorted(groups.items())]


def priced_rows(runs_dir: Path, match: str = "") -> list[dict]:
    """Every priced B1 row (profile-only inputs) whose name holds ``match`` and whose MoE layers wait for the host."""
    from meshplan.planner.cluster.spec import load_cluster
    from meshplan.planner.search.job import PlanRequest, plan_job

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for row in dev_set.load_rows(runs_dir):
            if row.get("source_id") != "B1" or match not in row["name"]:
                continue
            inp = dev_set.row_needs(row, runs_dir, True)
            if not inp.moe or inp.out_of_scope:
                continue
            try:
                done = plan_job(PlanRequest.of(inp.model, inp.cluster, inp.global_batch, inp.seq_len,
                                               fix=inp.fix_string, stack=inp.profile, top=1, dtype=inp.dtype,
                                               name="hostwait", lora=inp.lora, task=inp.task, breakdown=True,
                                               out=Path(tmp) / "p.yaml"))
            except dev_set.MeshplanError:
                continue  # refused (out of memory, a mesh rule): the dev set reports those
            stage = done.breakdown["stages"][done.breakdown["slowest_stage"]]
            wait_s = stage["exposed_comm_s"].get(WAIT_KEY, 0.0)
            if wait_s <= 0:
                continue
            fix = dict(kv.split("=", 1) for kv in inp.fix_string.split(","))
            micro = inp.global_batch // (int(fix["dp"]) * int(fix["mbs"]))
            device = load_cluster(inp.cluster).device
            out.append(implied({"name": inp.name, "published_step_s": inp.published_step_s,
                                "predicted_step_s": done.rows[0]["step_time_s"], "wait_s": wait_s,
                                "layer_forwards": stage["layers"] * micro, "pp": int(fix["pp"]),
                                "cuda_graphs": inp.cuda_graphs, "host": device.host_cpu}))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--match", default="", help="only rows whose name holds this text")
    parser.add_argument("--json", action="store_true", help="print the rows and the summary as JSON")
    args = parser.parse_args()
    records = priced_rows(dev_set.DEFAULT_RUNS, args.match)
    if args.json:
        print(json.dumps({"rows": records, "summary": summary(records)}, indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="MoE host wait per layer forward, priced and implied by the published step (ms)")
    for col in ("row", "pp", "host", "CUDA graphs", "priced", "implied", "implied / priced"):
        table.add_column(col, overflow="fold", justify="left" if col in ("row", "host", "CUDA graphs") else "right")
    for r in records:
        table.add_row(r["name"], str(r["pp"]), r["host"], r["cuda_graphs"] or "-", f"{r['priced_ms']:.2f}",
                      f"{r['implied_ms']:+.2f}", f"{r['implied_over_priced']:+.2f}")
    Console().print(table)
    totals = Table(title="by pipelining and host: medians")
    for col in ("pipelined", "host", "rows", "priced", "implied", "implied / priced"):
        totals.add_column(col, justify="right")
    for s in summary(records):
        totals.add_row(str(s["pipelined"]), s["host"], str(s["rows"]), f"{s['median_priced_ms']:.2f}",
                       f"{s['median_implied_ms']:+.2f}", f"{s['median_implied_over_priced']:+.2f}")
    Console().print(totals)


if __name__ == "__main__":
    main()
