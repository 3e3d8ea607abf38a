"""The replay report (``meshplan replay --report FILE.html``): where each rank's step went, measured against
replayed step times, and the critical path, beside the Perfetto timeline ``--timeline`` writes.

``replay_values`` reads them off a replayed run (``profiler.report.Analysis`` and its ``replay_report``
document); ``replay_page`` draws them (values in, HTML out, ``core.htmlpage``). Units: seconds.

A rank's step splits into compute (its compute and copy ops, as the union of their intervals: streams overlap),
exposed communication (communication not under compute), host (host-side ops under neither) and idle (the rest of
the replayed step).
"""
from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go

from meshplan.core.htmlpage import PALETTE, Section, page, styled
from meshplan.profiler.critical_path import critical_path
from meshplan.profiler.dataflow_graph import KIND_NAMES
from meshplan.profiler.replay import Timeline, replay
from meshplan.profiler.whatif import apply_whatif, parse_knobs

PARTS = ("compute", "exposed comm", "host", "idle")
PART_COLOURS = {"compute": "#4C72B0", "exposed comm": "#DD8452", "host": "#8172B3", "idle": "#DDDDDD"}
KIND_COLOURS = {"compute": "#4C72B0", "comm": "#DD8452", "host": "#8172B3", "memcpy": "#55A868", "idle": "#BBBBBB"}


@dataclass(frozen=True)
class ReplayValues:
    """What the replay page draws.

    ``rank_parts``: step -> rank -> {part: seconds} (``PARTS``); ``steps``: the report's per-step rows;
    ``path``: the critical path of ``path_step`` as (rank, lane, kind, name, start_s, end_s, exposed_s);
    ``dominant``: the report's ``critical_path`` rows.
    """

    source: str
    rank_parts: dict
    steps: tuple[dict, ...]
    path_step: int
    path: tuple[tuple, ...]
    dominant: tuple[dict, ...]
    timeline: str | None
    what_if: tuple[str, ...]


def replay_values(a, report: dict) -> ReplayValues:
    """The page's values for ``a`` (an ``Analysis``) and its ``replay_report`` document ``report`` (the what-if's
    replay when the report has one, as its critical path is)."""
    knobs = parse_knobs(report["what_if"]) if report["what_if"] else []
    tl = replay(apply_whatif(a.graph, knobs)) if knobs else a.timeline
    step = report["critical_path_step"]
    path = tuple((p.rank, p.lane, p.kind, p.name, p.start_s, p.end_s, p.exposed_s) for p in critical_path(tl, step))
    return ReplayValues(source=str(report["source"]), rank_parts=rank_step_parts(tl), steps=tuple(report["steps"]),
                        path_step=step, path=path, dominant=tuple(report["critical_path"]),
                        timeline=report.get("timeline"), what_if=tuple(report["what_if"]))


def rank_step_parts(tl: Timeline) -> dict[int, dict[int, dict[str, float]]]:
    """step -> rank -> {part: seconds}, the parts of ``PARTS`` summing to the replayed step time."""
    g = tl.graph
    spans: dict[tuple[int, int], dict[str, list]] = {}
    for i, s in enumerate(g.step):
        kind = KIND_NAMES[g.kind[i]]
        cls = "compute" if kind in ("compute", "memcpy") else kind
        spans.setdefault((s, g.rank[i]), {"compute": [], "comm": [], "host": []})[cls].append(
            (tl.start_s[i], tl.end_s[i]))
    out: dict[int, dict[int, dict[str, float]]] = {}
    for (s, r), iv in sorted(spans.items()):
        compute = _covered(iv["compute"])
        with_comm = _covered(iv["compute"] + iv["comm"])
        busy = _covered(iv["compute"] + iv["comm"] + iv["host"])
        total = max(tl.steps.get(s, 0.0), busy)
        out.setdefault(s, {})[r] = {"compute": compute, "exposed comm": with_comm - compute,
                                    "host": busy - with_comm, "idle": total - busy}
    return out


