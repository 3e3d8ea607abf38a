"""Device catalogue: ``DeviceSpec`` values loaded from ``costmodel/data/devices.yaml`` (data, with sources).

Units: FLOP/s (dense, no sparsity), bytes, bytes/s, Hz. Each figure's source is kept in the YAML ``sources`` map.
The catalogue is read-only: a device measured at run time (this host's CPU from ``planner.host.calibrate``, a CPU a
model was trained on) is passed where it is needed (``get_device(name, extra=...)``), never added to it.
Dataset spellings (``Tesla T4``, ``NV_V100``) and the older GPUs of the public datasets
(``costmodel/data/dataset_devices.yaml``) resolve through :func:`resolve`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from types import MappingProxyType
from typing import Iterable, Mapping

from meshplan.core.errors import MeshplanError
from meshplan.core.yamlio import load_packaged


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator (or this machine's CPU for ``local:N`` clusters).

    Attributes:
        name: Canonical name, e.g. ``H100-SXM``.
        vendor: ``nvidia``, ``amd`` or ``cpu``.
        peak_flops: Dense peak FLOP/s per dtype (``fp32``, ``tf32``, ``fp16``, ``bf16``, ``fp8``, ``mxfp8``,
            ``nvfp4``, ``int8``, ``int4``); ``mxfp8`` and ``nvfp4`` are the block-scaled tensor-core kinds of
            Blackwell. A dtype that is absent is not supported by the device.
        memory_bytes: Device memory, bytes.
        mem_bw_bytes_per_s: HBM/DRAM bandwidth, bytes/s.
        sm_count: Streaming multiprocessors (compute units on AMD, cores on CPU).
        l2_bytes: Last-level on-chip cache, bytes.
        clock_hz: Boost clock, Hz.
        base_clock_hz: Datasheet base clock, Hz (0 = not published). With ``tdp_w`` it gives the clock a dense
            GEMM sustains under the board power limit (:meth:`sustained_clock_hz`).
        tdp_w: Board power limit (TDP / max board power), watts (0 = not published).
        host_bw_bytes_per_s: The link to host memory, bytes/s in one direction for one GPU while every GPU of its
            node copies at once (0 = not in the catalogue): what activation offloading's device-to-host and
            host-to-device copies run at.
        host_cpu: The CPU that launches the device's work: ``grace`` (NVIDIA Grace over NVLink-C2C: GH200, GB200,
            GB300 superchips) or ``x86`` (the default: DGX / HGX and PCIe hosts). What one framework op costs the
            host differs between them (``planner.estimate.host_wait``).
        family: Default node/link family (``dgx-h100``, ``dgx-a100``, ``pcie``, ...), see cluster presets.
        launch_s: Fixed cost of one op call, seconds (framework dispatch + launch; ``collect`` measures it on this
            machine's CPU). 0 = not measured: GPUs use ``costmodel.api.KERNEL_LAUNCH_S`` in the calibrated roofline.
        aliases: Other names accepted on the command line.
        sources: Figure name -> where it comes from (datasheet URL/title, table).
    """

    name: str
    vendor: str
    peak_flops: Mapping[str, float]
    memory_bytes: int
    mem_bw_bytes_per_s: float
    sm_count: int
    l2_bytes: int
    clock_hz: float
    family: str = "pcie"
    launch_s: float = 0.0
    base_clock_hz: float = 0.0
    tdp_w: float = 0.0
    host_bw_bytes_per_s: float = 0.0
    host_cpu: str = "x86"
    aliases: tuple[str, ...] = ()
    sources: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Read-only views of copies: a spec handed out by the cached catalogue cannot be changed by its reader.
        for name in ("peak_flops", "sources"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))

    def __getstate__(self) -> dict:  # pickle and deepcopy cannot copy a mappingproxy: hand them plain dicts
        return {k: dict(v) if isinstance(v, MappingProxyType) else v for k, v in self.__dict__.items()}

    def __setstate__(self, state: dict) -> None:
        for k, v in state.items():
            object.__setattr__(self, k, v)
        self.__post_init__()

    def __hash__(self) -> int:  # mapping fields are not hashable; the name is unique in the catalogue
        return hash(self.name)

    @property
    def sustained_clock_hz(self) -> float:
        """Clock a long dense GEMM sustains, Hz: the base clock on boards limited to PCIe slot power
        (``tdp_w <= SLOT_POWER_W``: Tesla P4, T4, L4 — passively cooled, no auxiliary power connector), the boost
        clock otherwise (or when the base clock / TDP is not published).

        NVIDIA specifies the base clock as the clock held at the board power limit under a sustained full load;
        the boost clock is opportunistic. Measured fp32 GEMMs above 2^36 FLOPs (NeuSight) reach a median 0.34
        (L4) and 0.39 (T4) of the boost-clock peak against base/boost = 0.39 / 0.37, while 250-700 W boards reach
        0.67-0.90 of it (costmodel/data/model/README.md, "Unseen GPUs").
        """
        if self.base_clock_hz > 0 and 0 < self.tdp_w <= SLOT_POWER_W:
            return min(self.base_clock_hz, self.clock_hz)
        return self.clock_hz

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


