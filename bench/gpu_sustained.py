"""Measure what a one-shot kernel benchmark cannot: the rate a GPU sustains under minutes of training-like work, the
host's cost of launching a kernel, and fp8 GEMMs under each scaling recipe with their quantize passes.

Sections (each under its own time guard; the file is rewritten after every section so a cut run keeps what it has):
  sustain  three workloads held for --hold-s each, timed in windows of about 0.25 s, with nvidia-smi sampled every
           200 ms (SM clock, power, temperature, clock-event reasons): a dense bf16 GEMM, a dense fp8 GEMM, and the
           forward + backward of one Llama-3.1-70B decoder layer as tensor parallelism of 8 leaves it on a GPU
  launch   the host's cost of one eager kernel launch (enqueued behind a GPU sleep, so the CPU time is all launch),
           eager kernels back to back, and the same kernels replayed from a CUDA graph
  duty     the bf16 GEMM in ~20 ms bursts between near-idle gaps (a GPU sleep), at busy fractions 0.8 / 0.6 / 0.4:
           how much of the power-cap drop a step that waits on communication keeps
  fp8gemm  dense GEMMs at the projection shapes of Llama 3.1 8B and 70B (TP 8): bf16, fp8 tensorwise (fast and split
           accumulation), fp8 rowwise, fp8 blockwise (1x128 activations, 128x128 weights, DeepSeek-V3's recipe);
           and the quantize pass each recipe needs, torch.compile'd

    PYTHONUNBUFFERED=1 python3 bench/gpu_sustained.py --out nvidia-h200-sustained.json
    python bench/gpu_sustained.py --quick --out /tmp/s.json     # tiny shapes on CPU: checks the code paths

Standalone like bench/gpu_kernels.py (torch and the standard library), whose timing helpers it shares.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from gpu_kernels import (
    FP8,
    FP8_MAX,
    attempt,
    check_sections,
    compiled,
    empty_cache,
    error_line,
    rate,
    run_or_tables,
    run_sections,
)

SMI_FIELDS = ("clocks.sm", "power.draw", "temperature.gpu", "clocks_event_reasons.active",
              "clocks_event_reasons.sw_power_cap", "clocks_event_reasons.sw_thermal_slowdown",
              "clocks_event_reasons.hw_slowdown")

# Llama-3.1-70B (HF config planner/presets/models/llama-3.1-70b-instruct.json): hidden 8192, 64 query heads, 8 KV
# heads, head dim 128, intermediate 28672. Tensor parallelism of 8 leaves 8 query heads, 1 KV head and 3584 of the
# MLP on each GPU.
LAYER_70B_TP8 = {"hidden": 8192, "q_heads": 8, "kv_heads": 1, "head_dim": 128, "ffn": 3584}
# Qwen3-30B-A3B (HF config planner/presets/models/qwen3-30b-a3b.json): hidden 2048, 32 query heads, 4 KV heads,
# head dim 128, per-head q/k RMSNorm, 128 routed experts of width 768, top-8 with renormalised probabilities. One GPU
# of EP 8 holds 16 experts and, with balanced routing, computes as many token copies as its own tokens send out.
QWEN3_30B = {"hidden": 2048, "q_heads": 32, "kv_heads": 4, "head_dim": 128, "moe_ffn": 768, "experts": 128,
             "topk": 8}
# Dense projection shapes (K, N) per GPU: Llama 3.1 8B unsplit (hidden 4096, 32/8 heads, ffn 14336) and 70B at TP 8.
FP8_SHAPES = {
    "8b.qkv": (4096, 6144), "8b.proj": (4096, 4096), "8b.fc1": (4096, 28672), "8b.fc2": (14336, 4096),
    "70b-tp8.qkv": (8192, 1280), "70b-tp8.proj": (1024, 8192), "70b-tp8.fc1": (8192, 7168),
    "70b-tp8.fc2": (3584, 8192),
}
FULL_PLAN = {"hold_s": {"gemm_bf16": 40.0, "gemm_fp8": 25.0, "layer_bf16": 40.0}, "idle_s": 4.0, "gemm_mnk": 8192,
             "layer_tokens": 8192, "layer": LAYER_70B_TP8, "fp8_m": [1024, 4096, 16384], "fp8_shapes": FP8_SHAPES,
             "launch_n": 2000,
             "quant_m": [4096, 16384], "compile": True, "launch_linear": 4096, "duties": [0.8, 0.6, 0.4],
             "duty_hold_s": 15.0, "duty_burst_ms": 20.0,
             "moe": QWEN3_30B, "moe_local_experts": 16, "moe_tokens": 16384, "moe_batch": 4, "moe_hold_s": 30.0}
QUICK_PLAN = {"hold_s": {"gemm_bf16": 0.3, "gemm_fp8": 0.3, "layer_bf16": 0.3}, "idle_s": 0.05, "gemm_mnk": 256,
              "layer_tokens": 256, "layer": {"hidden": 256, "q_heads": 4, "kv_heads": 1, "head_dim": 32, "ffn": 512},
              "fp8_m": [256], "fp8_shapes": {"8b.proj": (256, 256), "70b-tp8.qkv": (512, 256)},
              "launch_n": 50, "quant_m": [256], "compile": False, "launch_linear": 64, "duties": [0.5],
              "duty_hold_s": 0.3, "duty_burst_ms": 5.0,
              "moe": {"hidden": 128, "q_heads": 4, "kv_heads": 2, "head_dim": 32, "moe_ffn": 64, "experts": 16,
                      "topk": 4}, "moe_local_experts": 4, "moe_tokens": 256, "moe_batch": 2, "moe_hold_s": 0.3}


# --------------------------------------------------------------------------------------------------- nvidia-smi
class SmiSampler:
    """nvidia-smi in loop mode (-lms) on a reader thread; each line is stamped with the monotonic clock on arrival."""

    def __init__(self, period_ms: int = 200):
        self.samples: list[dict] = []
        self.fields = SMI_FIELDS
        self.proc = None
        for fields in (SMI_FIELDS, SMI_FIELDS[:3]):  # older drivers lack the clock-event fields
            if self._fields_ok(fields):
                self.fields = fields
                self.proc = subprocess.Popen(
                    ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits",
                     f"-lms={period_ms}"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                threading.Thread(target=self._read, daemon=True).start()
                break

    @staticmethod
    def _fields_ok(fields) -> bool:
        try:
            out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20, check=False)
            return out.returncode == 0 and "Field" not in out.stdout
        except (OSError, subprocess.SubprocessError):
            return False

    def _read(self) -> None:
        for line in self.proc.stdout:
            values = [v.strip() for v in line.split(",")]
            if len(values) == len(self.fields):
                self.samples.append({"t": time.monotonic(), **dict(zip(self.fields, values))})

    def between(self, t0: float, t1: float) -> list[dict]:
        return [{**s, "t": round(s["t"] - t0, 3)} for s in self.samples if t0 <= s["t"] <= t1]

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()


def _num(sample: dict, key: str) -> float | None:
    try:
        return float(sample[key])
    except (KeyError, ValueError):
        return None


# ------------------------------------------------------------------------------------------------------ sustain
def gemm_workload(device, mnk: int, dtype: str):
    a = torch.randn(mnk, mnk, device=device, dtype=torch.bfloat16)
    b = torch.randn(mnk, mnk, device=device, dtype=torch.bfloat16).t()
    flops = 2.0 * mnk ** 3
    if dtype == "bf16":
        return (lambda: torch.mm(a, b)), flops
    a8, b8 = a.to(FP8), b.to(FP8)
    one = torch.ones((), device=device, dtype=torch.float32)
    return (lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)), flops


def layer_weights(shape: dict, device) -> dict:
    h, d, f = shape["hidden"], shape["head_dim"], shape["ffn"]
    qkv = (shape["q_heads"] + 2 * shape["kv_heads"]) * d

    def w(k, n):
        return (torch.randn(n, k, device=device, dtype=torch.bfloat16) * k ** -0.5).requires_grad_()
    return {"qkv": w(h, qkv), "proj": w(shape["q_heads"] * d, h), "fc1": w(h, 2 * f), "fc2": w(f, h),
            "norm1": torch.ones(h, device=device, dtype=torch.bfloat16, requires_grad=True),
            "norm2": torch.ones(h, device=device, dtype=torch.bfloat16, requires_grad=True)}


def layer_forward(x, w: dict, shape: dict):
    """One pre-norm decoder layer (Megatron-core GPT layer order): norm, QKV, causal GQA attention, projection,
    residual; norm, fused gate+up, SwiGLU, down projection, residual."""
    t, h = x.shape
    hq, hkv, d = shape["q_heads"], shape["kv_heads"], shape["head_dim"]
    qkv = F.linear(F.rms_norm(x, (h,), w["norm1"]), w["qkv"])
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    q, k, v = (z.view(1, t, -1, d).transpose(1, 2) for z in (q, k, v))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    x = x + F.linear(o.transpose(1, 2).reshape(t, hq * d), w["proj"])
    gate, up = F.linear(F.rms_norm(x, (h,), w["norm2"]), w["fc1"]).chunk(2, dim=-1)
    return x + F.linear(F.silu(gate) * up, w["fc2"])


def layer_workload(device, tokens: int, shape: dict = LAYER_70B_TP8):
    """Forward + backward of one layer; model FLOPs: 3 x the GEMMs' forward, attention forward + 2.5 x it
    backward (causal, FlashAttention-2 convention)."""
    w = layer_weights(shape, device)
    x = torch.randn(tokens, shape["hidden"], device=device, dtype=torch.bfloat16, requires_grad=True)
    gemm_fwd = 2.0 * tokens * sum(p.shape[0] * p.shape[1] for k, p in w.items() if not k.startswith("norm"))
    attn_fwd = 4.0 * tokens ** 2 * shape["q_heads"] * shape["head_dim"] / 2

    def step():
        layer_forward(x, w, shape).sum().backward()
    return step, 3 * gemm_fwd + 3.5 * attn_fwd


def hold(fn, flops: float, hold_s: float, device) -> list[dict]:
    """Run fn back to back for hold_s; one record per window of ~0.25 s: start time, calls, achieved TFLOP/s."""
    windows, t_start = [], time.monotonic()
    calls = 1
    while time.monotonic() - t_start < hold_s:
        t0 = time.monotonic()
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
        else:
            for _ in range(calls):
                fn()
            ms = (time.monotonic() - t0) * 1e3
        windows.append({"t": round(t0 - t_start, 3), "calls": calls, "ms": ms,
                        "tflops": rate(flops * calls, ms) / 1e12})
        calls = max(1, int(calls * 250.0 / max(ms, 1e-3)))
    return windows


def summarize(windows: list[dict], smi: list[dict], hold_s: float) -> dict:
    """First window (a cold GPU, what a one-shot benchmark sees), the last 40% of the hold (steady), their ratio,
    and the SM clock and power over the steady part."""
    steady_t = 0.6 * hold_s
    steady = [w["tflops"] for w in windows if w["t"] >= steady_t] or [windows[-1]["tflops"]]
    first_s = [w["tflops"] for w in windows if w["t"] < 1.0]
    out = {"first_window_tflops": windows[0]["tflops"], "first_second_max_tflops": max(first_s),
           "steady_median_tflops": statistics.median(steady), "steady_from_s": steady_t}
    out["steady_over_first_second_max"] = out["steady_median_tflops"] / out["first_second_max_tflops"]
    for key, name in (("clocks.sm", "sm_mhz"), ("power.draw", "power_w"), ("temperature.gpu", "temp_c")):
        vals = [v for v in (_num(s, key) for s in smi if s["t"] >= steady_t) if v is not None]
        out[f"steady_median_{name}"] = statistics.median(vals) if vals else None
        first = [v for v in (_num(s, key) for s in smi if s["t"] < 1.0) if v is not None]
        out[f"first_second_max_{name}"] = max(first) if first else None
    return out


def sustain_section(clock, guard, plan, log) -> dict:
    sampler = SmiSampler() if clock.cuda else None
    records = {}
    makers = {"gemm_bf16": lambda: gemm_workload(clock.device, plan["gemm_mnk"], "bf16"),
              "gemm_fp8": lambda: gemm_workload(clock.device, plan["gemm_mnk"], "fp8"),
              "layer_bf16": lambda: layer_workload(clock.device, plan["layer_tokens"], plan["layer"])}
    try:
        for name, make in makers.items():
            hold_s = plan["hold_s"][name]
            if not guard.left(need_s=hold_s + plan["idle_s"]):
                break
            time.sleep(plan["idle_s"])  # let the clock recover between workloads; the sampler records it
            records[name] = attempt(log, f"sustain {name}", lambda: _hold_one(make, hold_s, clock, sampler))
            if "summary" in records[name]:
                s = records[name]["summary"]
                log(f"sustain {name}: first second {s['first_second_max_tflops']:.0f} -> steady "
                    f"{s['steady_median_tflops']:.0f} TFLOP/s ({s['steady_over_first_second_max']:.3f}), "
                    f"SM {s['steady_median_sm_mhz']} MHz, {s['steady_median_power_w']} W")
            empty_cache()
    finally:
        if sampler is not None:
            sampler.stop()
    return {"smi_fields": list(sampler.fields) if sampler else [], "records": records}


def _hold_one(make, hold_s: float, clock, sampler) -> dict:
    fn, flops = make()
    fn()  # first call: cuBLAS / cuDNN heuristics and workspace, outside the timed hold
    if clock.cuda:
        torch.cuda.synchronize()
    t0 = time.monotonic()
    windows = hold(fn, flops, hold_s, clock.device)
    smi = sampler.between(t0 - 1.0, time.monotonic()) if sampler else []
    smi = [{**s, "t": round(s["t"] - 1.0, 3)} for s in smi]
    return {"flops_per_call": flops, "hold_s": hold_s, "windows": windows, "smi": smi,
            "summary": summarize(windows, smi, hold_s)}


# --------------------------------------------------------------------------------------------------------- duty
def duty_cycles(fn, flops: float, burst_calls: int, gap_cycles: int, hold_s: float, device) -> list[dict]:
    """Bursts of ``burst_calls`` calls, each followed by a GPU sleep of ``gap_cycles`` SM cycles (one spinning
    thread: the GPU nearly idle, as it is while a collective waits on the network), for ``hold_s``; one record per
    burst: start, burst and gap times (CUDA events), the burst's rate."""
    out, t_start = [], time.monotonic()
    while time.monotonic() - t_start < hold_s:
        t0 = time.monotonic()
        if device.type != "cuda":
            for _ in range(burst_calls):
                fn()
            burst_ms, gap_ms = (time.monotonic() - t0) * 1e3, 0.0
        else:
            e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            e0.record()
            for _ in range(burst_calls):
                fn()
            e1.record()
            torch.cuda._sleep(gap_cycles)
            e2.record()
            e2.synchronize()
            burst_ms, gap_ms = e0.elapsed_time(e1), e1.elapsed_time(e2)
        out.append({"t": round(t0 - t_start, 3), "burst_ms": burst_ms, "gap_ms": gap_ms,
                    "tflops": rate(flops * burst_calls, burst_ms) / 1e12})
    return out


