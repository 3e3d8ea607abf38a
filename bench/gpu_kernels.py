"""Measure the kernels the cost model prices for MoE and long-context training on one GPU, and keep the figures.

Sections (each under its own time guard, results written after every section so a cut run keeps what it has):
  gemm       grouped expert GEMMs (gate+up fused and down projection) at the routed-expert shapes of Qwen3-30B-A3B,
             Qwen3-235B-A22B, DeepSeek-V3 and GPT-OSS-120b, bf16 and fp8, against one dense GEMM of the same FLOPs
  permute    token dispatch inside a GPU: argsort + gather into expert order, probs-weighted index_add back; router
  attention  causal SDPA forward and backward, GQA, under the FLASH and CUDNN backends, 4k..128k tokens
  fp8cast    bf16 -> float8_e4m3fn with tensorwise amax scaling, and transpose + cast
  memory     SwiGLU, residual add, RMSNorm, cross-entropy (eager and torch.compile)

Timing: CUDA events around each call, L2 flushed (a 256 MiB write) before every timed call so no kernel reads data
left in L2 by its previous repeat, warm-up first, median over repeats. Clocks are not locked.

    PYTHONUNBUFFERED=1 python3 bench/gpu_kernels.py --out h200_kernels.json
    python bench/gpu_kernels.py --quick --out /tmp/k.json     # tiny shapes on CPU: checks the code paths

The script is standalone (torch and the standard library only): the GPU machine that runs it has no meshplan
installed, so it carries its own atomic writer.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

# Routed-expert shapes. qwen3-30b-a3b and deepseek-v3: the HF config.json files in shared/model_configs (and
# planner/presets/models). qwen3-235b-a22b: the Qwen/Qwen3-235B-A22B hub config (hidden_size 4096,
# moe_intermediate_size 1536, num_experts 128, num_experts_per_tok 8), transcribed. gpt-oss-120b: the
# openai/gpt-oss-120b hub config (hidden_size 2880, intermediate_size 2880, num_local_experts 128,
# num_experts_per_tok 4), transcribed.
MOE_MODELS = {
    "qwen3-30b-a3b": {"hidden": 2048, "ffn": 768, "experts": 128, "topk": 8},
    "qwen3-235b-a22b": {"hidden": 4096, "ffn": 1536, "experts": 128, "topk": 8},
    "deepseek-v3": {"hidden": 7168, "ffn": 2048, "experts": 256, "topk": 8},
    "gpt-oss-120b": {"hidden": 2880, "ffn": 2880, "experts": 128, "topk": 4},
}
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite float8_e4m3fn (OCP FP8 spec, E4M3)
L2_FLUSH_BYTES = 256 << 20


class Clock:
    """Times one callable: CUDA events on a GPU (L2 flushed before each call), perf_counter on the CPU."""

    def __init__(self, device: torch.device, quick: bool):
        self.device = device
        self.cuda = device.type == "cuda"
        self.quick = quick
        self.flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.float32, device=device) if self.cuda else None

    def once_ms(self, fn) -> float:
        if not self.cuda:
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
        self.flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    def median_ms(self, fn, reps: int = 10, cap_s: float = 1.0) -> dict:
        """Warm up (twice unless a call is long), then repeat; fewer repeats (at least 3) when a call is long, so
        one case stays near cap_s."""
        if self.quick:
            reps = 2
        first_ms = self.once_ms(fn)
        warm_ms = self.once_ms(fn) if first_ms < 100 else first_ms
        n = max(3, min(reps, int(cap_s * 1e3 / max(warm_ms, 1e-3))))
        if self.quick:
            n = 2
        times = [self.once_ms(fn) for _ in range(n)]
        return {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times), "reps": n,
                "first_call_ms": first_ms}


class Guard:
    """A section's time budget and the run's deadline: ``left()`` says whether another case may start."""

    def __init__(self, budget_s: float, deadline: float):
        self.budget_s, self.deadline = budget_s, deadline
        self.t0 = time.monotonic()
        self.skipped = 0

    def left(self, need_s: float = 0.0) -> bool:
        now = time.monotonic()
        ok = now - self.t0 < self.budget_s and now + need_s < self.deadline
        if not ok:
            self.skipped += 1
        return ok

    def summary(self) -> dict:
        used_s = round(time.monotonic() - self.t0, 2)
        return {"budget_s": self.budget_s, "used_s": used_s, "cases_skipped": self.skipped}


def write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file in the same folder and rename, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def error_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"




def rate(value: float, ms: float) -> float:
    """value per second, from a time in milliseconds."""
    return value / (ms * 1e-3) if ms > 0 else 0.0


# ---------------------------------------------------------------------------------------------------- grouped GEMM
def expert_weights(experts: int, k: int, n: int, device) -> torch.Tensor:
    """[E, N, K] like nn.Linear weights; the GEMM reads its transpose [E, K, N] (column-major), the layout the grouped
    kernels take for the second operand."""
    return torch.randn(experts, n, k, device=device, dtype=torch.bfloat16).mul_(0.05)


def offsets(experts: int, tokens_per_expert: int, device) -> torch.Tensor:
    """Cumulative end row of each expert's group (balanced routing: every expert gets the same count)."""
    return torch.arange(1, experts + 1, device=device, dtype=torch.int32) * tokens_per_expert


