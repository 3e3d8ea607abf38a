"""Measured run -> global dataflow graph (the node/edge schema is in :mod:`profiler.dataflow_graph`).

Per rank and step:

* **Device ops** (kernels, memcpy/memset) become one node each on their stream lane; ``launch`` edge from the host
  node that ends with the launching runtime call (joined on ``correlation``).
* **CPU collectives** (``gloo:*`` on gloo worker threads) become nodes on their thread; ``enqueue`` edge from the
  host node that ends where the matching ``c10d::*`` op handed the work over (k-th op of that type on the rank).
  CPU point-to-point transfers (``gloo:send`` / ``gloo:recv``) get a lane per issuing thread, direction and peer.
* **Host threads** are cut into consecutive segments at top-level CPU-op boundaries and at launch/enqueue points,
  so the segments chain without gaps and replay the thread's own timing exactly. Two kinds of blocking become
  ``wait`` nodes that depend on what they waited for: a synchronising runtime call (``cudaStreamSynchronize``,
  blocking ``cudaMemcpy`` ...) during which a device op of the rank ended, and an idle gap on the thread that ends
  at most ``WAKE_US`` after a CPU collective of the rank ended (how a gloo DDP wait looks: no event, the thread
  sleeps). A wait node's duration is the wake-up time after that op's end, so a faster op wakes the host sooner.
  On CPU-only ranks host segments are ``compute`` (the CPU does the math), else ``host``.
* **Collectives** matched across ranks (:mod:`profiler.match`) share a ``coll`` id; each member's duration is its
  transfer time, end - last participant's (aligned) start. Partial groups keep their measured duration.
* A step whose stepping thread recorded no op (a marker with nothing inside, or a thinned trace) gets an idle node
  spanning the marker on that thread (``idle``), so the step replays at its measured length instead of vanishing.
* ``cudaStreamWaitEvent`` s that newer traces record (``cuda_sync`` events) become ``event`` edges from the op the
  event captured to the first op launched on the waiting stream after the wait.
* A device/comm op that starts at most ``LAUNCH_LATENCY_US`` after its launch (or ``SLACK_US`` after its stream
  predecessor) keeps that lag as its ``gap_s`` (launch latency / back-to-back gap, as dPRO keeps gaps).
* A device/comm op that started later than its lane, launch and dependencies explain (> ``SLACK_US``) is attributed
  to the op of the same rank that ended last within ``INFER_US`` before it (an ``inferred`` edge; covers
  ``cudaStreamWaitEvent`` cross-stream syncs that old traces do not describe). If none exists its start is pinned
  (``release_s``) to the measured one when the op has no known constraint at all; otherwise the delay becomes a
  ``delay`` node between its constraints and it, so it keeps its measured length but moves with them.

Times in the graph are seconds after the step origin: the earliest aligned ``ProfilerStep`` start over ranks.
"""
from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field

import networkx as nx

from meshplan.profiler.dataflow_graph import GraphBuilder
from meshplan.profiler.match import CollGroup, channel_of
from meshplan.profiler.runs import Run
from meshplan.profiler.trace import SYNC_CALLS, Event, RankTrace

WAKE_US = 200.0  # an idle host gap ending this soon after a CPU collective ended is a wait for it
MIN_GAP_US = 5.0  # shorter host gaps are scheduling noise, not waits
SLACK_US = 5.0  # start delays below this are launch latency, not an unexplained dependency
INFER_US = 50.0  # look-back window for the op whose end explains a delayed start
# Launch-to-start latency seen on V100 in the DLRM set is 10-25 µs (cudaLaunchKernel return -> kernel start);
# up to this much after its launch a kernel is launch-bound, not waiting on anything else.
LAUNCH_LATENCY_US = 50.0
IDLE_NAME = "(idle: no op recorded)"


