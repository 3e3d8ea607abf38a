"""Measure attention over packed documents (variable-length, per-document causal) on one GPU, and the host's time
per framework op, and keep the figures.

Sections (each under its own time guard; the file is rewritten after every section so a cut run keeps what it has):
  varlen  a pack of T tokens cut into documents of L tokens each, causal within each document, at the head shapes of
          Llama 3 8B / 70B, Llama 2 7B and GPT-OSS: FlashAttention's variable-length kernel (``varlen_attn``, THD
          layout with cumulative offsets), cuDNN's (``_cudnn_attention_forward`` with offsets, where the build has it),
          and the same documents as a dense batch of L-token sequences (SDPA, FLASH and CUDNN backends), forward and
          backward; L = T is the whole-pack attention a packed run would pay without per-document masks
  host    the host's time per call of a torch.nn.Linear forward at TransformerEngine issue 2053's shape (bf16,
          hidden 2048, 8192 tokens; with and without autograd recording), of one tiny elementwise op, of torch.empty
          and of torch.split into 8: what the CPU spends launching, the GPU queue never drained

    PYTHONUNBUFFERED=1 python3 bench/gpu_varlen.py --out nvidia-h200-varlen.json
    python bench/gpu_varlen.py --quick --out /tmp/v.json     # tiny shapes on CPU: checks the code paths
    python bench/gpu_varlen.py --tables costmodel/data/measured/nvidia-h200-varlen.json   # the kept run, as tables

Standalone (torch and the standard library, plus bench/gpu_kernels.py beside it): the GPU machine has no meshplan.
"""
from __future__ import annotations

import inspect
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from gpu_kernels import attempt, attention_case, empty_cache, parse_one_file_args, rate, run_or_tables, run_sections

# (label, query heads, KV heads, head dim) per GPU at TP 1: the HF configs of Llama 3 8B / 70B and Llama 2 7B in
# planner/presets/models, and openai/gpt-oss-120b's hub config (64 query heads, 8 KV heads, head_dim 64)
HEADS = [("llama3-8b", 32, 8, 128), ("llama3-70b", 64, 8, 128), ("llama2-7b", 32, 32, 128), ("gpt-oss", 64, 8, 64)]
FULL_PLAN = {"heads": HEADS, "pack": 4096, "tokens": 16384, "docs": [128, 256, 512, 1024, 2048, 4096],
             "host_linear": [8192, 2048], "host_calls": 200, "host_repeats": 7}
QUICK_PLAN = {"heads": [("tiny", 4, 2, 16)], "pack": 64, "tokens": 128, "docs": [16, 64], "host_linear": [64, 32],
              "host_calls": 5, "host_repeats": 2}
SECTION_BUDGET_S = {"varlen": 150, "host": 30}


def doc_flops(tokens: int, doc: int, q_heads: int, head_dim: int) -> dict:
    """Causal attention within each of tokens/doc documents: forward 4*doc^2*hq*d/2 per document (two GEMMs, half
    masked), backward 2.5x forward (FlashAttention-2 paper, section 4.1, the convention of bench/gpu_kernels.py)."""
    fwd = (tokens // doc) * 4.0 * doc * doc * q_heads * head_dim / 2
    return {"fwd": fwd, "bwd": 2.5 * fwd}


def thd_inputs(tokens, hq, hkv, d, device):
    def make(h):
        return torch.randn(tokens, h, d, device=device, dtype=torch.bfloat16, requires_grad=True)
    return make(hq), make(hkv), make(hkv)


def offsets(tokens: int, doc: int, device) -> torch.Tensor:
    return torch.arange(0, tokens + 1, doc, device=device, dtype=torch.int32)


def flash_varlen(q, k, v, cu, doc: int):
    """torch's FlashAttention variable-length kernel, causal (an ``is_causal`` flag in older releases, a (-1, 0)
    window in newer ones)."""
    from torch.nn.attention.varlen import varlen_attn
    params = inspect.signature(varlen_attn).parameters
    causal = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
    gqa = {"enable_gqa": True} if "enable_gqa" in params and q.shape[1] != k.shape[1] else {}
    if not gqa and q.shape[1] != k.shape[1]:
        k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    return varlen_attn(q, k, v, cu, cu, doc, doc, **causal, **gqa)


def cudnn_varlen(q, k, v, cu, doc: int):
    """cuDNN's fused attention over THD offsets (the path Transformer Engine takes for packed sequences); K and V
    repeated to the query heads (torch's cuDNN varlen path refuses GQA)."""
    rep = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(rep, dim=1) for t in (k, v))
    return torch.ops.aten._cudnn_attention_forward(q, k, v, None, cu, cu, doc, doc, True, 0.0, True, False)[0]


