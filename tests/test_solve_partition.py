"""Exactness of the partition + precision CP-SAT model against an independent brute-force enumeration.

The brute force below enumerates every composition of the layers into stages, every mapping of stages to
device groups and every per-layer precision, prices each with the step-time formula written out again here
(sum of stage times + links + (m-1) x slowest, 1F1B in-flight memory), and keeps the minimum. Times, bytes
and indicators are whole multiples of the solver's quanta, so both sides work in exact integers.
"""
from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from meshplan.core.errors import MeshplanError
from meshplan.planner.search.solve.partition import (
    GroupSlot,
    PartitionProblem,
    Phase,
    PipelineOption,
    StageRun,
    evaluate,
    solve_partition,
)

TQ = 1e-6  # time quantum used by the instances, seconds
MQ = 2**20  # memory quantum, bytes
QQ = 1e-3  # quality quantum


def _random_problem(rng: random.Random) -> PartitionProblem:
    L = rng.randint(2, 5)
    G = rng.randint(1, 3)
    P = rng.randint(1, 3) if L <= 4 else rng.randint(1, 2)
    groups = tuple(GroupSlot(f"dev{g}", rng.randint(0 if g else 1, 2), rng.randint(8, 60) * MQ) for g in range(G))
    unsupported = {(g, p) for g in range(G) for p in range(1, P) if rng.random() < 0.2}  # column 0 always runs

    def table(lo, hi, scale, zero_ok=False):
        return [[[None if (g, p) in unsupported else (0 if zero_ok and rng.random() < 0.3 else rng.randint(lo,
                                                                                                           hi)) * scale
                  for p in range(P)] for g in range(G)] for _ in range(L)]

    options = []
    for _ in range(rng.randint(1, 2)):
        phases = []
        for k in range(rng.randint(1, 2)):
            link = [[rng.randint(0, 15) * TQ for _ in range(G)] for _ in range(G)]
            phases.append(Phase(f"ph{k}", rng.randint(1, 4), rng.randint(1, 3), table(1, 30, TQ), link))
        options.append(PipelineOption("opt", tuple(phases), table(1, 12, MQ), table(0, 6, MQ, zero_ok=True),
                                      inflight_cap=rng.randint(1, 4)))
    sens = [[0.0] + [rng.randint(0, 20) * QQ for _ in range(P - 1)] for _ in range(L)]
    if rng.random() < 0.5:  # identical middle layers, as in a real transformer: exercises the block counts
        a, b = (1, L - 1) if L > 3 else (0, L)
        for opt in options:
            for ph in opt.phases:
                for l in range(a + 1, b):
                    ph.layer_time_s[l] = ph.layer_time_s[a]
            for l in range(a + 1, b):
                opt.static_bytes[l] = opt.static_bytes[a]
                opt.act_bytes[l] = opt.act_bytes[a]
        for l in range(a + 1, b):
            sens[l] = sens[a]
    budget = rng.choice([None, rng.randint(0, 40) * QQ])
    return PartitionProblem(tuple(f"p{p}" for p in range(P)), groups, tuple(options), sens, budget,
                            time_quantum_s=TQ, memory_quantum_bytes=MQ, quality_quantum=QQ)


