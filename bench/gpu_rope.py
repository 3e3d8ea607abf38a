"""Measure the eager chains Megatron-Core runs around GPT-OSS's fused kernels on one GPU, and keep the figures.

Section ``rope``, at GPT-OSS's attention shapes (64 query and 8 KV heads of 64 dims, 4096 tokens, micro-batch 1 and 4):
  unfused        the kernel chain Megatron-Core runs when RoPE fusion is off (``_apply_rotary_pos_emb_bshd``,
                 tests/test_rope_passes.py counts it on CPU): t * cos, rotate-half (neg of one half, cat), * sin, the
                 add, a cat with the dimensions passed through; on q and k, forward, and forward + backward
  unfused_view   the same on q and k as the strided views a fused QKV projection's split hands the attention
  copy           one clone of q and of k: one read and one write of each, the pass meshplan prices a fused RoPE at
Each case also gets the profiler's per-kernel device time.

Section ``experts``, at GPT-OSS's routed experts (fc1 out 2 x 2880, fc2 out 2880; 65,536 routed rows a rank: 16,384
tokens x top-4), forward and forward + backward:
  clamp          ``weighted_bias_quick_geglu_impl``'s clamp before its fused kernel: chunk the fc1 output, clamp each
                 half, cat them back
  bias_E         ``TEGroupedMLP._apply_bias`` with E local experts: per expert t + b * p (bf16 rows, bf16 bias, fp32
                 router probabilities), cat, cast to bf16

    PYTHONUNBUFFERED=1 python3 bench/gpu_rope.py --out nvidia-h200-rope.json
    python bench/gpu_rope.py --quick --out /tmp/r.json     # tiny shapes on CPU: checks the code paths
    python bench/gpu_rope.py --tables costmodel/data/measured/nvidia-h200-rope.json   # the kept run, as a table

Standalone (torch and the standard library, plus bench/gpu_kernels.py beside it): the GPU machine has no meshplan.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
from gpu_kernels import attempt, parse_one_file_args, run_or_tables, run_sections

# (label, tokens, micro-batch, query heads, KV heads, head dim): openai/gpt-oss-120b's hub config at TP 1
# experts: routed rows a rank, expert width, local experts (EP 64 / 16 / 8 of 128), GPT-OSS's swiglu_limit
FULL_PLAN = {"shapes": [("gpt-oss-mbs1", 4096, 1, 64, 8, 64), ("gpt-oss-mbs4", 4096, 4, 64, 8, 64)],
             "mscale": 0.1 * math.log(32.0) + 1.0, "rows": 65536, "ffn": 2880, "local_experts": [2, 8, 16],
             "clamp": 7.0}
QUICK_PLAN = {"shapes": [("tiny", 32, 2, 4, 2, 16)], "mscale": 0.1 * math.log(32.0) + 1.0, "rows": 64, "ffn": 16,
              "local_experts": [2], "clamp": 7.0}
SECTION_BUDGET_S = {"rope": 90, "experts": 90}


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = torch.chunk(x, 2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def unfused_rope(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The kernel chain of Megatron-Core's unfused RoPE: cos and sin already scaled and cast (they are [s, 1, 1, d],
    computed once per step), the pass-through dims empty (rotary over the whole head)."""
    rot = t.shape[-1]
    t, t_pass = t[..., :rot], t[..., rot:]
    return torch.cat(((t * cos) + (rotate_half(t) * sin), t_pass), dim=-1)


