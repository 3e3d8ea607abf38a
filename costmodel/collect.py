"""Micro-benchmarks of this machine's device (``meshplan costmodel collect``) with ``torch.utils.benchmark``.

Shapes: about 40% from a grid of real LLM layer sizes and their tensor-parallel shards (hidden 256-2048,
tokens 32-512, TP 1/2/4/8: scaled down from 4k-8k hidden so a 2-core CPU measures each in milliseconds) and
60% random log-uniform shapes of every op class (``RANDOM_WEIGHTS``) with sizes snapped or not to multiples of 64
(notes/costmodel.md sec. 5.2). With the random shapes drawn from only some classes, attention, embedding, copy and
cast had under 30 rows and no model, and the norms about 36 training rows: held-out MAPE 13-45% on a quiet host
(noise floor 4-8%) against 2-9% with this grid and the measured per-call floor (BENCHMARKS.md).
Each shape is timed ``repeats`` times (separate ``blocked_autorange`` runs, shape order shuffled between
passes); the median of the repeats is the latency and (max - min) / median is the row's own noise.
The device vector (peak GEMM FLOP/s per dtype, copy bandwidth, cost of one op call, cores, LLC, clock) is
measured too, before and after the grid with each rate at its faster reading (``fastest_device``), and written to
``device.json`` so the CPU is featurised like any GPU.
"""
from __future__ import annotations

import json
import os
import platform
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from meshplan.core.atomic import write_atomic
from meshplan.core.errors import MeshplanError
from meshplan.costmodel.datasets.local import load as load_local

HIDDEN = (256, 512, 1024, 2048)
TOKENS = (32, 128, 512)
TP = (1, 2, 4, 8)


@dataclass(frozen=True)
class Shape:
    """One benchmark point in table convention (see ``costmodel.datasets.table``)."""

    op: str
    b: int
    m: int
    n: int
    k: int
    dtype: str
    variant: str