def build_graph(run: Run, groups: list[CollGroup]) -> nx.DiGraph:
    """Build the global dataflow graph of an (aligned) run.

    Args:
        run: Loaded run, clocks already aligned (:func:`profiler.align.apply_alignment`).
        groups: Matched collectives (:func:`profiler.match.match_collectives`).

    Returns:
        The graph; ``G.graph["steps"][s]`` holds ``origin_us`` and ``measured_s`` per step.
    """
    b = GraphBuilder()
    member_of: dict[int, CollGroup] = {}
    for g in groups:
        for e in g.members.values():
            member_of[id(e)] = g
    transfer: dict[int, float] = {}
    for g in groups:
        if g.complete:
            last_start = max(e.ts_us for e in g.members.values())
            for e in g.members.values():
                transfer[id(e)] = max(0.0, e.end_us - last_start)
        elif g.expected is not None and len(g.expected) == 1 and set(g.members) == set(g.expected):
            for e in g.members.values():  # a group of one (world size 1): nobody to wait for, nobody absent
                transfer[id(e)] = e.dur_us
    steps = run.steps
    by_rank_step: dict[tuple[int, int], list[Event]] = defaultdict(list)
    for r, t in run.ranks.items():
        for e in t.events:
            if e.step is not None:
                by_rank_step[(r, e.step)].append(e)
    n_partial = 0
    for s in steps:
        origin = _origin_us(run, s, by_rank_step)
        meas_end = origin
        for r, t in run.ranks.items():
            evs = by_rank_step.get((r, s), [])
            if not evs:
                if s in t.steps:  # a step marker with no op of the rank in it: the rank idles through it
                    _add_idle(b, t, s, origin)
                    meas_end = max(meas_end, sum(t.steps[s]))
                continue
            n_partial += _add_rank_step(b, t, s, evs, origin, member_of, transfer)
            meas_end = max(meas_end, max(e.end_us for e in evs))
            if s in t.steps:
                meas_end = max(meas_end, sum(t.steps[s]))
        b.graph_attrs["steps"][s] = {"origin_us": origin, "measured_s": (meas_end - origin) / 1e6}
    if n_partial:
        b.graph_attrs["warnings"].append(f"{n_partial} collective op(s) have participants absent from the trace and "
                                         f"replay with their measured durations")
    return b.build()


def _add_idle(b: GraphBuilder, t: RankTrace, s: int, origin: float) -> int:
    """An idle node spanning the step window on the stepping thread (the thread recorded no op in it)."""
    st, du = t.steps[s]
    return b.add_op(t.rank, t.main_lane or "thread:main", "host", IDLE_NAME, du * 1e-6, step=s,
                    release_s=(st - origin) * 1e-6, idle=True, measured_start_s=(st - origin) * 1e-6,
                    measured_end_s=(st + du - origin) * 1e-6, peer=("main", IDLE_NAME, 0))


def _origin_us(run: Run, s: int, by_rank_step: dict) -> float:
    starts = [t.steps[s][0] for t in run.ranks.values() if s in t.steps]
    if starts:
        return min(starts)
    return min(e.ts_us for r in run.ranks for e in by_rank_step.get((r, s), [])[:1] or [])


@dataclass
class _StepNodes:
    """What one rank-step's nodes are known by while they are added (ids of trace events -> node ids)."""

    anchor_node: dict[int, int] = field(default_factory=dict)  # id(runtime/enqueue event) -> host node ending there
    node_meas: dict[int, tuple[float, float]] = field(default_factory=dict)  # node -> measured (start, end) µs
    wait_edges: list[tuple[Event, int]] = field(default_factory=list)  # (op waited for, wait node)
    ev_node: dict[int, int] = field(default_factory=dict)  # id(device / comm event) -> node
    pending: list[tuple[Event, int, float, list[int]]] = field(default_factory=list)  # device ops to explain
    n_partial: int = 0


def _coll_id(g: CollGroup | None) -> str | None:
    return None if g is None else "c:" + "/".join(str(x) for x in g.key)


def _pair_cpu_collectives(evs: list[Event], cpu_comm: list[Event]) -> list[tuple[Event, Event]]:
    """(comm event, its enqueue op): the k-th ``c10d::`` op of a type <-> the k-th comm event of that type."""
    pairs: list[tuple[Event, Event]] = []
    if not cpu_comm:
        return pairs
    enq = defaultdict(list)
    for e in evs:
        if e.kind == "host" and e.coll and e.name.startswith("c10d::"):
            enq[e.coll].append(e)
    comm_by = defaultdict(list)
    for e in cpu_comm:
        comm_by[e.coll].append(e)
    for typ, lst in comm_by.items():
        for c, q in zip(lst, enq.get(typ, [])):
            if q.ts_us <= c.ts_us + SLACK_US:
                pairs.append((c, q))
    return pairs


