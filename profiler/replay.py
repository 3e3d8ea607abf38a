"""Discrete-event replay of a dataflow graph (measured or synthetic) -> per-step time and a :class:`Timeline`.

Semantics (dPRO's per-resource list scheduling, ``../shared/notes/profiler.md`` §1.4, with collectives as
barriers):

* every lane (host thread, GPU stream, comm channel) runs its ops one at a time, in ``seq`` order;
* an op becomes ready when its lane predecessor and all its graph predecessors have ended, and not before its
  ``release_s``; it starts ``gap_s`` later (launch latency) and runs for ``duration_s``;
* the members of one collective each become ready on their own lane; the transfer starts when the last member
  is ready and every member ends ``duration_s`` (its transfer time) later. The early members hold their lane
  while they wait, as an NCCL kernel spins on its stream.

Lanes are FIFO and durations fixed, so each op's start is the max over its constraints and the schedule is
computed in one topological sweep (Kahn's algorithm on CSR arrays) -- no event heap is needed. A cycle
(collectives issued in different orders on different ranks) is reported as a :class:`MeshplanError` naming a
stuck collective.
"""
from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from meshplan.core.errors import MeshplanError
from meshplan.profiler.dataflow_graph import CompiledGraph, compile_graph


@dataclass
class Timeline:
    """The replay's schedule.

    Attributes:
        graph: The compiled graph replayed (node index i <-> ``graph.node_ids[i]``).
        start_s, end_s: Per node index, seconds after its step's origin. A collective member's start is when it
            became ready (it may wait for peers inside [start, end)).
        cause: Per node index, the node whose end fixed its start (-1: lane start or ``release_s``). For a
            collective member it is the last-arriving member.
        steps: step -> replayed step time, seconds (latest end of the step's ops).
    """

    graph: CompiledGraph
    start_s: list[float]
    end_s: list[float]
    cause: list[int]
    steps: dict[int, float]

    def step_nodes(self, step: int) -> list[int]:
        return [i for i, s in enumerate(self.graph.step) if s == step]


def replay(G: nx.DiGraph | CompiledGraph) -> Timeline:
    """Replay a graph.

    Args:
        G: A graph from :func:`profiler.trace_to_graph.build_graph` or
            :class:`profiler.dataflow_graph.GraphBuilder`, or its compiled form.

    Returns:
        The :class:`Timeline`.

    Raises:
        MeshplanError: The graph has a dependency cycle (e.g. collectives in different orders on two ranks).
    """
    cg = G if isinstance(G, CompiledGraph) else compile_graph(G)
    n = cg.n
    dur = cg.dur_s
    gap = cg.gap_s
    ptr = cg.succ_ptr
    idx = cg.succ_idx
    grp = cg.group
    groups = cg.groups
    indeg = cg.indeg[:]
    ready = cg.release_s[:]
    cause = [-1] * n
    start = [0.0] * n
    end = [0.0] * n
    gpend = [len(m) for m in groups]
    gready = [0.0] * len(groups)
    glast = [-1] * len(groups)
    stack = [i for i in range(n) if indeg[i] == 0]
    pop = stack.pop
    push = stack.append
    done = 0
    while stack:
        i = pop()
        g = grp[i]
        if g >= 0:
            # A collective member: wait until every member is ready, then all end together.
            r = ready[i] + gap[i]
            ready[i] = r
            if glast[g] < 0 or r > gready[g]:
                gready[g] = r
                glast[g] = i
            gpend[g] -= 1
            if gpend[g]:
                continue
            t0 = gready[g]
            last = glast[g]
            for m in groups[g]:
                start[m] = ready[m]
                e = t0 + dur[m]
                end[m] = e
                if m != last:
                    cause[m] = last
                done += 1
                for k in range(ptr[m], ptr[m + 1]):
                    j = idx[k]
                    if e > ready[j]:
                        ready[j] = e
                        cause[j] = m
                    indeg[j] -= 1
                    if not indeg[j]:
                        push(j)
            continue
        s = ready[i] + gap[i]
        start[i] = s
        e = s + dur[i]
        end[i] = e
        done += 1
        for k in range(ptr[i], ptr[i + 1]):
            j = idx[k]
            if e > ready[j]:
                ready[j] = e
                cause[j] = i
            indeg[j] -= 1
            if not indeg[j]:
                push(j)
    if done < n:
        raise _deadlock(cg, gpend, indeg, done)
    return Timeline(graph=cg, start_s=start, end_s=end, cause=cause, steps=_step_ends(cg.step, end))


def _deadlock(cg: CompiledGraph, gpend: list[int], indeg: list[int], done: int) -> MeshplanError:
    """Why a replay stopped with ops never ready: the first collective still missing participants, else a cycle."""
    groups = cg.groups
    stuck = [g for g in range(len(groups)) if gpend[g] > 0]
    if stuck:
        g = stuck[0]
        m = groups[g][0]
        waiting = sorted({cg.rank[x] for x in groups[g] if indeg[x] == 0})
        return MeshplanError(f"replay deadlock: collective {cg.coll_type[m] or cg.name[m]!r} (group of "
                             f"{len(groups[g])} ranks) never gets all participants ready; ready on ranks "
                             f"{waiting[:8]} - collectives issued in different orders?")
    return MeshplanError(f"replay deadlock: {cg.n - done} of {cg.n} ops never became ready (dependency cycle)")


def _step_ends(step: list[int], end: list[float]) -> dict[int, float]:
    """step -> the latest end of its ops, seconds, in step order."""
    steps: dict[int, float] = {}
    for i in range(len(step)):
        s = step[i]
        e = end[i]
        if e > steps.get(s, -1.0):
            steps[s] = e
    return dict(sorted(steps.items()))
