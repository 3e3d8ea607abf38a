"""Kineto trace ingestion: one rank's trace file -> :class:`RankTrace` of normalised :class:`Event` records.

Handles what PyTorch writes today and what it wrote before (see ``../shared/notes/profiler.md`` §2):

* GPU runs: ``kernel`` events (compute, and NCCL ``ncclKernel_*`` / ``ncclDevKernel_*`` = comm), ``gpu_memcpy`` /
  ``gpu_memset`` (memcpy), ``cuda_runtime`` / ``cuda_driver`` launches (host), joined launch -> kernel by the
  ``correlation`` arg. Collective metadata (``Collective name``, ``In msg nelems``, ``Process Group Name``,
  ``Seq``) is read when the kernel carries it; otherwise the enclosing ``nccl:*`` annotation gives the type and
  size (``Input Dims``).
* CPU runs: gloo collectives are ``gloo:*`` ``user_annotation`` events on gloo worker threads (comm).
* Timestamps: Chrome-trace ``ts``/``dur`` are microseconds in every variant; old traces use integer absolute
  unix µs, newer ones float µs with ns digits relative to ``baseTimeNanoseconds`` (kept as ``base_ns`` so ranks
  can be put on one clock). ``displayTimeUnit`` only changes how viewers display time, never the unit of ``ts``.
* Rank: ``distributedInfo.rank``, else the file name (``rank-3``, ``rank3``, ``worker3``), else 0 with a warning.

Only what the analyses need is kept (flows, metadata, memory instants are dropped), strings are interned and
shapes frozen and shared, and the file is streamed (:mod:`profiler.jsonstream`), so ingest memory grows with
the number of kept events, not with the file text.
"""
from __future__ import annotations

import bisect
import functools
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshplan.core.errors import MeshplanError
from meshplan.profiler.jsonstream import stream_trace

KINDS = ("compute", "comm", "host", "memcpy")

_COMM_KERNEL = re.compile(r"nccl|rccl|hccl|xccl", re.IGNORECASE)
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_OUT_OF_RANGE = re.compile(r"Out-of-range = (\d+)")
_RANK_IN_NAME = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)
_DTYPE_BYTES = {"float": 4, "float32": 4, "double": 8, "half": 2, "float16": 2, "bfloat16": 2, "c10::half": 2,
                "c10::bfloat16": 2, "int": 4, "int32": 4, "long int": 8, "int64": 8, "long": 8, "bool": 1,
                "unsigned char": 1, "signed char": 1, "char": 1, "int8": 1, "uint8": 1, "short": 2, "short int": 2}
# Runtime calls that make the host wait for the device (the thread blocks until queued work finishes).
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
              "hipStreamSynchronize", "hipDeviceSynchronize", "hipEventSynchronize", "hipMemcpy",
              "cuStreamSynchronize", "cuCtxSynchronize")
_P2P_OPS = ("c10d::send", "c10d::recv_", "c10d::recv_any_source_")
_KEEP_CATS = {"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "kernel", "gpu_memcpy", "gpu_memset",
              "cuda_sync"}


def collective_type(name: str) -> str | None:
    """Normalised collective type from a kernel, annotation or ``Collective name`` string.

    Returns one of ``allreduce, allgather, reducescatter, alltoall, broadcast, reduce, sendrecv, barrier`` or None.
    """
    n = name.lower().replace("_", "").replace(":", "").replace(" ", "")
    for key, typ in (("allreduce", "allreduce"), ("reducescatter", "reducescatter"), ("allgather", "allgather"),
                     ("alltoall", "alltoall"), ("broadcast", "broadcast"), ("barrier", "barrier"),
                     ("sendrecv", "sendrecv"), ("send", "sendrecv"), ("recv", "sendrecv"), ("reduce", "reduce"),
                     ("gather", "allgather"), ("scatter", "reducescatter")):
        if key in n:
            return typ
    return None


