"""Set the cost model's Mamba-2 SSD forward price beside mamba_ssm's own Triton forward, timed by others
(``costmodel/data/published/ssd_forward_mamba_ssm.json``): 20 shapes on an H200 (tile-ai/TileOPs PR 1557) and 22 on
a B200 (flashinfer PR 2709's Triton reference, adapted from mamba_ssm v2.2.4).

Each row is priced as the planner prices a Mamba mixer's scan (``OpSpec("ssd", ...)``, forward) and split by where
one group's shared tensors live while the per-head kernels sweep it: ``C B^T`` (fp32, Q a token) and B, C (N each)
over the whole batch, against the part's L2. The chunk-state and chunk-scan kernels run one program per head (their
grids put the head outermost) and each reads its group's tiles; the share of them L2 does not hold comes again from
HBM for every head (``costmodel.ops.ssd_group_rereads``). The H200 rows' heads share one group, and past L2 (the
long-context and large-batch rows) their measured forward ran 1.3-1.9x the price of the group's tensors read once;
with the rereads priced every row from a quarter of a million token-heads up lands at 0.74-1.30 of its price.

    python bench/ssd_vs_costmodel.py [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def regime(heads: int, groups: int, shared_bytes: float, l2_bytes: float) -> str:
    """Where a group's shared tensors come from for its heads: nothing to share (a group per head), L2, or HBM."""
    if heads == groups:
        return "a group a head"
    return "shared, in L2" if shared_bytes <= l2_bytes else "shared, past L2"


def rows(pricer) -> list[dict]:
    from meshplan.costmodel.devices import catalogue
    from meshplan.costmodel.ops import OpSpec, ssd_group_tensor_bytes

    data = json.loads((ROOT / "costmodel/data/published/ssd_forward_mamba_ssm.json").read_text(encoding="utf-8"))
    out = []
    for s in data["sets"]:
        dev = catalogue()[s["device"]]
        for r in s["rows"]:
            op = OpSpec("ssd", (r["batch"], r["heads"], r["seq_len"], s["head_dim"], s["state"], s["groups"],
                                s["chunk"]), s["dtype"])
            priced_ms = pricer.predict(op, dev) * 1e3
            shared = ssd_group_tensor_bytes(op)
            out.append({"device": s["device"], "batch": r["batch"], "seq_len": r["seq_len"], "heads": r["heads"],
                        "groups": s["groups"], "token_heads_m": r["batch"] * r["seq_len"] * r["heads"] / 1e6,
                        "regime": regime(r["heads"], s["groups"], shared, dev.l2_bytes),
                        "measured_ms": r["latency_ms"], "priced_ms": priced_ms,
                        "measured_over_priced": r["latency_ms"] / priced_ms})
    return out


def summary(table: list[dict]) -> list[dict]:
    """Median measured / priced per part and regime, over the rows of at least 0.25 M token-heads (below that the
    launches, not the bytes, set the time)."""
    out = []
    for dev in sorted({r["device"] for r in table}):
        for reg in ("a group a head", "shared, in L2", "shared, past L2"):
            sel = [r["measured_over_priced"] for r in table
                   if r["device"] == dev and r["regime"] == reg and r["token_heads_m"] >= 0.25]
            if sel:
                out.append({"device": dev, "group tensors": reg, "rows": len(sel),
                            "median measured / priced": statistics.median(sel), "min": min(sel), "max": max(sel)})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the rows and the summary as JSON")
    args = ap.parse_args(argv)
    from rich.console import Console
    from rich.table import Table

    from meshplan.costmodel.api import Pricer

    table = rows(Pricer.shipped())
    summ = summary(table)
    if args.json:
        print(json.dumps({"rows": table, "summary": summ}, indent=1))
        return 0
    t = Table(title="SSD forward: mamba_ssm's Triton kernels measured vs meshplan's price")
    for col in ("part", "batch x seq", "heads/groups", "M token-heads", "group tensors", "measured ms", "priced ms",
                "meas / priced"):
        t.add_column(col, justify="right")
    for r in table:
        t.add_row(r["device"], f"{r['batch']} x {r['seq_len']}", f"{r['heads']}/{r['groups']}",
                  f"{r['token_heads_m']:.2f}", r["regime"], f"{r['measured_ms']:.4f}",
                  f"{r['priced_ms']:.4f}", f"{r['measured_over_priced']:.2f}")
    s = Table(title="median measured / priced, rows of at least 0.25 M token-heads")
    for col in ("part", "group tensors", "rows", "median", "min", "max"):
        s.add_column(col, justify="right")
    for r in summ:
        s.add_row(r["device"], r["group tensors"], str(r["rows"]), f"{r['median measured / priced']:.2f}",
                  f"{r['min']:.2f}", f"{r['max']:.2f}")
    console = Console()
    console.print(t)
    console.print(s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