def _covered(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of ``intervals``."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def replay_page(v: ReplayValues) -> str:
    """The report page of ``v``."""
    facts = [("run", v.source), ("steps", ", ".join(str(s["step"]) for s in v.steps) or "none")]
    if v.what_if:
        facts.append(("what-if", "; ".join(v.what_if) + " (bars and path are the what-if's replay)"))
    if v.timeline:
        facts.append(("timeline", f"{v.timeline} (open it in https://ui.perfetto.dev)"))
    sections = [Section("The run", facts=tuple(facts))]
    if v.rank_parts:
        sections.append(Section("Each rank's step", note="Replayed seconds per rank: compute, communication not "
                                                         "hidden under compute, host-only work and idle. Pick the "
                                                         "step in the menu.", figure=rank_bars_figure(v)))
    sections.append(Section("Measured against replayed step time", figure=steps_figure(v)))
    if v.path:
        total = sum(p[6] for p in v.path)
        sections.append(Section(f"Critical path of step {v.path_step}",
                                note=f"{len(v.path):,} ops whose ends fixed the step's end ({total * 1e3:.2f} ms "
                                     "charged along it); each row is a rank's lane, each bar an op on the path.",
                                figure=path_figure(v)))
        sections.append(Section("Ops that dominate the critical path", note="Exposed time on the path, summed by "
                                                                            "op name.", figure=dominant_figure(v)))
    return page(f"meshplan replay: {v.source}", f"{len(v.steps)} step(s) replayed", sections,
                footer="meshplan replay --report; figures drawn with Plotly")


def rank_bars_figure(v: ReplayValues) -> go.Figure:
    steps = sorted(v.rank_parts)
    shown = v.path_step if v.path_step in v.rank_parts else steps[-1]
    fig = go.Figure()
    for s in steps:
        ranks = sorted(v.rank_parts[s])
        for part in PARTS:
            fig.add_trace(go.Bar(x=[f"rank {r}" for r in ranks], y=[v.rank_parts[s][r][part] * 1e3 for r in ranks],
                                 name=part, marker_color=PART_COLOURS[part], visible=s == shown,
                                 legendgroup=part, hovertemplate=f"{part}: %{{y:.3f}} ms<extra>step {s}</extra>"))
    buttons = [dict(label=f"step {s}", method="update",
                    args=[{"visible": [t == s for t in steps for _ in PARTS]}]) for s in steps]
    return styled(fig, 380, barmode="stack", yaxis_title="ms", margin=dict(l=70, r=30, t=70, b=55),
                  legend=dict(orientation="h", yanchor="bottom", y=1.02, x=1.0, xanchor="right"),
                  updatemenus=[dict(buttons=buttons, direction="down", x=0.0, xanchor="left", y=1.02,
                                    yanchor="bottom", active=steps.index(shown), bgcolor="#f6f8fa")])


def steps_figure(v: ReplayValues) -> go.Figure:
    xs = [str(s["step"]) for s in v.steps]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=xs, y=[(s["measured_s"] or 0.0) * 1e3 for s in v.steps], name="measured",
                         marker_color=PALETTE[0], hovertemplate="step %{x}: %{y:.3f} ms measured<extra></extra>"))
    fig.add_trace(go.Bar(x=xs, y=[s["replayed_s"] * 1e3 for s in v.steps], name="replayed",
                         marker_color=PALETTE[4], hovertemplate="step %{x}: %{y:.3f} ms replayed<extra></extra>"))
    if any(s.get("whatif_s") is not None for s in v.steps):
        fig.add_trace(go.Bar(x=xs, y=[(s.get("whatif_s") or 0.0) * 1e3 for s in v.steps], name="what-if",
                             marker_color=PALETTE[2]))
    return styled(fig, 320, barmode="group", xaxis_title="step", yaxis_title="ms", xaxis_type="category")


def path_figure(v: ReplayValues) -> go.Figure:
    rows = sorted({(p[0], p[1]) for p in v.path})
    label = {row: f"rank {row[0]} · {row[1]}" for row in rows}
    fig = go.Figure()
    for kind in sorted({p[2] for p in v.path}):
        ps = [p for p in v.path if p[2] == kind]
        fig.add_trace(go.Bar(y=[label[(p[0], p[1])] for p in ps], x=[(p[5] - p[4]) * 1e3 for p in ps],
                             base=[p[4] * 1e3 for p in ps], orientation="h", name=kind,
                             marker=dict(color=KIND_COLOURS.get(kind, "#999"), line=dict(color="white", width=0.3)),
                             customdata=[[p[3][:90], p[6] * 1e3] for p in ps],
                             hovertemplate="%{customdata[0]}<br>%{base:.3f} to %{x:.3f} ms, exposed "
                                           "%{customdata[1]:.3f} ms<extra></extra>"))
    styled(fig, 160 + 30 * len(rows), barmode="overlay", xaxis_title="ms from the step's start",
           margin=dict(l=170, r=30, t=40, b=55))
    fig.update_yaxes(autorange="reversed", categoryorder="array", categoryarray=[label[r] for r in rows])
    return fig


def dominant_figure(v: ReplayValues) -> go.Figure:
    rows = list(v.dominant)[::-1]
    fig = go.Figure(go.Bar(
        y=[r["name"][:55] for r in rows], x=[r["exposed_s"] * 1e3 for r in rows], orientation="h",
        marker_color=[KIND_COLOURS.get(r["kind"], "#999") for r in rows],
        text=[f"{100 * r['share']:.0f}%" for r in rows], textposition="outside",
        customdata=[[r["kind"], r["count"]] for r in rows],
        hovertemplate="%{y} (%{customdata[0]}, %{customdata[1]} ops): %{x:.3f} ms<extra></extra>"))
    return styled(fig, 140 + 28 * len(rows), xaxis_title="exposed ms on the path", showlegend=False,
                  margin=dict(l=400, r=50, t=20, b=55))
