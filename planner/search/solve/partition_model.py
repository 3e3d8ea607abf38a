"""The CP-SAT model of one partition option (``PartitionModel``), see :mod:`planner.search.solve.partition`."""
from __future__ import annotations

from typing import Optional, Sequence

from ortools.sat.python import cp_model

from meshplan.core.errors import MeshplanError
from meshplan.planner.search.solve.common import ticks, ticks_down, ticks_up
from meshplan.planner.search.solve.partition_data import PartitionProblem, PipelineOption, StageRun


def _blocks(problem: PartitionProblem, opt: PipelineOption) -> list[tuple[int, int]]:
    """Runs ``[start, end)`` of consecutive layers whose every number is identical (interchangeable layers)."""

    def row(l):
        return (tuple(tuple(map(tuple, ph.layer_time_s[l])) for ph in opt.phases),
                tuple(map(tuple, opt.static_bytes[l])), tuple(map(tuple, opt.act_bytes[l])),
                tuple(problem.sensitivity[l]))

    out, start = [], 0
    for l in range(1, problem.num_layers + 1):
        if l == problem.num_layers or row(l) != row(start):
            out.append((start, l))
            start = l
    return out


class PartitionModel:
    """The CP-SAT model of one option. ``goal``: ``time`` (default), ``quality`` or ``overflow`` (diagnosis).

    Formulation (positions, not layers, carry the structure, which keeps the model small and its LP bound tight):
    ``K`` stage positions in pipeline order; ``P_k`` = first layer of position ``k`` (monotone, ``P_0 = 0``,
    ``P_K = L``); ``y[k][g]`` = position ``k`` runs on group ``g``; used positions form a prefix. Consecutive
    layers with identical numbers form a block; ``c[b][k]`` = layers of block ``b`` in position ``k`` is the overlap
    of two integer ranges (min/max constraints), split by precision and group into counts ``n[b,k,g,p]``.
    Per-layer data that all differ give one block per layer, and the counts become booleans.
    """

    def __init__(self, problem: PartitionProblem, option: int, goal: str = "time",
                 enforce_quality: bool = True, cutoff: Optional[int] = None):
        self.problem, self.option = problem, option
        self.opt = opt = problem.options[option]
        L = problem.num_layers
        K = self.K = min(L, sum(max(0, g.max_stages) for g in problem.groups))
        if K == 0:
            raise MeshplanError("partition: the cluster offers no stage units (every group has max_stages 0)")
        self.blocks = _blocks(problem, opt)
        self.m = cp_model.CpModel()
        for (s, _) in self.blocks:
            if not any(self._ok(s, g, p) for g in range(len(problem.groups)) for p in range(len(problem.precisions))):
                raise MeshplanError(f"partition: layer {s} has no device group and precision that can run it")
        self._add_positions()
        self._add_counts()
        self._add_memory(goal)
        self._add_quality(enforce_quality)
        self._add_time()
        m = self.m
        if goal == "time":
            if cutoff is not None:
                m.add(self.time_obj <= cutoff)
            m.minimize(self.time_obj)
        elif goal == "quality":
            m.minimize(self.quality)
        else:
            m.minimize(self.overflow)

    def _ok(self, layer: int, g: int, p: int) -> bool:
        """Whether group ``g`` can run ``layer`` at precision ``p``."""
        opt = self.opt
        return (self.problem.groups[g].max_stages > 0 and opt.static_bytes[layer][g][p] is not None
                and all(ph.layer_time_s[layer][g][p] is not None for ph in opt.phases))

    def _add_positions(self) -> None:
        """Positions: boundaries ``P``, group choice ``y``, a prefix of used positions."""
        problem, m, K = self.problem, self.m, self.K
        L, G = problem.num_layers, len(problem.groups)
        self.P = bnd = [m.new_constant(0)] + [m.new_int_var(0, L, f"P{k}") for k in range(1, K)] + [m.new_constant(L)]
        self.y = y = [[m.new_bool_var(f"y{k}_{g}") if problem.groups[g].max_stages > 0 else None for g in range(G)]
                      for k in range(K)]
        self.used = used = []
        for k in range(K):
            u = sum(v for v in y[k] if v is not None)
            m.add(u <= 1)
            m.add(bnd[k + 1] - bnd[k] >= u)
            m.add(bnd[k + 1] - bnd[k] <= L * u)
            used.append(u)
        for k in range(K - 1):
            m.add(used[k] >= used[k + 1])
        for g in range(G):
            if problem.groups[g].max_stages > 0:
                m.add(sum(y[k][g] for k in range(K)) <= problem.groups[g].max_stages)

    def _add_counts(self) -> None:
        """Block/position overlap and its split into (group, precision) counts ``n``."""
        problem, m, K, bnd, y = self.problem, self.m, self.K, self.P, self.y
        L, G, P = problem.num_layers, len(problem.groups), len(problem.precisions)
        self.n = n = {}
        for bi, (s, e) in enumerate(self.blocks):
            size = e - s
            for k in range(K):
                hi = m.new_int_var(0, L, "")
                lo = m.new_int_var(0, L, "")
                m.add_min_equality(hi, [bnd[k + 1], e])
                m.add_max_equality(lo, [bnd[k], s])
                c = m.new_int_var(0, size, f"c{bi}_{k}")
                m.add_max_equality(c, [0, hi - lo])
                cells = []
                for g in range(G):
                    for p in range(P):
                        if self._ok(s, g, p):
                            v = n[bi, k, g, p] = m.new_int_var(0, size, f"n{bi}_{k}_{g}_{p}")
                            m.add(v <= size * y[k][g])
                            cells.append(v)
                m.add(sum(cells) == c)
        for bi, (s, e) in enumerate(self.blocks):  # redundant: every layer of a block is placed
            m.add(sum(v for key, v in n.items() if key[0] == bi) == e - s)
        self.keys_k = [[key for key in n if key[1] == k] for k in range(K)]

    def _add_memory(self, goal: str) -> None:
        """Memory per position: static + activation x micro-batches in flight (1F1B: min(cap, stages from here
        on)); ``goal == "overflow"`` measures by how much the capacity is missed instead."""
        problem, opt, m, n, blocks, y = self.problem, self.opt, self.m, self.n, self.blocks, self.y
        G, mq = len(problem.groups), problem.memory_quantum_bytes
        static_t = {key: ticks_up(opt.static_bytes[blocks[key[0]][0]][key[2]][key[3]], mq) for key in n}
        act_t = {key: ticks_up(opt.act_bytes[blocks[key[0]][0]][key[2]][key[3]] or 0.0, mq) for key in n}
        has_act = any(act_t.values())
        cap_t = [ticks_down(gs.memory_bytes, mq) for gs in problem.groups]
        big_mem = sum(max(static_t[key] + act_t[key] * opt.inflight_cap for key in n if key[0] == bi) * (e - s)
                      for bi, (s, e) in enumerate(blocks))
        self.overflow = m.new_int_var(0, big_mem, "overflow") if goal == "overflow" else 0
        for k in range(self.K):
            mem = sum(static_t[key] * n[key] for key in self.keys_k[k])
            if has_act:
                f = m.new_int_var(0, max(1, opt.inflight_cap), f"f{k}")
                m.add_min_equality(f, [sum(self.used[k:]), max(1, opt.inflight_cap)])
                act_sum = m.new_int_var(0, big_mem, f"act{k}")
                m.add(act_sum == sum(act_t[key] * n[key] for key in self.keys_k[k]))
                act_mem = m.new_int_var(0, big_mem * max(1, opt.inflight_cap), f"actmem{k}")
                m.add_multiplication_equality(act_mem, [act_sum, f])
                mem = mem + act_mem
            m.add(mem <= sum(cap_t[g] * y[k][g] for g in range(G) if y[k][g] is not None) + self.overflow)

    def _add_quality(self, enforce_quality: bool) -> None:
        """The summed sensitivity of the chosen precisions, bounded by the quality budget."""
        problem, n, blocks, qq = self.problem, self.n, self.blocks, self.problem.quality_quantum
        sens_t = {key: ticks_up(problem.sensitivity[blocks[key[0]][0]][key[3]], qq) for key in n}
        self.quality = sum(sens_t[key] * n[key] for key in n)
        if enforce_quality and problem.quality_budget is not None:
            self.m.add(self.quality <= ticks_down(problem.quality_budget, qq))

    def _add_time(self) -> None:
        """Time per phase: sum of stage times + links + (m - 1) * slowest stage or link (``time_obj``)."""
        problem, opt, n, blocks = self.problem, self.opt, self.n, self.blocks
        obj_terms = []
        for pi, ph in enumerate(opt.phases):
            tt = {key: ticks(ph.layer_time_s[blocks[key[0]][0]][key[2]][key[3]], problem.time_quantum_s)
                  for key in n}
            stage_t = [sum(tt[key] * n[key] for key in self.keys_k[k]) for k in range(self.K)]
            bc, max_link = self._link_terms(pi, ph)
            term = sum(stage_t) + sum(bc)
            if ph.num_micro_batches > 1:
                term = term + (ph.num_micro_batches - 1) * self._slowest(pi, tt, stage_t, bc, max_link)
            obj_terms.append(ph.weight * term)
        self.time_obj = sum(obj_terms)

    def _link_terms(self, pi: int, ph) -> tuple[list, int]:
        """(the transfer time between each pair of neighbouring positions, the longest link time) of phase ``pi``."""
        problem, m, y = self.problem, self.m, self.y
        G, tq = len(problem.groups), problem.time_quantum_s
        link_t = [[ticks(ph.link_time_s[g][h], tq) for h in range(G)] for g in range(G)]
        max_link = max((x for row in link_t for x in row), default=0)
        bc = []
        for k in range(self.K - 1):
            if max_link == 0:
                break
            c = m.new_int_var(0, max_link, f"link{pi}_{k}")
            for g in range(G):
                for h in range(G):
                    if link_t[g][h] > 0 and y[k][g] is not None and y[k + 1][h] is not None:
                        m.add(c >= link_t[g][h] * (y[k][g] + y[k + 1][h] - 1))
            bc.append(c)
        return bc, max_link

    def _slowest(self, pi: int, tt: dict, stage_t: list, bc: list, max_link: int):
        """The slowest stage or link of phase ``pi``, with the load-balance cut that tightens its LP bound."""
        problem, m, n = self.problem, self.m, self.n
        big_t = sum(max(tt[key] for key in n if key[0] == bi) * (e - s) for bi, (s, e) in enumerate(self.blocks))
        mx = m.new_int_var(0, big_t + max_link, f"max{pi}")
        for k in range(self.K):
            m.add(mx >= stage_t[k])
        for c in bc:
            m.add(mx >= c)
        # redundant cut (load balance): group g's stages share its layers' time, so
        # max_stages[g] * slowest >= time of the layers on g. Tightens the LP bound.
        for g in range(len(problem.groups)):
            if problem.groups[g].max_stages > 0:
                m.add(problem.groups[g].max_stages * mx >= sum(tt[key] * n[key] for key in n if key[2] == g))
        return mx

    def hint(self, runs: Sequence[StageRun], precisions: Sequence[str]) -> None:
        """Give CP-SAT a complete starting solution (e.g. from :func:`_heuristic`)."""
        L, m = self.problem.num_layers, self.m
        pidx = [self.problem.precisions.index(p) for p in precisions]
        for k in range(1, self.K):
            m.add_hint(self.P[k], runs[k].first if k < len(runs) else L)
        for k in range(self.K):
            for g, v in enumerate(self.y[k]):
                if v is not None:
                    m.add_hint(v, k < len(runs) and runs[k].group == g)
        counts = {}
        for k, r in enumerate(runs):
            for l in range(r.first, r.first + r.count):
                bi = next(i for i, (s, e) in enumerate(self.blocks) if s <= l < e)
                key = (bi, k, r.group, pidx[l])
                counts[key] = counts.get(key, 0) + 1
        for key, v in self.n.items():
            m.add_hint(v, counts.get(key, 0))

    def extract(self, solver: cp_model.CpSolver) -> tuple[tuple[StageRun, ...], tuple[str, ...]]:
        L = self.problem.num_layers
        runs, precs = [], [None] * L
        for k in range(self.K):
            a, b = solver.value(self.P[k]), solver.value(self.P[k + 1])
            if b <= a:
                continue
            g = next(g for g, v in enumerate(self.y[k]) if v is not None and solver.boolean_value(v))
            runs.append(StageRun(a, b - a, g))
            for bi, (s, e) in enumerate(self.blocks):
                lo = max(a, s)
                for p in range(len(self.problem.precisions)):
                    v = self.n.get((bi, k, g, p))
                    cnt = solver.value(v) if v is not None else 0
                    for l in range(lo, lo + cnt):
                        precs[l] = self.problem.precisions[p]
                    lo += cnt
        return tuple(runs), tuple(precs)
