"""SimuMax and Calculon on the dev set: each peer's predicted step time per row, and its error per source.

Run (with a Python that has the peers' dependencies, see bench/peers/README.md):
    python bench/peers/run_peers.py --simumax PATH --calculon PATH [--dev-set PATH] [--json] [--save-inputs DIR]
                                    [--save-json FILE]

PATH is a checkout of github.com/MooreThreads/SimuMax (the folder holding simumax/) and of
github.com/calculon-ai/calculon (the folder holding calculon/); nothing of theirs lives in this repository.
Signed error = (predicted - published) / published, negative = predicted too fast; published = the source's s/step,
else gbs*seq/(tokens_per_s_per_gpu*n_gpus) (dev set README). ``--json`` prints one object whose ``rows`` carry the
dev-set ``name`` (the key to join with bench/dev_set.py's rows) and whose ``peers`` carry each checkout's commit.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calculon_adapter
import simumax_adapter
from peer_rows import NotExpressible, Prediction, load_rows, summarize

REPO = Path(__file__).resolve().parents[2]
# the repository's copy of the dev set (data/README.md)
DEFAULT_DEV_SET = REPO / "data" / "published_runs" / "dev_runs.jsonl"
SIMUMAX_BASES = ("a100", "b200")  # accelerator section of the derived H100 file (simumax_adapter docstring)


def commit_of(checkout: Path) -> str:
    """HEAD of ``checkout`` if it is a git work tree, else a sentence saying it is not."""
    try:
        out = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=30, check=True)
        return out.stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError, subprocess.TimeoutExpired):
        return "unknown (not a git checkout)"


def run_all(dev_set: Path, simumax: Path, calculon: Path, console: Console) -> tuple[list[Prediction], dict]:
    rows = load_rows(dev_set)
    shipped = simumax_adapter.load_shipped(simumax)
    preds: list[Prediction] = []
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("peers", total=len(rows) * (len(SIMUMAX_BASES) + 1))
        for row in rows:
            for base in SIMUMAX_BASES:
                bar.update(task, description=f"SimuMax ({base}) {row.name}")
                preds.append(simumax_adapter.predict(row, simumax, base, shipped))
                bar.advance(task)
            bar.update(task, description=f"Calculon {row.name}")
            preds.append(calculon_adapter.predict(row, calculon))
            bar.advance(task)
    sm_commit, ca_commit = commit_of(simumax), commit_of(calculon)
    peers = {f"simumax:{b}": {"checkout": str(simumax), "commit": sm_commit,
                              "system": simumax_adapter.system_config(shipped, "H100", b)[1]}
             for b in SIMUMAX_BASES}
    systems = calculon_adapter.SYSTEMS
    peers["calculon"] = {"checkout": str(calculon), "commit": ca_commit,
                         "system": f"H100: {systems['H100']}, A100: {systems['A100']}"}
    return preds, peers


def save_inputs(dev_set: Path, simumax: Path, out: Path) -> None:
    """Each row's peer inputs as JSON files under ``out`` (derived SimuMax system files included)."""
    shipped = simumax_adapter.load_shipped(simumax)
    out.mkdir(parents=True, exist_ok=True)
    for gpu in simumax_adapter.MACHINES:
        for base in SIMUMAX_BASES:
            system, _ = simumax_adapter.system_config(shipped, gpu, base)
            (out / f"simumax_system_{gpu}_{base}.json").write_text(json.dumps(system, indent=1))
    for row in load_rows(dev_set):
        for name, build in (("simumax", (simumax_adapter.model_config, simumax_adapter.strategy_config)),
                            ("calculon", (calculon_adapter.application, calculon_adapter.execution))):
            try:
                doc = {f.__name__: f(row)[0] for f in build}
            except NotExpressible as exc:
                doc = {"not_expressible": str(exc)}
            (out / f"{row.name}.{name}.json").write_text(json.dumps(doc, indent=1))


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def render(preds: list[Prediction], peers: dict, console: Console) -> None:
    by_row: dict[str, dict[str, Prediction]] = {}
    for p in preds:
        by_row.setdefault(p.name, {})[p.peer] = p
    names = list(peers)
    t = Table(title="Peers on the dev set: predicted step time (s) and signed error", show_lines=False)
    for col in ("row", "src", "published s", *names):
        t.add_column(col, overflow="fold")
    for name, per in by_row.items():
        first = next(iter(per.values()))
        cells = []
        for peer in names:
            p = per[peer]
            if p.predicted_step_s is not None:
                flag = "~" if p.status == "approx" else ""
                cells.append(f"{p.predicted_step_s:.2f} {_pct(p.signed_error)}{flag}")
            elif p.status == "refused":
                cells.append(f"refused ({p.time_if_not_refused_s:.2f} if not)")
            else:
                cells.append(f"{p.status}: {p.reason[:60]}")
        t.add_row(name, first.source_id, f"{first.published_step_s:.2f}", *cells)
    console.print(t)
    console.print("~ = priced with approximations (listed per row in --json and bench/peers/README.md)")
    s = Table(title="Per source: mean |error|, worst, median signed (priced rows only)")
    for col in ("peer", "source", "rows", "priced", "not expr.", "refused", "errors", "mean |err|", "worst",
                "median signed"):
        s.add_column(col)
    for peer in names:
        for d in summarize([p for p in preds if p.peer == peer]):
            s.add_row(peer, d["source_id"], str(d["rows"]), str(d["priced"]), str(d["not_expressible"]),
                      str(d["refused"]), str(d["errors"]),
                      "-" if d["mean_abs_error"] is None else f"{100 * d['mean_abs_error']:.1f}%",
                      _pct(d["worst_error"]), _pct(d["median_signed_error"]))
    console.print(s)
    for peer, info in peers.items():
        console.print(f"{peer}: {info['checkout']} @ {info['commit']}; system: {info['system']}")


