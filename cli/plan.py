"""``meshplan plan``: model + cluster + batch -> ranked layouts (rich table or JSON), best plan written to plans/."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from cli.common import console, err_console, handle_errors, print_json
from planner.memory import GiB


def plan(
    model: Annotated[str, typer.Option("--model", "-m", help="Preset name or path to a HF config.json")],
    cluster: Annotated[str, typer.Option("--cluster", "-c", help="16x8xH100, 4xT4+1xA100, local:2 or a YAML file")],
    global_batch: Annotated[int, typer.Option("--global-batch", "-b", help="Sequences per optimizer step")],
    seq_len: Annotated[int, typer.Option("--seq-len", "-s", help="Tokens per sequence")],
    fix: Annotated[Optional[str], typer.Option("--fix", help="Pin decisions: tp=8,pp=4,mbs=1,zero=1,recompute=full")] = None,
    top: Annotated[int, typer.Option("--top", "-k", help="How many ranked plans to show")] = 10,
    dtype: Annotated[str, typer.Option("--dtype", help="Math dtype of the training step")] = "bf16",
    name: Annotated[Optional[str], typer.Option("--name", help="Plan name (default: the model's)")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Where to write the best plan")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print a JSON list of plans, best first")] = False,
) -> None:
    """Rank the layouts of MODEL on CLUSTER by predicted step time and write the best one to plans/."""
    from planner.planning import plan_job
    from planner.search import describe

    if top < 1:
        raise typer.BadParameter("--top must be >= 1")
    show = not json_out and console.is_terminal
    with Progress(SpinnerColumn(), TextColumn("[progress.description]{task.description}"), BarColumn(),
                  TextColumn("{task.completed} layouts"), TimeElapsedColumn(), console=err_console,
                  transient=True, disable=not show) as bar:
        task = bar.add_task("searching layouts", total=None)
        outcome = plan_job(model, cluster, global_batch, seq_len, fix=fix, top=top, dtype=dtype, name=name,
                           out=out, progress=lambda n: bar.update(task, completed=n))
    if json_out:
        print_json(outcome.rows)
        return
    res = outcome.result
    table = Table(title=f"{outcome.work.model.name} on {outcome.work.cluster.spec}: global batch {global_batch}, "
                        f"seq {seq_len} — {res.feasible} of {res.evaluated} layouts fit ({res.wall_s:.2f} s)")
    for col in ("#", "layout", "step s", "tokens/s", "TFLOP/s/dev", "MFU", "peak GiB"):
        table.add_column(col, justify="left" if col == "layout" else "right")
    for i, (lay, _est) in enumerate(outcome.result.ranked, 1):
        r = outcome.rows[i - 1]
        table.add_row(str(i), describe(lay), f"{r['step_time_s']:.3f}", f"{r['tokens_per_s']:,.0f}",
                      f"{r['tflops_per_device']:.1f}", f"{100 * r['mfu']:.1f}%",
                      f"{r['peak_memory_bytes'] / GiB:.1f}")
    console.print(table)
    console.print(f"best plan written to [bold]{outcome.path}[/bold]")


def register(app: typer.Typer) -> None:
    app.command("plan")(handle_errors(plan))