def inputs(shape, device, view: bool):
    """q [s, b, hq, d] and k [s, b, hkv, d] (bf16, requiring grad), contiguous or as views of one fused QKV tensor."""
    _, s, b, hq, hkv, d = shape
    if view:
        qkv = torch.randn(s, b, (hq + 2 * hkv) * d, device=device, dtype=torch.bfloat16, requires_grad=True)
        q, k, _ = torch.split(qkv, [hq * d, hkv * d, hkv * d], dim=-1)
        return q.view(s, b, hq, d), k.view(s, b, hkv, d), qkv
    q = torch.randn(s, b, hq, d, device=device, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(s, b, hkv, d, device=device, dtype=torch.bfloat16, requires_grad=True)
    return q, k, None


def freqs(s: int, d: int, mscale: float, device):
    f = torch.randn(s, 1, 1, d, device=device, dtype=torch.float32)
    return (torch.cos(f) * mscale).to(torch.bfloat16), (torch.sin(f) * mscale).to(torch.bfloat16)


def kernels_us(fn, calls: int = 3) -> dict:
    """Device time per call of each kernel the profiler saw, microseconds, and their sum."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    acts = [ProfilerActivity.CUDA] if torch.cuda.is_available() else [ProfilerActivity.CPU]
    with profile(activities=acts) as prof:
        for _ in range(calls):
            fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    want = DeviceType.CUDA if torch.cuda.is_available() else DeviceType.CPU
    per = {e.key: e.self_device_time_total / calls for e in prof.key_averages() if e.device_type == want}
    return {"total_us": sum(per.values()), "kernels": per, "calls": calls}


def case(clock, kind: str, shape, mscale: float, device) -> dict:
    label, s, b, hq, hkv, d = shape
    q, k, _ = inputs(shape, device, view=kind == "unfused_view")
    cos, sin = freqs(s, d, mscale, device)
    if kind == "copy":
        def fwd():
            return q.detach().clone(), k.detach().clone()
    else:
        def fwd():
            return unfused_rope(q, cos, sin), unfused_rope(k, cos, sin)
    rec = {"kind": kind, "shape": label, "tokens": s, "micro_batch": b, "q_heads": hq, "kv_heads": hkv,
           "head_dim": d, "elements": (hq + hkv) * s * b * d, "pass_bytes": 2 * 2 * (hq + hkv) * s * b * d}
    rec["fwd"] = clock.median_ms(lambda: fwd())
    rec["fwd_kernels"] = attempt(lambda msg: None, "profile", lambda: kernels_us(lambda: fwd()))
    if kind != "copy":
        gq, gk = torch.ones_like(q), torch.ones_like(k)

        def both():
            oq, ok = fwd()
            torch.autograd.backward((oq, ok), (gq, gk))
        rec["fwd_bwd"] = clock.median_ms(both)
        rec["fwd_bwd_kernels"] = attempt(lambda msg: None, "profile", lambda: kernels_us(both))
    return rec


def rope_section(clock, guard, plan, log) -> dict:
    records = []
    for shape in plan["shapes"]:
        for kind in ("copy", "unfused", "unfused_view"):
            if not guard.left():
                return {"records": records}
            rec = attempt(log, f"{shape[0]} {kind}", lambda: case(clock, kind, shape, plan["mscale"], clock.device))
            log(f"{shape[0]} {kind}: fwd {rec.get('fwd', {}).get('median_ms', float('nan')):.3f} ms")
            records.append({"kind": kind, "shape": shape[0], **rec})
    return {"records": records}


def clamp_chain(y: torch.Tensor, limit: float) -> torch.Tensor:
    glu, lin = y.chunk(2, -1)
    return torch.cat((glu.clamp(min=None, max=limit), lin.clamp(min=-limit, max=limit)), -1)


def bias_chain(t: torch.Tensor, biases, probs: torch.Tensor, rows: list[int]) -> torch.Tensor:
    parts = [x + b * p for x, b, p in zip(torch.split(t, rows), biases, torch.split(probs, rows))]
    return torch.cat(parts).to(t.dtype)


def timed(clock, fwd, leaves) -> dict:
    """Forward and forward + backward of ``fwd()`` (a ones gradient into ``leaves``): CUDA-event medians (they show a
    host that cannot keep the GPU fed) and the profiler's kernel time."""
    out = fwd()
    grad = torch.ones_like(out)

    def both():
        for leaf in leaves:
            leaf.grad = None
        fwd().backward(grad)
    return {"fwd": clock.median_ms(fwd), "fwd_bwd": clock.median_ms(both),
            "fwd_kernels": attempt(lambda msg: None, "profile", lambda: kernels_us(fwd)),
            "fwd_bwd_kernels": attempt(lambda msg: None, "profile", lambda: kernels_us(both))}


def experts_section(clock, guard, plan, log) -> dict:
    dev, rows, ffn, records = clock.device, plan["rows"], plan["ffn"], []
    y = torch.randn(rows, 2 * ffn, device=dev, dtype=torch.bfloat16, requires_grad=True)
    rec = attempt(log, "clamp", lambda: timed(clock, lambda: clamp_chain(y, plan["clamp"]), [y]))
    records.append({"kind": "clamp", "rows": rows, "width": 2 * ffn, **rec})
    log(f"clamp: fwd {rec.get('fwd', {}).get('median_ms', float('nan')):.3f} ms")
    t = torch.randn(rows, ffn, device=dev, dtype=torch.bfloat16, requires_grad=True)
    probs = torch.rand(rows, 1, device=dev, dtype=torch.float32, requires_grad=True)
    for experts in plan["local_experts"]:
        if not guard.left():
            break
        biases = [torch.randn(ffn, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(experts)]
        split = [rows // experts] * experts
        rec = attempt(log, f"bias_{experts}", lambda: timed(clock, lambda: bias_chain(t, biases, probs, split),
                                                               [t, probs, *biases]))
        records.append({"kind": f"bias_{experts}", "rows": rows, "width": ffn, "local_experts": experts, **rec})
        log(f"bias_{experts}: fwd {rec.get('fwd', {}).get('median_ms', float('nan')):.3f} ms")
    return {"records": records}


SECTIONS = {"rope": rope_section, "experts": experts_section}


def conventions() -> dict:
    return {"timing": "CUDA events around one call, 256 MiB written before each call to flush L2, median of up to 10 "
                      "repeats; kernels: the profiler's self device time per call, 3 calls; clocks not locked",
            "pass_bytes": "one read and one write of q and k in bf16: 2 x 2 B x (hq + hkv) x tokens x micro-batch x "
                          "head dim, what meshplan prices one RoPE pass at"}


def run(args, log) -> dict:
    return run_sections("meshplan.gpu_rope/1", SECTIONS, SECTION_BUDGET_S, QUICK_PLAN if args.quick else FULL_PLAN,
                        conventions(), args, log)


def parse(argv):
    return parse_one_file_args(__doc__, SECTIONS, 120.0, argv)


def pass_equivalents(rec: dict, copy: dict, phase: str) -> float:
    """How many one-read-one-write passes over q and k the case's time is worth, at the copy's time per pass."""
    return rec[phase]["median_ms"] / copy["fwd"]["median_ms"]


def tables(path: str) -> list[str]:
    import json
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    recs = [r for r in data["sections"]["rope"]["records"] if "fwd" in r]
    lines = [f"{data['environment'].get('device_name', '?')}, torch {data['environment']['torch']}: RoPE on q and k",
             f"{'shape':14s} {'kind':13s} {'fwd ms':>8s} {'GB/s':>6s} {'passes':>6s} "
             f"{'fwd+bwd ms':>10s} {'passes':>6s}"]
    for shape in dict.fromkeys(r["shape"] for r in recs):
        copy = next(r for r in recs if r["shape"] == shape and r["kind"] == "copy")
        for r in (x for x in recs if x["shape"] == shape):
            gbs = r["pass_bytes"] / (r["fwd"]["median_ms"] * 1e-3) / 1e9
            both = r.get("fwd_bwd")
            lines.append(f"{shape:14s} {r['kind']:13s} {r['fwd']['median_ms']:8.3f} {gbs:6.0f} "
                         f"{pass_equivalents(r, copy, 'fwd'):6.1f} "
                         + (f"{both['median_ms']:10.3f} {pass_equivalents(r, copy, 'fwd_bwd'):6.1f}" if both else ""))
    lines.append("passes: the time over one copy of q and k (one read and one write each); GB/s: one pass's bytes over "
                 "the time")
    experts = [r for r in data["sections"].get("experts", {}).get("records", []) if "fwd" in r]
    if experts:
        lines.append(f"{'experts':14s} {'rows x width':>13s} {'fwd ms':>8s} {'kernels':>8s} {'fwd+bwd ms':>10s} "
                     f"{'kernels':>8s}")
    for r in experts:
        kern = [(r.get(k) or {}).get("total_us", float("nan")) / 1e3 for k in ("fwd_kernels", "fwd_bwd_kernels")]
        lines.append(f"{r['kind']:14s} {r['rows']:>6d} x {r['width']:<5d} {r['fwd']['median_ms']:8.3f} {kern[0]:8.3f} "
                     f"{r['fwd_bwd']['median_ms']:10.3f} {kern[1]:8.3f}")
    return lines


def main(argv=None) -> int:
    return run_or_tables(parse(argv), run, tables)


if __name__ == "__main__":
    sys.exit(main())
