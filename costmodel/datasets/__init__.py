"""Loaders for the public kernel-latency datasets and this machine's measurements, into one ``KernelTable``.

``load(paths)`` accepts dataset roots (the repository's ``data/kernels`` or one of its sub-folders, or a
``collect`` output folder) and dispatches to the matching loader by what the folder contains. The loaders import
only ``table`` and ``devices`` of this package, never the package itself, so the package imports them plainly.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from meshplan.core.errors import MeshplanError
from meshplan.costmodel.datasets import deepbench, local, neusight, vidur
from meshplan.costmodel.datasets.table import MEDIAN_LATENCY_BAND_S, KernelTable
from meshplan.costmodel.devices import DeviceSpec

__all__ = ["Dataset", "KernelTable", "MEDIAN_LATENCY_BAND_S", "load"]


@dataclass(frozen=True)
class Dataset:
    """What ``load`` read.

    Attributes:
        table: The normalised rows of every dataset found.
        files: The files read (for hashing), in load order.
        measured: The devices ``collect`` measured (each folder's ``device.json``), which no catalogue lists:
            pass them to ``datasets.devices.resolve`` / ``train.prepare`` so the rows measured on them resolve.
    """

    table: KernelTable
    files: tuple[str, ...]
    measured: tuple[DeviceSpec, ...] = ()


def load(paths: list[str | Path], collectives: bool = True) -> Dataset:
    """Load every dataset found under ``paths``.

    Args:
        paths: Folders: ``data/kernels`` (all of NeuSight, Vidur, DeepBench), one dataset folder
            (``.../neusight``), or a ``meshplan costmodel collect`` output folder.
        collectives: Also load collective (network) rows.

    Raises:
        MeshplanError: a path that is no dataset, a missing column or a unit mismatch.
    """
    tables, files, measured = [], [], []
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
            t, f, dev = local.load(p)
            tables.append(t)
            files += f
            measured.append(dev)
            found = True
        if not found:
            raise MeshplanError(f"{p}: no known dataset here (expected neusight/, vidur/, deepbench/ or local.csv)")
    return Dataset(KernelTable.concat(tables), tuple(str(f) for f in files), tuple(measured))
