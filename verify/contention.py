"""How much of its core a CPU rank really got during a run (shared hosts): the contention factor.

A ``local:N`` plan prices its compute with single-thread timings (``planner.host.cpu_bench.HostBench``, the fastest of
several repetitions: the speed of a free core). On a shared machine other people's processes take a share of
every core and evict its caches, so the same run can be 1.3-3x slower an hour later (issue 6: "This machine is
noisy"). The run's own trace says how much: an operator that runs many times with the same input shapes
(``aten::addmm`` of one layer shape, ``aten::gelu`` ...) takes its free-core time when undisturbed and longer
when the core was taken or its caches were cold, so per rank

    contention = sum(traced durations) / sum(count x fastest traced duration)      over (op, shapes) groups

over the ``aten::`` operators of the training thread that occur at least ``MIN_REPEATS`` times (collective
and wait ops excluded: their time depends on peers, not on the core). 1.0 = the cores were free.
``meshplan check --contention`` scales the prediction by it before judging (and keeps the raw error).
"""
from __future__ import annotations

import statistics
from pathlib import Path

from meshplan.profiler.runs import load_run

MIN_REPEATS = 5  # an (op, shapes) group needs this many calls for its fastest one to be a free-core time
MIN_CALLS = 50  # fewer qualifying calls on a rank: no estimate for that rank
_PEER_BOUND = ("c10d", "wait", "gloo", "nccl", "recv", "send", "barrier", "record_param_comms")


def rank_contention(trace) -> float | None:
    """Contention factor of one rank (``profiler.trace.RankTrace``), or None with too few repeated ops."""
    groups: dict[tuple, list[float]] = {}
    for e in trace.events:
        if (e.lane != trace.main_lane or e.step is None or not e.name.startswith("aten::")
                or any(k in e.name for k in _PEER_BOUND)):
            continue
        groups.setdefault((e.name, e.shapes), []).append(e.dur_us)
    traced = fastest = 0.0
    n = 0
    for durs in groups.values():
        if len(durs) < MIN_REPEATS or min(durs) <= 0:
            continue
        traced += sum(durs)
        fastest += len(durs) * min(durs)
        n += len(durs)
    if n < MIN_CALLS or fastest <= 0:
        return None
    return traced / fastest


def run_contention(run_dir: str | Path) -> tuple[float | None, dict[int, float]]:
    """(median factor over ranks, factor per rank) of a profiled run folder; (None, {}) without repeated ops."""
    run = load_run(run_dir)
    per = {r: f for r, t in sorted(run.ranks.items()) if (f := rank_contention(t)) is not None}
    return (statistics.median(per.values()) if per else None), per
