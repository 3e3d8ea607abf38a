"""``meshplan costmodel collect|train|eval|predict|fit``: build, judge and use the learned latency model."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich import box
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from meshplan.cli.common import console, handle_errors, print_json
from meshplan.core.errors import MeshplanError

costmodel_app = typer.Typer(help="Learned operator/collective latency model: collect, train, eval, predict, fit.",
                            no_args_is_help=True)


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=True)


def _paths(data: list[Path] | None, extra: list[Path] | None) -> list[Path]:
    out = list(data or []) + list(extra or [])
    if not out:
        raise MeshplanError("--data: give at least one dataset folder (e.g. ../shared/kernels)")
    return out


@costmodel_app.command("collect")
@handle_errors
def collect_cmd(
    out: Annotated[Path, typer.Option("--out", help="Output folder (local.csv + device.json).")],
    quick: Annotated[bool, typer.Option("--quick", help="Small grid, short timings (~10 s).")] = False,
    device: Annotated[str, typer.Option("--device", help="cpu or cuda.")] = "cpu",
    threads: Annotated[int, typer.Option("--threads", help="torch threads (recorded in the device name).")] = 1,
    repeats: Annotated[int, typer.Option("--repeats", help="Timings per shape (their spread = noise).")] = 3,
    json_out: Annotated[bool, typer.Option("--json", help="Print a JSON summary.")] = False,
) -> None:
    """Micro-benchmark this machine's device over LLM-layer / TP-shard shapes plus random shapes."""
    from meshplan.costmodel.collect import collect_summary

    if device not in ("cpu", "cuda"):
        raise MeshplanError(f"--device {device}: expected cpu or cuda")
    with _progress() as prog:
        task = prog.add_task("measuring", total=None)
        summary = collect_summary(out, quick=quick, device=device, threads=threads, repeats=repeats,
                                  progress=lambda d, t: prog.update(task, completed=d, total=t))
    if json_out:
        print_json(summary)
        return
    console.print(f"wrote {summary['rows']} measurements of {summary['device']} to {out} "
                  f"(median repeat spread {summary['median_noise_pct']}%)")


@costmodel_app.command("train")
@handle_errors
def train_cmd(
    out: Annotated[Path, typer.Option("--out", help="Model folder to write.")],
    data: Annotated[Optional[list[Path]], typer.Option("--data", help="Dataset folder (repeatable).")] = None,
    extra: Annotated[Optional[list[Path]], typer.Argument(help="More dataset folders.")] = None,
    rounds: Annotated[Optional[int], typer.Option("--rounds", help="Boosting rounds per op class.")] = None,
    max_rows: Annotated[Optional[int], typer.Option("--max-rows", help="Subsample each op class.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the metadata summary as JSON.")] = False,
) -> None:
    """Train one xgboost model per op class (+ the collective model) and write it to --out."""
    from meshplan.costmodel.ops import COMPUTE_KINDS
    from meshplan.costmodel.train import train

    with _progress() as prog:
        task = prog.add_task("training op classes", total=len(COMPUTE_KINDS))
        meta = train(_paths(data, extra), out, progress=lambda k: prog.advance(task), n_estimators=rounds,
                     max_rows_per_kind=max_rows)
    rows = [{"op": k, "n_train": v["n_train"], "train_mape": round(v["train_mape"], 2), "devices": len(v["devices"])}
            for k, v in sorted(meta["kinds"].items())]
    if json_out:
        print_json({"out": str(out), "train_seconds": meta["train_seconds"], "kinds": rows,
                    "collective_rows": meta.get("collectives", {}).get("n_train", 0)})
        return
    t = Table(title=f"model written to {out} in {meta['train_seconds']} s", box=box.SIMPLE_HEAD)
    for c in ("op", "n_train", "train MAPE %", "devices"):
        t.add_column(c, justify="left" if c == "op" else "right")
    for r in rows:
        t.add_row(r["op"], str(r["n_train"]), f"{r['train_mape']:.2f}", str(r["devices"]))
    console.print(t)


