"""``meshplan check PLAN RUN``: predicted vs measured step time and memory; exit 0 within tolerance, 1 outside."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from meshplan.cli.common import console, err_console, handle_errors, print_json
from meshplan.core.errors import MeshplanError


@handle_errors
def check(
    plan: Annotated[Path, typer.Argument(help="Plan YAML (with its prediction).")],
    runs: Annotated[list[Path], typer.Argument(help="Run folder written by `meshplan profile`; several: each is "
                                                    "judged, the exit code is the worst, --report charts them "
                                                    "in the order given.", metavar="RUN...")],
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
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON (several runs: "
                                           "{\"runs\": [...], \"exit_code\"}).")] = False,
    report: Annotated[Optional[Path], typer.Option("--report", help="Also write a self-contained HTML page: "
                                                   "predicted against measured per phase, the measured steps, "
                                                   "and the runs given over time.")] = None,
) -> None:
    """Compare PLAN's predicted step time and peak memory with each RUN; exit 1 when one is outside the tolerance."""
    from meshplan.core.atomic import refuse_overwrite, write_atomic
    from meshplan.core.htmlpage import check_report_path
    from meshplan.verify.report import advice_line, check_page, junit_xml, markdown

    inputs: dict[str, object] = {"PLAN": plan}
    for run in runs:
        one = len(runs) == 1
        inputs.update({"RUN" if one else f"RUN {run}": run,
                       "run.json" if one else f"run.json of {run}": Path(run) / "run.json"})
    for flag, out in (("--junit", junit), ("--summary", summary)):
        if out is not None:
            refuse_overwrite(out, inputs, flag)
    if report is not None:
        check_report_path(report, inputs)
    if len(runs) > 1:
        for flag, given in (("--junit", junit), ("--summary", summary), ("--learn", learn), ("--advise", advise)):
            if given:
                raise MeshplanError(f"{flag} takes one RUN ({len(runs)} given): it reports or learns from one run")
    gates = [_check_one(plan, run, tolerance, no_breakdown, contention, learn, host_terms, json_out, advise,
                        advise_out) for run in runs]
    results, advice = [g.result for g in gates], gates[0].advice
    if junit is not None:
        write_atomic(junit, junit_xml(results[0], advice))
    if summary is not None:
        write_atomic(summary, markdown(results[0], advice))
    if report is not None:
        write_atomic(report, check_page(results))
        err_console.print(f"report written to {report}", highlight=False)
    code = max(r.exit_code for r in results)
    if json_out:
        print_json({**results[0].as_dict(), **({"advice": advice.as_dict()} if advice is not None else {})}
                   if len(results) == 1 else {"runs": [r.as_dict() for r in results], "exit_code": code})
    else:
        for res in results:
            _print_result(plan, res)
        if advice is not None:
            console.print(f"advise: {advice_line(advice)}", highlight=False)
    raise typer.Exit(code)


def _check_one(plan: Path, run: Path, tolerance: str, no_breakdown: bool, contention: bool, learn: bool,
               host_terms: Optional[Path], quiet: bool, advise: bool, advise_out: Optional[Path]):
    """``verify.gate.check_run`` on one run, its notices on stderr; the gate (its ``result`` and ``advice``)."""
    from meshplan.planner.host.calibrate import load_calibration
    from meshplan.planner.host.terms import default_terms_path, load_host
    from meshplan.verify.gate import check_run
    from meshplan.verify.learn import learned_line

    with Progress(SpinnerColumn(), TextColumn("checking {task.description}"), TimeElapsedColumn(),
                  console=err_console, transient=True, disable=quiet or not err_console.is_terminal) as bar:
        bar.add_task(str(run), total=None)
        gate = check_run(plan, run, tolerance, breakdown=not no_breakdown, contention=contention, learn=learn,
                         terms_path=host_terms or default_terms_path(), calibration_of=load_calibration,
                         advise=advise, advise_out=advise_out, host_for=load_host)
    for notice in gate.notices:
        err_console.print(f"[yellow]warning:[/yellow] {notice}", highlight=False, soft_wrap=True)
    if gate.learned is not None:
        err_console.print(f"learned from {run}: {learned_line(gate.learned)}; written to {gate.learned_path}",
                          highlight=False, soft_wrap=True)
    return gate


def _print_result(plan: Path, res) -> None:
    from meshplan.verify.report import verdict_line

    for w in res.warnings:
        err_console.print(f"[yellow]warning:[/yellow] {w}", highlight=False, soft_wrap=True)
    table = Table(title=f"{plan} vs {res.run_path}")
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


def register(app: typer.Typer) -> None:
    """Add the ``check`` command to the root app."""
    app.command("check")(check)
