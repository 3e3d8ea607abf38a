"""Raw trace events -> :class:`profiler.events.Event` records, as they stream by (no raw event is kept).

Device comm ops are typed from their metadata, else (in :meth:`Normaliser.finish`) from the collective
annotation (``nccl:*``, ``hccl:*`` ...) around their launch, else from their name. Every field is type-checked:
a value of the wrong type is treated as absent (the caller counts events it could not use).
"""
from __future__ import annotations

import math
from typing import Any, Callable

from meshplan.profiler.categories import (
    collective_type,
    comm_type_hint,
    is_comm_annotation,
    is_comm_kernel,
    is_cpu_collective,
)
from meshplan.profiler.events import Event

_DTYPE_BYTES = {"float": 4, "float32": 4, "double": 8, "half": 2, "float16": 2, "bfloat16": 2, "c10::half": 2,
                "c10::bfloat16": 2, "int": 4, "int32": 4, "long int": 8, "int64": 8, "long": 8, "bool": 1,
                "unsigned char": 1, "signed char": 1, "char": 1, "int8": 1, "uint8": 1, "short": 2, "short int": 2}
_P2P_OPS = ("c10d::send", "c10d::recv_", "c10d::recv_any_source_")
_MAX_SHAPE_DEPTH = 8  # Input Dims nest two levels (list of per-input dims); deeper is not a shape
_CAT_NAME = {"host": "cpu_op", "annotation": "user_annotation", "device": "kernel"}


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def _freeze(x: Any, cache: dict, depth: int = 0) -> Any:
    if depth == 0 and type(x) is list:
        # Fast path for the usual two levels of scalars ([[8, 1024], [1024], []]); anything else (deeper lists,
        # dicts: unhashable) takes the checked path below.
        try:
            t = tuple(tuple(v) if type(v) is list else v for v in x)
            return cache.setdefault(t, t)
        except TypeError:
            pass
    if isinstance(x, list):
        if depth >= _MAX_SHAPE_DEPTH:
            return None
        t = tuple(_freeze(v, cache, depth + 1) for v in x)
        return cache.setdefault(t, t)
    return x if isinstance(x, (int, float, str)) or x is None else None


def _numel(dims: Any) -> int:
    """Elements of a shape; 0 when it is not one (a dimension that is not an integer in [0, 2^48): no device holds
    2^48 elements, and 2^200 x 2^200 would overflow the float its bytes become)."""
    if isinstance(dims, (list, tuple)) and dims and all(_int(d) is not None and 0 <= d < 2**48 for d in dims):
        n = 1
        for d in dims:
            n *= d
        return n
    return 0


def parse_ranks(v: Any) -> tuple[int, ...] | None:
    """``Process Group Ranks`` (a list, or a string ``"[0, 1]"``) -> tuple of ints, None when malformed."""
    if isinstance(v, list):
        return tuple(v) if v and all(_int(x) is not None for x in v) else None
    if isinstance(v, str) and v.startswith("[") and len(v) < 1_000_000:
        try:
            t = tuple(int(x) for x in v.strip("[]").split(",") if x.strip())
        except ValueError:
            return None
        return t or None
    return None


def _kernel_collective(name: str, args: dict, nbytes: float, intern: Callable[[str], str]
                       ) -> tuple[str, str | None, int | None, tuple[int, ...] | None, float]:
    """(type, process group, sequence number, group ranks, payload bytes) of a comm kernel: from the metadata it
    carries (``Collective name``, ``In msg nelems``, ``Process Group Name``, ``Seq``), else from its name."""
    cname = args.get("Collective name")
    coll = collective_type(cname) if isinstance(cname, str) else None
    coll = coll or comm_type_hint(name) or collective_type(
        name.split("(")[0].replace("ncclKernel", "").replace("ncclDevKernel", "")) or "collective"
    nel = _num(args.get("In msg nelems"))
    if nel is not None and nel >= 0:
        nbytes = nel * _DTYPE_BYTES.get(str(args.get("dtype", "float")).lower(), 4)
    pgn = args.get("Process Group Name")
    pg = intern(str(pgn)[:200]) if isinstance(pgn, (str, int)) else None
    s = _num(args.get("Seq"))
    s = _num(args.get("seq")) if s is None else s
    seq = int(s) if s is not None else None
    return coll, pg, seq, parse_ranks(args.get("Process Group Ranks")), nbytes


