"""``meshplan replay RUN``: measured vs replayed step time, critical path, what-if, timeline file."""
from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from meshplan.cli.common import console, err_console, handle_errors, print_json

_STAGES = ("loading traces", "matching collectives", "aligning clocks", "building graph", "replaying")


def register(app: typer.Typer) -> None:
    """Add the ``replay`` command to the root app."""
    app.command("replay")(replay_cmd)


@handle_errors
def replay_cmd(
    run: Annotated[Path, typer.Argument(help="Run folder from `meshplan profile`, or any folder / .tar.gz / .zip "
                                             "of Kineto traces (one per rank), or one trace file.")],
    summary: Annotated[bool, typer.Option("--summary", help="Only list ranks, steps and ops per kind.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    what_if: Annotated[Optional[list[str]], typer.Option(
        "--what-if", help="Knob KEY=VALUE, repeatable: compute=0.8, comm=0.5, name~allreduce=0, bandwidth=2, "
                          "stragglers=median, bucket=25MB; KEY@RANKS limits it to ranks (compute@1=2).")] = None,
    timeline: Annotated[Optional[Path], typer.Option("--timeline", help="Write a Perfetto/Chrome JSON of the "
                                                                        "replay beside the measured trace.")] = None,
    step: Annotated[Optional[int], typer.Option("--step", help="Step whose critical path is shown "
                                                               "(default: last).")] = None,
) -> None:
    """Replay a measured run: per-step measured vs replayed time, critical path, what-if."""
    from meshplan.profiler.report import analyze_run, replay_report
    from meshplan.profiler.runs import load_run
    from meshplan.profiler.summary import run_summary
    from meshplan.profiler.whatif import parse_knob

    knobs = [parse_knob(k) for k in what_if or []]  # bad knobs fail before any parsing work
    if summary:
        with err_console.status("loading traces", spinner="dots") if not json_out else nullcontext():
            s = run_summary(load_run(run, allow_empty=True))
        print_json(s) if json_out else _print_summary(s)
        return
    with Progress(TextColumn("[bold]replay[/bold] {task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=err_console, transient=True, disable=json_out) as bar:
        task = bar.add_task(_STAGES[0], total=len(_STAGES) + 1)

        def progress(msg: str) -> None:
            bar.update(task, description=msg, completed=_STAGES.index(msg) if msg in _STAGES else 0)

        a = analyze_run(run, progress=progress)
        bar.update(task, description="what-if, critical path" + (", timeline" if timeline else ""),
                   completed=len(_STAGES))
        report = replay_report(a, [k.text for k in knobs], cp_step=step, timeline=timeline)
    if json_out:
        print_json(report)
        return
    _print_report(report)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.3f}"


def _print_summary(s: dict) -> None:
    t = Table(title=f"{s['source']}: {len(s['ranks'])} rank(s) of {s['world_size'] or '?'} ({s['backend'] or '?'})")
    for c in ("rank", "file", "steps", "compute", "comm", "host", "memcpy", "threads", "streams"):
        t.add_column(c, justify="left" if c == "file" else "right")
    for r in s["per_rank"]:
        st = r["steps"]
        steps = f"{st[0]}..{st[-1]} ({len(st)})" if len(st) > 1 else (str(st[0]) if st else "none")
        ops = (str(r["ops"][k]) for k in ("compute", "comm", "host", "memcpy"))
        t.add_row(str(r["rank"]), Path(r["file"].split("!")[-1]).name, steps, *ops,
                  str(r["host_threads"]), str(r["gpu_streams"]))
    if s["per_rank"]:
        console.print(t)
        console.print(f"steps on every rank: {s['steps']}; ops: " + ", ".join(f"{k} {v}" for k, v in s["ops"].items()))
    else:
        console.print(f"[bold]{s['source']}[/bold]: no Kineto trace found")
    for sk in s["skipped"]:
        console.print(f"[yellow]not loaded[/yellow] {sk['file']}: {sk['reason']}", highlight=False)
    for w in s["warnings"]:
        if not any(w.startswith(sk["file"]) for sk in s["skipped"]):
            console.print(f"[yellow]warning:[/yellow] {w}", highlight=False)


def _print_report(r: dict) -> None:
    t = Table(title=f"{r['source']}: measured vs replayed step time (ms)")
    for c in ("step", "measured", "replayed", "error"):
        t.add_column(c, justify="right")
    has_wi = any("whatif_s" in s for s in r["steps"])
    if has_wi:
        t.add_column("what-if", justify="right")
        t.add_column("change", justify="right")
    for s in r["steps"]:
        row = [str(s["step"]), _ms(s["measured_s"]), _ms(s["replayed_s"]),
               "-" if s["error"] is None else f"{s['error'] * 100:+.2f}%"]
        if has_wi:
            w = s.get("whatif_s")
            row += [_ms(w), "-" if w is None else f"{(w - s['replayed_s']) / s['replayed_s'] * 100:+.1f}%"]
        t.add_row(*row)
    console.print(t)
    if r["median_error"] is not None:
        console.print(f"median |error| {r['median_error'] * 100:.2f}%   clock offsets (µs): "
                      f"{r['alignment']['offsets_us']}  residual {r['alignment']['residual_us']} µs", highlight=False)
    if r["what_if"]:
        console.print(f"what-if: {', '.join(r['what_if'])}")
    cp = Table(title=f"critical path of step {r['critical_path_step']} ({r['critical_path_ops']} ops): dominant ops")
    for c in ("kind", "name", "exposed ms", "share", "count", "ranks"):
        cp.add_column(c, justify="left" if c in ("kind", "name") else "right")
    for o in r["critical_path"]:
        ranks = o["ranks"]
        cp.add_row(o["kind"], o["name"][:70], f"{o['exposed_s'] * 1e3:.3f}", f"{o['share'] * 100:.1f}%",
                   str(o["count"]), ",".join(map(str, ranks[:8])) + ("…" if len(ranks) > 8 else ""))
    console.print(cp)
    if r.get("timeline"):
        console.print(f"timeline written: {r['timeline']} (open in https://ui.perfetto.dev)")
    for w in r["warnings"][:20]:
        console.print(f"[yellow]warning:[/yellow] {w}", highlight=False)
    if len(r["warnings"]) > 20:
        console.print(f"[yellow]... {len(r['warnings']) - 20} more warnings (see --json)[/yellow]")