VENDORS = ("nvidia", "amd", "cpu")
DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8", "mxfp8", "nvfp4", "int8", "int4")
_REQUIRED = ("name", "vendor", "peak_flops", "memory_bytes", "mem_bw_bytes_per_s", "sm_count", "l2_bytes", "clock_hz")
_OPTIONAL = ("family", "aliases", "sources", "launch_s", "base_clock_hz", "tdp_w", "host_bw_bytes_per_s", "host_cpu")
HOST_CPUS = ("x86", "grace")
# PCIe CEM slot power, watts: a board drawing no more has no auxiliary power connector and (P4/T4/L4) passive
# cooling, and runs dense math at its base clock (``DeviceSpec.sustained_clock_hz``). PCI Express Card
# Electromechanical Specification rev. 4.0, sec. 4.2: 75 W for a x16 graphics card from the slot.
SLOT_POWER_W = 75.0


def _positive(origin: str, name: str, key: str, value, cast):
    try:
        v = cast(float(value))
    except (TypeError, ValueError):
        raise MeshplanError(f"{origin}: device {name}: {key} must be a number, got {value!r}") from None
    if not v > 0:
        raise MeshplanError(f"{origin}: device {name}: {key} must be positive, got {value!r}")
    return v


def device_from_dict(d: dict, origin: str = "devices.yaml") -> DeviceSpec:
    """Build a validated ``DeviceSpec`` from a catalogue entry (or a cached calibration of this host's CPU).

    Args:
        d: Mapping with the ``DeviceSpec`` fields; units as in the class docstring.
        origin: File or source named in error messages.

    Raises:
        MeshplanError: missing/unknown key, unknown vendor or dtype, a non-positive figure.
    """
    if not isinstance(d, dict):
        raise MeshplanError(f"{origin}: a device entry must be a mapping, got {type(d).__name__}")
    name = str(d.get("name", "?"))
    missing = [k for k in _REQUIRED if k not in d]
    if missing:
        raise MeshplanError(f"{origin}: device {name}: missing {', '.join(missing)}")
    unknown = sorted(set(d) - set(_REQUIRED) - set(_OPTIONAL))
    if unknown:
        raise MeshplanError(f"{origin}: device {name}: unknown key(s) {', '.join(unknown)}")
    if d["vendor"] not in VENDORS:
        raise MeshplanError(f"{origin}: device {name}: vendor must be one of {', '.join(VENDORS)}, got {d['vendor']!r}")
    flops = d["peak_flops"]
    if not isinstance(flops, dict) or not flops:
        raise MeshplanError(f"{origin}: device {name}: peak_flops must map dtype -> FLOP/s")
    if d.get("host_cpu", "x86") not in HOST_CPUS:
        raise MeshplanError(f"{origin}: device {name}: host_cpu must be one of {', '.join(HOST_CPUS)}, "
                            f"got {d['host_cpu']!r}")
    bad = sorted(set(flops) - set(DTYPES))
    if bad:
        raise MeshplanError(f"{origin}: device {name}: unknown dtype(s) {', '.join(bad)} (known: {', '.join(DTYPES)})")
    return DeviceSpec(
        name=name,
        vendor=d["vendor"],
        peak_flops={k: _positive(origin, name, f"peak_flops.{k}", v, float) for k, v in flops.items()},
        memory_bytes=_positive(origin, name, "memory_bytes", d["memory_bytes"], int),
        mem_bw_bytes_per_s=_positive(origin, name, "mem_bw_bytes_per_s", d["mem_bw_bytes_per_s"], float),
        sm_count=_positive(origin, name, "sm_count", d["sm_count"], int),
        l2_bytes=_positive(origin, name, "l2_bytes", d["l2_bytes"], int),
        clock_hz=_positive(origin, name, "clock_hz", d["clock_hz"], float),
        family=str(d.get("family", "pcie")),
        launch_s=_positive(origin, name, "launch_s", d["launch_s"], float) if "launch_s" in d else 0.0,
        base_clock_hz=(_positive(origin, name, "base_clock_hz", d["base_clock_hz"], float)
                       if "base_clock_hz" in d else 0.0),
        tdp_w=_positive(origin, name, "tdp_w", d["tdp_w"], float) if "tdp_w" in d else 0.0,
        host_bw_bytes_per_s=(_positive(origin, name, "host_bw_bytes_per_s", d["host_bw_bytes_per_s"], float)
                             if "host_bw_bytes_per_s" in d else 0.0),
        host_cpu=str(d.get("host_cpu", "x86")),
        aliases=tuple(str(a) for a in d.get("aliases", ()) or ()),
        sources={str(k): str(v) for k, v in (d.get("sources") or {}).items()},
    )