def bf16_grouped(a, w_enk, offs, tpe: int, path: str):
    w = w_enk.transpose(-2, -1)
    if path == "torch._grouped_mm":
        return lambda: torch._grouped_mm(a, w, offs=offs)
    out = torch.empty(a.shape[0], w.shape[-1], device=a.device, dtype=a.dtype)
    return lambda: [torch.mm(a[i * tpe:(i + 1) * tpe], w[i], out=out[i * tpe:(i + 1) * tpe]) for i in range(w.shape[0])]


def fp8_grouped(a8, w8_enk, offs, tpe: int, path: str):
    """Operands already in fp8 (the cast is its own section). Rowwise scales for the grouped kernel (one per token
    row of A, one per output column of each expert), tensorwise scales for the per-expert fallback."""
    w8 = w8_enk.transpose(-2, -1)
    e, n = w8.shape[0], w8.shape[-1]
    if path == "torch._scaled_grouped_mm":
        sa = torch.ones(a8.shape[0], device=a8.device, dtype=torch.float32)
        sb = torch.ones(e, n, device=a8.device, dtype=torch.float32)
        return lambda: torch._scaled_grouped_mm(a8, w8, sa, sb, offs=offs, out_dtype=torch.bfloat16)
    if path == "F.scaled_grouped_mm (rowwise)":
        sa = torch.ones(a8.shape[0], device=a8.device, dtype=torch.float32)
        sb = torch.ones(e, n, device=a8.device, dtype=torch.float32)
        row = F.ScalingType.RowWise
        return lambda: F.scaled_grouped_mm(a8, w8, sa, row, sb, row, offs=offs, output_dtype=torch.bfloat16)
    one = torch.ones((), device=a8.device, dtype=torch.float32)
    return lambda: [torch._scaled_mm(a8[i * tpe:(i + 1) * tpe], w8[i], scale_a=one, scale_b=one,
                                     out_dtype=torch.bfloat16) for i in range(e)]


def bf16_wgrad(a, dy, offs):
    """Weight gradient of every local expert in one call: dW_e = A_e^T dY_e, the token dimension split by offs
    (2-D x 2-D grouped GEMM; output [E, K, N]). A^T is a transposed view, as autograd hands it over."""
    return lambda: torch._grouped_mm(a.t(), dy, offs=offs)


def dense_ref(a, w_enk, dtype: str):
    """One GEMM of the same M x K x N as the whole grouped call (so the same FLOPs): the dense rate to compare to."""
    w = w_enk[0].t()
    if dtype == "bf16":
        return lambda: torch.mm(a, w)
    one = torch.ones((), device=a.device, dtype=torch.float32)
    return lambda: torch._scaled_mm(a, w, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)


