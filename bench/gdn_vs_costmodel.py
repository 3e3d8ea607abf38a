"""Set the cost model's Gated DeltaNet price beside FLA's own timings of ``chunk_gated_delta_rule`` on a GB200
(``costmodel/data/published/fla_chunk_gdn_gb200.json``: six shapes, forward and forward+backward, beside
FlashAttention-2 at the same shapes).

For each shape: the measured time, the fit over all six (``costmodel.gdn``: a per-call constant plus GPU seconds per
forward FLOP), the same fit over the other five (leave one shape out), and meshplan's price, which is the fit's GPU
work alone (the constant is read as FLA's Python launching its kernels, not priced). ``measured - price`` is what a
step pays on top where its host cannot run ahead of these kernels.

    python bench/gdn_vs_costmodel.py [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

COLUMNS = (("fwd", "chunk_gdn_fwd_ms"), ("fwd+bwd", "chunk_gdn_fwdbwd_ms"))


def rows() -> list[dict]:
    from meshplan.costmodel import gdn
    from meshplan.costmodel.devices import get_device

    published, dev = gdn.published_rows(), get_device("GB200")
    out = []
    for name, column in COLUMNS:
        t0, s = gdn.fit(published, column)
        for i, r in enumerate(published):
            held = gdn.fit([x for j, x in enumerate(published) if j != i], column)
            flops = gdn.gdn_flops(gdn.row_op(r))
            price = gdn.time_s(gdn.row_op(r), dev)
            if name == "fwd+bwd":
                price += gdn.time_s(gdn.row_op(r, backward=True), dev)
            out.append({"pass": name, "B": r["B"], "T": r["T"], "H": r["H"], "D": r["D"],
                        "token_heads_m": r["B"] * r["T"] * r["H"] / 1e6, "measured_ms": r[column],
                        "fit_ms": (t0 + s * flops) * 1e3, "left_out_ms": (held[0] + held[1] * flops) * 1e3,
                        "priced_ms": price * 1e3, "constant_ms": t0 * 1e3})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    table = rows()
    summary = {name: {"left_out_max_abs_error": max(abs(r["left_out_ms"] / r["measured_ms"] - 1) for r in table
                                                    if r["pass"] == name),
                      "fit_median_abs_error": statistics.median(abs(r["fit_ms"] / r["measured_ms"] - 1)
                                                                for r in table if r["pass"] == name),
                      "constant_ms": next(r["constant_ms"] for r in table if r["pass"] == name)}
               for name, _ in COLUMNS}
    if args.json:
        print(json.dumps({"rows": table, "summary": summary}, indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title="FLA chunk_gated_delta_rule on GB200: measured, fitted, left out, priced (ms)")
    for col in ("pass", "B", "T", "H", "D", "M token-heads", "measured", "fit", "left out", "priced",
                "left out / measured"):
        t.add_column(col, justify="right")
    for r in table:
        t.add_row(r["pass"], str(r["B"]), str(r["T"]), str(r["H"]), str(r["D"]), f"{r['token_heads_m']:.2f}",
                  f"{r['measured_ms']:.3f}", f"{r['fit_ms']:.3f}", f"{r['left_out_ms']:.3f}",
                  f"{r['priced_ms']:.3f}", f"{r['left_out_ms'] / r['measured_ms']:.3f}")
    Console().print(t)
    for name, s in summary.items():
        print(f"{name}: per-call constant {s['constant_ms']:.2f} ms (not priced); fit median |error| "
              f"{s['fit_median_abs_error']:.1%}; left out, worst |error| {s['left_out_max_abs_error']:.1%}")


if __name__ == "__main__":
    main()
