"""``meshplan replay RUN``: measured vs replayed step time, critical path, what-if, timeline file."""
from __future__ import annotations

import signal
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from meshplan.cli.common import INDEX, console, err_console, handle_errors, print_json
from meshplan.core.errors import MeshplanError

_STAGES = ("loading traces", "matching collectives", "aligning clocks", "building graph", "replaying")


def register(app: typer.Typer) -> None:
    """Add the ``replay`` command to the root app."""
    app.command("replay")(replay_cmd)


@handle_errors
def replay_cmd(
    run: Annotated[Path, typer.Argument(help="Run folder from `meshplan profile`, or any folder / .tar.gz / .zip "
                                             "of Kineto traces (one per rank), or one trace file.")],
    summary: Annotated[bool, typer.Option("--summary", help="Only list ranks, steps, ops per kind and which event "
                                                            "categories were used.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    what_if: Annotated[Optional[list[str]], typer.Option(
        "--what-if", help="Knob KEY=VALUE, repeatable or comma-separated: compute=0.8, comm=0.5, "
                          "name~allreduce=0, bandwidth=2, stragglers=median, bucket=25MB; KEY@RANKS limits it to "
                          "ranks (compute@1=2). A knob that matches no op is an error. JSON: "
                          "steps[].whatif_s.")] = None,
    timeline: Annotated[Optional[Path], typer.Option("--timeline", help="Write a timeline of the replay beside "
                                                     "the measured trace (never over an input).")] = None,
    timeline_format: Annotated[str, typer.Option("--timeline-format", help="perfetto (Perfetto protobuf, "
                                                 ".pftrace) or chrome (Chrome trace JSON).")] = "perfetto",
    step: Annotated[Optional[int], typer.Option("--step", **INDEX, help="Step whose critical path is shown "
                                                               "(default: last).")] = None,
    steps_at: Annotated[Optional[str], typer.Option("--steps-at", help="Cut steps at an op instead of "
                                                    "ProfilerStep# markers: 'optimizer' (each optimizer step ends "
                                                    "one) or an op name (each occurrence starts one).")] = None,
    ranks: Annotated[Optional[str], typer.Option("--ranks", help="Analyse only these ranks of a big job, e.g. "
                                                 "0-7,128-135 (absent peers: measured collective times kept).")]
    = None,
    fit_steps: Annotated[Optional[int], typer.Option("--fit-steps", min=1, help="Held-out check: steps to fit on "
                                                     "(default: half); the rest are predicted.")] = None,
    workers: Annotated[Optional[int], typer.Option("--workers", min=1, help="Processes parsing traces in "
                                                   "parallel (default: the cores available).")] = None,
    ray: Annotated[Optional[str], typer.Option("--ray", help="Parse on Ray: 'auto' (running cluster), 'local' "
                                               "(start one here) or a cluster address.")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Do not read or write the Parquet cache of parsed "
                                           "traces.")] = False,
    report_page: Annotated[Optional[Path], typer.Option("--report", help="Also write a self-contained HTML page: "
                                                        "each rank's step, measured vs replayed steps, the critical "
                                                        "path (beside the --timeline file).")] = None,
) -> None:
    """Replay a measured run: per-step measured vs replayed time, held-out prediction, critical path, what-if."""
    from meshplan.core.cache import cache_dir
    from meshplan.profiler.report import analyze_run, check_output_path, replay_report
    from meshplan.profiler.runs import parse_rank_list
    from meshplan.profiler.summary import summarize_run
    from meshplan.profiler.timeline import FORMATS
    from meshplan.profiler.whatif import parse_knobs

    _terminate_cleanly()
    knobs = parse_knobs(what_if or [])  # bad knobs fail before any parsing work
    if timeline_format not in FORMATS:
        raise MeshplanError(f"--timeline-format {timeline_format!r}: expected one of {', '.join(FORMATS)}")
    if timeline is not None:
        check_output_path(timeline, [run], "--timeline")
    if report_page is not None:
        from meshplan.core.htmlpage import check_report_path

        check_output_path(report_page, [run], "--report")
        check_report_path(report_page, {"RUN": run, "--timeline": timeline})
        if summary:
            raise MeshplanError("--report draws a replay; --summary only lists what the traces hold (drop one)")
    sample = parse_rank_list(ranks) if ranks is not None else None
    opts = dict(step_at=steps_at, ranks=sample, workers=workers, ray=ray,
                cache_dir=None if no_cache else cache_dir() / "traces")
    if summary:
        with err_console.status("loading traces", spinner="dots") if not json_out else nullcontext():
            s = summarize_run(run, **opts)
        print_json(s) if json_out else _print_summary(s)
        return
    with Progress(TextColumn("[bold]replay[/bold] {task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=err_console, transient=True, disable=json_out) as bar:
        task = bar.add_task(_STAGES[0], total=len(_STAGES) + 1)

        def progress(msg: str) -> None:
            bar.update(task, description=msg, completed=_STAGES.index(msg) if msg in _STAGES else 0)

        a = analyze_run(run, progress=progress, keep_events=False, **opts)
        bar.update(task, description="what-if, prediction, critical path" + (", timeline" if timeline else ""),
                   completed=len(_STAGES))
        report = replay_report(a, [k.text for k in knobs], cp_step=step, timeline=timeline, fit_steps=fit_steps,
                               timeline_format=timeline_format)
        if report_page is not None:
            from meshplan.core.atomic import write_atomic
            from meshplan.profiler.report_page import replay_page, replay_values

            write_atomic(report_page, replay_page(replay_values(a, report)))
            err_console.print(f"report written to {report_page}", highlight=False)
    if json_out:
        print_json(report)
        return
    _print_report(report)


def _terminate_cleanly() -> None:
    """SIGTERM raises SystemExit, so ``finally`` blocks run (temporary folders of extracted archives removed)."""
    def _raise(signum, _frame):  # noqa: ANN001
        raise SystemExit(128 + signum)

    try:
        signal.signal(signal.SIGTERM, _raise)
    except ValueError:  # not the main thread (an embedding application): leave its handlers alone
        pass


def _span(xs: list[int]) -> str:
    return f"{xs[0]}-{xs[-1]}" if len(xs) > 1 else str(xs[0])


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
    _print_inputs(s["inputs"])
    for sk in s["skipped"]:
        console.print(f"[yellow]not loaded[/yellow] {sk['file']}: {sk['reason']}", highlight=False)
    for w in s["warnings"]:
        if not any(w.startswith(sk["file"]) for sk in s["skipped"]):
            console.print(f"[yellow]warning:[/yellow] {w}", highlight=False)


def _print_inputs(inputs: dict) -> None:
    if inputs["used"]:
        console.print("used: " + "; ".join(f"{u['category']} ({u['role']}, {u['used']:,})" for u in inputs["used"]),
                      highlight=False)
    for u in inputs["not_used"]:
        console.print(f"not used: {u['category']} ({u['events']:,} events): {u['why']}", highlight=False)


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
    c = r["consistency"]["median_abs_error"]
    if c is not None:
        console.print(f"consistency (each step replayed with its own measured ops; not a prediction): median "
                      f"|error| {c * 100:.2f}%", highlight=False)
    p = r["prediction"]
    if p.get("available") and p["median_abs_error"] is not None:
        console.print(f"prediction (held-out steps {_span(p['held_out_steps'])} from per-op medians of steps "
                      f"{_span(p['fit_steps'])}): median |error| {p['median_abs_error'] * 100:.2f}%"
                      + (f", {p['unfitted_share'] * 100:.1f}% of op time unfitted" if p["unfitted_share"] else ""),
                      highlight=False)
    else:
        console.print(f"prediction: not available ({p.get('why')})", highlight=False)
    if len(r["ranks"]) > 1:
        console.print(f"clock offsets (µs): {r['alignment']['offsets_us']}  residual "
                      f"{r['alignment']['residual_us']} µs", highlight=False)
    if r.get("sampled_ranks") is not None:
        console.print(f"sampled ranks: {len(r['ranks'])} of world size {r['world_size']}; "
                      f"{r['partial_collectives']} collective op(s) with absent peers keep their measured durations",
                      highlight=False)
    if r["what_if"]:
        console.print("what-if: " + "; ".join(f"{k} ({r['what_if_ops'].get(k, 0):,} ops)" for k in r["what_if"]),
                      highlight=False)
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
    _print_inputs(r["inputs"])
    for w in r["warnings"][:20]:
        console.print(f"[yellow]warning:[/yellow] {w}", highlight=False)
    if len(r["warnings"]) > 20:
        console.print(f"[yellow]... {len(r['warnings']) - 20} more warnings (see --json)[/yellow]")
