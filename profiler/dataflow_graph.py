"""The global dataflow graph: one ``networkx.DiGraph`` for a measured run or a hypothetical plan.

A measured trace (:func:`profiler.trace_to_graph.build_graph`) and a planner's synthetic schedule
(:class:`GraphBuilder`) produce the same kind of graph, and :mod:`profiler.replay` replays both.

Node attributes (node ids are ints):

=================  ==========================================================================================
``rank``           global rank (int)
``lane``           serial resource on that rank: ``thread:<tid>`` (host thread), ``stream:<dev>:<id>`` (GPU
                   stream), or any name for synthetic graphs. Ops of one lane run one at a time, in ``seq`` order.
``seq``            position in the lane (int, increasing). Steps replay independently: a lane's ops of
                   different steps are separate queues, each step starting from its own origin.
``kind``           ``compute``, ``comm``, ``host`` or ``memcpy``
``name``           op / kernel name
``duration_s``     intrinsic duration, seconds. For a matched collective: its transfer time (end - last
                   participant's start); for a host wait node: the wake-up time after what it waited for.
``step``           training step (ProfilerStep number; 0 for synthetic graphs unless given)
``release_s``      earliest start, seconds after the step origin (0 = no constraint)
``gap_s``          seconds between becoming ready and starting (dPRO's measured gaps: kernel launch latency,
                   back-to-back kernel gap); 0 by default
``coll``           collective group id (str) shared by all participants of one collective, else None. A group
                   starts its transfer when every member is ready; all members end ``duration_s`` later.
``coll_type``      ``allreduce``, ``alltoall`` ... for comm ops
``bytes``          payload bytes (comm, memcpy), 0 when unknown
``shapes``         input shapes (nested tuples) when known
``partial``        True for a collective whose other participants are absent from the trace: it keeps its
                   measured duration and waits for nobody
``wait``           True for host nodes that model blocking on device/comm work
``delay``          True for a start delay the trace does not explain (kept at its measured length)
``idle``           True for a step's idle span on a thread that recorded no op in it (kept at its length)
``peer``           key identifying "the same op" on other ranks (used by the straggler what-if)
``measured_start_s``, ``measured_end_s``   aligned measured times after the step origin (traces only)
=================  ==========================================================================================

Edge attribute ``type``: ``program`` (lane order), ``launch`` (host launch -> kernel), ``enqueue`` (host op ->
CPU collective), ``delay`` (into and out of a delay node), ``wait`` (device/comm op -> blocked host node),
``event`` (cudaStreamWaitEvent: recorded op -> first op after the wait on the other stream),
``inferred`` (an unexplained start delay attributed to the op on another lane of the same rank that ended just
before), ``data`` (synthetic graphs).

Graph attributes: ``steps`` = {step: {"origin_us", "measured_s"}} (traces), ``warnings`` = [str].

:meth:`GraphBuilder.compile` produces the replay's compact form directly (no networkx), for graphs of
millions of ops.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import networkx as nx

KIND_CODES = {"compute": 0, "comm": 1, "host": 2, "memcpy": 3}
KIND_NAMES = {v: k for k, v in KIND_CODES.items()}


@dataclass
class CompiledGraph:
    """Array form of a graph for the replay hot loop (plain Python lists: fastest element access in CPython).

    Attributes:
        node_ids: original node id per index.
        rank, lane, kind, step: per node (lane = index into ``lanes``; kind = ``KIND_CODES`` value).
        name: per node.
        dur_s, release_s: per node, seconds.
        gap_s: per node, seconds between the op becoming ready and starting (launch latency, back-to-back gap).
        group: collective group index per node (-1 none); ``groups[g]`` lists its member indices.
        succ_ptr, succ_idx: CSR successor lists (program order included).
        indeg: number of predecessors per node.
        lanes: (rank, lane name) per lane index.
        coll_bytes: payload bytes per node.
        coll_type: per node (None for non-comm).
    """

    node_ids: list
    rank: list[int]
    lane: list[int]
    kind: list[int]
    step: list[int]
    name: list[str]
    dur_s: list[float]
    release_s: list[float]
    group: list[int]
    groups: list[list[int]]
    succ_ptr: list[int]
    succ_idx: list[int]
    indeg: list[int]
    lanes: list[tuple[int, str]]
    coll_bytes: list[float]
    coll_type: list
    gap_s: list[float]

    @property
    def n(self) -> int:
        return len(self.dur_s)


class GraphBuilder:
    """Build a graph op by op (traces and plans alike).

    Example (two ranks, compute then an all-reduce that waits for both)::

        b = GraphBuilder()
        f0 = b.add_op(0, "stream:0", "compute", "fwd", 1e-3)
        f1 = b.add_op(1, "stream:0", "compute", "fwd", 2e-3)
        b.add_op(0, "comm:0", "comm", "allreduce", 5e-4, deps=[f0], coll="ar0", coll_type="allreduce")
        b.add_op(1, "comm:0", "comm", "allreduce", 5e-4, deps=[f1], coll="ar0", coll_type="allreduce")
        G = b.build()          # networkx.DiGraph, or b.compile() for the replay's array form

    Ops added to the same (rank, lane, step) run in the order they were added.
    """

    _COLS = ("rank", "lane", "seq", "kind", "name", "duration_s", "step", "release_s", "coll", "coll_type",
             "bytes", "gap_s")

    def __init__(self) -> None:
        # Columnar storage: a million ops cost a few lists, not a million dicts.
        self.cols: dict[str, list] = {c: [] for c in self._COLS}
        self.extra: dict[int, dict[str, Any]] = {}
        self.edges: list[tuple[int, int, str]] = []
        self._lane_tail: dict[tuple[int, str, int], int] = {}
        self.graph_attrs: dict[str, Any] = {"steps": {}, "warnings": []}

    def __len__(self) -> int:
        return len(self.cols["rank"])

    def add_op(self, rank: int, lane: str, kind: str, name: str, duration_s: float, *, deps: Iterable[int] = (),
               step: int = 0, coll: str | None = None, coll_type: str | None = None, nbytes: float = 0.0,
               release_s: float = 0.0, dep_type: str = "data", **extra: Any) -> int:
        """Append an op to the end of its lane.

        Args:
            rank, lane: Where it runs (ops of one lane are serial, in insertion order).
            kind: ``compute``, ``comm``, ``host`` or ``memcpy``.
            name: Label (what-if name patterns match it).
            duration_s: Intrinsic duration in seconds (for a collective: transfer time once all are ready).
            deps: Node ids that must finish first (besides the previous op of the lane).
            step: Step number.
            coll: Collective group id: every op with the same id is one collective.
            coll_type, nbytes: Collective type and payload bytes.
            release_s: Earliest start, seconds after the step origin.
            dep_type: Edge ``type`` given to ``deps``.
            **extra: Further node attributes (``shapes``, ``peer``, ``partial``, ``measured_start_s`` ...).

        Returns:
            The new node id.
        """
        if kind not in KIND_CODES:
            raise ValueError(f"unknown op kind {kind!r}; expected one of {sorted(KIND_CODES)}")
        c = self.cols
        nid = len(c["rank"])
        key = (rank, lane, step)
        prev = self._lane_tail.get(key)
        c["rank"].append(rank)
        c["lane"].append(lane)
        c["seq"].append(0 if prev is None else c["seq"][prev] + 1)
        c["kind"].append(kind)
        c["name"].append(name)
        c["duration_s"].append(float(duration_s))
        c["step"].append(step)
        c["release_s"].append(float(release_s))
        c["coll"].append(coll)
        c["coll_type"].append(coll_type)
        c["bytes"].append(float(nbytes))
        c["gap_s"].append(float(extra.pop("gap_s", 0.0)))
        if extra:
            self.extra[nid] = extra
        if prev is not None:
            self.edges.append((prev, nid, "program"))
        for d in deps:
            if d != prev:
                self.edges.append((d, nid, dep_type))
        self._lane_tail[key] = nid
        return nid

    def insert_before(self, nid: int, kind: str, name: str, duration_s: float, *, deps: Iterable[int] = (),
                      dep_type: str = "delay", **extra: Any) -> int:
        """Insert an op just before ``nid`` on its lane; it waits for ``deps`` and ``nid`` waits for it."""
        c = self.cols
        new = len(c["rank"])
        for col in self._COLS:
            c[col].append(c[col][nid])
        c["kind"][new], c["name"][new], c["duration_s"][new] = kind, name, float(duration_s)
        c["seq"][new] = c["seq"][nid] - 0.5
        c["coll"][new] = c["coll_type"][new] = None
        c["bytes"][new], c["release_s"][new], c["gap_s"][new] = 0.0, 0.0, 0.0
        if extra:
            self.extra[new] = extra
        for d in deps:
            self.edges.append((d, new, dep_type))
        self.edges.append((new, nid, dep_type))
        return new

    def add_dep(self, u: int, v: int, dep_type: str = "data") -> None:
        """``v`` cannot start before ``u`` ends."""
        if u != v:
            self.edges.append((u, v, dep_type))

    def set(self, nid: int, **attrs: Any) -> None:
        """Change attributes of an op already added (``duration_s``, ``release_s``, extras ...)."""
        for k, v in attrs.items():
            if k in self.cols:
                self.cols[k][nid] = v
            else:
                self.extra.setdefault(nid, {})[k] = v

    def node(self, nid: int) -> dict[str, Any]:
        """All attributes of one op."""
        a = {"partial": False, "wait": False}
        a.update({k: col[nid] for k, col in self.cols.items()})
        a.update(self.extra.get(nid, {}))
        return a

    def build(self) -> nx.DiGraph:
        """The networkx graph (attributes as in the module docstring)."""
        G = nx.DiGraph()
        G.graph.update(self.graph_attrs)
        G.add_nodes_from((i, self.node(i)) for i in range(len(self)))
        G.add_edges_from((u, v, {"type": t}) for u, v, t in self.edges)
        return G

    def compile(self) -> CompiledGraph:
        """The replay's array form, without going through networkx."""
        c = self.cols
        partial = [bool(self.extra.get(i, {}).get("partial", False)) for i in self.extra]
        pset = {i for i, p in zip(self.extra, partial) if p}
        return _compile_cols(list(range(len(self))), c["rank"], c["lane"], c["seq"], c["kind"], c["name"],
                             c["duration_s"], c["step"], c["release_s"],
                             [None if i in pset else g for i, g in enumerate(c["coll"])], c["coll_type"],
                             c["bytes"], [(u, v) for u, v, _ in self.edges], c["gap_s"])


