"""Rack segments: the best plan priced again on the same trays allocated in segments that keep its groups in a rack.

A cluster of ``NxGxDEVICE-NVL72`` is packed: ranks fill one NVLink domain after another, so a group whose block of
ranks does not divide the domain straddles a rack boundary somewhere (64 ranks of 72-GPU racks: ranks 64-127 sit 8
in the first rack and 56 in the next) and that group's collectives leave NVLink for the network
(``ClusterSpec.collective_link``). Slurm's block topology can instead hand a job its nodes in segments of ``s``
nodes, each inside one rack (``sbatch --segment=s``, which Megatron-Bridge's launcher asks for on GB200 / GB300:
``scripts/performance/utils/executors.py``, the largest divisor of the node count up to 18; the stack profiles'
``placement``). Each segment is then the job's NVLink domain: ``s`` trays, written ``-NVL{s x G}`` in the shorthand.

The allocation is what meshplan is handed, not a decision it makes. It prices the best layout again on each
segmenting of the same trays (``segment_sizes``), and searches once more on the one segmenting Megatron-Bridge's
launcher would ask for where that differs from the packed racks (``planner.layout.stacks.segment_nodes`` of a rack's
trays: a job that does not fill whole racks), since another layout may gain more there than the packed allocation's
best. One note says the fastest when it beats the packed allocation by at least ``GAIN_AT_LEAST``: the segments, the
layout, which of its groups then stay on NVLink, and the cluster to plan on for a search of that allocation.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from meshplan.planner.cluster.spec import ClusterSpec
from meshplan.planner.estimate.base import Estimate
from meshplan.planner.layout.layout import Layout
from meshplan.planner.layout.stacks import segment_nodes
from meshplan.planner.search.exact import layout_row

# The smallest saving worth an allocation change: what the open figures call a tie ("within 1%",
# ``planner.search.report.ranking_notes``)
GAIN_AT_LEAST = 0.01
# The groups whose collectives the note names, in Megatron's rank order (``planner.layout.layout``)
GROUPS = (("tp", "tp_group"), ("cp", "cp_group"), ("ep", "ep_group"), ("pp", "pp_neighbours"), ("dp", "dp_group"))


def segment_sizes(nodes: int, trays_per_domain: int) -> list[int]:
    """The segment sizes Slurm can give a job of ``nodes`` nodes in racks of ``trays_per_domain``: every divisor of
    the node count below the rack's trays (a segment as wide as the rack is the packed allocation's domain)."""
    return [s for s in range(1, trays_per_domain) if nodes % s == 0]


def segmented(cluster: ClusterSpec, trays: int) -> ClusterSpec:
    """``cluster`` (one group of trays in NVLink domains wider than a tray) allocated in segments of ``trays``
    trays: each segment its own NVLink domain (a single tray's domain is the tray itself), its links as they were,
    its spec the shorthand of that domain (-NVL4: the tray alone; the GB200 family's own domain is 72)."""
    g = cluster.groups[0]
    gpus = trays * g.devices_per_node
    group = dataclasses.replace(g, nvlink_domain=gpus if trays > 1 else 0)
    spec = f"{g.nodes}x{g.devices_per_node}x{g.device.name}-NVL{gpus}"
    return dataclasses.replace(cluster, spec=spec, groups=(group,))


def from_file(cluster: ClusterSpec) -> bool:
    """Whether ``cluster`` was read from a YAML file (its spec the file's path)."""
    return Path(cluster.spec).suffix.lower() in (".yaml", ".yml") or Path(cluster.spec).is_file()


def applies(cluster: ClusterSpec) -> bool:
    """One group of trays whose NVLink domain joins several of them, and more trays than one domain holds."""
    if len(cluster.groups) != 1:
        return False
    g = cluster.groups[0]
    return g.domain_size > g.devices_per_node and g.world_size > g.domain_size


def on_network(cluster: ClusterSpec, layout: Layout) -> list[str]:
    """The names of ``layout``'s groups whose collectives leave NVLink on ``cluster`` (``GROUPS``)."""
    intra = cluster.groups[0].intra_link.name
    return [name for name, attr in GROUPS
            if getattr(layout, attr).size > 1 and cluster.collective_link(*getattr(layout, attr)).name != intra]


@dataclass(frozen=True)
class Allocation:
    """The same trays allocated in rack segments, faster (``segment_advice``): ``meshplan plan --json`` prints it
    under ``allocation``, the plan's notes say it in words (``note``)."""

    segment_trays: int
    """Nodes per ``sbatch --segment``: each segment inside one rack, the job's NVLink domain."""
    nvlink_domain: int
    """GPUs per segment."""
    cluster: str
    """The cluster to plan on for that allocation: its shorthand, or the cluster file to write ``nvlink_domain`` in."""
    cluster_file: bool
    """Whether ``cluster`` is a cluster file (its links the shorthand would drop)."""
    step_time_s: float
    """The layout's step time there."""
    packed_step_time_s: float
    """The best layout's on the packed racks."""
    layout: str
    """The layout, in the ranked table's words."""
    same_layout: bool
    """Whether ``layout`` is the packed racks' best (re-priced) or the best a search of the segments found."""
    groups_on_nvlink: tuple[str, ...]
    """The layout's groups (tp, cp, ep, pp, dp) that leave NVLink on the packed racks and stay inside a segment."""

    def note(self) -> str:
        what = "this layout" if self.same_layout else f"its best layout, {self.layout},"
        owner = "its" if self.same_layout else "that layout's"
        why = (f": {owner} {', '.join(self.groups_on_nvlink)} groups leave NVLink where they cross a rack of the "
               "packed allocation, and stay inside one segment") if self.groups_on_nvlink else ""
        hint = (f"set nvlink_domain: {self.nvlink_domain} in {self.cluster} to search that allocation"
                if self.cluster_file else f"meshplan plan -c {self.cluster} searches that allocation")
        return (f"allocation: in segments of {self.segment_trays} trays (Slurm sbatch --segment={self.segment_trays}, "
                f"as Megatron-Bridge's launcher asks on NVL72 racks), {what} runs {self.step_time_s:.3f} s a step "
                f"against {self.packed_step_time_s:.3f} s for the best here "
                f"({self.step_time_s / self.packed_step_time_s - 1:+.1%}){why}; {hint}")


def segment_advice(estimator, work, layout: Layout, step_s: float,
                   research: Optional[Callable[[object], Optional[tuple]]] = None) -> Optional[Allocation]:
    """The segmenting that runs fastest, when it saves at least ``GAIN_AT_LEAST`` of ``step_s`` (the best layout's
    price on ``work``'s packed cluster); ``None`` where none does or the cluster is not one of racks wider than a
    tray. ``research(work)``: the best (layout, estimate) of a search of ``work``, tried on the launcher's segmenting
    (``segment_nodes`` of a rack) where it is not whole racks."""
    cluster = work.cluster
    if not applies(cluster):
        return None
    g = cluster.groups[0]
    per_rack = g.domain_size // g.devices_per_node
    best: Optional[tuple[float, int, Layout, Estimate]] = None
    for trays in segment_sizes(g.nodes, per_rack):
        est = estimator.estimate(dataclasses.replace(work, cluster=segmented(cluster, trays)), layout)
        if est.fits and (best is None or est.step_time_s < best[0]):
            best = (est.step_time_s, trays, layout, est)
    trays = segment_nodes(g.nodes, per_rack)
    if research is not None and trays < per_rack:
        found = research(dataclasses.replace(work, cluster=segmented(cluster, trays)))
        if found is not None and (best is None or found[1].step_time_s < best[0]):
            best = (found[1].step_time_s, trays, *found)
    if best is None or best[0] > step_s * (1 - GAIN_AT_LEAST):
        return None
    seg_s, trays, lay, est = best
    other = segmented(cluster, trays)
    moved = tuple(n for n in on_network(cluster, lay) if n not in on_network(other, lay))
    in_file = from_file(cluster)  # a file's links: the shorthand would drop them, so the file is named
    return Allocation(trays, trays * g.devices_per_node, cluster.spec if in_file else other.spec, in_file, seg_s,
                      step_s, layout_row(lay, est)["layout"], lay is layout, moved)