def varlen_case(clock, fn, tokens, doc, shape, device) -> dict:
    _, hq, hkv, d = shape
    q, k, v = thd_inputs(tokens, hq, hkv, d, device)
    cu = offsets(tokens, doc, device)
    flops = doc_flops(tokens, doc, hq, d)
    out = fn(q, k, v, cu, doc)
    rec = {"flops_fwd": flops["fwd"], "flops_bwd": flops["bwd"]}
    rec["fwd"] = clock.median_ms(lambda: fn(q, k, v, cu, doc), reps=10, cap_s=1.0)
    rec["fwd_tflops"] = rate(flops["fwd"], rec["fwd"]["median_ms"]) / 1e12
    grad = torch.randn_like(out)

    def bwd_fn():
        return torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)

    def backward() -> dict:
        bwd = clock.median_ms(bwd_fn, reps=10, cap_s=1.5)
        return {"bwd": bwd, "bwd_tflops": rate(flops["bwd"], bwd["median_ms"]) / 1e12}
    rec.update(attempt(lambda msg: None, "backward", backward))  # a forward-only op keeps its forward
    if clock.cuda:
        rec["fwd_kernel_ms"] = attempt(lambda msg: None, "profile", lambda: kernel_ms(lambda: fn(q, k, v, cu, doc)))
        rec["bwd_kernel_ms"] = attempt(lambda msg: None, "profile", lambda: kernel_ms(bwd_fn))
    return rec


