"""End to end: run -> aligned graph -> replay (and what-if) -> per-step measured vs replayed, critical path.

This is the library behind ``meshplan replay``; other tools (``meshplan check``, the capture helper's real-run
checks) call :func:`analyze_run` / :func:`replay_report` directly.
"""
from __future__ import annotations

import gc
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import networkx as nx

from meshplan.core.atomic import same_file
from meshplan.core.errors import MeshplanError
from meshplan.profiler.align import Alignment, apply_alignment, estimate_offsets
from meshplan.profiler.critical_path import critical_path, dominant_ops
from meshplan.profiler.match import match_collectives
from meshplan.profiler.predict import HeldOutCheck, held_out_check
from meshplan.profiler.replay import Timeline, replay
from meshplan.profiler.runs import Run, _ranges, load_run
from meshplan.profiler.summary import inputs_report
from meshplan.profiler.timeline import write_timeline
from meshplan.profiler.trace_to_graph import build_graph
from meshplan.profiler.whatif import apply_whatif, check_knobs, parse_knobs


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


def analyze_run(run: Run | str | Path, progress: Callable[[str], None] | None = None, *,
                step_at: str | None = None, ranks: list[int] | None = None, workers: int | None = None,
                ray: str | None = None, cache_dir: str | Path | None = None, keep_events: bool = True) -> Analysis:
    """Load (if a path), match collectives, align clocks, build the graph and replay it.

    ``step_at``, ``ranks``, ``workers``, ``ray``, ``cache_dir``: see :func:`profiler.runs.load_run`.
    ``keep_events=False`` drops the parsed events once the graph holds what the replay needs (the CLI does: a
    500 MB trace's events are ~0.5 GB that nothing reads afterwards).
    """
    say = progress or (lambda _msg: None)
    if not isinstance(run, Run):
        say("loading traces")
        run = load_run(run, step_at=step_at, ranks=ranks, workers=workers, ray=ray, cache_dir=cache_dir)
    say("matching collectives")
    groups, match_warn = match_collectives(run)
    say("aligning clocks")
    alignment = estimate_offsets(run, groups)
    apply_alignment(run, alignment)
    say("building graph")
    G = build_graph(run, groups)
    if not keep_events:
        del groups
        for t in run.ranks.values():
            t.events = []
        gc.collect()
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


def check_output_path(out: str | Path, inputs: list[str | Path], what: str) -> None:
    """Refuse an output that would overwrite an input of the same command, or that is a folder."""
    p = Path(out)
    if p.is_dir():
        raise MeshplanError(f"{what} {p}: is a folder; give a file name")
    for i in inputs:
        ip = Path(i)
        if same_file(p, ip) or (ip.is_dir() and ip.resolve() in p.resolve().parents
                                 and p.name.endswith((".json", ".json.gz"))):
            raise MeshplanError(f"{what} {p}: would overwrite (or add a trace to) the input {ip}; choose another path")


