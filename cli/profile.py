"""``meshplan profile``: run an unmodified training script under torchrun with the profiler attached."""
from __future__ import annotations

import os
import shlex
import statistics
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from meshplan.cli.common import console, err_console, handle_errors, print_json


def register(app: typer.Typer) -> None:
    """Add the ``profile`` command to the root app."""
    # Everything after SCRIPT belongs to the script (even ``--steps``): stop option parsing at SCRIPT.
    app.command(
        "profile",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                          "allow_interspersed_args": False},
    )(profile)


@handle_errors
def profile(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", "-o", help="Run folder to write (traces + run.json).")],
    nproc: Annotated[Optional[int], typer.Option("--nproc", help="Ranks per node (default: plan's, else 1).")] = None,
    nnodes: Annotated[int, typer.Option("--nnodes", help="Nodes (multi-node needs --rdzv-endpoint).")] = 1,
    node_rank: Annotated[int, typer.Option("--node-rank", help="This node's rank.")] = 0,
    rdzv_backend: Annotated[str, typer.Option("--rdzv-backend", help="torchrun rendezvous backend.")] = "c10d",
    rdzv_endpoint: Annotated[Optional[str], typer.Option("--rdzv-endpoint", help="HOST:PORT.")] = None,
    rdzv_id: Annotated[str, typer.Option("--rdzv-id", help="Rendezvous job id.")] = "meshplan",
    warmup: Annotated[int, typer.Option("--warmup", help="Steps skipped before measuring.")] = 2,
    steps: Annotated[int, typer.Option("--steps", help="Steps measured (traced).")] = 8,
    unprofiled: Annotated[int, typer.Option("--unprofiled-steps", min=0,
                                            help="Steps timed after the traced ones with the profiler stopped "
                                                 "(`meshplan check` judges on them: the profiler's cost per op "
                                                 "is in the traced steps only); 0 = none.")] = 8,
    pin: Annotated[Optional[bool], typer.Option("--pin/--no-pin",
                                                help="One core per rank (default: when ranks <= cores).")] = None,
    from_plan: Annotated[Optional[Path], typer.Option("--from-plan", help="Plan: world size + --plan for the "
                                                      "script (and $MESHPLAN_PLAN).")] = None,
    keep_running: Annotated[bool, typer.Option("--keep-running", help="Let the script finish its own loop "
                                               "after the measured steps.")] = False,
    show_output: Annotated[bool, typer.Option("--show-output", help="Stream the ranks' output "
                                              "(default: OUT/launch.log).")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print run.json instead of a table.")] = False,
    sensitivity: Annotated[bool, typer.Option("--sensitivity", help="Measure per-layer quantization sensitivity "
                                              "on a small real model (QSync) into OUT/sensitivity.json.")] = False,
    script: Annotated[Optional[Path], typer.Argument(metavar="SCRIPT [SCRIPT_ARGS]...",
                                           help="Training script, run unmodified; its arguments follow it.")] = None,
) -> None:
    """Profile SCRIPT on every rank and write a run folder for `meshplan replay` / `meshplan check`."""
    if sensitivity:
        _sensitivity(out, json_out)
        return
    if script is None:
        raise typer.BadParameter("missing SCRIPT (or use --sensitivity)")
    from meshplan.planner.plan.schema import load_plan
    from meshplan.profiler.capture import capture_steps
    from meshplan.profiler.capture_launch import LaunchConfig, launch

    plan_world = load_plan(from_plan).degrees.world_size if from_plan is not None else None
    cfg = LaunchConfig(script=script, out_dir=out, script_args=list(ctx.args), nproc=nproc, nnodes=nnodes,
                       node_rank=node_rank, rdzv_backend=rdzv_backend, rdzv_endpoint=rdzv_endpoint,
                       rdzv_id=rdzv_id, warmup=warmup, steps=steps, unprofiled=unprofiled, pin=pin, plan=from_plan,
                       plan_world_size=plan_world, stop_when_done=not keep_running, show_output=show_output,
                       environ=dict(os.environ))
    command = shlex.join(["meshplan", *sys.argv[1:]]) if sys.argv and "meshplan" in sys.argv[0] else None
    with Progress(TextColumn("[bold]profiling[/bold] {task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err_console, transient=True, disable=json_out) as bar:
        task = bar.add_task(script.name, total=capture_steps(warmup, steps, unprofiled))
        result = launch(cfg, on_progress=lambda done, total: bar.update(task, completed=done, total=total),
                        meshplan_command=command)
    for w in result.warnings:
        err_console.print(f"[yellow]warning:[/yellow] {w}", highlight=False, soft_wrap=True)
    run = result.run
    if json_out:
        print_json(run)
        return
    table = Table(title=f"{out}  ({run['world_size']} ranks, {run['backend']}, "
                        f"{run['warmup_steps_skipped']} warm-up steps skipped)")
    for col in ("rank", "device", "core", "steps", "median step (ms)", "min (ms)", "max (ms)",
                "unprofiled steps", "unprofiled median (ms)"):
        table.add_column(col, justify="right" if col not in ("device",) else "left")
    unprof = run.get("unprofiled_step_times_s") or {}
    for rank, times in sorted(run["step_times_s"].items(), key=lambda kv: int(kv[0])):
        med = statistics.median(times) if times else 0.0
        free = unprof.get(rank) or []
        table.add_row(rank, str(run["devices"].get(rank)), str(run["pinned_cores"].get(rank)), str(len(times)),
                      f"{med * 1e3:.1f}", f"{min(times, default=0) * 1e3:.1f}", f"{max(times, default=0) * 1e3:.1f}",
                      str(len(free)), f"{statistics.median(free) * 1e3:.1f}" if free else "-")
    console.print(table)


def _sensitivity(out: Path, json_out: bool) -> None:
    """Measured indicators for ``meshplan plan --sensitivity OUT/sensitivity.json``."""
    from meshplan.planner.search.solve.sensitivity import PROFILE_PRECISIONS as precisions
    from meshplan.planner.search.solve.sensitivity import measure_sensitivity_file

    with err_console.status("measuring quantization sensitivity on a small real model"):
        path, rows = measure_sensitivity_file(out, precisions)
    if json_out:
        print_json({"path": str(path), "precisions": list(precisions), "layers": rows})
        return
    table = Table(title=f"relative gradient error per block ({path})")
    table.add_column("block")
    for p in precisions:
        table.add_column(p, justify="right")
    for i, r in enumerate(rows):
        table.add_row(str(i), *(f"{x:.2e}" for x in r))
    console.print(table)
