"""The cluster YAML file as typed pydantic models (schema: ``planner/presets/clusters/README.md``; JSON Schema:
``docs/schemas/cluster.schema.json``). ``planner.cluster.spec`` turns a validated file into a ``ClusterSpec``.

Every problem becomes one ``MeshplanError`` naming the file and the field (``c.yaml: groups[0]: unknown key
'devices_per_nod' (did you mean 'devices_per_node'?)``). Numbers are bounded by what exists: a node holds at most
576 accelerators (NVL576, the largest NVLink domain announced), a job at most 2^24 of them.
"""
from __future__ import annotations

import difflib
import math
from typing import Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from meshplan.core.errors import MeshplanError

MAX_DEVICES_PER_NODE = 576  # NVIDIA NVL576 (Vera Rubin Ultra), the largest single NVLink domain announced
MAX_NODES = 2**24  # no job has come near 16.8M nodes; a larger count is a typo

Bandwidth = Union[float, str]  # a bare number is bytes/s; "25Gbps", "50GB/s" (core.units.parse_bandwidth)


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _positive_finite(key: str, v):
    if v is None:
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{key} must be a finite number, got {v!r}")
    if not v > 0:
        raise ValueError(f"{key} must be positive, got {v!r}")
    return v


def _whole(key: str, v, most: int):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v != int(v) or v < 1:
        raise ValueError(f"{key} must be a whole number >= 1, got {v!r}")
    if v > most:
        raise ValueError(f"{key} must be at most {most}, got {v!r}")
    return int(v)


class IntraLinkFile(_File):
    """A node group's link between its devices (default: the device family's)."""

    family: Optional[str] = None
    """Start from this link family of ``links.yaml`` (e.g. ``dgx-a100``, ``pcie-gen4``)."""
    name: Optional[str] = None
    bandwidth: Optional[Bandwidth] = None
    """Achievable per-GPU, per-direction bandwidth: ``240GB/s``, or a bare number of bytes/s."""
    latency_us: Optional[float] = None
    """Per-message latency, microseconds."""

    @field_validator("latency_us", mode="before")
    @classmethod
    def _latency(cls, v):
        return _positive_finite("latency_us", v)


class InterLinkFile(IntraLinkFile):
    """The network between nodes (default: each group's device family)."""

    nic: Optional[Bandwidth] = None
    """One NIC's line rate, e.g. ``400Gbps``."""
    nics_per_node: Optional[int] = None
    efficiency: Optional[float] = None
    """Fraction of the line rate reached, in (0, 1]."""

    @field_validator("nics_per_node", mode="before")
    @classmethod
    def _nics(cls, v):
        return None if v is None else _whole("nics_per_node", v, MAX_DEVICES_PER_NODE)

    @field_validator("efficiency", mode="before")
    @classmethod
    def _eff(cls, v):
        v = _positive_finite("efficiency", v)
        if v is not None and v > 1:
            raise ValueError(f"efficiency must be in (0, 1], got {v}")
        return v


class GroupFile(_File):
    """Nodes of one kind: ``nodes`` x ``devices_per_node`` devices of one type."""

    nodes: int
    devices_per_node: int
    device: str
    """A catalogue name or alias (``meshplan devices``)."""
    intra_link: Optional[IntraLinkFile] = None
    nvlink_domain: Optional[int] = None
    """GPUs in one NVLink domain when it spans several nodes (72: an NVL72 rack of 18 trays x 4 GPUs); a multiple
    of devices_per_node. Absent: the device family's own (72 for GB200 / GB300), else the node."""

    @field_validator("nodes", mode="before")
    @classmethod
    def _nodes(cls, v):
        return _whole("nodes", v, MAX_NODES)

    @field_validator("devices_per_node", mode="before")
    @classmethod
    def _dpn(cls, v):
        return _whole("devices_per_node", v, MAX_DEVICES_PER_NODE)

    @field_validator("nvlink_domain", mode="before")
    @classmethod
    def _domain(cls, v):
        return None if v is None else _whole("nvlink_domain", v, MAX_DEVICES_PER_NODE)

    @field_validator("device", mode="before")
    @classmethod
    def _device(cls, v):
        if not isinstance(v, (str, int)) or isinstance(v, bool) or not str(v).strip():
            raise ValueError(f"device must be a device name, got {v!r}")
        return str(v)


class ClusterFile(_File):
    """A cluster YAML file: node groups (ranks numbered group by group, node-major) and the network between them."""

    name: Optional[str] = None
    description: Optional[str] = None
    groups: list[GroupFile] = Field(min_length=1, max_length=1024)
    """One or more node groups."""
    inter_link: Optional[InterLinkFile] = None


_MODELS = {"": ClusterFile, "groups": GroupFile, "intra_link": IntraLinkFile, "inter_link": InterLinkFile}


def _where(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def parse_cluster_file(data, where: str) -> ClusterFile:
    """Validate the parsed YAML of a cluster file.

    Raises:
        MeshplanError: one line naming ``where`` and the field (with the closest valid key for a misspelt one).
    """
    if not isinstance(data, dict):
        raise MeshplanError(f"{where}: expected a mapping, got {type(data).__name__}")
    if not isinstance(data.get("groups"), list) or not data.get("groups"):
        unknown = [k for k in data if k not in ClusterFile.model_fields]
        if not unknown:
            raise MeshplanError(f"{where}: 'groups' must be a non-empty list of node groups")
    try:
        return ClusterFile.model_validate(data)
    except ValidationError as exc:
        errs = exc.errors()  # a misspelt key first: it explains the "missing" key it was meant to be
        err = next((e for e in errs if e["type"] == "extra_forbidden"), errs[0])
        loc = tuple(err["loc"])
        if err["type"] == "extra_forbidden":
            key = str(loc[-1])
            parent = next((p for p in reversed(loc[:-1]) if isinstance(p, str)), "")
            allowed = list(_MODELS[parent].model_fields)
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"valid keys: {', '.join(allowed)}"
            at = _where(loc[:-1])
            raise MeshplanError(f"{where}: {at + ': ' if at else ''}unknown key '{key}' ({hint})") from None
        if err["type"] == "missing":
            raise MeshplanError(f"{where}: {_where(loc[:-1])}: missing '{loc[-1]}'") from None
        msg = str(err["msg"]).removeprefix("Value error, ")
        if loc == ("groups",):
            msg = f"'groups' must be a non-empty list of at most 1024 node groups ({msg})"
            raise MeshplanError(f"{where}: {msg}") from None
        raise MeshplanError(f"{where}: {_where(loc[:-1]) or _where(loc)}: {msg}") from None


def cluster_file_schema() -> dict:
    """JSON Schema of the cluster YAML file (published as ``docs/schemas/cluster.schema.json``)."""
    return ClusterFile.model_json_schema()
