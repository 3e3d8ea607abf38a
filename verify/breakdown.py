"""Measured step breakdown of a profiled run: compute, exposed communication and pipeline bubble, per step.

Read through the profiler's API (:func:`profiler.runs.load_run`: one Kineto trace per rank, events with
``kind``, ``lane`` and ``step``). For one rank and one ``ProfilerStep`` window W (seconds):

* ``C`` = union of the collective events in flight on that rank (``gloo:*`` annotations on the gloo thread,
  NCCL kernels on GPUs) inside W; **exposed comm** = |C|. On a CPU rank pinned to one core the gloo
  transport runs on that same core, so a collective in flight is not hidden behind compute (see
  planner/estimate/cpu.py); a wait for a late peer is counted here too;
* ``M`` = union of the ops on the rank's training thread (the ``ProfilerStep`` span itself excluded);
  **compute** = |M - C|;
* the rest of W, when the main thread runs no op and no collective is in flight, is the pipeline **bubble**
  on ranks that send/recv activations in that step (Narayanan et al. 2021 §2.2: a stage idles until its
  neighbour's micro-batch arrives; p2p transfers are asynchronous and overlap both), and interpreter time
  between ops (compute) on ranks that do not.

A straggler shows up as more *compute* on its own rank and more *exposed comm* (waiting inside collectives)
on its peers; the breakdown reported for a run is the one of its critical rank (the rank with the most
compute), whose median over steps is taken phase by phase.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from meshplan.profiler.runs import load_run

PHASES = ("compute_s", "exposed_comm_s", "bubble_s")
P2P = ("sendrecv", "send", "recv", "isend", "irecv")  # profiler.trace collective types of point-to-point ops


@dataclass(frozen=True)
class StepPhases:
    """One rank's step split into phases, seconds (they sum to ``step_s``)."""

    rank: int
    step: int
    step_s: float
    compute_s: float
    exposed_comm_s: float
    bubble_s: float


def _union_us(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def _minus(intervals: list[tuple[float, float]], cut: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """``intervals`` minus ``cut`` (both unions, sorted)."""
    out = []
    for a, b in intervals:
        cur = a
        for c, d in cut:
            if d <= cur or c >= b:
                continue
            if c > cur:
                out.append((cur, c))
            cur = max(cur, d)
        if cur < b:
            out.append((cur, b))
    return out


def rank_step_phases(trace, step: int) -> StepPhases | None:
    """Phases of one rank's step (``trace``: :class:`profiler.trace.RankTrace`); None if the step is absent."""
    if step not in trace.steps:
        return None
    start, dur = trace.steps[step]
    lo, hi = start, start + dur
    coll, busy, n_p2p = [], [], 0
    for e in trace.events:
        if e.end_us <= lo or e.ts_us >= hi:
            continue
        iv = (max(lo, e.ts_us), min(hi, e.end_us))
        if e.kind == "comm":
            if e.coll in P2P:
                n_p2p += 1
            else:
                coll.append(iv)
        elif e.lane == trace.main_lane and not e.name.startswith("ProfilerStep"):
            busy.append(iv)
    coll_u = _union_us(coll)
    busy_u = _union_us(busy)
    comm_us = _length(coll_u)
    compute_us = _length(_minus(busy_u, coll_u))
    idle_us = max(0.0, dur - comm_us - compute_us)
    if n_p2p:  # a pipeline stage: the main thread idles waiting for its neighbour's micro-batch
        bubble_us = idle_us
    else:  # no p2p: the gaps between ops are interpreter time, i.e. compute
        bubble_us, compute_us = 0.0, compute_us + idle_us
    return StepPhases(trace.rank, step, dur / 1e6, compute_us / 1e6, comm_us / 1e6, bubble_us / 1e6)


@dataclass(frozen=True)
class MeasuredBreakdown:
    """Median phases of the critical rank over the measured steps, seconds, and every rank-step row."""

    rank: int
    compute_s: float
    exposed_comm_s: float
    bubble_s: float
    rows: tuple[StepPhases, ...]

    def as_dict(self) -> dict:
        return {"rank": self.rank, "compute_s": self.compute_s, "exposed_comm_s": self.exposed_comm_s,
                "bubble_s": self.bubble_s}


def measured_breakdown(run_dir: str | Path) -> MeasuredBreakdown:
    """Load the run's traces (profiler-core) and split every rank's steps into phases.

    Raises:
        MeshplanError: the folder holds no readable trace (from :func:`profiler.runs.load_run`).
    """
    run = load_run(run_dir)
    rows: list[StepPhases] = []
    for trace in run.ranks.values():
        for s in sorted(trace.steps):
            ph = rank_step_phases(trace, s)
            if ph is not None:
                rows.append(ph)
    return summarize(rows)


def summarize(rows: list[StepPhases]) -> MeasuredBreakdown:
    """Median phases of the rank with the largest median compute (the critical rank)."""
    by_rank: dict[int, list[StepPhases]] = {}
    for r in rows:
        by_rank.setdefault(r.rank, []).append(r)
    if not by_rank:
        return MeasuredBreakdown(0, 0.0, 0.0, 0.0, ())
    med = {rk: {p: statistics.median(getattr(x, p) for x in xs) for p in PHASES} for rk, xs in by_rank.items()}
    crit = max(med, key=lambda rk: (med[rk]["compute_s"], -rk))
    m = med[crit]
    return MeasuredBreakdown(crit, m["compute_s"], m["exposed_comm_s"], m["bubble_s"], tuple(rows))
