"""ByteComp-style gradient compression per bucket (Wang et al. 2023, "ByteComp: Revisiting Gradient Compression
in Distributed Training"), solved exactly with CP-SAT.

Timeline of one backward pass (ByteComp §4, one compute stream and one communication stream):

- bucket ``b``'s gradients are ready after the backward compute that produces buckets ``0..b`` plus any GPU
  compression kernels of those buckets (they run on the compute stream and delay later compute):
  ``R_b = sum_{j<=b} (backward_s[j] + compute_s[j])``;
- its communication starts when it is ready and the stream is free, ``S_b = max(R_b, E_{b-1})``, and holds the
  stream for ``comm_s`` (CPU compression and copies, the network collective, decompression):
  ``E_b = S_b + comm_s[b]``;
- the backward pass ends at ``max(R_N + tail_s, E_N)``; only the communication beyond the compute is exposed.

Each bucket picks one :class:`CompressionChoice` (method, one-/two-level, GPU/CPU, with its costs and its
error indicator); the sum of the chosen error indicators stays within the error budget. Choices dominated in
all three numbers are dropped before solving (exact: the objective and the budget are monotone in them).
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Optional, Sequence

from ortools.sat.python import cp_model

from meshplan.core.errors import MeshplanError
from meshplan.planner.plan.schema import BucketCompression
from meshplan.planner.search.solve.common import (
    SolverStatus,
    make_solver,
    ticks,
    ticks_down,
    ticks_up,
)
from meshplan.planner.search.solve.compression_problem import compression_problem
from meshplan.planner.search.solve.compression_types import CompressionChoice, CompressionProblem


@dataclass(frozen=True)
class CompressionSolution:
    """The chosen compression per bucket and its timeline.

    Attributes:
        choice: Index into ``problem.choices[b]`` per bucket.
        end_s: End of backward + communication, seconds (the objective).
        exposed_s: ``end_s`` minus the pure backward compute (exposed comm + compression kernels), seconds.
        error: Sum of chosen error indicators.
        buckets: The decisions as plan values.
        status: Solver status (objective and bound in seconds).
    """

    choice: tuple[int, ...]
    end_s: float
    exposed_s: float
    error: float
    buckets: tuple[BucketCompression, ...]
    status: SolverStatus


def simulate(problem: CompressionProblem, choice: Sequence[int]) -> tuple[float, float]:
    """End time of backward + communication and the summed error for a given choice per bucket (floats)."""
    ready = comm_end = 0.0
    err = 0.0
    for b, k in enumerate(choice):
        c = problem.choices[b][k]
        ready += problem.backward_s[b] + c.compute_s
        comm_end = max(ready, comm_end) + c.comm_s
        err += c.error
    return max(ready + problem.tail_s, comm_end), err


def _pareto(problem: CompressionProblem, b: int) -> list[int]:
    """Indices of bucket b's choices not dominated in (compute, comm, error) ticks; first of equals kept."""
    tq, eq = problem.time_quantum_s, problem.error_quantum
    keys = [(ticks(c.compute_s, tq), ticks(c.comm_s, tq), ticks_up(c.error, eq)) for c in problem.choices[b]]
    keep = []
    for i, ki in enumerate(keys):
        dominated = any(
            all(a <= x for a, x in zip(kj, ki)) and (kj != ki or j < i) for j, kj in enumerate(keys) if j != i)
        if not dominated:
            keep.append(i)
    return keep


def _runs(problem: CompressionProblem) -> list[tuple[int, int]]:
    """Runs ``[start, end)`` of consecutive buckets with identical backward time and choices."""
    tq, eq = problem.time_quantum_s, problem.error_quantum
    key = [(ticks(problem.backward_s[b], tq),
            tuple((c.method, c.param, c.two_level, c.where, ticks(c.compute_s, tq), ticks(c.comm_s, tq),
                   ticks_up(c.error, eq)) for c in problem.choices[b])) for b in range(len(problem.backward_s))]
    out, start = [], 0
    for b in range(1, len(key) + 1):
        if b == len(key) or key[b] != key[start]:
            out.append((start, b))
            start = b
    return out


