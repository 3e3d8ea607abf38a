"""QSync-style hybrid data parallel training with per-layer precision on the slower device groups.

QSync (Zhao et al. 2023, "QSync: Quantization-Minimized Synchronous Distributed Training Across Hybrid
Devices", IPDPS'24): devices of different speed train one model in synchronous data parallel; the step waits for
the slowest group. On the slower groups each operator may run in a lower precision (fp32 -> fp16 -> int8),
which speeds it up but adds gradient noise; a cast is paid wherever consecutive operators differ in precision.
The model here (exact, CP-SAT) first minimises the step time ``max(fast group, each slow group incl. casts)``,
then, at that step time, the summed quality indicator — "lower precision where it costs least quality until the
slow group matches the fast one". The indicator of a slow group's choice is weighted by the group's share of
the global batch (its share of the gradient average).

The entry point that uses it (``solve_hetero_train(strategy="qsync")``) is in :mod:`planner.search.solve.precision`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional, Sequence

from ortools.sat.python import cp_model

from meshplan.core.errors import MeshplanError
from meshplan.costmodel.collectives import collective_time_s
from meshplan.costmodel.ops import OpSpec
from meshplan.planner.estimate.ops_graph import layer_ops
from meshplan.planner.layout.layout import Layout
from meshplan.planner.search.solve.columns import precision_columns, resolve_sensitivity
from meshplan.planner.search.solve.common import (
    DEFAULT_QUALITY_QUANTUM,
    DEFAULT_TIME_QUANTUM_S,
    SolverStatus,
    make_solver,
    ticks,
    ticks_down,
    ticks_up,
)
from meshplan.planner.search.solve.pricing import OpPrices, default_estimator


@dataclass(frozen=True)
class QSyncGroup:
    """A slow device group's per-operator options.

    Attributes:
        name: Device name.
        op_time_s: Seconds per operator and precision ``[op][precision]`` for the group's local batch
            (``None`` = unsupported); forward + backward.
        cast_s: Seconds of the cast in front of operator ``o`` when its precision differs from ``o-1``'s.
        batch_share: The group's fraction of the global batch (weights its indicators).
    """

    name: str
    op_time_s: Sequence[Sequence[Optional[float]]]
    cast_s: Sequence[float]
    batch_share: float


@dataclass(frozen=True)
class QSyncProblem:
    """Plain numbers of one QSync problem.

    Attributes:
        precisions: Column names, reference first (``fp32``).
        fast_step_s: Step time of the fastest group at the reference precision (the target), seconds.
        slow: The slower groups.
        sensitivity: Indicator per ``[op][precision]`` (0 for the reference).
        quality_budget: Bound on the batch-share-weighted indicator sum; ``None`` = unbounded.
        sync_s: Gradient all-reduce time added to every step (reported; does not change the choice).
    """

    precisions: tuple[str, ...]
    fast_step_s: float
    slow: tuple[QSyncGroup, ...]
    sensitivity: Sequence[Sequence[float]]
    quality_budget: Optional[float] = None
    sync_s: float = 0.0
    time_quantum_s: float = DEFAULT_TIME_QUANTUM_S
    quality_quantum: float = DEFAULT_QUALITY_QUANTUM


@dataclass(frozen=True)
class QSyncSolution:
    """Per slow group, per operator precision; step time and quality (summed, batch-share weighted)."""

    precision: tuple[tuple[str, ...], ...]
    step_s: float
    group_step_s: tuple[float, ...]
    quality: float
    status: SolverStatus


def qsync_evaluate(problem: QSyncProblem, precision: Sequence[Sequence[str]]) -> tuple[float, tuple[float, ...], float]:
    """(step seconds incl. sync, each slow group's compute seconds, quality) of a given assignment."""
    group_t, quality = [], 0.0
    for g, prec in zip(problem.slow, precision):
        idx = [problem.precisions.index(p) for p in prec]
        t = sum(g.op_time_s[o][k] for o, k in enumerate(idx))
        t += sum(g.cast_s[o] for o in range(1, len(idx)) if idx[o] != idx[o - 1])
        group_t.append(t)
        quality += g.batch_share * sum(problem.sensitivity[o][k] for o, k in enumerate(idx))
    return max([problem.fast_step_s] + group_t) + problem.sync_s, tuple(group_t), quality


def solve_qsync(problem: QSyncProblem, time_limit_s: float = 10.0,
                num_workers: Optional[int] = None) -> QSyncSolution:
    """Exact QSync allocation: minimise the step, then the quality cost at that step (two CP-SAT solves).

    Raises:
        MeshplanError: the quality budget admits no assignment (the least cost is given) or bad shapes.
    """
    tq, qq = problem.time_quantum_s, problem.quality_quantum
    if problem.quality_budget is not None and not problem.quality_budget >= 0:
        raise MeshplanError(f"quality budget {problem.quality_budget:g}: must be a number >= 0")
    P = len(problem.precisions)
    O = len(problem.sensitivity)
    for g in problem.slow:
        if len(g.op_time_s) != O or len(g.cast_s) != O:
            raise MeshplanError(f"qsync: group {g.name} has {len(g.op_time_s)} ops, sensitivity has {O}")
    t0 = time.perf_counter()

    def build():
        m = cp_model.CpModel()
        z = {}
        step = m.new_int_var(ticks(problem.fast_step_s, tq), 1 << 50, "step")
        qual = []
        for gi, g in enumerate(problem.slow):
            for o in range(O):
                opts = [p for p in range(P) if g.op_time_s[o][p] is not None]
                if not opts:
                    raise MeshplanError(f"qsync: device {g.name} supports none of {problem.precisions} for op {o}")
                for p in opts:
                    z[gi, o, p] = m.new_bool_var(f"z{gi}_{o}_{p}")
                m.add_exactly_one(z[gi, o, p] for p in opts)
            casts = []
            for o in range(1, O):
                d = m.new_bool_var(f"d{gi}_{o}")
                for p in range(P):  # d = 1 when op o's precision differs from op o-1's
                    a, b = z.get((gi, o, p)), z.get((gi, o - 1, p))
                    if a is not None and b is not None:
                        m.add(d >= a - b)
                    elif a is not None:
                        m.add(d >= a)
                casts.append(ticks(g.cast_s[o], tq) * d)
            m.add(step >= sum(ticks(g.op_time_s[o][p], tq) * z[gi, o, p] for (gg, o, p) in z if gg == gi) + sum(casts))
            share_q = round(g.batch_share * 1e6)  # batch share in ppm keeps the quality sum integral
            qual.append(sum(share_q * ticks_up(problem.sensitivity[o][p], qq) * z[gi, o, p]
                            for (gg, o, p) in z if gg == gi))
        q = sum(qual)
        if problem.quality_budget is not None:
            m.add(q <= ticks_down(problem.quality_budget, qq) * 1_000_000)
        return m, z, step, q

    m, z, step, q = build()
    m.minimize(step)
    solver = make_solver(time_limit_s, num_workers)
    code = solver.solve(m)
    if code == cp_model.INFEASIBLE:
        least = sum(g.batch_share * sum(min(problem.sensitivity[o][p] for p in range(P)
                                            if g.op_time_s[o][p] is not None)
                                        for o in range(O)) for g in problem.slow)
        raise MeshplanError(f"quality budget {problem.quality_budget:g} admits no precision assignment: the least "
                            f"cost is {least:.4g} ({least - problem.quality_budget:.4g} over)")
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise MeshplanError(f"qsync: no assignment found within the {time_limit_s:g} s time limit")
    hit = code == cp_model.FEASIBLE
    best_step = int(round(solver.objective_value))
    bound = solver.best_objective_bound
    m2, z2, step2, q2 = build()
    m2.add(step2 <= best_step)
    m2.minimize(q2)
    solver2 = make_solver(max(0.1, time_limit_s - (time.perf_counter() - t0)), num_workers)
    code2 = solver2.solve(m2)
    if code2 in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        solver, z = solver2, z2
        hit |= code2 == cp_model.FEASIBLE
    prec = tuple(tuple(problem.precisions[next(p for p in range(P)
                                               if (gi, o, p) in z and solver.boolean_value(z[gi, o, p]))]
                       for o in range(O)) for gi in range(len(problem.slow)))
    step_s, group_t, quality = qsync_evaluate(problem, prec)
    status = SolverStatus("FEASIBLE" if hit else "OPTIMAL", step_s, min(step_s, bound * tq + problem.sync_s), hit,
                          time.perf_counter() - t0, solves=2)
    return QSyncSolution(prec, step_s, group_t, quality, status)


def qsync_problem(model, cluster, global_batch: int, seq_len: int, precisions=None, quality_budget=None,
                  sensitivity=None, estimator=None) -> QSyncProblem:
    """QSync problem: every device holds a replica; the batch is split evenly over all devices.

    One "operator" per decoder layer (its GEMMs at the chosen precision, the rest at fp32); a cast of the
    layer's input activation (b x s x h elements) is paid where consecutive layers differ. The fastest group
    (least reference time) runs fp32 and sets the target. ``estimator``: what prices the operators (default: the
    shipped cost model).
    """
    prices = OpPrices(default_estimator(estimator))
    return prices.build(lambda: _qsync_problem(prices, model, cluster, global_batch, seq_len, precisions,
                                               quality_budget, sensitivity))


def _qsync_problem(prices: OpPrices, model, cluster, global_batch, seq_len, precisions, quality_budget,
                   sensitivity) -> QSyncProblem:
    devices = [g.device for g in cluster.groups]
    cols = precision_columns(devices, "qsync", precisions)
    world = cluster.world_size
    if global_batch % world:
        raise MeshplanError(f"global batch {global_batch}: not divisible by the {world} devices of {cluster.spec}")
    b = global_batch // world
    L = model.num_layers
    lay = Layout(micro_batch=b)
    times = []
    for grp in cluster.groups:
        rows = []
        for i in range(L):
            lo = layer_ops(model, i, lay, seq_len, dtype="fp32")
            rows.append([prices.ops_s(lo.compute, grp.device, p, "fp32", True)
                         + prices.host_wait_s(model, lo, lay, grp.device, p, "fp32") if grp.device.supports(p) else None
                         for p in cols])
        times.append(rows)
    ref_t = [sum(r[0] for r in t) for t in times]
    fast = min(range(len(cluster.groups)), key=lambda g: ref_t[g])
    slow = []
    for gi, grp in enumerate(cluster.groups):
        if gi == fast:
            continue
        cast = prices.time_s(OpSpec("cast", (b * seq_len * model.hidden_size,), "fp32"), grp.device)
        slow.append(QSyncGroup(grp.device.name, times[gi], [cast] * L, grp.world_size / world))
    sens = resolve_sensitivity(sensitivity, model, cols, "fp32", operands=2)
    grad_bytes = model.num_params * 4.0
    sync = collective_time_s("allreduce", grad_bytes, world, cluster.inter_link if cluster.num_nodes > 1
                             else cluster.groups[0].intra_link)
    return QSyncProblem(cols, ref_t[fast], tuple(slow), sens, quality_budget, sync_s=sync)
