"""Cost-model benchmark: training time, load time, per-prediction time, and the held-out eval tables.

Usage (from the repository root, ``../shared`` beside it):
    python bench/costmodel_bench.py [--train] [--splits neusight,vidur-h100,vidur-network] [--json OUT] [--no-blend]
    python bench/costmodel_bench.py --splits lodo-gemm   # GEMM leave-one-device-out, one row per GPU

``--train`` retrains the default model into a temporary folder and reports wall and CPU seconds (the shipped
model is rebuilt by ``meshplan costmodel train --data ../shared/kernels --out costmodel/data/model``).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from meshplan.costmodel.devices import get_device  # noqa: E402
from meshplan.costmodel.learned import LearnedModel  # noqa: E402
from meshplan.costmodel.ops import OpSpec  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "costmodel" / "data" / "model"


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def bench_train(data: Path) -> dict:
    from meshplan.costmodel.train import train

    with tempfile.TemporaryDirectory() as d:
        w0, c0 = time.perf_counter(), _cpu_s()
        train([data], d)
        return {"train_wall_s": round(time.perf_counter() - w0, 1), "train_cpu_s": round(_cpu_s() - c0, 1),
                "load_avg_1min": os.getloadavg()[0]}


def bench_predict(n: int = 100_000) -> dict:
    t0 = time.perf_counter()
    m = LearnedModel.load(SHIPPED)
    load_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    dims = (2 ** rng.uniform(6, 14, (n, 3))).astype(int)
    kinds = ("matmul", "layernorm", "elementwise")
    ops = []
    for i, (a, b, c) in enumerate(dims):
        k = kinds[i % 3]
        ops.append(OpSpec(k, (int(a), int(b), int(c)) if k == "matmul" else (int(a), int(b)) if k == "layernorm"
                          else (int(a) * int(b),), "bf16"))
    dev = get_device("H100")
    m.predict_ops(ops[:1000], dev)
    t0 = time.perf_counter()
    _, src = m.predict_ops(ops, dev)
    per = (time.perf_counter() - t0) / n
    from meshplan.costmodel.api import Pricer

    pricer = Pricer.from_dir(SHIPPED)
    t0 = time.perf_counter()
    for o in ops[:2000]:
        pricer.predict(o, dev)
    single = (time.perf_counter() - t0) / 2000
    return {"load_s": round(load_s, 3), "batch_us_per_prediction": round(per * 1e6, 2), "batch_size": n,
            "single_call_us_uncached": round(single * 1e6, 1),
            "learned_fraction": round(float(np.mean(np.char.startswith(src.astype(str), "learned"))), 3)}


def gemm_rows(data: Path):
    """The measured GEMM rows (matmul + bmm, no local ones) the leave-one-device-out split evaluates."""
    from meshplan.costmodel.datasets import load

    table, _ = load([data])
    return table.select((table.source != "local") & np.isin(table.op, ("matmul", "bmm")))


def held_out(g, dev: str, blend_unseen: bool = True):
    """Train on every GPU of ``g`` but ``dev`` (200 trees, 20k rows per class, as the ``leave-one-device-out``
    split) and predict ``dev``'s rows: (its rows, predictions, absolute percentage errors)."""
    from meshplan.costmodel.datasets.devices import resolve_many
    from meshplan.costmodel.eval import _as_model
    from meshplan.costmodel.train import ape, prepare, train_models

    s = g.device == dev
    te = g.select(s)
    m = _as_model(train_models(prepare(g.select(~s)), n_estimators=200, max_rows_per_kind=20000,
                               kinds=("matmul", "bmm"), blend_unseen=blend_unseen))
    specs, _ = resolve_many(te.device)
    pred, _ = m.predict_arrays(te.op, te.b, te.m, te.n, te.k, te.dtype, te.device, specs)
    return te, pred, ape(pred, te.latency_s)


