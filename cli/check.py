"""``meshplan check PLAN RUN``: predicted vs measured step time and memory; exit 0 within tolerance, 1 outside."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from meshplan.cli.common import console, err_console, handle_errors, print_json


@handle_errors
def check(
    plan: Annotated[Path, typer.Argument(help="Plan YAML (with its prediction).")],
    run: Annotated[Path, typer.Argument(help="Run folder written by `meshplan profile`.")],
    tolerance: Annotated[str, typer.Option("--tolerance", "-t", help="Allowed step-time error, e.g. 15%.")] = "15%",
    junit: Annotated[Optional[Path], typer.Option("--junit", help="Write a JUnit XML report here.")] = None,
    summary: Annotated[Optional[Path], typer.Option("--summary", help="Write a Markdown summary here.")] = None,
    no_breakdown: Annotated[bool, typer.Option("--no-breakdown", help="Skip the per-phase split (faster: "
                                                                      "does not load the traces).")] = False,
    contention: Annotated[bool, typer.Option("--contention", help="Scale the prediction by the host contention "
                                             "measured from the run's own operator timings (shared runners).")] = False,
    learn: Annotated[bool, typer.Option("--learn", help="Fit this host's learned terms (compute scale, "
                                        "wait per collective) from RUN; later local:N plans use them.")] = False,
    host_terms: Annotated[Optional[Path], typer.Option("--host-terms", help="With --learn: the host's terms file to "
                                                       "update (default: local-fit.json in the host cache).")] = None,
    advise: Annotated[bool, typer.Option("--advise", help="Also advise on RUN (`meshplan advise`): the summary and "
                                         "JUnit say when a faster layout is predicted.")] = False,
    advise_out: Annotated[Optional[Path], typer.Option("--advise-out", help="With --advise: where the advised plan "
                                                       "goes (default: plans/<run>-advised.yaml).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Compare PLAN's predicted step time and peak memory with RUN; exit 1 when outside the tolerance."""
    from meshplan.core.atomic import refuse_overwrite, write_atomic
    from meshplan.planner.host.calibrate import load_calibration
    from meshplan.planner.host.terms import default_terms_path, load_host
    from meshplan.verify.gate import check_run
    from meshplan.verify.learn import learned_line
    from meshplan.verify.report import advice_line, junit_xml, markdown, verdict_line

    for flag, out in (("--junit", junit), ("--summary", summary)):
        if out is not None:
            refuse_overwrite(out, {"PLAN": plan, "RUN": run, "run.json": Path(run) / "run.json"}, flag)
    with Progress(SpinnerColumn(), TextColumn("checking {task.description}"), TimeElapsedColumn(),
                  console=err_console, transient=True, disable=json_out or not err_console.is_terminal) as bar:
        bar.add_task(str(run), total=None)
        gate = check_run(plan, run, tolerance, breakdown=not no_breakdown, contention=contention, learn=learn,
                         terms_path=host_terms or default_terms_path(), calibration_of=load_calibration,
                         advise=advise, advise_out=advise_out, host_for=load_host)
    res = gate.result
    for notice in gate.notices:
        err_console.print(f"[yellow]warning:[/yellow] {notice}", highlight=False, soft_wrap=True)
    if gate.learned is not None:
        err_console.print(f"learned from {run}: {learned_line(gate.learned)}; written to {gate.learned_path}",
                          highlight=False, soft_wrap=True)
    if junit is not None:
        write_atomic(junit, junit_xml(res, gate.advice))
    if summary is not None:
        write_atomic(summary, markdown(res, gate.advice))
    if json_out:
        print_json({**res.as_dict(), **({"advice": gate.advice.as_dict()} if gate.advice is not None else {})})
    else:
        for w in res.warnings:
            err_console.print(f"[yellow]warning:[/yellow] {w}", highlight=False, soft_wrap=True)
        table = Table(title=f"{plan} vs {run}")
        for col in ("", "predicted", "measured", "difference"):
            table.add_column(col, justify="left" if not col else "right")
        table.add_row("step time (ms)", f"{1e3 * res.predicted_s:.1f}", f"{1e3 * res.measured_s:.1f}",
                      f"{100 * res.error:+.1f}%")
        mp = res.measured_peak_bytes
        table.add_row("peak memory (MiB)", f"{res.predicted_peak_bytes / 2**20:.1f}",
                      f"{mp / 2**20:.1f}" if mp is not None else "not recorded",
                      f"{100 * (mp - res.predicted_peak_bytes) / res.predicted_peak_bytes:+.1f}%" if mp else "")
        for ph in res.phases:
            mark = " <" if ph["phase"] == res.moved_phase else ""
            table.add_row(f"{ph['phase']} (ms){mark}", f"{1e3 * ph['predicted_s']:.1f}",
                          f"{1e3 * ph['measured_s']:.1f}", f"{1e3 * ph['delta_s']:+.1f} ms")
        console.print(table)
        style = "green" if res.passed else "red"
        console.print(f"[{style}]{'PASS' if res.passed else 'FAIL'}[/{style}] {verdict_line(res)}", highlight=False)
        if gate.advice is not None:
            console.print(f"advise: {advice_line(gate.advice)}", highlight=False)
    raise typer.Exit(res.exit_code)


def register(app: typer.Typer) -> None:
    """Add the ``check`` command to the root app."""
    app.command("check")(check)
