"""Alpha-beta model of ring/tree collectives on a link (Thakur, Rabenseifner & Gropp 2005, "Optimization of
Collective Communication Operations in MPICH", IJHPCA 19(1); NCCL's "bus bandwidth" convention, nccl-tests
PERFORMANCE.md).

For p participants and a payload of n bytes (the full tensor on each rank):
    all-reduce (ring):        2 (p-1) alpha + 2 (p-1)/p * n / B
    all-gather / reduce-scatter (ring): (p-1) alpha + (p-1)/p * n / B      (n = the full gathered size)
    all-to-all:               (p-1) alpha + (p-1)/p * n / B
    send/recv:                alpha + n / B
B is the per-rank bandwidth of the slowest link the ring crosses, in bytes/s.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Link:
    """A network link class as seen by one rank.

    Attributes:
        name: e.g. ``nvlink4``, ``ib-ndr-8x400``, ``gloo-loopback``.
        bandwidth_bytes_per_s: Achievable unidirectional bandwidth per rank (bus bandwidth), bytes/s.
        latency_s: Per-message latency (alpha), seconds.
    """

    name: str
    bandwidth_bytes_per_s: float
    latency_s: float


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
    frac = (p - 1) / p
    if kind == "allreduce":
        return 2 * (p - 1) * link.latency_s + 2 * frac * nbytes / link.bandwidth_bytes_per_s
    if kind in ("allgather", "reducescatter", "alltoall"):
        return (p - 1) * link.latency_s + frac * nbytes / link.bandwidth_bytes_per_s
    raise ValueError(f"unknown collective kind {kind!r}")
