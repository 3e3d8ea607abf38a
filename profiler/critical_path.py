"""Critical path of a replay: the chain of ops that fixed the step's end, and the ops that dominate it.

As in dPRO, the path is taken on the *execution* graph (after replay), not on the raw dataflow graph: starting
from the op that ends last in the step, follow ``Timeline.cause`` (the op whose end fixed each start -- a
dependency, the previous op of the lane, or for a collective its last-arriving member). Each op is charged its
*exposed* time ``end - end(cause)`` (its own duration plus any wait it could not hide); a collective member
is charged its transfer, from the moment the last participant was ready. The charges along the path sum to the
step time.
"""
from __future__ import annotations

from dataclasses import dataclass

from meshplan.profiler.dataflow_graph import KIND_NAMES
from meshplan.profiler.replay import Timeline


@dataclass
class PathOp:
    """One op on the critical path (times in seconds after the step origin)."""

    node: object
    rank: int
    lane: str
    kind: str
    name: str
    start_s: float
    end_s: float
    exposed_s: float


def critical_path(tl: Timeline, step: int) -> list[PathOp]:
    """The critical path of one step, first op first."""
    g = tl.graph
    nodes = [i for i, s in enumerate(g.step) if s == step]
    if not nodes:
        return []
    i = max(nodes, key=lambda k: tl.end_s[k])
    path: list[PathOp] = []
    seen = set()
    eff_end = tl.end_s[i]  # the time up to which the current op is charged
    while i >= 0 and i not in seen:
        seen.add(i)
        c = tl.cause[i]
        rank, lane = g.lanes[g.lane[i]]
        if c >= 0 and g.group[i] >= 0 and g.group[c] == g.group[i]:
            # Collective jump to the last-arriving member: this member is charged the transfer (from the moment
            # everyone was ready), the last arrival is charged up to that moment.
            prev_end = tl.end_s[c] - g.dur_s[c]
        else:
            prev_end = tl.end_s[c] if c >= 0 else tl.start_s[i]
        path.append(PathOp(g.node_ids[i], rank, lane, KIND_NAMES[g.kind[i]], g.name[i], tl.start_s[i], tl.end_s[i],
                           eff_end - prev_end))
        if c < 0 and tl.start_s[i] > 0:
            # The chain starts at a release time: the rank began the step late (or the op's start is pinned to
            # its measured one); that offset is part of the step time too.
            path.append(PathOp(None, rank, lane, "idle", "(step start offset / pinned start)", 0.0, tl.start_s[i],
                               tl.start_s[i]))
        eff_end = prev_end
        i = c
    path.reverse()
    return path


def dominant_ops(path: list[PathOp], top: int = 10) -> list[dict]:
    """Exposed time on the path summed by (kind, name), largest first, with its share of the step."""
    total = sum(p.exposed_s for p in path) or 1.0
    agg: dict[tuple[str, str], list] = {}
    for p in path:
        a = agg.setdefault((p.kind, p.name), [0.0, 0, set()])
        a[0] += p.exposed_s
        a[1] += 1
        a[2].add(p.rank)
    rows = [{"kind": k, "name": n, "exposed_s": v[0], "share": v[0] / total, "count": v[1], "ranks": sorted(v[2])}
            for (k, n), v in agg.items()]
    rows.sort(key=lambda r: -r["exposed_s"])
    return rows[:top]
