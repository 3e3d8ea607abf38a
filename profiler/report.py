"""End to end: run -> aligned graph -> replay (and what-if) -> per-step measured vs replayed, critical path.

This is the library behind ``meshplan replay``; other tools (``meshplan check``, the capture helper's real-run
checks) call :func:`analyze_run` / :func:`replay_report` directly.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import networkx as nx

from meshplan.core.errors import MeshplanError
from meshplan.profiler.align import Alignment, apply_alignment, estimate_offsets
from meshplan.profiler.critical_path import critical_path, dominant_ops
from meshplan.profiler.match import match_collectives
from meshplan.profiler.replay import Timeline, replay
from meshplan.profiler.runs import Run, load_run
from meshplan.profiler.timeline import write_timeline
from meshplan.profiler.tracegraph import build_graph
from meshplan.profiler.whatif import apply_whatif, parse_knob


@dataclass
class Analysis:
    """A run turned into a graph, replayed.

    Attributes:
        run: The loaded (and aligned) run.
        alignment: Clock offsets applied.
        graph: Global dataflow graph.
        timeline: Baseline replay.
        warnings: Everything worth telling the user (partial collectives, skipped files, mismatches ...).
    """

    run: Run
    alignment: Alignment
    graph: nx.DiGraph
    timeline: Timeline
    warnings: list[str] = field(default_factory=list)


def analyze_run(run: Run | str | Path, progress: Callable[[str], None] | None = None) -> Analysis:
    """Load (if a path), match collectives, align clocks, build the graph and replay it."""
    say = progress or (lambda _msg: None)
    if not isinstance(run, Run):
        say("loading traces")
        run = load_run(run)
    say("matching collectives")
    groups, match_warn = match_collectives(run)
    say("aligning clocks")
    alignment = estimate_offsets(run, groups)
    apply_alignment(run, alignment)
    say("building graph")
    G = build_graph(run, groups)
    say("replaying")
    extra: list[str] = []
    try:
        tl = replay(G)
    except MeshplanError as exc:
        # Inferred edges are heuristics; if they close a cycle with the trace's real dependencies, drop them.
        inferred = [(u, v) for u, v, t in G.edges(data="type") if t == "inferred"]
        if not str(exc).startswith("replay deadlock") or not inferred:
            raise
        G.remove_edges_from(inferred)
        tl = replay(G)
        extra.append(f"dropped {len(inferred)} inferred dependencies that formed a cycle ({exc})")
    warnings = list(run.warnings) + match_warn + list(G.graph.get("warnings", [])) + extra
    if alignment.unaligned and len(run.ranks) > 1:
        warnings.append(f"clocks of rank(s) {alignment.unaligned} not aligned (no complete collective shared with "
                        f"other ranks); trace timestamps used as they are")
    return Analysis(run, alignment, G, tl, warnings)


def replay_report(a: Analysis, what_if: list[str] | None = None, cp_step: int | None = None,
                  timeline: str | Path | None = None) -> dict[str, Any]:
    """The ``meshplan replay --json`` document.

    Args:
        a: From :func:`analyze_run`.
        what_if: Knob strings (see :mod:`profiler.whatif`); adds ``whatif_s`` per step, and the critical path
            and timeline are those of the what-if replay.
        cp_step: Step whose critical path is reported (default: the last step).
        timeline: Write a Perfetto/Chrome JSON of the replay beside the measured trace here (atomically).

    Returns:
        ``{"source", "ranks", "steps": [{"step", "measured_s", "replayed_s", "error"[, "whatif_s"]}],
        "median_error", "critical_path": [{"kind", "name", "exposed_s", "share", "count", "ranks"}],
        "critical_path_step", "alignment": {...}, "what_if": [...], "warnings": [...]}``;
        ``error`` = (replayed - measured) / measured.
    """
    knobs = [parse_knob(k) for k in (what_if or [])]
    wtl = replay(apply_whatif(a.graph, knobs)) if knobs else None
    steps = []
    meas = a.graph.graph.get("steps", {})
    for s, rep in a.timeline.steps.items():
        m = meas.get(s, {}).get("measured_s")
        row: dict[str, Any] = {"step": s, "measured_s": m, "replayed_s": rep,
                               "error": (rep - m) / m if m else None}
        if wtl is not None:
            row["whatif_s"] = wtl.steps.get(s)
        steps.append(row)
    errs = [abs(r["error"]) for r in steps if r["error"] is not None]
    s_cp = cp_step if cp_step is not None else (steps[-1]["step"] if steps else 0)
    path = critical_path(wtl or a.timeline, s_cp)
    out: dict[str, Any] = {
        "source": a.run.source,
        "ranks": sorted(a.run.ranks),
        "world_size": a.run.world_size,
        "steps": steps,
        "median_error": statistics.median(errs) if errs else None,
        "critical_path_step": s_cp,
        "critical_path": dominant_ops(path),
        "critical_path_ops": len(path),
        "alignment": {"offsets_us": {str(r): round(v, 3) for r, v in a.alignment.offsets_us.items()},
                      "residual_us": round(a.alignment.residual_us, 3),
                      "collectives_used": a.alignment.n_collectives},
        "what_if": [k.text for k in knobs],
        "warnings": a.warnings,
    }
    if timeline is not None:
        write_timeline(timeline, a.graph, wtl or a.timeline)
        out["timeline"] = str(timeline)
    return out
