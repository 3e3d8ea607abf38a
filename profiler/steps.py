"""Steps of a trace: ``ProfilerStep#N`` markers, or steps cut at a named op / the optimizer step when a trace has none.

Many real traces carry no ``ProfilerStep#`` (PARAM benchmarks, scripts that call ``profiler.start()/stop()``
themselves): their iterations show only as ``Optimizer.step#SGD.step`` or a user annotation. Without markers the
whole trace is one step 0 (and the run says so, once). ``--steps-at`` cuts steps instead:

* ``optimizer``: a step ends where an optimizer step ends (``Optimizer.step*`` ops); the first step starts at the
  end of the first optimizer step, so n optimizer steps give n - 1 whole steps (the part before the first one is
  warm-up or data loading that belongs to no whole step);
* any other text: a step starts where an op of that name starts (exact name, else the ops whose name contains
  it, case-insensitive); n occurrences give n - 1 steps, each from one occurrence to the next.

Steps are numbered 0, 1, ... on every rank, so the k-th step of each rank is the same training step.
"""
from __future__ import annotations

import bisect
import difflib

from meshplan.core.errors import MeshplanError
from meshplan.profiler.events import RankTrace

OPTIMIZER = "optimizer"
_MAX_STEPS = 1_000_000


def apply_step_cut(t: RankTrace, step_at: str | None) -> None:
    """Replace the trace's steps by steps cut at ``step_at`` (None: keep markers), then assign events to steps."""
    if step_at is not None:
        text = step_at.strip()
        if not text:
            raise MeshplanError("--steps-at: empty op name (give an op name, or 'optimizer')")
        host = [e for e in t.events if not e.lane.startswith("stream:") and e.kind != "comm"]
        if text.lower() == OPTIMIZER:
            marks = [e for e in host if e.name.startswith("Optimizer.step")]
            what = "the end of each optimizer step (Optimizer.step*)"
            times = _dedupe(marks, at_end=True)
        else:
            marks = [e for e in host if e.name == text]
            if not marks:
                low = text.lower()
                marks = [e for e in host if low in e.name.lower()]
            what = f"the start of each {text!r} op"
            times = _dedupe(marks, at_end=False)
        if len(times) < 2:
            names = sorted({e.name for e in host})
            close = difflib.get_close_matches(text, names, n=4, cutoff=0.5) if text.lower() != OPTIMIZER else []
            hint = f"; closest op names: {', '.join(repr(c) for c in close)}" if close else ""
            raise MeshplanError(f"{t.path}: --steps-at {text}: {len(times)} occurrence(s) found, at least 2 are "
                                f"needed to cut a step{hint}")
        times = times[:_MAX_STEPS + 1]
        t.steps = {k: (times[k][0], times[k + 1][0] - times[k][0]) for k in range(len(times) - 1)}
        t.main_lane = times[0][1]
        t.step_source = f"cut at {what}: {len(times)} occurrences, {len(times) - 1} steps"
    else:
        check_marker_order(t)
    assign_steps(t)


def _dedupe(marks: list, at_end: bool) -> list[tuple[float, str]]:
    """Boundary (time, lane) per occurrence; an op nested in another occurrence (cpu_op inside its annotation of
    the same name) is the same occurrence."""
    out: list[tuple[float, str]] = []
    last_end = float("-inf")
    for e in sorted(marks, key=lambda e: (e.ts_us, -e.dur_us)):
        if e.ts_us < last_end:
            continue
        last_end = e.end_us
        out.append((e.end_us if at_end else e.ts_us, e.lane))
    out.sort()
    return out


def check_marker_order(t: RankTrace) -> None:
    """``ProfilerStep#N`` markers must follow one another: a step that starts before the previous one ends
    (swapped or overlapping timestamps) cannot be replayed as steps. Raises MeshplanError naming both."""
    order = sorted(t.steps.items())
    for (n0, (s0, d0)), (n1, (s1, _)) in zip(order, order[1:]):
        if s1 < s0 + d0 - 1.0:  # 1 µs: integer-µs traces round both ends
            raise MeshplanError(f"{t.path}: ProfilerStep#{n1} starts at {s1:.0f} µs, before ProfilerStep#{n0} ends "
                                f"({s0 + d0:.0f} µs): step markers overlap or are out of order")


def assign_steps(t: RankTrace) -> None:
    """Give every event the step it belongs to; fill ``empty_steps``.

    Host events: the step whose window [start, next step's start) holds their start. Device events: the step of
    the runtime call that launched them (joined on ``correlation``), else their start time. No steps in the
    trace: everything is step 0.
    """
    if not t.steps:
        for e in t.events:
            e.step = 0
        t.empty_steps = []
        return
    order = sorted(t.steps.items(), key=lambda kv: kv[1][0])
    starts = [s for _, (s, _) in order]
    last_end = order[-1][1][0] + order[-1][1][1]

    def step_at(x: float) -> int | None:
        i = bisect.bisect_right(starts, x) - 1
        if i < 0:
            return None
        if i == len(order) - 1 and x > last_end:
            return None
        return order[i][0]

    launch_step: dict[int, int | None] = {}
    for e in t.events:
        if not e.lane.startswith("stream:"):
            e.step = step_at(e.ts_us)
            if e.corr is not None and e.cat in ("cuda_runtime", "cuda_driver"):
                launch_step[e.corr] = e.step
    for e in t.events:
        if e.lane.startswith("stream:"):
            e.step = launch_step[e.corr] if e.corr in launch_step else step_at(e.ts_us)
    held = {e.step for e in t.events}
    t.empty_steps = sorted(s for s in t.steps if s not in held)
