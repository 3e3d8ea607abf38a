"""Loaders for the public kernel-latency datasets and this machine's measurements, into one ``KernelTable``.

``load(paths)`` accepts dataset roots (``../shared/kernels`` or one of its sub-folders, or a ``collect``
output folder) and dispatches to the matching loader by what the folder contains.
"""
from __future__ import annotations

from pathlib import Path

from meshplan.costmodel.datasets.table import KernelTable
from meshplan.core.errors import MeshplanError

# Plausible median single-op GPU/CPU latency, seconds. A median outside this band means the file's unit is
# not the one the loader assumes (e.g. microseconds read as milliseconds gives a 1000x larger median).
MEDIAN_LATENCY_BAND_S = (2e-6, 0.1)


def load(paths: list[str | Path], collectives: bool = True) -> tuple[KernelTable, list[str]]:
    """Load every dataset found under ``paths``.

    Args:
        paths: Folders: ``../shared/kernels`` (all of NeuSight, Vidur, DeepBench), one dataset folder
            (``.../neusight``), or a ``meshplan costmodel collect`` output folder.
        collectives: Also load collective (network) rows.

    Returns:
        ``(table, files)``: the normalised table and the list of files read (for hashing).

    Raises:
        MeshplanError: a path that is no dataset, a missing column or a unit mismatch.
    """
    from meshplan.costmodel.datasets import deepbench, local, neusight, vidur

    tables, files = [], []
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise MeshplanError(f"{p}: dataset folder not found")
        found = False
        for name, mod in (("neusight", neusight), ("vidur", vidur), ("deepbench", deepbench)):
            root = p if p.name == name else p / name
            if mod.is_dataset(root):
                t, f = mod.load(root, collectives=collectives)
                tables.append(t)
                files += f
                found = True
        if local.is_dataset(p):
            t, f = local.load(p)
            tables.append(t)
            files += f
            found = True
        if not found:
            raise MeshplanError(f"{p}: no known dataset here (expected neusight/, vidur/, deepbench/ or local.csv)")
    return KernelTable.concat(tables), files
