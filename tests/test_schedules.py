"""Pipeline schedules (issue 12 item 2): bubbles as the papers print them, activations in flight, parameter copies,
and the schedules a plan pins reach the plan, its memory and the exports' warnings."""
from __future__ import annotations

import pytest

from meshplan.cli.main import app
from meshplan.planner.estimate.memory import inflight_factor, model_state_bytes
from meshplan.planner.layout.layout import Layout
from meshplan.planner.layout.schedules import bubble_s
from meshplan.planner.plan.schema import load_plan

# Qi et al. 2024 Table 1 / DeepSeek-V3 Table 2 notation with unit passes: F = 1, B (input grads) = 1, W = 1, so a
# micro-batch's full forward + backward t = 3 and its full backward b = 2.
T, B_FULL = 3.0, 2.0


@pytest.mark.parametrize("pp", [2, 4, 8, 16])
def test_bubbles_match_the_papers(pp):
    f, b_in, w = 1.0, 1.0, 1.0
    assert bubble_s("1f1b", pp, 1, T, B_FULL) == (pp - 1) * (f + b_in + w)  # Narayanan et al. 2021: (p-1)(F+B)
    assert bubble_s("interleaved", pp, 4, T, B_FULL) == (pp - 1) * (f + b_in + w) / 4
    assert bubble_s("zbh1", pp, 1, T, B_FULL) == (pp - 1) * (f + b_in - w)  # Qi et al.: 1/3 of 1F1B's
    assert bubble_s("zbh1", pp, 1, T, B_FULL) == pytest.approx(bubble_s("1f1b", pp, 1, T, B_FULL) / 3)
    # DeepSeek-V3 Table 2: (PP/2 - 1)(F&B + B - 3W), F&B = F + B_full, B = the full backward
    assert bubble_s("dualpipe", pp, 1, T, B_FULL) == (pp / 2 - 1) * ((f + b_in + w) + (b_in + w) - 3 * w)


def test_memory_in_flight_and_parameter_copies():
    one = Layout(pp=8, micro_batch=1)
    dual = Layout(pp=8, micro_batch=1, pipeline_schedule="dualpipe")
    zb = Layout(pp=8, micro_batch=1, pipeline_schedule="zbh1")
    assert inflight_factor(one, 64, 0) == 8 and inflight_factor(zb, 64, 0) == 8  # PP (Table 2: 1F1B, ZB1P)
    assert inflight_factor(dual, 64, 0) == 9 and inflight_factor(dual, 64, 7) == 9  # PP + 1 on every rank
    assert model_state_bytes(1e9, 0, dual) == tuple(2 * x for x in model_state_bytes(1e9, 0, one))  # 2x


def test_pinned_schedules_are_planned_priced_and_named_by_the_exports(runner, tmp_path):
    args = ["plan", "--model", "llama-3.1-70b", "--cluster", "8x8xH100", "--global-batch", "512", "--seq-len", "4096",
            "--top", "1", "--json"]
    steps = {}
    for sched in ("1f1b", "zbh1", "dualpipe"):
        out = tmp_path / f"{sched}.yaml"
        r = runner.invoke(app, [*args, "--fix", f"tp=8,pp=8,mbs=1,recompute=full,schedule={sched}", "--out", str(out)])
        assert r.exit_code == 0, r.output
        plan = load_plan(out)
        assert plan.schedule == sched
        steps[sched] = plan.prediction
        r = runner.invoke(app, ["export", str(out), "--to", "megatron", "--json"])
        assert r.exit_code == 0
        assert any(f"no {sched} pipeline schedule" in w for w in __import__("json").loads(r.stdout)["warnings"]) == (
            sched != "1f1b")
    # same micro-batches, same per-stage work: only the schedule's bubble differs (formulas checked above)
    for sched in ("zbh1", "dualpipe"):
        assert steps[sched].breakdown.bubble_s < steps["1f1b"].breakdown.bubble_s
        assert steps[sched].breakdown.compute_s == pytest.approx(steps["1f1b"].breakdown.compute_s)
    assert steps["dualpipe"].peak_memory_bytes > steps["1f1b"].peak_memory_bytes  # two parameter copies


@pytest.mark.parametrize("fix,needle", [("pp=7,tp=8,dp=1,schedule=dualpipe", "pp must be even"),
                                         ("pp=4,vpp=2,schedule=zbh1", "one chunk per rank"),
                                         ("schedule=zb", "expected one of")])
def test_impossible_schedules_are_refused(runner, tmp_path, fix, needle):
    r = runner.invoke(app, ["plan", "--model", "llama-3.1-70b", "--cluster", "7x8xH100", "--global-batch", "448",
                            "--seq-len", "4096", "--fix", fix, "--out", str(tmp_path / "p.yaml")])
    assert r.exit_code == 2 and needle in r.output and len(r.output.strip().splitlines()) == 1, r.output