def _add_rank_step(b: GraphBuilder, t: RankTrace, s: int, evs: list[Event], origin: float,
                   member_of: dict[int, CollGroup], transfer: dict[int, float]) -> int:
    """Add one rank's ops of one step. Returns the number of partial collective members."""
    device_ops = [e for e in evs if e.lane.startswith("stream:") or e.kind == "comm"]
    ends_sorted = sorted(device_ops, key=lambda e: e.end_us)
    end_keys = [e.end_us for e in ends_sorted]
    runtime_by_corr = {e.corr: e for e in evs if e.cat in ("cuda_runtime", "cuda_driver") and e.corr is not None}
    launched = {id(runtime_by_corr[e.corr]) for e in device_ops if e.corr in runtime_by_corr}
    host_lanes = {e.lane for e in evs if not e.lane.startswith("stream:") and e.kind != "comm"}
    # gloo point-to-point ops run on the calling (training) thread: they sit inline in its host chain.
    inline = defaultdict(list)
    for e in device_ops:
        if e.lane in host_lanes:
            inline[e.lane].append(e)
    cpu_comm = [e for e in device_ops if not e.lane.startswith("stream:") and e.lane not in host_lanes]
    enq_pairs = _pair_cpu_collectives(evs, cpu_comm)
    enq_for = {id(c): q for c, q in enq_pairs}
    # The collective starts inside its c10d op (after argument checks and bucket copies): cut the host thread
    # where the comm thread picked the work up, or at the op's end if that came first.
    # Idle host gaps count as waits only for CPU collectives (a gloo wait leaves no event); on GPU ranks host gaps
    # are Python overhead and blocking shows up as synchronising runtime calls.
    cpu_comm_sorted = sorted(cpu_comm + [e for v in inline.values() for e in v], key=lambda e: e.end_us)
    cpu_ends = (cpu_comm_sorted, [e.end_us for e in cpu_comm_sorted])
    enqueue_at = {id(q): min(q.end_us, max(q.ts_us, c.ts_us)) for c, q in enq_pairs}
    host_by_lane: dict[str, list[Event]] = defaultdict(list)
    for e in evs:
        if not e.lane.startswith("stream:") and e.kind != "comm":
            host_by_lane[e.lane].append(e)
    nodes = _StepNodes()
    step_win = t.steps.get(s)
    for lane, hev in host_by_lane.items():
        is_main = lane == t.main_lane and step_win is not None
        lo = step_win[0] if is_main else min(e.ts_us for e in hev)
        hi = max(step_win[0] + step_win[1] if is_main else 0.0, max(e.end_us for e in hev))
        segs = _segments(hev, lo, hi, launched, enqueue_at, ends_sorted, end_keys, cpu_ends, inline.get(lane, []))
        _add_host_lane(b, nodes, t, s, lane, segs, origin, "main" if is_main else "thread", member_of, transfer)
    if step_win is not None and t.main_lane not in host_by_lane:
        _add_idle(b, t, s, origin)  # the training thread recorded nothing in this step (e.g. a thinned trace)
    event_dep = _stream_event_deps(t, device_ops, runtime_by_corr)
    # Device ops and CPU collectives on comm threads, lane by lane in start order.
    dev_by_lane: dict[str, list[Event]] = defaultdict(list)
    for e in device_ops:
        if e.lane not in host_lanes:
            dev_by_lane[e.lane].append(e)
    for lane, lst in dev_by_lane.items():
        _add_device_lane(b, nodes, t.rank, s, lane, lst, origin, runtime_by_corr, enq_for, event_dep, member_of,
                         transfer)
    for waited, nid in nodes.wait_edges:
        if id(waited) in nodes.ev_node:
            b.add_dep(nodes.ev_node[id(waited)], nid, "wait")
    for target, src in event_dep.items():
        if target in nodes.ev_node and id(src) in nodes.ev_node:
            b.add_dep(nodes.ev_node[id(src)], nodes.ev_node[target], "event")
    _explain_starts(b, nodes.pending, nodes.ev_node, ends_sorted, end_keys, origin, nodes.node_meas)
    return nodes.n_partial


