"""Alpha-beta model of ring/tree collectives on a link (Thakur, Rabenseifner & Gropp 2005, "Optimization of
Collective Communication Operations in MPICH", IJHPCA 19(1); NCCL's "bus bandwidth" convention, nccl-tests
PERFORMANCE.md).

For p participants and a payload of n bytes (the full tensor on each rank):
    all-reduce (ring):        2 (p-1) alpha + 2 (p-1)/p * n / B
    all-gather / reduce-scatter (ring): (p-1) alpha + (p-1)/p * n / B      (n = the full gathered size)
    all-to-all:               (p-1) alpha + (p-1)/p * n / B
    send/recv:                alpha + n / B
B is the per-rank bandwidth of the slowest link the ring crosses, in bytes/s.

A group that spans ``N`` nodes (``Link.nodes``) pays the network's alpha only on the ring steps that cross a node:
NCCL's own cost model (NVIDIA/nccl ``src/graph/tuning.cc`` @ 5067397, ``ncclTopoTuneModel``) counts ``N - 1`` such
steps per ring phase (``2 (N - 1)`` for all-reduce) and the rest at the intra-node link's alpha, and prices an
all-reduce over nodes by a double binary tree too (``2 ((k - 1) alpha_intra + log2(N) alpha_net)``, ``k`` ranks per
node), taking the faster. The alphas are links.yaml's measured ones; nothing here is fitted. A collective inside
one NVLink4 or NVLink5 domain is priced at nccl-tests' measured time instead (``costmodel.nvlink_nccl``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from meshplan.costmodel import nvlink_nccl


@dataclass(frozen=True)
class Link:
    """A network link class as seen by one rank.

    Attributes:
        name: e.g. ``nvlink4``, ``ib-ndr-8x400``, ``gloo-loopback``.
        bandwidth_bytes_per_s: Achievable unidirectional bandwidth per rank (bus bandwidth), bytes/s.
        latency_s: Per-message latency (alpha), seconds; across nodes, the network's.
        nodes: Nodes (or NVLink domains) the group spans, as ``ClusterSpec.collective_link`` counts them; 1 = the
            whole ring on one link class, every step at ``latency_s``.
        intra_latency_s: Alpha of the ring steps inside a node when ``nodes > 1`` (the NVLink's).
    """

    name: str
    bandwidth_bytes_per_s: float
    latency_s: float
    nodes: int = 1
    intra_latency_s: float = 0.0


def ring_latency_s(kind: str, group_size: int, link: Link) -> float:
    """The latency part of a ring (or, for all-reduce across nodes, tree) collective, seconds (see module doc)."""
    p, n = group_size, link.nodes
    phases = 2 if kind == "allreduce" else 1
    if n <= 1:  # every step on one link class
        return phases * (p - 1) * link.latency_s
    ring = phases * ((p - n) * link.intra_latency_s + (n - 1) * link.latency_s)
    if kind != "allreduce":
        return ring
    tree = 2 * ((p / n - 1) * link.intra_latency_s + math.ceil(math.log2(n)) * link.latency_s)
    return min(ring, tree)


def collective_time_s(kind: str, nbytes: float, group_size: int, link: Link) -> float:
    """Time of one collective, seconds (alpha-beta, ring algorithm).

    Args:
        kind: ``allreduce``, ``allgather``, ``reducescatter``, ``alltoall`` or ``sendrecv``.
        nbytes: Payload bytes (full tensor size; for send/recv the message).
        group_size: Participants.
        link: The slowest link the collective crosses.
    """
    p = group_size
    if kind == "sendrecv":
        return link.latency_s + nbytes / link.bandwidth_bytes_per_s
    if p <= 1:
        return 0.0
    if link.nodes <= 1:
        measured = nvlink_nccl.time_s(link.name, kind, nbytes, p, link.latency_s)
        if measured is not None:
            return measured
    frac = (p - 1) / p
    if kind == "allreduce":
        return ring_latency_s(kind, p, link) + 2 * frac * nbytes / link.bandwidth_bytes_per_s
    if kind in ("allgather", "reducescatter"):
        return ring_latency_s(kind, p, link) + frac * nbytes / link.bandwidth_bytes_per_s
    if kind == "alltoall":  # every pair exchanges directly: no ring steps to split by node
        return (p - 1) * link.latency_s + frac * nbytes / link.bandwidth_bytes_per_s
    raise ValueError(f"unknown collective kind {kind!r}")


# NCCL's own latency model for its LL protocol, which it picks for messages of a few kilobytes: NVIDIA/nccl
# ``src/graph/tuning.cc`` @ 5067397 (``ncclTunerConstantsDefaults``, ``ncclTopoTuneModel``), microseconds. A ring
# pays its base latency once and each step's hardware latency: NVLink's inside a node, the network's on the steps
# that cross one, and inside a group that spans nodes at least the host's network overhead (``getNetOverhead``:
# 1 us but on AMD x86); a tree all-reduce pays two passes up and down ``log2(nodes)`` network levels.
NCCL_LL_BASE_US = {"ring": 6.6, "tree": 6.8}
NCCL_LL_NVLINK_US = {"ring": 0.6, "tree": 0.6}
NCCL_LL_NET_US = {"ring": 2.7, "tree": 5.0}
NCCL_NET_OVERHEAD_US = 1.0


def nccl_ll_latency_s(kind: str, group_size: int, nodes: int = 1) -> float:
    """Seconds NCCL's tuning model gives a tiny ``kind`` collective (LL protocol) over ``group_size`` ranks on
    ``nodes`` nodes (or NVLink domains): a ring for all-gather and reduce-scatter, the faster of ring and tree for
    all-reduce; with one rank a node the network steps take the tree's latency, as NCCL does."""
    p, n = group_size, max(1, nodes)
    if p <= 1:
        return 0.0
    steps = 2 * (p - 1) if kind == "allreduce" else p - 1
    inter = 0 if n == 1 else (2 * (n - 1) if kind == "allreduce" else n - 1)
    intra = NCCL_LL_NVLINK_US["ring"] if n == 1 else max(NCCL_LL_NVLINK_US["ring"], NCCL_NET_OVERHEAD_US)
    net = NCCL_LL_NET_US["tree" if p == n else "ring"]
    ring = NCCL_LL_BASE_US["ring"] + (steps - inter) * intra + inter * net
    if kind != "allreduce":
        return ring * 1e-6
    tree = NCCL_LL_BASE_US["tree"] + 2 * ((p / n - 1) * NCCL_LL_NVLINK_US["tree"]
                                          + math.ceil(math.log2(n)) * NCCL_LL_NET_US["tree"])
    return min(ring, tree) * 1e-6
