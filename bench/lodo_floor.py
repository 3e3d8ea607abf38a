"""Oracle floor of the GEMM leave-one-device-out MAPE: the best MAPE any predictor could reach on each GPU's rows.

Usage (from the repository root; 5-8 s on 2 shared cores, no training):
    python bench/lodo_floor.py [--data data/kernels] [--examples 5] [--json OUT]
    python bench/lodo_floor.py --lodo P4,P100   # also retrain lodo_gemm for these GPUs, MAPE per collection (slow)

What the floor means. ``bench/costmodel_bench.py --splits lodo-gemm`` (issue 13 item 4, target <= 15% on every GPU)
scores, per held-out GPU, every matmul and bmm row the loaders produce (``costmodel.datasets.load``, local rows
excluded, GPUs with >= 50 GEMM rows). A predictor sees an operator as (kind, b, m, n, k, dtype, device): rows that
agree on those fields get the same prediction, whatever model makes it. Where one such operator was measured several
times with different results, no prediction can be right for all of them. For each group of identical operators the
single prediction ``p`` minimising the summed absolute percentage error ``sum |p - m_i| / m_i`` is the weighted
median of the measurements ``m_i`` under weights ``1 / m_i`` (the objective is convex and piecewise linear in ``p``;
its slope ``sum_{m_i < p} w_i - sum_{m_i > p} w_i`` changes sign there). Predicting that for every group and the
measurement itself for every singleton gives the **oracle floor**: no predictor with this interface, however
trained, scores a lower MAPE on that GPU. A floor above 15% means item 4 cannot be met there by any model; a low
floor says the data do not forbid it.

Two keys are reported: ``op key`` (the predictor's interface above, the floor that binds the item) and ``kernel
key``, which also separates what the loaders fold together (NeuSight's ``B x M`` split of a linear's rows, DeepBench's
transposes): a finer key can only lower the floor, so the gap says how much of it comes from folding. Duplicate
groups are split by collection (the file a row came from): groups whose rows all come from one file, and groups whose
rows span files (e.g. NeuSight's train and test sweeps of the same shape), with the spread max/min measured time.
The ``LODO MAPE`` column is the shipped model's held-out MAPE recorded in BENCHMARKS.md ("Unseen GPUs: GEMM
leave-one-device-out", column "before", i.e. what ships), not recomputed here. Every duplicate group's weighted
median is also checked against the exact minimum of the objective over its breakpoints (the measurements).

Where a GPU's collections never measured the same shape (NeuSight's train and test sweeps share none), a second
table compares them at near shapes (each of b, m, n, k within a factor 1.1, time per FLOP): a check of whether the
sweeps agree where they meet, **not** an oracle bound, since two different shapes may truly differ (odd sizes vs
multiples of 128 change the cuBLAS kernel).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# BENCHMARKS.md, "Unseen GPUs: GEMM leave-one-device-out (issue 13 item 4, 2026-11-25)", column "before" (the
# shipped model): `python bench/costmodel_bench.py --splits lodo-gemm`.
LODO_MAPE_RECORDED = {
    "A100-80GB": 7.1, "A100-PCIe-40GB": 17.0, "A100-PCIe-80GB": 8.0, "A40": 14.3, "GTX-1080Ti": 42.0,
    "H100-SXM": 11.0, "L4": 38.1, "M40": 26.6, "P100": 27.5, "P4": 27.1, "T4": 22.1, "TitanX-Maxwell": 28.2,
    "TitanX-Pascal": 36.6, "TitanXp": 25.3, "V100-PCIe-32GB": 21.3, "V100-SXM2-32GB": 34.2,
}
TARGET_PCT = 15.0
MIN_ROWS = 50  # lodo_gemm holds out GPUs with >= 50 GEMM rows


def min_sape(values: np.ndarray) -> float:
    """The prediction ``p`` minimising ``sum |p - m| / m`` over the measurements ``values`` (> 0): the weighted median
    under weights ``1 / m`` (the lowest ``m`` at which the sorted cumulative weight reaches half the total)."""
    m = np.sort(np.asarray(values, dtype=np.float64))
    w = 1.0 / m
    c = np.cumsum(w)
    return float(m[np.searchsorted(c, 0.5 * c[-1] * (1 - 1e-12))])


def group_floor(gid: np.ndarray, lat: np.ndarray) -> np.ndarray:
    """Per-row oracle prediction: ``min_sape`` of the row's group (``gid``: integer group ids), vectorised."""
    order = np.lexsort((lat, gid))
    g, m = gid[order], lat[order]
    w = 1.0 / m
    c = np.cumsum(w)
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    ends = np.r_[starts[1:], len(g)]
    base = np.r_[0.0, c[starts[1:] - 1]]  # cumulative weight before each group
    tot = c[ends - 1] - base
    cg = c - np.repeat(base, ends - starts)
    half = np.repeat(0.5 * tot * (1 - 1e-12), ends - starts)
    reached = cg >= half
    # first index in each group where the group's cumulative weight reaches half its total
    idx = np.maximum.reduceat(np.where(reached, -np.arange(len(g)), -len(g)), starts)
    p_group = m[-idx]
    pred = np.empty_like(lat)
    pred[order] = np.repeat(p_group, ends - starts)
    return pred


