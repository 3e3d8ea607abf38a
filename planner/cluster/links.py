"""Link families: each node type's links (``planner/presets/clusters/links.yaml``, with sources and the efficiency
factors applied), and the per-GPU share of a node's network. Bandwidths are bytes/s per rank and per direction
(nccl-tests "bus bandwidth"), latencies seconds.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from types import MappingProxyType
from typing import Mapping

from meshplan.core.errors import MeshplanError
from meshplan.core.yamlio import load_packaged
from meshplan.costmodel.collectives import Link

PRESET_DIR = "presets/clusters"


@dataclass(frozen=True)
class LinkFamily:
    """One node type's links (see ``links.yaml``).

    Attributes:
        name: Family key, e.g. ``dgx-h100``.
        intra: Achievable GPU-to-GPU link inside a node (bytes/s per direction, latency s).
        nic_line_bytes_per_s: Line rate of one NIC, bytes/s.
        nic_efficiency: Fraction of the line rate a large NCCL transfer reaches (see links.yaml).
        nics_per_node: NICs per node.
        inter_name: Name of the network link.
        inter_latency_s: Network alpha, seconds.
        nvlink_domain_gpus: GPUs that share one NVLink domain when it is wider than a node (72 for the NVL72
            racks, whose compute trays hold 4); 0 = the node.
        nvlink_domain_max_gpus: The widest NVLink domain the family's systems build (the NVL72 racks: 72; the
            H100's NVLink Switch System: 256); 0 = the node: NVLink does not leave it.
        nvlink_domain_note: What a cluster refused for a wider domain is told beside the limit.
    """

    name: str
    intra: Link
    nic_line_bytes_per_s: float
    nic_efficiency: float
    nics_per_node: int
    inter_name: str
    inter_latency_s: float
    nvlink_domain_gpus: int = 0
    nvlink_domain_max_gpus: int = 0
    nvlink_domain_note: str = ""

    def inter_link(self, devices_per_node: int) -> Link:
        """Per-GPU share of the node's network (a GPU uses at most one NIC)."""
        return Link(self.inter_name, nic_share_bytes_per_s(self.nic_line_bytes_per_s, self.nic_efficiency,
                                                          self.nics_per_node, devices_per_node),
                    self.inter_latency_s)


def nic_share_bytes_per_s(line_bytes_per_s: float, efficiency: float, nics_per_node: int,
                          devices_per_node: int) -> float:
    """Achievable network bandwidth per GPU: line rate x efficiency x min(1, NICs / GPUs per node), bytes/s."""
    return line_bytes_per_s * efficiency * min(1.0, nics_per_node / devices_per_node)


@lru_cache(maxsize=1)
def link_families() -> Mapping[str, LinkFamily]:
    """All link families from the packaged ``links.yaml``, keyed by family name (read-only: it is cached)."""
    text = resources.files("meshplan.planner").joinpath(PRESET_DIR, "links.yaml").read_text(encoding="utf-8")
    out = {}
    for key, fam in load_packaged(text)["families"].items():
        intra, inter = fam["intra"], fam["inter"]
        out[key] = LinkFamily(
            name=key,
            intra=Link(intra["name"], float(intra["nominal_gbytes_per_s"]) * 1e9 * float(intra["efficiency"]),
                       float(intra["latency_us"]) / 1e6),
            nic_line_bytes_per_s=float(inter["nic_gbits_per_s"]) * 1e9 / 8,
            nic_efficiency=float(inter["efficiency"]),
            nics_per_node=int(inter["nics_per_node"]),
            inter_name=inter["name"],
            inter_latency_s=float(inter["latency_us"]) / 1e6,
            nvlink_domain_gpus=int(fam.get("nvlink_domain_gpus", 0)),
            nvlink_domain_max_gpus=int(fam.get("nvlink_domain_max_gpus", 0)),
            nvlink_domain_note=str(fam.get("nvlink_domain_note", "")),
        )
    return MappingProxyType(out)


def get_family(name: str, where: str = "link family") -> LinkFamily:
    """The link family ``name`` from ``links.yaml``.

    Raises:
        MeshplanError: unknown family; names ``where`` it was asked for and the closest known family.
    """
    fams = link_families()
    if name not in fams:
        close = difflib.get_close_matches(name, list(fams), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise MeshplanError(f"{where}: unknown link family '{name}'{hint}; known: {', '.join(fams)}")
    return fams[name]
