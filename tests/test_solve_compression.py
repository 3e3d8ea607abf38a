"""Exactness of the ByteComp-style compression CP-SAT model against brute-force enumeration, and its speed.

The brute force re-implements the two-stream timeline (compute stream delays from GPU compression kernels,
one communication stream, buckets in ready order) independently and tries every choice per bucket.
"""
from __future__ import annotations

import itertools
import random

import pytest

from meshplan.core.errors import MeshplanError
from meshplan.planner.search.solve.compression import CompressionChoice, CompressionProblem, solve_compression_problem

TQ = 1e-6
EQ = 1e-3


def _random(rng: random.Random) -> CompressionProblem:
    n = rng.randint(1, 6)
    k = rng.randint(1, 4) if n <= 5 else rng.randint(1, 3)
    choices = []
    for _ in range(n):
        cs = [CompressionChoice("none", 0, False, "gpu", 0.0, rng.randint(5, 60) * TQ, 0.0)]
        for j in range(k - 1):
            cs.append(CompressionChoice(rng.choice(["fp16", "int8", "topk", "powersgd"]), 0.01, rng.random() < 0.5,
                                        rng.choice(["gpu", "cpu"]), rng.randint(0, 10) * TQ,
                                        rng.randint(1, 40) * TQ, rng.randint(0, 10) * EQ))
        if k > 1 and rng.random() < 0.3:
            cs = cs[1:]  # compression forced: the budget can then be infeasible
        choices.append(cs)
    bwd = [rng.randint(1, 40) * TQ for _ in range(n)]
    budget = rng.choice([None, rng.randint(0, 15) * EQ])
    return CompressionProblem(bwd, [1 << 20] * n, choices, tail_s=rng.randint(0, 20) * TQ, error_budget=budget,
                              time_quantum_s=TQ, error_quantum=EQ)


def _brute(pb: CompressionProblem):
    best = None
    bwd = [round(t / TQ) for t in pb.backward_s]
    for combo in itertools.product(*[range(len(c)) for c in pb.choices]):
        cs = [pb.choices[b][k] for b, k in enumerate(combo)]
        err = sum(round(c.error / EQ) for c in cs)
        if pb.error_budget is not None and err > round(pb.error_budget / EQ):
            continue
        t_compute, t_comm = 0, 0
        for b, c in enumerate(cs):
            t_compute += bwd[b] + round(c.compute_s / TQ)  # GPU compression kernels delay the compute stream
            t_comm = max(t_comm, t_compute) + round(c.comm_s / TQ)  # comm stream: wait for data and for the stream
        end = max(t_compute + round(pb.tail_s / TQ), t_comm)
        best = end if best is None else min(best, end)
    return best


def test_compression_matches_brute_force_on_random_instances():
    rng = random.Random(7)
    feasible = infeasible = 0
    for _ in range(300):
        pb = _random(rng)
        truth = _brute(pb)
        if truth is None:
            with pytest.raises(MeshplanError, match="error budget"):
                solve_compression_problem(pb, num_workers=1)
            infeasible += 1
            continue
        sol = solve_compression_problem(pb, num_workers=1)
        assert sol.status.status == "OPTIMAL"
        assert round(sol.end_s / TQ) == truth
        feasible += 1
    assert feasible > 200 and infeasible > 10


def test_budget_infeasible_reports_amount():
    c = [CompressionChoice("int8", 0, False, "gpu", 0.0, 1e-3, 0.02)]
    pb = CompressionProblem([1e-3] * 3, [1] * 3, [c] * 3, error_budget=0.05)
    with pytest.raises(MeshplanError, match=r"least achievable error is 0.06 \(0.01 over\)"):
        solve_compression_problem(pb, num_workers=1)