def gemm_rows(data: Path) -> dict[str, np.ndarray]:
    """lodo_gemm's rows (non-local matmul + bmm of ``costmodel.datasets.load``), each with the file it came from and
    the dataset fields the loaders fold (``kernel``: NeuSight B x M and cuBLAS kernel name, DeepBench transposes).
    Built file by file with the loaders' own functions and checked row for row against ``load``."""
    from meshplan.costmodel.datasets import deepbench, neusight, vidur
    from meshplan.costmodel.datasets.table import read_csv, table_files, table_name

    parts: list[dict] = []

    def add(t, file: str, fold: np.ndarray, kname: np.ndarray) -> None:
        keep = np.isin(t.op, ("matmul", "bmm"))
        parts.append({"device": t.device[keep], "op": t.op[keep], "dtype": t.dtype[keep], "b": t.b[keep],
                      "m": t.m[keep], "n": t.n[keep], "k": t.k[keep], "latency_s": t.latency_s[keep],
                      "source": t.source[keep], "file": np.full(keep.sum(), file, dtype=object),
                      "fold": fold[keep], "kname": kname[keep]})

    root = data / "neusight"
    for f, s in neusight._files(root):
        cols = read_csv(f, ("OPName", "Latency", "Device", "B"))
        if "M" not in cols:
            continue
        t = neusight.load_file(f, s)
        fold = np.array([f"B={b} M={m}" for b, m in zip(cols["B"], cols["M"])], dtype=object)
        add(t, str(table_name(f).relative_to(data)), fold, np.array(cols["Kernel Name"], dtype=object))
    f = data / "deepbench" / "tidy" / "gemm.csv"
    cols = read_csv(f, ("device", "precision", "M", "N", "K", "time_ms", "tflops_reported", "a_trans", "b_trans"))
    keep = np.array([p in deepbench.PRECISION and d.startswith("NV_") for p, d in zip(cols["precision"],
                                                                                      cols["device"])])
    t_ms = np.array([float(x) if x else np.nan for x in cols["time_ms"]])
    tf = np.array([float(x) if x else np.nan for x in cols["tflops_reported"]])
    ok = (np.isfinite(t_ms) & np.isfinite(tf) & (t_ms > 0))[keep]
    sel = np.flatnonzero(keep)[ok]
    fold = np.array([f"{cols['a_trans'][i]}{cols['b_trans'][i]}" for i in sel], dtype=object)
    kname = np.array([f"{cols['suite'][i]}:{cols['application'][i]}" for i in sel], dtype=object)
    add(deepbench.load_gemm(f), str(f.relative_to(data)), fold, kname)
    for f in table_files(data / "vidur" / "compute", "*/*/mlp.csv"):
        t = vidur.load_compute(f, f.parent.parent.name)
        add(t, str(table_name(f).relative_to(data)), t.variant.astype(object), t.variant.astype(object))
    rows = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    # the same rows as bench/costmodel_bench.py lodo_gemm, checked as multisets
    from bench.costmodel_bench import gemm_rows

    g = gemm_rows(data)

    def canon(d):
        return sorted(zip(d["device"], d["op"], d["dtype"], d["b"], d["m"], d["n"], d["k"], d["latency_s"]))

    ref = {c: getattr(g, c) for c in ("device", "op", "dtype", "b", "m", "n", "k", "latency_s")}
    if canon(ref) != canon(rows):
        raise RuntimeError("per-file rows differ from costmodel.datasets.load's GEMM rows")
    return rows


