"""Kineto trace ingestion: one rank's trace file -> :class:`RankTrace` of normalised :class:`Event` records.

Reads what PyTorch writes today and what it wrote before (``../shared/notes/profiler.md`` §2), for any vendor:
the category of every event decides its role (:mod:`profiler.categories`): host ops, annotations, runtime calls
(CUDA, HIP, MTIA, XPU ...), device ops (kernels, MTIA CCP events), copies. 2021 traces (``Operator``, ``Runtime``,
``Kernel``, ``Memcpy``, ``Memset``; ``ProfilerStep#N`` as an ``Operator``) load like current ones. Every event
category seen is counted, and the ones not used are reported with the reason (``RankTrace.categories``).

* Device ops: compute, or comm when the name says so (NCCL, RCCL, HCCL, DeepEP, NVSHMEM ... see
  :func:`profiler.categories.is_comm_kernel`); joined to the launching runtime call by ``correlation``.
  Collective metadata (``Collective name``, ``In msg nelems``, ``Process Group Name``, ``Seq``) is read when the
  kernel carries it; otherwise the enclosing ``nccl:*`` annotation gives the type and size (``Input Dims``).
* CPU runs: gloo collectives are ``gloo:*`` ``user_annotation`` events on gloo worker threads (comm).
* Timestamps: ``ts``/``dur`` are microseconds in every variant; old traces use integer absolute unix µs, newer
  ones float µs relative to ``baseTimeNanoseconds`` (kept as ``base_ns`` so ranks share one clock).
* Rank: ``distributedInfo.rank``, else the file name (``rank-3``, ``rank3``, ``worker3``), else 0 with a warning.
* Steps: ``ProfilerStep#N`` ranges; a trace without them gets one warning and, when asked, steps cut at a named
  op or at the optimizer step (:mod:`profiler.steps`).

Hostile input (the rules are :mod:`profiler.trace_schema`, published in ``docs/schemas/``): a timed event with a
field of the wrong type (``ts`` a string, ``dur`` negative, ``args`` a list, ``correlation`` "7", an integer past
64 bits) refuses the file, naming the event and the field (none of the 623,146 timed events of the 31 traces in
``../shared`` has one); header fields of the wrong type (``distributedInfo.rank`` "x", ``world_size`` "many" or
1e8, ``baseTimeNanoseconds`` "abc", ``pg_config`` 5) are refused with the file and field named. Only what the
analyses need is kept, strings are interned and shapes shared, and the file is streamed
(:mod:`profiler.jsonstream`), so memory grows with the kept events, not with the file text.
"""
from __future__ import annotations

import math
import re
import sys
from pathlib import Path
from typing import Any, Callable

from meshplan.core.errors import MeshplanError, one_line
from meshplan.profiler.categories import ROLES, collective_type, role_of, why_not_used  # noqa: F401 (re-export)
from meshplan.profiler.events import KINDS, Event, RankTrace  # noqa: F401 (re-export)
from meshplan.profiler.jsonstream import stream_trace
from meshplan.profiler.normalise import Normaliser
from meshplan.profiler.steps import apply_step_cut
from meshplan.profiler.trace_schema import ARG_TYPES, MAX_WORLD_SIZE, arg_problem, number_ok, validate_header  # noqa: F401 (re-export)

_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_OUT_OF_RANGE = re.compile(r"Out-of-range = (\d+)")
_RANK_IN_NAME = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)
# Runtime calls that make the host wait for the device (the thread blocks until queued work finishes).
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
              "hipStreamSynchronize", "hipDeviceSynchronize", "hipEventSynchronize", "hipMemcpy",
              "cuStreamSynchronize", "cuCtxSynchronize", "synchronizeStream", "synchronizeDevice")


def rank_from_name(path: str | Path) -> int | None:
    """Rank encoded in a trace file name (``rank-3``, ``rank3``, ``worker3``), else None."""
    m = _RANK_IN_NAME.search(Path(str(path)).name)
    return int(m.group(1)) if m else None