class Event:
    """One normalised trace event (times in µs on this rank's own clock, relative to its ``base_ns``).

    Attributes:
        rank: Global rank.
        lane: ``thread:<tid>`` for host threads, ``stream:<device>:<stream>`` for GPU streams,
            ``thread:<tid>:p2p-<send|recv>-<peer>`` for CPU point-to-point transfers issued by that thread.
        kind: ``compute``, ``comm``, ``host`` or ``memcpy``.
        cat: Kineto category (``kernel``, ``cpu_op``, ``cuda_runtime``, ``user_annotation`` ...).
        name: Op / kernel name.
        ts_us, dur_us: Start and duration, microseconds.
        shapes: ``Input Dims`` frozen to nested tuples (shared between equal shapes), or None.
        bytes: Payload bytes of a collective / memcpy (0 when unknown).
        coll: Normalised collective type for comm events and collective enqueue ops, else None.
        pg: Process-group name when the trace carries it.
        seq: Per-process-group sequence number (2026+ traces), else None.
        group_ranks: Participating global ranks when the trace names them, else None.
        corr: ``correlation`` id (launch <-> kernel), else None.
        peer: For point-to-point ops, the other rank when the trace says (``c10d::send`` inputs), else None.
        step: ``ProfilerStep`` number the event belongs to (filled by :meth:`RankTrace.assign_steps`).
    """

    __slots__ = ("rank", "lane", "kind", "cat", "name", "ts_us", "dur_us", "shapes", "bytes", "coll", "pg", "seq",
                 "group_ranks", "corr", "step", "peer")

    def __init__(self, rank: int, lane: str, kind: str, cat: str, name: str, ts_us: float, dur_us: float,
                 shapes: Any = None, nbytes: float = 0.0, coll: str | None = None, pg: str | None = None,
                 seq: int | None = None, group_ranks: tuple[int, ...] | None = None, corr: int | None = None):
        self.rank, self.lane, self.kind, self.cat, self.name = rank, lane, kind, cat, name
        self.ts_us, self.dur_us, self.shapes, self.bytes = ts_us, dur_us, shapes, nbytes
        self.coll, self.pg, self.seq, self.group_ranks, self.corr = coll, pg, seq, group_ranks, corr
        self.step: int | None = None
        self.peer: int | None = None

    @property
    def end_us(self) -> float:
        return self.ts_us + self.dur_us

    def __repr__(self) -> str:
        return (f"Event(r{self.rank} {self.lane} {self.kind} {self.name[:40]!r} ts={self.ts_us:.3f} "
                f"dur={self.dur_us:.3f})")


@dataclass
class RankTrace:
    """One rank's parsed trace.

    Attributes:
        path: Source file (or ``archive!member``).
        rank, world_size, backend: From ``distributedInfo`` (or the file name).
        base_ns: ``baseTimeNanoseconds`` (0 for old absolute-µs traces); absolute ns = base_ns + ts_us * 1000.
        events: Kept events, sorted by ``ts_us``.
        steps: ``ProfilerStep`` number -> (start_us, dur_us) on the stepping thread.
        main_lane: Lane of the ``ProfilerStep`` annotations (the training thread).
        pg_config: ``distributedInfo.pg_config`` when present.
        devices: GPU names from ``deviceProperties``.
        warnings: Problems found while loading (dropped-event log lines, rank guessed ...).
        stream_waits: (wait call correlation, waiting stream, recorded stream, record call correlation) for every
            ``cudaStreamWaitEvent`` the trace describes (``cuda_sync`` events of newer traces).
    """

    path: str
    rank: int
    world_size: int | None
    backend: str | None
    base_ns: int
    events: list[Event]
    steps: dict[int, tuple[float, float]]
    main_lane: str | None
    pg_config: list[dict] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    hostname: str | None = None
    warnings: list[str] = field(default_factory=list)
    stream_waits: list[tuple[int, int, int, int]] = field(default_factory=list)

    @functools.cached_property
    def has_gpu(self) -> bool:
        """True when the trace holds device (GPU stream) activity."""
        return any(e.lane.startswith("stream:") for e in self.events)

    def counts_by_kind(self) -> dict[str, int]:
        out = {k: 0 for k in KINDS}
        for e in self.events:
            out[e.kind] += 1
        return out

    def shift(self, delta_us: float) -> None:
        """Move every timestamp by ``delta_us`` (used to undo or, in tests, to inject clock skew)."""
        for e in self.events:
            e.ts_us += delta_us
        self.steps = {n: (s + delta_us, d) for n, (s, d) in self.steps.items()}

    def assign_steps(self) -> None:
        """Give every event the ``ProfilerStep`` it belongs to.

        Host events: the step whose window [start, next step's start) holds their start. GPU events: the step of
        the runtime call that launched them (joined on ``correlation``), else their start time. No steps in the
        trace: everything is step 0.
        """
        if not self.steps:
            for e in self.events:
                e.step = 0
            return
        order = sorted(self.steps.items(), key=lambda kv: kv[1][0])
        starts = [s for _, (s, _) in order]
        last_end = order[-1][1][0] + order[-1][1][1]

        def step_at(t: float) -> int | None:
            i = bisect.bisect_right(starts, t) - 1
            if i < 0:
                return None
            if i == len(order) - 1 and t > last_end:
                return None
            return order[i][0]

        launch_step: dict[int, int | None] = {}
        for e in self.events:
            if not e.lane.startswith("stream:"):
                e.step = step_at(e.ts_us)
                if e.corr is not None and e.cat in ("cuda_runtime", "cuda_driver"):
                    launch_step[e.corr] = e.step
        for e in self.events:
            if e.lane.startswith("stream:"):
                e.step = launch_step[e.corr] if e.corr in launch_step else step_at(e.ts_us)