def _johnson(jobs: Sequence[tuple[int, int]]) -> list[int]:
    """Johnson's rule (Johnson 1954, "Optimal two- and three-stage production schedules with setup times
    included", Naval Res. Logistics Q. 1(1)) for a two-machine flow shop: jobs with p1 < p2 first by p1
    ascending, then the rest by p2 descending. Among interchangeable buckets this order minimises the makespan
    of every prefix/suffix term, so only the count of each choice in a run is a decision."""
    first = sorted((i for i, (a, b) in enumerate(jobs) if a < b), key=lambda i: (jobs[i][0], i))
    last = sorted((i for i, (a, b) in enumerate(jobs) if a >= b), key=lambda i: (-jobs[i][1], i))
    return first + last


def solve_compression_problem(problem: CompressionProblem, time_limit_s: float = 10.0,
                              num_workers: Optional[int] = None) -> CompressionSolution:
    """Exact per-bucket compression choice minimising the end of backward + communication.

    Raises:
        MeshplanError: empty or inconsistent input, or an error budget below the least achievable error
            (the message gives both numbers).
    """
    _check_problem(problem)
    t0 = time.perf_counter()
    m, runs, orders, counts = _flow_shop_model(problem)
    solver = make_solver(time_limit_s, num_workers)
    code = solver.solve(m)
    wall = time.perf_counter() - t0
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        if code == cp_model.INFEASIBLE:
            raise MeshplanError(f"compression error budget {problem.error_budget:g} admits no plan")
        raise MeshplanError(f"compression: no plan found within the {time_limit_s:g} s time limit")
    return _solution(problem, solver, code, wall, runs, orders, counts)


def _check_problem(problem: CompressionProblem) -> None:
    """Refuse empty or inconsistent input, and an error budget below the least achievable error."""
    N = len(problem.backward_s)
    if N == 0 or len(problem.choices) != N or len(problem.sizes_bytes) != N:
        raise MeshplanError(f"compression: {N} buckets but {len(problem.choices)} choice lists and "
                            f"{len(problem.sizes_bytes)} sizes")
    if any(not c for c in problem.choices):
        raise MeshplanError("compression: a bucket has no candidate choice")
    eq = problem.error_quantum
    if problem.error_budget is not None and not problem.error_budget >= 0:
        raise MeshplanError(f"compression error budget {problem.error_budget:g}: must be a number >= 0")
    if problem.error_budget is not None:
        least = sum(min(c.error for c in cs) for cs in problem.choices)
        if sum(min(ticks_up(c.error, eq) for c in cs) for cs in problem.choices) > ticks_down(problem.error_budget, eq):
            raise MeshplanError(f"compression error budget {problem.error_budget:g} admits no plan: the least "
                                f"achievable error is {least:.4g} ({least - problem.error_budget:.4g} over)")