def _brute_force(pb: PartitionProblem):
    """Minimum objective (integer microseconds) over every plan, or None when no plan is feasible."""
    L, G, P = pb.num_layers, len(pb.groups), len(pb.precisions)
    combos = np.array(list(itertools.product(range(P), repeat=L)), dtype=np.int64)  # (P^L, L)
    lay = np.arange(L)
    sens = np.array([[round(x / QQ) for x in row] for row in pb.sensitivity], dtype=np.int64)
    quality = sens[lay, combos].sum(axis=1)
    ok_q = np.ones(len(combos), bool) if pb.quality_budget is None else quality <= round(pb.quality_budget / QQ)
    best = None

    def arr(tab):  # [layer][group][precision] -> int array, unsupported = -1
        return np.array([[[-1 if x is None else round(x / (TQ if tab is not None else 1)) for x in gr] for gr in row]
                         for row in tab], dtype=np.int64)

    for opt in pb.options:
        st = np.array([[[-1 if x is None else round(x / MQ) for x in gr] for gr in row] for row in opt.static_bytes])
        ac = np.array([[[-1 if x is None else round(x / MQ) for x in gr] for gr in row] for row in opt.act_bytes])
        phases = [(arr(ph.layer_time_s), np.array([[round(x / TQ) for x in r] for r in ph.link_time_s]),
                   ph.num_micro_batches, ph.weight) for ph in opt.phases]
        for cuts in itertools.product([0, 1], repeat=L - 1):
            bounds = [0] + [i + 1 for i, c in enumerate(cuts) if c] + [L]
            runs = [(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]
            S = len(runs)
            for gs in itertools.product(range(G), repeat=S):
                if any(gs.count(g) > pb.groups[g].max_stages for g in range(G)):
                    continue
                glay = np.array([gs[i] for i, (a, b) in enumerate(runs) for _ in range(a, b)])
                ok = ok_q.copy()
                for tab, _, _, _ in phases:
                    ok &= (tab[lay, glay[lay], combos] >= 0).all(axis=1)
                ok &= (st[lay, glay[lay], combos] >= 0).all(axis=1)
                for i, (a, b) in enumerate(runs):
                    inflight = min(opt.inflight_cap, S - i)
                    mem = (st[lay[a:b], glay[a:b], combos[:, a:b]]
                           + ac[lay[a:b], glay[a:b], combos[:, a:b]] * inflight).sum(axis=1)
                    ok &= mem <= pb.groups[gs[i]].memory_bytes // MQ
                if not ok.any():
                    continue
                total = np.zeros(len(combos), dtype=np.int64)
                for tab, link, m, w in phases:
                    t = tab[lay, glay[lay], combos]
                    stage_t = np.stack([t[:, a:b].sum(axis=1) for a, b in runs], axis=1)
                    links = [link[gs[i], gs[i + 1]] for i in range(S - 1)]
                    slow = np.maximum(stage_t.max(axis=1), max(links, default=0))
                    total += w * (stage_t.sum(axis=1) + sum(links) + (m - 1) * slow)
                v = int(total[ok].min())
                best = v if best is None else min(best, v)
    return best


def test_partition_matches_brute_force_on_random_instances():
    rng = random.Random(20240611)
    n_feasible = n_infeasible = 0
    for _ in range(200):
        pb = _random_problem(rng)
        truth = _brute_force(pb)
        if truth is None:
            with pytest.raises(MeshplanError):
                solve_partition(pb, time_limit_s=10, num_workers=1)
            n_infeasible += 1
            continue
        sol = solve_partition(pb, time_limit_s=10, num_workers=1)
        assert sol.status.status == "OPTIMAL"
        assert round(sol.evaluation.objective_s / TQ) == truth
        assert sol.evaluation.feasible, sol.evaluation.violations
        n_feasible += 1
    # both outcomes must be exercised for the comparison to mean something
    assert n_feasible > 100 and n_infeasible > 10


def _two_group_problem(budget=None, cap_gib=40):
    # 4 layers; group 0 fast (1 unit), group 1 slow (2 units); bf16 and int8
    fast = [[1e-3, 0.6e-3], [3e-3, 1.8e-3]]
    t = [fast for _ in range(4)]
    mem = [[[10 * 2**30, 5 * 2**30], [10 * 2**30, 5 * 2**30]] for _ in range(4)]
    zero = [[[0.0, 0.0], [0.0, 0.0]] for _ in range(4)]
    ph = Phase("step", 1, 1, t, [[0.0, 0.0], [0.0, 0.0]])
    return PartitionProblem(("bf16", "int8"), (GroupSlot("A100", 1, 80 * 2**30), GroupSlot("T4", 2, cap_gib * 2**30)),
                            (PipelineOption("m1", (ph,), mem, zero),), [[0.0, 0.1]] * 4, budget)


def test_memory_infeasible_names_constraint_and_amount():
    pb = _two_group_problem(cap_gib=1)
    pb = PartitionProblem(pb.precisions, (GroupSlot("A100", 1, 8 * 2**30), GroupSlot("T4", 1, 8 * 2**30)),
                          pb.options, pb.sensitivity, None)
    # 4 layers x 5 GiB (int8) = 20 GiB over two 8 GiB devices: the best split leaves 10 GiB on one -> 2 GiB over
    with pytest.raises(MeshplanError, match=r"memory admits no plan.*2\.00 GiB over"):
        solve_partition(pb, num_workers=1)


def test_quality_budget_infeasible_names_constraint_and_amount():
    # both devices 16 GiB: 40 GiB bf16 does not fit 32 GiB, so at least 2 layers must be int8 (0.1 each)
    pb = _two_group_problem()
    pb = PartitionProblem(pb.precisions, (GroupSlot("A100", 1, 16 * 2**30), GroupSlot("T4", 1, 16 * 2**30)),
                          pb.options, pb.sensitivity, quality_budget=0.15)
    with pytest.raises(MeshplanError, match=r"quality budget 0.15 admits no plan.*at least 0.2 \(0.05 over"):
        solve_partition(pb, num_workers=1)


def test_evaluate_refuses_precision_the_device_lacks():
    pb = _two_group_problem()
    opt = pb.options[0]
    t = [[[1e-3, None], [3e-3, 1.8e-3]] for _ in range(4)]
    pb2 = PartitionProblem(pb.precisions, pb.groups, (PipelineOption("m1", (Phase("step", 1, 1, t,
                                                                                  opt.phases[0].link_time_s),),
                                                                     opt.static_bytes, opt.act_bytes),), pb.sensitivity)
    with pytest.raises(MeshplanError, match="device A100 does not support int8"):
        evaluate(pb2, 0, [StageRun(0, 4, 0)], ["int8"] * 4)


def test_time_limit_surfaces_with_best_bound():
    # 80 identical layers over 32 stage units of 4 groups: CP-SAT cannot prove optimality in 0.3 s, so the
    # result must say so and carry a valid bound below the plan's objective
    L, G, P = 80, 4, 3
    speed = [1.0, 1.7, 2.9, 4.1]
    t = [[[1e-3 * speed[g] * (1.0, 0.7, 0.55)[p] for p in range(P)] for g in range(G)] for _ in range(L)]
    mem = [[[2**30 * (1.0, 0.5, 0.3)[p] for p in range(P)] for g in range(G)] for _ in range(L)]
    zero = [[[0.0] * P for _ in range(G)] for _ in range(L)]
    ph = Phase("step", 16, 1, t, [[0.0 if a == b else 1e-4 for b in range(G)] for a in range(G)])
    pb = PartitionProblem(("bf16", "fp8", "int8"), tuple(GroupSlot(f"d{g}", 8, 12 * 2**30) for g in range(G)),
                          (PipelineOption("m16", (ph,), mem, zero, inflight_cap=16),),
                          [[0.0, 1e-3, 5e-3]] * L, quality_budget=0.2)
    sol = solve_partition(pb, time_limit_s=0.3, num_workers=1)
    assert sol.status.hit_time_limit and sol.status.status == "FEASIBLE"
    assert sol.status.best_bound < sol.status.objective
    assert sol.evaluation.feasible
