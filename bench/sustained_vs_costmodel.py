"""Set the shipped cost model's prices beside the workloads ``bench/gpu_sustained.py`` held on one GPU: the bf16 and
fp8 GEMMs, the Llama-3.1-70B decoder layer at TP 8 (8,192 tokens) and the Qwen3-30B-A3B layer as one GPU of EP 8
runs it (16,384 tokens), forward + backward.

Each workload is priced the way the planner prices its kernels: one-shot (``Pricer()``) and under sustained load
(``Pricer(sustained=True)``, what ``GpuEstimator`` uses). The layer is its kernels summed: the four projections and
their two backward GEMMs each, causal attention forward and backward, two RMSNorms, SwiGLU and two residual adds
(memory-bound kernels' backward at twice their forward, the estimator's rule). The script ran the layer through
SDPA's default backend, which it did not record, so both FlashAttention-2 and cuDNN prices are shown. Printed:
priced one-shot over the first second's measured time, and priced under load over the steady time.

    python bench/sustained_vs_costmodel.py [FILE ...]    (default: costmodel/data/measured/*-sustained*.json)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from gpu_sustained import LAYER_70B_TP8 as LAYER  # noqa: E402 -- the shapes the script held

DEVICE_OF = {"NVIDIA H200": "H200", "NVIDIA H100 80GB HBM3": "H100-SXM"}


def layer_ops(tokens: int, attention: str):
    """(op, count, backward priced as its own op) of the measured layer's kernels."""
    from meshplan.costmodel.ops import OpSpec

    h, d, f = LAYER["hidden"], LAYER["head_dim"], LAYER["ffn"]
    qkv = (LAYER["q_heads"] + 2 * LAYER["kv_heads"]) * d
    gemms = [(tokens, qkv, h), (tokens, h, LAYER["q_heads"] * d), (tokens, 2 * f, h), (tokens, h, f)]
    ops = [(OpSpec("matmul", s, "bf16"), 1, True) for s in gemms]
    ops.append((OpSpec("attention", (1, LAYER["q_heads"], tokens, tokens, d), "bf16", causal=True, impl=attention),
                1, True))
    ops += [(OpSpec("rmsnorm", (tokens, h), "bf16"), 2, False), (OpSpec("swiglu", (tokens * f,), "bf16"), 1, False),
            (OpSpec("elementwise", (tokens * h,), "bf16"), 2, False)]
    return ops


