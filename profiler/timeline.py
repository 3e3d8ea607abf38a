"""Timeline of a replay beside the aligned measured trace: Perfetto's own format, or Chrome trace JSON.

Perfetto (default, ``.pftrace``; open in ui.perfetto.dev): built with the ``perfetto`` package's
``TraceProtoBuilder`` as ``TrackEvent`` packets with integer-nanosecond timestamps. One process track per rank
(``replay rank R`` and ``measured rank R (aligned)``), one child track per lane (host thread, device stream, comm
channel); flows link a launch to its kernel / an enqueue to its CPU collective, and the members of each
collective to one another. The ``critical path`` track holds each critical-path op's *exposed* interval
(``end - exposed, end``): those intervals follow one another, so the track never has overlapping slices (the ops
themselves come from several ranks and may overlap in time; their own slices stay on their ranks' tracks).

Chrome JSON (``--timeline-format chrome``): the same content as ``ph: X`` events in integer microseconds (Chrome's
unit), for tools that read only that.

Steps are laid end to end (each starts where the longer of the previous step's measured and replayed spans
ended, plus 1 ms). Written atomically.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator

import networkx as nx

from meshplan.core.atomic import write_atomic
from meshplan.core.errors import MeshplanError
from meshplan.profiler.critical_path import critical_path
from meshplan.profiler.dataflow_graph import KIND_NAMES
from meshplan.profiler.replay import Timeline

FORMATS = ("perfetto", "chrome")
_FLOW_EDGES = ("launch", "enqueue")


def _step_offsets_ns(G: nx.DiGraph, tl: Timeline) -> dict[int, int]:
    meas = G.graph.get("steps", {})
    out, t = {}, 0
    for s in sorted(set(tl.graph.step)):
        out[s] = t
        span = max(tl.steps.get(s, 0.0), meas.get(s, {}).get("measured_s", 0.0) or 0.0)
        t += int(round(span * 1e9)) + 1_000_000
    return out


def _slices(G: nx.DiGraph, tl: Timeline) -> Iterator[tuple]:
    """(group, rank, lane, name, kind, t0_ns, t1_ns, node index) for replayed and measured ops."""
    cg = tl.graph
    off = _step_offsets_ns(G, tl)
    for i, nid in enumerate(cg.node_ids):
        rank, lane = cg.lanes[cg.lane[i]]
        o = off[cg.step[i]]
        kind = KIND_NAMES[cg.kind[i]]
        yield ("replay", rank, lane, cg.name[i], kind, o + int(round(tl.start_s[i] * 1e9)),
               o + int(round(tl.end_s[i] * 1e9)), i)
        a = G.nodes[nid] if nid in G else {}
        ms, me = a.get("measured_start_s"), a.get("measured_end_s")
        if ms is not None and me is not None:
            yield ("measured", rank, lane, cg.name[i], kind, o + int(round(ms * 1e9)), o + int(round(me * 1e9)), i)


def _critical(tl: Timeline, G: nx.DiGraph) -> list[tuple]:
    """Critical path as (name, rank, kind, t0_ns, t1_ns): each op's exposed time, laid one after another from the
    step's start (the exposed times sum to the step time, so the last interval ends where the step ends)."""
    off = _step_offsets_ns(G, tl)
    out = []
    for s in sorted(off):
        cursor = off[s]
        for p in critical_path(tl, s):
            t1 = cursor + int(round(max(0.0, p.exposed_s) * 1e9))
            if t1 > cursor:
                out.append((p.name, p.rank, p.kind, cursor, t1))
            cursor = t1
    return out


def _flows(G: nx.DiGraph, tl: Timeline) -> list[tuple[int, int]]:
    """(source node index, destination node index) for launch/enqueue edges and within each collective."""
    cg = tl.graph
    pos = {nid: i for i, nid in enumerate(cg.node_ids)}
    out = [(pos[u], pos[v]) for u, v, t in G.edges(data="type") if t in _FLOW_EDGES and u in pos and v in pos]
    for members in cg.groups:
        ms = sorted(members, key=lambda m: cg.rank[m])
        out.extend(zip(ms, ms[1:]))
    return out


