"""``meshplan plan``: model + cluster + batch -> ranked layouts (rich table or JSON), best plan written to plans/."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from meshplan.cli.common import COUNT, console, err_console, finite_budget, handle_errors, print_json
from meshplan.core.errors import MeshplanError
from meshplan.planner.layout.space import fix_help
from meshplan.planner.plan.schema import PLAN_SCHEMA_VERSION

GiB = 1024**3


def plan(
    model: Annotated[str, typer.Option("--model", "-m", help="Preset name or path to a HF config.json")],
    cluster: Annotated[str, typer.Option("--cluster", "-c", help="16x8xH100, 4xT4+1xA100, local:2 or a YAML file")],
    global_batch: Annotated[int, typer.Option("--global-batch", "-b", **COUNT, help="Sequences per optimizer step")],
    seq_len: Annotated[int, typer.Option("--seq-len", "-s", **COUNT,
                                         help="Tokens per sequence (prompt length to serve)")],
    fix: Annotated[Optional[str], typer.Option("--fix", help=fix_help())] = None,
    stack: Annotated[Optional[str], typer.Option("--stack", help="Stack profile NAME[@VERSION] whose defaults the plan "
                                                 "starts from (`meshplan stacks`); --fix overrides them")] = None,
    top: Annotated[int, typer.Option("--top", "-k", **COUNT, help="How many ranked plans to show")] = 10,
    dtype: Annotated[Optional[str], typer.Option("--dtype",
                                                 help="Math dtype (default: bf16; fp32 on local:N CPUs)")] = None,
    workload: Annotated[str, typer.Option("--workload", help="train or serve (LLM-PQ style)")] = "train",
    task: Annotated[str, typer.Option("--task", help="pretrain, sft (supervised fine-tuning of every weight: a "
                                      "stack profile's fine-tuning defaults hold) or lora (LoRA adapters: --lora's, "
                                      "else those the --stack profile's recipe trains)")] = "pretrain",
    lora: Annotated[Optional[str], typer.Option("--lora", help="Fine-tune LoRA adapters over a frozen base: "
                                                "RANK[:MODULES], modules qkv, proj, fc1, fc2 joined by + "
                                                "(default all four), e.g. 16:qkv")] = None,
    quality_budget: Annotated[Optional[float], typer.Option("--quality-budget", callback=finite_budget,
                                                            help="Bound on summed per-layer quantization "
                                                            "sensitivity")] = None,
    compress: Annotated[bool, typer.Option("--compress",
                                           help="Choose gradient compression per bucket (ByteComp)")] = False,
    error_budget: Annotated[Optional[float], typer.Option("--error-budget", callback=finite_budget,
                                                          help="Bound on gradient compression error")] = None,
    net: Annotated[Optional[str], typer.Option("--net", help="Inter-node bandwidth per GPU, e.g. 25Gbps")] = None,
    gen_len: Annotated[int, typer.Option("--gen-len", **COUNT, help="Tokens generated per request (serve)")] = 128,
    sensitivity: Annotated[Optional[Path], typer.Option("--sensitivity", help="Measured indicators from "
                                                        "`meshplan profile --sensitivity`")] = None,
    name: Annotated[Optional[str], typer.Option("--name", help="Plan name (default: the model's)")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Where to write the best plan")] = None,
    costmodel: Annotated[Optional[Path], typer.Option("--costmodel", help="Cost model folder to price ops with "
                                                      "(from `meshplan costmodel train` or `fit --out`; default: the "
                                                      "shipped one)")] = None,
    host_terms: Annotated[Optional[Path], typer.Option("--host-terms", help="local:N: the learned host terms file "
                                                       "(default: local-fit.json in the host cache)")] = None,
    no_host_terms: Annotated[bool, typer.Option("--no-host-terms", help="local:N: price unfitted (ignore what this "
                                                "host learned from its runs)")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print a JSON object: plan_path, schema_version, "
                                           "warnings and the ranked plans (best first)")] = False,
    explain: Annotated[bool, typer.Option("--explain", help="Break the best plan down (also into the plan file): "
                                          "per stage compute by op class, exposed comm by collective and link, "
                                          "bubble, the efficiency each op class was priced at")] = False,
    report: Annotated[Optional[Path], typer.Option("--report", help="Also write a self-contained HTML page: every "
                                                   "priced layout as step time against memory, the best plan's "
                                                   "per-stage breakdown, pipeline schedule and memory split.")]
    = None,
) -> None:
    """Rank the layouts of MODEL on CLUSTER by predicted step time and write the best one to plans/."""
    from meshplan.planner.host.terms import load_host
    from meshplan.planner.search.job import PlanRequest, plan_job

    if report is not None:
        from meshplan.core.htmlpage import check_report_path

        check_report_path(report, {"--model": model if Path(model).exists() else None,
                                   "--cluster": cluster if Path(cluster).exists() else None,
                                   "--sensitivity": sensitivity, "--host-terms": host_terms, "--costmodel": costmodel,
                                   "--out": out})
        if workload == "serve" or quality_budget is not None or sensitivity is not None:
            raise MeshplanError("--report charts the layout search; --workload serve, --quality-budget and "
                                "--sensitivity plan with a solver, which prices no layouts to compare")
    if out is not None:  # a folder, a path under a file, a read-only folder: said before the search, not after
        from meshplan.core.atomic import check_writable

        check_writable(out)
    request = PlanRequest.of(model, cluster, global_batch, seq_len, fix=fix, dtype=dtype, workload=workload,
                             stack=stack, lora=lora, task=task, top=top, name=name, out=out,
                             quality_budget=quality_budget, compress=compress, net=net, gen_len=gen_len,
                             error_budget=error_budget, sensitivity=sensitivity, costmodel=costmodel, explain=explain,
                             breakdown=report is not None)
    show = not json_out and console.is_terminal
    with Progress(SpinnerColumn(), TextColumn("[progress.description]{task.description}"), BarColumn(),
                  TextColumn("{task.completed} layouts"), TimeElapsedColumn(), console=err_console,
                  transient=True, disable=not show) as bar:
        task = bar.add_task("searching layouts", total=None)
        # local:N: this host's calibration (measured once, then cached) and learned terms; nothing otherwise
        host = load_host(cluster, host_terms, use_terms=not no_host_terms,
                         progress=lambda step: bar.update(task, description=f"calibrating this host: {step}"))
        bar.update(task, description="searching layouts")
        # --costmodel: a missing or corrupt folder is one line, exit 2 (checksums verified)
        outcome = plan_job(request, host, progress=lambda n: bar.update(task, completed=n))
    if report is not None:
        _write_report(report, outcome)
    if json_out:
        print_json({"plan_path": str(outcome.path), "schema_version": PLAN_SCHEMA_VERSION,
                    "meshplan_version": outcome.plan.meshplan_version, "warnings": list(outcome.notes),
                    "plans": outcome.rows, **({"explain": outcome.plan.explain} if explain else {}),
                    # the same trays in rack segments, where that runs faster (planner.search.segments); else null
                    "allocation": dataclasses.asdict(outcome.allocation) if outcome.allocation else None,
                    # the search's figures: layouts in the space, priced in full, pruned; of the pruned, those whose
                    # step time alone could not rank, those whose activations alone overflow (a solver's answer: null)
                    **{k: outcome.counts.get(k) for k in ("layouts_in_space", "layouts_priced", "layouts_pruned",
                                                          "layouts_timed", "layouts_unfit")}})
        return
    render_ranked(outcome)
    for note in outcome.notes:
        console.print(note, highlight=False)
    if explain and outcome.plan.explain:
        render_explain(outcome.plan.explain)
    console.print(f"best plan written to [bold]{outcome.path}[/bold]")


def render_ranked(outcome) -> None:
    """The ranked layouts as a rich table whose cells wrap."""
    table = Table(title=outcome.title)
    cols = ("#", "layout", "step s", "tokens/s", "TFLOP/s/dev", "MFU", "peak GiB")
    has_quality = any("quality" in r for r in outcome.rows)
    for col in cols + (("quality",) if has_quality else ()):
        table.add_column(col, justify="left" if col == "layout" else "right", overflow="fold")
    fmt = {"step_time_s": "{:.3f}", "tokens_per_s": "{:,.0f}", "tflops_per_device": "{:.1f}"}
    for i, r in enumerate(outcome.rows, 1):
        cells = [str(i), r["layout"]]
        cells += [fmt[k].format(r[k]) if k in r else "" for k in ("step_time_s", "tokens_per_s", "tflops_per_device")]
        cells.append(f"{100 * r['mfu']:.1f}%" if "mfu" in r else "")
        cells.append(f"{r['peak_memory_bytes'] / GiB:.1f}" if "peak_memory_bytes" in r else "")
        if has_quality:
            cells.append(f"{r['quality']:.3g}" if "quality" in r else "")
        table.add_row(*cells)
    console.print(table)


def _write_report(path: Path, outcome) -> None:
    """The plan report page (``planner.search.report``), written atomically."""
    from meshplan.core.atomic import write_atomic
    from meshplan.planner.search.report import plan_page, plan_report

    write_atomic(path, plan_page(plan_report(outcome)))
    err_console.print(f"report written to {path}", highlight=False)


def render_explain(ex: dict) -> None:
    """The best plan's breakdown (``planner.estimate.explain``) as rich tables that wrap."""
    profile = f", stack profile {ex['stack_profile']}" if ex.get("stack_profile") else ""
    step = Table(title=f"why {ex['step_time_s']:.3f} s per step (slowest stage: {ex['slowest_stage']}{profile})")
    step.add_column("part", overflow="fold")
    step.add_column("s", justify="right")
    for part, sec in ex["step_s"].items():
        step.add_row(part, f"{sec:.3f}")
    console.print(step)
    stages = Table(title="per stage, seconds per step")
    for col in ("stage", "layers", "compute by op class", "exposed comm by collective and link"):
        stages.add_column(col, overflow="fold", justify="right" if col in ("stage", "layers") else "left")
    for st in ex["stages"]:
        stages.add_row(str(st["stage"]), str(st["layers"]),
                       "\n".join(f"{k}: {v:.3f}" for k, v in st["compute_s"].items()),
                       "\n".join(f"{k}: {v:.3f}" for k, v in st["exposed_comm_s"].items()) or "-")
    console.print(stages)
    eff = Table(title="efficiency each op class was priced at (stage 0)")
    for col in ("op class", "achieved", "of peak"):
        eff.add_column(col, overflow="fold", justify="left" if col == "op class" else "right")
    for cls, e in ex["efficiency_stage0"].items():
        unit = "TFLOP/s" if e["unit"] == "FLOP/s" else "GB/s"
        scale = 1e12 if e["unit"] == "FLOP/s" else 1e9
        eff.add_row(cls, f"{e['achieved'] / scale:,.0f} {unit}", f"{100 * e['of_peak']:.1f}%")
    console.print(eff)
    basis = Table(title="what each op class's price rests on")
    for col in ("op class", "priced from"):
        basis.add_column(col, overflow="fold")
    for cls, how in ex.get("priced_from", {}).items():
        basis.add_row(cls, how)
    console.print(basis)
    for cls, how in ex.get("unmeasured", {}).items():
        console.print(f"unmeasured: {cls}: {how}")
    for name, lead in (("host_speed", "host speed"), ("sustained", "sustained clock")):
        band = ex.get(name)
        if band:  # the step at the other published figure (planner.estimate.host_band, sustained_band)
            console.print(f"{lead}: {band['step_time_s']:.3f} s a step ({100 * band['change']:+.1f}%) with "
                          f"{'an ' if name == 'host_speed' else 'the '}{band['source']}")


def register(app: typer.Typer) -> None:
    app.command("plan")(handle_errors(plan))