def duty_section(clock, guard, plan, log) -> dict:
    """The bf16 GEMM of ``sustain`` in bursts of ~20 ms separated by near-idle gaps, at several busy fractions:
    how much of the power-cap drop a step with exposed communication keeps."""
    sampler = SmiSampler() if clock.cuda else None
    fn, flops = gemm_workload(clock.device, plan["gemm_mnk"], "bf16")
    fn()
    first_ms = clock.median_ms(fn)["median_ms"]
    burst_calls = max(1, int(plan["duty_burst_ms"] / first_ms))
    records = {}
    try:
        for duty in plan["duties"]:
            hold_s = plan["duty_hold_s"]
            if not guard.left(need_s=hold_s + plan["idle_s"]):
                break
            time.sleep(plan["idle_s"])
            gap_s = burst_calls * first_ms * 1e-3 * (1 - duty) / duty
            t0 = time.monotonic()
            cycles = duty_cycles(fn, flops, burst_calls, int(gap_s * 1.98e9), hold_s, clock.device)
            smi = sampler.between(t0 - 1.0, time.monotonic()) if sampler else []
            smi = [{**x, "t": round(x["t"] - 1.0, 3)} for x in smi]
            steady = [c for c in cycles if c["t"] >= 0.6 * hold_s] or cycles[-1:]
            busy = sum(c["burst_ms"] for c in steady) / sum(c["burst_ms"] + c["gap_ms"] for c in steady)
            summary = {"busy_fraction": busy, "first_burst_tflops": cycles[0]["tflops"],
                       "steady_median_tflops": statistics.median(c["tflops"] for c in steady)}
            summary["steady_over_first_burst"] = summary["steady_median_tflops"] / summary["first_burst_tflops"]
            vals = [v for v in (_num(x, "clocks.sm") for x in smi if x["t"] >= 0.6 * hold_s) if v is not None]
            summary["steady_median_sm_mhz"] = statistics.median(vals) if vals else None
            records[f"{duty:.2f}"] = {"target_duty": duty, "burst_calls": burst_calls, "hold_s": hold_s,
                                      "cycles": cycles, "smi": smi, "summary": summary}
            log(f"duty {duty:.2f}: busy {busy:.2f}, first burst {summary['first_burst_tflops']:.0f} -> steady "
                f"{summary['steady_median_tflops']:.0f} TFLOP/s ({summary['steady_over_first_burst']:.3f}), "
                f"SM {summary['steady_median_sm_mhz']} MHz")
    finally:
        if sampler is not None:
            sampler.stop()
    return {"flops_per_call": flops, "one_call_ms": first_ms, "records": records}


