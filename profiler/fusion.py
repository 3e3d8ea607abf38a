"""Tensor fusion what-if: regroup a step's gradient all-reduces into buckets of a new size (DDP ``bucket_cap_mb``).

dPRO's tensor-fusion pass (``TensorFusionGraphPass``, ``../shared/notes/profiler.md`` §1.5) merges and splits
gradient all-reduces and re-prices them. Here, per (rank, step, comm lane), the all-reduces are read as one byte
stream in issue order (bucket i holds bytes [c_{i-1}, c_i)); new bucket j holds [(j-1)B, jB). Bucket j:

* waits for everything any overlapped old bucket waited for (its gradients are ready only when the last of
  them is),
* takes the lane position of the last old bucket it overlaps,
* releases the successors of each old bucket whose last byte it carries,
* costs ``alpha + beta * bytes`` with (alpha, beta) fitted to the run's own all-reduces
  (:func:`profiler.whatif.fit_alpha_beta`).

New buckets of the same index on different ranks form one collective (same ``coll`` id).
"""
from __future__ import annotations

import math
from collections import defaultdict

import networkx as nx

from meshplan.core.errors import MeshplanError

_ALLREDUCE = "allreduce"


def rebucket_allreduces(G: nx.DiGraph, bucket_bytes: float, fits: dict[str, tuple[float, float]]) -> nx.DiGraph:
    """A copy of ``G`` with each step's all-reduces regrouped into ``bucket_bytes`` buckets.

    Raises:
        MeshplanError: The graph has no all-reduce with a known size.
    """
    H = G.copy()
    lanes: dict[tuple, list[int]] = defaultdict(list)
    for n, a in H.nodes(data=True):
        if a["kind"] == "comm" and a.get("coll_type") == _ALLREDUCE and a.get("bytes", 0) > 0:
            lanes[(a["rank"], a.get("step", 0), a["lane"])].append(n)
    if not lanes:
        raise MeshplanError("what-if bucket: the run has no all-reduce with a known size to re-bucket")
    alpha, beta = fits.get(_ALLREDUCE, (0.0, 0.0))
    next_id = max(H.nodes) + 1 if len(H) else 0
    for (rank, step, lane), olds in sorted(lanes.items()):
        olds.sort(key=lambda n: H.nodes[n]["seq"])
        sizes = [H.nodes[n]["bytes"] for n in olds]
        total = sum(sizes)
        m = max(1, math.ceil(total / bucket_bytes - 1e-9))
        bounds = [min(total, (j + 1) * bucket_bytes) for j in range(m)]
        cum, c = [], 0.0
        for s in sizes:
            c += s
            cum.append(c)
        proto = H.nodes[olds[0]]
        partial = any(H.nodes[n].get("partial") for n in olds)
        new_nodes = []
        lo = 0.0
        for j, hi in enumerate(bounds):
            over = [i for i, (ci, s) in enumerate(zip(cum, sizes)) if ci - s < hi and ci > lo]
            last = olds[over[-1]]
            nb = hi - lo
            attrs = dict(proto)
            attrs.update(name=f"allreduce bucket {j} ({nb / 1e6:.2f} MB)", bytes=nb,
                         duration_s=alpha + beta * nb, seq=H.nodes[last]["seq"] + (j + 1) / (m + 1),
                         coll=None if partial else f"bucket:{step}:{lane.rsplit(':', 1)[-1]}:{j}", partial=partial,
                         peer=("bucket", j), measured_start_s=None, measured_end_s=None)
            nid = next_id
            next_id += 1
            H.add_node(nid, **attrs)
            for i in over:
                for p in G.predecessors(olds[i]):
                    if G.edges[p, olds[i]].get("type") != "program" and p not in olds:
                        H.add_edge(p, nid, type=G.edges[p, olds[i]].get("type", "data"))
            new_nodes.append((nid, lo, hi))
            lo = hi
        for i, n in enumerate(olds):
            carrier = next(nid for nid, l0, h0 in new_nodes if l0 < cum[i] <= h0 + 1e-6)
            for sc in G.successors(n):
                if G.edges[n, sc].get("type") != "program" and sc not in olds:
                    H.add_edge(carrier, sc, type=G.edges[n, sc].get("type", "data"))
        H.remove_nodes_from(olds)
        _relink_lane(H, rank, step, lane)
    return H


def _relink_lane(H: nx.DiGraph, rank: int, step: int, lane: str) -> None:
    """Rebuild the program-order edges of one lane after nodes were replaced; renumber ``seq``."""
    nodes = [n for n, a in H.nodes(data=True) if a["rank"] == rank and a.get("step", 0) == step and a["lane"] == lane]
    nodes.sort(key=lambda n: H.nodes[n]["seq"])
    for n in nodes:
        for s in [s for s in H.successors(n) if H.edges[n, s].get("type") == "program"]:
            H.remove_edge(n, s)
    for i, n in enumerate(nodes):
        H.nodes[n]["seq"] = i
    for u, v in zip(nodes, nodes[1:]):
        H.add_edge(u, v, type="program")