def perfetto_bytes(G: nx.DiGraph, tl: Timeline) -> bytes:
    """The timeline as a serialized Perfetto ``Trace`` (TrackEvent packets, integer ns)."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TrackEvent
    from perfetto.trace_builder.proto_builder import TraceProtoBuilder

    builder = TraceProtoBuilder()
    seq = 7  # one trusted packet sequence for the whole file
    uuids: dict[tuple, int] = {}

    def track(group: str, rank: int | None, lane: str | None) -> int:
        key = (group, rank, lane)
        u = uuids.get(key)
        if u is not None:
            return u
        u = uuids[key] = len(uuids) + 1
        pk = builder.add_packet()
        td = pk.track_descriptor
        td.uuid = u
        if lane is None:
            td.process.pid = (0 if group == "replay" else 1_000_000 if group == "measured" else 2_000_000) + (rank or 0)
            td.process.process_name = {"replay": f"replay rank {rank}", "measured": f"measured rank {rank} (aligned)",
                                       "critical": "critical path"}[group]
        else:
            td.parent_uuid = track(group, rank, None)
            td.name = lane
        return u

    flows: dict[int, list[int]] = {}
    terminating: dict[int, list[int]] = {}
    for k, (src, dst) in enumerate(_flows(G, tl), start=1):
        flows.setdefault(src, []).append(k)
        terminating.setdefault(dst, []).append(k)
    # Sort key (ts, phase, k, sub): at one instant every slice that ends closes (phase 0) before any begins
    # (phase 1); a zero-length slice closes right after it opens (same k, sub 1).
    events = []
    k = 0
    for group, rank, lane, name, kind, t0, t1, i in _slices(G, tl):
        k += 1
        u = track(group, rank, lane)
        events.append(((t0, 1, k, 0), u, name, kind, i if group == "replay" else None, True))
        events.append(((t1, 0, k, 0) if t1 > t0 else (t0, 1, k, 1), u, name, kind, None, False))
    for name, rank, kind, t0, t1 in _critical(tl, G):
        k += 1
        u = track("critical", None, "critical path (exposed time)")
        events.append(((t0, 1, k, 0), u, f"r{rank} {name}", kind, None, True))
        events.append(((t1, 0, k, 0), u, f"r{rank} {name}", kind, None, False))
    events.sort(key=lambda e: e[0])
    for (ts, *_), u, name, kind, i, begin in events:
        pk = builder.add_packet()
        pk.timestamp = ts
        pk.trusted_packet_sequence_id = seq
        te = pk.track_event
        te.track_uuid = u
        if begin:
            te.type = TrackEvent.TYPE_SLICE_BEGIN
            te.name = name
            te.categories.append(kind)
            if i is not None:
                te.flow_ids.extend(flows.get(i, []))
                te.terminating_flow_ids.extend(terminating.get(i, []))
        else:
            te.type = TrackEvent.TYPE_SLICE_END
    return builder.serialize()


def chrome_events(G: nx.DiGraph, tl: Timeline) -> list[dict]:
    """Chrome trace events (``ph: X`` in integer µs, flows as ``s``/``f``, process/thread name metadata)."""
    events: list[dict] = []
    tids: dict[tuple, int] = {}
    pid_of = {"replay": 0, "measured": 1_000_000, "critical": 2_000_000}
    named: set = set()

    def ids(group: str, rank: int, lane: str) -> tuple[int, int]:
        pid = pid_of[group] + rank
        if (group, rank) not in named:
            named.add((group, rank))
            pname = {"replay": f"replay rank {rank}", "measured": f"measured rank {rank} (aligned)",
                     "critical": "critical path"}[group]
            events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": pname}})
        tid = tids.get((group, rank, lane))
        if tid is None:
            tid = tids[(group, rank, lane)] = len(tids) + 1
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": lane}})
        return pid, tid

    at: dict[int, tuple[int, int, int]] = {}
    for group, rank, lane, name, kind, t0, t1, i in _slices(G, tl):
        pid, tid = ids(group, rank, lane)
        ts = t0 // 1000
        events.append({"ph": "X", "name": name, "cat": kind, "pid": pid, "tid": tid, "ts": ts,
                       "dur": max(0, t1 // 1000 - ts), "args": {"kind": kind}})
        if group == "replay":
            at[i] = (pid, tid, ts)
    for name, rank, kind, t0, t1 in _critical(tl, G):
        pid, tid = ids("critical", 0, "critical path (exposed time)")
        ts = t0 // 1000
        events.append({"ph": "X", "name": f"r{rank} {name}", "cat": kind, "pid": pid, "tid": tid, "ts": ts,
                       "dur": max(0, t1 // 1000 - ts)})
    for k, (src, dst) in enumerate(_flows(G, tl), start=1):
        if src in at and dst in at:
            (p0, t0_, ts0), (p1, t1_, ts1) = at[src], at[dst]
            events.append({"ph": "s", "id": k, "name": "flow", "cat": "flow", "pid": p0, "tid": t0_, "ts": ts0})
            events.append({"ph": "f", "bp": "e", "id": k, "name": "flow", "cat": "flow", "pid": p1, "tid": t1_,
                           "ts": ts1})
    return events


def write_timeline(path: str | os.PathLike, G: nx.DiGraph, tl: Timeline, fmt: str = "perfetto") -> Path:
    """Write the timeline atomically in ``fmt`` (``perfetto`` or ``chrome``); returns the path."""
    if fmt == "perfetto":
        return write_atomic(path, perfetto_bytes(G, tl))
    if fmt == "chrome":
        doc = {"displayTimeUnit": "ms", "traceEvents": chrome_events(G, tl),
               "otherData": {"generator": "meshplan replay", "steps": {str(s): v for s, v in tl.steps.items()}}}
        return write_atomic(path, json.dumps(doc, separators=(",", ":")))
    raise MeshplanError(f"--timeline-format {fmt!r}: expected one of {', '.join(FORMATS)}")
