"""Physical monotonicity of the step price over every priced dev-set row: what a price must do that no measurement
is needed to say.

Each row is planned as ``bench/dev_set.py --profile-only`` plans it (its layout pinned, its stack profile), then again
with the network between nodes at half and at twice its per-GPU bandwidth (``meshplan plan --net``) and with twice the
global batch. A faster network must never price the same layout slower, nor a slower one faster; twice the batch must
take at least the step and at most twice it (twice the micro-batches through the same kernels and links, the
pipeline fill, gradient exchange and optimizer step paid once either way). The table counts the rows that break
either and lists them; ``tests/test_monotone.py`` keeps four rows of the check in the default suite.

    python bench/monotone.py [RUNS_DIR] [--json]      (about two minutes on 2 cores)
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import dev_set  # noqa: E402

from meshplan.core.errors import MeshplanError  # noqa: E402
from meshplan.planner.cluster.spec import load_cluster  # noqa: E402
from meshplan.planner.search.job import PlanRequest, plan_job  # noqa: E402

NET_FACTORS = (0.5, 2.0)
TOLERANCE = 1e-9  # relative: a price equal to the base's holds


def _step_s(inp, out: Path, global_batch: int | None = None, net: str | None = None) -> float | None:
    try:
        res = plan_job(PlanRequest.of(inp.model, inp.cluster, global_batch or inp.global_batch, inp.seq_len,
                                      fix=inp.fix_string, stack=inp.profile, top=1, dtype=inp.dtype, name="monotone",
                                      lora=inp.lora, task=inp.task, net=net, out=out / "p.yaml"))
    except MeshplanError:
        return None
    return res.rows[0]["step_time_s"]


def check_row(inp, out: Path) -> dict | None:
    """The row's step at its own network and batch, at each ``NET_FACTORS`` network, and at twice the batch, with
    what breaks monotonicity; None when the row does not price."""
    base = _step_s(inp, out)
    if base is None:
        return None
    per_gpu = load_cluster(inp.cluster).inter_link.bandwidth_bytes_per_s
    net = {f: _step_s(inp, out, net=f"{per_gpu * f / 1e9:.6f}GB/s") for f in NET_FACTORS}
    double = _step_s(inp, out, global_batch=2 * inp.global_batch)
    broken = [f"network x{f}: {t:.3f} s" for f, t in net.items() if t is not None and (
        (f > 1 and t > base * (1 + TOLERANCE)) or (f < 1 and t < base * (1 - TOLERANCE)))]
    if double is not None and not base * (1 - TOLERANCE) <= double <= 2 * base * (1 + TOLERANCE):
        broken.append(f"batch x2: {double:.3f} s")
    return {"name": inp.name, "step_s": base, "net_s": {str(f): t for f, t in net.items()}, "batch_x2_s": double,
            "broken": broken}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs_dir", nargs="?", type=Path, default=dev_set.DEFAULT_RUNS)
    ap.add_argument("--json", action="store_true", help="print the records as JSON")
    args = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="meshplan-monotone-"))
    records = []
    for row in dev_set.load_rows(args.runs_dir):
        if not dev_set.in_scope(row):
            continue
        inp = dev_set.row_needs(row, args.runs_dir, True)
        if inp.out_of_scope or inp.missing:
            continue
        rec = check_row(inp, out)
        if rec is not None:
            records.append(rec)
    if args.json:
        print(json.dumps(records, indent=1))
        return
    ratios = [r["batch_x2_s"] / r["step_s"] for r in records if r["batch_x2_s"]]
    moved = sum(1 for r in records if r["net_s"]["0.5"] and r["net_s"]["0.5"] > r["step_s"] * (1 + TOLERANCE))
    table = Table(title="physical monotonicity of the step price (dev set, profile-only inputs)")
    for col in ("rows priced", "broken", "slower at half the network", "batch x2 / step: min, median, max"):
        table.add_column(col, overflow="fold")
    broken = [r for r in records if r["broken"]]
    table.add_row(str(len(records)), str(len(broken)), str(moved),
                  f"{min(ratios):.3f}, {statistics.median(ratios):.3f}, {max(ratios):.3f}" if ratios else "-")
    console = Console()
    console.print(table)
    for r in broken:
        console.print(f"{r['name']}: step {r['step_s']:.3f} s; " + "; ".join(r["broken"]))


if __name__ == "__main__":
    main()
