"""Cost-model benchmark: training time, load time, per-prediction time, and the held-out eval tables.

Usage (from the repository root, ``../shared`` beside it):
    python bench/costmodel_bench.py [--train] [--splits neusight,vidur-h100,vidur-network] [--json OUT] [--no-blend]

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
            "learned_fraction": round(float(np.mean(src == "learned")), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "kernels"))
    ap.add_argument("--train", action="store_true", help="time a full retrain of the default model")
    ap.add_argument("--splits", default="", help="comma-separated eval splits to run")
    ap.add_argument("--local", default="", help="collect output folder for the 'local' split")
    ap.add_argument("--json", default="", help="write all results to this JSON file")
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