def main(
    simumax: Annotated[Path, typer.Option("--simumax", help="SimuMax checkout (holds simumax/)")],
    calculon: Annotated[Path, typer.Option("--calculon", help="Calculon checkout (holds calculon/)")],
    dev_set: Annotated[Path, typer.Option("--dev-set", help="dev_runs.jsonl (configs/ beside it)")] = DEFAULT_DEV_SET,
    json_out: Annotated[bool, typer.Option("--json", help="Print rows, summary and peers as one JSON object")] = False,
    inputs_dir: Annotated[Path | None, typer.Option("--save-inputs",
                                                       help="Also write every row's peer inputs here")] = None,
    json_file: Annotated[Path | None, typer.Option("--save-json",
                                                      help="Also write the --json object to this file")] = None,
) -> None:
    err = Console(stderr=True)
    for label, p in (("--dev-set", dev_set), ("--simumax", simumax), ("--calculon", calculon)):
        if not p.exists():
            err.print(f"{label} {p}: no such file or folder")
            raise typer.Exit(2)
    try:
        preds, peers = run_all(dev_set, simumax, calculon, err)
        if inputs_dir:
            save_inputs(dev_set, simumax, inputs_dir)
    except SystemExit as exc:  # a loader's one-line message (bad dev-set line, not a checkout)
        err.print(str(exc))
        raise typer.Exit(2) from None
    doc = json.dumps({
        "dev_set": str(dev_set), "dev_set_sha256": hashlib.sha256(dev_set.read_bytes()).hexdigest(),
        "date": datetime.date.today().isoformat(), "peers": peers,
        "rows": [{**asdict(p), "signed_error": p.signed_error} for p in preds],
        "summary": {peer: summarize([p for p in preds if p.peer == peer]) for peer in peers},
        "row_assumptions": {r.name: r.assumed for r in load_rows(dev_set)}}, indent=1)
    if json_file:
        json_file.write_text(doc + "\n", encoding="utf-8")
    if json_out:
        print(doc)
    else:
        render(preds, peers, Console(width=200))


if __name__ == "__main__":
    typer.run(main)