def _flow_shop_model(problem: CompressionProblem) -> tuple[cp_model.CpModel, list, list, list]:
    """The CP-SAT model: (model, runs of identical buckets, each run's choices in Johnson's order, their counts)."""
    N, tq, eq = len(problem.backward_s), problem.time_quantum_s, problem.error_quantum
    m = cp_model.CpModel()
    keep = [_pareto(problem, b) for b in range(N)]
    runs = _runs(problem)
    p1 = lambda b, k: ticks(problem.backward_s[b], tq) + ticks(problem.choices[b][k].compute_s, tq)  # noqa: E731
    p2 = lambda b, k: ticks(problem.choices[b][k].comm_s, tq)  # noqa: E731
    horizon = sum(max(p1(b, k) + p2(b, k) for k in keep[b]) for b in range(N)) + ticks(problem.tail_s, tq)
    end = m.new_int_var(0, horizon, "end")
    # Per run of identical buckets: how many take each choice (n), in Johnson's order (see _johnson).
    counts, orders, tot1, tot2 = [], [], [], []
    for ri, (s0, e0) in enumerate(runs):
        order = _johnson([(p1(s0, k), p2(s0, k)) for k in keep[s0]])
        ks = [keep[s0][i] for i in order]
        n = [m.new_int_var(0, e0 - s0, f"n{ri}_{k}") for k in ks]
        m.add(sum(n) == e0 - s0)
        counts.append(n)
        orders.append(ks)
        tot1.append(sum(p1(s0, k) * v for k, v in zip(ks, n)))
        tot2.append(sum(p2(s0, k) * v for k, v in zip(ks, n)))
    pre, acc = [], 0  # compute-stream time before each run
    for ri in range(len(runs)):
        pre.append(acc)
        v = m.new_int_var(0, horizon, f"pre{ri + 1}")
        m.add(v == acc + tot1[ri])
        acc = v
    suf, acc = [None] * len(runs), 0  # communication after each run
    for ri in reversed(range(len(runs))):
        suf[ri] = acc
        v = m.new_int_var(0, horizon, f"suf{ri}")
        m.add(v == acc + tot2[ri])
        acc = v
    # Makespan of a two-machine flow shop (compute stream, then comm stream): max over buckets b of
    # (compute up to and incl. b) + (comm from b on). Inside a block of equal jobs the term is linear in the
    # position, so its first and last job bound it.
    for ri, (s0, e0) in enumerate(runs):
        ks, n = orders[ri], counts[ri]
        if e0 - s0 == 1:  # a single bucket: its term is linear in its choice, no enforcement needed
            m.add(end >= pre[ri] + tot1[ri] + tot2[ri] + suf[ri])
            continue
        for i, k in enumerate(ks):
            used = m.new_bool_var(f"u{ri}_{k}")
            m.add(n[i] >= 1).only_enforce_if(used)
            m.add(n[i] == 0).only_enforce_if(~used)
            before = sum(p1(s0, kk) * v for kk, v in zip(ks[:i], n[:i]))
            after = sum(p2(s0, kk) * v for kk, v in zip(ks[i + 1:], n[i + 1:]))
            base = pre[ri] + before + after + suf[ri]
            m.add(end >= base + p1(s0, k) + p2(s0, k) * n[i]).only_enforce_if(used)
            m.add(end >= base + p1(s0, k) * n[i] + p2(s0, k)).only_enforce_if(used)
    m.add(end >= sum(tot1) + ticks(problem.tail_s, tq))
    # redundant cuts, valid for any order inside a run (its first job's compute precedes all of its comm, its
    # last job's comm follows all of its compute): they give the LP relaxation a tight bound
    for ri, (s0, _) in enumerate(runs):
        m.add(end >= pre[ri] + min(p1(s0, k) for k in orders[ri]) + tot2[ri] + suf[ri])
        m.add(end >= pre[ri] + tot1[ri] + min(p2(s0, k) for k in orders[ri]) + suf[ri])
    if problem.error_budget is not None:
        m.add(sum(ticks_up(problem.choices[s0][k].error, eq) * v
                  for ri, (s0, _) in enumerate(runs) for k, v in zip(orders[ri], counts[ri]))
              <= ticks_down(problem.error_budget, eq))
    m.minimize(end)
    return m, runs, orders, counts