def device_to_dict(dev: DeviceSpec) -> dict:
    """Plain-data form of a device (YAML/JSON friendly; inverse of :func:`device_from_dict`)."""
    return {
        "name": dev.name,
        "vendor": dev.vendor,
        "family": dev.family,
        "aliases": list(dev.aliases),
        "peak_flops": dict(dev.peak_flops),
        "memory_bytes": dev.memory_bytes,
        "mem_bw_bytes_per_s": dev.mem_bw_bytes_per_s,
        "sm_count": dev.sm_count,
        "l2_bytes": dev.l2_bytes,
        "clock_hz": dev.clock_hz,
        **({"launch_s": dev.launch_s} if dev.launch_s else {}),
        **({"base_clock_hz": dev.base_clock_hz} if dev.base_clock_hz else {}),
        **({"tdp_w": dev.tdp_w} if dev.tdp_w else {}),
        **({"host_bw_bytes_per_s": dev.host_bw_bytes_per_s} if dev.host_bw_bytes_per_s else {}),
        **({"host_cpu": dev.host_cpu} if dev.host_cpu != "x86" else {}),
        "sources": dict(dev.sources),
    }


@lru_cache(maxsize=1)
def catalogue() -> Mapping[str, DeviceSpec]:
    """All devices of the packaged catalogue, keyed by canonical name (read-only: the value is cached).

    Raises:
        MeshplanError: the packaged file is malformed or two devices share a name or alias.
    """
    origin = "costmodel/data/devices.yaml"
    text = resources.files("meshplan.costmodel").joinpath("data/devices.yaml").read_text(encoding="utf-8")
    out: dict[str, DeviceSpec] = {}
    seen: dict[str, str] = {}
    for d in load_packaged(text)["devices"]:
        dev = device_from_dict(d, origin)
        for key in (dev.name, *dev.aliases):
            owner = seen.setdefault(_norm(key), dev.name)
            if owner != dev.name:
                raise MeshplanError(f"{origin}: name/alias '{key}' of {dev.name} is already used by {owner}")
        out[dev.name] = dev
    return MappingProxyType(out)


def _norm(s: str) -> str:
    return s.lower().replace("_", "-").replace(" ", "-")


def get_device(name: str, extra: Iterable[DeviceSpec] = ()) -> DeviceSpec:
    """Look a device up by canonical name or alias (case-insensitive; ``_``, ``-`` and spaces are equivalent).

    Args:
        name: What the user wrote.
        extra: Devices measured at run time that may be meant too (this host's ``cpu-local`` calibration).

    Raises:
        MeshplanError: unknown device; the message suggests the closest name and lists the known ones.
    """
    key = _norm(name)
    extra = tuple(extra)
    for dev in (*catalogue().values(), *extra):
        if key == _norm(dev.name) or key in (_norm(a) for a in dev.aliases):
            return dev
    import difflib

    names = [*catalogue(), *(d.name for d in extra)]
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    hint = f"did you mean {close[0]}? " if close else ""
    raise MeshplanError(f"unknown device '{name}' ({hint}known: {', '.join(names)})")


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
def dataset_supplement() -> Mapping[str, DeviceSpec]:
    """Older GPUs of the public datasets (``data/dataset_devices.yaml``, datasheet figures), by lower-case name
    (read-only: the value is cached)."""
    text = resources.files("meshplan.costmodel").joinpath("data/dataset_devices.yaml").read_text(encoding="utf-8")
    out = {}
    for d in load_packaged(text)["devices"]:
        out[d["name"].lower()] = DeviceSpec(
            name=d["name"], vendor=d["vendor"], peak_flops={k: float(v) for k, v in d["peak_flops"].items()},
            memory_bytes=int(float(d["memory_bytes"])), mem_bw_bytes_per_s=float(d["mem_bw_bytes_per_s"]),
            sm_count=int(d["sm_count"]), l2_bytes=int(float(d["l2_bytes"])), clock_hz=float(d["clock_hz"]),
            base_clock_hz=float(d.get("base_clock_hz", 0.0)), tdp_w=float(d.get("tdp_w", 0.0)),
            sources={"all": d.get("source", "")},
        )
    return MappingProxyType(out)


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


def resolve(name: str, extra: Iterable[DeviceSpec] = ()) -> DeviceSpec:
    """DeviceSpec for a catalogue name/alias, a dataset spelling, one of ``extra`` (measured devices, matched by
    name) or a dataset supplement device.

    Raises:
        MeshplanError: the name is in none of them.
    """
    measured = {d.name.lower(): d for d in extra}
    for n in (name, canonical(name)):
        if n.lower() in measured:
            return measured[n.lower()]
    name = canonical(name)
    try:
        return get_device(name)
    except MeshplanError as exc:
        found = dataset_supplement().get(name.lower())
        if found is not None:
            return found
        raise exc
