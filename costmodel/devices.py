"""Device catalogue: ``DeviceSpec`` values loaded from ``costmodel/data/devices.yaml`` (data, with sources).

Units: FLOP/s (dense, no sparsity), bytes, bytes/s, Hz. Each figure's source is kept in the YAML ``sources`` map.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

import yaml

from planner.errors import MeshplanError


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator (or this machine's CPU for ``local:N`` clusters).

    Attributes:
        name: Canonical name, e.g. ``H100-SXM``.
        vendor: ``nvidia``, ``amd`` or ``cpu``.
        peak_flops: Dense peak FLOP/s per dtype (``fp32``, ``tf32``, ``fp16``, ``bf16``, ``fp8``, ``int8``, ``int4``).
            A dtype that is absent is not supported by the device.
        memory_bytes: Device memory, bytes.
        mem_bw_bytes_per_s: HBM/DRAM bandwidth, bytes/s.
        sm_count: Streaming multiprocessors (compute units on AMD, cores on CPU).
        l2_bytes: Last-level on-chip cache, bytes.
        clock_hz: Boost clock, Hz.
        family: Default node/link family (``dgx-h100``, ``dgx-a100``, ``pcie``, ...), see cluster presets.
        aliases: Other names accepted on the command line.
        sources: Figure name -> where it comes from (datasheet URL/title, table).
    """

    name: str
    vendor: str
    peak_flops: dict[str, float]
    memory_bytes: int
    mem_bw_bytes_per_s: float
    sm_count: int
    l2_bytes: int
    clock_hz: float
    family: str = "pcie"
    aliases: tuple[str, ...] = ()
    sources: dict[str, str] = field(default_factory=dict)

    def __hash__(self) -> int:  # dict fields are not hashable; the name is unique in the catalogue
        return hash(self.name)

    def supports(self, dtype: str) -> bool:
        return dtype in self.peak_flops

    def peak(self, dtype: str) -> float:
        """Peak dense FLOP/s for ``dtype``.

        Raises:
            MeshplanError: the device has no such math (e.g. fp8 on an A100).
        """
        try:
            return self.peak_flops[dtype]
        except KeyError:
            raise MeshplanError(
                f"device {self.name} does not support {dtype} (supports: {', '.join(sorted(self.peak_flops))})"
            ) from None


def _from_dict(d: dict) -> DeviceSpec:
    return DeviceSpec(
        name=d["name"],
        vendor=d["vendor"],
        peak_flops={k: float(v) for k, v in d["peak_flops"].items()},
        memory_bytes=int(float(d["memory_bytes"])),
        mem_bw_bytes_per_s=float(d["mem_bw_bytes_per_s"]),
        sm_count=int(d["sm_count"]),
        l2_bytes=int(float(d["l2_bytes"])),
        clock_hz=float(d["clock_hz"]),
        family=d.get("family", "pcie"),
        aliases=tuple(d.get("aliases", ())),
        sources=dict(d.get("sources", {})),
    )


@lru_cache(maxsize=1)
def catalogue() -> dict[str, DeviceSpec]:
    """All devices keyed by canonical name."""
    text = resources.files("costmodel").joinpath("data/devices.yaml").read_text(encoding="utf-8")
    return {d["name"]: _from_dict(d) for d in yaml.safe_load(text)["devices"]}


def _norm(s: str) -> str:
    return s.lower().replace("_", "-").replace(" ", "-")


def get_device(name: str) -> DeviceSpec:
    """Look a device up by canonical name or alias (case-insensitive).

    Raises:
        MeshplanError: unknown device; the message lists the known names.
    """
    key = _norm(name)
    for dev in catalogue().values():
        if key == _norm(dev.name) or key in (_norm(a) for a in dev.aliases):
            return dev
    raise MeshplanError(f"unknown device '{name}' (known: {', '.join(catalogue())})")


def register_device(dev: DeviceSpec) -> None:
    """Add a device measured at run time (e.g. this host's CPU for ``local:N``) to the catalogue."""
    catalogue()[dev.name] = dev
