"""The heterogeneous ``train`` and ``serve`` entry points: per-layer precision on mixed clusters.

* ``solve_serve``: LLM-PQ serving (Zhao et al. 2024): stages over devices, per-layer bit-width, prefill/decode
  micro-batching, with :mod:`planner.search.solve.partition` on problems built by :mod:`planner.search.solve.problems`;
* ``solve_hetero_train``: the heterogeneous 1F1B pipeline (same solver), or QSync's hybrid data parallelism
  (:mod:`planner.search.solve.qsync`, Zhao et al. 2023) when a full replica fits every device.

Each result carries the baselines priced by the same formulas (even split at one precision, best all-16-bit).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional, Sequence

from meshplan.core.errors import MeshplanError
from meshplan.planner.estimate.memory import (
    GRAD_BYTES,
    OPTIMIZER_BYTES,
    PARAM_BYTES,
    activation_bytes_per_layer,
    layer_shape,
)
from meshplan.planner.layout.layout import Layout
from meshplan.planner.plan.schema import Stage
from meshplan.planner.search.solve import problems as pbs
from meshplan.planner.search.solve.columns import usable_bytes
from meshplan.planner.search.solve.common import SolverStatus
from meshplan.planner.search.solve.partition import StageRun, evaluate, solve_partition
from meshplan.planner.search.solve.qsync import (
    QSyncGroup,
    QSyncProblem,
    QSyncSolution,
    qsync_evaluate,
    qsync_problem,
    solve_qsync,
)


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
        """The ``planner.plan.schema.Plan`` fields this result decides (``stages``, ``layer_precision``,
        ``micro_batch``)
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
        estimator: What prices the operators (``planner.estimate.base.Estimator``; default: the shipped cost model).

    Returns:
        A :class:`SolveResult` whose ``tokens_per_s`` is generated tokens per second.
    """
    problem = pbs.serve_partition_problem(model, cluster, batch, prompt_len, gen_len, precisions, quality_budget,
                                          micro_batches=micro_batches, sensitivity=sensitivity,
                                          estimator=estimator)
    # deterministic: the same request gives a byte-identical plan, ties among optima included
    sol = solve_partition(problem, time_limit_s=time_limit_s, num_workers=num_workers, deterministic=True)
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
    (``planner.estimate.base.Estimator``; default: the shipped cost model).

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
        baselines={"uniform fp32": (tokens / ref[0], ref[2]), f"uniform {fp16} on slow groups": (tokens / uni[0],
                                                                                                 uni[2])},
        detail={"group_precision": {g.name: p for g, p in zip(problem.slow, sol.precision)},
                "group_step_s": sol.group_step_s, "fast_step_s": problem.fast_step_s})


def _replica_fits(model, cluster, seq_len: int) -> bool:
    need = model.num_params * (PARAM_BYTES + GRAD_BYTES + OPTIMIZER_BYTES) + sum(
        activation_bytes_per_layer(layer_shape(model, i), seq_len, 1, Layout()) for i in range(model.num_layers))
    return all(need <= usable_bytes(g.device) for g in cluster.groups)


__all__ = ["QSyncGroup", "QSyncProblem", "QSyncSolution", "SolveResult", "qsync_evaluate", "solve_qsync",
           "solve_serve", "solve_hetero_train", "qsync_problem"]
