"""Device names of the training data: catalogue names, dataset spellings, and the devices ``collect`` measured.

Spellings and the older GPUs of the public datasets are resolved by ``costmodel.devices.resolve``; the measured
devices of the collect folders loaded for training (``datasets.Dataset.measured``, this machine's CPU), which no
catalogue lists, are passed in by the caller. Training-side only: a loaded model carries its measured devices
itself (``LearnedModel.measured_devices``).
"""
from __future__ import annotations

from typing import Iterable

from meshplan.core.errors import MeshplanError
from meshplan.costmodel.devices import DeviceSpec, canonical
from meshplan.costmodel.devices import resolve as resolve_named

__all__ = ["canonical", "resolve", "resolve_many"]


def resolve(name: str, measured: Iterable[DeviceSpec] = ()) -> DeviceSpec:
    """DeviceSpec for a catalogue name/alias, a dataset spelling, one of ``measured`` or a supplement.

    Raises:
        MeshplanError: the name is in none of them.
    """
    return resolve_named(name, extra=measured)


def resolve_many(names, measured: Iterable[DeviceSpec] = ()) -> tuple[dict[str, DeviceSpec], list[str]]:
    """Resolve each distinct name (against the catalogues and ``measured``); returns ``(found, missing)``."""
    measured = tuple(measured)
    found, missing = {}, []
    for n in sorted(set(names)):
        try:
            found[n] = resolve(n, measured)
        except MeshplanError:
            missing.append(n)
    return found, missing