def _freeze(x: Any, cache: dict) -> Any:
    if isinstance(x, list):
        t = tuple(_freeze(v, cache) for v in x)
        return cache.setdefault(t, t)
    return x


def _numel(dims: Any) -> int:
    if isinstance(dims, (list, tuple)) and dims and all(isinstance(d, int) for d in dims):
        n = 1
        for d in dims:
            n *= d
        return n
    return 0


def rank_from_name(path: str | Path) -> int | None:
    """Rank encoded in a trace file name (``rank-3``, ``rank3``, ``worker3``), else None."""
    m = _RANK_IN_NAME.search(Path(str(path)).name)
    return int(m.group(1)) if m else None


def load_trace(path: str | Path, label: str | None = None) -> RankTrace:
    """Parse one rank's Kineto trace (``.json`` or ``.json.gz``), streaming.

    Args:
        path: Trace file.
        label: Name used in messages (defaults to the path; archives pass ``archive!member``).

    Returns:
        The :class:`RankTrace`, events sorted by start time and assigned to steps.

    Raises:
        MeshplanError: Truncated gzip, malformed JSON, or a JSON that is not a Kineto trace.
    """
    label = label or str(path)
    intern = sys.intern
    shape_cache: dict = {}
    norm = _Normaliser(shape_cache, intern)
    steps: dict[int, tuple[float, float]] = {}
    step_lanes: list[str] = []
    n_seen = [0]

    def on_event(ev: dict) -> None:
        n_seen[0] += 1
        if ev.get("ph") != "X":
            return
        cat = ev.get("cat")
        if cat not in _KEEP_CATS:
            return
        try:
            ts = float(ev["ts"])
            dur = float(ev.get("dur", 0.0))
        except (KeyError, TypeError, ValueError):
            return
        name = ev.get("name", "")
        args = ev.get("args") or {}
        if cat == "user_annotation":
            m = _STEP.match(name)
            if m:
                steps[int(m.group(1))] = (ts, dur)
                step_lanes.append(f"thread:{ev.get('tid')}")
                return
        norm.add(cat, intern(str(name)), ts, dur, ev.get("pid"), ev.get("tid"), args)

    header = stream_trace(path, on_event)
    if not isinstance(header.get("distributedInfo", {}), dict):
        raise MeshplanError(f"{label}: not a Kineto trace (distributedInfo is not an object)")
    if n_seen[0] and not norm.events and not steps:
        raise MeshplanError(f"{label}: not a Kineto trace: {n_seen[0]} events but no CPU op, kernel or runtime "
                            f"events")
    dist = header.get("distributedInfo") or {}
    warnings: list[str] = []
    rank = dist.get("rank")
    if not isinstance(rank, int):
        rank = rank_from_name(label)
        if rank is None:
            rank = 0
            warnings.append(f"{label}: no distributedInfo.rank and no rank in the file name; assuming rank 0")
    for key in ("INFO", "ERROR", "WARNING"):
        for line in header.get(key) or []:
            m = _OUT_OF_RANGE.search(line) if isinstance(line, str) else None
            if m and int(m.group(1)) > 0:
                warnings.append(f"{label}: the profiler dropped {m.group(1)} out-of-range events (its log says so); "
                                f"ops may be missing")
    events = norm.finish(rank)
    rt = RankTrace(
        path=label, rank=rank, world_size=dist.get("world_size"), backend=dist.get("backend"),
        base_ns=int(header.get("baseTimeNanoseconds") or 0), events=events, steps=steps,
        main_lane=step_lanes[0] if step_lanes else None, pg_config=list(dist.get("pg_config") or []),
        devices=[str(d.get("name")) for d in header.get("deviceProperties") or [] if isinstance(d, dict)],
        hostname=header.get("host_name") if isinstance(header.get("host_name"), str) else None,
        warnings=warnings, stream_waits=norm.stream_waits)
    rt.assign_steps()
    return rt


