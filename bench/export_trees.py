"""Write the numpy trees (``<kind>.npz``, what predicts: ``costmodel.trees``) of a model folder trained before
``meshplan costmodel train`` saved them with the boosters, and record their sha256 in its ``metadata.json``.
The ``.ubj`` files stay byte for byte (the model id is unchanged); each class's trees are first checked to predict
exactly as xgboost on rows that sit on and beside every split threshold (``costmodel.train.export_trees``).

    python bench/export_trees.py [--model costmodel/data/model]
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(model: Annotated[Path, typer.Option(help="Model folder to update")] = ROOT / "costmodel" / "data" / "model"
         ) -> None:
    from meshplan.core.errors import MeshplanError
    from meshplan.costmodel.train import export_trees

    try:
        done = export_trees(model)
    except MeshplanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    for kind, sha in done.items():
        print(f"{kind}: {model / (kind + '.npz')} sha256 {sha}")


if __name__ == "__main__":
    typer.run(main)
