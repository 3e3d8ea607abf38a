"""``meshplan advise RUN``: the layout a job ran (inferred from its traces), re-priced on its own kernels, and a
faster one written as a plan, with each changed decision's share of the gain (library: verify.advise.job)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from meshplan.cli.common import console, err_console, handle_errors, print_json


def _render(a) -> None:
    table = Table(title=f"the layout {a.run} ran (inferred)")
    for col in ("part", "value", "confidence", "evidence"):
        table.add_column(col, overflow="fold")
    for k, p in a.inferred.parts.items():
        table.add_row(k, str(p.value), p.confidence, escape(p.evidence))
    console.print(table)
    for line in a.calibration:
        console.print(f"calibration: {escape(line)}", highlight=False)
    console.print(f"ran {a.ran_layout} on {a.cluster}: priced {1e3 * a.ran_predicted_s:.1f} ms, measured "
                  f"{1e3 * a.measured_s:.1f} ms ({a.measured_from}): price error {100 * a.price_error:+.1f}%",
                  highlight=False)
    if a.still_best:
        console.print(f"[green]still the best layout[/green]: nothing the search found is predicted faster "
                      f"(plan {a.plan_path})", highlight=False)
        return
    console.print(f"advised {a.best_layout}: {1e3 * a.best_predicted_s:.1f} ms predicted, "
                  f"[bold]{100 * a.gain:.1f}% faster[/bold]; plan written to {a.plan_path}", highlight=False)
    changes = Table(title="what changed (Shapley shares: each change's effect averaged over every order)")
    for col in ("change", "gain (ms)", "share", "step with it alone (ms)"):
        changes.add_column(col, justify="left" if col == "change" else "right")
    total = sum(c.gain_s for c in a.changes) or 1.0
    for c in a.changes:
        alone = "not valid alone" if c.alone_s is None else f"{1e3 * c.alone_s:.1f}"
        changes.add_row(escape(c.label()), f"{1e3 * c.gain_s:+.1f}", f"{100 * c.gain_s / total:.0f}%", alone)
    console.print(changes)


@handle_errors
def advise(
    run: Annotated[Path, typer.Argument(help="A `meshplan profile` run folder, or a folder of Kineto traces.")],
    cluster: Annotated[Optional[str], typer.Option("--cluster", "-c", help="Search on this cluster (default: the "
                                                   "one the run used).")] = None,
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Preset or HF config.json (default: the "
                                                 "shape the run's GEMMs show).")] = None,
    to: Annotated[Optional[str], typer.Option("--to", help="Also export the advised plan for this launcher.")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Where to write the advised plan (default: "
                                                "plans/<run>-advised.yaml).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the advice as JSON.")] = False,
) -> None:
    """Infer the layout RUN ran, price it against its measured step, and write a faster plan if there is one.

    Each changed decision's share of the predicted gain is its Shapley
    value: the step-time change it makes, averaged over every order of
    applying the changes (the mesh's degrees count as one change). The
    shares add up to the gain; a change that only adds work, such as more
    recomputation, gets a share of zero or less.
    """
    from meshplan.planner.host.terms import load_host
    from meshplan.verify.advise.job import AdviseRequest
    from meshplan.verify.advise.job import advise as advise_run

    a = advise_run(AdviseRequest(run, cluster, model, to, out), host_for=load_host)
    for w in a.notes + a.export_warnings:
        err_console.print(f"[yellow]note:[/yellow] {escape(w)}", highlight=False, soft_wrap=True)
    if json_out:
        print_json(a.as_dict())
        return
    _render(a)
    if a.export is not None:
        console.print(f"exported for {to}: {a.export}", highlight=False)


def register(app: typer.Typer) -> None:
    """Add the ``advise`` command to the root app."""
    app.command("advise")(advise)