def llm_grid() -> list[Shape]:
    """Layer ops of a Llama-style block at TP-shard sizes (QKV, O, up, down GEMMs; norms; act; add; SDPA)."""
    out = []
    for h in HIDDEN:
        ffn = int(8 * h / 3 // 64 * 64)
        for t in TOKENS:
            for tp in TP:
                out += [Shape("matmul", 1, t, 3 * h // tp, h, "fp32", "qkv"),
                        Shape("matmul", 1, t, h, h // tp, "fp32", "o_proj"),
                        Shape("matmul", 1, t, 2 * ffn // tp, h, "fp32", "up"),
                        Shape("matmul", 1, t, h, ffn // tp, "fp32", "down"),
                        Shape("elementwise", 1, t * ffn // tp, 1, 1, "fp32", "silu_mul")]
            heads = max(1, h // 64)
            out += [Shape("layernorm", 1, t, h, 1, "fp32", "layer_norm"),
                    Shape("rmsnorm", 1, t, h, 1, "fp32", "rms_norm"),
                    Shape("softmax", 1, t, h, 1, "fp32", "softmax"),
                    Shape("activation", 1, t * h, 1, 1, "fp32", "gelu"),
                    Shape("elementwise", 1, t * h, 1, 1, "fp32", "add"),
                    Shape("bmm", heads, t, t, 64, "fp32", "scores"),
                    Shape("attention", heads, t, t, 64, "fp32", "sdpa"),
                    Shape("embedding", 1, t, h, 1, "fp32", "embedding"),
                    Shape("cast", 1, t * h, 1, 1, "fp32", "to_bf16"),
                    Shape("copy", 1, t * h, 1, 1, "fp32", "clone")]
    return out


# Random shapes per op class, as weights of ``n_random``. Every class gets enough that a 25% hold-out (the ``local``
# split) still leaves more than ``costmodel.train.MIN_ROWS`` training rows with the grid's own shapes; the norms and
# softmax, whose time is a few microseconds, get more, because dispatch and loop overheads vary more from shape to
# shape there than in a GEMM.
RANDOM_WEIGHTS = {"matmul": 2, "bmm": 2, "attention": 2, "layernorm": 3, "rmsnorm": 3, "softmax": 3,
                  "elementwise": 2, "activation": 2, "embedding": 2, "copy": 2, "cast": 2}


def random_shapes(n: int, seed: int = 0) -> list[Shape]:
    """``n`` random shapes split over the classes by ``RANDOM_WEIGHTS``; log-uniform sizes, 70% snapped to multiples
    of 64 (tile-aligned), 30% odd."""
    rng = np.random.default_rng(seed)

    def size(lo, hi):
        v = int(2 ** rng.uniform(np.log2(lo), np.log2(hi)))
        return max(lo, v // 64 * 64) if rng.random() < 0.7 and v >= 64 else v

    total_w = sum(RANDOM_WEIGHTS.values())
    kinds = [k for k, w in RANDOM_WEIGHTS.items() for _ in range(int(round(n * w / total_w)))]
    out = []
    for kind in kinds:
        if kind == "matmul":
            out.append(Shape(kind, 1, size(16, 1024), size(16, 2048), size(16, 2048), "fp32", "random"))
        elif kind == "bmm":
            out.append(Shape(kind, size(1, 32), size(16, 512), size(16, 512), size(16, 256), "fp32", "random"))
        elif kind == "attention":  # heads, s_q = s_kv, d_head
            s_len = size(16, 512)
            out.append(Shape(kind, size(1, 16), s_len, s_len, int(rng.choice([32, 64, 80, 128])), "fp32", "random"))
        elif kind in ("layernorm", "softmax", "rmsnorm", "embedding"):
            out.append(Shape(kind, 1, size(8, 1024), size(64, 4096), 1, "fp32", "random"))
        else:
            out.append(Shape(kind, 1, size(4096, 1 << 22), 1, 1, "fp32", "random"))
    return out


def _stmt(s: Shape, device: str):
    """``(callable, tensors)`` that runs the op once on ``device``."""
    import torch
    import torch.nn.functional as F

    dt = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[s.dtype]
    g = torch.Generator().manual_seed(0)
    r = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float32).to(device=device, dtype=dt)  # noqa: E731
    if s.op == "matmul":
        a, w = r(s.m, s.k), r(s.k, s.n)
        return lambda: torch.mm(a, w)
    if s.op == "bmm":
        a, w = r(s.b, s.m, s.k), r(s.b, s.k, s.n)
        return lambda: torch.bmm(a, w)
    if s.op == "attention":
        q, k, v = r(1, s.b, s.m, s.k), r(1, s.b, s.n, s.k), r(1, s.b, s.n, s.k)
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if s.op == "layernorm":
        x, w, bias = r(s.m, s.n), r(s.n), r(s.n)
        return lambda: F.layer_norm(x, (s.n,), w, bias)
    if s.op == "rmsnorm":
        x, w = r(s.m, s.n), r(s.n)
        return lambda: F.rms_norm(x, (s.n,), w)
    if s.op == "softmax":
        x = r(s.m, s.n)
        return lambda: torch.softmax(x, dim=-1)
    if s.op == "elementwise":
        x, y = r(s.m), r(s.m)
        return lambda: torch.add(x, y)
    if s.op == "activation":
        x = r(s.m)
        return lambda: F.gelu(x)
    if s.op == "embedding":
        table = r(4096, s.n)
        idx = torch.randint(0, 4096, (s.m,), generator=g).to(device)
        return lambda: F.embedding(idx, table)
    if s.op == "cast":
        x = r(s.m)
        return lambda: x.to(torch.bfloat16)
    if s.op == "copy":
        x = r(s.m)
        return lambda: x.clone()
    raise ValueError(s.op)


def time_once(fn, min_run_time: float, best: bool = False) -> float:
    """Seconds per call of ``fn`` from one ``torch.utils.benchmark`` blocked autorange (3 warm-ups first).

    Args:
        best: Return the fastest block instead of the median (for peak-rate measurements, where any slower
            block is interference from other processes, not the device).
    """
    from torch.utils import benchmark

    for _ in range(3):
        fn()
    m = benchmark.Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(min_run_time=min_run_time)
    return float(min(m.times)) if best else float(m.median)


def measure_device(device: str = "cpu", threads: int | None = None, quick: bool = False) -> dict:
    """Measure the device vector: peak GEMM FLOP/s (fp32, bf16), copy bandwidth, cost of one op call, cores, LLC,
    clock.

    Returns:
        A ``device.json`` dict (``DeviceSpec`` fields; units FLOP/s, bytes, bytes/s, Hz).
    """
    import torch

    n = 1024
    peaks = {}
    for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        a = torch.randn(n, n).to(device=device, dtype=dt)
        t = time_once(lambda: torch.mm(a, a), 0.1 if quick else 0.3, best=True)
        peaks[name] = 2.0 * n ** 3 / t
    x = torch.randn((8 if quick else 32) << 20).to(device)  # 32-128 MiB, larger than any LLC here
    y = torch.empty_like(x)  # preallocated: time the copy, not the allocator's page faults
    t = time_once(lambda: y.copy_(x), 0.1 if quick else 0.3, best=True)
    bw = 2.0 * x.numel() * 4 / t  # read + write
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        return {"name": p.name, "vendor": "nvidia", "peak_flops": peaks, "memory_bytes": int(p.total_memory),
                "mem_bw_bytes_per_s": bw, "sm_count": int(p.multi_processor_count),
                "l2_bytes": int(getattr(p, "L2_cache_size", 40 << 20)), "clock_hz": 1.5e9,
                "source": "measured by meshplan costmodel collect (GEMM peak, copy bandwidth)"}
    # The fixed cost of one op call on the CPU (dispatch, output allocation): a one-element add, median. GPUs keep
    # the catalogue's convention (costmodel.api.KERNEL_LAUNCH_S in the calibrated roofline, none in the trees').
    one = torch.ones(1)
    launch_s = time_once(lambda: torch.add(one, one), 0.02 if quick else 0.1)
    model, mhz = platform.processor() or "cpu", 2.0e3
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            if line.startswith("cpu MHz"):
                mhz = float(line.split(":", 1)[1])
    except OSError:
        pass
    llc = 32 << 20
    for idx in ("index3", "index2"):
        p = Path(f"/sys/devices/system/cpu/cpu0/cache/{idx}/size")
        if p.is_file():
            txt = p.read_text().strip()
            llc = int(txt[:-1]) * (1 << 20 if txt.endswith("M") else 1 << 10) if txt[-1] in "KM" else int(txt)
            break
    threads = threads or torch.get_num_threads()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 8 << 30
    return {"name": f"cpu-{threads}t", "vendor": "cpu", "peak_flops": peaks, "memory_bytes": int(mem),
            "mem_bw_bytes_per_s": bw, "launch_s": launch_s, "sm_count": int(threads), "l2_bytes": int(llc),
            "clock_hz": mhz * 1e6, "model": model, "torch": torch.__version__,
            "source": "measured by meshplan costmodel collect: peak = best 2n^3/t of an n x n GEMM, bw = clone, "
                      "launch = median one-element add"}


def collect(out_dir: str | Path, quick: bool = False, device: str = "cpu", threads: int | None = 1,
            n_random: int | None = None, repeats: int = 3, progress=None, seed: int = 0) -> Path:
    """Measure the shape grid on ``device`` and write ``local.csv`` + ``device.json`` into ``out_dir``.

    Args:
        out_dir: Output folder.
        quick: A small grid and short timings (for tests, ~10 s).
        device: ``cpu`` or ``cuda``.
        threads: torch intra-op threads (recorded in the device name); ``None`` keeps torch's default.
        n_random: Random shapes added to the LLM grid (default 40% of the grid).
        repeats: Timings per shape (noise = spread of the repeats).
        progress: ``progress(done, total)`` callback.
        seed: Random-shape and order seed.

    Returns:
        ``out_dir``.
    """
    import torch

    if repeats < 1 or (threads is not None and threads < 1):
        raise MeshplanError(f"--repeats {repeats} / --threads {threads}: expected counts >= 1")
    if threads:
        torch.set_num_threads(threads)
    grid = llm_grid()
    rng = np.random.default_rng(seed)
    if quick:
        grid = [grid[i] for i in rng.choice(len(grid), 20, replace=False)]
        grid = [s for s in grid if s.m * max(s.n, 1) <= (1 << 20) or s.op != "matmul"]
    n_random = n_random if n_random is not None else (6 if quick else int(1.5 * len(grid)))
    shapes = grid + random_shapes(n_random, seed)
    min_run = 0.005 if quick else 0.05
    before = measure_device(device, threads, quick)
    times = {s: [] for s in shapes}
    total = len(shapes) * repeats
    done = 0
    for _ in range(repeats):
        order = rng.permutation(len(shapes))  # shuffle per pass so drift does not alias with shape
        for i in order:
            s = shapes[i]
            times[s].append(time_once(_stmt(s, device), min_run))
            done += 1
            if progress:
                progress(done, total)
    # measured again after the grid: a process sharing the cores while the device vector was timed would otherwise
    # set it for every shape timed after it left (time_once's best-of holds only within one 0.1-0.3 s window)
    dev = fastest_device(before, measure_device(device, threads, quick))
    lines = ["device,op,variant,b,m,n,k,dtype,latency_s,noise"]
    for s, ts in times.items():
        med = float(np.median(ts))
        lines.append(f"{dev['name']},{s.op},{s.variant},{s.b},{s.m},{s.n},{s.k},{s.dtype},{med:.9g},"
                     f"{(max(ts) - min(ts)) / med:.4g}")
    out = Path(out_dir)
    write_atomic(out / "device.json", json.dumps(dev, indent=1))
    write_atomic(out / "local.csv", "\n".join(lines) + "\n")
    return out


def fastest_device(a: dict, b: dict) -> dict:
    """Two measurements of one device vector, each rate at its faster reading (peak GEMM FLOP/s per dtype, copy
    bandwidth) and the op call at its cheaper one: a slower reading is interference, not the device."""
    out = dict(a)
    out["peak_flops"] = {k: max(v, b["peak_flops"].get(k, 0.0)) for k, v in a["peak_flops"].items()}
    out["mem_bw_bytes_per_s"] = max(a["mem_bw_bytes_per_s"], b["mem_bw_bytes_per_s"])
    if "launch_s" in a:
        out["launch_s"] = min(a["launch_s"], b["launch_s"])
    return out


def collect_summary(out_dir: str | Path, **kw) -> dict:
    """``collect(out_dir, **kw)`` (``meshplan costmodel collect``), then what it wrote: ``{"out", "rows", "device",
    "median_noise_pct"}`` (the median relative spread of the repeats, %)."""
    collect(out_dir, **kw)
    table, _, _ = load_local(Path(out_dir))
    return {"out": str(out_dir), "rows": len(table), "device": str(table.device[0]) if len(table) else None,
            "median_noise_pct": round(float(100 * np.nanmedian(table.noise)), 2)}