def _solution(problem: CompressionProblem, solver, code: int, wall: float, runs: list, orders: list,
              counts: list) -> CompressionSolution:
    """The solver's choice per bucket, re-simulated in seconds, with its status."""
    tq = problem.time_quantum_s
    choice = []
    for ri in range(len(runs)):
        for k, v in zip(orders[ri], counts[ri]):
            choice.extend([k] * solver.value(v))
    choice = tuple(choice)
    end_s, err = simulate(problem, choice)
    exposed = end_s - sum(problem.backward_s) - problem.tail_s
    buckets = tuple(
        BucketCompression(bucket=b, size_bytes=int(problem.sizes_bytes[b]), method=problem.choices[b][k].method,
                          param=problem.choices[b][k].param, two_level=problem.choices[b][k].two_level,
                          where=problem.choices[b][k].where)
        for b, k in enumerate(choice))
    status = SolverStatus(
        status="OPTIMAL" if code == cp_model.OPTIMAL else "FEASIBLE",
        objective=end_s,
        best_bound=min(end_s, solver.best_objective_bound * tq),
        hit_time_limit=code == cp_model.FEASIBLE,
        wall_s=wall,
    )
    return CompressionSolution(choice, end_s, exposed, err, buckets, status)


@dataclass(frozen=True)
class CompressionResult:
    """Compression plan for a data-parallel job, with the uncompressed baseline priced by the same timeline.

    Attributes:
        solution: The solver's answer (buckets, end of backward + comm, error, status).
        step_s: Forward + backward + exposed communication, seconds.
        baseline_step_s: The same with every bucket uncompressed (flat all-reduce), seconds.
        baseline_exposed_s: Exposed communication of that baseline, seconds.
        tokens_per_s, baseline_tokens_per_s: Throughput of the two.
    """

    solution: CompressionSolution
    step_s: float
    baseline_step_s: float
    baseline_exposed_s: float
    tokens_per_s: float
    baseline_tokens_per_s: float


def solve_compression(model, cluster, global_batch: int, seq_len: int, error_budget: Optional[float] = None,
                      net_bytes_per_s: Optional[float] = None, bucket_bytes: int = 25 * 2**20,
                      errors: Optional[dict] = None, time_limit_s: float = 10.0,
                      num_workers: Optional[int] = None, estimator=None,
                      hook_choices_only: bool = False) -> CompressionResult:
    """ByteComp-style compression plan for data parallel training of ``model`` over ``cluster``.

    Args:
        model: ``ModelSpec``; cluster: ``ClusterSpec`` (every device a data-parallel rank).
        global_batch: Sequences per step (divisible by the world size); seq_len: tokens per sequence.
        error_budget: Bound on the summed, size-weighted relative gradient error (``None`` = unbounded).
        net_bytes_per_s: Per-GPU inter-node bandwidth override (``--net 25Gbps`` parsed by
            ``core.units.parse_bandwidth``).
        bucket_bytes: DDP bucket size, bytes.
        errors: Measured ``(method, param) -> relative error`` (``sensitivity.measure_compression_error``).
        estimator: What prices the backward compute (``planner.estimate.base.Estimator``; default: shipped model).
        hook_choices_only: Offer only what the DDP communication hook applies (``planner.export.comm_hook``: one level,
            on the GPU), not ByteComp's two-level or CPU placements.

    Raises:
        MeshplanError: indivisible batch, an error budget that admits no plan (with the least achievable error).
    """
    problem = compression_problem(model, cluster, global_batch, seq_len, error_budget, bucket_bytes, errors,
                                  net_bytes_per_s, estimator=estimator)
    if hook_choices_only:
        problem = dataclasses.replace(problem, choices=[[c for c in cs if not c.two_level and c.where == "gpu"]
                                                        for cs in problem.choices])
    sol = solve_compression_problem(problem, time_limit_s=time_limit_s, num_workers=num_workers)
    none = [next(i for i, c in enumerate(cs) if c.method == "none" and not c.two_level) for cs in problem.choices]
    base_end, _ = simulate(problem, none)
    tokens = float(global_batch * seq_len)
    step = problem.forward_s + sol.end_s
    base_step = problem.forward_s + base_end
    return CompressionResult(sol, step, base_step, base_end - sum(problem.backward_s) - problem.tail_s,
                             tokens / step, tokens / base_step)


__all__ = ["CompressionChoice", "CompressionProblem", "CompressionResult", "CompressionSolution", "simulate",
           "solve_compression", "solve_compression_problem"]
