"""QSync precision model: CP-SAT against brute force; serve/train entry points on real presets.

The brute force enumerates every precision of every operator on every slow group, prices the step as
max(fast group, each slow group's operator times + casts where consecutive precisions differ) and keeps the
lexicographic minimum (step time, then quality cost), as QSync's objective states.
"""
from __future__ import annotations

import itertools
import random

import pytest

from meshplan.core.errors import MeshplanError
from meshplan.planner.cluster.spec import load_cluster
from meshplan.planner.model.config import load_model
from meshplan.planner.search.solve.precision import QSyncGroup, QSyncProblem, solve_qsync, solve_serve
from meshplan.planner.search.solve.problems import precision_columns

TQ = 1e-6
QQ = 1e-3


def _random(rng: random.Random) -> QSyncProblem:
    O = rng.randint(1, 5)
    P = rng.randint(1, 3)
    G = 1 if O > 3 else rng.randint(1, 2)
    groups = []
    for g in range(G):
        times = [[rng.randint(20, 60) * TQ] + [None if rng.random() < 0.15 else rng.randint(5, 50) * TQ
                                               for _ in range(P - 1)] for _ in range(O)]
        for row in times:  # sometimes the reference precision is unavailable: a budget can then bind
            if P > 1 and row[1] is not None and rng.random() < 0.3:
                row[0] = None
        groups.append(QSyncGroup(f"slow{g}", times, [rng.randint(0, 8) * TQ for _ in range(O)],
                                 rng.choice([0.25, 0.5])))
    sens = [[0.0] + [rng.randint(1, 9) * QQ for _ in range(P - 1)] for _ in range(O)]
    budget = rng.choice([None, rng.randint(0, 12) * QQ])
    return QSyncProblem(tuple(f"p{i}" for i in range(P)), rng.randint(40, 200) * TQ, tuple(groups), sens, budget,
                        time_quantum_s=TQ, quality_quantum=QQ)


def _brute(pb: QSyncProblem):
    """(step ticks, quality in 1e-6 units) lexicographic minimum, or None."""
    P = len(pb.precisions)
    O = len(pb.sensitivity)
    per_group = []
    for g in pb.slow:
        opts = []
        for combo in itertools.product(range(P), repeat=O):
            if any(g.op_time_s[o][p] is None for o, p in enumerate(combo)):
                continue
            t = sum(round(g.op_time_s[o][p] / TQ) for o, p in enumerate(combo))
            t += sum(round(g.cast_s[o] / TQ) for o in range(1, O) if combo[o] != combo[o - 1])
            q = round(g.batch_share * 1e6) * sum(round(pb.sensitivity[o][p] / QQ) for o, p in enumerate(combo))
            opts.append((t, q))
        per_group.append(opts)
    best = None
    fast = round(pb.fast_step_s / TQ)
    for pick in itertools.product(*per_group):
        q = sum(x[1] for x in pick)
        if pb.quality_budget is not None and q > round(pb.quality_budget / QQ) * 1_000_000:
            continue
        key = (max([fast] + [x[0] for x in pick]), q)
        best = key if best is None else min(best, key)
    return best


def test_qsync_matches_brute_force_lexicographic_optimum():
    rng = random.Random(11)
    feasible = infeasible = 0
    for _ in range(250):
        pb = _random(rng)
        truth = _brute(pb)
        if truth is None:
            with pytest.raises(MeshplanError, match="quality budget"):
                solve_qsync(pb, num_workers=1)
            infeasible += 1
            continue
        sol = solve_qsync(pb, num_workers=1)
        assert sol.status.status == "OPTIMAL"
        assert round(sol.step_s / TQ) == truth[0]
        q = sum(round(g.batch_share * 1e6) * sum(round(pb.sensitivity[o][pb.precisions.index(p)] / QQ)
                                                 for o, p in enumerate(prec)) for g, prec in zip(pb.slow,
                                                                                                 sol.precision))
        assert q == truth[1]
        feasible += 1
    assert feasible > 150 and infeasible > 10


def test_precision_a_device_lacks_is_refused_with_its_name():
    c = load_cluster("4xT4+1xA100")
    devices = [g.device for g in c.groups]
    with pytest.raises(MeshplanError, match="precision fp8: device T4 does not support it"):
        precision_columns(devices, "serve", ["fp8"])
    # the default menu only offers what some device has: no fp8 on T4/A100 (datasheets: Turing/Ampere lack fp8)
    assert precision_columns(devices, "serve") == ("fp16", "int8", "int4")


def test_serve_plan_on_llm_pq_cluster_respects_budget_and_memory():
    model = load_model("qwen2.5-7b")
    cluster = load_cluster("4xT4+1xA100")
    res = solve_serve(model, cluster, batch=16, prompt_len=512, gen_len=128, quality_budget=0.2, time_limit_s=20,
                      micro_batches=(1, 2))
    assert res.status.status == "OPTIMAL"
    assert res.quality <= 0.2
    assert sum(s.num_layers for s in res.stages) == model.num_layers
    assert all(m <= cluster.groups[s.device_group].device.memory_bytes
               for s, m in zip(res.stages, res.detail["stage_memory_bytes"]))
    # the solver's plan can never be slower than the baselines priced by the same model
    assert all(res.tokens_per_s >= tps * (1 - 1e-9) for tps, _ in res.baselines.values())


def test_serve_memory_infeasible_names_constraint():
    # 70B at 16-bit on 4 T4 (16 GB each) + ... cannot fit even at int4 on 2 T4s: 70e9 * 0.52 B = 36 GB > 2 x 14 GB
    model = load_model("llama-3.1-70b-instruct")
    with pytest.raises(MeshplanError, match=r"device memory admits no plan.*GiB over"):
        solve_serve(model, load_cluster("2xT4"), batch=1, prompt_len=128, gen_len=8, time_limit_s=20)
