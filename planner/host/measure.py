"""Measurements of this host for ``local:N`` clusters: GEMM throughput, memory bandwidth, gloo alpha-beta.

- GEMM throughput, fp32 and bf16, FLOP/s: ``torch.mm`` of square matrices timed with ``torch.utils.benchmark``
  on **one thread**, because ``torchrun`` starts every worker with ``OMP_NUM_THREADS=1`` when nproc > 1
  (torch.distributed.run docs), so that is what each rank of a local run gets.
- Memory bandwidth, bytes/s: a copy of a 64 MiB fp32 tensor (read + write = 2 x 64 MiB moved per copy),
  also on one thread.
- gloo all-reduce over loopback with a real 2-process ``torch.distributed`` run (``torch.multiprocessing.spawn``):
  for p = 2 the ring model gives T(n) = 2 alpha + n / B (costmodel/collectives.py), so alpha = T(4 bytes) / 2
  and B is the least-squares fit of n / (T(n) - 2 alpha) over n = 4 and 16 MiB (gradient-bucket sizes: DDP's
  default bucket is 25 MiB); T(8 MiB) is measured too and kept to check the fit. Messages that fit in the CPU
  caches (<= 1 MiB) run faster per byte than this B, so the model is conservative for them.
- Host facts the OS reports: RAM, the largest cache level, the clock, the cores this process may use.

The measured figures are achieved (not datasheet) rates; they stand in for the "peak" of the ``cpu-local`` device.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Callable

from meshplan.core.errors import MeshplanError
from meshplan.costmodel.collectives import Link

GEMM_N = 768  # 2*768^3 = 0.9 GFLOP per call: long enough to time, short enough for a loaded 2-core box
COPY_BYTES = 64 * 2**20  # larger than any LLC, so the copy streams from DRAM
SMALL_BYTES = 4
FIT_BYTES = (4 * 2**20, 16 * 2**20)
CHECK_BYTES = 8 * 2**20
# A fit whose 8 MiB check lands outside this band (predicted / measured) was taken while other work held the cores:
# the link is measured again, up to LINK_ATTEMPTS times, and the attempt closest to its check kept
CHECK_BAND = (0.5, 2.0)
LINK_ATTEMPTS = 3


def usable_cores() -> int:
    """Cores this process may run on (its affinity set; torchrun children inherit it)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def ram_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        raise MeshplanError("calibration: cannot read this host's RAM size (os.sysconf)") from None


def llc_bytes() -> tuple[int, str]:
    """Largest CPU cache reported by Linux sysfs (bytes, source)."""
    best = 0
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for idx in base.glob("index*"):
        try:
            txt = (idx / "size").read_text().strip().upper()
        except OSError:
            continue
        mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(txt[-1:], 1)
        digits = txt.rstrip("KMG")
        if digits.isdigit():
            best = max(best, int(digits) * mult)
    if best:
        return best, "sysfs /sys/devices/system/cpu/cpu0/cache (largest level)"
    for name in ("SC_LEVEL3_CACHE_SIZE", "SC_LEVEL2_CACHE_SIZE"):
        try:
            v = os.sysconf(name)
        except (ValueError, OSError):
            continue
        if v and v > 0:
            return int(v), f"os.sysconf({name})"
    return 2**20, "not reported by the OS; 1 MiB assumed"


def clock_hz() -> tuple[float, str]:
    try:
        khz = float(Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").read_text())
        return khz * 1e3, "sysfs cpufreq cpuinfo_max_freq"
    except (OSError, ValueError):
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("cpu mhz"):
                return float(line.split(":")[1]) * 1e6, "/proc/cpuinfo cpu MHz"
    except (OSError, ValueError, IndexError):
        pass
    return 1e9, "not reported by the OS; 1 GHz assumed"


def one_thread(fn: Callable[[], float]) -> float:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn()
    finally:
        torch.set_num_threads(before)


def _fastest(m) -> float:
    """Seconds per call of the fastest measured block of a ``torch.utils.benchmark.Measurement``."""
    return min(m.times)


def measure_gemm_flops(dtype: str, n: int = GEMM_N, min_run_time_s: float = 0.4) -> float:
    """Achieved ``torch.mm`` FLOP/s on one thread for ``n x n`` matrices of ``dtype`` (``fp32``/``bf16``)."""
    import torch
    import torch.utils.benchmark as benchmark

    tdt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]

    def run() -> float:
        a = torch.randn(n, n).to(tdt)
        b = torch.randn(n, n).to(tdt)
        torch.mm(a, b)  # warm-up: first call allocates and picks the kernel
        m = benchmark.Timer("torch.mm(a, b)", globals={"torch": torch, "a": a, "b": b},
                            num_threads=1).blocked_autorange(min_run_time=min_run_time_s)
        # fastest block: a shared host only ever slows a run down, so the best block is closest to the peak
        return 2.0 * n**3 / _fastest(m)

    return one_thread(run)


