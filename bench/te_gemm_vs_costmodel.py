"""Set the shipped cost model's prices beside Transformer Engine's own GEMM benchmark (NVIDIA/TransformerEngine PR
#2863, ``docs/examples/gemm_profiling``; ``costmodel/data/published/te_gemm_profiling.json``): the twelve GEMMs of
one layer (hidden 4096, intermediate 16384, 15,872 tokens) per recipe, on a B300 and an H200 NVL.

Each published pass sum is priced the way the planner prices a decoder GEMM (``ops_graph.gemm_ops``: the GEMM and
its input's quantize passes), one-shot as the benchmark ran (100 calls, well under a second):

- ``prequantized``: the GEMM alone;
- ``autocast``: ``te.Linear`` forward, which quantizes its input (rowwise and columnwise: the weight needs grad)
  and its weight (rowwise) on every call: the GEMM, the input's quantize ops and the same ops over the K x N weight.
  meshplan's ``cast`` moves 4 B an element (reads 2, writes 2), an MXFP8 input's two 1-byte copies and their
  scales; for the weight's single copy, and a tensor-wise input's (one layout serves both on Blackwell), it counts
  a byte more than moves. The dgrad / wgrad rows are forward calls at swapped shapes, priced as such.

The B300 constants (``costmodel.te_gemm``) rest on the pre-quantized sums and the bf16 runs; the quantized autocast
sums set nothing and check the quantize passes. Delayed scaling always runs under autocast (its amax history), so
its pre-quantized rows are left out. The H200 NVL is a 600 W card meshplan's catalogue does not hold:
only its ratios between recipes are compared, priced on the H200 (SXM).

    python bench/te_gemm_vs_costmodel.py [--json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Transformer Engine's recipe names -> meshplan's (dtype, fp8 recipe)
RECIPES = {"BF16": ("bf16", "none"), "FP8Current": ("fp8", "tensorwise"), "FP8Delayed": ("fp8", "delayed"),
           "FP8Block": ("fp8", "blockwise"), "MXFP8": ("fp8", "mxfp8"), "NVFP4": ("nvfp4", "nvfp4")}
PRICED_ON = {"B300": "B300", "H200 NVL": "H200"}


def priced_pass_ms(pricer, device_name: str, recipe: str, mode: str, which: str) -> float:
    """Priced ms of one published pass (four GEMMs) under ``recipe`` in ``mode``."""
    from meshplan.costmodel import te_gemm
    from meshplan.costmodel.devices import catalogue
    from meshplan.planner.estimate.ops_graph import gemm_ops

    dev, (dtype, rec) = catalogue()[device_name], RECIPES[recipe]
    total_s = 0.0
    for m, k, n in te_gemm.shapes(which):
        ops = list(gemm_ops(dtype, rec, m, n, k))
        if mode == "prequantized":
            ops = [o for o in ops if o.kind == "matmul"]
        else:  # the weight, K x N, quantized by the same passes as an input
            ops += [o for o in gemm_ops(dtype, rec, k, 1, n) if o.kind != "matmul"]
        total_s += sum(pricer.predict(o, dev) for o in ops)
    return total_s * 1e3


def rows(pricer) -> list[dict]:
    """One row per (part, mode, recipe): measured and priced sums over the twelve GEMMs, and each recipe's ratio to
    the part's tensor-wise fp8 sum in the same mode."""
    from meshplan.costmodel import te_gemm

    data = te_gemm.published_file(te_gemm.DATA_FILE)["devices"]
    out = []
    for part, priced_on in PRICED_ON.items():
        for mode, recipes in data[part]["pass_ms"].items():
            for recipe, passes in recipes.items():
                if (mode, recipe) == ("prequantized", "FP8Delayed"):
                    continue  # the benchmark runs delayed scaling under autocast in both modes
                measured = sum(passes.values())
                priced = sum(priced_pass_ms(pricer, priced_on, recipe, mode, p) for p in passes)
                out.append({"part": part, "priced_on": priced_on, "mode": mode, "recipe": recipe,
                            "measured_ms": round(measured, 3), "priced_ms": round(priced, 3),
                            "priced_over_measured": round(priced / measured, 3)})
            ref = {r["recipe"]: r for r in out if r["part"] == part and r["mode"] == mode}
            for r in ref.values():
                if "FP8Current" in ref:
                    r["measured_vs_fp8current"] = round(r["measured_ms"] / ref["FP8Current"]["measured_ms"], 3)
                    r["priced_vs_fp8current"] = round(r["priced_ms"] / ref["FP8Current"]["priced_ms"], 3)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args(argv)
    from meshplan.costmodel.api import Pricer

    table = rows(Pricer.shipped())
    if args.json:
        print(json.dumps(table, indent=1))
        return 0
    head = ("part", "mode", "recipe", "measured ms", "priced ms", "priced/measured", "measured/FP8Current",
            "priced/FP8Current")
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in table:
        print(f"| {r['part']} (priced as {r['priced_on']}) | {r['mode']} | {r['recipe']} | {r['measured_ms']:.3f} | "
              f"{r['priced_ms']:.3f} | {r['priced_over_measured']:.3f} | {r.get('measured_vs_fp8current', '')} | "
              f"{r.get('priced_vs_fp8current', '')} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
