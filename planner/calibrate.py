"""Calibration of this host for ``local:N`` clusters (N CPU processes on one machine, gloo over loopback).

Measures, in about 10-20 s, and caches as JSON under ``~/.cache/meshplan/`` (``MESHPLAN_CACHE`` overrides):

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
- gloo collectives **as a training step issues them** (``measure_gloo_in_step``): with p = 2 and p = 4 processes
  placed as ``meshplan profile`` places ranks (one pinned core each when there are enough cores, else unpinned,
  sharing them), every all-reduce / all-gather follows about a millisecond of single-thread compute, and the
  mean wall time per call on the issuing thread is kept for sizes from 4 B to 4 MiB (sizes and kinds taken
  round-robin, so each mean spans the whole launch's drift; median of 3 launches). That is what a rank pays:
  the gloo worker thread runs on the rank's own core and must be woken after compute, the peer's worker too, and
  with more ranks than cores a peer may be descheduled (time-slicing). Measured here (2 cores): a 512 KiB
  all-reduce takes 0.18 ms back to back but 2-3 ms after compute; with 4 ranks on 2 cores a 64 KiB one takes
  2-6 ms. The mean, not the fastest call, because a step pays every call. When 4 ranks outnumber the cores, groups
  of 2 among the 4 (all groups at once, ``in_world_key``: "2of4") are measured too: the data-parallel groups of a
  DP2 x PP2 run, whose peer may be descheduled by the other group's ranks. ``allreduce_burst``: the mean of the
  calls after the first in a burst of back-to-back all-reduces after compute (a trainer that averages its
  gradients one tensor at a time pays the wake-up once, not per tensor).

The measured figures are achieved (not datasheet) rates; they stand in for the "peak" of the ``cpu-local`` device.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
import platform
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from meshplan.costmodel.collectives import Link
from meshplan.costmodel.devices import DeviceSpec, device_from_dict, device_to_dict, register_device
from meshplan.core.atomic import write_atomic
from meshplan.core.cache import cache_dir
from meshplan.core.errors import MeshplanError

CACHE_VERSION = 7  # 2: peak figures from the fastest block, not the median; 3: gloo collectives in a step;
# 4: groups inside an oversubscribed world (``in_world_key``); 5: back-to-back all-reduce bursts;
# 6: median of 3 launches; 7: sizes round-robin, 100 calls per size on own cores
DEVICE_NAME = "cpu-local"
GEMM_N = 768  # 2*768^3 = 0.9 GFLOP per call: long enough to time, short enough for a loaded 2-core box
COPY_BYTES = 64 * 2**20  # larger than any LLC, so the copy streams from DRAM
SMALL_BYTES = 4
FIT_BYTES = (4 * 2**20, 16 * 2**20)
CHECK_BYTES = 8 * 2**20
STEP_SIZES = (4, 64 * 2**10, 512 * 2**10, 4 * 2**20)  # bytes: DDP/FSDP/TP messages of small models lie here
STEP_GROUPS = (2, 4)  # process counts measured in-step (2 ranks, and 4 ranks: oversubscribed on 2 cores)
# calls per (kind, size) and launch: a mean, because the runs pay every call (a mean without the slowest 10%
# priced TP steps 25-35% low). Calls are bimodal here (~0.5 ms or 2.5-5.5 ms for 512 KiB after compute) and the
# slow share drifts over seconds, so the sizes and kinds are measured round-robin (each size's calls spread over
# the whole launch, not one contiguous half second) and ranks with their own cores take 100 calls (30: the 512 KiB
# mean went 1.53, 2.00, 3.50 ms over three calibrations of one morning while the runs paid 2.0-2.4 ms per call).
STEP_REPS = 100
STEP_REPS_SHARED = 30  # ranks that share cores: each call lasts ~20 ms, so fewer
STEP_SPAWNS = 3  # separate launches per table, median taken (``measure_gloo_in_step``)
SHARE_N = 512  # square fp32 matmul of the time-slicing measurement: 8 x 2*512^3 = 2.1 GFLOP, ~20 ms per chunk
SHARE_REPS = 8  # chunks per rank (the first is dropped as warm-up)
BURST_CALLS = 12  # back-to-back all-reduces per burst (a stage's per-tensor gradient averaging holds 10-70)
BURST_REPS = 12
STEP_COMPUTE_N = 256  # square fp32 matmul between calls: 2*256^3*8 = 268 MFLOP, about 2.5 ms on one core


@dataclass(frozen=True)
class Calibration:
    """One host calibration.

    Attributes:
        device: The ``cpu-local`` device (peak_flops = measured 1-thread GEMM FLOP/s; memory = host RAM, bytes).
        link: gloo loopback all-reduce link (bytes/s per rank, latency s).
        measured: Raw measurements (seconds, bytes) and the 8 MiB check of the alpha-beta fit.
        path: Cache file it was read from or written to.
        cached: True when read from the cache, False when just measured.
    """

    device: DeviceSpec
    link: Link
    measured: dict
    path: Path
    cached: bool


def _fingerprint() -> dict:
    import torch

    return {"host": platform.node(), "machine": platform.machine(), "cpu_count": os.cpu_count() or 1,
            "torch": torch.__version__.split("+")[0]}


def cache_path() -> Path:
    return cache_dir() / "calibration-cpu.json"


# ---------------------------------------------------------------- host facts (OS-reported)

def _ram_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        raise MeshplanError("calibration: cannot read this host's RAM size (os.sysconf)") from None


def _llc_bytes() -> tuple[int, str]:
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


def _clock_hz() -> tuple[float, str]:
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


# ---------------------------------------------------------------- measurements

def _one_thread(fn: Callable[[], float]) -> float:
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

    return _one_thread(run)


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

    return _one_thread(run)


def _free_port() -> int:
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


def _step_worker(rank: int, world: int, port: int, pin: bool, out_file: str, group: int = 0) -> None:
    """One rank of the in-step gloo measurement: compute, then a collective, mean seconds per call per size.

    ``group`` > 0: the collectives run in groups of that many consecutive ranks, all groups at once (the data-
    parallel groups of a pipeline-outer mesh, e.g. {0, 1} and {2, 3} of DP2 x PP2); 0: over the whole world.
    """
    import warnings

    import torch
    import torch.distributed as dist

    warnings.simplefilter("ignore", FutureWarning)  # all_gather_into_tensor's rename notice, once per call
    if pin and hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[rank % len(cores)]})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=_dt.timedelta(seconds=60))
    try:
        pg, size = None, world
        if group:
            groups = [dist.new_group(list(range(g, g + group))) for g in range(0, world, group)]  # all ranks call
            pg, size = groups[rank // group], group
        a = torch.randn(STEP_COMPUTE_N, STEP_COMPUTE_N)
        bufs = {}
        for n in STEP_SIZES:
            t = torch.ones(max(1, n // 4))
            bufs[n] = (t, torch.empty(size * t.numel()))
            dist.all_reduce(t, group=pg)
            dist.all_gather_into_tensor(bufs[n][1], t, group=pg)  # warm-up: connection and buffers
        calls: dict = {(kind, n): [] for kind in ("allreduce", "allgather") for n in STEP_SIZES}
        dist.barrier()
        for _ in range(STEP_REPS if pin else STEP_REPS_SHARED):
            for kind, n in calls:  # round-robin: every size sees the whole launch's drift alike
                t, out = bufs[n]
                for _ in range(8):
                    a @ a  # the step's compute between collectives (the worker threads go idle)
                t0 = time.perf_counter()
                if kind == "allreduce":
                    dist.all_reduce(t, group=pg)
                else:
                    dist.all_gather_into_tensor(out, t, group=pg)  # what FSDP2 issues
                calls[(kind, n)].append(time.perf_counter() - t0)
        res: dict = {"allreduce": {}, "allgather": {}}
        for (kind, n), xs in calls.items():
            res[kind][str(n)] = sum(xs) / len(xs)
        for n in STEP_SIZES:
            t = bufs[n][0]
            # a burst: BURST_CALLS all-reduces back to back after compute (a trainer averaging its gradients one
            # tensor at a time); the calls after the first, whose wake-up the row above holds
            dist.barrier()
            bursts = []
            for _ in range(BURST_REPS):
                for _ in range(8):
                    a @ a
                dist.all_reduce(t, group=pg)
                t0 = time.perf_counter()
                for _ in range(BURST_CALLS - 1):
                    dist.all_reduce(t, group=pg)
                bursts.append((time.perf_counter() - t0) / (BURST_CALLS - 1))
            res.setdefault("allreduce_burst", {})[str(n)] = sum(bursts) / len(bursts)
        if rank == 0:
            Path(out_file).write_text(json.dumps(res))
    finally:
        dist.destroy_process_group()


def _share_worker(rank: int, world: int, port: int, out_file: str) -> None:
    """One of ``world`` unpinned ranks on fewer cores: compute a chunk, all-reduce 4 B, repeat; wall per chunk."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=_dt.timedelta(seconds=60))
    try:
        a, t = torch.randn(SHARE_N, SHARE_N), torch.ones(1)
        dist.all_reduce(t)
        walls = []
        for _ in range(SHARE_REPS):
            t0 = time.perf_counter()
            for _ in range(8):
                a @ a
            dist.all_reduce(t)  # the step's synchronisation: every rank waits for the slowest
            walls.append(time.perf_counter() - t0)
        if rank == 0:
            Path(out_file).write_text(json.dumps(walls[1:]))
    finally:
        dist.destroy_process_group()