def moe_layer_ops(plan: dict, attention: str):
    """(op, count, backward priced as its own op) of the measured Qwen3-30B layer (bench/gpu_sustained.py
    ``moe_attention`` + ``moe_experts``): per-head q/k norms; the router; the token copies gathered, weighted and
    scattered back (index_add_) as memory passes; the local experts as grouped GEMMs of their balanced rows."""
    from meshplan.costmodel.ops import OpSpec

    m, t, local, batch = plan["moe"], plan["moe_tokens"], plan["moe_local_experts"], plan["moe_batch"]
    h, d, f, k = m["hidden"], m["head_dim"], m["moe_ffn"], m["topk"]
    copies, seq = t * k, t // batch
    qkv = (m["q_heads"] + 2 * m["kv_heads"]) * d
    own = [OpSpec("matmul", (t, qkv, h), "bf16"), OpSpec("matmul", (t, h, m["q_heads"] * d), "bf16"),
           OpSpec("matmul", (t, m["experts"], h), "bf16"),
           OpSpec("attention", (batch, m["q_heads"], seq, seq, d), "bf16", causal=True, impl=attention),
           OpSpec("matmul", (copies // local, 2 * f, h), "bf16", groups=local),
           OpSpec("matmul", (copies // local, h, f), "bf16", groups=local)]
    doubled = [(OpSpec("rmsnorm", (t, h), "bf16"), 2), (OpSpec("rmsnorm", (t * m["q_heads"], d), "bf16"), 1),
               (OpSpec("rmsnorm", (t * m["kv_heads"], d), "bf16"), 1),
               (OpSpec("softmax", (t, m["experts"]), "fp32"), 1),
               (OpSpec("copy", (copies * h,), "bf16"), 2), (OpSpec("swiglu", (copies * f,), "bf16"), 1),
               (OpSpec("elementwise", (copies * h,), "bf16"), 1), (OpSpec("elementwise", (t * h,), "bf16"), 3)]
    return [(op, 1, True) for op in own] + [(op, n, False) for op, n in doubled]


def priced_s(pricer, ops, dev) -> float:
    from dataclasses import replace

    total = 0.0
    for op, n, bwd_own in ops:
        bwd = pricer.predict(replace(op, backward=True), dev) if bwd_own else 2.0 * pricer.predict(op, dev)
        total += n * (pricer.predict(op, dev) + bwd)
    return total


def workload_ops(name: str, rec: dict, plan: dict):
    from meshplan.costmodel.ops import OpSpec

    if name == "layer_bf16":
        return {f"layer ({a})": layer_ops(plan["layer_tokens"], a) for a in ("flash2", "cudnn")}
    if name == "moe_layer_bf16":
        return {f"qwen3-30b MoE layer ({a})": moe_layer_ops(plan, a) for a in ("flash2", "cudnn")}
    n = plan["gemm_mnk"]
    dtype = "fp8" if name == "gemm_fp8" else "bf16"
    op = OpSpec("matmul", (n, n, n), dtype, impl="tensorwise" if dtype == "fp8" else "")
    return {name: [(op, 1, False)]}


def compare(path: Path) -> list[dict]:
    """One record per held workload (the layer once per attention backend) of a measurement file: the measured first
    second and steady times per call, and the one-shot and under-load prices, ms."""
    from meshplan.costmodel.api import Pricer
    from meshplan.costmodel.devices import catalogue

    data = json.loads(path.read_text(encoding="utf-8"))
    dev = catalogue()[DEVICE_OF[data["environment"]["device_name"]]]
    shot, load = Pricer.shipped(), Pricer.shipped().under_load()
    out = []
    held = {**data["sections"].get("sustain", {}).get("records", {}),
            **data["sections"].get("moe", {}).get("records", {})}
    for name, rec in held.items():
        s = rec["summary"]
        first_ms = rec["flops_per_call"] / (s["first_second_max_tflops"] * 1e12) * 1e3
        steady_ms = rec["flops_per_call"] / (s["steady_median_tflops"] * 1e12) * 1e3
        for label, ops in workload_ops(name, rec, data["plan"]).items():
            if label == name:  # a lone GEMM: priced as one call, its backward not part of the workload
                one, under = shot.predict(ops[0][0], dev) * 1e3, load.predict(ops[0][0], dev) * 1e3
            else:
                one, under = priced_s(shot, ops, dev) * 1e3, priced_s(load, ops, dev) * 1e3
            out.append({"file": path.name, "device": dev.name, "workload": label, "first_ms": first_ms,
                        "one_shot_ms": one, "steady_ms": steady_ms, "under_load_ms": under,
                        "measured_share": s["steady_over_first_second_max"], "priced_share": one / under})
    return out


def rows(path: Path) -> list[str]:
    return [f"| {r['file']} | {r['device']} | {r['workload']} | {r['first_ms']:.2f} | {r['one_shot_ms']:.2f} | "
            f"{r['one_shot_ms'] / r['first_ms']:.3f} | {r['steady_ms']:.2f} | {r['under_load_ms']:.2f} | "
            f"{r['under_load_ms'] / r['steady_ms']:.3f} | {r['measured_share']:.3f} | {r['priced_share']:.3f} |"
            for r in compare(path)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path)
    args = ap.parse_args(argv)
    files = args.files or sorted((ROOT / "costmodel" / "data" / "measured").glob("*-sustained*.json"))
    print("| file | device | workload | first, ms | priced one-shot | ratio | steady, ms | priced under load | ratio "
          "| steady / first | priced share |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for path in files:
        try:
            lines = rows(path)
            if lines:
                print("\n".join(lines))
        except (OSError, ValueError, KeyError) as exc:
            print(f"{path}: not a bench/gpu_sustained.py file ({type(exc).__name__}: {exc})", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
