"""When each pipeline rank runs which micro-batch: the per-rank op orders of the four schedules of
``planner.layout.schedules``, timed by dependencies, for drawing (``meshplan plan --report``).

``planner.layout.schedules`` prices a schedule by its bubble formula; this module lays out the ops the formula counts.
Each rank runs its list in order; an op starts when its rank is free and its input is ready (the forward of the
previous virtual stage, the backward of the next one, the rank's own backward for a weight-gradient pass).
Point-to-point transfers take no time here (the estimator prices them apart).

Orders, per rank ``r`` of ``p``, ``m`` micro-batches:

- 1F1B: ``p - r - 1`` warm-up forwards, then forward/backward pairs, then the remaining backwards (Narayanan et al.
  2021 §2.2.1; ``torch.distributed.pipelining.Schedule1F1B``).
- Interleaved (``v`` chunks per rank): Megatron-LM's order as ``torch.distributed.pipelining`` writes it
  (``ScheduleInterleaved1F1B``): micro-batches in rounds of ``p``, chunk ``(k // p) % v`` for the k-th forward,
  ``(v - 1) p + 2 (p - r - 1)`` warm-up forwards.
- ZB-H1: the 1F1B order with each backward split into its input-gradient pass and a weight-gradient pass ``W``,
  rank ``r`` holding back its first ``r`` W passes to the end (``ScheduleInterleavedZeroBubble`` with one chunk,
  the paper's ZB-H1: Qi et al. 2024 §3.1).
- DualPipe: DeepSeek's eight steps (``deepseek-ai/DualPipe`` ``dualpipe.py``, ``DualPipe.step``): half the
  micro-batches enter at rank 0, half at rank ``p - 1``; a rank holds stage ``r`` of the first direction and stage
  ``p - 1 - r`` of the second. An overlapped forward-and-backward pair starts once both inputs are there
  (``_forward_backward_chunk`` receives both, then runs them) and is drawn as its forward then its backward, as
  ``planner.layout.schedules`` prices F&B as F + B.

Units: seconds.
"""
from __future__ import annotations

from dataclasses import dataclass

from meshplan.core.errors import MeshplanError
from meshplan.planner.layout.schedules import WEIGHT_GRAD_SHARE


@dataclass(frozen=True)
class Slot:
    """One pass of one micro-batch on one pipeline rank.

    ``kind``: ``F`` (forward), ``B`` (backward; only its input-gradient part when ``W`` is split off), ``W``
    (weight gradients). ``chunk``: the rank's model chunk (interleaved) or direction (DualPipe: 0 enters at rank 0).
    """

    rank: int
    kind: str
    microbatch: int
    chunk: int
    start_s: float
    end_s: float


# An op in a rank's list: (kind, direction, position along its micro-batch's path of virtual stages, micro-batch,
# split, paired): split = its weight-gradient pass is a separate W op; paired = a forward launched together with
# the backward after it (DualPipe's overlapped pair: both inputs received before either runs).
_Op = tuple


def schedule_slots(schedule: str, pp: int, vpp: int, m: int, fwd_s: list[float], bwd_s: list[float]) -> list[Slot]:
    """Every pass of one step's pipeline, timed.

    Args:
        schedule: ``1f1b``, ``interleaved``, ``zbh1`` or ``dualpipe`` (``Layout.schedule``).
        pp, vpp: pipeline ranks and chunks per rank.
        m: micro-batches in the step (DualPipe: even, at least ``2 pp``, as ``DualPipe.step`` asserts).
        fwd_s, bwd_s: per pipeline stage (model order), one micro-batch's forward and full backward through the
            whole stage (all its chunks), seconds.

    Raises:
        MeshplanError: the schedule cannot run these numbers, or an order deadlocks (a bug here, never silent).
    """
    if len(fwd_s) != pp or len(bwd_s) != pp:
        raise MeshplanError(f"schedule drawing: {len(fwd_s)} forward / {len(bwd_s)} backward times for pp={pp}")
    if m < 1:
        raise MeshplanError(f"schedule drawing: {m} micro-batches")
    if schedule == "dualpipe":
        if pp % 2 or m % 2 or m < 2 * pp:
            raise MeshplanError(f"DualPipe needs an even pp and an even number of micro-batches >= 2 pp "
                                f"(pp={pp}, m={m})")
        orders, length = [_dualpipe(r, pp, m) for r in range(pp)], pp
    elif schedule == "interleaved":
        orders, length = [_interleaved(r, pp, vpp, m) for r in range(pp)], pp * vpp
    elif schedule in ("1f1b", "zbh1"):
        orders, length = [_one_f_one_b(r, pp, m, schedule == "zbh1") for r in range(pp)], pp
    else:
        raise MeshplanError(f"schedule drawing: unknown schedule {schedule!r}")
    chunks = vpp if schedule == "interleaved" else 1
    return _timed(orders, pp, length, schedule == "dualpipe",
                  [f / chunks for f in fwd_s], [b / chunks for b in bwd_s])


def _one_f_one_b(r: int, p: int, m: int, zero_bubble: bool) -> list[_Op]:
    warm = min(p - r - 1, m)
    ops: list[_Op] = [("F", 0, r, i, False, False) for i in range(warm)]
    held = 0  # zbh1: weight passes rank r holds back (its first r)
    pending: list[int] = []
    for i in range(m):
        if warm + i < m:
            ops.append(("F", 0, r, warm + i, False, False))
        ops.append(("B", 0, r, i, zero_bubble, False))
        if zero_bubble:
            pending.append(i)
            if held < r:
                held += 1
            else:
                ops.append(("W", 0, r, pending.pop(0), True, False))
    ops += [("W", 0, r, i, True, False) for i in pending]
    return ops


