"""Held-out-steps check: how well the replay *predicts* steps it has not seen, from one run.

Replaying a step with its own measured segments reproduces it almost exactly: that is a consistency check of
the graph, not a prediction. A single run still allows an honest prediction: fit the replay's per-op values on
the first ``k`` steps and replay the steps after them with the fitted values only.

Fit: every op of a held-out step gets, for its duration, release time and launch gap, the median over the fit
steps of the same op — the same rank, lane, name and occurrence of that name on the lane within the step (the
n-th ``aten::mm`` of thread 7). An op with no such twin in the fit steps takes the median of its (rank, lane,
name) over all occurrences, then of its (kind, name) over all ranks; an op with none of these keeps its measured
value and is counted as *unfitted* (its share of the held-out op time is reported, so a prediction that leans
on measured values says so).
"""
from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from dataclasses import dataclass

import networkx as nx

from meshplan.profiler.dataflow_graph import compile_graph
from meshplan.profiler.replay import replay

_FIELDS = ("duration_s", "release_s", "gap_s")


@dataclass
class HeldOutCheck:
    """Result of the held-out check.

    Attributes:
        fit_steps, held_out: Step numbers used to fit and to predict.
        rows: per held-out step ``{"step", "measured_s", "predicted_s", "error"}``.
        median_abs_error: median |error| over the held-out steps.
        unfitted_share: share of the held-out steps' op time that kept measured values (no twin in the fit).
    """

    fit_steps: list[int]
    held_out: list[int]
    rows: list[dict]
    median_abs_error: float | None
    unfitted_share: float


def _keys(G: nx.DiGraph) -> dict:
    """node -> (rank, lane, name, k) with k the occurrence of that name on the lane within its step."""
    seen: dict[tuple, int] = defaultdict(int)
    out = {}
    for n in sorted(G.nodes, key=lambda n: (G.nodes[n].get("step", 0), G.nodes[n]["rank"], G.nodes[n]["lane"],
                                          G.nodes[n].get("seq", 0))):
        a = G.nodes[n]
        base = (a.get("step", 0), a["rank"], a["lane"], a.get("name", ""))
        out[n] = (a["rank"], a["lane"], a.get("name", ""), seen[base])
        seen[base] += 1
    return out


def held_out_check(G: nx.DiGraph, fit_steps: int | None = None) -> HeldOutCheck | None:
    """Fit per-op values on the first ``fit_steps`` steps (default: half, at least 1) and predict the rest.

    Returns:
        The :class:`HeldOutCheck`, or None when the run has fewer than two steps with a measured time.
    """
    meas = {s: v.get("measured_s") for s, v in G.graph.get("steps", {}).items() if v.get("measured_s")}
    steps = sorted(meas)
    if len(steps) < 2:
        return None
    k = fit_steps if fit_steps is not None else max(1, len(steps) // 2)
    k = min(max(1, k), len(steps) - 1)
    fit, held = steps[:k], steps[k:]
    fit_set = set(fit)
    keys = _keys(G)
    exact: dict[tuple, list[dict]] = defaultdict(list)
    by_name: dict[tuple, list[dict]] = defaultdict(list)
    by_kind: dict[tuple, list[dict]] = defaultdict(list)
    for n, a in G.nodes(data=True):
        if a.get("step", 0) in fit_set:
            exact[keys[n]].append(a)
            by_name[keys[n][:3]].append(a)
            by_kind[(a["kind"], a.get("name", ""))].append(a)
    # Replay the compiled graph with the fitted values in copies of its value arrays (no copy of the graph).
    cg = compile_graph(G)
    cols = {"duration_s": cg.dur_s[:], "release_s": cg.release_s[:], "gap_s": cg.gap_s[:]}
    held_set = set(held)
    total = unfitted = 0.0
    for i, n in enumerate(cg.node_ids):
        a = G.nodes[n]
        if a.get("step", 0) not in held_set:
            continue
        src = exact.get(keys[n]) or by_name.get(keys[n][:3]) or by_kind.get((a["kind"], a.get("name", "")))
        total += a["duration_s"]
        if not src:
            unfitted += a["duration_s"]
            continue
        for f in _FIELDS:
            cols[f][i] = max(0.0, statistics.median([x.get(f) or 0.0 for x in src]))
    tl = replay(dataclasses.replace(cg, dur_s=cols["duration_s"], release_s=cols["release_s"], gap_s=cols["gap_s"]))
    rows = []
    for s in held:
        p = tl.steps.get(s)
        m = meas[s]
        rows.append({"step": s, "measured_s": m, "predicted_s": p, "error": (p - m) / m if p is not None else None})
    errs = [abs(r["error"]) for r in rows if r["error"] is not None]
    return HeldOutCheck(fit, held, rows, statistics.median(errs) if errs else None,
                      unfitted / total if total else 0.0)
