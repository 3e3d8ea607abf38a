"""Retrain some op classes of the shipped cost model in place, the others untouched.

`meshplan costmodel train --data data/kernels --out DIR` retrains every class; a change that moves rows between
classes (e.g. Vidur's fused SwiGLU from "activation" to "swiglu") needs only those classes refitted, and refitting
the GEMM classes would move issue 4's NeuSight gates for nothing. Same code path as `train` (``prepare``,
``train_models`` with the default row cap, same seeds), so the refitted classes equal a full retrain's.

    python bench/retrain_kinds.py --kinds activation,swiglu [--model costmodel/data/model] [--data data/kernels]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(kinds: Annotated[str, typer.Option(help="Comma-separated op classes to refit")],
         model: Annotated[Path, typer.Option(help="Model folder to update")] = ROOT / "costmodel" / "data" / "model",
         data: Annotated[Path, typer.Option(help="Dataset root")] = ROOT / "data" / "kernels") -> None:
    from meshplan.core.atomic import write_atomic
    from meshplan.costmodel.datasets import load
    from meshplan.costmodel.learned import save_kind
    from meshplan.costmodel.ops import COMPUTE_KINDS
    from meshplan.costmodel.train import DEFAULT_MAX_ROWS, data_hashes, prepare, train_models

    wanted = tuple(k.strip() for k in kinds.split(",") if k.strip())
    unknown = [k for k in wanted if k not in COMPUTE_KINDS]
    if unknown or not wanted:
        raise SystemExit(f"--kinds: '{unknown[0] if unknown else kinds}' is not an op class "
                         f"(known: {', '.join(COMPUTE_KINDS)})")
    meta = json.loads((model / "metadata.json").read_text(encoding="utf-8"))
    ds = load([data])
    hashes = [{"file": f, "sha256": h} for f, h in data_hashes(list(ds.files), [data])]
    if hashes != meta["data"]:
        raise SystemExit(f"{data}: not the data the model in {model} was trained on (sha256 differ)")
    fresh = train_models(prepare(ds.table, ds.measured), max_rows_per_kind=DEFAULT_MAX_ROWS, kinds=wanted)
    out = Table(title=f"refitted classes of {model.name}")
    for col in ("class", "rows", "devices", "train MAPE %", "before"):
        out.add_column(col)
    for kind in wanted:
        before = meta["kinds"].pop(kind, None)
        if kind not in fresh:  # no rows left in this class: drop it
            (model / f"{kind}.ubj").unlink(missing_ok=True)
            (model / f"{kind}.npz").unlink(missing_ok=True)
            out.add_row(kind, "0", "-", "-", f"{before['train_mape']:.1f}" if before else "-")
            continue
        m = fresh[kind]
        meta["kinds"][kind] = {k: v for k, v in m.items() if k != "model"} | save_kind(model, kind, m["model"])
        out.add_row(kind, str(m["n_train"]), ", ".join(m["devices"]), f"{m['train_mape']:.1f}",
                    f"{before['train_mape']:.1f} ({before['n_train']} rows)" if before else "new class")
    write_atomic(model / "metadata.json", json.dumps(meta, indent=1, sort_keys=True))
    Console().print(out)


if __name__ == "__main__":
    typer.run(main)
