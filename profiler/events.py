"""The normalised records of a trace: one :class:`Event` per kept op, one :class:`RankTrace` per rank.

The data types alone, below every module that builds or reads them: :mod:`profiler.normalise` makes the events,
:mod:`profiler.steps` assigns them to steps and :mod:`profiler.trace` assembles the rank's trace, each importing
these types from here (so none of them needs to import another to name a type).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

KINDS = ("compute", "comm", "host", "memcpy")


class Event:
    """One normalised trace event (times in µs on this rank's own clock, relative to its ``base_ns``).

    Attributes:
        rank: Global rank.
        lane: ``thread:<tid>`` for host threads, ``stream:<device>:<stream>`` for device queues,
            ``thread:<tid>:p2p-<send|recv>-<peer>`` for CPU point-to-point transfers issued by that thread.
        kind: ``compute``, ``comm``, ``host`` or ``memcpy``.
        cat: Category normalised to today's CUDA names whatever the vendor or vintage: ``cpu_op`` (host ops),
            ``user_annotation``, ``cuda_runtime`` (any runtime call: CUDA, HIP, MTIA, XPU ...), ``cuda_driver``,
            ``kernel`` (any device op), ``gpu_memcpy``, ``gpu_memset``.
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
        step: Step number the event belongs to (filled by :func:`profiler.steps.assign_steps`).
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
        steps: step number -> (start_us, dur_us) on the stepping thread.
        main_lane: Lane of the step markers (the training thread).
        pg_config: ``distributedInfo.pg_config`` when present.
        devices: Device names from ``deviceProperties``.
        warnings: Problems found while loading (dropped-event log lines, rank guessed ...).
        stream_waits: (wait call correlation, waiting stream, recorded stream, record call correlation) for every
            ``cudaStreamWaitEvent`` the trace describes (``cuda_sync`` events of newer traces).
        categories: raw category -> {"events": n seen, "used": n kept, "role": role or None, "why": reason when
            not used}; the ``(none)`` entry counts metadata/flow/instant events without a category.
        step_source: ``ProfilerStep`` markers, ``cut at <op>``, or None (no steps: one step 0).
        empty_steps: Steps whose marker holds no op of the rank (replayed as idle).
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
    categories: dict[str, dict] = field(default_factory=dict)
    step_source: str | None = None
    empty_steps: list[int] = field(default_factory=list)
    file_bytes: int = 0

    @functools.cached_property
    def has_gpu(self) -> bool:
        """True when the trace holds device (accelerator queue) activity."""
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
