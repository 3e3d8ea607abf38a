"""gloo collectives as a training step issues them: the calibration's in-step tables and the price read from them.

With p = 2 and p = 4 processes placed as ``meshplan profile`` places ranks (one pinned core each when there are
enough cores, else unpinned, sharing them), every all-reduce / all-gather follows about a millisecond of
single-thread compute, and the mean wall time per call on the issuing thread is kept for sizes from 4 B to 4 MiB
(sizes and kinds taken round-robin, so each mean spans the whole launch's drift; median of 3 launches). That is
what a rank pays: the gloo worker thread runs on the rank's own core and must be woken after compute, the peer's
worker too, and with more ranks than cores a peer may be descheduled (time-slicing). Measured here (2 cores): a
512 KiB all-reduce takes 0.18 ms back to back but 2-3 ms after compute; with 4 ranks on 2 cores a 64 KiB one
takes 2-6 ms. The mean, not the fastest call, because a step pays every call. When 4 ranks outnumber the cores,
groups of 2 among the 4 (all groups at once, ``in_world_key``: "2of4") are measured too: the data-parallel groups
of a DP2 x PP2 run, whose peer may be descheduled by the other group's ranks. ``allreduce_burst``: the mean of the
calls after the first in a burst of back-to-back all-reduces after compute (a trainer that averages its gradients
one tensor at a time pays the wake-up once, not per tensor). ``measure_time_slicing``: how well ranks sharing
fewer cores use them between synchronisations.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Optional

from meshplan.core.errors import MeshplanError
from meshplan.planner.host.measure import FIT_BYTES, free_port, one_thread, usable_cores

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
# ``quick``: a first look (and the test suite's one calibration): 20 / 8 calls per size, one launch per table,
# 4 bursts: the whole calibration 34 s instead of 121 s on a quiet 2-core host; its means carry the
# launch-to-launch drift noted above.
QUICK = {"reps": 20, "reps_shared": 8, "spawns": 1, "bursts": 4}
FULL = {"reps": STEP_REPS, "reps_shared": STEP_REPS_SHARED, "spawns": STEP_SPAWNS, "bursts": BURST_REPS}


def _step_worker(rank: int, world: int, port: int, pin: bool, out_file: str, group: int = 0,
                 effort: Optional[dict] = None) -> None:
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
        effort = effort or FULL
        for _ in range(effort["reps"] if pin else effort["reps_shared"]):
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
            for _ in range(effort["bursts"]):
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

    cores = usable_cores()
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

    chunk_s = one_thread(chunk)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "share.json"
        try:
            mp.spawn(_share_worker, args=(world, free_port(), str(out)), nprocs=world, join=True)
        except Exception as exc:
            first = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            raise MeshplanError(f"calibration: {world}-process time-slicing run failed: {first}") from None
        walls = json.loads(out.read_text())
    wall_s = sum(walls) / len(walls)
    ideal_s = chunk_s * world / cores
    return {"world": world, "cores": cores, "chunk_s": chunk_s, "wall_per_chunk_s": wall_s,
            "efficiency": min(1.0, ideal_s / wall_s)}


def measure_gloo_in_step(quick: bool = False) -> dict:
    """Mean gloo all-reduce / all-gather time per call after compute, {p: {kind: {bytes: s}}} for ``STEP_GROUPS``
    (``quick``: the ``QUICK`` effort instead of ``FULL``).

    Ranks are pinned one per core when there are enough cores, as ``meshplan profile`` pins them; otherwise they
    share the cores unpinned, as a ``local:N`` run with N > cores does.
    """
    import torch.multiprocessing as mp

    cores = usable_cores()
    runs = [(str(p), p, 0) for p in STEP_GROUPS]
    # groups inside an oversubscribed world: a group's peer may be descheduled by the other groups' ranks
    runs += [(in_world_key(g, w), w, g) for w in STEP_GROUPS if w > cores for g in STEP_GROUPS if g < w]
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        for key, p, group in runs:
            spawns = []
            effort = QUICK if quick else FULL
            for i in range(effort["spawns"]):
                out = Path(tmp) / f"step{key}.{i}.json"
                try:
                    mp.spawn(_step_worker, args=(p, free_port(), p <= cores, str(out), group, effort), nprocs=p,
                             join=True)
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