def floor_by_device(rows: dict[str, np.ndarray]) -> list[dict]:
    out = []
    for dev in sorted(set(rows["device"])):
        s = rows["device"] == dev
        if s.sum() < MIN_ROWS:
            continue
        r = {c: v[s] for c, v in rows.items()}
        lat = r["latency_s"]
        op_key = np.array([f"{o}|{d}|{b!r}|{m!r}|{n!r}|{k!r}" for o, d, b, m, n, k in
                           zip(r["op"], r["dtype"], r["b"], r["m"], r["n"], r["k"])], dtype=object)
        _, gid = np.unique(op_key, return_inverse=True)
        _, kgid = np.unique(np.array([f"{a}|{f}" for a, f in zip(op_key, r["fold"])], dtype=object),
                            return_inverse=True)
        _, fgid = np.unique(np.array([f"{a}|{f}" for a, f in zip(op_key, r["file"])], dtype=object),
                            return_inverse=True)
        size = np.bincount(gid)
        dup = size[gid] > 1
        floor = 100 * np.abs(group_floor(gid, lat) - lat) / lat
        floor_k = 100 * np.abs(group_floor(kgid, lat) - lat) / lat
        floor_f = 100 * np.abs(group_floor(fgid, lat) - lat) / lat
        gmax = np.full(gid.max() + 1, 0.0)
        gmin = np.full(gid.max() + 1, np.inf)
        np.maximum.at(gmax, gid, lat)
        np.minimum.at(gmin, gid, lat)
        spread = gmax / gmin
        _, file_id = np.unique(r["file"].astype(str), return_inverse=True)
        pairs = np.unique(np.stack([gid, file_id]), axis=1)
        nfiles = np.bincount(pairs[0], minlength=gid.max() + 1)
        dg = size > 1
        cross = dg & (nfiles > 1)
        within = dg & (nfiles == 1)
        rec = {
            "device": dev, "rows": int(s.sum()), "dup_groups": int(dg.sum()), "dup_rows": int(size[dg].sum()),
            "floor_mape": float(floor.mean()), "floor_mape_kernel_key": float(floor_k.mean()),
            "floor_mape_per_file": float(floor_f.mean()),
            "floor_mape_dup_rows": float(floor[dup].mean()) if dup.any() else 0.0,
            "max_spread": float(spread[dg].max()) if dg.any() else 1.0,
            "median_spread": float(np.median(spread[dg])) if dg.any() else 1.0,
            "cross_file_groups": int(cross.sum()), "cross_file_rows": int(size[cross].sum()),
            "cross_file_median_spread": float(np.median(spread[cross])) if cross.any() else None,
            "cross_file_max_spread": float(spread[cross].max()) if cross.any() else None,
            "within_file_groups": int(within.sum()), "within_file_rows": int(size[within].sum()),
            "within_file_median_spread": float(np.median(spread[within])) if within.any() else None,
            "within_file_max_spread": float(spread[within].max()) if within.any() else None,
            "lodo_mape_recorded": LODO_MAPE_RECORDED.get(dev),
            "files": sorted(set(r["file"])),
        }
        # per collection: rows, and the floor's error summed over that collection's rows
        rec["by_file"] = {f: {"rows": int((r["file"] == f).sum()),
                              "dup_rows": int((dup & (r["file"] == f)).sum()),
                              "floor_mape": float(floor[r["file"] == f].mean())} for f in rec["files"]}
        rec["_groups"] = (gid, spread, nfiles, r)
        out.append(rec)
    return out


def check_minimiser(recs: list[dict]) -> int:
    """Every duplicate group: the weighted median's summed APE equals the minimum over the group's measurements
    (the objective is convex and piecewise linear with its kinks there, so that minimum is the global one).
    Returns the number of groups checked; raises on a mismatch."""
    checked = 0
    for rec in recs:
        gid, _, _, r = rec["_groups"]
        lat = r["latency_s"]
        order = np.argsort(gid, kind="stable")
        bounds = np.flatnonzero(np.r_[True, gid[order][1:] != gid[order][:-1], True])
        for a, b in zip(bounds[:-1], bounds[1:]):
            if b - a < 2:
                continue
            m = lat[order[a:b]]
            obj = lambda p: float(np.sum(np.abs(p - m) / m))  # noqa: E731
            best = min(obj(x) for x in m)
            if obj(min_sape(m)) > best * (1 + 1e-9) + 1e-15:
                raise AssertionError(f"{rec['device']}: weighted median is not the minimiser for {m}")
            checked += 1
    return checked


