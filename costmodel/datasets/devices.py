"""Device names of the training data: the devices ``collect`` measured (this machine's CPU), by name.

Spellings and the older GPUs of the public datasets are resolved by ``costmodel.devices.resolve``; this module adds
the measured devices of the collect folders loaded for training (``datasets.local.load_device`` registers each one
here), which no catalogue lists. Training-side only: a loaded model carries its measured devices itself
(``LearnedModel.measured_devices``).
"""
from __future__ import annotations

from meshplan.core.errors import MeshplanError
from meshplan.costmodel.devices import DeviceSpec, canonical, resolve as resolve_named

__all__ = ["canonical", "register_local", "resolve", "resolve_many"]

_LOCAL: dict[str, DeviceSpec] = {}


def register_local(dev: DeviceSpec) -> None:
    """Make a device measured by ``collect`` resolvable by name for the training data loaded in this process."""
    _LOCAL[dev.name.lower()] = dev


def resolve(name: str) -> DeviceSpec:
    """DeviceSpec for a catalogue name/alias, a dataset spelling, a measured local device or a supplement.

    Raises:
        MeshplanError: the name is in none of them.
    """
    return resolve_named(name, extra=_LOCAL.values())


def resolve_many(names) -> tuple[dict[str, DeviceSpec], list[str]]:
    """Resolve each distinct name; returns ``(found, missing)``."""
    found, missing = {}, []
    for n in sorted(set(names)):
        try:
            found[n] = resolve(n)
        except MeshplanError:
            missing.append(n)
    return found, missing