def pick_paths(device) -> dict:
    """Which grouped kernels this torch runs: try each on a small problem and compare with a per-expert loop."""
    e, tpe, k, n = 4, 64, 256, 512
    a = torch.randn(e * tpe, k, device=device, dtype=torch.bfloat16)
    w = expert_weights(e, k, n, device)
    offs = offsets(e, tpe, device)
    ref = torch.cat([a[i * tpe:(i + 1) * tpe].float() @ w[i].t().float() for i in range(e)])
    found = {"bf16": "loop of torch.mm", "fp8": "loop of torch._scaled_mm (tensorwise)", "errors": {}}
    try:
        got = bf16_grouped(a, w, offs, tpe, "torch._grouped_mm")().float()
        found["bf16_rel_err"] = float((got - ref).abs().max() / ref.abs().max())
        found["bf16"] = "torch._grouped_mm"
    except Exception as exc:  # noqa: BLE001 -- record why the grouped kernel is not used, then fall back
        found["errors"]["torch._grouped_mm"] = error_line(exc)
    a8, w8 = a.to(FP8), w.to(FP8)
    ref8 = torch.cat([a8[i * tpe:(i + 1) * tpe].float() @ w8[i].t().float() for i in range(e)])
    dy = torch.randn(e * tpe, n, device=device, dtype=torch.bfloat16)
    ref_w = torch.stack([a[i * tpe:(i + 1) * tpe].float().t() @ dy[i * tpe:(i + 1) * tpe].float() for i in range(e)])
    found["wgrad"] = None
    try:
        got = bf16_wgrad(a, dy, offs)().float()
        found["wgrad_rel_err"] = float((got - ref_w).abs().max() / ref_w.abs().max())
        found["wgrad"] = "torch._grouped_mm (2-D x 2-D)"
    except Exception as exc:  # noqa: BLE001
        found["errors"]["wgrad"] = error_line(exc)
    found["fp8"] = None
    for path in ("torch._scaled_grouped_mm", "F.scaled_grouped_mm (rowwise)", "loop of torch._scaled_mm (tensorwise)"):
        try:
            got = fp8_grouped(a8, w8, offs, tpe, path)()
            got = got if isinstance(got, torch.Tensor) else torch.cat(got)
            found["fp8_rel_err"] = float((got.float() - ref8).abs().max() / ref8.abs().max())
            found["fp8"] = path
            break
        except Exception as exc:  # noqa: BLE001
            found["errors"][path] = error_line(exc)
    return found


def gemm_case(clock, a, w, offs, tpe, dtype, paths) -> dict:
    m, k = a.shape
    n = w.shape[1]
    flops = 2.0 * m * k * n
    make = bf16_grouped if dtype == "bf16" else fp8_grouped
    grouped = clock.median_ms(make(a, w, offs, tpe, paths[dtype]))
    dense = clock.median_ms(dense_ref(a, w, dtype))
    return {"pass": "fwd", "m_total": m, "k": k, "n": n, "flops": flops, "path": paths[dtype], "grouped": grouped,
            "grouped_tflops": rate(flops, grouped["median_ms"]) / 1e12, "dense": dense,
            "dense_tflops": rate(flops, dense["median_ms"]) / 1e12,
            "grouped_over_dense": dense["median_ms"] / grouped["median_ms"]}


def wgrad_case(clock, a, dy, offs) -> dict:
    """bf16 weight gradient; the dense reference is one [K, M] x [M, N] GEMM (same FLOPs, one output)."""
    m, k = a.shape
    n = dy.shape[1]
    flops = 2.0 * m * k * n
    grouped = clock.median_ms(bf16_wgrad(a, dy, offs))
    dense = clock.median_ms(lambda: torch.mm(a.t(), dy))
    return {"pass": "wgrad", "m_total": m, "k": k, "n": n, "flops": flops, "path": "torch._grouped_mm (2-D x 2-D)",
            "grouped": grouped, "grouped_tflops": rate(flops, grouped["median_ms"]) / 1e12, "dense": dense,
            "dense_tflops": rate(flops, dense["median_ms"]) / 1e12,
            "grouped_over_dense": dense["median_ms"] / grouped["median_ms"]}


def gemm_section(clock, guard, plan, log) -> dict:
    paths = pick_paths(clock.device)
    log(f"gemm paths: bf16={paths['bf16']} fp8={paths['fp8']} errors={paths['errors']}")
    records = []
    for name, cfg in plan["models"].items():
        h, ffn = cfg["hidden"], cfg["ffn"]
        for e in plan["experts_local"]:
            if not guard.left():
                break
            w_up, w_down = expert_weights(e, h, 2 * ffn, clock.device), expert_weights(e, ffn, h, clock.device)
            top = e * max(plan["tokens_per_expert"])
            x, mid, dy_up, dy_down = (torch.randn(top, c, device=clock.device, dtype=torch.bfloat16)
                                      for c in (h, ffn, 2 * ffn, h))
            grads = {"gate_up": dy_up, "down": dy_down}
            for dtype in ("bf16", "fp8"):
                if paths[dtype] is None:
                    continue
                cast = (lambda t: t) if dtype == "bf16" else (lambda t: t.to(FP8))
                ws = {"gate_up": cast(w_up), "down": cast(w_down)}
                acts = {"gate_up": cast(x), "down": cast(mid)}
                for tpe in plan["tokens_per_expert"]:
                    for proj in ("gate_up", "down"):
                        if not guard.left():
                            break
                        label = f"gemm {name} E={e} tpe={tpe} {proj} {dtype}"
                        rec = attempt(log, label, lambda: gemm_case(clock, acts[proj][:e * tpe], ws[proj],
                                                                    offsets(e, tpe, clock.device), tpe, dtype, paths))
                        rec.update(model=name, experts_local=e, tokens_per_expert=tpe, proj=proj, dtype=dtype)
                        records.append(rec)
                        if "grouped" in rec:
                            log(f"{label}: {rec['grouped_tflops']:.0f} TFLOP/s grouped, "
                                f"{rec['dense_tflops']:.0f} dense")
                        if dtype == "bf16" and paths["wgrad"]:
                            rec = attempt(log, label + " wgrad", lambda: wgrad_case(
                                clock, acts[proj][:e * tpe], grads[proj][:e * tpe], offsets(e, tpe, clock.device)))
                            rec.update(model=name, experts_local=e, tokens_per_expert=tpe, proj=proj, dtype=dtype)
                            records.append(rec)
                ws = acts = None  # drop the GPU buffers before the next case
            w_up = w_down = x = mid = dy_up = dy_down = grads = None  # drop the GPU buffers before the next case
            empty_cache()
    return {"paths": paths, "records": records}