# ---------------------------------------------------------------------------------------------------- MoE layer
def moe_weights(shape: dict, local: int, device) -> dict:
    h, d, f = shape["hidden"], shape["head_dim"], shape["moe_ffn"]

    def w(*dims, fan_in):
        return (torch.randn(*dims, device=device, dtype=torch.bfloat16) * fan_in ** -0.5).requires_grad_()
    ones = {k: torch.ones(n, device=device, dtype=torch.bfloat16, requires_grad=True)
            for k, n in (("norm1", h), ("norm2", h), ("q_norm", d), ("k_norm", d))}
    return {"qkv": w((shape["q_heads"] + 2 * shape["kv_heads"]) * d, h, fan_in=h),
            "proj": w(h, shape["q_heads"] * d, fan_in=shape["q_heads"] * d),
            "router": w(shape["experts"], h, fan_in=h), "gate_up": w(local, h, 2 * f, fan_in=h),
            "down": w(local, f, h, fan_in=f), **ones}


def moe_attention(x, w: dict, shape: dict, batch: int):
    t, h = x.shape
    hq, hkv, d = shape["q_heads"], shape["kv_heads"], shape["head_dim"]
    q, k, v = F.linear(F.rms_norm(x, (h,), w["norm1"]), w["qkv"]).split([hq * d, hkv * d, hkv * d], dim=-1)
    q = F.rms_norm(q.view(batch, -1, hq, d), (d,), w["q_norm"]).transpose(1, 2)
    k = F.rms_norm(k.view(batch, -1, hkv, d), (d,), w["k_norm"]).transpose(1, 2)
    v = v.view(batch, -1, hkv, d).transpose(1, 2)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return x + F.linear(o.transpose(1, 2).reshape(t, hq * d), w["proj"])