class Normaliser:
    """Accumulates events of one trace; :meth:`finish` returns them typed, ranked and sorted."""

    def __init__(self, intern: Callable[[str], str]) -> None:
        self.Event = Event  # bound once: add() runs per raw event
        self.shape_cache: dict = {}
        self.intern = intern
        self.events: list = []
        self.annotations: dict[str, list[tuple[float, float, str, int]]] = {}  # lane -> (ts, end, coll, bytes)
        self.launches: dict[int, tuple[str, float]] = {}  # correlation -> (host lane, ts) of the launch
        self.stream_waits: list[tuple[int, int, int, int]] = []

    def add(self, role: str, rawcat: str, name: str, ts: float, dur: float, pid: Any, tid: Any, args: dict) -> bool:
        """Add one ``ph: X`` event of a used category. Returns False when it had to be skipped."""
        Event, intern, events = self.Event, self.intern, self.events
        if role == "sync":
            # Not an op: a record of which stream waited for which event (needs pytorch#105187 / kineto#808).
            # "Stream Wait Event" = cudaStreamWaitEvent: stream waits for the op recorded on wait_on_stream.
            if args.get("cuda_sync_kind") == "Stream Wait Event":
                w = (args.get("correlation"), args.get("stream"), args.get("wait_on_stream"),
                     args.get("wait_on_cuda_event_record_corr_id"))
                if all(_int(x) is not None for x in w) and w[3] >= 0:
                    self.stream_waits.append(w)
            return True
        corr = _int(args.get("correlation"))
        if role in ("device", "copy"):
            stream = args.get("stream", tid)
            if _int(stream) is None:  # 2021 traces: tid "stream 7"
                s = str(stream)
                stream = s[7:] if s.startswith("stream ") else s
            lane = intern(f"stream:{pid}:{stream}")
            lname = name.lower()
            if role == "copy" or (rawcat == "mtia_ccp_events" and lname.startswith("dma")):
                kind, cat = "memcpy", ("gpu_memset" if "memset" in rawcat.lower() or "memset" in lname
                                       else "gpu_memcpy")
            else:
                kind, cat = ("comm" if is_comm_kernel(name) else "compute"), "kernel"
            nbytes = _num(args.get("bytes")) or _num(args.get("size")) or 0.0
            coll = pg = seq = granks = None
            if kind == "comm":
                coll, pg, seq, granks, nbytes = _kernel_collective(name, args, nbytes, intern)
            events.append(Event(-1, lane, kind, cat, name, ts, dur, None, max(0.0, nbytes), coll, pg, seq, granks,
                                corr))
            return True
        lane = intern(f"thread:{tid}")
        if role == "runtime":
            cat = "cuda_driver" if rawcat.endswith("_driver") else "cuda_runtime"
            if corr is not None:
                self.launches[corr] = (lane, ts)
            events.append(Event(-1, lane, "host", cat, name, ts, dur, None, 0.0, None, None, None, None, corr))
            return True
        dims = args.get("Input Dims")
        shapes = _freeze(dims, self.shape_cache) if isinstance(dims, list) else None
        lname = name.lower()
        coll = None
        kind = "host"
        nbytes = 0.0
        if is_cpu_collective(lname):
            kind = "comm"  # CPU collective executed on a backend worker thread
        if is_comm_annotation(lname):
            cname = args.get("Collective name")
            coll = collective_type(cname if isinstance(cname, str) else name.split(":", 1)[-1])
            types = args.get("Input type")
            n = _numel(dims[0]) if isinstance(dims, list) and dims else 0
            nel = _num(args.get("In msg nelems"))
            if nel is not None and nel >= 0:
                n = int(nel)
            elsize = _DTYPE_BYTES.get(str(types[0]).lower(), 4) if isinstance(types, list) and types else 4
            nbytes = float(n * elsize)
            if lname.startswith(("nccl:", "rccl:", "hccl:", "xccl:")) and coll:
                self.annotations.setdefault(lane, []).append((ts, ts + dur, coll, int(nbytes)))
        if kind == "comm" and coll is None:
            coll = "collective"
        if kind == "comm" and coll == "sendrecv":
            coll = "send" if lname.endswith("send") else ("recv" if "recv" in lname else coll)
        peer = None
        if name in _P2P_OPS:
            coll = "send" if name == "c10d::send" else "recv"
            ci = args.get("Concrete Inputs")
            if isinstance(ci, list) and len(ci) > 2 and str(ci[2]).lstrip("-").isdigit() and len(str(ci[2])) < 12:
                peer = int(ci[2])
        pgn = args.get("Process Group Name")
        ev = Event(-1, lane, kind, _CAT_NAME[role], name, ts, dur, shapes, nbytes, coll,
                   intern(str(pgn)[:200]) if isinstance(pgn, (str, int)) else None, None,
                   parse_ranks(args.get("Process Group Ranks")), corr)
        ev.peer = peer
        events.append(ev)
        return True

    def finish(self, rank: int) -> list:
        """All events, ranked, annotation-typed and sorted by start."""
        events, annotations = self.events, self.annotations
        for e in events:
            e.rank = rank
        # Device comm ops without metadata: the collective annotation around the launch names the collective and
        # its size (old traces, ../shared/notes/profiler.md §2). Kernel-name typing stays the fallback.
        for lane_ann in annotations.values():
            lane_ann.sort()
        for e in events:
            if e.kind == "comm" and e.lane.startswith("stream:") and e.corr in self.launches:
                lane, t = self.launches[e.corr]
                for a0, a1, coll, nb in annotations.get(lane, []):
                    if a0 <= t <= a1:
                        if not e.bytes:
                            e.bytes = float(nb)
                        if e.coll in ("collective", "sendrecv") and coll:
                            e.coll = coll
                        break
        events.sort(key=lambda e: e.ts_us)
        # A CPU point-to-point op (gloo:send/recv, the wait for the transfer) takes its peer from the c10d::send /
        # recv op that issued it, and starts where that op started: the transfer is posted at the issue.
        issued: dict = {}
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