def empty_cache() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def attempt(log, label: str, fn) -> dict:
    """Run one measurement; a failure becomes a record with the error line, so one bad case does not end a section."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 -- recorded and reported, the run goes on
        log(f"{label}: FAILED {error_line(exc)}")
        empty_cache()
        return {"error": error_line(exc)}


# ------------------------------------------------------------------------------------------- permute / unpermute
def routing(tokens: int, experts: int, topk: int, device):
    """Top-k of softmax router probabilities over random logits: near balanced, as a trained router aims to be."""
    logits = torch.randn(tokens, experts, device=device, dtype=torch.float32)
    probs, idx = torch.topk(torch.softmax(logits, dim=-1), topk, dim=-1)
    return logits, probs, idx


def permute_fns(x, probs, idx):
    """Dispatch inside a GPU: stable argsort of the flattened expert ids gives expert order; gather token rows into
    it; back: weight each row by its router probability and index_add into the token's output row."""
    topk = idx.shape[1]
    flat = idx.reshape(-1)
    order = torch.argsort(flat, stable=True)
    src = order // topk
    y = x.index_select(0, src)
    w = probs.reshape(-1)[order].unsqueeze(1).to(x.dtype)

    def permute():
        o = torch.argsort(flat, stable=True)
        return x.index_select(0, o // topk)

    def unpermute():
        out = torch.zeros_like(x)
        return out.index_add_(0, src, y * w)

    inverse = torch.argsort(order)
    pk = probs.unsqueeze(-1).to(x.dtype)

    def unpermute_gather_sum():
        """Deterministic alternative (no atomics): gather rows back to token-major order, weight, sum over top-k."""
        return (y.index_select(0, inverse).view(-1, topk, x.shape[1]) * pk).sum(dim=1)
    return {"permute": permute, "gather_only": lambda: x.index_select(0, src), "unpermute": unpermute,
            "unpermute_gather_sum": unpermute_gather_sum}


def permute_bytes(tokens: int, hidden: int, topk: int) -> dict:
    """Unique bytes each kernel must move (bf16 rows): the gather reads each of the T token rows (a row picked k times
    is read from HBM once at best) and writes T*k rows; unpermute reads the T*k rows and writes T rows. Index and
    probability traffic is left out (under 1% at these widths)."""
    row_bytes = 2 * hidden
    gather = tokens * row_bytes + tokens * topk * row_bytes
    back = tokens * topk * row_bytes + tokens * row_bytes
    return {"permute": gather, "gather_only": gather, "unpermute": back, "unpermute_gather_sum": back}


def permute_section(clock, guard, plan, log) -> dict:
    records = []
    for name, cfg in plan["models"].items():
        for tokens in plan["permute_tokens"]:
            if not guard.left():
                break
            h, e, k = cfg["hidden"], cfg["experts"], cfg["topk"]
            logits, probs, idx = routing(tokens, e, k, clock.device)
            x = torch.randn(tokens, h, device=clock.device, dtype=torch.bfloat16)
            fns = permute_fns(x, probs, idx)
            fns["router_softmax_topk"] = lambda: torch.topk(torch.softmax(logits, dim=-1), k, dim=-1)
            fns["router_sigmoid_topk"] = lambda: torch.topk(torch.sigmoid(logits), k, dim=-1)
            nbytes = permute_bytes(tokens, h, k)
            nbytes["router_softmax_topk"] = nbytes["router_sigmoid_topk"] = tokens * e * 4
            for op, fn in fns.items():
                rec = attempt(log, f"permute {name} T={tokens} {op}", lambda: clock.median_ms(fn))
                rec.update(model=name, tokens=tokens, hidden=h, experts=e, topk=k, op=op, bytes=nbytes[op])
                if "median_ms" in rec:
                    rec["gbps"] = rate(nbytes[op], rec["median_ms"]) / 1e9
                    log(f"permute {name} T={tokens} {op}: {rec['median_ms']:.3f} ms {rec['gbps']:.0f} GB/s")
                records.append(rec)
            logits = probs = idx = x = fns = None  # drop the GPU buffers before the next case
            empty_cache()
    return {"records": records}


# ------------------------------------------------------------------------------------------------------- attention
def attention_flops(batch: int, seq: int, q_heads: int, head_dim: int) -> dict:
    """Causal forward = half of 4*b*s^2*h*d (two GEMMs, QK^T and PV); backward = 2.5x forward, the convention of
    Dao, FlashAttention-2 (2023), section 4.1: two matmuls forward, five backward (recomputation included)."""
    fwd = 4.0 * batch * seq * seq * q_heads * head_dim / 2
    return {"fwd": fwd, "bwd": 2.5 * fwd}


def attention_inputs(batch, seq, q_heads, kv_heads, head_dim, device):
    def make(h):
        return torch.randn(batch, h, seq, head_dim, device=device, dtype=torch.bfloat16, requires_grad=True)
    return make(q_heads), make(kv_heads), make(kv_heads)


def sdpa_forward(q, k, v):
    """GQA through enable_gqa; when a backend refuses it, K and V repeated to the query heads (what a framework
    without native GQA support does). Returns (output, how GQA ran)."""
    try:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), "enable_gqa"
    except RuntimeError:
        rep = q.shape[1] // k.shape[1]
        kk, vv = (t.repeat_interleave(rep, dim=1) for t in (k, v))
        return F.scaled_dot_product_attention(q, kk, vv, is_causal=True), "kv_repeated"