def moe_experts(x, w: dict, shape: dict, local: int, grouped: bool):
    """Router (softmax, top-k, renormalised), the copies sorted to the local experts (expert id modulo the local
    count: what a balanced all-to-all hands this GPU), gate+up and down as grouped GEMMs, SwiGLU, and the weighted
    sum back to token order with index_add_."""
    t, h = x.shape
    y = F.rms_norm(x, (h,), w["norm2"])
    probs, idx = torch.topk(torch.softmax(F.linear(y, w["router"]).float(), dim=-1), shape["topk"], dim=-1)
    probs = (probs / probs.sum(dim=-1, keepdim=True)).to(x.dtype)
    local_id = (idx % local).flatten()
    order = torch.argsort(local_id, stable=True)
    token = order // shape["topk"]
    counts = torch.bincount(local_id, minlength=local)
    rows = y[token]
    if grouped:
        offs = torch.cumsum(counts, 0).to(torch.int32)
        gate, up = torch._grouped_mm(rows, w["gate_up"], offs=offs).chunk(2, dim=-1)
        out = torch._grouped_mm(F.silu(gate) * up, w["down"], offs=offs)
    else:  # per-expert loop: where the grouped kernel does not run (recorded as the section's path)
        parts, start = [], 0
        for e, n in enumerate(counts.tolist()):
            g, u = (rows[start:start + n] @ w["gate_up"][e]).chunk(2, dim=-1)
            parts.append((F.silu(g) * u) @ w["down"][e])
            start += n
        out = torch.cat(parts)
    out = out * probs.flatten()[order].unsqueeze(-1)
    return x + torch.zeros_like(x).index_add_(0, token, out)