def collection(files: np.ndarray) -> np.ndarray:
    """A row's collection: ``neusight/train``, ``neusight/test``, ``deepbench``, ``vidur/<gpu>``."""
    out = []
    for f in files:
        parts = f.split("/")
        out.append("/".join(parts[:2]) if parts[0] in ("neusight",) else
                   "/".join((parts[0], parts[2])) if parts[0] == "vidur" else parts[0])
    return np.array(out, dtype=object)


NEAR = 1.1  # near-shape cells: each of b, m, n, k within a factor 1.1 (log2 bins of width log2 1.1)


def near_shape(rows: dict[str, np.ndarray]) -> tuple[list[dict], list[dict]]:
    """Where collections of one GPU never share an exact shape, compare them at near shapes: cells of (op, dtype,
    log2 b, m, n, k binned by ``NEAR``), time per FLOP per collection. Not an oracle bound (two shapes may truly
    differ), a check of whether collections agree where they meet. Returns (per-GPU summaries, example pairs)."""
    from meshplan.costmodel.features import flops_bytes

    w = np.log2(NEAR)
    out, ex = [], []
    for dev in sorted(set(rows["device"])):
        s = rows["device"] == dev
        r = {c: v[s] for c, v in rows.items()}
        coll = collection(r["file"])
        if s.sum() < MIN_ROWS or len(set(coll)) < 2:
            continue
        fl, _ = flops_bytes(r["op"], r["b"], r["m"], r["n"], r["k"], r["dtype"])
        y = r["latency_s"] / fl
        bins = np.floor(np.log2(np.stack([r["b"], r["m"], r["n"], r["k"]])) / w).astype(int)
        ck = np.array([f"{o}|{d}|{a}|{b}|{c}|{e}" for o, d, a, b, c, e in zip(r["op"], r["dtype"], *bins)],
                      dtype=object)
        _, cid = np.unique(ck, return_inverse=True)
        cnames, fid = np.unique(coll.astype(str), return_inverse=True)
        pairs = np.unique(np.stack([cid, fid]), axis=1)
        nf = np.bincount(pairs[0], minlength=cid.max() + 1)
        mixed = nf[cid] > 1
        rec = {"device": dev, "collections": list(cnames), "mixed_cells": int((nf > 1).sum()),
               "mixed_rows": int(mixed.sum())}
        if mixed.any():
            pooled = 100 * np.abs(group_floor(cid, y) - y) / y
            sep = 100 * np.abs(group_floor(cid * len(cnames) + fid, y) - y) / y
            rec["cell_floor_pooled_mixed"] = float(pooled[mixed].mean())
            rec["cell_floor_separate_mixed"] = float(sep[mixed].mean())
            spreads, tr_te = [], []
            for c in np.flatnonzero(nf > 1):
                inc = cid == c
                med = {cn: float(np.median(y[inc & (coll == cn)])) for cn in set(coll[inc])}
                spreads.append(max(med.values()) / min(med.values()))
                if "neusight/train" in med and "neusight/test" in med:
                    tr_te.append(med["neusight/train"] / med["neusight/test"])
                    i = np.flatnonzero(inc & (coll == "neusight/train"))
                    j = np.flatnonzero(inc & (coll == "neusight/test"))
                    a, b = i[np.argmax(r["latency_s"][i])], j[np.argmax(r["latency_s"][j])]
                    ex.append({"device": dev, "ratio_time_per_flop": float(y[a] / y[b]),
                               "max_ms": float(max(r["latency_s"][a], r["latency_s"][b]) * 1e3),
                               "rows": [_row(r, a), _row(r, b)]})
            rec["median_collection_spread"] = float(np.median(spreads))
            rec["max_collection_spread"] = float(np.max(spreads))
            if tr_te:
                t = np.array(tr_te)
                rec["train_over_test"] = {"cells": len(t), "median": float(np.median(t)),
                                          "p10": float(np.percentile(t, 10)), "p90": float(np.percentile(t, 90)),
                                          "frac_over_2": float((t > 2).mean())}
        out.append(rec)
    return out, ex


def _row(r: dict, i: int) -> dict:
    return {"file": r["file"][i], "op": r["op"][i], "dtype": r["dtype"][i],
            "bmnk": [int(r[c][i]) for c in ("b", "m", "n", "k")],
            "latency_ms": round(float(r["latency_s"][i]) * 1e3, 4),
            "fold": r["fold"][i], "kernel": r["kname"][i]}


