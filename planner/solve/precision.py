"""Per-layer precision: QSync-style hybrid data parallel training, and the ``train`` / ``serve`` entry points.

QSync (Zhao et al. 2023, "QSync: Quantization-Minimized Synchronous Distributed Training Across Hybrid
Devices", IPDPS'24): devices of different speed train one model in synchronous data parallel; the step waits for
the slowest group. On the slower groups each operator may run in a lower precision (fp32 -> fp16 -> int8),
which speeds it up but adds gradient noise; a cast is paid wherever consecutive operators differ in precision.
The model here (exact, CP-SAT) first minimises the step time ``max(fast group, each slow group incl. casts)``,
then, at that step time, the summed quality indicator — "lower precision where it costs least quality until the
slow group matches the fast one". The indicator of a slow group's choice is weighted by the group's share of
the global batch (its share of the gradient average).

Serving (LLM-PQ) and heterogeneous pipeline training use :mod:`planner.solve.partition` on problems built by
:mod:`planner.solve.problems`.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

from ortools.sat.python import cp_model

from meshplan.core.errors import MeshplanError
from meshplan.costmodel.collectives import collective_time_s
from meshplan.costmodel.ops import OpSpec
from meshplan.planner.layout import Layout
from meshplan.planner.memory import (GRAD_BYTES, OPTIMIZER_BYTES, PARAM_BYTES, activation_bytes_per_layer,
                                     layer_shape)
from meshplan.planner.ops_graph import layer_ops
from meshplan.planner.plan import Stage
from meshplan.planner.solve import problems as pbs
from meshplan.planner.solve.columns import precision_columns, resolve_sensitivity, usable_bytes
from meshplan.planner.solve.common import (DEFAULT_QUALITY_QUANTUM, DEFAULT_TIME_QUANTUM_S, SolverStatus, make_solver,
                                           ticks, ticks_down, ticks_up)
from meshplan.planner.solve.partition import StageRun, evaluate, solve_partition
from meshplan.planner.solve.pricing import OpPrices, default_estimator


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
        least = sum(g.batch_share * sum(min(problem.sensitivity[o][p] for p in range(P) if g.op_time_s[o][p] is not None)
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
    prec = tuple(tuple(problem.precisions[next(p for p in range(P) if (gi, o, p) in z and solver.boolean_value(z[gi, o, p]))]
                       for o in range(O)) for gi in range(len(problem.slow)))
    step_s, group_t, quality = qsync_evaluate(problem, prec)
    status = SolverStatus("FEASIBLE" if hit else "OPTIMAL", step_s, min(step_s, bound * tq + problem.sync_s), hit,
                          time.perf_counter() - t0, solves=2)
    return QSyncSolution(prec, step_s, group_t, quality, status)


# ------------------------------------------------------------------------------------------- entry points

@dataclass(frozen=True)
class SolveResult:
    """What the planner needs from a solve, with the baselines priced by the same model.

    Attributes:
        workload: ``train-pipeline``, ``train-qsync`` or ``serve``.
        stages: Pipeline stages for ``Plan.stages`` (``None`` for QSync data parallel).
        layer_precision: Per layer (per group for QSync: the slowest group's) for ``Plan.layer_precision``.
        micro_batch: Sequences per micro-batch (decode micro-batch for serving).
        num_micro_batches: Micro-batches per step (decode pass for serving).
        time_s: Step time (training) or batch latency (serving), seconds.
        tokens_per_s: Tokens processed (training) or generated (serving) per second.
        quality: Summed quality indicator of the plan.
        status: Solver status.
        baselines: Name -> (tokens/s, quality) of reference plans priced by the same formulas.
        detail: Extra values (per-group precision for QSync, option label, stage memory).
    """

    workload: str
    stages: Optional[tuple[Stage, ...]]
    layer_precision: tuple[str, ...]
    micro_batch: int
    num_micro_batches: int
    time_s: float
    tokens_per_s: float
    quality: float
    status: SolverStatus
    baselines: dict = field(default_factory=dict)
    detail: dict = field(default_factory=dict)

    def plan_fields(self) -> dict:
        """The ``planner.plan.Plan`` fields this result decides (``stages``, ``layer_precision``, ``micro_batch``)
        and a note line with the solver status, for ``Plan(**common, **result.plan_fields())``."""
        st = self.status
        note = (f"solver {self.workload}: {st.status}, objective {st.objective:.6g} s, bound {st.best_bound:.6g} s"
                + (" (time limit hit)" if st.hit_time_limit else "") + f", quality cost {self.quality:.4g}")
        return {"stages": self.stages, "layer_precision": tuple(self.layer_precision) or None,
                "micro_batch": self.micro_batch, "notes": (note,)}


def _even_uniform(problem, option: int, precision: str):
    """Baseline: every stage unit used, layers split evenly in group order, one precision everywhere.

    Returns ``None`` when the precision is missing on a device or the plan breaks a memory limit."""
    L = problem.num_layers
    units = [g for g, gs in enumerate(problem.groups) for _ in range(gs.max_stages)][:L]
    S = len(units)
    runs, first = [], 0
    for k, g in enumerate(units):
        n = L // S + (1 if k < L % S else 0)
        runs.append(StageRun(first, n, g))
        first += n
    try:
        ev = evaluate(problem, option, runs, [precision] * L)
    except MeshplanError:
        return None
    mem_ok = all(v.startswith("quality") for v in ev.violations)
    return ev if mem_ok else None


def _best_uniform(problem, precision: str):
    """Best even-split plan at one precision over the micro-batch options (None if none fits)."""
    evs = [e for e in (_even_uniform(problem, i, precision) for i in range(len(problem.options))) if e is not None]
    return min(evs, key=lambda e: e.objective_s) if evs else None


def _pipeline_result(workload, problem, sol, tokens: float, batch_tokens_note: str) -> SolveResult:
    opt = problem.options[sol.option]
    base = problem.precisions[0]
    baselines = {}
    even = _best_uniform(problem, base)
    baselines["even-partition uniform " + base] = (tokens / even.objective_s, even.quality) if even else (0.0, 0.0)
    free = dataclasses.replace(problem, precisions=(base,), sensitivity=[[0.0]] * problem.num_layers,
                               options=tuple(_only_column(o, problem.precisions.index(base)) for o in problem.options),
                               quality_budget=None)
    try:
        all16 = solve_partition(free, time_limit_s=10.0)
        baselines[f"all-{base} (solved partition)"] = (tokens / all16.evaluation.objective_s, 0.0)
    except MeshplanError:
        baselines[f"all-{base} (solved partition)"] = (0.0, 0.0)
    return SolveResult(
        workload=workload, stages=sol.plan_stages(), layer_precision=sol.layer_precision,
        micro_batch=opt.micro_batch, num_micro_batches=opt.phases[-1].num_micro_batches,
        time_s=sol.evaluation.objective_s, tokens_per_s=tokens / sol.evaluation.objective_s,
        quality=sol.evaluation.quality, status=sol.status, baselines=baselines,
        detail={"option": sol.label, "stage_memory_bytes": sol.evaluation.stage_memory_bytes,
                "phase_times_s": sol.evaluation.phase_times_s, "tokens": batch_tokens_note})


def _only_column(opt, p: int):

    def col(tab):
        return [[[r[p]] for r in row] for row in tab]

    phases = tuple(dataclasses.replace(ph, layer_time_s=col(ph.layer_time_s)) for ph in opt.phases)
    return dataclasses.replace(opt, phases=phases, static_bytes=col(opt.static_bytes), act_bytes=col(opt.act_bytes))


def solve_serve(model, cluster, batch: int, prompt_len: int, gen_len: int, quality_budget: Optional[float] = None,
                precisions: Optional[Sequence[str]] = None, sensitivity=None, time_limit_s: float = 30.0,
                num_workers: Optional[int] = None, micro_batches: Sequence[int] = (1, 2, 4),
                estimator=None) -> SolveResult:
    """LLM-PQ serving plan: stages over devices, per-layer bit-width, prefill/decode micro-batching.

    Args:
        model: ``ModelSpec``; cluster: ``ClusterSpec``.
        batch: Requests served together; prompt_len / gen_len: tokens per request in / out.
        quality_budget: Bound on the summed per-layer indicators (``None`` = unbounded).
        precisions: Allowed precisions (default: 16-bit, fp8, int8, int4 where devices have them).
        sensitivity: Measured indicators ``[layer][precision]`` replacing the defaults.
        micro_batches: Candidate micro-batch counts for prefill and for decode (those dividing ``batch``).
        estimator: What prices the operators (``planner.estimate.Estimator``; default: the shipped cost model).

    Returns:
        A :class:`SolveResult` whose ``tokens_per_s`` is generated tokens per second.
    """
    problem = pbs.serve_partition_problem(model, cluster, batch, prompt_len, gen_len, precisions, quality_budget,
                                          micro_batches=micro_batches, sensitivity=sensitivity,
                                          estimator=estimator)
    sol = solve_partition(problem, time_limit_s=time_limit_s, num_workers=num_workers)
    return _pipeline_result("serve", problem, sol, float(batch * gen_len), "generated tokens per batch")


def solve_hetero_train(model, cluster, global_batch: int, seq_len: int, quality_budget: Optional[float] = None,
                       precisions: Optional[Sequence[str]] = None, strategy: str = "auto", sensitivity=None,
                       time_limit_s: float = 30.0, num_workers: Optional[int] = None,
                       micro_batches: Sequence[int] = (1, 2, 4), estimator=None) -> SolveResult:
    """Training on a heterogeneous cluster.

    ``strategy``: ``pipeline`` (heterogeneous 1F1B pipeline, one stage per node, per-layer bf16/fp8),
    ``qsync`` (synchronous data parallel, per-layer fp32/fp16/int8 on the slower groups), or ``auto``: QSync
    when a full replica with micro-batch 1 fits every device, else the pipeline. ``micro_batches``: candidate
    micro-batch sizes of the pipeline (those dividing ``global_batch``). ``estimator``: what prices the operators
    (``planner.estimate.Estimator``; default: the shipped cost model).

    Raises:
        MeshplanError: bad input, no plan (names the binding constraint), a precision a device lacks.
    """
    if strategy not in ("auto", "pipeline", "qsync"):
        raise MeshplanError(f"strategy '{strategy}': expected auto, pipeline or qsync")
    if strategy == "auto":
        strategy = "qsync" if _replica_fits(model, cluster, seq_len) and len(cluster.groups) > 1 else "pipeline"
    tokens = float(global_batch * seq_len)
    if strategy == "pipeline":
        problem = pbs.train_partition_problem(model, cluster, global_batch, seq_len, precisions, quality_budget,
                                              micro_batches=micro_batches, sensitivity=sensitivity,
                                              estimator=estimator)
        sol = solve_partition(problem, time_limit_s=time_limit_s, num_workers=num_workers)
        return _pipeline_result("train-pipeline", problem, sol, tokens, "tokens per step")
    problem = qsync_problem(model, cluster, global_batch, seq_len, precisions, quality_budget, sensitivity,
                            estimator=estimator)
    sol = solve_qsync(problem, time_limit_s=time_limit_s, num_workers=num_workers)
    ref = qsync_evaluate(problem, [[problem.precisions[0]] * len(problem.sensitivity)] * len(problem.slow))
    fp16 = "fp16" if "fp16" in problem.precisions else problem.precisions[0]
    uni = qsync_evaluate(problem, [[fp16] * len(problem.sensitivity)] * len(problem.slow))
    return SolveResult(
        workload="train-qsync", stages=None, layer_precision=sol.precision[-1] if sol.precision else (),
        micro_batch=max(1, global_batch // cluster.world_size), num_micro_batches=1, time_s=sol.step_s,
        tokens_per_s=tokens / sol.step_s, quality=sol.quality, status=sol.status,
        baselines={"uniform fp32": (tokens / ref[0], ref[2]), f"uniform {fp16} on slow groups": (tokens / uni[0], uni[2])},
        detail={"group_precision": {g.name: p for g, p in zip(problem.slow, sol.precision)},
                "group_step_s": sol.group_step_s, "fast_step_s": problem.fast_step_s})


def _replica_fits(model, cluster, seq_len: int) -> bool:
    need = model.num_params * (PARAM_BYTES + GRAD_BYTES + OPTIMIZER_BYTES) + sum(
        activation_bytes_per_layer(layer_shape(model, i), seq_len, 1, Layout()) for i in range(model.num_layers))
    return all(need <= usable_bytes(g.device) for g in cluster.groups)


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
            ops = layer_ops(model, i, lay, seq_len, dtype="fp32").compute
            rows.append([prices.ops_s(ops, grp.device, p, "fp32", True) if grp.device.supports(p) else None
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


__all__ = ["QSyncGroup", "QSyncProblem", "QSyncSolution", "SolveResult", "qsync_evaluate", "solve_qsync",
           "solve_serve", "solve_hetero_train", "qsync_problem"]
