"""Clock alignment across ranks from collective end times.

All participants of a blocking collective leave it together (a ring all-reduce cannot finish on one rank before
the last chunk from its neighbour arrives), so after correcting clock offsets θ_r the end times
``end_r + θ_r`` of one collective agree (``../shared/notes/profiler.md`` §1.2 and §8; dPRO aligns hosts with the
same causality). Start times do not: early ranks wait for the last one.

The estimate is a robust alternating median (an L1 fit of ``end_r + θ_r = c_g`` over all collectives g):
repeat { c_g = median_r(end_r + θ_r); θ_r = median_g(c_g - end_r) }, then fix θ of the lowest rank to 0.
Medians make one stalled collective (or one mismatched pair) harmless. Ranks that share no complete collective
with the others keep θ = 0 and are reported. When host names are known (trace ``host_name`` or ``run.json``),
ranks of one host share one offset (they read one clock): the median of their estimates.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from meshplan.profiler.match import CollGroup
from meshplan.profiler.runs import Run

_ITERATIONS = 8


@dataclass
class Alignment:
    """Clock offsets, µs: add ``offsets_us[r]`` to rank r's timestamps to put it on the reference clock.

    Attributes:
        offsets_us: rank -> offset (reference = lowest rank, offset 0).
        residual_us: Median |end_r + θ_r - c_g| over all members of the collectives used (fit quality).
        n_collectives: Complete collectives used.
        unaligned: Ranks with no collective shared with others (offset left at 0).
    """

    offsets_us: dict[int, float]
    residual_us: float
    n_collectives: int
    unaligned: list[int] = field(default_factory=list)


def estimate_offsets(run: Run, groups: list[CollGroup]) -> Alignment:
    """Estimate per-rank clock offsets from the end times of matched collectives."""
    usable = [g for g in groups if g.complete]
    theta = {r: 0.0 for r in run.ranks}
    if not usable:
        return Alignment(theta, 0.0, 0, unaligned=sorted(run.ranks) if len(run.ranks) > 1 else [])
    ends = [{r: e.ts_us + e.dur_us for r, e in g.members.items()} for g in usable]
    ref = min(run.ranks)
    for _ in range(_ITERATIONS):
        centres = [statistics.median(v + theta[r] for r, v in end.items()) for end in ends]
        per_rank: dict[int, list[float]] = {r: [] for r in run.ranks}
        for c, end in zip(centres, ends):
            for r, v in end.items():
                per_rank[r].append(c - v)
        theta = {r: (statistics.median(d) if d else 0.0) for r, d in per_rank.items()}
        shift = theta[ref]
        theta = {r: v - shift for r, v in theta.items()}
    hosts = _hosts(run)
    if hosts:
        # Ranks on one host read one clock (../shared/notes/profiler.md §1.2: dPRO keeps one offset per host):
        # the host's offset is the median of its ranks' estimates, which removes per-rank noise such as a CPU
        # collective's thread being scheduled late.
        by_host: dict[str, list[float]] = {}
        for r, h in hosts.items():
            by_host.setdefault(h, []).append(theta[r])
        host_theta = {h: statistics.median(v) for h, v in by_host.items()}
        base = host_theta[hosts[ref]] if ref in hosts else 0.0
        theta = {r: (host_theta[hosts[r]] - base if r in hosts else theta[r]) for r in theta}
    centres = [statistics.median(v + theta[r] for r, v in end.items()) for end in ends]
    resid = [abs(v + theta[r] - c) for c, end in zip(centres, ends) for r, v in end.items()]
    covered = {r for end in ends for r in end}
    return Alignment(theta, statistics.median(resid), len(usable),
                     unaligned=sorted(r for r in run.ranks if r not in covered))


def _hosts(run: Run) -> dict[int, str]:
    """rank -> host name, from the traces (``host_name``) or a meshplan ``run.json``; {} when unknown."""
    names = {r: t.hostname for r, t in run.ranks.items() if t.hostname}
    rj = (run.run_json or {}).get("hostnames") or {}
    for k, v in rj.items():
        if v and int(k) in run.ranks:
            names.setdefault(int(k), str(v))
    return names


def apply_alignment(run: Run, alignment: Alignment) -> None:
    """Shift every rank's events by its offset (in place)."""
    for r, t in run.ranks.items():
        d = alignment.offsets_us.get(r, 0.0)
        if d:
            t.shift(d)