def attention_case(clock, backend, shape, device) -> dict:
    from torch.nn.attention import sdpa_kernel
    batch, seq, hq, hkv, d = shape
    q, k, v = attention_inputs(batch, seq, hq, hkv, d, device)
    flops = attention_flops(batch, seq, hq, d)
    with sdpa_kernel([backend]):
        out, gqa = sdpa_forward(q, k, v)
        grad = torch.randn_like(out)
        reps = 10 if seq <= 16384 else 3
        fwd = clock.median_ms(lambda: sdpa_forward(q, k, v), reps=reps, cap_s=1.5)
        bwd = clock.median_ms(lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True), reps=reps,
                              cap_s=2.5)
    return {"gqa": gqa, "flops_fwd": flops["fwd"], "flops_bwd": flops["bwd"], "fwd": fwd, "bwd": bwd,
            "fwd_tflops": rate(flops["fwd"], fwd["median_ms"]) / 1e12,
            "bwd_tflops": rate(flops["bwd"], bwd["median_ms"]) / 1e12}


def attention_section(clock, guard, plan, log) -> dict:
    from torch.nn.attention import SDPBackend
    records = []
    for label, hq, hkv, d in plan["attention_heads"]:
        for backend_name in plan["attention_backends"]:
            backend = getattr(SDPBackend, backend_name)
            for seq in plan["attention_seqs"]:
                if not guard.left():
                    break
                batch = max(1, plan["attention_tokens"] // seq)
                rec = attempt(log, f"attention {label} {backend_name} s={seq}",
                              lambda: attention_case(clock, backend, (batch, seq, hq, hkv, d), clock.device))
                rec.update(heads=label, q_heads=hq, kv_heads=hkv, head_dim=d, backend=backend_name, batch=batch,
                           seq=seq, causal=True, dtype="bf16")
                records.append(rec)
                if "fwd" in rec:
                    log(f"attention {label} {backend_name} b={batch} s={seq}: fwd {rec['fwd_tflops']:.0f} "
                        f"bwd {rec['bwd_tflops']:.0f} TFLOP/s ({rec['gqa']})")
                empty_cache()
    return {"records": records}


# ---------------------------------------------------------------------------------------------------- fp8 cast
def cast_tensorwise(x):
    """Current tensorwise scaling: amax over the tensor, scale = FP8_MAX / amax, scale and saturate, cast."""
    amax = x.abs().amax().float().clamp(min=1e-12)
    scale = FP8_MAX / amax
    return (x.float() * scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def transpose_cast(x):
    """The same cast, written transposed (what the weight-gradient GEMM needs for its fp8 operand)."""
    y, scale = cast_tensorwise(x)
    return y.t().contiguous(), scale


def compiled(fn, log):
    """torch.compile with static shapes (each size compiled for itself: dynamic-shape kernels ran at half the
    bandwidth in a first run); None if it cannot compile."""
    try:
        return torch.compile(fn, dynamic=False)
    except Exception as exc:  # noqa: BLE001
        log(f"torch.compile unavailable: {error_line(exc)}")
        return None


def fp8_section(clock, guard, plan, log) -> dict:
    """Bytes counted: each unique byte once (read the bf16 tensor, write the fp8 one, 3 bytes per element; amax alone
    reads 2); eager code makes several passes, so its rate against this count shows what fusion would save."""
    records = []
    variants = {"amax_eager": lambda x: x.abs().amax(), "cast_eager": cast_tensorwise,
                "transpose_cast_eager": transpose_cast}
    if plan["compile"] and guard.left(need_s=40):
        variants.update(cast_compiled=compiled(cast_tensorwise, log),
                        transpose_cast_compiled=compiled(transpose_cast, log))
    for variant, fn in variants.items():
        for numel in plan["cast_numel"]:
            if fn is None or not guard.left():
                break
            x = torch.randn(numel // 4096, 4096, device=clock.device, dtype=torch.bfloat16)
            rec = attempt(log, f"fp8 {variant} n={numel}", lambda: clock.median_ms(lambda: fn(x)))
            nbytes = 2 * numel if variant.startswith("amax") else 3 * numel
            rec.update(op=variant, numel=numel, bytes=nbytes)
            if "median_ms" in rec:
                rec["gbps"] = rate(nbytes, rec["median_ms"]) / 1e9
                log(f"fp8 {variant} n={numel}: {rec['median_ms']:.3f} ms {rec['gbps']:.0f} GB/s")
            records.append(rec)
            x = None  # drop the GPU buffers before the next case
    return {"records": records}


# ------------------------------------------------------------------------------------------- memory-bound kernels
def rms_norm_eager(x, w, eps: float = 1e-6):
    """The Llama/Qwen RMSNorm as written in HF modeling code: fp32 variance, rsqrt, scale, cast back."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def swiglu(gate_up):
    g, u = gate_up.chunk(2, dim=-1)
    return F.silu(g) * u


def cross_entropy_fwd_bwd(logits, labels):
    loss = F.cross_entropy(logits, labels)
    return torch.autograd.grad(loss, logits)


def memory_cases(plan, device, log) -> list:
    """(op, variant, make inputs, fn, unique bytes) for every case; compiled variants only when asked."""
    cases = []
    for rows in plan["mem_rows"]:
        h, f = plan["mem_hidden"], plan["mem_ffn"]
        cases += [("swiglu", "eager", (rows, 2 * f), swiglu, 3 * rows * f * 2),
                  ("residual_add", "eager", (2, rows, h), lambda x: x[0] + x[1], 3 * rows * h * 2),
                  ("rms_norm", "eager", (rows, h), lambda x: rms_norm_eager(x, x[0]), 2 * rows * h * 2),
                  ("rms_norm", "F.rms_norm", (rows, h), lambda x: F.rms_norm(x, (h,), x[0]), 2 * rows * h * 2)]
    for rows in plan["ce_rows"]:
        for vocab in plan["ce_vocab"]:
            cases += [("cross_entropy_fwd", "eager", (rows, vocab), None, rows * vocab * 2),
                      ("cross_entropy_fwd_bwd", "eager", (rows, vocab), None, 2 * rows * vocab * 2)]
    return cases


def memory_section(clock, guard, plan, log) -> dict:
    """Unique bytes: each input read once, each output written once (bf16)."""
    records = []
    compiled_fns = {}
    if plan["compile"] and guard.left(need_s=40):
        compiled_fns = {"swiglu": compiled(swiglu, log), "rms_norm": compiled(rms_norm_eager, log)}
    for op, variant, shape, fn, nbytes in memory_cases(plan, clock.device, log):
        if not guard.left():
            break
        x = torch.randn(*shape, device=clock.device, dtype=torch.bfloat16, requires_grad=op.endswith("bwd"))
        run = memory_callable(op, fn, x)
        todo = [(variant, run)]
        if op in compiled_fns and compiled_fns[op] is not None and variant == "eager":
            cfn = compiled_fns[op]
            todo.append(("torch.compile", (lambda: cfn(x)) if op == "swiglu" else (lambda: cfn(x, x[0]))))
        for name, call in todo:
            rec = attempt(log, f"mem {op} {name} {shape}", lambda: clock.median_ms(call))
            rec.update(op=op, variant=name, shape=list(shape), bytes=nbytes)
            if "median_ms" in rec:
                rec["gbps"] = rate(nbytes, rec["median_ms"]) / 1e9
                log(f"mem {op} {name} {shape}: {rec['median_ms']:.3f} ms {rec['gbps']:.0f} GB/s")
            records.append(rec)
        x = None  # drop the GPU buffers before the next case
        empty_cache()
    return {"records": records}


def memory_callable(op, fn, x):
    if op.startswith("cross_entropy"):
        labels = torch.randint(0, x.shape[1], (x.shape[0],), device=x.device)
        if op.endswith("bwd"):
            return lambda: cross_entropy_fwd_bwd(x, labels)
        return lambda: F.cross_entropy(x, labels)
    return lambda: fn(x)


# ------------------------------------------------------------------------------------------------------------ run
FULL_PLAN = {
    "models": MOE_MODELS, "experts_local": [8, 16, 32], "tokens_per_expert": [128, 512, 2048, 8192],
    "permute_tokens": [4096, 16384, 65536],
    # (label, q heads, kv heads, head dim): Llama-3.1-70B-like GQA 64/8 x 128 (its config.json in shared/model_configs),
    # GPT-OSS-120b 64/8 x 64 (hub config: num_attention_heads 64, num_key_value_heads 8, head_dim 64).
    "attention_heads": [("q64_kv8_d128", 64, 8, 128), ("q64_kv8_d64", 64, 8, 64)],
    "attention_backends": ["FLASH_ATTENTION", "CUDNN_ATTENTION"],
    "attention_seqs": [4096, 8192, 16384, 32768, 65536, 131072], "attention_tokens": 65536,
    "cast_numel": [1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28],
    "mem_rows": [8192, 32768], "mem_hidden": 4096, "mem_ffn": 4096, "ce_rows": [4096, 8192],
    "ce_vocab": [128256, 151936], "compile": True,
}
QUICK_PLAN = {
    "models": {"tiny": {"hidden": 64, "ffn": 32, "experts": 8, "topk": 2}}, "experts_local": [2],
    "tokens_per_expert": [16], "permute_tokens": [64], "attention_heads": [("q4_kv2_d32", 4, 2, 32)],
    "attention_backends": ["FLASH_ATTENTION", "CUDNN_ATTENTION"], "attention_seqs": [128], "attention_tokens": 256,
    "cast_numel": [1 << 14], "mem_rows": [64], "mem_hidden": 64, "mem_ffn": 64, "ce_rows": [16], "ce_vocab": [1000],
    "compile": False,
}
# Seconds per section; the run's deadline (--budget-s) caps them all together.
SECTION_BUDGET_S = {"gemm": 55, "permute": 20, "attention": 85, "fp8cast": 25, "memory": 35}
SECTIONS = {"gemm": gemm_section, "permute": permute_section, "attention": attention_section,
            "fp8cast": fp8_section, "memory": memory_section}


def nvidia_smi() -> dict:
    query = "name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.limit,temperature.gpu"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True,
                             check=False, text=True, timeout=20).stdout.strip().splitlines()
        return dict(zip(query.split(","), (v.strip() for v in out[0].split(",")))) if out else {}
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": error_line(exc)}


def environment(device) -> dict:
    env = {"date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "device_type": device.type, "clocks_locked": False}
    try:
        import triton
        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(device_name=props.name, sm_count=props.multi_processor_count, memory_bytes=props.total_memory,
                   capability=f"{props.major}.{props.minor}", cudnn=torch.backends.cudnn.version(),
                   l2_bytes=getattr(props, "L2_cache_size", None), nvidia_smi=nvidia_smi())
    return env


def conventions() -> dict:
    return {
        "timing": "CUDA events around one call; 256 MiB written before each call to flush L2; 1-2 warm-up calls; "
                  "median of the repeats (10, fewer when one call is long, at least 3); clocks not locked",
        "gemm_flops": "2*M*K*N per GEMM; gate_up: K=hidden, N=2*moe_ffn; down: K=moe_ffn, N=hidden; balanced "
                      "routing (every local expert gets tokens_per_expert rows); fp8 operands already cast",
        "attention_flops": "causal forward = 4*b*s^2*hq*d/2; backward = 2.5 x forward (FlashAttention-2 convention)",
        "bytes": "unique bytes: each input read once, each output written once",
        "compile": "torch.compile(dynamic=False): the first call per shape compiles (first_call_ms); the median "
                   "is over later calls",
    }


def run(args, log) -> dict:
    return run_sections("meshplan.gpu_kernels/1", SECTIONS, SECTION_BUDGET_S, QUICK_PLAN if args.quick else FULL_PLAN,
                        conventions(), args, log)


def run_sections(schema: str, sections: dict, budgets: dict, plan: dict, notes: dict, args, log) -> dict:
    """Run the sections ``args.sections`` names, each under its time guard, rewriting ``args.out`` after each (a
    cut run keeps what it measured): the driver this script and bench/gpu_sustained.py share."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    result = {"schema": schema, "environment": environment(device), "conventions": notes,
              "plan": {k: v for k, v in plan.items()}, "sections": {}}
    log(f"device {result['environment'].get('device_name', device.type)}, torch {torch.__version__}")
    clock = Clock(device, args.quick)
    deadline = time.monotonic() + args.budget_s
    torch.manual_seed(0)
    for name in args.sections.split(","):
        guard = Guard(budgets[name], deadline)
        section = attempt(log, f"section {name}", lambda: sections[name](clock, guard, plan, log))
        section["guard"] = guard.summary()
        if device.type == "cuda":
            section["nvidia_smi_after"] = nvidia_smi()
        result["sections"][name] = section
        write_atomic(Path(args.out), json.dumps(result, indent=1) + "\n")
        log(f"section {name} done in {section['guard']['used_s']} s")
    return result


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON file to write (rewritten after every section)")
    ap.add_argument("--quick", action="store_true", help="tiny shapes (CPU when no GPU): checks the code paths")
    ap.add_argument("--budget-s", type=float, default=220.0, help="deadline for the whole run, seconds")
    ap.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated subset of " + ",".join(SECTIONS))
    args = ap.parse_args(argv)
    check_sections(ap, args.sections, SECTIONS)
    return args


def check_sections(ap, names: str, sections: dict) -> None:
    """Exit 2 with one line when ``--sections`` names a section the script does not have."""
    bad = [s for s in names.split(",") if s not in sections]
    if bad:
        ap.exit(2, f"--sections: '{bad[0]}' is not a section (known: {', '.join(sections)})\n")


def run_logged(run, args) -> int:
    """``run(args, log)`` with a log that stamps each line with the seconds since the start."""
    t0 = time.monotonic()

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - t0:7.1f}s] {msg}", flush=True)
    run(args, log)
    log(f"wrote {args.out}")
    return 0


