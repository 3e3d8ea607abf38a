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
from typing import Optional

from ortools.sat.python import cp_model

from meshplan.core.errors import MeshplanError
from meshplan.planner.search.solve.common import SolverStatus, make_solver, ticks
from meshplan.planner.search.solve.partition_data import (
    Evaluation,
    GiB,
    GroupSlot,
    PartitionProblem,
    PartitionSolution,
    Phase,
    PipelineOption,
    StageRun,
    Table,
    evaluate,
)
from meshplan.planner.search.solve.partition_model import PartitionModel

__all__ = ["Evaluation", "GroupSlot", "PartitionProblem", "PartitionSolution", "Phase", "PipelineOption", "StageRun",
           "Table", "evaluate", "solve_partition"]


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
                    num_workers: Optional[int] = None, deterministic: bool = False) -> PartitionSolution:
    """Exact partition + precision + micro-batching (CP-SAT), best over all options.

    Options are solved in order of a cheap lower bound; an option whose bound cannot beat the incumbent is
    skipped, and each later solve must beat the incumbent strictly, so ties keep the earlier option.

    Args:
        problem: The numbers.
        time_limit_s: Wall-clock budget for all solves together, seconds.
        num_workers: CP-SAT workers (default: the machine's cores, at most 8).
        deterministic: the same plan on every run, among equal optima too (``common.make_solver``).

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
        best, bound, hit, unknown = _solve_option(problem, i, best, lb, left, num_workers, deterministic)
        solves += 1
        bounds.append(bound)
        hit_limit |= hit
        any_unknown |= unknown
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


def _solve_option(problem: PartitionProblem, i: int, best, lb: int, left_s: float, num_workers: Optional[int],
                  deterministic: bool) -> tuple:
    """Solve option ``i`` within ``left_s``, starting from the heuristic plan: (the best plan so far as
    ``(ticks, option, runs, precisions)``, this option's bound in ticks or ``None``, whether time ran out, whether
    it ran out before any plan of this option was found)."""
    tq = problem.time_quantum_s
    model = PartitionModel(problem, i, cutoff=None if best is None else best[0] - 1)
    start = _heuristic(problem, i)
    if start is not None:
        model.hint(start[1], start[2])
    solver = make_solver(left_s, num_workers, deterministic)
    code = solver.solve(model.m)
    if code == cp_model.UNKNOWN and start is not None:  # out of time: keep the heuristic plan if it is better
        obj = ticks(start[0], tq)
        if best is None or obj < best[0]:
            best = (obj, i, start[1], start[2])
        return best, max(lb, int(solver.best_objective_bound)), True, False
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        runs, precs = model.extract(solver)
        best = (int(round(solver.objective_value)), i, runs, precs)
        return best, int(solver.best_objective_bound), code == cp_model.FEASIBLE, False
    if code == cp_model.INFEASIBLE:
        return best, best[0] if best is not None else None, False, False
    # UNKNOWN: time ran out before any plan of this option was found
    bound = max(lb, int(solver.best_objective_bound))
    return best, bound if best is None else min(best[0], bound), True, True


def _diagnose(problem: PartitionProblem, time_limit_s: float, num_workers: Optional[int]) -> None:
    """Every option is infeasible: find which constraint binds and by how much, and raise it."""
    qq, mq = problem.quality_quantum, problem.memory_quantum_bytes
    if problem.quality_budget is not None:
        qmin = None
        for i in range(len(problem.options)):
            model = PartitionModel(problem, i, goal="quality", enforce_quality=False)
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
        model = PartitionModel(problem, i, goal="overflow", enforce_quality=False)
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