def moe_layer_workload(device, plan: dict, grouped: bool):
    shape, local, tokens, batch = plan["moe"], plan["moe_local_experts"], plan["moe_tokens"], plan["moe_batch"]
    w = moe_weights(shape, local, device)
    x = torch.randn(tokens, shape["hidden"], device=device, dtype=torch.bfloat16, requires_grad=True)
    h, d, f, k = shape["hidden"], shape["head_dim"], shape["moe_ffn"], shape["topk"]
    seq = tokens // batch
    gemm_fwd = 2.0 * tokens * h * ((shape["q_heads"] + 2 * shape["kv_heads"]) * d + shape["q_heads"] * d
                                   + shape["experts"]) + 2.0 * tokens * k * 3 * h * f
    attn_fwd = 4.0 * batch * seq * seq * shape["q_heads"] * d / 2

    def step():
        moe_experts(moe_attention(x, w, shape, batch), w, shape, local, grouped).sum().backward()
    return step, 3 * gemm_fwd + 3.5 * attn_fwd, (x, w)


def moe_phases(clock, plan: dict, grouped: bool, x, w) -> dict:
    """Forward only, per part (median of 5 calls, no grad): the attention block, and the MoE block."""
    shape, local, batch = plan["moe"], plan["moe_local_experts"], plan["moe_batch"]
    with torch.no_grad():
        a = moe_attention(x, w, shape, batch)
        return {"attention_block_fwd": clock.median_ms(lambda: moe_attention(x, w, shape, batch), reps=5),
                "moe_block_fwd": clock.median_ms(lambda: moe_experts(a, w, shape, local, grouped), reps=5)}


def moe_section(clock, guard, plan, log) -> dict:
    """One Qwen3-30B-A3B decoder layer, forward + backward, held like ``sustain``'s workloads, as one GPU of EP 8
    runs it (16 local experts, its micro-batch's token copies); then its forward parts timed alone."""
    sampler = SmiSampler() if clock.cuda else None
    grouped = True
    try:
        fn, flops, (x, w) = moe_layer_workload(clock.device, plan, grouped)
        try:
            fn()
        except RuntimeError as exc:  # no grouped kernel (or its backward) here: the per-expert loop
            log(f"moe: grouped GEMM unavailable ({error_line(exc)}); per-expert loop")
            grouped = False
            fn, flops, (x, w) = moe_layer_workload(clock.device, plan, grouped)
        rec = _hold_one(lambda: (fn, flops), plan["moe_hold_s"], clock, sampler)
        rec["path"] = "torch._grouped_mm" if grouped else "loop of torch.mm"
        rec["phases"] = moe_phases(clock, plan, grouped, x, w)
        s = rec["summary"]
        log(f"moe layer: first second {s['first_second_max_tflops']:.0f} -> steady {s['steady_median_tflops']:.0f} "
            f"TFLOP/s ({s['steady_over_first_second_max']:.3f}); steady "
            f"{rec['flops_per_call'] / (s['steady_median_tflops'] * 1e9):.2f} ms per fwd+bwd; fwd parts "
            + ", ".join(f"{k} {v['median_ms']:.2f} ms" for k, v in rec["phases"].items()))
    finally:
        if sampler is not None:
            sampler.stop()
    return {"workload": "qwen3-30b-a3b layer, EP 8 local shapes", "records": {"moe_layer_bf16": rec}}