def lodo_gemm(data: Path, blend_unseen: bool = True, only: tuple[str, ...] = ()) -> list[dict]:
    """GEMM (matmul + bmm) leave-one-device-out: every GPU with >= 50 GEMM rows is held out in turn (none of its rows
    reach training, blend selection included); 200 trees, 20k rows per class as the ``leave-one-device-out`` split.
    ``only``: hold out just these GPUs (each still trains on every other GPU)."""
    g = gemm_rows(data)
    rows = []
    for dev in sorted(set(g.device)):
        if (g.device == dev).sum() < 50 or (only and dev not in only):
            continue
        te, pred, e = held_out(g, dev, blend_unseen)
        r = {"device": dev, "n": int(len(e)), "mape": round(float(e.mean()), 1),
             "median_ape": round(float(np.median(e)), 1),
             "median_ratio": round(float(np.median(pred / te.latency_s)), 2)}
        for op in ("matmul", "bmm"):
            if (te.op == op).any():
                r[op] = round(float(e[te.op == op].mean()), 1)
        rows.append(r | {"_ape": e})
    return rows


def print_lodo_gemm(rows: list[dict], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for c in ("held-out GPU", "rows", "GEMM MAPE %", "matmul", "bmm", "median APE %", "median pred/meas", "<= 15%"):
        t.add_column(c, justify="right" if c != "held-out GPU" else "left")
    for r in rows:
        t.add_row(r["device"], str(r["n"]), str(r["mape"]), str(r.get("matmul", "")), str(r.get("bmm", "")),
                  str(r["median_ape"]), str(r["median_ratio"]), "yes" if r["mape"] <= 15 else "no")
    e = np.concatenate([r["_ape"] for r in rows])
    t.add_row("row-weighted", str(len(e)), f"{e.mean():.1f}", "", "", f"{np.median(e):.1f}", "", "")
    t.add_row("median GPU", "", f"{np.median([r['mape'] for r in rows]):.1f}", "", "", "", "", "")
    Console(width=140).print(t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "kernels"))
    ap.add_argument("--train", action="store_true", help="time a full retrain of the default model")
    ap.add_argument("--splits", default="", help="comma-separated eval splits to run")
    ap.add_argument("--local", default="", help="collect output folder for the 'local' split")
    ap.add_argument("--json", default="", help="write all results to this JSON file")
    ap.add_argument("--lodo-devices", default="",
                    help="lodo-gemm: comma-separated GPUs to hold out (default: every GPU with GEMM rows)")
    ap.add_argument("--no-blend", action="store_true",
                    help="price unseen devices by the trees alone (the model before the unseen-device blend)")
    args = ap.parse_args()
    out: dict = {"predict": bench_predict()}
    print(json.dumps(out["predict"]), flush=True)
    if args.train:
        out["train"] = bench_train(Path(args.data))
        print(json.dumps(out["train"]), flush=True)
    from meshplan.costmodel.eval import evaluate

    for split in [s for s in args.splits.split(",") if s]:
        if split == "lodo-gemm":
            t0 = time.perf_counter()
            rows = lodo_gemm(Path(args.data), blend_unseen=not args.no_blend,
                             only=tuple(d for d in args.lodo_devices.split(",") if d))
            print_lodo_gemm(rows, f"GEMM leave-one-device-out ({time.perf_counter() - t0:.0f} s)")
            out[split] = [{k: v for k, v in r.items() if k != "_ape"} for r in rows]
            continue
        data = [Path(args.local)] if split == "local" else [Path(args.data)]
        t0 = time.perf_counter()
        rows = evaluate(split, data, blend_unseen=not args.no_blend)
        out[split] = rows
        print(f"## {split} ({time.perf_counter() - t0:.0f} s)")
        noise = split == "local"  # this machine's split also reports each class's measured noise floor
        print("| device | op | n | MAPE % | median APE % | p90 APE % | roofline MAPE % | fallback |"
              + (" noise floor % |" if noise else ""))
        print("|---|---|---|---|---|---|---|---|" + ("---|" if noise else ""))
        for r in rows:
            print(f"| {r['device']} | {r['op']} | {r['n']} | {r['mape']} | {r['median_ape']} | {r['p90_ape']} | "
                  f"{r.get('roofline_mape', '')} | {r.get('fallback_frac', '')} |"
                  + (f" {r.get('noise_floor_pct', '')} |" if noise else ""), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
