"""Set the shipped cost model's prices beside the kernels measured by ``bench/gpu_kernels.py`` on one GPU.

Prices each measured case the way the planner does (``planner`` expert ops: one grouped GEMM of ``experts_local``
groups of ``tokens_per_expert`` rows, ``costmodel.grouped``; fused attention from the published curves by
implementation; memory-bound kernels by op class) and prints predicted / measured medians, grouped by what moves
the ratio. Reads only; the measurements are not fed back into the model. ``--tables`` prints the measured medians
as markdown instead.

    python bench/gpu_kernels_vs_costmodel.py [--data costmodel/data/measured/nvidia-h200.json] [--device H200]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def gemm_ratios(records, pricer, dev, OpSpec) -> dict:
    """(dtype, tokens_per_expert) -> predicted/measured of the grouped call (``costmodel.grouped``, as the planner
    prices it), and of the same-FLOPs dense GEMM."""
    from meshplan.costmodel.grouped import priced_over_measured

    grouped = priced_over_measured(pricer, {"sections": {"gemm": {"records": records}}}, dev)
    out = {key: {"grouped": vals, "dense": []} for key, vals in grouped.items()}
    for r in records:
        if r.get("pass") != "fwd" or "grouped" not in r:
            continue
        dense = OpSpec("matmul", (r["m_total"], r["n"], r["k"]), r["dtype"], impl="rowwise" if r["dtype"] == "fp8"
                       else "")
        out[(r["dtype"], r["tokens_per_expert"])]["dense"].append(
            pricer.predict(dense, dev) * 1e3 / r["dense"]["median_ms"])
    return out


def attention_ratios(records, dev, OpSpec, fused_attention_s) -> dict:
    """(backend, head_dim, pass) -> predicted/measured per sequence length, from the published-curve pricing."""
    impl_of = {"FLASH_ATTENTION": "flash2", "CUDNN_ATTENTION": "cudnn"}
    out = defaultdict(dict)
    for r in records:
        if "fwd" not in r:
            continue
        for pass_ in ("fwd", "bwd"):
            op = OpSpec("attention", (r["batch"], r["q_heads"], r["seq"], r["seq"], r["head_dim"]), "bf16",
                        causal=True, backward=pass_ == "bwd", impl=impl_of[r["backend"]])
            out[(r["backend"], r["head_dim"], pass_)][r["seq"]] = (
                fused_attention_s(op, dev) * 1e3 / r[pass_]["median_ms"])
    return out


def memory_ratios(records, pricer, dev, OpSpec) -> list:
    """(op, variant, shape, predicted/measured) for the memory-bound kinds the planner prices."""
    rows = []
    for r in records:
        if "median_ms" not in r:
            continue
        shape = r["shape"]
        out_numel = shape[-2] * shape[-1] // (2 if r["op"] == "swiglu" else 1)  # swiglu: [T, 2F] in, [T, F] out
        spec = {("swiglu", "torch.compile"): ("swiglu", (out_numel,), "fused"),
                ("swiglu", "eager"): ("swiglu", (out_numel,), "eager"),
                ("rms_norm", "F.rms_norm"): ("rmsnorm", tuple(shape), "fused"),
                ("rms_norm", "torch.compile"): ("rmsnorm", tuple(shape), "fused"),
                ("rms_norm", "eager"): ("rmsnorm", tuple(shape), "eager"),
                ("residual_add", "eager"): ("elementwise", (out_numel,), "")}.get((r["op"], r["variant"]))
        if spec:
            ms = pricer.predict(OpSpec(spec[0], spec[1], "bf16", impl=spec[2]), dev) * 1e3
            rows.append((r["op"], r["variant"], shape, ms / r["median_ms"]))
    return rows


def cast_ratios(records, pricer, dev, OpSpec) -> list:
    """Tensorwise fp8 cast as the planner prices it (a cast of n elements plus the amax read, priced as a copy of n/2
    elements: the same bytes) against the measured eager and compiled casts."""
    rows = []
    for r in records:
        if r["op"] in ("cast_eager", "cast_compiled"):
            n = r["numel"]
            cast = pricer.predict(OpSpec("cast", (n,), "bf16"), dev)
            amax = pricer.predict(OpSpec("copy", (n // 2,), "bf16"), dev)
            rows.append((r["op"], n, (cast + amax) * 1e3 / r["median_ms"]))
    return rows


def med(values) -> float:
    return statistics.median(values) if values else float("nan")


def gemm_table(records) -> list[str]:
    """Median over models and experts_local of the grouped TFLOP/s, and of grouped over dense, by tokens per expert."""
    cols = (("bf16", "fwd"), ("bf16", "wgrad"), ("fp8", "fwd"))
    lines = ["| tokens/expert | " + " | ".join(f"{d} {p}: grouped TFLOP/s (x dense)" for d, p in cols) + " |",
             "|---" * (len(cols) + 1) + "|"]
    for tpe in sorted({r["tokens_per_expert"] for r in records}):
        cells = []
        for dtype, pass_ in cols:
            sel = [r for r in records if (r["dtype"], r["pass"], r["tokens_per_expert"]) == (dtype, pass_, tpe)]
            cells.append(f"{med([r['grouped_tflops'] for r in sel]):.0f} "
                         f"({med([r['grouped_over_dense'] for r in sel]):.2f})")
        lines.append(f"| {tpe} | " + " | ".join(cells) + " |")
    return lines


def attention_table(records) -> list[str]:
    seqs = sorted({r["seq"] for r in records})
    lines = ["| backend, head dim | pass | " + " | ".join(f"{s // 1024}k" for s in seqs) + " |",
             "|---|---" + "|---" * len(seqs) + "|"]
    for backend in ("FLASH_ATTENTION", "CUDNN_ATTENTION"):
        for d in (128, 64):
            for p in ("fwd", "bwd"):
                by = {r["seq"]: r[f"{p}_tflops"] for r in records if (r["backend"], r["head_dim"]) == (backend, d)}
                lines.append(f"| {backend} d{d} | {p} | " + " | ".join(f"{by[s]:.0f}" for s in seqs) + " |")
    return lines


def permute_table(records, tokens: int) -> list[str]:
    ops = ("permute", "gather_only", "unpermute", "unpermute_gather_sum", "router_softmax_topk")
    lines = [f"| model (T={tokens}) | " + " | ".join(f"{o} ms (GB/s)" for o in ops) + " |", "|---" * 6 + "|"]
    for model in dict.fromkeys(r["model"] for r in records):
        by = {r["op"]: r for r in records if r["model"] == model and r["tokens"] == tokens}
        lines.append(f"| {model} | " + " | ".join(f"{by[o]['median_ms']:.2f} ({by[o]['gbps']:.0f})" for o in ops)
                     + " |")
    return lines


def simple_table(records, key, label) -> list[str]:
    lines = [f"| {label} | median ms | GB/s (unique bytes) |", "|---|---|---|"]
    lines += [f"| {key(r)} | {r['median_ms']:.3f} | {r['gbps']:.0f} |" for r in records]
    return lines


def print_tables(sec) -> None:
    print("\n".join(gemm_table(sec["gemm"]["records"])), end="\n\n")
    print("\n".join(attention_table(sec["attention"]["records"])), end="\n\n")
    print("\n".join(permute_table(sec["permute"]["records"], 65536)), end="\n\n")
    print("\n".join(simple_table(sec["fp8cast"]["records"], lambda r: f"{r['op']} {r['numel'] >> 20}M", "op")),
          end="\n\n")
    print("\n".join(simple_table(sec["memory"]["records"], lambda r: f"{r['op']} {r['variant']} {r['shape']}", "op")))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT / "costmodel" / "data" / "measured" / "nvidia-h200.json")
    ap.add_argument("--device", default="H200")
    ap.add_argument("--tables", action="store_true", help="print the measured medians as markdown tables instead")
    args = ap.parse_args(argv)
    from meshplan.costmodel.api import Pricer
    from meshplan.costmodel.attention import fused_attention_s
    from meshplan.costmodel.devices import resolve
    from meshplan.costmodel.ops import OpSpec
    try:
        data = json.loads(args.data.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"--data {args.data}: cannot read measurements ({exc})", file=sys.stderr)
        return 2
    sec = data["sections"]
    if args.tables:
        print_tables(sec)
        return 0
    pricer, dev = Pricer.shipped(), resolve(args.device)
    print("grouped expert GEMM, forward: predicted / measured (median over models and experts_local)")
    for (dtype, tpe), v in sorted(gemm_ratios(sec["gemm"]["records"], pricer, dev, OpSpec).items()):
        print(f"  {dtype:5} tokens/expert {tpe:5}: grouped {statistics.median(v['grouped']):.2f}"
              f"  dense {statistics.median(v['dense']):.2f}  (n={len(v['grouped'])})")
    print("attention, causal: predicted / measured by sequence length")
    for key, by_seq in sorted(attention_ratios(sec["attention"]["records"], dev, OpSpec, fused_attention_s).items()):
        print(f"  {key[0]:16} d={key[1]:3} {key[2]}: " + "  ".join(f"{s // 1024}k {x:.2f}" for s, x in by_seq.items()))
    print("memory-bound: predicted / measured")
    for op, variant, shape, ratio in memory_ratios(sec["memory"]["records"], pricer, dev, OpSpec):
        print(f"  {op:13} {variant:14} {shape!s:18} {ratio:.2f}")
    print("fp8 tensorwise cast (amax + cast): predicted / measured")
    for op, n, ratio in cast_ratios(sec["fp8cast"]["records"], pricer, dev, OpSpec):
        print(f"  {op:14} {n >> 20:4}M {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
