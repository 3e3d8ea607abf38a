"""meshplan's price of each published NCCL measurement against the measurement, by node count and message size.

Measurements (data/README.md): the nccl-tests all-reduce logs NetX-lab/Echo publishes (Azure ND A100 v4, 2-128
GPUs, 1-16 nodes), microsoft/mscclpp's table of NCCL all-gather, all-reduce and all-to-all on Azure NDm A100 v4
(1 node of 8, 2 nodes of 1 and of 8; ``data/nccl_tests/nccl_tests.csv``) and Vidur's NCCL all-reduce tables (DGX
A100 up to 2 nodes, DGX H100 in a node; ``data/kernels/vidur/network``). Each point is priced the way the
planner prices a collective: the cluster ``NODESx8xDEVICE``, the group of ``p`` ranks with ``gpus_per_node`` on
each node (stride ``8 / gpus_per_node``), ``ClusterSpec.collective_link`` for the link (``alltoall_link`` for an
all-to-all), ``costmodel.collectives.collective_time_s``.

Usage (from the repository root):
    python bench/nccl_vs_costmodel.py [--markdown] [--flat] [--source echo|mscclpp|vidur-a100|vidur-h100]
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from meshplan.costmodel.collectives import Link, collective_time_s
from meshplan.planner.cluster.spec import load_cluster

REPO = Path(__file__).resolve().parents[1]
ECHO_CSV = REPO / "data" / "nccl_tests" / "nccl_tests.csv"
VIDUR = REPO / "data" / "kernels" / "vidur" / "network"
NODE_GPUS = 8  # every cluster here has 8 GPUs per node (DGX / HGX / ND A100 v4)
SIZE_BINS = ((0, 64 << 10, "<64K"), (64 << 10, 1 << 20, "64K-1M"), (1 << 20, 16 << 20, "1M-16M"),
             (16 << 20, 256 << 20, "16M-256M"), (256 << 20, 1 << 62, ">=256M"))


@dataclass(frozen=True)
class Point:
    """One measured collective: ``source``, ``device`` (a meshplan device name), ``kind``, ``nodes``,
    ``gpus_per_node``, ``size_bytes``, ``measured_s``."""

    source: str
    device: str
    kind: str
    nodes: int
    gpus_per_node: int
    size_bytes: float
    measured_s: float


def load_points(repo: Path = REPO) -> list[Point]:
    """Every measured collective of the sources above (one GPU per rank, sizes from 1 KiB)."""
    pts = []
    logs = pd.read_csv(repo / ECHO_CSV.relative_to(REPO))
    for r in logs.itertuples():
        if r.size_bytes >= 1024:
            pts.append(Point(r.source, "A100", r.collective, r.nodes, r.gpus_per_node, r.size_bytes,
                             r.time_us * 1e-6))
    for node, device in (("a100_dgx", "A100"), ("h100_dgx", "H100")):
        df = pd.read_csv(repo / VIDUR.relative_to(REPO) / node / "all_reduce.csv.xz")
        for r in df.itertuples():
            p, dpn = int(r.num_workers), int(r.devices_per_node)
            pts.append(Point(f"vidur-{device.lower()}", device, "allreduce", -(-p // dpn), dpn, float(r.size),
                             float(getattr(r, "_3")) * 1e-3))  # time_stats.all_reduce.median, ms
    return pts


def price_s(pt: Point, flat: bool = False) -> float:
    """meshplan's price of ``pt``: the planner's link for that group and the alpha-beta collective on it.
    ``flat``: every ring step at the link's (network) alpha, as meshplan priced it before 2026-11-26."""
    cluster = load_cluster(f"{pt.nodes}x{NODE_GPUS}x{pt.device}" if pt.nodes > 1 else f"{NODE_GPUS}x{pt.device}")
    p = pt.nodes * pt.gpus_per_node
    stride = NODE_GPUS // pt.gpus_per_node
    link = (cluster.alltoall_link if pt.kind == "alltoall" else cluster.collective_link)(p, stride)
    if flat:
        link = Link(link.name, link.bandwidth_bytes_per_s, link.latency_s)
    return collective_time_s(pt.kind, pt.size_bytes, p, link)