class _Normaliser:
    """Turns raw trace events into :class:`Event` s as they stream by (no raw event is kept).

    NCCL kernels are typed from their metadata, else (in :meth:`finish`) from the ``nccl:*`` annotation around
    their launch.
    """

    def __init__(self, shape_cache: dict, intern) -> None:
        self.shape_cache, self.intern = shape_cache, intern
        self.events: list[Event] = []
        self.annotations: dict[str, list[tuple[float, float, str, int]]] = {}  # lane -> (ts, end, coll, bytes)
        self.launches: dict[int, tuple[str, float]] = {}  # correlation -> (host lane, ts) of the launch
        self.stream_waits: list[tuple[int, int, int, int]] = []

    def add(self, cat: str, name: str, ts: float, dur: float, pid: Any, tid: Any, args: dict) -> None:
        events, annotations, shape_cache, intern, rank = (self.events, self.annotations, self.shape_cache,
                                                          self.intern, -1)
        if cat == "cuda_sync":
            # Not an op: a record of which stream waited for which event (needs pytorch#105187 / kineto#808).
            # "Stream Wait Event" = cudaStreamWaitEvent: stream waits for the op recorded on wait_on_stream.
            if args.get("cuda_sync_kind") == "Stream Wait Event":
                w = (args.get("correlation"), args.get("stream"), args.get("wait_on_stream"),
                     args.get("wait_on_cuda_event_record_corr_id"))
                if all(isinstance(x, int) for x in w) and w[3] >= 0:
                    self.stream_waits.append(w)
            return
        dims = args.get("Input Dims")
        shapes = _freeze(dims, shape_cache) if dims is not None else None
        corr = args.get("correlation")
        if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            stream = args.get("stream", tid)
            lane = intern(f"stream:{pid}:{stream}")
            if cat == "kernel":
                # Templated kernel names run to kilobytes; the collective library prefix is near the start.
                kind = "comm" if _COMM_KERNEL.search(name, 0, 96) else "compute"
            else:
                kind = "memcpy"
            nbytes = float(args.get("bytes") or 0.0)
            coll = pg = seq = granks = None
            if kind == "comm":
                cname = args.get("Collective name")
                coll = collective_type(cname) if isinstance(cname, str) else None
                coll = coll or collective_type(name.split("(")[0].replace("ncclKernel", "").replace(
                    "ncclDevKernel", "")) or "collective"
                nel = args.get("In msg nelems")
                if isinstance(nel, (int, float)):
                    nbytes = float(nel) * _DTYPE_BYTES.get(str(args.get("dtype", "float")).lower(), 4)
                pg = args.get("Process Group Name")
                pg = intern(str(pg)) if pg is not None else None
                s = args.get("Seq", args.get("seq"))
                seq = int(s) if isinstance(s, (int, float)) else None
                granks = _parse_ranks(args.get("Process Group Ranks"))
            events.append(Event(rank, lane, kind, cat, name, ts, dur, None, nbytes, coll, pg, seq, granks,
                                corr if isinstance(corr, int) else None))
            return
        lane = intern(f"thread:{tid}")
        if cat in ("cuda_runtime", "cuda_driver"):
            ev = Event(rank, lane, "host", cat, name, ts, dur, None, 0.0, None, None, None, None,
                       corr if isinstance(corr, int) else None)
            if isinstance(corr, int):
                self.launches[corr] = (lane, ts)
            events.append(ev)
            return
        lname = name.lower()
        coll = None
        kind = "host"
        nbytes = 0.0
        if lname.startswith(("gloo:", "mpi:", "ucc:")):
            kind = "comm"  # CPU collective executed on a backend worker thread
        if lname.startswith(("nccl:", "gloo:", "mpi:", "ucc:", "c10d::")) or name == "record_param_comms":
            cname = args.get("Collective name")
            coll = collective_type(cname if isinstance(cname, str) else name.split(":", 1)[-1])
            types = args.get("Input type") or []
            n = _numel(dims[0]) if isinstance(dims, list) and dims else 0
            nel = args.get("In msg nelems")
            if isinstance(nel, (int, float)):
                n = int(nel)
            elsize = _DTYPE_BYTES.get(str(types[0]).lower(), 4) if types else 4
            nbytes = float(n * elsize)
            if lname.startswith("nccl:") and coll:
                annotations.setdefault(lane, []).append((ts, ts + dur, coll, int(nbytes)))
        if kind == "comm" and coll is None:
            coll = "collective"
        if kind == "comm" and coll == "sendrecv":
            coll = "send" if lname.endswith("send") else ("recv" if "recv" in lname else coll)
        peer = None
        if name in _P2P_OPS:
            coll = "send" if name == "c10d::send" else "recv"
            ci = args.get("Concrete Inputs")
            if isinstance(ci, list) and len(ci) > 2 and str(ci[2]).lstrip("-").isdigit():
                peer = int(ci[2])
        pg = args.get("Process Group Name")
        ev = Event(rank, lane, kind, cat, name, ts, dur, shapes, nbytes, coll,
                   intern(str(pg)) if pg is not None else None, None,
                   _parse_ranks(args.get("Process Group Ranks")), corr if isinstance(corr, int) else None)
        ev.peer = peer
        events.append(ev)

    def finish(self, rank: int) -> list[Event]:
        """All events, ranked, annotation-typed and sorted by start."""
        events, annotations = self.events, self.annotations
        for e in events:
            e.rank = rank
        # NCCL kernels without metadata: the nccl:* annotation around the launch names the collective and its size
        # (old traces, ../shared/notes/profiler.md §2). Kernel-name typing stays the fallback.
        for lane_ann in annotations.values():
            lane_ann.sort()
        for e in events:
            if e.kind == "comm" and e.lane.startswith("stream:") and e.corr in self.launches:
                lane, t = self.launches[e.corr]
                anns = annotations.get(lane, [])
                for a0, a1, coll, nb in anns:
                    if a0 <= t <= a1:
                        if not e.bytes:
                            e.bytes = float(nb)
                        if e.coll in ("collective", "sendrecv") and coll:
                            e.coll = coll
                        break
        events.sort(key=lambda e: e.ts_us)
        # A CPU point-to-point op (gloo:send/recv, the wait for the transfer) takes its peer from the c10d::send /
        # recv op that issued it, and starts where that op started: the transfer is posted at the issue.
        issued: dict[str, Event] = {}
        for e in events:
            if e.name in _P2P_OPS:
                issued[e.lane] = e
            elif e.kind == "comm" and e.coll in ("send", "recv") and e.lane in issued:
                op = issued.pop(e.lane)
                if e.peer is None:
                    e.peer = op.peer
                if op.ts_us <= e.ts_us:
                    e.dur_us += e.ts_us - op.ts_us
                    e.ts_us = op.ts_us
        for e in events:
            if e.kind == "comm" and e.coll in ("send", "recv") and e.lane.startswith("thread:"):
                # The annotation spans issue -> completion while the thread goes on (isend/irecv) or blocks in
                # wait(): the transfer gets its own lane per direction and peer, the thread's wait is a gap.
                e.lane = self.intern(f"{e.lane}:p2p-{e.coll}-{e.peer}")
        events.sort(key=lambda e: e.ts_us)
        return events


def _parse_ranks(v: Any) -> tuple[int, ...] | None:
    if isinstance(v, list):
        return tuple(int(x) for x in v)
    if isinstance(v, str) and v.startswith("["):
        try:
            return tuple(int(x) for x in v.strip("[]").split(",") if x.strip())
        except ValueError:
            return None
    return None