def _bad_event(label: str, index: int, ev: dict, why: str) -> MeshplanError:
    """One line naming the file, the event (its place in ``traceEvents`` and its name) and the field."""
    name = ev.get("name")
    named = f" ({one_line(name)[:60]!r})" if isinstance(name, str) else ""
    return MeshplanError(f"{label}: traceEvents[{index}]{named}: {why}; not a trace meshplan can read")


def _time_problem(ts: Any, dur: Any) -> str | None:
    """Why an ``X`` event's ``ts``/``dur`` cannot be used (the schema's rules, ``TraceEvent``), else None."""
    for key, v in (("ts", ts), ("dur", dur)):
        if not number_ok(v):
            kind = type(v)
            got = ("an integer past 64 bits" if kind is int else "a boolean" if kind is bool
                   else f"{v!r:.20}" if kind is float else kind.__name__)
            return f"{key}: expected a finite number of microseconds, got {got}"
    return "dur: expected >= 0" if dur < 0 else None


def load_trace(path: str | Path, label: str | None = None, step_at: str | None = None) -> RankTrace:
    """Parse one rank's Kineto trace (``.json`` or ``.json.gz``), streaming.

    Args:
        path: Trace file.
        label: Name used in messages (defaults to the path; archives pass ``archive!member``).
        step_at: Cut steps at this op instead of ``ProfilerStep#`` markers: an op name (each occurrence starts a
            step) or ``optimizer`` (each optimizer step ends one); see :mod:`profiler.steps`.

    Returns:
        The :class:`RankTrace`, events sorted by start time and assigned to steps.

    Raises:
        MeshplanError: Truncated gzip, malformed JSON, a timed event's or a header's field of the wrong type (the
            file, the event and the field named), or a JSON that is not a
            Kineto trace.
    """
    label = label or str(path)
    norm = Normaliser(sys.intern)
    steps: dict[int, tuple[float, float]] = {}
    step_lanes: list[str] = []
    seen: dict[Any, int] = {}
    used: dict[Any, int] = {}
    n_seen = [0]  # events
    header = stream_trace(path, _event_sink(norm, steps, step_lanes, seen, used, n_seen, label))
    if not n_seen[0]:
        raise MeshplanError(f"{label}: not a Kineto trace: traceEvents is empty")
    if not norm.events and not steps:
        cats = ", ".join(f"{c} {n}" for c, n in sorted(seen.items(), key=lambda kv: -kv[1])[:5] if c)
        raise MeshplanError(f"{label}: not a Kineto trace: {n_seen[0]} events but no host op, device op or runtime "
                            f"event (categories: {cats or 'none'})")
    head = validate_header(header, label)
    dist = head.distributedInfo
    warnings: list[str] = []
    rank = _rank_of(dist.rank if dist else None, label, warnings)
    world = dist.world_size if dist else None
    if world is not None and rank >= world:
        raise MeshplanError(f"{label}: distributedInfo.rank {rank} is not below world_size {world}")
    pg_config = (dist.pg_config if dist else None) or []
    base = head.baseTimeNanoseconds or 0
    backend = dist.backend if dist else None
    warnings += _dropped_event_warnings(header, label)
    events = norm.finish(rank)
    props = head.deviceProperties
    rt = RankTrace(
        path=label, rank=rank, world_size=world, backend=backend,
        base_ns=int(base), events=events, steps=steps, main_lane=step_lanes[0] if step_lanes else None,
        pg_config=[pg for pg in pg_config if isinstance(pg, dict)],
        devices=[str(d.get("name")) for d in props or [] if isinstance(d, dict)],
        hostname=head.host_name,
        warnings=warnings, stream_waits=norm.stream_waits,
        categories=_category_counts(seen, used),
        step_source="ProfilerStep markers" if steps else None)
    apply_step_cut(rt, step_at)
    return rt