def _add_host_lane(b: GraphBuilder, nodes: _StepNodes, t: RankTrace, s: int, lane: str, segs: list, origin: float,
                   role: str, member_of: dict[int, CollGroup], transfer: dict[int, float]) -> None:
    """One host thread's segments (:func:`_segments`) as nodes: inline collectives, waits, and host work."""
    us = 1e-6
    rank = t.rank
    kind = "compute" if not t.has_gpu else "host"
    seen: dict[str, int] = defaultdict(int)
    first = True
    for seg in segs:
        t0, t1, name, anchors, waited, comm = seg
        if comm is not None:
            partial = id(comm) not in transfer
            nodes.n_partial += partial
            nid = b.add_op(rank, lane, "comm", comm.name, (comm.dur_us if partial else transfer[id(comm)]) * us,
                           step=s, release_s=(t0 - origin) * us if first else 0.0,
                           coll=_coll_id(member_of.get(id(comm))),
                           coll_type=comm.coll, nbytes=comm.bytes, partial=partial,
                           measured_start_s=(t0 - origin) * us, measured_end_s=(t1 - origin) * us,
                           peer=(role, comm.name, seen[comm.name]))
            seen[comm.name] += 1
            nodes.ev_node[id(comm)] = nid
        elif waited is not None:
            d = max(0.0, t1 - max(t0, waited.end_us))
            nid = b.add_op(rank, lane, "host", f"wait:{waited.name[:60]}", d * us, step=s,
                           release_s=(t0 - origin) * us if first else 0.0, wait=True,
                           measured_start_s=(t0 - origin) * us, measured_end_s=(t1 - origin) * us,
                           peer=(role, "wait", seen["wait"]))
            seen["wait"] += 1
            nodes.wait_edges.append((waited, nid))
        else:
            nid = b.add_op(rank, lane, kind, name, (t1 - t0) * us, step=s,
                           release_s=(t0 - origin) * us if first else 0.0,
                           measured_start_s=(t0 - origin) * us, measured_end_s=(t1 - origin) * us,
                           peer=(role, name, seen[name]))
            seen[name] += 1
        first = False
        nodes.node_meas[nid] = (t0, t1)
        for a in anchors:
            nodes.anchor_node[id(a)] = nid


def _add_device_lane(b: GraphBuilder, nodes: _StepNodes, rank: int, s: int, lane: str, lst: list[Event],
                     origin: float, runtime_by_corr: dict, enq_for: dict[int, Event], event_dep: dict[int, Event],
                     member_of: dict[int, CollGroup], transfer: dict[int, float]) -> None:
    """One device stream's ops (or a comm thread's CPU collectives) as nodes, in start order, each depending on the
    host node that launched or enqueued it; their starts are explained later (:func:`_explain_starts`)."""
    us = 1e-6
    lst.sort(key=lambda e: e.ts_us)
    role = channel_of(lst[0]) if lst[0].kind == "comm" else "stream" + lane.rsplit(":", 1)[-1]
    seen: dict[str, int] = defaultdict(int)
    for e in lst:
        deps, dep_type = [], "launch"
        src = runtime_by_corr.get(e.corr) if e.corr is not None else None
        if src is not None and id(src) in nodes.anchor_node:
            deps.append(nodes.anchor_node[id(src)])
        q = enq_for.get(id(e))
        if q is not None and id(q) in nodes.anchor_node:
            deps.append(nodes.anchor_node[id(q)])
            dep_type = "enqueue"
        partial = e.kind == "comm" and id(e) not in transfer
        if e.kind == "comm":
            nodes.n_partial += partial
            dur = e.dur_us if partial else transfer[id(e)]
            coll = _coll_id(member_of.get(id(e)))
        else:
            dur, coll = e.dur_us, None
        nid = b.add_op(rank, lane, e.kind, e.name, dur * us, deps=deps, step=s, dep_type=dep_type,
                       coll=coll, coll_type=e.coll, nbytes=e.bytes, partial=partial, shapes=e.shapes,
                       measured_start_s=(e.ts_us - origin) * us, measured_end_s=(e.end_us - origin) * us,
                       peer=(role, e.name, seen[e.name]))
        seen[e.name] += 1
        nodes.ev_node[id(e)] = nid
        nodes.node_meas[nid] = (e.ts_us, e.end_us)
        dep_end = max([nodes.node_meas[d][1] for d in deps] or [float("-inf")])
        if id(e) in event_dep:
            dep_end = max(dep_end, event_dep[id(e)].end_us)
        nodes.pending.append((e, nid, dep_end, deps))