def examples(recs: list[dict], n: int) -> list[dict]:
    """The widest exact-duplicate groups (same op key) with a kernel >= 1 ms, one per GPU first."""
    ex = []
    for rec in recs:
        gid, spread, _, r = rec["_groups"]
        size = np.bincount(gid)
        big = np.zeros(len(size), bool)
        np.logical_or.at(big, gid, r["latency_s"] >= 1e-3)
        for i in [i for i in np.argsort(-spread) if size[i] > 1 and big[i]][:2]:
            ex.append({"device": rec["device"], "spread": float(spread[i]),
                       "rows": [_row(r, j) for j in np.flatnonzero(gid == i)]})
    ex.sort(key=lambda e: -e["spread"])
    seen, first = set(), []
    for e in ex:
        if e["device"] not in seen:
            seen.add(e["device"])
            first.append(e)
    return (first + [e for e in ex if e not in first])[:n]


def lodo_by_collection(data: Path, devices: list[str]) -> list[dict]:
    """``--lodo``: the held-out MAPE of ``bench/costmodel_bench.py`` ``lodo_gemm`` (its ``held_out``: 200 trees, 20k
    rows per class, none of the GPU's rows in training) for ``devices``, split by the rows' ``source``
    (``neusight/train``, ``neusight/test``, ``deepbench``, ``vidur/<gpu>``). Retrains once per GPU (5-100 s each)."""
    from bench.costmodel_bench import gemm_rows, held_out

    g = gemm_rows(data)
    out = []
    for dev in devices:
        te, pred, e = held_out(g, dev)
        rec = {"device": dev, "rows": int(len(e)), "mape": float(e.mean()), "by_source": {}}
        for src in sorted(set(te.source)):
            c = te.source == src
            rec["by_source"][src] = {"rows": int(c.sum()), "mape": float(e[c].mean()),
                                     "median_pred_over_meas": float(np.median(pred[c] / te.latency_s[c]))}
        out.append(rec)
    return out


def print_lodo(lodo: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="Held-out GPU (lodo_gemm protocol, retrained here), MAPE split by collection")
    for c in ("GPU", "collection", "rows", "LODO MAPE %", "median pred/meas"):
        t.add_column(c, justify="left" if c in ("GPU", "collection") else "right")
    for r in lodo:
        t.add_row(r["device"], "all", str(r["rows"]), f"{r['mape']:.1f}", "")
        for src, v in r["by_source"].items():
            t.add_row("", src, str(v["rows"]), f"{v['mape']:.1f}", f"{v['median_pred_over_meas']:.2f}")
    Console(width=200).print(t)


