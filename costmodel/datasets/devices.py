"""Map the device names used by the public datasets to ``DeviceSpec`` values.

The main catalogue (``costmodel.devices.get_device``) always wins. Devices it does not (yet) list are read
from ``costmodel/data/dataset_devices.yaml`` (datasheet figures, cited there) so the older GPUs of NeuSight
and DeepBench can still be featurised. Names that are neither are reported by :func:`resolve_many`.
"""
from __future__ import annotations

from functools import lru_cache
from importlib import resources

import yaml

from meshplan.costmodel.devices import DeviceSpec, get_device
from meshplan.core.errors import MeshplanError

# Dataset spelling -> canonical name (catalogue name or a dataset_devices.yaml name).
DATASET_NAMES: dict[str, str] = {
    # NeuSight (torch.cuda.get_device_name)
    "Tesla P4": "P4",
    "Tesla P100-PCIE-16GB": "P100-PCIE-16GB",
    "Tesla T4": "T4",
    "Tesla V100-PCIE-32GB": "V100-PCIE-32GB",
    "NVIDIA A100-PCIE-40GB": "A100-PCIE-40GB",
    "NVIDIA A100 80GB PCIe": "A100-80GB-PCIe",
    "NVIDIA L4": "L4",
    "NVIDIA H100 80GB HBM3": "H100-SXM",
    # Vidur folder names (compute on one GPU of an A100 DGX / H100 DGX; the SKU is not recorded per file,
    # PROVENANCE.md: treated as the SXM parts of those DGX systems)
    "a100": "A100-80GB",
    "h100": "H100-SXM",
    "a40": "A40",
    # DeepBench sheet names (the V100 sheets were measured on DGX-1 class SXM2 V100s)
    "NV_V100": "V100-SXM2",
    "NV_P100": "P100-PCIE-16GB",
    "NV_T4": "T4",
    "NV_M40": "M40",
    "NV_1080Ti": "GTX-1080Ti",
    "NV_TitanX": "TitanX-Maxwell",
    "NV_TitanX_Pascal": "TitanX-Pascal",
    "NV_TitanXp": "TitanXp",
}


@lru_cache(maxsize=1)
def _extra() -> dict[str, DeviceSpec]:
    text = resources.files("meshplan.costmodel").joinpath("data/dataset_devices.yaml").read_text(encoding="utf-8")
    out = {}
    for d in yaml.safe_load(text)["devices"]:
        out[d["name"].lower()] = DeviceSpec(
            name=d["name"], vendor=d["vendor"], peak_flops={k: float(v) for k, v in d["peak_flops"].items()},
            memory_bytes=int(float(d["memory_bytes"])), mem_bw_bytes_per_s=float(d["mem_bw_bytes_per_s"]),
            sm_count=int(d["sm_count"]), l2_bytes=int(float(d["l2_bytes"])), clock_hz=float(d["clock_hz"]),
            sources={"all": d.get("source", "")},
        )
    return out


_LOCAL: dict[str, DeviceSpec] = {}


def register_local(dev: DeviceSpec) -> None:
    """Make a measured device (this machine's CPU, from ``collect``) resolvable by name."""
    _LOCAL[dev.name.lower()] = dev


@lru_cache(maxsize=None)
def canonical(name: str) -> str:
    """Canonical spelling of a dataset device name: the catalogue's name when it knows the device, else the
    supplement's name (unchanged when there is no mapping)."""
    mapped = DATASET_NAMES.get(name, name)
    for cand in (mapped, name):
        try:
            return get_device(cand).name
        except MeshplanError:
            pass
    return mapped


def resolve(name: str) -> DeviceSpec:
    """DeviceSpec for a catalogue name/alias, a dataset spelling, a measured local device or a supplement.

    Raises:
        MeshplanError: the name is in none of them.
    """
    if name.lower() in _LOCAL:
        return _LOCAL[name.lower()]
    name = canonical(name)
    if name.lower() in _LOCAL:
        return _LOCAL[name.lower()]
    try:
        return get_device(name)
    except MeshplanError as exc:
        extra = _extra().get(name.lower())
        if extra is not None:
            return extra
        raise exc


def resolve_many(names) -> tuple[dict[str, DeviceSpec], list[str]]:
    """Resolve each distinct name; returns ``(found, missing)``."""
    found, missing = {}, []
    for n in sorted(set(names)):
        try:
            found[n] = resolve(n)
        except MeshplanError:
            missing.append(n)
    return found, missing