def measure_copy_bandwidth(nbytes: int = COPY_BYTES, min_run_time_s: float = 0.3) -> float:
    """Achieved memory bandwidth of a large tensor copy on one thread, bytes/s (read + write counted)."""
    import torch
    import torch.utils.benchmark as benchmark

    def run() -> float:
        src = torch.ones(nbytes // 4)
        dst = torch.empty_like(src)
        dst.copy_(src)
        m = benchmark.Timer("dst.copy_(src)", globals={"src": src, "dst": dst},
                            num_threads=1).blocked_autorange(min_run_time=min_run_time_s)
        return 2.0 * nbytes / _fastest(m)

    return one_thread(run)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _time_allreduces(dist, torch, sizes: list[int], reps: int) -> list[float]:
    """Fastest time (s) of each all-reduce size; sizes are interleaved round by round, so a burst of load from
    other processes on a shared host slows every size alike instead of one."""
    bufs = [torch.ones(max(1, n // 4)) for n in sizes]
    for t in bufs:
        dist.all_reduce(t)  # warm-up (connection set-up, buffers)
    best = [math.inf] * len(sizes)
    for _ in range(reps):
        for i, t in enumerate(bufs):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            # the fastest repetition: on a shared host the slower ones measure other people's work, not the
            # link (NeuSight's kernel timings make the same choice, see shared/kernels/neusight/PROVENANCE.md)
            best[i] = min(best[i], time.perf_counter() - t0)
    return best


def _gloo_worker(rank: int, port: int, out_file: str) -> None:
    """One rank of the 2-process gloo measurement (module-level so ``spawn`` can import it)."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=_dt.timedelta(seconds=60))
    try:
        small = _time_allreduces(dist, torch, [SMALL_BYTES], 200)[0]
        big = _time_allreduces(dist, torch, [*FIT_BYTES, CHECK_BYTES], 12)
        res = {"small_s": small, "fit_s": big[:len(FIT_BYTES)], "check_s": big[-1]}
        if rank == 0:
            Path(out_file).write_text(json.dumps(res))
    finally:
        dist.destroy_process_group()


def measure_gloo_allreduce() -> dict:
    """Fastest all-reduce times (s) of 4 B, 4/16 MiB (fit) and 8 MiB (check) over 2 gloo processes on loopback."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "gloo.json"
        try:
            mp.spawn(_gloo_worker, args=(free_port(), str(out)), nprocs=2, join=True)
        except Exception as exc:  # a child failure arrives as ProcessRaisedException/ProcessExitedException
            first = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            raise MeshplanError(f"calibration: 2-process gloo all-reduce on 127.0.0.1 failed: {first}") from None
        return json.loads(out.read_text())


def fit_link(times: dict) -> tuple[Link, dict]:
    """Alpha-beta fit for p = 2 (T = 2 alpha + n / B): alpha from 4 B, B by least squares over the fit sizes.

    Returns:
        The link and a check of the fit at 8 MiB (predicted / measured time).
    """
    alpha = times["small_s"] / 2
    transfer = [t - 2 * alpha for t in times["fit_s"]]
    if min(transfer) <= 0:
        raise MeshplanError(f"calibration: large all-reduces ({times['fit_s']} s) were not slower than 4 B "
                            f"({times['small_s']:.3g} s); the host is too loaded to measure, retry")
    # minimise sum (n_i / B - x_i)^2 over 1/B: 1/B = sum n_i x_i / sum n_i^2
    inv_bw = sum(n * x for n, x in zip(FIT_BYTES, transfer)) / sum(n * n for n in FIT_BYTES)
    bw = 1.0 / inv_bw
    predicted = 2 * alpha + CHECK_BYTES / bw
    check = {"check_bytes": CHECK_BYTES, "check_measured_s": times["check_s"], "check_predicted_s": predicted,
             "check_ratio": predicted / times["check_s"]}
    return Link("gloo-loopback", bw, alpha), check


def measure_link(measure: Callable[[], dict] | None = None,
                 attempts: int = LINK_ATTEMPTS) -> tuple[Link, dict, dict]:
    """The loopback link (``fit_link`` over ``measure_gloo_allreduce``'s times), measured again while its 8 MiB
    check falls outside ``CHECK_BAND`` or the host was too loaded to fit at all: a shared host only ever slows a
    measurement, and one burst of other work can land on one size. Keeps the attempt whose check is closest to 1.

    Args:
        measure: What takes one set of all-reduce times (``measure_gloo_allreduce``, the default).
        attempts: The most measurements taken.

    Returns:
        ``(link, check, times)``; ``check`` carries ``link_attempts``, how many were taken.

    Raises:
        MeshplanError: no attempt could be fitted (``fit_link``'s message, from the last).
    """
    measure = measure or measure_gloo_allreduce
    best, failure = None, None
    for n in range(1, attempts + 1):
        times = measure()
        try:
            link, check = fit_link(times)
        except MeshplanError as exc:
            failure = exc
            continue
        if best is None or abs(math.log(check["check_ratio"])) < abs(math.log(best[1]["check_ratio"])):
            best = (link, check, times)
        if CHECK_BAND[0] < check["check_ratio"] < CHECK_BAND[1]:
            break
    if best is None:
        raise failure
    return best[0], {**best[1], "link_attempts": n}, best[2]
