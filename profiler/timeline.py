"""Perfetto / Chrome trace JSON of a replay beside the aligned measured trace (open in ui.perfetto.dev).

Processes ``replay rank R`` hold the replayed ops, ``measured rank R`` the same ops at their aligned measured
times; one thread per lane. Steps are laid end to end (each starts where the longer of the previous step's
measured and replayed spans ended). Ops on the critical path carry ``args.critical = true`` and are also drawn
on a ``critical path`` process. Written atomically.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import networkx as nx

from meshplan.core.atomic import write_atomic
from meshplan.profiler.critical_path import critical_path
from meshplan.profiler.graph import KIND_NAMES
from meshplan.profiler.replay import Timeline

_MEASURED_PID = 1_000_000
_CRIT_PID = 2_000_000


def timeline_events(G: nx.DiGraph, tl: Timeline) -> list[dict]:
    """Chrome trace events (``ph: X`` in µs, plus process/thread name metadata)."""
    cg = tl.graph
    steps = sorted(set(cg.step))
    meas_steps = G.graph.get("steps", {})
    offset: dict[int, float] = {}
    t = 0.0
    for s in steps:
        offset[s] = t
        span = max(tl.steps.get(s, 0.0), meas_steps.get(s, {}).get("measured_s", 0.0))
        t += span * 1e6 + 1000.0  # 1 ms gap between steps
    crit = {p.node for s in steps for p in critical_path(tl, s)}
    events: list[dict] = []
    tids: dict[tuple[int, str], int] = {}
    ranks = sorted({r for r, _ in cg.lanes})
    for r in ranks:
        events.append({"ph": "M", "name": "process_name", "pid": r, "args": {"name": f"replay rank {r}"}})
        events.append({"ph": "M", "name": "process_name", "pid": _MEASURED_PID + r,
                       "args": {"name": f"measured rank {r} (aligned)"}})
    events.append({"ph": "M", "name": "process_name", "pid": _CRIT_PID, "args": {"name": "critical path"}})
    for i, nid in enumerate(cg.node_ids):
        rank, lane = cg.lanes[cg.lane[i]]
        tid = tids.get((rank, lane))
        if tid is None:
            tid = tids[(rank, lane)] = len(tids) + 1
            for pid in (rank, _MEASURED_PID + rank):
                events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": lane}})
        off = offset[cg.step[i]]
        a = G.nodes[nid] if nid in G else {}
        args = {"kind": KIND_NAMES[cg.kind[i]], "step": cg.step[i], "duration_s": cg.dur_s[i]}
        if a.get("coll_type"):
            args["collective"] = a.get("coll_type")
        if nid in crit:
            args["critical"] = True
        ev = {"ph": "X", "name": cg.name[i], "cat": KIND_NAMES[cg.kind[i]], "pid": rank, "tid": tid,
              "ts": off + tl.start_s[i] * 1e6, "dur": (tl.end_s[i] - tl.start_s[i]) * 1e6, "args": args}
        events.append(ev)
        if nid in crit:
            events.append(dict(ev, pid=_CRIT_PID, tid=1))
        ms, me = a.get("measured_start_s"), a.get("measured_end_s")
        if ms is not None and me is not None:
            events.append({"ph": "X", "name": cg.name[i], "cat": KIND_NAMES[cg.kind[i]], "pid": _MEASURED_PID + rank,
                           "tid": tid, "ts": off + ms * 1e6, "dur": (me - ms) * 1e6,
                           "args": {"kind": KIND_NAMES[cg.kind[i]], "step": cg.step[i]}})
    return events


def write_timeline(path: str | os.PathLike, G: nx.DiGraph, tl: Timeline) -> Path:
    """Write the timeline JSON atomically; returns the path."""
    doc = {"displayTimeUnit": "ms", "traceEvents": timeline_events(G, tl),
           "otherData": {"generator": "meshplan replay", "steps": {str(s): v for s, v in tl.steps.items()}}}
    return write_atomic(path, json.dumps(doc, separators=(",", ":")))
