"""Match collective operations across ranks: which comm event on rank A is the same collective as on rank B.

Identity, in order of preference (``../shared/notes/profiler.md`` §7-8):

1. process group + ``Seq`` (per-group sequence number, kineto PR #1294, 2026+ traces);
2. process group + the k-th collective of that group on the rank (metadata traces without ``Seq``);
3. CPU point-to-point (``gloo:send`` / ``gloo:recv``, issued on the training thread): (source, destination, k)
   -- the k-th send from A to B is the k-th receive on B from A; the peer comes from the ``c10d::send`` /
   ``c10d::recv_`` inputs, or is the other rank of a 2-rank job;
4. channel + collective type + k-th occurrence, where the channel is the NCCL stream id (device index dropped:
   rank 3 runs on ``cuda:3`` but its NCCL stream has the same id) or, for CPU backends, all gloo worker threads
   of the rank together (gloo hands work to its threads FIFO, so start order is issue order while the thread a
   collective lands on differs between ranks).

Expected participants come from ``Process Group Ranks`` / ``pg_config`` when present, else every rank of the
job (``world_size``). A group is *complete* when every expected participant is loaded; otherwise it is partial
(a sampled pair of a 128-rank job, a rank missing, or a rank that issued a collective nobody else did).
"""
from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

from meshplan.profiler.runs import Run
from meshplan.profiler.trace import Event

_STREAM = re.compile(r"^stream:[^:]*:(.*)$")


@dataclass
class CollGroup:
    """One collective instance across ranks.

    Attributes:
        key: Identity tuple (see module docstring).
        coll: Normalised type (``allreduce``, ``alltoall`` ...).
        step: ProfilerStep number.
        members: rank -> comm Event.
        expected: Ranks that take part (None when unknown).
    """

    key: tuple
    coll: str
    step: int | None
    members: dict[int, Event] = field(default_factory=dict)
    expected: tuple[int, ...] | None = None

    @property
    def complete(self) -> bool:
        """All expected participants are present (and there are at least two)."""
        if self.expected is None:
            return len(self.members) >= 2
        return len(self.expected) >= 2 and all(r in self.members for r in self.expected)

    @property
    def label(self) -> str:
        k = "/".join(str(x) for x in self.key)
        return f"{self.coll} [{k}]"


def channel_of(e: Event) -> str:
    """Channel a comm event is ordered on (NCCL stream id without the device, or ``cpu-comm``)."""
    m = _STREAM.match(e.lane)
    return f"stream{m.group(1)}" if m else "cpu-comm"


def match_collectives(run: Run) -> tuple[list[CollGroup], list[str]]:
    """Group every comm event of the run into :class:`CollGroup` s.

    Returns:
        (groups sorted by the earliest member's start, warnings about collectives seen on only some ranks).
    """
    groups: dict[tuple, CollGroup] = {}
    pg_ranks: dict[str, tuple[int, ...]] = {}
    for t in run.ranks.values():
        for pg in t.pg_config:
            if isinstance(pg, dict) and "pg_name" in pg and isinstance(pg.get("ranks"), list):
                pg_ranks[str(pg["pg_name"])] = tuple(int(x) for x in pg["ranks"])
    world = tuple(range(run.world_size)) if run.world_size else tuple(sorted(run.ranks))
    for rank, t in run.ranks.items():
        counters: dict[tuple, int] = defaultdict(int)
        for e in t.events:
            if e.kind != "comm":
                continue
            peer = e.peer if e.peer is not None else (1 - rank if run.world_size == 2 else None)
            if e.coll in ("send", "recv") and peer is not None and not e.lane.startswith("stream:"):
                # CPU point-to-point: the k-th send from A to B is the k-th receive on B from A.
                src, dst = (rank, peer) if e.coll == "send" else (peer, rank)
                base = ("p2p", src, dst)
                key = base + (counters[base],)
                counters[base] += 1
                if key not in groups:
                    groups[key] = CollGroup(key=key, coll="sendrecv", step=e.step, expected=(src, dst))
            elif e.pg is not None and e.seq is not None:
                key = ("pg", e.pg, "seq", e.seq)
            elif e.pg is not None:
                base = ("pg", e.pg)
                key = base + (counters[base],)
                counters[base] += 1
            else:
                base = (channel_of(e), e.coll)
                key = base + (counters[base],)
                counters[base] += 1
            g = groups.get(key)
            if g is None:
                expected = e.group_ranks or (pg_ranks.get(e.pg) if e.pg is not None else None) or world
                g = groups[key] = CollGroup(key=key, coll=e.coll or "collective", step=e.step, expected=expected)
            if rank in g.members:  # same key twice on one rank: keep the first, the rest stays unmatched
                continue
            g.members[rank] = e
    warnings: list[str] = []
    present = set(run.ranks)
    for g in groups.values():
        exp_present = [r for r in (g.expected or ()) if r in present]
        absent_loaded = [r for r in exp_present if r not in g.members]
        if absent_loaded and len(exp_present) > 1:
            warnings.append(f"step {g.step}: collective {g.label} has no peer on rank(s) {absent_loaded} "
                            f"(seen on {sorted(g.members)}); it keeps its measured duration")
        sizes = {m.bytes for m in g.members.values() if m.bytes}
        if len(sizes) > 1 and g.coll in ("allreduce", "broadcast", "reduce") and g.key[0] != "pg":
            warnings.append(f"step {g.step}: collective {g.label} has different sizes across ranks "
                            f"({sorted(sizes)[:2]} bytes): matched by issue order, a rank may have skipped one")
        types = {m.coll for m in g.members.values()} - {"send", "recv"}
        if len(types) > 1:
            warnings.append(f"step {g.step}: collective {g.label} has different types across ranks {sorted(types)}")
    out = sorted(groups.values(), key=lambda g: min(m.ts_us for m in g.members.values()))
    return out, warnings
