"""The plan report (``meshplan plan --report FILE.html``): every priced layout as step time against peak memory
with the frontier marked, the best plan's per-stage breakdown, its pipeline schedule and its memory split.

``plan_report`` gathers the values from a ``planner.search.job.PlanOutcome``; ``plan_page`` draws them (values in,
HTML out, ``core.htmlpage``). Units: seconds and bytes in the values, GiB on the axes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import plotly.graph_objects as go

from meshplan.core.errors import MeshplanError
from meshplan.core.htmlpage import BACKWARD, FORWARD, PALETTE, WEIGHT, Section, page, styled
from meshplan.planner.estimate.memory import GiB
from meshplan.planner.layout.pipeline_timeline import Slot, schedule_slots
from meshplan.planner.plan.build import plan_layout
from meshplan.planner.search.exact import describe

# Decisions the scatter can colour by, as (label, value of a layout); those that take one value only are left out.
DECISIONS = (
    ("tp", lambda l: l.tp), ("pp", lambda l: l.pp), ("vpp", lambda l: l.vpp), ("cp", lambda l: l.cp),
    ("ep", lambda l: l.ep), ("dp_shard", lambda l: l.dp_shard), ("dp_replicate", lambda l: l.dp_replicate),
    ("micro-batch", lambda l: l.micro_batch), ("zero", lambda l: l.zero_stage), ("recompute", lambda l: l.recompute),
    ("schedule", lambda l: l.schedule), ("sequence parallel", lambda l: l.sequence_parallel),
    ("cp kind", lambda l: l.cp_kind), ("fp8", lambda l: l.fp8), ("attention", lambda l: l.attention),
    ("attention dtype", lambda l: l.attention_dtype),
    ("tp overlap", lambda l: l.tp_overlap), ("etp", lambda l: l.etp),
)
# The schedule drawing holds at most this many forward passes per rank (warm-up and cool-down are those of the full
# step; the steady part repeats): thousands of bars tell no more than a few dozen.
MAX_DRAWN_PASSES = 40
# Backward = 2 x forward per micro-batch: the GEMM FLOP ratio the GPU estimator itself uses for a stage's last
# backward (``GpuEstimator.estimate``: last_bwd = per micro-batch x 2/3).
BWD_SHARE = 2 / 3


@dataclass(frozen=True)
class PlanReport:
    """Everything the plan page draws.

    ``points``: per priced layout (description, step s, peak bytes, fits, {decision: value}).
    ``stages``: per pipeline stage {"compute_s": {op class: s}, "exposed_comm_s": {link: s}} per step (the
    ``planner.estimate.explain`` breakdown; ``None`` where the estimator has none, e.g. ``local:N``). The schedule is
    drawn for one of the step's ``runs``.
    """

    title: str
    subtitle: str
    best: str
    step_time_s: float
    points: tuple[tuple[str, float, int, bool, dict], ...]
    memory_limit_bytes: int
    memory_bytes: dict
    step_parts_s: dict
    stages: Optional[tuple[dict, ...]]
    schedule: str
    pp: int
    vpp: int
    microbatches: int  # in one schedule run
    runs: int = 1  # schedule runs per step (``Layout.pp_runs``), each with its own fill and drain
    facts: tuple[tuple[str, str], ...] = ()


def plan_report(outcome) -> PlanReport:
    """The values of ``outcome`` (a ``PlanOutcome`` of the layout search) the page draws.

    Raises:
        MeshplanError: a solver plan (it has no layout search to chart).
    """
    plan = outcome.plan
    if not outcome.priced:
        raise MeshplanError("--report charts the layout search; this plan came from a solver (heterogeneous "
                            "cluster, --workload serve or --quality-budget), which prices no layouts to compare")
    lay = plan_layout(plan)
    pred = plan.prediction
    points = tuple((describe(p.layout), p.step_time_s, p.peak_memory_bytes, p.fits,
                    {name: get(p.layout) for name, get in DECISIONS}) for p in outcome.priced)
    ex = outcome.breakdown
    parts = dict(ex["step_s"]) if ex else {"compute": pred.breakdown.compute_s,
                                           "exposed communication": pred.breakdown.exposed_comm_s,
                                           "pipeline bubble": pred.breakdown.bubble_s,
                                           "optimizer and other": pred.breakdown.other_s}
    facts = (("layout", describe(lay)), ("step time", f"{pred.step_time_s:.3f} s"),
             ("tokens/s", f"{pred.tokens_per_s:,.0f}"), ("MFU", f"{100 * pred.mfu:.1f}%"),
             ("peak memory", f"{pred.peak_memory_bytes / GiB:.1f} of {outcome.memory_limit_bytes / GiB:.1f} GiB"),
             ("priced by", pred.costmodel), ("plan file", str(outcome.path)))
    return PlanReport(title=f"meshplan plan: {plan.model.name} on {plan.cluster.spec}", subtitle=outcome.title,
                      best=describe(lay), step_time_s=pred.step_time_s, points=points,
                      memory_limit_bytes=outcome.memory_limit_bytes, memory_bytes=dict(pred.memory_bytes),
                      step_parts_s=parts, stages=tuple(ex["stages"]) if ex else None, schedule=lay.schedule,
                      pp=lay.pp, vpp=lay.vpp,
                      microbatches=max(1, lay.num_microbatches(plan.global_batch) // lay.pp_runs), runs=lay.pp_runs,
                      facts=facts)


def plan_page(rep: PlanReport) -> str:
    """The report page of ``rep``."""
    slots, drawn, why = _schedule(rep, max(1, MAX_DRAWN_PASSES // rep.vpp))
    full = _schedule(rep, rep.microbatches)[0] if drawn < rep.microbatches else slots
    sections = [
        Section("The plan", facts=rep.facts),
        Section("Every priced layout: step time against peak memory",
                note=f"{len(rep.points):,} layouts priced by the search (it prunes the rest, which cannot rank "
                     "higher); the line joins the frontier: no other layout that fits is both faster and smaller. "
                     "Crosses miss the memory limit. Pick the decision the colours show in the menu.",
                figure=scatter_figure(rep)),
        Section("Where the best plan's step goes, per pipeline stage",
                note=("Seconds per step: compute by op class, exposed communication by collective and link, and "
                      "the stage's idle time in the schedule drawn below. " if rep.stages else
                      "Seconds per step, as this cluster's estimator splits it (no per-op breakdown for "
                      "host-measured clusters). ")
                + "Step: " + ", ".join(f"{k} {v:.3f} s" for k, v in rep.step_parts_s.items() if v) + ".",
                figure=stage_figure(rep, full)),
        Section(f"Pipeline schedule: {_schedule_name(rep.schedule, rep.vpp)}, {rep.pp} stage(s)",
                note=why or _schedule_note(rep, drawn),
                figure=schedule_figure(rep, slots) if slots else None),
        Section("Memory on the most loaded device",
                note="Model states under the plan's ZeRO stage and precision, activations in flight under its "
                     "schedule and recomputation, and the runtime's own (CUDA context, NCCL buffers, allocator "
                     "fragmentation); the dashed line is what a rank may allocate.",
                figure=memory_figure(rep)),
    ]
    return page(rep.title, rep.subtitle, sections, footer="meshplan plan --report; figures drawn with Plotly")


def frontier(points) -> list[int]:
    """Indices of the fitting points no other fitting point beats on both step time and memory, by memory."""
    order = sorted((i for i, p in enumerate(points) if p[3]), key=lambda i: (points[i][2], points[i][1]))
    best, out = float("inf"), []
    for i in order:
        if points[i][1] < best:
            best = points[i][1]
            out.append(i)
    return out


def scatter_figure(rep: PlanReport) -> go.Figure:
    """Step time against peak memory, one marker per priced layout, coloured by the decision the menu picks."""
    pts = rep.points
    x = [float(f"{p[2] / GiB:.4g}") for p in pts]  # 4 digits: the page carries thousands of points
    y = [float(f"{p[1]:.4g}") for p in pts]
    varying = [name for name, _ in DECISIONS if len({p[4][name] for p in pts}) > 1] or ["pp"]
    fig = go.Figure()
    buttons = []
    for k, name in enumerate(varying):
        values = sorted({p[4][name] for p in pts}, key=lambda v: (isinstance(v, str), v))
        code = {v: i for i, v in enumerate(values)}
        n = len(values)
        colours = [PALETTE[i % len(PALETTE)] for i in range(n)]
        # a stepped colour scale: value i fills [i/n, (i+1)/n]
        scale = [[edge, c] for i, c in enumerate(colours) for edge in (i / n, (i + 1) / n)]
        codes = [code[p[4][name]] for p in pts]
        colour = dict(color=codes, colorscale=scale, cmin=-0.5, cmax=n - 0.5)
        bar = dict(title=dict(text=name), tickvals=list(range(n)), ticktext=[str(v) for v in values], len=0.8)
        if k == 0:
            marker = dict(colour, symbol=["circle" if p[3] else "x-thin-open" for p in pts], size=7, opacity=0.75,
                          line=dict(colour, width=1.5), colorbar=bar)
            fig.add_trace(go.Scatter(x=x, y=y, mode="markers", marker=marker, name="priced layouts",
                                     text=[p[0] + ("" if p[3] else " (does not fit)") for p in pts],
                                     hovertemplate="%{text}<br>%{y:.3f} s, %{x:.1f} GiB<extra></extra>"))
        # the menu restyles only the colours (symbols, positions and hover texts are sent once)
        change = {f"marker.{pre}{key}": [v] if isinstance(v, list) else v
                  for pre in ("", "line.") for key, v in colour.items()}
        change.update({f"marker.colorbar.{key}": [v] if isinstance(v, list) else v
                       for key, v in (("title.text", name), ("tickvals", bar["tickvals"]),
                                      ("ticktext", bar["ticktext"]))})
        buttons.append(dict(label=name, method="restyle", args=[change, [0]]))
    front = frontier(pts)
    fig.add_trace(go.Scatter(x=[x[i] for i in front], y=[y[i] for i in front], mode="lines+markers",
                             line=dict(color="#222", width=1.5, shape="hv"), name="frontier",
                             marker=dict(size=9, color="rgba(0,0,0,0)", line=dict(color="#222", width=1.5)),
                             text=[pts[i][0] for i in front],
                             hovertemplate="frontier: %{text}<br>%{y:.3f} s, %{x:.1f} GiB<extra></extra>"))
    best = min((i for i, p in enumerate(pts) if p[0] == rep.best), key=lambda i: y[i], default=None)
    if best is not None:
        fig.add_trace(go.Scatter(x=[x[best]], y=[y[best]], mode="markers", name="the plan",
                                 marker=dict(symbol="star", size=18, color="#FFD700", line=dict(color="#222", width=1)),
                                 text=[rep.best], hovertemplate="the plan: %{text}<br>%{y:.3f} s, %{x:.1f} GiB"
                                                                "<extra></extra>"))
    limit = rep.memory_limit_bytes / GiB
    fig.add_vline(x=limit, line=dict(color="#CC3311", dash="dash", width=1.5),
                  annotation_text=f"limit {limit:.1f} GiB", annotation_position="top left")
    styled(fig, 540, xaxis_title="peak memory per device (GiB)", yaxis_title="step time (s)",
           margin=dict(l=70, r=30, t=70, b=55),
           legend=dict(orientation="h", yanchor="bottom", y=1.02, x=1.0, xanchor="right"),
           updatemenus=[dict(buttons=buttons, direction="down", x=0.09, xanchor="left", y=1.02, yanchor="bottom",
                             showactive=True, bgcolor="#f6f8fa", bordercolor="#d0d7de")],
           annotations=[dict(text="colour by", x=0.08, xref="paper", xanchor="right", y=1.035, yref="paper",
                             yanchor="bottom", showarrow=False)])
    # memory and time span orders of magnitude across a space: log axes keep the fitting ones readable
    for axis, vals in ((fig.update_xaxes, x), (fig.update_yaxes, y)):
        if max(vals) > 4 * min(vals):
            axis(type="log", tickvals=_ticks_125(min(vals), max(vals)))
    return fig


def _ticks_125(lo: float, hi: float) -> list[float]:
    """1-2-5 ticks covering [lo, hi] (Plotly labels a log axis's minor ticks with single digits otherwise)."""
    out, decade = [], 10.0 ** math.floor(math.log10(lo))
    while decade <= hi:
        out += [decade * k for k in (1, 2, 5) if lo / 2 <= decade * k <= hi * 2]
        decade *= 10
    return out


def stage_figure(rep: PlanReport, slots: list[Slot]) -> go.Figure:
    """Per stage, stacked seconds per step: compute by op class, exposed comm by link, idle (bubble) in
    ``slots``, the whole step's schedule."""
    fig = go.Figure()
    if rep.stages:
        labels = [f"stage {s['stage']} ({s['layers']} layers)" for s in rep.stages]
        groups = [("compute_s", ""), ("exposed_comm_s", "comm: ")]
        colour = 0
        for key, prefix in groups:
            classes = sorted({c for s in rep.stages for c in s[key]}, key=lambda c: -sum(s[key].get(c, 0.0)
                                                                                        for s in rep.stages))
            for c in classes:
                fig.add_trace(go.Bar(y=labels, x=[s[key].get(c, 0.0) for s in rep.stages], orientation="h",
                                     name=prefix + c, marker_color=PALETTE[colour % len(PALETTE)],
                                     hovertemplate=f"{prefix}{c}: %{{x:.3f}} s<extra></extra>"))
                colour += 1
        idle = [i * rep.runs for i in _idle_per_rank(slots, rep.pp)] if slots else [0.0] * rep.pp
        fig.add_trace(go.Bar(y=labels, x=idle, orientation="h", name="bubble (idle)",
                             marker=dict(color="#DDDDDD", pattern=dict(shape="/")),
                             hovertemplate="bubble: %{x:.3f} s<extra></extra>"))
    else:
        for i, (k, v) in enumerate(rep.step_parts_s.items()):
            fig.add_trace(go.Bar(y=["the step"], x=[v], orientation="h", name=k, marker_color=PALETTE[i],
                                 hovertemplate=f"{k}: %{{x:.3f}} s<extra></extra>"))
    n = len(rep.stages) if rep.stages else 1
    styled(fig, max(120 + 40 * n, 100 + 22 * len(fig.data)), barmode="stack", xaxis_title="seconds per step",
           legend=dict(orientation="v", x=1.02, y=1.0, yanchor="top", font=dict(size=11)),
           margin=dict(l=130, r=20, t=20, b=55))
    fig.update_yaxes(autorange="reversed")
    return fig


def schedule_figure(rep: PlanReport, slots: list[Slot]) -> go.Figure:
    """A Gantt chart of ``slots``: one row per pipeline rank, bars at their times, labelled by micro-batch."""
    fig = go.Figure()
    names = {"F": "forward", "B": "backward", "W": "weight gradients (split off the backward)"}
    base = {"F": FORWARD, "B": BACKWARD, "W": WEIGHT}
    for kind in ("F", "B", "W"):
        ss = [s for s in slots if s.kind == kind]
        if not ss:
            continue
        fig.add_trace(go.Bar(
            y=[f"rank {s.rank}" for s in ss], x=[s.end_s - s.start_s for s in ss], base=[s.start_s for s in ss],
            orientation="h", name=names[kind], marker=dict(color=base[kind], line=dict(color="white", width=0.6),
                                                          opacity=[1.0 if s.chunk % 2 == 0 else 0.6 for s in ss]),
            text=[str(s.microbatch) for s in ss], textposition="inside", insidetextanchor="middle",
            textfont=dict(color="white", size=10),
            customdata=[[s.microbatch, s.chunk] for s in ss],
            hovertemplate=f"{names[kind]}: micro-batch %{{customdata[0]}}, "
                          + ("direction" if rep.schedule == "dualpipe" else "chunk")
                          + " %{customdata[1]}<br>%{base:.3f} to %{x:.3f} s<extra></extra>"))
    styled(fig, 150 + 38 * rep.pp, barmode="overlay", bargap=0.25, xaxis_title="seconds from the step's start",
           uniformtext=dict(minsize=8, mode="hide"))
    fig.update_yaxes(autorange="reversed", categoryorder="array", categoryarray=[f"rank {r}" for r in range(rep.pp)])
    return fig


def memory_figure(rep: PlanReport) -> go.Figure:
    """The peak's parts as one stacked bar against the limit."""
    parts = (("weights", "weights_bytes"), ("gradients", "grads_bytes"), ("optimizer states", "optimizer_bytes"),
             ("activations", "activations_bytes"), ("runtime (context, NCCL, fragmentation)", "overhead_bytes"))
    fig = go.Figure()
    for i, (label, key) in enumerate(parts):
        v = rep.memory_bytes.get(key, 0) / GiB
        fig.add_trace(go.Bar(y=["peak"], x=[v], orientation="h", name=f"{label} {v:.1f} GiB",
                             marker_color=PALETTE[(i + 3) % len(PALETTE)], text=[f"{v:.1f}"], textposition="inside",
                             hovertemplate=f"{label}: %{{x:.2f}} GiB<extra></extra>"))
    limit = rep.memory_limit_bytes / GiB
    fig.add_vline(x=limit, line=dict(color="#CC3311", dash="dash", width=1.5),
                  annotation_text=f"limit {limit:.1f} GiB", annotation_position="top left")
    styled(fig, 250, barmode="stack", xaxis_title="GiB per device", margin=dict(l=60, r=30, t=30, b=40),
           legend=dict(orientation="h", yanchor="top", y=-0.45, x=0))
    return fig


def _schedule(rep: PlanReport, most: int) -> tuple[list[Slot], int, str]:
    """The schedule's slots with at most ``most`` micro-batches, how many they hold, and why there are none ("" when
    there are)."""
    m = min(rep.microbatches, most)
    if rep.schedule == "interleaved" and m < rep.microbatches:
        m = max(rep.pp, m - m % rep.pp)
    if rep.schedule == "dualpipe":
        m = max(2 * rep.pp, m - m % 2)
    per_step = rep.microbatches * rep.runs
    if rep.stages:
        per_mb = [(sum(s["compute_s"].values()) + sum(s["exposed_comm_s"].values())) / per_step for s in rep.stages]
    else:
        per_mb = [(rep.step_parts_s.get("compute", 0.0) + rep.step_parts_s.get("exposed communication", 0.0))
                  / per_step] * rep.pp
    try:
        slots = schedule_slots(rep.schedule, rep.pp, rep.vpp, m, [t * (1 - BWD_SHARE) for t in per_mb],
                               [t * BWD_SHARE for t in per_mb])
    except MeshplanError as exc:
        return [], 0, f"Not drawn: {exc}"
    return slots, m, ""


def _idle_per_rank(slots: list[Slot], pp: int) -> list[float]:
    end = max(s.end_s for s in slots)
    busy = [0.0] * pp
    for s in slots:
        busy[s.rank] += s.end_s - s.start_s
    return [end - b for b in busy]


def _schedule_note(rep: PlanReport, drawn: int) -> str:
    run = "the step's" if rep.runs == 1 else f"each of the step's {rep.runs} schedule runs'"
    return (f"Which micro-batch each stage runs when, drawn with {drawn} of {run} {rep.microbatches} micro-batches"
            + (" (the steady part repeats)" if drawn < rep.microbatches else "")
            + "; forward, backward and weight-gradient passes coloured, the number is the micro-batch"
            + (", odd chunks lighter" if rep.vpp > 1 else "")
            + (", the direction entering at the last rank lighter" if rep.schedule == "dualpipe" else "")
            + ". A micro-batch's backward is taken as twice its forward.")


def _schedule_name(schedule: str, vpp: int) -> str:
    return {"1f1b": "1F1B", "interleaved": f"interleaved 1F1B, {vpp} chunks per rank", "zbh1": "ZB-H1",
            "dualpipe": "DualPipe"}.get(schedule, schedule)