def _stream_event_deps(t: RankTrace, device_ops: list[Event], runtime_by_corr: dict) -> dict[int, Event]:
    """cudaStreamWaitEvent edges: id(first op launched on the waiting stream after the wait) -> the last op
    launched on the recorded stream before the cudaEventRecord (the op the event captured), as HTA's
    critical-path analysis resolves them."""
    if not t.stream_waits:
        return {}
    by_stream: dict[int, list[tuple[float, Event]]] = defaultdict(list)
    for e in device_ops:
        src = runtime_by_corr.get(e.corr) if e.corr is not None else None
        if src is not None and e.lane.startswith("stream:"):
            by_stream[int(e.lane.rsplit(":", 1)[-1])].append((src.ts_us, e))
    for lst in by_stream.values():
        lst.sort(key=lambda x: x[0])
    out: dict[int, Event] = {}
    for wait_corr, stream, rec_stream, rec_corr in t.stream_waits:
        wait_call, rec_call = runtime_by_corr.get(wait_corr), runtime_by_corr.get(rec_corr)
        if wait_call is None or rec_call is None:
            continue
        recorded = [e for ts, e in by_stream.get(rec_stream, []) if ts < rec_call.ts_us]
        later = [e for ts, e in by_stream.get(stream, []) if ts > wait_call.ts_us]
        if recorded and later and id(later[0]) not in out:
            out[id(later[0])] = recorded[-1]
    return out


def _explain_starts(b: GraphBuilder, pending, ev_node, ends_sorted, end_keys, origin, node_meas) -> None:
    """Give device ops whose measured start is later than their known constraints a cause (or pin them)."""
    prev_end: dict[str, float] = {}
    for e, nid, dep_end, deps in pending:
        lane_end = prev_end.get(e.lane, float("-inf"))
        prev_end[e.lane] = e.end_us
        explained = max(lane_end, dep_end)
        lag = e.ts_us - explained
        if lag <= SLACK_US or (dep_end >= lane_end and lag <= LAUNCH_LATENCY_US):
            # Back-to-back gap or launch latency (the kernel waited for its launch to reach the device, not for
            # another op): kept as the op's gap, as dPRO keeps measured gaps as node attributes.
            if lag > 0 and explained > float("-inf"):
                b.set(nid, gap_s=lag * 1e-6)
            continue
        j = bisect.bisect_right(end_keys, e.ts_us + 0.5) - 1
        cause = None
        while j >= 0 and end_keys[j] >= e.ts_us - INFER_US:
            c = ends_sorted[j]
            if c.lane != e.lane and id(c) in ev_node and end_keys[j] > explained:
                cause = c
                break
            j -= 1
        if cause is not None:
            b.add_dep(ev_node[id(cause)], nid, "inferred")
        elif explained > float("-inf"):
            # Nothing on the rank explains the wait (CPU contention, an event the trace does not show): keep it
            # as a delay after the op's real constraints, so it moves with them in a what-if.
            b.insert_before(nid, "host", "(unexplained delay)", (e.ts_us - explained) * 1e-6, deps=deps,
                            delay=True, measured_start_s=(explained - origin) * 1e-6,
                            measured_end_s=(e.ts_us - origin) * 1e-6)
        else:
            b.set(nid, release_s=(e.ts_us - origin) * 1e-6)


def _tops_and_busy(hev: list[Event]) -> tuple[list[Event], list[list[float]]]:
    """(top-level CPU ops, busy intervals [start, end] of the thread) of a thread's events in start order."""
    tops: list[Event] = []
    cur_end = float("-inf")
    busy: list[list[float]] = []
    for e in hev:
        if e.cat == "cpu_op" and e.ts_us >= cur_end:
            tops.append(e)
            cur_end = e.end_us
        if busy and e.ts_us <= busy[-1][1]:
            busy[-1][1] = max(busy[-1][1], e.end_us)
        else:
            busy.append([e.ts_us, e.end_us])
    return tops, busy