def replay_report(a: Analysis, what_if: list[str] | None = None, cp_step: int | None = None,
                  timeline: str | Path | None = None, fit_steps: int | None = None,
                  timeline_format: str = "perfetto") -> dict[str, Any]:
    """The ``meshplan replay --json`` document.

    Args:
        a: From :func:`analyze_run`.
        what_if: Knob strings (see :mod:`profiler.whatif`; comma-separated knobs allowed). Each must change at
            least one op. Adds ``whatif_s`` per step; the critical path and timeline are those of the what-if.
        cp_step: Step whose critical path is reported (default: the last step); must be a step of the run.
        timeline: Write a timeline of the replay beside the measured trace here (atomically); refused when it
            is an input of the run.
        fit_steps: Steps the held-out check fits on (default: half of them).
        timeline_format: ``perfetto`` (Perfetto's protobuf trace) or ``chrome`` (Chrome trace JSON).

    Returns:
        ``{"source", "ranks", "world_size", "steps": [{"step", "measured_s", "replayed_s", "error", "idle"
        [, "whatif_s"]}], "consistency": {"median_abs_error", "what"}, "prediction": {"fit_steps",
        "held_out_steps", "steps": [...], "median_abs_error", "unfitted_share", "what"} | {"available": false,
        "why"}, "median_error" (= consistency), "critical_path", "critical_path_step", "alignment", "what_if",
        "what_if_ops", "whatif_median_s", "inputs", "sampled_ranks", "warnings"}``. ``error`` = (replayed -
        measured) / measured. **The what-if step time is ``steps[i].whatif_s``** (seconds, per step);
        ``whatif_median_s`` is its median over steps.
    """
    knobs = parse_knobs(what_if or [])
    matched = check_knobs(a.graph, knobs) if knobs else {}
    steps_avail = sorted(a.timeline.steps)
    if cp_step is not None and cp_step not in a.timeline.steps:
        raise MeshplanError(f"--step {cp_step}: not a step of {a.run.source} (steps: "
                            f"{_ranges(steps_avail) if steps_avail else 'none'})")
    if timeline is not None:
        check_output_path(timeline, [a.run.source] + [t.path.split("!")[0] for t in a.run.ranks.values()],
                          "--timeline")
    wtl = replay(apply_whatif(a.graph, knobs)) if knobs else None
    steps = []
    meas = a.graph.graph.get("steps", {})
    idle = {s for t in a.run.ranks.values() for s in t.empty_steps}
    for s, rep in a.timeline.steps.items():
        m = meas.get(s, {}).get("measured_s")
        row: dict[str, Any] = {"step": s, "measured_s": m, "replayed_s": rep,
                               "error": (rep - m) / m if m else None, "idle": s in idle}
        if wtl is not None:
            row["whatif_s"] = wtl.steps.get(s)
        steps.append(row)
    errs = [abs(r["error"]) for r in steps if r["error"] is not None]
    consistency = statistics.median(errs) if errs else None
    pred = held_out_check(a.graph, fit_steps)
    s_cp = cp_step if cp_step is not None else (steps[-1]["step"] if steps else 0)
    path = critical_path(wtl or a.timeline, s_cp)
    out: dict[str, Any] = {
        "source": a.run.source,
        "ranks": sorted(a.run.ranks),
        "world_size": a.run.world_size,
        "sampled_ranks": a.run.sampled,
        "steps": steps,
        "consistency": {"median_abs_error": consistency,
                        "what": "replay of each step with its own measured op durations (checks the graph; "
                                "not a prediction)"},
        "prediction": _prediction_doc(pred, len(steps)),
        "median_error": consistency,
        "critical_path_step": s_cp,
        "critical_path": dominant_ops(path),
        "critical_path_ops": len(path),
        "alignment": {"offsets_us": {str(r): round(v, 3) for r, v in a.alignment.offsets_us.items()},
                      "residual_us": round(a.alignment.residual_us, 3),
                      "collectives_used": a.alignment.n_collectives},
        "what_if": [k.text for k in knobs],
        "what_if_ops": matched,
        "whatif_median_s": (statistics.median(r["whatif_s"] for r in steps if r.get("whatif_s") is not None)
                            if wtl is not None and steps else None),
        "partial_collectives": sum(1 for _, x in a.graph.nodes(data="partial") if x),
        "inputs": inputs_report([t.categories for t in a.run.ranks.values()]),
        "warnings": a.warnings,
    }
    if timeline is not None:
        write_timeline(timeline, a.graph, wtl or a.timeline, fmt=timeline_format)
        out["timeline"] = str(timeline)
    return out


def _prediction_doc(pred: HeldOutCheck | None, n_steps: int) -> dict[str, Any]:
    if pred is None:
        return {"available": False, "why": f"the run has {n_steps} step(s) with a measured time; the held-out "
                                           f"check needs at least 2 (cut steps with --steps-at if the trace has "
                                           f"no markers)"}
    return {"available": True, "fit_steps": pred.fit_steps, "held_out_steps": pred.held_out, "steps": pred.rows,
            "median_abs_error": pred.median_abs_error, "unfitted_share": pred.unfitted_share,
            "what": "each held-out step replayed with per-op medians fitted on the fit steps only"}