# ------------------------------------------------------------------------------------------------------- launch
def launch_section(clock, guard, plan, log) -> dict:
    """Per-launch host cost of an eager op; eager kernels back to back; the same kernels from a CUDA graph.

    The host-side figure queues at most 256 launches behind a GPU sleep: the driver's launch queue holds about a
    thousand, and a fuller queue makes the host wait on the GPU, which would time the sleep instead."""
    n, dev, h = plan["launch_n"], clock.device, plan["launch_linear"]
    queued = min(n, 256)
    y = torch.zeros(1, device=dev)
    a = torch.randn(16, h, device=dev, dtype=torch.bfloat16)
    w = torch.randn(h, h, device=dev, dtype=torch.bfloat16)
    out = {"n": n, "op": "y.add_(1) on one float32 element", "linear": f"F.linear [16, {h}] x [{h}, {h}] bf16"}

    def many(k: int = n):
        for _ in range(k):
            y.add_(1)

    def linears(k: int):
        for _ in range(k):
            F.linear(a, w)
    for name, fn in (("host_enqueue_us", many), ("host_enqueue_linear_us", linears)):
        samples = []
        for _ in range(5):
            fn(16)  # warm: allocator segments, cuBLAS handle and workspace before the timed calls
            if clock.cuda:
                torch.cuda.synchronize()
                torch.cuda._sleep(int(1e8))  # ~50 ms of GPU time queued first: the host never waits on the GPU
            t0 = time.perf_counter()
            fn(queued)
            samples.append((time.perf_counter() - t0) / queued * 1e6)
        out[name] = statistics.median(samples)
    if not clock.cuda:
        return out
    torch.cuda.synchronize()
    out["eager_back_to_back_us"] = clock.median_ms(many)["median_ms"] / n * 1e3
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        many()
        with torch.cuda.graph(graph, stream=stream):
            many()
    torch.cuda.synchronize()
    out["graph_replay_us"] = clock.median_ms(graph.replay)["median_ms"] / n * 1e3
    log(f"launch: host {out['host_enqueue_us']:.2f} us/launch (linear {out['host_enqueue_linear_us']:.2f}), eager "
        f"back to back {out['eager_back_to_back_us']:.2f} us, graph replay {out['graph_replay_us']:.2f} us")
    return out


# ------------------------------------------------------------------------------------------------------ fp8 GEMM
def one_scales(recipe: str, m: int, k: int, n: int, device):
    """Scales of 1 in the layout each recipe takes (cuBLAS, per torch's test_scaled_matmul_cuda.py): tensorwise
    scalars; rowwise [M, 1] and [1, N]; blockwise activations [M, K/128] outer-dim-major and weights [N/128, K/128]
    handed over transposed."""
    f32 = {"device": device, "dtype": torch.float32}
    if recipe.startswith("fp8_tensor"):
        return torch.ones((), **f32), torch.ones((), **f32)
    if recipe == "fp8_rowwise":
        return torch.ones(m, 1, **f32), torch.ones(1, n, **f32)
    return torch.ones(m, k // 128, **f32).t().contiguous().t(), torch.ones(n // 128, k // 128, **f32).t()


def fp8_gemm(recipe: str, a, w):
    """a [M, K] bf16, w [N, K] bf16 (an nn.Linear weight): a callable computing a @ w.T under the recipe."""
    if recipe == "bf16":
        wt = w.t()
        return lambda: torch.mm(a, wt)
    (m, k), n = a.shape, w.shape[0]
    a8, w8t = a.to(FP8), w.to(FP8).t()
    sa, sb = one_scales(recipe, m, k, n, a.device)
    fast = recipe in ("fp8_tensor_fast", "fp8_rowwise")
    if recipe == "fp8_block" and hasattr(F, "scaled_mm"):  # the explicit-recipe API names the blocks
        st = F.ScalingType
        return lambda: F.scaled_mm(a8, w8t, sa, st.BlockWise1x128, sb, st.BlockWise128x128,
                                   output_dtype=torch.bfloat16)
    return lambda: torch._scaled_mm(a8, w8t, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, use_fast_accum=fast)


FP8_RECIPES = ("bf16", "fp8_tensor_fast", "fp8_tensor_split", "fp8_rowwise", "fp8_block")


def rel_err(fn, a, w) -> float:
    ref = (a.float() @ w.float().t())
    got = fn().float()
    return float((got - ref).abs().max() / ref.abs().max())


def fp8gemm_section(clock, guard, plan, log) -> dict:
    records, dev = [], clock.device
    for m in plan["fp8_m"]:
        for shape, (k, n) in plan["fp8_shapes"].items():
            a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.05
            for recipe in FP8_RECIPES:
                if not guard.left():
                    return {"records": records, "quantize": []}
                rec = attempt(log, f"fp8gemm {shape} m={m} {recipe}", lambda: _gemm_case(clock, recipe, a, w))
                rec.update(shape=shape, m=m, k=k, n=n, recipe=recipe, flops=2.0 * m * k * n)
                if "median_ms" in rec:
                    rec["tflops"] = rate(rec["flops"], rec["median_ms"]) / 1e12
                records.append(rec)
            log(f"fp8gemm {shape} m={m}: " + ", ".join(f"{r['recipe']} {r.get('tflops', 0):.0f}"
                                                       for r in records[-len(FP8_RECIPES):]))
            a = w = None
            empty_cache()
    return {"records": records, "quantize": quantize_cases(clock, guard, plan, log)}


def _gemm_case(clock, recipe, a, w) -> dict:
    fn = fp8_gemm(recipe, a, w)
    rec = clock.median_ms(fn)
    if a.shape[0] == 1024 or clock.quick:  # the numerics once per shape: each recipe against an fp32 product
        rec["rel_err_vs_fp32"] = rel_err(fn, a, w)
    return rec


def quant_tensorwise(x):
    amax = x.abs().amax().float().clamp(min=1e-12)
    return (x.float() * (FP8_MAX / amax)).clamp(-FP8_MAX, FP8_MAX).to(FP8), amax


def quant_rowwise(x):
    amax = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12)
    return (x.float() * (FP8_MAX / amax)).clamp(-FP8_MAX, FP8_MAX).to(FP8), amax