def _cut_points(hev: list[Event], tops: list[Event], busy: list[list[float]], launched: set, enqueue_at: dict,
                ends_sorted: list[Event], end_keys: list[float], cpu_ends: tuple[list[Event], list[float]],
                inline: list[Event]) -> list[tuple[float, int, object]]:
    """Where a host thread is cut, as (time, order, payload), sorted: top-level op boundaries (no payload),
    waits (``("wait", end, waited op, call|None)``), launch/enqueue points (``("anchor", event)``) and inline
    collectives (``("comm", end, event)``); at one time, order 0 comes first."""
    cuts: list[tuple[float, int, object]] = []
    for e in tops:
        cuts.append((e.ts_us, 1, None))
        cuts.append((e.end_us, 1, None))
    for e in hev:
        if e.cat in ("cuda_runtime", "cuda_driver"):
            if e.name.startswith(SYNC_CALLS):
                x = _last_end_within(ends_sorted, end_keys, e.ts_us, e.end_us + 1.0)
                if x is not None:
                    cuts.append((e.ts_us, 0, ("wait", e.end_us, x, e)))
                    continue
            if id(e) in launched:
                cuts.append((e.end_us, 2, ("anchor", e)))
        elif id(e) in enqueue_at:
            cuts.append((enqueue_at[id(e)], 2, ("anchor", e)))
    for k in range(len(busy) - 1):
        g0, g1 = busy[k][1], busy[k + 1][0]
        if g1 - g0 < MIN_GAP_US:
            continue
        x = _last_end_within(cpu_ends[0], cpu_ends[1], g0, g1)
        if x is not None and g1 - x.end_us <= WAKE_US:
            cuts.append((g0, 0, ("wait", g1, x, None)))
    for e in inline:
        cuts.append((e.ts_us, 0, ("comm", e.end_us, e)))
    cuts.sort(key=lambda c: (c[0], c[1]))
    return cuts


def _segments(hev: list[Event], lo: float, hi: float, launched: set, enqueue_at: dict, ends_sorted: list[Event],
              end_keys: list[float], cpu_ends: tuple[list[Event], list[float]], inline: list[Event]):
    """Cut one host thread's [lo, hi] into (t0, t1, name, anchors, waited_event|None, comm_event|None) segments."""
    hev = sorted(hev, key=lambda e: (e.ts_us, -e.dur_us))
    tops, busy = _tops_and_busy(hev)
    cuts = _cut_points(hev, tops, busy, launched, enqueue_at, ends_sorted, end_keys, cpu_ends, inline)
    top_starts = [e.ts_us for e in tops]

    def name_at(t: float) -> str:
        i = bisect.bisect_right(top_starts, t) - 1
        if i >= 0 and tops[i].end_us > t:
            return tops[i].name
        return "(python)"

    segs = []
    cur = lo
    pending_anchors: list[Event] = []
    for t, _, payload in cuts:
        if t < cur:
            if payload is not None and payload[0] == "anchor":
                # Launched while the thread was blocked: the launch precedes the wait, never follows it.
                prior = [sg for sg in segs if sg[4] is None and sg[5] is None]
                (prior[-1][3] if prior else pending_anchors).append(payload[1])
            continue
        t = min(t, hi)
        if t > cur:
            segs.append((cur, t, name_at((cur + t) / 2), pending_anchors, None, None))
            pending_anchors = []
            cur = t
        if payload is None:
            continue
        if payload[0] == "anchor":
            if segs and segs[-1][1] == t:
                segs[-1][3].append(payload[1])
            else:
                pending_anchors.append(payload[1])
        elif payload[0] == "comm":
            _, t_end, ev = payload
            t_end = min(max(t_end, cur), hi)
            if pending_anchors:
                if segs and segs[-1][1] == cur:
                    segs[-1][3].extend(pending_anchors)
                else:
                    segs.append((cur, cur, name_at(cur), pending_anchors, None, None))
                pending_anchors = []
            segs.append((cur, t_end, ev.name, [], None, ev))
            cur = t_end
        else:
            _, t_end, x, call = payload
            t_end = min(max(t_end, cur), hi)
            if call is not None and id(call) in launched:
                # A blocking copy launches the op it then waits for: the launch belongs before the wait.
                pending_anchors.append(call)
            if pending_anchors:
                if segs and segs[-1][1] == cur:
                    segs[-1][3].extend(pending_anchors)
                else:
                    segs.append((cur, cur, name_at(cur), pending_anchors, None, None))
                pending_anchors = []
            segs.append((cur, t_end, "wait", [], x, None))
            cur = t_end
    if hi > cur or pending_anchors or not segs:
        segs.append((cur, max(hi, cur), name_at(cur), pending_anchors, None, None))
    return segs


def _last_end_within(ends_sorted: list[Event], end_keys: list[float], a: float, b: float) -> Event | None:
    """The device/comm op whose end is latest in [a, b]."""
    j = bisect.bisect_right(end_keys, b) - 1
    if j >= 0 and end_keys[j] >= a:
        return ends_sorted[j]
    return None