def print_table(recs: list[dict], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    cols = ("GPU", "rows", "dup groups", "rows in them", "floor MAPE %", "floor, kernel key %",
            "floor, per file %", "max spread", "cross-file groups (rows)", "cross-file median / max spread",
            "LODO MAPE % (BENCHMARKS)", "floor <= 15%")
    for c in cols:
        t.add_column(c, justify="left" if c == "GPU" else "right")
    for r in recs:
        cs = (f"{r['cross_file_median_spread']:.2f} / {r['cross_file_max_spread']:.2f}"
              if r["cross_file_groups"] else "")
        t.add_row(r["device"], str(r["rows"]), str(r["dup_groups"]), str(r["dup_rows"]), f"{r['floor_mape']:.2f}",
                  f"{r['floor_mape_kernel_key']:.2f}", f"{r['floor_mape_per_file']:.2f}", f"{r['max_spread']:.2f}",
                  f"{r['cross_file_groups']} ({r['cross_file_rows']})", cs,
                  "" if r["lodo_mape_recorded"] is None else f"{r['lodo_mape_recorded']:.1f}",
                  "yes" if r["floor_mape"] <= TARGET_PCT else "NO")
    n = sum(r["rows"] for r in recs)
    t.add_row("row-weighted", str(n), str(sum(r["dup_groups"] for r in recs)), str(sum(r["dup_rows"] for r in recs)),
              f"{sum(r['floor_mape'] * r['rows'] for r in recs) / n:.2f}",
              f"{sum(r['floor_mape_kernel_key'] * r['rows'] for r in recs) / n:.2f}",
              f"{sum(r['floor_mape_per_file'] * r['rows'] for r in recs) / n:.2f}", "", "", "", "21.0", "")
    Console(width=200).print(t)


def print_by_file(recs: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="Per collection: rows, rows in a duplicate group (op key), the oracle floor's MAPE on them")
    for c in ("GPU", "file", "rows", "dup rows", "floor MAPE %"):
        t.add_column(c, justify="left" if c in ("GPU", "file") else "right")
    for r in recs:
        for f, v in r["by_file"].items():
            t.add_row(r["device"], f, str(v["rows"]), str(v["dup_rows"]), f"{v['floor_mape']:.2f}")
    Console(width=200).print(t)


def print_near(near: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"Collections of one GPU at near shapes (each of b, m, n, k within x{NEAR}; time per FLOP); "
                    "a check, not an oracle bound")
    for c in ("GPU", "collections", "mixed cells", "rows in them", "cell floor pooled %", "cell floor per collection %",
              "median / max spread of collection medians", "train/test time per FLOP: median (p10-p90)",
              "cells train/test > 2x"):
        t.add_column(c, justify="left" if c in ("GPU", "collections") else "right")
    for r in near:
        tt = r.get("train_over_test")
        t.add_row(r["device"], ", ".join(r["collections"]), str(r["mixed_cells"]), str(r["mixed_rows"]),
                  f"{r['cell_floor_pooled_mixed']:.1f}" if r["mixed_rows"] else "",
                  f"{r['cell_floor_separate_mixed']:.1f}" if r["mixed_rows"] else "",
                  f"{r['median_collection_spread']:.2f} / {r['max_collection_spread']:.2f}" if r["mixed_rows"] else "",
                  f"{tt['median']:.2f} ({tt['p10']:.2f}-{tt['p90']:.2f})" if tt else "",
                  f"{tt['frac_over_2'] * tt['cells']:.0f} of {tt['cells']}" if tt else "")
    Console(width=200).print(t)


def _print_rows(rows: list[dict]) -> None:
    for r in rows:
        b, m, n, k = r["bmnk"]
        print(f"    {r['op']:6s} {r['dtype']} b={b} m={m} n={n} k={k}: {r['latency_ms']:>10.4f} ms  {r['file']}  "
              f"[{r['fold']}; {r['kernel']}]")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(REPO / "data" / "kernels"))
    ap.add_argument("--examples", type=int, default=5, help="example groups / pairs to print")
    ap.add_argument("--json", default="", help="write the results to this JSON file")
    ap.add_argument("--lodo", default="", help="comma-separated GPUs to hold out and retrain for (slow), reporting "
                                                "their LODO MAPE per collection")
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows = gemm_rows(Path(args.data))
    recs = floor_by_device(rows)
    checked = check_minimiser(recs)
    near, near_ex = near_shape(rows)
    ex = examples(recs, args.examples)
    near_ex = sorted([e for e in near_ex if e["max_ms"] >= 1.0], key=lambda e: -e["ratio_time_per_flop"])
    pick, seen = [], set()
    for e in near_ex:  # the widest pair per GPU, then the next widest
        if e["device"] not in seen:
            seen.add(e["device"])
            pick.append(e)
    pick += [e for e in near_ex if e not in pick]
    pick = pick[:args.examples]
    wall = time.perf_counter() - t0
    print_table(recs, f"GEMM leave-one-device-out: oracle floor per GPU ({len(rows['device'])} rows, {wall:.1f} s)")
    print(f"weighted median checked against the exact minimum over breakpoints in all {checked} duplicate groups")
    print_by_file(recs)
    print_near(near)
    print("Exact duplicates (same op key), groups with a kernel >= 1 ms, widest spread first:")
    for e in ex:
        print(f"  {e['device']}: spread {e['spread']:.2f}x")
        _print_rows(e["rows"])
    print("NeuSight train vs test at near shapes (the longest kernel of each sweep in a mixed cell), >= 1 ms:")
    for e in pick:
        print(f"  {e['device']}: time per FLOP train/test {e['ratio_time_per_flop']:.2f}x")
        _print_rows(e["rows"])
    lodo = []
    if args.lodo:
        t1 = time.perf_counter()
        lodo = lodo_by_collection(Path(args.data), [d for d in args.lodo.split(",") if d])
        print_lodo(lodo)
        print(f"(--lodo: {time.perf_counter() - t1:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps({"wall_s": wall, "checked_groups": checked, "devices": [
            {k: v for k, v in r.items() if not k.startswith("_")} for r in recs], "near_shape": near,
            "examples": ex, "near_examples": pick, "lodo": lodo}, indent=1, default=str))


if __name__ == "__main__":
    main()