def errors(points: list[Point], flat: bool = False) -> pd.DataFrame:
    """One row per point with its price and signed error (price / measured - 1)."""
    rows = [{"source": pt.source, "kind": pt.kind, "nodes": pt.nodes, "gpus_per_node": pt.gpus_per_node,
             "gpus": pt.nodes * pt.gpus_per_node, "size_bytes": pt.size_bytes, "measured_s": pt.measured_s,
             "price_s": price_s(pt, flat)} for pt in points]
    df = pd.DataFrame(rows)
    df["err"] = df.price_s / df.measured_s - 1
    df["size_bin"] = pd.cut(df.size_bytes, [b[0] for b in SIZE_BINS] + [SIZE_BINS[-1][1]], right=False,
                            labels=[b[2] for b in SIZE_BINS])
    return df


def pivot(df: pd.DataFrame) -> pd.DataFrame:
    """Mean signed error (percent) per (source, collective, nodes, GPUs per node) row and size-bin column."""
    keys = ["source", "kind", "nodes", "gpus_per_node"]
    t = df.groupby([*keys, "size_bin"], observed=True).err.mean().unstack("size_bin")
    t["all |err|"] = df.groupby(keys).err.apply(lambda e: e.abs().mean())
    return (100 * t).round(1)


def fit_alpha_busbw(df: pd.DataFrame, min_bytes: float = 1 << 20) -> pd.DataFrame:
    """Per (source, nodes, GPUs per node) of the all-reduces: the measured and the priced curve each fitted as
    ``t = a + f n / B`` (``f = 2 (p - 1) / p``; least squares in relative error, Hockney's alpha-beta) over sizes
    from ``min_bytes``: the latency ``a`` (us) and bus bandwidth ``B`` (GB/s) a span shows, against meshplan's."""
    out = []
    ar = df[(df.kind == "allreduce") & (df.size_bytes >= min_bytes)]
    for key, g in ar.groupby(["source", "nodes", "gpus_per_node"]):
        if len(g) < 3:
            continue
        f = 2 * (g.gpus - 1) / g.gpus
        row = dict(zip(("source", "nodes", "gpus_per_node"), key))
        for name, t in (("measured", g.measured_s), ("priced", g.price_s)):
            a_mat = np.column_stack([1 / t, f * g.size_bytes / t])
            a, inv_b = np.linalg.lstsq(a_mat, np.ones(len(g)), rcond=None)[0]
            row[f"{name}_a_us"], row[f"{name}_busbw_gbps"] = round(a * 1e6, 1), round(1 / inv_b / 1e9, 1)
        out.append(row)
    return pd.DataFrame(out).set_index(["source", "nodes", "gpus_per_node"]) if out else pd.DataFrame()


def markdown(t: pd.DataFrame) -> str:
    """A Markdown table of ``pivot``'s frame (no tabulate dependency)."""
    head = ["source", "collective", "nodes", "GPUs/node", *map(str, t.columns)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for idx, row in t.iterrows():
        cells = [*map(str, idx), *("" if pd.isna(v) else f"{v:+.1f}" for v in row.iloc[:-1]), f"{row.iloc[-1]:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true", help="print Markdown tables")
    ap.add_argument("--source", choices=("echo", "mscclpp", "vidur-a100", "vidur-h100"), help="only this source")
    ap.add_argument("--flat", action="store_true", help="every ring step at the network alpha (the earlier model)")
    args = ap.parse_args(argv)
    df = errors([p for p in load_points() if args.source in (None, p.source)], args.flat)
    t = pivot(df)
    print("mean signed error of meshplan's price, % (positive: priced slower than measured)")
    print(markdown(t) if args.markdown else t.to_string())
    by_src = df.groupby("source").err.apply(lambda e: 100 * e.abs().mean()).round(1)
    print("\nmean |error| per source, %: " + ", ".join(f"{k} {v}" for k, v in by_src.items()))
    print(f"all {len(df)} points: mean |error| {100 * np.abs(df.err).mean():.1f}%")
    fit = fit_alpha_busbw(df)
    if fit.empty:
        return 0
    print("\nlatency a (us) and bus bandwidth B (GB/s) of t = a + 2 (p-1)/p n / B fitted from 1 MiB up, measured vs "
          "priced")
    print(fit.to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