def kernel_ms(fn, calls: int = 3) -> dict:
    """The GPU kernels' own time per call, summed from the profiler's device events: what the kernels took, apart
    from host work between them (a path that plans its kernels on the host each call shows it in CUDA-event time
    but not here)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    us = sum(e.self_device_time_total for e in prof.key_averages() if e.device_type == DeviceType.CUDA)
    return {"median_ms": us / calls / 1e3, "calls": calls}


def varlen_section(clock, guard, plan, log) -> dict:
    from torch.nn.attention import SDPBackend
    tokens, records = plan["tokens"], []
    kinds = [("varlen_flash", flash_varlen), ("varlen_cudnn", cudnn_varlen)]
    for shape in plan["heads"]:
        label, hq, hkv, d = shape
        for doc in plan["docs"]:
            for kind, fn in kinds:
                if not guard.left():
                    return {"records": records}
                rec = attempt(log, f"{kind} {label} L={doc}",
                              lambda: varlen_case(clock, fn, tokens, doc, shape, clock.device))
                records.append(dict(rec, kind=kind, heads=label, q_heads=hq, kv_heads=hkv, head_dim=d,
                                    tokens=tokens, doc=doc, pack=plan["pack"], dtype="bf16"))
            for backend in ("FLASH_ATTENTION", "CUDNN_ATTENTION"):
                if not guard.left():
                    return {"records": records}
                rec = attempt(log, f"batched {backend} {label} L={doc}",
                              lambda: attention_case(clock, getattr(SDPBackend, backend),
                                                     (tokens // doc, doc, hq, hkv, d), clock.device))
                records.append(dict(rec, kind="batched_" + backend.split("_")[0].lower(), heads=label, q_heads=hq,
                                    kv_heads=hkv, head_dim=d, tokens=tokens, doc=doc, pack=plan["pack"],
                                    dtype="bf16"))
            done = [r for r in records[-4:] if "fwd_tflops" in r]
            log(f"{label} L={doc}: " + ", ".join(f"{r['kind']} {r['fwd_tflops']:.0f}/{r.get('bwd_tflops', 0):.0f}"
                                                 for r in done) + " TFLOP/s fwd/bwd")
            empty_cache()
    return {"records": records}


def host_us(fn, calls: int, repeats: int, cuda: bool) -> dict:
    """Host microseconds per call: ``calls`` calls back to back with the GPU queue drained first, median over
    ``repeats`` (the GPU runs behind; its queue holds far more than ``calls`` launches)."""
    per_call = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter() - t0) / calls * 1e6)
    if cuda:
        torch.cuda.synchronize()
    return {"median_us": statistics.median(per_call), "min_us": min(per_call), "max_us": max(per_call),
            "calls": calls, "repeats": repeats}


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False, timeout=10).stdout
        return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")),
                    platform.processor())
    except (OSError, subprocess.SubprocessError):
        return platform.processor()


def host_section(clock, guard, plan, log) -> dict:
    device, cuda = clock.device, clock.cuda
    tokens, hidden = plan["host_linear"]
    linear = torch.nn.Linear(hidden, hidden, bias=False, device=device, dtype=torch.bfloat16)
    x = torch.randn(tokens, hidden, device=device, dtype=torch.bfloat16)
    small = torch.randn(16, device=device)
    x_grad = x.detach().requires_grad_(True)
    cases = {"nn_linear_fwd": (False, lambda: linear(x)),
             "nn_linear_fwd_autograd": (True, lambda: linear(x_grad)),
             "add_16": (False, lambda: small.add(1.0)),
             "empty_1mib": (False, lambda: torch.empty(1 << 18, device=device)),
             "split_8": (False, lambda: torch.split(x, tokens // 8))}
    records = {}
    for name, (grad, fn) in cases.items():
        if not guard.left():
            break
        with torch.set_grad_enabled(grad):
            fn()
            records[name] = host_us(fn, plan["host_calls"], plan["host_repeats"], cuda)
        log(f"host {name}: {records[name]['median_us']:.2f} us a call")
    return {"cpu_model": cpu_model(), "machine": platform.machine(), "linear_shape": [tokens, hidden],
            "records": records}


SECTIONS = {"varlen": varlen_section, "host": host_section}


def conventions() -> dict:
    return {
        "timing": "varlen: CUDA events around one call, 256 MiB written before each call to flush L2, median of up "
                  "to 10 repeats; host: perf_counter around back-to-back calls with the GPU queue drained first, "
                  "median of the repeats; clocks not locked",
        "flops": "causal attention within each document: forward 4*L^2*hq*d/2 per document, tokens/L documents; "
                 "backward 2.5 x forward (FlashAttention-2 convention)",
        "kinds": "varlen_flash: torch.nn.attention.varlen.varlen_attn (FlashAttention, THD with offsets); "
                 "varlen_cudnn: aten._cudnn_attention_forward with offsets, K/V repeated to the query heads; "
                 "batched_flash / batched_cudnn: SDPA over a [tokens/L, heads, L, d] batch, causal",
    }


def run(args, log) -> dict:
    return run_sections("meshplan.gpu_varlen/1", SECTIONS, SECTION_BUDGET_S, QUICK_PLAN if args.quick else FULL_PLAN,
                        conventions(), args, log)


def parse(argv):
    return parse_one_file_args(__doc__, SECTIONS, 200.0, argv)


def kernel_or_event_ms(rec: dict, phase: str) -> float | None:
    """The kernels' own time where the profiler read it (the cuDNN varlen path plans on the host each call, so its
    CUDA-event time is mostly host), else the CUDA-event median."""
    block = rec.get(f"{phase}_kernel_ms") or rec.get(phase) or {}
    return block.get("median_ms")


def tables(path: str) -> list[str]:
    """Per head shape and document length: fwd+bwd milliseconds and TFLOP/s of each kind, and the share of the
    whole-pack (L = pack) time of the same kind that per-document attention keeps, beside its FLOP share."""
    import json
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    recs = [r for r in data["sections"]["varlen"]["records"] if "flops_fwd" in r]
    docs = sorted({r["doc"] for r in recs})
    lines = [f"{data['environment'].get('device_name', '?')}, torch {data['environment']['torch']}: per-document "
             "causal attention, fwd+bwd (kernel time where profiled)",
             f"{'heads':11s} {'kind':14s} " + " ".join(f"{'L=' + str(d):>17s}" for d in docs)]
    for heads in dict.fromkeys(r["heads"] for r in recs):
        for kind in dict.fromkeys(r["kind"] for r in recs):
            row = {r["doc"]: r for r in recs if r["heads"] == heads and r["kind"] == kind}
            whole = row.get(max(row)) if row else None
            cells = []
            for doc in sorted(row):
                ms = [kernel_or_event_ms(row[doc], p) for p in ("fwd", "bwd")]
                whole_ms = [kernel_or_event_ms(whole, p) for p in ("fwd", "bwd")]
                if None in ms or None in whole_ms:
                    cells.append(f"{'-':>17s}")
                    continue
                tflops = (row[doc]["flops_fwd"] + row[doc]["flops_bwd"]) / (sum(ms) * 1e-3) / 1e12
                share = sum(ms) / sum(whole_ms)
                cells.append(f"{tflops:5.0f} TF {share:5.0%} ({doc / row[doc]['pack']:4.0%})")
            lines.append(f"{heads:11s} {kind:14s} " + " ".join(cells))
    lines.append("each cell: TFLOP/s, the time's share of the whole-pack attention of the same kind (its FLOP share)")
    return lines


def main(argv=None) -> int:
    return run_or_tables(parse(argv), run, tables)


if __name__ == "__main__":
    sys.exit(main())