def quant_1x128(x):
    m, k = x.shape
    xb = x.view(m, k // 128, 128).float()
    amax = xb.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12)
    return (xb * (FP8_MAX / amax)).clamp(-FP8_MAX, FP8_MAX).to(FP8).view(m, k), amax


def quant_1x128_both(x):
    """What a blockwise recipe quantizes for one activation: 1x128 blocks along K for the forward GEMM and along M
    (the transpose) for the weight-gradient GEMM."""
    return quant_1x128(x), quant_1x128(x.t().contiguous())


def quant_128x128(x):
    m, k = x.shape
    xb = x.view(m // 128, 128, k // 128, 128).float()
    amax = xb.abs().amax(dim=(1, 3), keepdim=True).clamp(min=1e-12)
    return (xb * (FP8_MAX / amax)).clamp(-FP8_MAX, FP8_MAX).to(FP8).view(m, k), amax


QUANTIZERS = {"tensorwise": (quant_tensorwise, 3), "rowwise": (quant_rowwise, 3), "block1x128": (quant_1x128, 3),
              "block1x128_and_transposed": (quant_1x128_both, 4), "block128x128": (quant_128x128, 3)}


def quantize_cases(clock, guard, plan, log) -> list:
    """Each recipe's quantize pass, compiled (eager when compiling is off): unique bytes = 2 read + 1 written per
    element, + 1 more for the transposed copy."""
    records = []
    for name, (fn, bytes_per_elem) in QUANTIZERS.items():
        run = compiled(fn, log) if plan["compile"] else fn
        for m in plan["quant_m"]:
            if run is None or not guard.left(need_s=20):
                break
            x = torch.randn(m, 8192 if not clock.quick else 256, device=clock.device, dtype=torch.bfloat16)
            rec = attempt(log, f"quantize {name} m={m}", lambda: clock.median_ms(lambda: run(x)))
            rec.update(quantizer=name, shape=list(x.shape), bytes=bytes_per_elem * x.numel(),
                       compiled=bool(plan["compile"]))
            if "median_ms" in rec:
                rec["gbps"] = rate(rec["bytes"], rec["median_ms"]) / 1e9
                log(f"quantize {name} {list(x.shape)}: {rec['median_ms']:.3f} ms {rec['gbps']:.0f} GB/s")
            records.append(rec)
            x = None
    return records


# --------------------------------------------------------------------------------------------------------- run
SECTION_BUDGET_S = {"sustain": 130, "launch": 15, "fp8gemm": 70, "duty": 70, "moe": 60}
SECTIONS = {"sustain": sustain_section, "launch": launch_section, "fp8gemm": fp8gemm_section, "duty": duty_section,
            "moe": moe_section}


def conventions() -> dict:
    return {
        "sustain": "each workload is called back to back for hold_s after one untimed call; windows of ~0.25 s are "
                   "timed with CUDA events; no L2 flush (a long job never flushes); steady = median over the last "
                   "40% of the hold; first_second_max = the best window in the first second (a cold GPU, what a "
                   "one-shot benchmark sees); nvidia-smi sampled every 200 ms (t relative to the hold's start)",
        "layer_flops": "3 x forward GEMM FLOPs + 3.5 x causal attention forward FLOPs (4*s^2*hq*d/2)",
        "launch": "host_enqueue: perf_counter over n launches queued behind a GPU sleep; eager_back_to_back and "
                  "graph_replay: CUDA events over n kernels, L2 flushed before",
        "fp8gemm": "CUDA events, L2 flushed before each call, median of up to 10; operands already quantized; "
                   "scales of 1 in each recipe's layout; rel_err_vs_fp32 at M = 1024 only",
        "quantize_bytes": "2 bytes read + 1 written per element (+1 for the transposed copy)",
        "duty": "bursts of the sustain section's bf16 GEMM (~20 ms) each followed by torch.cuda._sleep for the gap "
                "the target busy fraction needs; burst and gap timed with CUDA events; steady = median burst rate "
                "from 60% of the hold on, over the first burst's",
    }


def run(args, log) -> dict:
    return run_sections("meshplan.gpu_sustained/1", SECTIONS, SECTION_BUDGET_S,
                        QUICK_PLAN if args.quick else FULL_PLAN, conventions(), args, log)


# ------------------------------------------------------------------------------------------------------- tables
def _rate_rows(name: str, data: dict) -> list[str]:
    rows = []
    for workload, r in data["sections"].get("sustain", {}).get("records", {}).items():
        s = r["summary"]
        rows.append(f"| {name} | {workload} | {s['first_second_max_tflops']:.0f} | "
                    f"{s['steady_median_tflops']:.0f} | {s['steady_over_first_second_max']:.3f} | "
                    f"{s['steady_median_sm_mhz']} |")
    for r in data["sections"].get("duty", {}).get("records", {}).values():
        s = r["summary"]
        rows.append(f"| {name} | busy {s['busy_fraction']:.2f} | {s['first_burst_tflops']:.0f} | "
                    f"{s['steady_median_tflops']:.0f} | {s['steady_over_first_burst']:.3f} | "
                    f"{s['steady_median_sm_mhz']} |")
    return rows


def _fp8_rows(name: str, data: dict) -> list[str]:
    recs = [r for r in data["sections"].get("fp8gemm", {}).get("records", []) if "median_ms" in r]
    ms = {(r["shape"], r["m"], r["recipe"]): r["median_ms"] for r in recs}
    rows = []
    for m in sorted({r["m"] for r in recs}):
        cells = [statistics.median(ms[(shape, m, "fp8_tensor_fast")] / v for (shape, mm, rec), v in ms.items()
                                   if rec == recipe and mm == m) for recipe in FP8_RECIPES]
        rows.append(f"| {name} | {m} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
    return rows


def tables(paths: list[str]) -> list[str]:
    """Markdown tables of measurement files this script wrote: sustained rates, duty cycles, launch costs and the
    fp8 recipes' GEMM rates against tensor-wise (median over shapes, per M)."""
    rates, fp8, launch = [], [], []
    for path in paths:
        data, name = json.loads(Path(path).read_text(encoding="utf-8")), Path(path).name
        rates += _rate_rows(name, data)
        fp8 += _fp8_rows(name, data)
        lau = data["sections"].get("launch", {})
        if "graph_replay_us" in lau:
            launch.append(f"| {name} | {lau['host_enqueue_us']:.1f} | {lau['host_enqueue_linear_us']:.1f} | "
                          f"{lau['eager_back_to_back_us']:.1f} | {lau['graph_replay_us']:.2f} |")
    return ["| file | workload / busy | first, TFLOP/s | steady | steady / first | steady SM MHz |",
            "|---|---|---|---|---|---|", *rates, "",
            "| file | host enqueue, eager add (us) | host enqueue, F.linear (us) | eager back to back (us/kernel) "
            "| CUDA graph replay (us/kernel) |", "|---|---|---|---|---|", *launch, "",
            "| file | M | " + " | ".join(FP8_RECIPES) + " |", "|---|---" + "|---" * len(FP8_RECIPES) + "|", *fp8, "",
            "(fp8 table: rate as a multiple of fp8 tensor-wise with fast accumulation, median over the shapes.)"]


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="JSON file to write (rewritten after every section)")
    ap.add_argument("--tables", nargs="+", metavar="FILE", help="print the tables of files this script wrote, run "
                    "nothing")
    ap.add_argument("--quick", action="store_true", help="tiny shapes (CPU when no GPU): checks the code paths")
    ap.add_argument("--budget-s", type=float, default=230.0, help="deadline for the whole run, seconds")
    ap.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated subset of " + ",".join(SECTIONS))
    args = ap.parse_args(argv)
    if not args.out and not args.tables:
        ap.exit(2, "--out: a file to write is needed (or --tables FILE... to print measured files)\n")
    check_sections(ap, args.sections, SECTIONS)
    return args


def main(argv=None) -> int:
    return run_or_tables(parse(argv), run, tables)


if __name__ == "__main__":
    sys.exit(main())