def compile_graph(G: nx.DiGraph) -> CompiledGraph:
    """Array form of a networkx graph; lane order from ``seq`` (program-order edges are implied)."""
    ids = list(G.nodes)
    at = [G.nodes[i] for i in ids]
    return _compile_cols(ids, [a["rank"] for a in at], [a["lane"] for a in at], [a.get("seq", 0) for a in at],
                         [a["kind"] for a in at], [a.get("name", "") for a in at], [a["duration_s"] for a in at],
                         [a.get("step", 0) or 0 for a in at], [a.get("release_s", 0.0) or 0.0 for a in at],
                         [None if a.get("partial") else a.get("coll") for a in at], [a.get("coll_type") for a in at],
                         [a.get("bytes", 0.0) or 0.0 for a in at], list(G.edges()),
                         [a.get("gap_s", 0.0) or 0.0 for a in at])


def _compile_cols(ids, ranks, lanes, seqs, kinds, names, durs, steps, rels, colls, ctypes, nbytes,
                  edges, gaps) -> CompiledGraph:
    n = len(ids)
    pos = None if ids == list(range(n)) else {nid: i for i, nid in enumerate(ids)}
    # Steps replay independently (each from its own origin): a lane of step 5 is not the same queue as step 4's.
    lane_ix: dict[tuple[int, str, int], int] = {}
    lane = [lane_ix.setdefault((r, l, s), len(lane_ix)) for r, l, s in zip(ranks, lanes, steps)]
    gix: dict[Any, int] = {}
    groups: list[list[int]] = []
    grp = [-1] * n
    for i, c in enumerate(colls):
        if c is not None:
            g = gix.get(c)
            if g is None:
                g = gix[c] = len(groups)
                groups.append([])
            groups[g].append(i)
            grp[i] = g
    # Program order: consecutive ops of a lane by seq (ties by insertion order). Edges are deduplicated as
    # integers u * n + v (a set of a million ints is far cheaper than one of a million tuples).
    by_lane: dict[int, list[int]] = {}
    for i in range(n):
        by_lane.setdefault(lane[i], []).append(i)
    keys: set[int] = set()
    add = keys.add
    for lst in by_lane.values():
        if any(seqs[a] > seqs[b] for a, b in zip(lst, lst[1:])):
            lst.sort(key=lambda i: (seqs[i], i))
        for u, v in zip(lst, lst[1:]):
            add(u * n + v)
    for u, v in edges:
        if pos is not None:
            u, v = pos[u], pos[v]
        if u != v:
            add(u * n + v)
    counts = [0] * (n + 1)
    indeg = [0] * n
    pairs = sorted(keys)  # sorted by u, then v: CSR rows come out in order
    idx = [0] * len(pairs)
    for k, key in enumerate(pairs):
        u, v = divmod(key, n)
        counts[u + 1] += 1
        indeg[v] += 1
        idx[k] = v
    for i in range(n):
        counts[i + 1] += counts[i]
    return CompiledGraph(node_ids=ids, rank=list(ranks), lane=lane, kind=[KIND_CODES[k] for k in kinds],
                         step=[int(s) for s in steps], name=list(names), dur_s=[max(0.0, float(d)) for d in durs],
                         release_s=[float(r) for r in rels], group=grp, groups=groups, succ_ptr=counts,
                         succ_idx=idx, indeg=indeg,
                         lanes=[(k[0], k[1]) for k, _ in sorted(lane_ix.items(), key=lambda kv: kv[1])],
                         coll_bytes=[float(b) for b in nbytes], coll_type=list(ctypes),
                         gap_s=[max(0.0, float(g)) for g in gaps])