def measure_time_slicing(world: int) -> Optional[dict]:
    """How well ``world`` ranks sharing fewer cores use them between synchronisations (None: enough cores).

    Each rank computes the same chunk (8 one-thread ``SHARE_N`` matmuls) and then all-reduces 4 B, repeatedly.
    Perfect sharing would take ``chunk_s x world / cores`` per chunk (work conservation); the measured wall per
    chunk is longer because a core idles once both of its ranks wait in the collective for ranks that the other
    core's scheduler has not finished, and every switch costs caches. ``efficiency`` = ideal / measured.
    """
    import torch
    import torch.multiprocessing as mp

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if world <= cores:
        return None

    def chunk() -> float:
        a = torch.randn(SHARE_N, SHARE_N)
        best = math.inf
        for _ in range(4):
            t0 = time.perf_counter()
            for _ in range(8):
                a @ a
            best = min(best, time.perf_counter() - t0)
        return best

    chunk_s = _one_thread(chunk)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "share.json"
        try:
            mp.spawn(_share_worker, args=(world, _free_port(), str(out)), nprocs=world, join=True)
        except Exception as exc:
            first = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            raise MeshplanError(f"calibration: {world}-process time-slicing run failed: {first}") from None
        walls = json.loads(out.read_text())
    wall_s = sum(walls) / len(walls)
    ideal_s = chunk_s * world / cores
    return {"world": world, "cores": cores, "chunk_s": chunk_s, "wall_per_chunk_s": wall_s,
            "efficiency": min(1.0, ideal_s / wall_s)}


