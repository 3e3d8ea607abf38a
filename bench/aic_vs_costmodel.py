"""NVIDIA AIConfigurator's kernel tables beside meshplan's prices: the streaming rate by bytes moved, GEMMs held
at the power limit, and GEMMs.

- ``streaming`` (from the repository's copy, ``costmodel/data/published/aic_streaming.json``): per part and octave of
  bytes moved, the faster static FP8 quantize kernel's median rate as a share of HBM bandwidth, the floor
  ``costmodel.streaming`` puts under every memory-bound op.
- ``held`` (from ``costmodel/data/published/aic_gemm_sustained.json``): per part and framework, the bf16 GEMM sweep
  collected with the board power read (each shape held a second or more, shape after shape) matched with the same
  framework's one-shot sweep: the median one-shot / held time over the shapes drawing 95% of the power limit or more
  (``costmodel.sustained.AT_CAP``), beside the share ``costmodel.sustained`` prices the part at: each sweep with
  ``MIN_SHAPES_AT_CAP`` shapes at the cap is one of its part's runs there.
- ``gemm`` (needs a checkout of ai-dynamo/aiconfigurator, e.g. ``fetch github:ai-dynamo/aiconfigurator``; not copied
  into the repository, nothing prices from it): TensorRT-LLM 1.3.0rc20's ``Linear`` GEMM times per part, bf16, and
  fp8 with its dynamic input quantize (the collector's own note) against the shipped pricer's one-shot price of the
  same GEMM and, for fp8, of its input's quantize ops (``ops_graph.gemm_ops``): the median priced / measured over
  ``SAMPLE`` shapes with m in [4096, 65536] and n, k >= 1024.

    python bench/aic_vs_costmodel.py [--gemm GIT_DIR] [--json]
"""
from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GEMM_TABLE = "aic-core/src/aiconfigurator_core/systems/data/{folder}/gemm/trtllm/1.3.0rc20/gemm_perf.parquet"
FOLDERS = {"H100-SXM": "h100_sxm", "H200": "h200_sxm", "B200": "b200_sxm", "GB200": "gb200", "B300": "b300_sxm",
           "GB300": "gb300"}
DTYPES = {"bfloat16": ("bf16", "none"), "fp8": ("fp8", "tensorwise")}
SAMPLE = 300

def held_rows() -> list[dict]:
    """One row per matched sweep: its share at the cap, the shapes there, and the share meshplan prices at."""
    from meshplan.costmodel.devices import catalogue
    from meshplan.costmodel.measured import published_file
    from meshplan.costmodel.sustained import HELD_SWEEPS, held_sweep_share, sustained_share

    out, cat = [], catalogue()
    for run in published_file(HELD_SWEEPS)["runs"]:
        share, n = held_sweep_share(run["rows"])
        priced = sustained_share(cat[run["part"]])[0]
        out.append({"part": run["part"], "framework": run["framework"], "shapes_at_cap": n,
                    "held_share": round(share, 3), "priced_share": round(priced, 3)})
    return out


def streaming_rows() -> list[dict]:
    """One row per part: the share of HBM bandwidth at each octave's centre."""
    from meshplan.costmodel import streaming
    from meshplan.costmodel.devices import catalogue

    cat = catalogue()
    return [{"part": part, "shares": {f"{b / 1e6:.0f}": round(r / cat[part].mem_bw_bytes_per_s, 2)
                                      for b, r in streaming.curve(part)}} for part in FOLDERS]


def gemm_rows(git_dir: str) -> list[dict]:
    """One row per (part, dtype): median and quartiles of priced / measured."""
    import numpy as np
    import pandas as pd

    from meshplan.costmodel.api import Pricer
    from meshplan.costmodel.devices import catalogue
    from meshplan.costmodel.ops import OpSpec
    from meshplan.planner.estimate.ops_graph import gemm_ops

    pricer, cat, out = Pricer.shipped(), catalogue(), []
    for part, folder in FOLDERS.items():
        blob = subprocess.run(["git", "--git-dir", git_dir, "show", f"HEAD:{GEMM_TABLE.format(folder=folder)}"],
                              check=True, capture_output=True).stdout
        t = pd.read_parquet(io.BytesIO(blob))
        for name, (dtype, recipe) in DTYPES.items():
            s = t[(t.gemm_dtype == name) & (t.kernel_source == "torch_flow") & (t.m >= 4096) & (t.m <= 65536)
                  & (t.n >= 1024) & (t.k >= 1024)]
            s = s.sample(min(SAMPLE, len(s)), random_state=0)
            ratios = []
            for m, n, k, ms in zip(s.m, s.n, s.k, s.latency):
                ops = [OpSpec(o.kind, o.shape[:1], o.dtype, impl=o.impl) if o.kind in ("cast", "copy") else o
                       for o in gemm_ops(dtype, recipe, int(m), int(n), int(k))]  # forward elements only
                ratios.append(sum(pricer.predict(o, cat[part]) for o in ops) / (ms * 1e-3))
            q = np.quantile(ratios, [0.25, 0.5, 0.75])
            out.append({"part": part, "dtype": name, "gemms": len(ratios), "priced_over_measured": round(q[1], 3),
                        "p25": round(q[0], 3), "p75": round(q[2], 3)})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gemm", metavar="GIT_DIR", help="an aiconfigurator checkout's git directory")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    result = {"streaming": streaming_rows(), "held": held_rows(), "gemm": gemm_rows(args.gemm) if args.gemm else []}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    octaves = list(result["streaming"][0]["shares"])
    table = Table(title="streaming rate / HBM bandwidth (the faster quantize kernel)")
    for col in ["MB moved", *(row["part"] for row in result["streaming"])]:
        table.add_column(col, justify="right", overflow="fold")
    for o in octaves:
        table.add_row(o, *(f"{row['shares'].get(o, float('nan')):.2f}" for row in result["streaming"]))
    Console().print(table)
    table = Table(title="bf16 GEMMs held at the power limit: one-shot / held time")
    for col in ("part", "framework", "shapes at cap", "held", "priced share"):
        table.add_column(col, justify="right", overflow="fold")
    for r in result["held"]:
        table.add_row(r["part"], r["framework"], str(r["shapes_at_cap"]), f"{r['held_share']:.3f}",
                      f"{r['priced_share']:.3f}")
    Console().print(table)
    if result["gemm"]:
        table = Table(title="TensorRT-LLM GEMMs: meshplan one-shot price / measured")
        for col in ("part", "dtype", "GEMMs", "median", "p25", "p75"):
            table.add_column(col, justify="right", overflow="fold")
        for r in result["gemm"]:
            table.add_row(r["part"], r["dtype"], str(r["gemms"]), f"{r['priced_over_measured']:.3f}",
                          f"{r['p25']:.3f}", f"{r['p75']:.3f}")
        Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
