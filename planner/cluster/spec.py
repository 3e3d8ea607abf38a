"""Clusters: groups of nodes x devices with their intra-node and inter-node links.

A cluster comes from a shorthand (``16x8xH100``, ``8xA100``, ``4xT4+1xA100``, ``2x8xA100+4x4xL4``, ``local:2``),
a YAML file, or a bundled preset name (``dgx-h100-16``, see ``planner/presets/clusters/``). Link figures come from
``planner/presets/clusters/links.yaml`` (families of nodes, with sources and the efficiency factors applied).
``local:N`` is built from this host's calibration, which the caller passes in (``planner.host.calibrate``): reading a
cluster never measures anything.

Ranks are numbered node-major inside each group: rank ``r`` lives on node ``r // devices_per_node`` and in NVLink
domain ``r // nvlink_domain``. A domain is a node unless the cluster says otherwise: an NVL72 rack joins 18 compute
trays of 4 GPUs (``64x4xGB200-NVL72``, or ``nvlink_domain: 72`` in YAML), so ranks 0-71 share NVLink and rank 72
starts the next rack. With Megatron's rank order (tp fastest, then cp, dp, pp) a parallel group of ``size`` ranks
``stride`` apart spans ``size * stride`` consecutive ranks: whether it stays inside a domain follows from its stride
alone, so placing tp (stride 1), then cp, then dp inside a rack is the order the degrees already imply.
Bandwidths are bytes/s per rank and per direction (the "bus bandwidth" of nccl-tests), latencies seconds.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path

from meshplan.core.errors import MeshplanError
from meshplan.core.units import parse_bandwidth
from meshplan.core.yamlio import load_yaml_file
from meshplan.costmodel.collectives import Link
from meshplan.costmodel.devices import DeviceSpec, get_device
from meshplan.planner.cluster.file import MAX_DEVICES_PER_NODE, InterLinkFile, IntraLinkFile, parse_cluster_file
from meshplan.planner.cluster.links import PRESET_DIR, LinkFamily, get_family, link_families, nic_share_bytes_per_s
from meshplan.planner.host.calibrate import Calibration, is_local_spec, local_process_count
from meshplan.planner.model.routing import contiguous_spread, uniform_ranks
from meshplan.planner.plan.schema import ClusterRef, DeviceGroupRef

NCCL_NIC_EFFICIENCY = 0.80  # planner/presets/clusters/links.yaml: InfiniBand families' efficiency
NCCL_NVLINK_EFFICIENCY = 0.80  # planner/presets/clusters/links.yaml: the NVLink families' efficiency

__all__ = ["ClusterSpec", "LinkFamily", "NodeGroup", "get_family", "link_families", "load_cluster", "load_cluster_file",
           "local_cluster", "nic_share_bytes_per_s", "parse_bandwidth", "parse_shorthand", "preset_names"]

# ---------------------------------------------------------------- the cluster

@lru_cache(maxsize=4096)
def _members_per_domain(size: int, stride: int, domain: int, world: int) -> int:
    """``NodeGroup.members_per_domain`` over ``world`` ranks in domains of ``domain`` ranks."""
    block = size * stride
    if block <= domain and domain % block == 0:
        return size
    fewest = size
    for start in range(0, max(world, block), block):
        for offset in range(stride):
            ranks = range(start + offset, start + offset + block, stride)
            counts = Counter(r // domain for r in ranks)
            if len(counts) > 1:
                fewest = min(fewest, min(counts.values()))
    return fewest


@dataclass(frozen=True)
class NodeGroup:
    """``nodes`` identical nodes with ``devices_per_node`` devices each, joined inside a node by ``intra_link``.

    ``nic_link`` is this group's own per-GPU share of its nodes' network (None: the cluster's ``inter_link``).
    """

    nodes: int
    devices_per_node: int
    device: DeviceSpec
    intra_link: Link
    nic_link: Link | None = None
    nvlink_domain: int = 0

    @property
    def world_size(self) -> int:
        return self.nodes * self.devices_per_node

    @property
    def domain_size(self) -> int:
        """GPUs that share one NVLink domain: ``nvlink_domain`` (an NVL72 rack: 72), else the node."""
        return self.nvlink_domain or self.devices_per_node

    def members_per_domain(self, group_size: int, stride: int) -> int:
        """Fewest members any group of ``group_size`` ranks ``stride`` apart has in one NVLink domain it touches
        (``group_size`` when every such group sits inside one domain).

        Only for domains wider than a node (the node rule is ``ClusterSpec.collective_link``'s). The groups tile
        the group's ranks in Megatron order: blocks of ``group_size * stride`` consecutive ranks, ``stride`` groups
        interleaved in each. A block that does not divide the domain straddles a rack boundary somewhere (64 ranks
        of 72-GPU racks: ranks 64-127 sit 8 in the first rack, 56 in the second), and the slowest group sets the
        collective's pace.
        """
        return _members_per_domain(group_size, stride, self.domain_size, self.world_size)


def distinct_nodes(nodes: float, topk: int, groups: int = 1, groups_per_token: int = 0, experts: int = 0) -> float:
    """Expected number of the ``nodes`` nodes (equal shares of the ``experts``, contiguous) a token's ``topk``
    experts sit on. Uniform routing: ``planner.model.routing.uniform_ranks`` over the nodes (``topk`` distinct
    experts; the many-experts limit ``nodes (1 - (1 - 1/nodes)^topk)`` without the count). Group-limited routing
    (DeepSeek-V3 §2.1.2: its experts in ``groups`` contiguous groups, a token's from ``groups_per_token`` of them)
    with whole groups per node: the nodes holding the chosen groups, ``nodes (1 - C(groups - g, chosen) /
    C(groups, chosen))`` with ``g`` groups per node (DeepSeek-V3 at EP64 over 8 nodes: 4 nodes, against 5.3
    uniform). Other splits: uniform."""
    whole = float(nodes).is_integer()
    uniform = uniform_ranks(int(nodes), topk, experts) if whole else nodes * (1 - (1 - 1 / nodes) ** topk)
    if not groups_per_token or groups_per_token >= groups or groups % nodes:
        return uniform
    g = groups // int(nodes)
    missed = math.comb(groups - g, groups_per_token) / math.comb(groups, groups_per_token)
    return min(uniform, nodes * (1 - missed))


@dataclass(frozen=True)
class ClusterSpec:
    """A (possibly heterogeneous) cluster.

    Attributes:
        spec: What the user passed (shorthand, preset name or file path).
        groups: Node groups; ranks are numbered group by group, node-major inside a group.
        inter_link: Per-GPU share of the network between nodes (the slowest group's), bytes/s and seconds.
        calibration: This host's calibration for ``local:N`` (CPU ranks are priced from it), else None.
    """

    spec: str
    groups: tuple[NodeGroup, ...]
    inter_link: Link
    calibration: Calibration | None = field(default=None, compare=False, repr=False)

    @property
    def world_size(self) -> int:
        return sum(g.world_size for g in self.groups)

    @property
    def num_nodes(self) -> int:
        return sum(g.nodes for g in self.groups)

    @property
    def is_heterogeneous(self) -> bool:
        """True when the groups differ in device, devices per node or intra-node link."""
        return len({(g.device.name, g.devices_per_node, g.intra_link) for g in self.groups}) > 1

    @property
    def devices_per_node(self) -> int:
        """Devices per node (all groups agree).

        Raises:
            MeshplanError: the groups have different numbers of devices per node.
        """
        values = sorted({g.devices_per_node for g in self.groups})
        if len(values) > 1:
            raise MeshplanError(f"cluster {self.spec} is heterogeneous (devices per node {values}); "
                                f"ask a group (cluster.groups[i]) instead")
        return values[0]

    @property
    def device(self) -> DeviceSpec:
        """The device (all groups agree).

        Raises:
            MeshplanError: the groups have different devices.
        """
        if len(self.groups) == 1:  # (asked 10^5 times a search)
            return self.groups[0].device
        names = sorted({g.device.name for g in self.groups})
        if len(names) > 1:
            raise MeshplanError(f"cluster {self.spec} is heterogeneous (devices {', '.join(names)}); "
                                f"ask a group (cluster.groups[i]) instead")
        return self.groups[0].device

    @property
    def nvlink_width(self) -> int:
        """GPUs one NVLink domain holds (the narrowest group's): the node, or the rack on NVL72 clusters."""
        return min(g.domain_size for g in self.groups)

    def collective_link(self, group_size: int, stride: int, group_index: int = 0) -> Link:
        """The slowest link a collective over ranks ``r, r+stride, ..., r+(group_size-1)*stride`` crosses.

        Inside one node (``stride * group_size <= devices_per_node`` or ``group_size == 1``), or inside one NVLink
        domain wider than a node (every group of the size and stride within one NVL72 rack, even across its
        trays), that is the group's NVLink. Otherwise it is the network: each member's per-GPU NIC share, times
        the number of members that share a node or NVLink domain (``k``), because NCCL runs one ring channel per
        NIC and the node boundary is crossed by ``k`` channels in parallel; never faster than the intra-node link
        the ring also uses.
        Vidur's DGX A100 all-reduce over 2 nodes (shared/kernels/vidur/network) scales this way: bus bandwidth
        5.9, 11.9, 22.4 GB/s for 1, 2, 4 GPUs per node. The link carries the nodes the group spans and the
        NVLink's alpha, so a ring pays the network's alpha only where it crosses a node (``costmodel.collectives``).

        Args:
            group_size: Members of the collective.
            stride: Rank distance between consecutive members.
            group_index: Which node group's layout to use.

        Raises:
            MeshplanError: non-positive size/stride or an unknown group index.
        """
        if group_size < 1 or stride < 1:
            raise MeshplanError(f"collective group size {group_size} and stride {stride} must be >= 1")
        if not 0 <= group_index < len(self.groups):
            raise MeshplanError(f"cluster {self.spec} has {len(self.groups)} group(s); no group {group_index}")
        g = self.groups[group_index]
        per_node = _members_per_side(g, group_size, stride)
        if not per_node:
            return g.intra_link
        nic = g.nic_link or self.inter_link
        bw = min(g.intra_link.bandwidth_bytes_per_s, per_node * nic.bandwidth_bytes_per_s)
        name = nic.name if per_node == 1 else f"{nic.name}x{per_node}"
        # only the ring steps that cross a node pay the network's alpha (costmodel.collectives, NCCL's tuning.cc)
        return Link(name, bw, max(nic.latency_s, g.intra_link.latency_s), nodes=-(-group_size // per_node),
                    intra_latency_s=g.intra_link.latency_s)

    def alltoall_link(self, group_size: int, stride: int, group_index: int = 0, dedup_topk: int = 0,
                      routing_groups: tuple[int, int] = (1, 0), nvlink_share: float = 0.0,
                      contiguous_experts: int = 0, experts: int = 0, dispatcher: str = "") -> Link:
        """The link an all-to-all over ``group_size`` ranks ``stride`` apart sees, as one effective bandwidth.

        Unlike a ring, an all-to-all gets no help from the node's other NICs: every rank sends ``(p - k) / p`` of
        its data to ranks on other nodes through its own NIC share and ``(k - 1) / p`` over NVLink to the ``k - 1``
        members on its node, both at once. The time ``max(inter bytes / NIC, intra bytes / NVLink)`` is returned
        as the bandwidth the alpha-beta all-to-all formula (``(p - 1)/p * n / B``) needs to give it.

        ``dedup_topk``: a dispatcher that sends each token once per remote node and forwards it to the experts there
        over NVLink (DeepEP's internode kernels, DeepSeek-V3 §3.2.2) moves, per routed copy, only
        ``E[distinct remote nodes] / topk`` of the inter-node bytes; with ``topk`` experts spread uniformly over the
        ``N`` nodes a node receives none of them with probability ``(1 - 1/N)^topk``; under group-limited routing
        (``routing_groups`` = (groups, groups per token)) fewer nodes (``distinct_nodes``). Over NVLink it sends one
        copy per destination rank, so there the bytes shrink by the expected distinct ranks over ``topk``.
        ``nvlink_share``: where set, NVLink runs at that share of its nominal bandwidth instead of NCCL's (Hybrid-EP's
        TMA kernels, ``costmodel.hybridep``; DeepEP's on Blackwell, ``costmodel.deepep``).
        ``dispatcher``: the kernels' name the link carries (``nvlink5-deepep``); by default Hybrid-EP's where a share
        is set, else DeepEP's.
        ``contiguous_experts``: where set (the model's experts), a token's experts are adjacent ones
        (``contiguous_spread``) rather than spread like uniform picks.
        ``experts``: the model's routed experts, whose ``dedup_topk`` a token picks distinct (``uniform_ranks``).
        """
        ring = self.collective_link(group_size, stride, group_index)
        g = self.groups[group_index]
        k = _members_per_side(g, group_size, stride)  # members per node (per NVLink domain on racks)
        p = group_size
        # DeepEP sends a token once to each rank that holds one of its experts (``get_dispatch_layout``:
        # ``is_token_in_rank``), and its README's bandwidths are of those bytes: per routed copy, NVLink carries
        # E[distinct ranks] / topk of what one copy per expert would (``uniform_ranks``)
        rank_share = uniform_ranks(p, dedup_topk, experts) / dedup_topk if dedup_topk else 1.0
        spread = contiguous_spread(contiguous_experts, dedup_topk, p, k) if dedup_topk and contiguous_experts else None
        if spread:
            rank_share = spread[0] / dedup_topk
        if not k:  # the group inside one NVLink domain
            if rank_share == 1.0:
                return ring
            scale = nvlink_share / NCCL_NVLINK_EFFICIENCY if nvlink_share else 1.0
            name = f"{ring.name}-{dispatcher or ('hybridep' if nvlink_share else 'deepep')}"
            return Link(name, ring.bandwidth_bytes_per_s / rank_share * scale, ring.latency_s)
        nic = g.nic_link or self.inter_link
        inter = (p - k) / p
        nic_bw = nic.bandwidth_bytes_per_s
        if dedup_topk:
            nodes = p / k
            reached = spread[1] if spread else distinct_nodes(nodes, dedup_topk, *routing_groups, experts=experts)
            inter = min(inter, (nodes - 1) / nodes * reached / dedup_topk)
            # DeepEP's RDMA kernels drive the NIC at its line rate (README, normal kernels on H800 + CX7 400 Gb/s:
            # internode EP64 dispatch 51 GB/s, combine 50 GB/s of "~50 GB/s maximum"), where a large NCCL transfer
            # reaches the 0.80 of it that links.yaml's network families carry
            nic_bw /= NCCL_NIC_EFFICIENCY
        intra_bw = g.intra_link.bandwidth_bytes_per_s
        if nvlink_share:
            intra_bw *= nvlink_share / NCCL_NVLINK_EFFICIENCY
        per_byte = max(inter / nic_bw, (k - 1) / p * rank_share / intra_bw)
        return Link(f"{nic.name}-a2a", (p - 1) / p / per_byte, ring.latency_s, nodes=ring.nodes,
                    intra_latency_s=ring.intra_latency_s)

    def with_inter_bandwidth(self, bytes_per_s: float) -> "ClusterSpec":
        """The same cluster with the per-GPU inter-node bandwidth set to ``bytes_per_s`` (``--net 25Gbps``)."""
        if not bytes_per_s > 0 or not math.isfinite(bytes_per_s):
            raise MeshplanError(f"network bandwidth {bytes_per_s} bytes/s must be positive")
        link = dataclasses.replace(self.inter_link, bandwidth_bytes_per_s=float(bytes_per_s),
                                   name=f"{self.inter_link.name}@{bytes_per_s * 8 / 1e9:g}Gbps")
        groups = tuple(dataclasses.replace(g, nic_link=None) for g in self.groups)
        return dataclasses.replace(self, groups=groups, inter_link=link)

    def to_dict(self) -> dict:
        """Plain-data summary (JSON friendly): groups, links in bytes/s and seconds, world size."""
        def link(lk: Link) -> dict:
            return {"name": lk.name, "bandwidth_bytes_per_s": lk.bandwidth_bytes_per_s, "latency_s": lk.latency_s}

        return {"spec": self.spec, "world_size": self.world_size, "num_nodes": self.num_nodes,
                "heterogeneous": self.is_heterogeneous, "inter_link": link(self.inter_link),
                "groups": [{"nodes": g.nodes, "devices_per_node": g.devices_per_node, "device": g.device.name,
                            "nvlink_domain": g.domain_size,
                            "intra_link": link(g.intra_link), "nic_link": link(g.nic_link or self.inter_link)}
                           for g in self.groups]}

    def to_ref(self) -> ClusterRef:
        """The plan-file form (``planner.plan.schema.ClusterRef``): the spec string and each group's counts and
        device."""
        return ClusterRef(spec=self.spec, groups=tuple(
            DeviceGroupRef(nodes=g.nodes, devices_per_node=g.devices_per_node, device=g.device.name)
            for g in self.groups))


def _members_per_side(g: NodeGroup, group_size: int, stride: int) -> int:
    """Members of a collective's group that share one node, or one NVLink domain wider than a node, where the group
    crosses the network; 0 where it never leaves NVLink."""
    if group_size == 1 or stride * group_size <= g.devices_per_node:
        return 0
    if g.domain_size > g.devices_per_node:
        k = g.members_per_domain(group_size, stride)
        return 0 if k == group_size else k
    return max(1, min(group_size, g.devices_per_node // stride))


def _make(spec: str, groups: list[NodeGroup], inter: list[Link]) -> ClusterSpec:
    groups = [dataclasses.replace(g, nic_link=link) for g, link in zip(groups, inter)]
    slowest = min(inter, key=lambda link: (link.bandwidth_bytes_per_s, -link.latency_s))
    latency = max(link.latency_s for link in inter)
    return ClusterSpec(spec, tuple(groups), Link(slowest.name, slowest.bandwidth_bytes_per_s, latency))


# ---------------------------------------------------------------- shorthand

_PART_RE = re.compile(r"^(?:(\d+)[xX])?(\d+)[xX]([A-Za-z].*)$")  # device names start with a letter


_NVL_RE = re.compile(r"^(.+?)-NVL(\d+)$", re.IGNORECASE)  # GB200-NVL72: the device and its NVLink domain


def _domain(where: str, devices_per_node: int, domain: int, device: DeviceSpec, fam: LinkFamily,
            stated: str) -> int:
    """The NVLink domain of a group (0: the node), checked: whole nodes, no wider than the largest announced, nor
    than the widest its device's systems build (``where`` names the cluster or its group, ``stated`` how the cluster
    said it, for the refusal)."""
    if not domain or domain == devices_per_node:
        return 0
    if domain % devices_per_node or domain > MAX_DEVICES_PER_NODE:
        raise MeshplanError(f"{where}: an NVLink domain of {domain} GPUs must hold whole nodes of "
                            f"{devices_per_node} and at most {MAX_DEVICES_PER_NODE} GPUs")
    widest = fam.nvlink_domain_max_gpus or devices_per_node
    if domain > widest:
        note = "; ".join(n for n in (fam.intra.name, fam.nvlink_domain_note) if n)
        reach = (f"join at most {widest} GPUs in one NVLink domain" if fam.nvlink_domain_max_gpus
                 else f"link GPUs only inside a node of {devices_per_node} ({note})")
        default = fam.nvlink_domain_gpus and f" for {fam.name}'s domain of {fam.nvlink_domain_gpus}"
        raise MeshplanError(f"{where}: {device.name} systems {reach}, not {stated}; drop it"
                            f"{default or ''}")
    return domain


def _count(value: str, what: str, spec: str) -> int:
    n = int(value)
    if n < 1:
        raise MeshplanError(f"cluster '{spec}': {what} must be >= 1, got {n}")
    return n


def parse_shorthand(spec: str) -> ClusterSpec:
    """``NODESxDEVICESxDEVICE`` or ``DEVICESxDEVICE`` parts joined by ``+``; links from each device's family."""
    groups, inter = [], []
    for part in spec.split("+"):
        m = _PART_RE.match(part.strip())
        if not m:
            raise MeshplanError(
                f"cluster '{spec}': cannot read '{part}' (expected NODESxDEVICESxDEVICE such as 16x8xH100 or "
                f"64x4xGB200-NVL72, "
                f"DEVICESxDEVICE such as 8xA100, parts joined by '+', local:N, a preset or a YAML file; "
                f"presets: {', '.join(preset_names())})")
        nodes = _count(m.group(1), "nodes", spec) if m.group(1) else 1
        dpn = _count(m.group(2), "devices per node", spec)
        name, nvl = m.group(3), _NVL_RE.match(m.group(3))
        if nvl:  # 64x4xGB200-NVL72: 4-GPU trays in NVLink domains of 72
            name = nvl.group(1)
            if int(nvl.group(2)) < 1:  # as YAML's nvlink_domain, a domain holds at least one GPU
                raise MeshplanError(f"cluster '{spec}': -NVL{nvl.group(2)} names no NVLink domain (NVL72: 72 GPUs "
                                    "share one; drop the suffix for the device's own)")
        dev = get_device(name)
        fam = get_family(dev.family, f"device {dev.name}")
        domain = _domain(f"cluster '{spec}'", dpn, int(nvl.group(2)) if nvl else fam.nvlink_domain_gpus, dev, fam,
                         f"-NVL{nvl.group(2)}" if nvl else f"{fam.name}'s default")
        groups.append(NodeGroup(nodes, dpn, dev, fam.intra, nvlink_domain=domain))
        inter.append(fam.inter_link(dpn))
    return _make(spec, groups, inter)


# ---------------------------------------------------------------- YAML files

def _bandwidth(where: str, value) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not (math.isfinite(value) and value > 0):
            raise MeshplanError(f"{where}: bandwidth must be a positive finite number, got {value!r}")
        return float(value)  # a bare number is bytes/s
    try:
        return parse_bandwidth(value)
    except MeshplanError as exc:
        raise MeshplanError(f"{where}: {exc}") from None


def _intra_from(where: str, d: IntraLinkFile, default: Link) -> Link:
    base = get_family(d.family, where).intra if d.family else default
    bw = _bandwidth(where, d.bandwidth) if d.bandwidth is not None else base.bandwidth_bytes_per_s
    lat = d.latency_us / 1e6 if d.latency_us is not None else base.latency_s
    return Link(d.name or base.name, bw, lat)


def _inter_from(where: str, d: InterLinkFile, default: LinkFamily, dpn: int) -> Link:
    fam = get_family(d.family, where) if d.family else default
    base = fam.inter_link(dpn)
    lat = d.latency_us / 1e6 if d.latency_us is not None else base.latency_s
    name = d.name or base.name
    if d.bandwidth is not None:  # the per-GPU achievable share, used as given
        return Link(name, _bandwidth(where, d.bandwidth), lat)
    nic = _bandwidth(where, d.nic) if d.nic is not None else fam.nic_line_bytes_per_s
    nics = d.nics_per_node if d.nics_per_node is not None else fam.nics_per_node
    eff = d.efficiency if d.efficiency is not None else fam.nic_efficiency
    return Link(name, nic_share_bytes_per_s(nic, eff, nics, dpn), lat)


def load_cluster_file(path: str | Path, spec: str | None = None) -> ClusterSpec:
    """Read a cluster YAML file (schema: ``planner/presets/clusters/README.md``; typed by
    ``planner.cluster.file.ClusterFile``).

    Raises:
        MeshplanError: unreadable file, unknown key (with the closest valid one), bad counts, unknown device.
    """
    p = Path(path)
    where = str(spec or p)
    try:
        data = load_yaml_file(p, where)
    except FileNotFoundError:
        raise MeshplanError(f"{where}: cannot read (No such file or directory)") from None
    f = parse_cluster_file(data, where)
    groups, inter = [], []
    for i, g in enumerate(f.groups):
        gw = f"{where}: groups[{i}]"
        try:
            dev = get_device(g.device)
        except MeshplanError as exc:
            raise MeshplanError(f"{gw}: {exc}") from None
        fam = get_family(dev.family, gw)
        intra = _intra_from(f"{gw}.intra_link", g.intra_link, fam.intra) if g.intra_link else fam.intra
        domain = _domain(gw, g.devices_per_node,
                         g.nvlink_domain if g.nvlink_domain is not None else fam.nvlink_domain_gpus, dev, fam,
                         f"nvlink_domain: {g.nvlink_domain}" if g.nvlink_domain is not None
                         else f"{fam.name}'s default")
        groups.append(NodeGroup(g.nodes, g.devices_per_node, dev, intra, nvlink_domain=domain))
        if f.inter_link is not None:
            inter.append(_inter_from(f"{where}: inter_link", f.inter_link, fam, g.devices_per_node))
        else:
            inter.append(fam.inter_link(g.devices_per_node))
    return _make(spec or str(path), groups, inter)


# ---------------------------------------------------------------- entry point

def preset_names() -> list[str]:
    """Bundled cluster presets (file stems under ``planner/presets/clusters``)."""
    folder = resources.files("meshplan.planner").joinpath(PRESET_DIR)
    return sorted(f.name[:-5] for f in folder.iterdir() if f.name.endswith(".yaml") and f.name != "links.yaml")


def local_cluster(n: int, cal: Calibration) -> ClusterSpec:
    """``local:N``: one node with ``n`` CPU processes joined by the calibrated gloo loopback link.

    Each process gets ``RAM / n`` bytes; when ``n`` exceeds the logical CPUs, each process's FLOP/s and memory
    bandwidth are scaled by ``cpus / n`` (the 1-thread figures assume a core per process).
    """
    if n < 1:
        raise MeshplanError(f"cluster 'local:{n}': local:N needs a process count N >= 1")
    share = min(1.0, (os.cpu_count() or 1) / n)
    dev = dataclasses.replace(
        cal.device, memory_bytes=cal.device.memory_bytes // n,
        peak_flops={k: v * share for k, v in cal.device.peak_flops.items()},
        mem_bw_bytes_per_s=cal.device.mem_bw_bytes_per_s * share)
    group = NodeGroup(1, n, dev, cal.link, nic_link=cal.link)
    return ClusterSpec(f"local:{n}", (group,), cal.link, calibration=cal)


def load_cluster(text: str, calibration: Calibration | None = None) -> ClusterSpec:
    """A cluster from a shorthand, ``local:N``, a YAML file path or a preset name.

    Args:
        text: The specification.
        calibration: This host's calibration, required by ``local:N`` (``planner.host.calibrate.calibration_for``).

    Raises:
        MeshplanError: malformed shorthand, zero counts, unknown device or preset, bad file, ``local:N`` without
            a calibration.
    """
    spec = str(text).strip()
    if not spec:
        raise MeshplanError("cluster: empty specification (e.g. 16x8xH100, 8xA100, local:2, dgx-h100-16)")
    if is_local_spec(spec):
        n = local_process_count(spec)
        if calibration is None:
            raise MeshplanError(f"cluster '{spec}': local:N is built from this host's calibration; pass it "
                                "(planner.host.calibrate.calibration_for)")
        return local_cluster(n, calibration)
    if spec in preset_names():
        path = resources.files("meshplan.planner").joinpath(PRESET_DIR, f"{spec}.yaml")
        return load_cluster_file(Path(str(path)), spec=spec)
    if spec.endswith((".yaml", ".yml")) or Path(spec).is_file():
        if not Path(spec).is_file():
            raise MeshplanError(f"{spec}: cluster file not found")
        return load_cluster_file(spec)
    return parse_shorthand(spec)
