"""Heterogeneous pipeline partition with per-layer precision: one exact CP-SAT model.

Decisions: which layers form each pipeline stage (contiguous, possibly unequal runs), which device group runs
each stage (at most ``max_stages`` stages per group), the precision of every layer (where its group supports
it), and the micro-batching (one :class:`PipelineOption` per candidate; each is solved, the best kept).

Step time of one pipeline pass with ``m`` micro-batches (the synchronous-pipeline formula of GPipe, Huang et al.
2019, §2.2, generalised to unequal stages as in PipeDream-2BW/Alpa: fill and drain traverse every stage and every
link once, the steady state repeats the slowest of them ``m - 1`` times):

    T = sum_s t_s + sum_b c_b + (m - 1) * max(max_s t_s, max_b c_b)

with ``t_s`` the stage's time per micro-batch (sum of its layers' times at their precisions on its device) and
``c_b`` the time to cross stage boundary ``b`` (activation forward + gradient backward, per micro-batch).
Serving has two passes (prefill once, decode ``gen_len - 1`` times, LLM-PQ, Zhao et al. 2024, §4.2), each a
:class:`Phase` with its own micro-batch count and weight; the objective is the weighted sum.

Memory per stage (per device): the layers' static bytes (weights, gradients, optimizer state, KV cache) plus
activation bytes times the micro-batches in flight; under 1F1B the stage at position ``s`` of ``S`` holds
``min(m, S - s)`` of them (Narayanan et al. 2021, §2.2.1).

Quality: the sum of per-layer sensitivity indicators of the chosen precisions stays within a budget.

The CP-SAT model uses one boolean per (layer, group, precision) and one per layer boundary; stage time and
memory are running sums that reset at a boundary, so the model grows linearly in the layer count.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

from ortools.sat.python import cp_model

from meshplan.core.errors import MeshplanError
from meshplan.planner.plan import Stage
from meshplan.planner.solve.common import (
    DEFAULT_MEMORY_QUANTUM_BYTES,
    DEFAULT_QUALITY_QUANTUM,
    DEFAULT_TIME_QUANTUM_S,
    SolverStatus,
    make_solver,
    ticks,
    ticks_down,
    ticks_up,
)

GiB = 2**30
Table = Sequence[Sequence[Sequence[Optional[float]]]]  # [layer][group][precision]; None = not supported


@dataclass(frozen=True)
class GroupSlot:
    """A device group as the partition solver sees it.

    Attributes:
        name: Device name shown in messages (e.g. ``T4``).
        max_stages: Stage units the group offers (devices, or nodes when a stage spans a node).
        memory_bytes: Memory of one stage unit, bytes (per device when a stage is one device).
    """

    name: str
    max_stages: int
    memory_bytes: float


@dataclass(frozen=True)
class Phase:
    """One pipeline pass.

    Attributes:
        name: ``step`` (training), ``prefill`` or ``decode``.
        num_micro_batches: ``m`` in the step-time formula.
        weight: Times the pass counts in the objective (1; ``gen_len - 1`` for decode).
        layer_time_s: Seconds per micro-batch, ``[layer][group][precision]``; ``None`` = unsupported.
        link_time_s: Seconds per micro-batch to cross one stage boundary, ``[from group][to group]``.
    """

    name: str
    num_micro_batches: int
    weight: int
    layer_time_s: Table
    link_time_s: Sequence[Sequence[float]]


@dataclass(frozen=True)
class PipelineOption:
    """One candidate micro-batching (and everything that depends on the micro-batch size).

    Attributes:
        label: Shown in results, e.g. ``micro_batch=2 x 16``.
        phases: The passes of one step / one request batch.
        static_bytes: Per-device bytes of each layer independent of micro-batches in flight, ``[layer][group][precision]``.
        act_bytes: Per-device activation bytes of each layer for one micro-batch in flight (0 when serving).
        inflight_cap: Micro-batches a 1F1B stage holds at most (the step's ``m``).
        micro_batch: Sequences per micro-batch (reported only).
    """

    label: str
    phases: tuple[Phase, ...]
    static_bytes: Table
    act_bytes: Table
    inflight_cap: int = 1
    micro_batch: int = 1


@dataclass(frozen=True)
class PartitionProblem:
    """Plain numbers for one partition + precision problem.

    Attributes:
        precisions: Names of the precision columns, e.g. ``("bf16", "fp8")``.
        groups: Device groups (columns of the tables).
        options: Micro-batching candidates; the solver returns the best over all of them.
        sensitivity: Quality indicator per ``[layer][precision]`` (0 for the reference precision).
        quality_budget: Bound on the sum of the chosen indicators; ``None`` = unbounded.
        time_quantum_s, memory_quantum_bytes, quality_quantum: Integer scaling of the CP-SAT model.
    """

    precisions: tuple[str, ...]
    groups: tuple[GroupSlot, ...]
    options: tuple[PipelineOption, ...]
    sensitivity: Sequence[Sequence[float]]
    quality_budget: Optional[float] = None
    time_quantum_s: float = DEFAULT_TIME_QUANTUM_S
    memory_quantum_bytes: float = DEFAULT_MEMORY_QUANTUM_BYTES
    quality_quantum: float = DEFAULT_QUALITY_QUANTUM

    @property
    def num_layers(self) -> int:
        return len(self.sensitivity)


@dataclass(frozen=True)
class StageRun:
    """A stage of a solution: layers ``[first, first + count)`` on group ``group``."""

    first: int
    count: int
    group: int


@dataclass(frozen=True)
class Evaluation:
    """A partition priced in unscaled units.

    Attributes:
        objective_s: Weighted sum of the phases' pass times, seconds.
        phase_times_s: Each phase's pass time (unweighted), seconds.
        stage_memory_bytes: Peak bytes per device of each stage.
        quality: Sum of the chosen indicators.
        violations: Human-readable constraint violations (empty = feasible).
    """

    objective_s: float
    phase_times_s: tuple[float, ...]
    stage_memory_bytes: tuple[float, ...]
    quality: float
    violations: tuple[str, ...] = ()

    @property
    def feasible(self) -> bool:
        return not self.violations


@dataclass(frozen=True)
class PartitionSolution:
    """The solver's answer.

    Attributes:
        option: Index of the chosen :class:`PipelineOption`.
        stages: Stage runs in pipeline order.
        layer_precision: Precision name per layer.
        evaluation: The plan priced in unscaled units.
        status: How the solve ended (objective and bound in seconds).
    """

    option: int
    stages: tuple[StageRun, ...]
    layer_precision: tuple[str, ...]
    evaluation: Evaluation
    status: SolverStatus
    label: str = ""
    notes: tuple[str, ...] = field(default=())

    def plan_stages(self) -> tuple[Stage, ...]:
        """The stages as :class:`planner.plan.Stage` values for a ``Plan``."""
        return tuple(Stage(first_layer=s.first, num_layers=s.count, device_group=s.group) for s in self.stages)


def evaluate(problem: PartitionProblem, option: int, stages: Sequence[StageRun],
             layer_precision: Sequence[str]) -> Evaluation:
    """Price a given partition (the solver's or a baseline's) with the same formulas, in floats.

    Args:
        problem: The problem.
        option: Index of the micro-batching option.
        stages: Contiguous stage runs covering every layer in order.
        layer_precision: Precision name of every layer.

    Raises:
        MeshplanError: a precision a stage's device lacks, or runs that do not cover the layers.
    """
    opt = problem.options[option]
    L = problem.num_layers
    covered = [l for s in stages for l in range(s.first, s.first + s.count)]
    if covered != list(range(L)):
        raise MeshplanError(f"partition: stages {[(s.first, s.count) for s in stages]} do not cover layers 0..{L - 1}")
    pidx = [problem.precisions.index(p) for p in layer_precision]
    S = len(stages)
    violations = []
    used = [0] * len(problem.groups)
    for s in stages:
        used[s.group] += 1
    for g, n in enumerate(used):
        if n > problem.groups[g].max_stages:
            violations.append(f"{problem.groups[g].name}: {n} stages > {problem.groups[g].max_stages} available")
    for s in stages:
        for l in range(s.first, s.first + s.count):
            if any(ph.layer_time_s[l][s.group][pidx[l]] is None for ph in opt.phases) \
                    or opt.static_bytes[l][s.group][pidx[l]] is None:
                raise MeshplanError(f"device {problem.groups[s.group].name} does not support {layer_precision[l]} "
                                    f"(layer {l})")
    phase_times = []
    for ph in opt.phases:
        st = [sum(ph.layer_time_s[l][s.group][pidx[l]] for l in range(s.first, s.first + s.count)) for s in stages]
        links = [ph.link_time_s[stages[i].group][stages[i + 1].group] for i in range(S - 1)]
        phase_times.append(sum(st) + sum(links) + (ph.num_micro_batches - 1) * max(st + links))
    objective = sum(ph.weight * t for ph, t in zip(opt.phases, phase_times))
    mem = []
    for i, s in enumerate(stages):
        inflight = min(opt.inflight_cap, S - i)
        mb = sum(opt.static_bytes[l][s.group][pidx[l]] + opt.act_bytes[l][s.group][pidx[l]] * inflight
                 for l in range(s.first, s.first + s.count))
        mem.append(mb)
        cap = problem.groups[s.group].memory_bytes
        if mb > cap:
            violations.append(f"stage {i} on {problem.groups[s.group].name}: {mb / GiB:.2f} GiB > {cap / GiB:.2f} GiB")
    quality = sum(problem.sensitivity[l][pidx[l]] for l in range(L))
    if problem.quality_budget is not None and quality > problem.quality_budget * (1 + 1e-9):
        violations.append(f"quality cost {quality:.4g} > budget {problem.quality_budget:.4g}")
    return Evaluation(objective, tuple(phase_times), tuple(mem), quality, tuple(violations))


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


class _Model:
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
        opt = problem.options[option]
        tq, mq, qq = problem.time_quantum_s, problem.memory_quantum_bytes, problem.quality_quantum
        L, G, P = problem.num_layers, len(problem.groups), len(problem.precisions)
        K = self.K = min(L, sum(max(0, g.max_stages) for g in problem.groups))
        if K == 0:
            raise MeshplanError("partition: the cluster offers no stage units (every group has max_stages 0)")
        self.blocks = blocks = _blocks(problem, opt)
        m = self.m = cp_model.CpModel()

        def ok(l, g, p):
            return (problem.groups[g].max_stages > 0 and opt.static_bytes[l][g][p] is not None
                    and all(ph.layer_time_s[l][g][p] is not None for ph in opt.phases))

        for (s, _) in blocks:
            if not any(ok(s, g, p) for g in range(G) for p in range(P)):
                raise MeshplanError(f"partition: layer {s} has no device group and precision that can run it")
        # positions: boundaries, group choice, prefix of used positions
        self.P = bnd = [m.new_constant(0)] + [m.new_int_var(0, L, f"P{k}") for k in range(1, K)] + [m.new_constant(L)]
        self.y = y = [[m.new_bool_var(f"y{k}_{g}") if problem.groups[g].max_stages > 0 else None for g in range(G)]
                      for k in range(K)]
        used = []
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
        # block/position overlap and its split into (group, precision) counts
        self.n = n = {}
        for bi, (s, e) in enumerate(blocks):
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
                        if ok(s, g, p):
                            v = n[bi, k, g, p] = m.new_int_var(0, size, f"n{bi}_{k}_{g}_{p}")
                            m.add(v <= size * y[k][g])
                            cells.append(v)
                m.add(sum(cells) == c)
        for bi, (s, e) in enumerate(blocks):  # redundant: every layer of a block is placed
            m.add(sum(v for key, v in n.items() if key[0] == bi) == e - s)
        keys_k = [[key for key in n if key[1] == k] for k in range(K)]
        # memory per position: static + activation x micro-batches in flight (1F1B: min(cap, stages from here on))
        static_t = {key: ticks_up(opt.static_bytes[blocks[key[0]][0]][key[2]][key[3]], mq) for key in n}
        act_t = {key: ticks_up(opt.act_bytes[blocks[key[0]][0]][key[2]][key[3]] or 0.0, mq) for key in n}
        has_act = any(act_t.values())
        cap_t = [ticks_down(gs.memory_bytes, mq) for gs in problem.groups]
        big_mem = sum(max(static_t[key] + act_t[key] * opt.inflight_cap for key in n if key[0] == bi) * (e - s)
                      for bi, (s, e) in enumerate(blocks))
        self.overflow = m.new_int_var(0, big_mem, "overflow") if goal == "overflow" else 0
        for k in range(K):
            mem = sum(static_t[key] * n[key] for key in keys_k[k])
            if has_act:
                f = m.new_int_var(0, max(1, opt.inflight_cap), f"f{k}")
                m.add_min_equality(f, [sum(used[k:]), max(1, opt.inflight_cap)])
                act_sum = m.new_int_var(0, big_mem, f"act{k}")
                m.add(act_sum == sum(act_t[key] * n[key] for key in keys_k[k]))
                act_mem = m.new_int_var(0, big_mem * max(1, opt.inflight_cap), f"actmem{k}")
                m.add_multiplication_equality(act_mem, [act_sum, f])
                mem = mem + act_mem
            m.add(mem <= sum(cap_t[g] * y[k][g] for g in range(G) if y[k][g] is not None) + self.overflow)
        # quality budget
        sens_t = {key: ticks_up(problem.sensitivity[blocks[key[0]][0]][key[3]], qq) for key in n}
        self.quality = sum(sens_t[key] * n[key] for key in n)
        if enforce_quality and problem.quality_budget is not None:
            m.add(self.quality <= ticks_down(problem.quality_budget, qq))
        # time per phase: sum of stage times + links + (m - 1) * slowest stage or link
        obj_terms = []
        for pi, ph in enumerate(opt.phases):
            tt = {key: ticks(ph.layer_time_s[blocks[key[0]][0]][key[2]][key[3]], tq) for key in n}
            stage_t = [sum(tt[key] * n[key] for key in keys_k[k]) for k in range(K)]
            link_t = [[ticks(ph.link_time_s[g][h], tq) for h in range(G)] for g in range(G)]
            max_link = max((x for row in link_t for x in row), default=0)
            bc = []
            for k in range(K - 1):
                if max_link == 0:
                    break
                c = m.new_int_var(0, max_link, f"link{pi}_{k}")
                for g in range(G):
                    for h in range(G):
                        if link_t[g][h] > 0 and y[k][g] is not None and y[k + 1][h] is not None:
                            m.add(c >= link_t[g][h] * (y[k][g] + y[k + 1][h] - 1))
                bc.append(c)
            term = sum(stage_t) + sum(bc)
            if ph.num_micro_batches > 1:
                big_t = sum(max(tt[key] for key in n if key[0] == bi) * (e - s) for bi, (s, e) in enumerate(blocks))
                mx = m.new_int_var(0, big_t + max_link, f"max{pi}")
                for k in range(K):
                    m.add(mx >= stage_t[k])
                for c in bc:
                    m.add(mx >= c)
                # redundant cut (load balance): group g's stages share its layers' time, so
                # max_stages[g] * slowest >= time of the layers on g. Tightens the LP bound.
                for g in range(G):
                    if problem.groups[g].max_stages > 0:
                        m.add(problem.groups[g].max_stages * mx
                              >= sum(tt[key] * n[key] for key in n if key[2] == g))
                term = term + (ph.num_micro_batches - 1) * mx
            obj_terms.append(ph.weight * term)
        self.time_obj = sum(obj_terms)
        if goal == "time":
            if cutoff is not None:
                m.add(self.time_obj <= cutoff)
            m.minimize(self.time_obj)
        elif goal == "quality":
            m.minimize(self.quality)
        else:
            m.minimize(self.overflow)

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


def _heuristic(problem: PartitionProblem, option: int):
    """A quick feasible plan to start from: the k fastest stage units (k = 1..all) at one uniform precision,
    layers split in proportion to unit speed. Returns ``(objective_s, runs, precisions)`` of the best feasible
    one, or ``None``."""
    opt = problem.options[option]
    L, G = problem.num_layers, len(problem.groups)
    ph = opt.phases[0]
    best = None
    for p, pname in enumerate(problem.precisions):
        speed = {}
        for g in range(G):
            cells = [ph.layer_time_s[l][g][p] for l in range(L)]
            if problem.groups[g].max_stages > 0 and all(c is not None for c in cells) and \
                    all(opt.static_bytes[l][g][p] is not None for l in range(L)):
                speed[g] = 1.0 / max(sum(cells), 1e-30)
        units = sorted((g for g in speed for _ in range(problem.groups[g].max_stages)), key=lambda g: -speed[g])
        for k in range(1, min(L, len(units)) + 1):
            use = sorted(units[:k])  # group order keeps same-group stages adjacent (cheap links)
            total = sum(speed[g] for g in use)
            share = [L * speed[g] / total for g in use]
            counts = [max(1, int(x)) for x in share]
            while sum(counts) > L:
                counts[counts.index(max(counts))] -= 1
            order = sorted(range(k), key=lambda i: -(share[i] - int(share[i])))
            i = 0
            while sum(counts) < L:
                counts[order[i % k]] += 1
                i += 1
            runs, first = [], 0
            for g, c in zip(use, counts):
                runs.append(StageRun(first, c, g))
                first += c
            try:
                ev = evaluate(problem, option, runs, [pname] * L)
            except MeshplanError:
                continue
            if ev.feasible and (best is None or ev.objective_s < best[0]):
                best = (ev.objective_s, tuple(runs), tuple([pname] * L))
    return best


def _lower_bound_ticks(problem: PartitionProblem, option: int) -> int:
    """Cheap bound: every layer at its fastest choice, the slowest such layer repeated m-1 times."""
    opt = problem.options[option]
    total = 0
    for ph in opt.phases:
        fastest = [min(ticks(x, problem.time_quantum_s) for row in ph.layer_time_s[l] for x in row if x is not None)
                   for l in range(problem.num_layers)]
        total += ph.weight * (sum(fastest) + (ph.num_micro_batches - 1) * max(fastest))
    return total


def solve_partition(problem: PartitionProblem, time_limit_s: float = 10.0,
                    num_workers: Optional[int] = None) -> PartitionSolution:
    """Exact partition + precision + micro-batching (CP-SAT), best over all options.

    Options are solved in order of a cheap lower bound; an option whose bound cannot beat the incumbent is
    skipped, and each later solve must beat the incumbent strictly, so ties keep the earlier option.

    Args:
        problem: The numbers.
        time_limit_s: Wall-clock budget for all solves together, seconds.
        num_workers: CP-SAT workers (default: the machine's cores, at most 8).

    Returns:
        The best plan; ``status.hit_time_limit`` with ``status.best_bound`` when the budget ran out.

    Raises:
        MeshplanError: no plan exists (names the binding constraint: memory or quality budget, and by how much),
            or none was found within the time limit.
    """
    tq = problem.time_quantum_s
    if problem.quality_budget is not None and not problem.quality_budget >= 0:
        raise MeshplanError(f"quality budget {problem.quality_budget:g}: must be a number >= 0")
    if not problem.options:
        raise MeshplanError("partition: no micro-batching option to solve")
    order = sorted(range(len(problem.options)), key=lambda i: _lower_bound_ticks(problem, i))
    t0 = time.perf_counter()
    best = None  # (ticks, option, runs, precisions)
    bounds, hit_limit, solves, any_unknown = [], False, 0, False
    for i in order:
        lb = _lower_bound_ticks(problem, i)
        if best is not None and lb >= best[0]:
            bounds.append(best[0])
            continue
        left = time_limit_s - (time.perf_counter() - t0)
        if left <= 0:
            hit_limit = True
            bounds.append(lb)
            continue
        model = _Model(problem, i, cutoff=None if best is None else best[0] - 1)
        start = _heuristic(problem, i)
        if start is not None:
            model.hint(start[1], start[2])
        solver = make_solver(left, num_workers)
        code = solver.solve(model.m)
        solves += 1
        if code == cp_model.UNKNOWN and start is not None:  # out of time: keep the heuristic plan if it is better
            obj = ticks(start[0], tq)
            if best is None or obj < best[0]:
                best = (obj, i, start[1], start[2])
            hit_limit = True
            bounds.append(max(lb, int(solver.best_objective_bound)))
            continue
        if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            obj = int(round(solver.objective_value))
            runs, precs = model.extract(solver)
            best = (obj, i, runs, precs)
            bounds.append(int(solver.best_objective_bound))
            hit_limit |= code == cp_model.FEASIBLE
        elif code == cp_model.INFEASIBLE:
            bounds.append(best[0] if best is not None else None)
        else:  # UNKNOWN: time ran out before any plan of this option was found
            hit_limit, any_unknown = True, True
            bounds.append(max(lb, int(solver.best_objective_bound)) if best is None else
                          min(best[0], max(lb, int(solver.best_objective_bound))))
    wall = time.perf_counter() - t0
    if best is None:
        if any_unknown or hit_limit:
            raise MeshplanError(f"partition: no plan found within the {time_limit_s:g} s time limit "
                                f"({len(problem.options)} micro-batch options); raise the time limit")
        _diagnose(problem, time_limit_s, num_workers)
    known = [b for b in bounds if b is not None]
    bound_ticks = min(known + [best[0]])
    _, i, runs, precs = best
    ev = evaluate(problem, i, runs, precs)
    status = SolverStatus(
        status="FEASIBLE" if hit_limit else "OPTIMAL",
        objective=ev.objective_s,
        best_bound=min(ev.objective_s, bound_ticks * tq),
        hit_time_limit=hit_limit,
        wall_s=wall,
        solves=solves,
    )
    return PartitionSolution(i, runs, precs, ev, status, label=problem.options[i].label)


def _diagnose(problem: PartitionProblem, time_limit_s: float, num_workers: Optional[int]) -> None:
    """Every option is infeasible: find which constraint binds and by how much, and raise it."""
    qq, mq = problem.quality_quantum, problem.memory_quantum_bytes
    if problem.quality_budget is not None:
        qmin = None
        for i in range(len(problem.options)):
            model = _Model(problem, i, goal="quality", enforce_quality=False)
            solver = make_solver(time_limit_s, num_workers)
            if solver.solve(model.m) in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                q = solver.objective_value * qq
                qmin = q if qmin is None else min(qmin, q)
        if qmin is not None:
            raise MeshplanError(
                f"quality budget {problem.quality_budget:g} admits no plan: fitting the model in memory needs a "
                f"quality cost of at least {qmin:.4g} ({qmin - problem.quality_budget:.4g} over the budget); "
                f"raise --quality-budget or add memory")
    over, where = None, ""
    for i in range(len(problem.options)):
        model = _Model(problem, i, goal="overflow", enforce_quality=False)
        solver = make_solver(time_limit_s, num_workers)
        if solver.solve(model.m) in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            o = solver.objective_value * mq
            if over is None or o < over:
                runs, precs = model.extract(solver)
                ev = evaluate(problem, i, runs, precs)
                worst = max(range(len(runs)), key=lambda s: ev.stage_memory_bytes[s]
                            - problem.groups[runs[s].group].memory_bytes)
                g = problem.groups[runs[worst].group]
                where = (f"a {g.name} stage needs {ev.stage_memory_bytes[worst] / GiB:.2f} GiB of its "
                         f"{g.memory_bytes / GiB:.2f} GiB")
                over = o
    if over is None:
        raise MeshplanError("partition: no plan exists (no layer assignment satisfies the stage counts)")
    total_units = sum(g.max_stages for g in problem.groups)
    raise MeshplanError(
        f"device memory admits no plan: even the best split over {total_units} stage units at the lowest "
        f"allowed precision is {over / GiB:.2f} GiB over ({where}); add devices, memory or a lower precision")