def parse_one_file_args(doc: str, sections: dict, budget_s: float, argv, extra=None):
    """The command line bench/gpu_varlen.py, bench/gpu_rope.py and bench/gpu_ssd.py share: ``--out`` to measure or
    ``--tables FILE`` to print a kept run, ``--quick``, ``--budget-s``, ``--sections``, and what ``extra(parser)``
    adds; a wrong one exits 2 with one line."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    if extra is not None:
        extra(ap)
    ap.add_argument("--out", help="JSON file to write (rewritten after every section)")
    ap.add_argument("--tables", metavar="FILE", help="print a kept run's tables instead of measuring")
    ap.add_argument("--quick", action="store_true", help="tiny shapes (CPU when no GPU): checks the code paths")
    ap.add_argument("--budget-s", type=float, default=budget_s, help="deadline for the whole run, seconds")
    ap.add_argument("--sections", default=",".join(sections), help="comma-separated subset of " + ",".join(sections))
    args = ap.parse_args(argv)
    if bool(args.out) == bool(args.tables):
        ap.exit(2, "give exactly one of --out (measure) and --tables FILE (print a kept run)\n")
    if args.tables and not Path(args.tables).is_file():
        ap.exit(2, f"--tables: {args.tables}: no such file\n")
    check_sections(ap, args.sections, sections)
    return args


def run_or_tables(args, run, tables) -> int:
    """The entry point bench/gpu_sustained.py and bench/gpu_varlen.py share: print the kept files' tables when
    ``--tables`` names them, else measure (``run_logged``)."""
    if args.tables:
        print("\n".join(tables(args.tables)))
        return 0
    return run_logged(run, args)


def main(argv=None) -> int:
    return run_logged(run, parse(argv))


if __name__ == "__main__":
    sys.exit(main())