def _interleaved(r: int, p: int, v: int, m: int) -> list[_Op]:
    rounds = max(1, m // p)
    per_round = m // rounds
    total = m * v
    warm = min((v - 1) * per_round + 2 * (p - r - 1), total)
    fwd_next = [0] * v
    bwd_next = [0] * v
    ops: list[_Op] = []

    def fwd(k: int) -> None:
        c = (k // per_round) % v
        ops.append(("F", 0, c * p + r, fwd_next[c], False, False))
        fwd_next[c] += 1

    def bwd(k: int) -> None:
        c = v - 1 - ((k - warm) // per_round) % v
        ops.append(("B", 0, c * p + r, bwd_next[c], False, False))
        bwd_next[c] += 1

    for k in range(warm):
        fwd(k)
    for k in range(warm, total):
        fwd(k)
        bwd(k)
    for k in range(total, total + warm):
        bwd(k)
    return ops


def _dualpipe(r: int, p: int, m: int) -> list[_Op]:
    """``DualPipe.step``'s eight steps for rank ``r`` (phase 0 is the direction entering at rank 0 on the first
    half of the ranks, the other one on the second half)."""
    half_ranks, half = p // 2, min(r, p - 1 - r)
    second = int(r >= half_ranks)
    nxt = {0: 0, 1: 0}, {0: 0, 1: 0}  # next forward / backward micro-batch per direction
    queue: list[tuple[int, int]] = []  # weight passes waiting (direction, micro-batch), first in first out
    ops: list[_Op] = []

    def pos(d: int) -> int:
        return r if d == 0 else p - 1 - r

    def f(phase: int, paired: bool = False) -> None:
        d = phase ^ second
        ops.append(("F", d, pos(d), nxt[0][d], False, paired))
        nxt[0][d] += 1

    def b(phase: int, zb: bool = False) -> None:
        d = phase ^ second
        ops.append(("B", d, pos(d), nxt[1][d], zb, False))
        if zb:
            queue.append((d, nxt[1][d]))
        nxt[1][d] += 1

    def w() -> None:
        d, i = queue.pop(0)
        ops.append(("W", d, pos(d), i, True, False))

    for _ in range((half_ranks - half - 1) * 2):
        f(0)
    for _ in range(half + 1):
        f(0)
        f(1)
    for _ in range(half_ranks - half - 1):
        b(1, zb=True)
        w()
        f(1)
    middle = r in (half_ranks - 1, half_ranks)
    for i in range(m // 2 - p + half + 1):
        f(0, paired=not (i == 0 and middle))  # the middle ranks' first pair is not overlapped (DualPipe.step)
        b(1)
        f(1, paired=True)
        b(0)
    for _ in range(half_ranks - half - 1):
        b(1)
        f(1, paired=True)
        b(0)
    zb, steps = False, half + 1
    for i in range(steps):
        if i == steps // 2 and half % 2 == 1:
            zb = True
        b(1, zb)
        if i == steps // 2 and half % 2 == 0:
            zb = True
        b(0, zb)
    for _ in range(half_ranks - half - 1):
        w()
        b(0, zb=True)
    for _ in range(half + 1):
        w()
    if queue:
        raise MeshplanError(f"DualPipe order of rank {r}: {len(queue)} weight passes left (a bug in the order)")
    return ops


def _timed(orders: list[list[_Op]], p: int, length: int, dual: bool, fwd_s: list[float],
           bwd_s: list[float]) -> list[Slot]:
    """List scheduling: each rank runs its ops in order, each op as soon as its rank and its input are ready."""
    def rank_of(d: int, pos: int) -> int:
        return (p - 1 - pos if d == 1 else pos) if dual else pos % p

    def cost(kind: str, pos: int, split: bool) -> float:
        stage = pos % p
        w = WEIGHT_GRAD_SHARE * bwd_s[stage]
        return fwd_s[stage] if kind == "F" else (w if kind == "W" else bwd_s[stage] - (w if split else 0.0))

    def dep_of(op: _Op):
        """The pass whose output ``op`` needs (``None``: the first forward of a micro-batch)."""
        kind, d, pos, i = op[:4]
        if kind == "F":
            return ("F", d, pos - 1, i) if pos > 0 else None
        if kind == "B":
            return ("B", d, pos + 1, i) if pos < length - 1 else ("F", d, pos, i)
        return ("B", d, pos, i)

    done: dict[tuple, float] = {}  # (kind, direction, position, micro-batch) -> end
    free = [0.0] * p
    nxt = [0] * p
    slots: list[Slot] = []
    left = sum(len(o) for o in orders)
    while left:
        moved = False
        for r in range(p):
            while nxt[r] < len(orders[r]):
                kind, d, pos, i, split, paired = orders[r][nxt[r]]
                deps = [dep_of(orders[r][nxt[r]])] + ([dep_of(orders[r][nxt[r] + 1])] if paired else [])
                deps = [x for x in deps if x is not None and x != (kind, d, pos, i)]
                if any(x not in done for x in deps):
                    break
                start = max([free[r]] + [done[x] for x in deps])
                end = free[r] = start + cost(kind, pos, split)
                done[(kind, d, pos, i)] = end
                chunk = d if dual else pos // p
                slots.append(Slot(r, kind, i, chunk, start, end))
                nxt[r] += 1
                left -= 1
                moved = True
        if not moved:
            stuck = [orders[r][nxt[r]][:4] for r in range(p) if nxt[r] < len(orders[r])]
            raise MeshplanError(f"schedule drawing: the order deadlocks at {stuck[:3]} (a bug in the order)")
    return slots