@costmodel_app.command("eval")
@handle_errors
def eval_cmd(
    split: Annotated[str, typer.Option("--split", help="neusight, vidur-h100, vidur-network, "
                                                       "leave-one-device-out, local, unseen-device:NAME.")],
    model: Annotated[Optional[Path], typer.Option("--model", help="Model folder whose recipe is evaluated.")] = None,
    data: Annotated[Optional[list[Path]], typer.Option("--data", help="Dataset folder (repeatable).")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Fewer trees and rows (fast, less accurate).")] = False,
    no_blend: Annotated[bool, typer.Option("--no-blend", help="Price unseen devices by the trees alone "
                                                              "(no shrinkage toward the calibrated roofline).")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print rows as JSON.")] = False,
) -> None:
    """Held-out accuracy per device and op class: the split's training rows only are used to fit."""
    from meshplan.costmodel.eval import evaluate

    paths = list(data or []) or [Path("../shared/kernels")]
    with _progress() as prog:
        task = prog.add_task(f"split {split}", total=None)
        rows = evaluate(split, paths, progress=lambda: prog.advance(task), quick=quick, blend_unseen=not no_blend,
                        model=model)
    if json_out:
        print_json(rows)
        return
    t = Table(title=f"split {split}: held-out error (%)", box=box.SIMPLE_HEAD)
    cols = ["device", "op", "n", "mape", "median_ape", "p90_ape"] + [c for c in ("roofline_mape", "fallback_frac",
                                                                                 "noise_floor_pct") if rows and c in rows[0]]
    for c in cols:
        t.add_column(c, justify="left" if c in ("device", "op") else "right")
    for r in rows:
        t.add_row(*(str(r.get(c, "")) for c in cols))
    console.print(t)


@costmodel_app.command("predict")
@handle_errors
def predict_cmd(
    op: Annotated[str, typer.Option("--op", help="Op class (matmul, bmm, attention, layernorm, ..., allreduce).")],
    shape: Annotated[str, typer.Option("--shape", help="Kind-specific shape, e.g. 8192x8192x8192 (m x n x k).")],
    device: Annotated[str, typer.Option("--device", help="Device name or alias (H100, A100, T4 ...).")],
    dtype: Annotated[str, typer.Option("--dtype", help="bf16, fp16, fp32, fp8 ...")] = "bf16",
    model: Annotated[Optional[Path], typer.Option("--model", help="Model folder (default: the shipped one).")] = None,
    group_size: Annotated[int, typer.Option("--group-size", help="Collectives: participants.")] = 8,
    link: Annotated[str, typer.Option("--link", help="Collectives: fitted link, e.g. h100_dgx/intra.")] = "",
    backward: Annotated[bool, typer.Option("--backward", help="Price the op's backward.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the prediction as JSON.")] = False,
) -> None:
    """Predicted latency of one op on one device (learned, or roofline when outside the trained range)."""
    from meshplan.costmodel.query import predict_query

    out = predict_query(op, shape, device, dtype, model, group_size, link, backward)
    sec, roof = out["latency_s"], out["ideal_roofline_s"]
    if json_out:
        print_json(out)
        return
    t = Table(title=f"{op} {shape} {dtype} on {out['device']}", box=box.SIMPLE_HEAD)
    t.add_column("figure")
    t.add_column("value", justify="right")
    t.add_row("latency", f"{sec * 1e6:,.2f} us")
    t.add_row("source", out["source"])
    if roof is not None:
        t.add_row("ideal roofline bound", f"{roof * 1e6:,.2f} us")
        if out["flops"]:
            t.add_row("achieved", f"{out['flops'] / sec / 1e12:,.1f} TFLOP/s")
    console.print(t)


@costmodel_app.command("fit")
@handle_errors
def fit_cmd(
    runs: Annotated[list[Path], typer.Option("--runs", help="Profiled run folder or trace (repeatable).")],
    out: Annotated[Optional[Path], typer.Option("--out", help="Write the op model calibrated on the runs' op "
                                                "records here (use it with `meshplan plan --costmodel DIR`).")] = None,
    model: Annotated[Optional[Path], typer.Option("--model", help="Base model (default: the shipped one).")] = None,
    device_dir: Annotated[Optional[Path], typer.Option("--device-json", help="collect folder with device.json.")] = None,
    device: Annotated[Optional[str], typer.Option("--device", help="Device the runs ran on (default: the GPU "
                                                  "their traces name, else this host's CPU).")] = None,
    host_terms: Annotated[Optional[Path], typer.Option("--host-terms", help="The host's terms file to update "
                                                       "(default: local-fit.json in the host cache).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print a JSON summary.")] = False,
) -> None:
    """Calibrate on profiled runs: this host's step-time figures from runs of local:N plans, and with --out an op
    model fitted on the runs' op records (name, input shapes, durations)."""
    from meshplan.planner.host.calibrate import load_calibration
    from meshplan.planner.host.terms import default_terms_path
    from meshplan.verify.fit import fit_from_runs
    from meshplan.verify.learn import learned_line

    terms_path = host_terms or default_terms_path()
    with _progress() as prog:
        prog.add_task("fitting", total=None)
        fitted = fit_from_runs(runs, terms_path, load_calibration, out=out, model=model, device_dir=device_dir,
                               device=device)
    if json_out:
        print_json(fitted)
        return
    local, summary = fitted["local"], fitted["ops"]
    if local["runs"]:
        console.print(f"this host (local:N plans, from {len(local['runs'])} run(s)): {learned_line(local)}; "
                      f"written to {terms_path}; later `meshplan plan --cluster local:N` use them", highlight=False)
    if summary is not None:
        t = Table(title=f"calibrated on {summary['rows']} op records of {summary['device']} -> {out}",
                  box=box.SIMPLE_HEAD)
        t.add_column("op")
        t.add_column("distinct shapes", justify="right")
        t.add_column("calibrated")
        for k, v in summary["ops"].items():
            t.add_row(k, str(v), "yes" if k in summary["calibrated"] else "no (one shape: learned model kept)")
        console.print(t)


def register(app: typer.Typer) -> None:
    app.add_typer(costmodel_app, name="costmodel")