def measure_gloo_in_step() -> dict:
    """Mean gloo all-reduce / all-gather time per call after compute, {p: {kind: {bytes: s}}} for ``STEP_GROUPS``.

    Ranks are pinned one per core when there are enough cores, as ``meshplan profile`` pins them; otherwise they
    share the cores unpinned, as a ``local:N`` run with N > cores does.
    """
    import torch.multiprocessing as mp

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    runs = [(str(p), p, 0) for p in STEP_GROUPS]
    # groups inside an oversubscribed world: a group's peer may be descheduled by the other groups' ranks
    runs += [(in_world_key(g, w), w, g) for w in STEP_GROUPS if w > cores for g in STEP_GROUPS if g < w]
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        for key, p, group in runs:
            spawns = []
            for i in range(STEP_SPAWNS):
                out = Path(tmp) / f"step{key}.{i}.json"
                try:
                    mp.spawn(_step_worker, args=(p, _free_port(), p <= cores, str(out), group), nprocs=p, join=True)
                except Exception as exc:
                    first = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
                    raise MeshplanError(f"calibration: {p}-process gloo collectives on 127.0.0.1 failed: "
                                        f"{first}") from None
                spawns.append(json.loads(out.read_text()))
            # per (kind, size) the median over separate launches: a launch's thread placement moved every mean
            # it measured together (a 512 KiB all-reduce 1.3 ms in one calibration, 2.4 ms in the next)
            res[key] = {kind: {n: sorted(sp[kind][n] for sp in spawns)[len(spawns) // 2] for n in spawns[0][kind]}
                        for kind in spawns[0]}
    return res


def in_world_key(group: int, world: int) -> str:
    """Key of the in-step table of ``group``-rank collectives measured inside a ``world``-rank oversubscribed run."""
    return f"{group}of{world}"


def measure_gloo_allreduce() -> dict:
    """Fastest all-reduce times (s) of 4 B, 4/16 MiB (fit) and 8 MiB (check) over 2 gloo processes on loopback."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "gloo.json"
        try:
            mp.spawn(_gloo_worker, args=(_free_port(), str(out)), nprocs=2, join=True)
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


# ---------------------------------------------------------------- calibrate / load

def calibrate(progress: Optional[Callable[[str], None]] = None) -> Calibration:
    """Measure this host now and write the cache atomically. ``progress`` is called before each step."""
    import torch

    step = progress or (lambda _s: None)
    t0 = time.perf_counter()
    step("gemm fp32")
    fp32 = measure_gemm_flops("fp32")
    step("gemm bf16")
    bf16 = measure_gemm_flops("bf16")
    step("memory bandwidth")
    mem_bw = measure_copy_bandwidth()
    step("gloo all-reduce (2 processes)")
    times = measure_gloo_allreduce()
    link, check = fit_link(times)
    step("gloo collectives in a step (2 and 4 processes, groups of 2 among 4)")
    in_step = measure_gloo_in_step()
    step("time-slicing (4 processes)")
    slicing = measure_time_slicing(max(STEP_GROUPS))
    llc, llc_src = _llc_bytes()
    clock, clock_src = _clock_hz()
    when = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    measured = f"measured by meshplan devices calibrate on {when}"
    dev = DeviceSpec(
        name=DEVICE_NAME, vendor="cpu",
        peak_flops={"fp32": fp32, "bf16": bf16},
        memory_bytes=_ram_bytes(), mem_bw_bytes_per_s=mem_bw, sm_count=os.cpu_count() or 1,
        l2_bytes=llc, clock_hz=clock, family="local", aliases=("local", "cpu"),
        sources={"peak_flops": f"{measured}: torch.mm {GEMM_N}x{GEMM_N}, 1 thread, torch.utils.benchmark fastest block (contention only slows)",
                 "memory_bytes": "os.sysconf SC_PHYS_PAGES x SC_PAGE_SIZE (host RAM)",
                 "mem_bw": f"{measured}: 1-thread copy of {COPY_BYTES >> 20} MiB (2x bytes moved)",
                 "sm_count": "os.cpu_count() (logical CPUs)", "l2_bytes": llc_src, "clock_hz": clock_src},
    )
    record = {"version": CACHE_VERSION, "fingerprint": _fingerprint(), "created": when,
              "wall_s": time.perf_counter() - t0, "torch_threads_used": 1,
              "device": device_to_dict(dev),
              "link": {"name": link.name, "bandwidth_bytes_per_s": link.bandwidth_bytes_per_s,
                       "latency_s": link.latency_s},
              "measured": {**times, **check, "in_step_s": in_step, "time_slicing": slicing, "torch": torch.__version__}}
    path = write_atomic(cache_path(), json.dumps(record, indent=2) + "\n")
    register_device(dev)
    return Calibration(dev, link, record["measured"], path, cached=False)


def _read_cache() -> Optional[Calibration]:
    path = cache_path()
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # absent or unreadable: measure again
    if record.get("version") != CACHE_VERSION or record.get("fingerprint") != _fingerprint():
        return None  # another host, CPU count or torch: stale
    try:
        dev = device_from_dict(record["device"], str(path))
        ld = record["link"]
        link = Link(str(ld["name"]), float(ld["bandwidth_bytes_per_s"]), float(ld["latency_s"]))
    except (KeyError, TypeError, ValueError, MeshplanError):
        return None
    if not (link.bandwidth_bytes_per_s > 0 and link.latency_s > 0 and math.isfinite(link.bandwidth_bytes_per_s)):
        return None
    if "in_step_s" not in record.get("measured", {}):
        return None
    register_device(dev)
    return Calibration(dev, link, dict(record.get("measured", {})), path, cached=True)


def load_calibration(force: bool = False, progress: Optional[Callable[[str], None]] = None) -> Calibration:
    """The cached calibration of this host, measuring it first when absent, stale or ``force``."""
    if not force:
        cal = _read_cache()
        if cal is not None:
            return cal
    return calibrate(progress)


def cached_calibration() -> Optional[Calibration]:
    """The cached calibration if there is a valid one; never measures."""
    return _read_cache()


def in_step_collective_s(measured: dict, kind: str, nbytes: float, p: int, world: int = 0) -> Optional[float]:
    """Mean time (s) of one gloo ``kind`` over ``p`` ranks issued inside a step, from the calibration.

    ``nbytes`` is the all-reduced tensor, or each rank's all-gather input (its shard). ``world`` > ``p``: the
    group runs inside a larger run; where that run was measured oversubscribed (``in_world_key``), its table
    is used, else the ``p``-rank one.

    Linear interpolation between the measured sizes; above the largest, the largest size's time plus the extra
    bytes at the ring rate of the alpha-beta link (``measured['fit_s']``); below the smallest, the smallest
    size's time (a fixed cost). None when ``p`` or ``kind`` was not measured (callers use alpha-beta).
    ``reducescatter`` is priced as an all-reduce (gloo has none: torch issues an all-reduce).
    (Tried: an affine fit over 8 sizes to average each size's noise; it priced the 256-512 KiB all-reduces of
    a 2-rank TP step at 0.9-1.4 ms where the runs paid about 2 ms, 20-35% low: the 4-size interpolation stays.)
    """
    tables = measured.get("in_step_s", {})
    table = tables.get(in_world_key(p, world)) or tables.get(str(p), {}) if world > p else tables.get(str(p), {})
    row = table.get("allgather" if kind == "allgather" else "allreduce" if kind in ("allreduce", "reducescatter")
                    else kind if kind == "allreduce_burst" else "", {})
    if not row:
        return None
    pts = sorted((int(k), float(v)) for k, v in row.items())
    for i in range(1, len(pts)):  # a larger message never costs less: noise in a mean of a dozen calls, clipped
        pts[i] = (pts[i][0], max(pts[i][1], pts[i - 1][1]))
    if nbytes <= pts[0][0]:
        return pts[0][1]
    for (n0, t0), (n1, t1) in zip(pts, pts[1:]):
        if nbytes <= n1:
            return t0 + (t1 - t0) * (nbytes - n0) / (n1 - n0)
    n_max, t_max = pts[-1]
    fit = measured.get("fit_s", [])
    bw = ((FIT_BYTES[-1] - FIT_BYTES[0]) / (fit[-1] - fit[0])) if len(fit) == 2 and fit[-1] > fit[0] else None
    if not bw:
        return t_max * nbytes / n_max
    ring = (p - 1.0) if kind == "allgather" else 2.0 * (p - 1) / p  # ring bytes per rank / nbytes (p=2 AR: 1)
    return t_max + ring * (nbytes - n_max) / bw


def local_cluster(n: int):
    """``local:N``: one node with ``n`` CPU processes joined by the calibrated gloo loopback link.

    Each process gets ``RAM / n`` bytes; when ``n`` exceeds the logical CPUs, each process's FLOP/s and memory
    bandwidth are scaled by ``cpus / n`` (the 1-thread figures assume a core per process).
    """
    from meshplan.planner.cluster import ClusterSpec, NodeGroup

    if n < 1:
        raise MeshplanError(f"cluster 'local:{n}': local:N needs a process count N >= 1")
    cal = load_calibration()
    share = min(1.0, (os.cpu_count() or 1) / n)
    dev = dataclasses.replace(
        cal.device, memory_bytes=cal.device.memory_bytes // n,
        peak_flops={k: v * share for k, v in cal.device.peak_flops.items()},
        mem_bw_bytes_per_s=cal.device.mem_bw_bytes_per_s * share)
    group = NodeGroup(1, n, dev, cal.link, nic_link=cal.link)
    return ClusterSpec(f"local:{n}", (group,), cal.link)