def _event_sink(norm: Normaliser, steps: dict[int, tuple[float, float]], step_lanes: list[str],
                seen: dict[Any, int], used: dict[Any, int], n_seen: list[int],
                label: str) -> Callable[[dict], None]:
    """The callback :func:`profiler.jsonstream.stream_trace` hands each raw event to (the hot path of ingestion):
    ``ProfilerStep#N`` markers go to ``steps`` (their threads to ``step_lanes``), every other event of a used
    category to ``norm``; ``seen``/``used`` count events per raw category, ``n_seen`` [events]. A timed event with
    a field of the wrong type refuses the file (``label``), naming the event and the field."""
    roles, _isfinite, arg_types = ROLES, math.isfinite, ARG_TYPES

    def on_event(ev: dict) -> None:
        n_seen[0] += 1
        cat = ev.get("cat")
        key = cat if isinstance(cat, str) else None
        seen[key] = seen.get(key, 0) + 1
        if ev.get("ph") != "X":
            return
        role = roles.get(cat) if key is not None else None
        if role is None:
            role = role_of(cat)
            if role is None:
                return
        ts = ev.get("ts")
        dur = ev.get("dur", 0.0)
        if type(ts) is not float or type(dur) is not float or not (_isfinite(ts) and _isfinite(dur)) or dur < 0:
            why = _time_problem(ts, dur)  # ints (read as floats), or a malformed field
            if why:
                raise _bad_event(label, n_seen[0] - 1, ev, why)
            ts, dur = float(ts), float(dur)
        name = ev.get("name", "")
        if type(name) is not str:
            raise _bad_event(label, n_seen[0] - 1, ev, f"name: expected a string, got {type(name).__name__}")
        args = ev.get("args")
        if type(args) is not dict:
            if args is not None:
                raise _bad_event(label, n_seen[0] - 1, ev, f"args: expected an object, got {type(args).__name__}")
            args = {}
        for arg, value in args.items():
            if arg in arg_types:
                why = arg_problem(arg, value)
                if why:
                    raise _bad_event(label, n_seen[0] - 1, ev, why)
        if role in ("host", "annotation"):
            m = _STEP.match(name)
            if m:
                steps[int(m.group(1))] = (ts, dur)
                step_lanes.append(f"thread:{ev.get('tid')}")
                used[key] = used.get(key, 0) + 1
                return
        norm.add(role, cat, sys.intern(name), ts, dur, ev.get("pid"), ev.get("tid"), args)
        used[key] = used.get(key, 0) + 1

    return on_event


def _rank_of(rank: int | None, label: str, warnings: list[str]) -> int:
    """``distributedInfo.rank``, else the rank in the file name, else 0 (with a warning)."""
    if rank is None:
        rank = rank_from_name(label)
        if rank is None:
            rank = 0
            warnings.append(f"{label}: no distributedInfo.rank and no rank in the file name; assuming rank 0")
    return rank


def _dropped_event_warnings(header: dict, label: str) -> list[str]:
    """One warning per ``Out-of-range = N`` (N > 0) line of the profiler's own log in the trace header."""
    out = []
    for key in ("INFO", "ERROR", "WARNING"):
        lines = header.get(key) or []
        for line in lines if isinstance(lines, list) else [lines]:
            m = _OUT_OF_RANGE.search(line) if isinstance(line, str) else None
            if m and int(m.group(1)) > 0:
                out.append(f"{label}: the profiler dropped {m.group(1)} out-of-range events (its log says so); "
                           f"ops may be missing")
    return out


def _category_counts(seen: dict, used: dict) -> dict[str, dict]:
    """``RankTrace.categories``: per raw category, events seen and kept, its role, and why it was not used."""
    return {("(none)" if c is None else c): {"events": n, "used": used.get(c, 0), "role": role_of(c),
                                             **({} if used.get(c) else {"why": why_not_used(c)})}
            for c, n in sorted(seen.items(), key=lambda kv: -kv[1])}

