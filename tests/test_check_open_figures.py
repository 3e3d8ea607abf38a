"""``meshplan check`` reads the open figures a plan written with ``--explain`` priced both ways
(``verify.check.open_figure_notes``): a measured step between the prediction and the other price is that figure's to
explain, one past it or on the prediction's other side is not. The plans are real ``meshplan plan --explain`` plans
(the bands as ``planner.estimate.host_band`` / ``sustained_band`` write them); the measured steps are placed by hand
around their two prices."""
from __future__ import annotations

import pytest

from meshplan.planner.search.job import PlanRequest, plan_job
from meshplan.verify.check import open_figure_notes


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> dict[str, object]:
    tmp = tmp_path_factory.mktemp("plans")
    out = {}
    moe = "dp=8,tp=1,pp=1,ep=8,mbs=4,moe_dispatcher=hybridep,cuda_graphs=layers"
    for name, model, cluster, fix, batch, seq in (
            ("gb300", "llama-3.1-8b-instruct", "2x4xGB300-NVL72", "dp=8,tp=1,pp=1,mbs=2", 128, 8192),
            ("b200", "qwen3-30b-a3b", "1x8xB200", moe, 512, 4096)):
        out[name] = plan_job(PlanRequest.of(model, cluster, batch, seq, fix=fix, top=1, dtype="fp8",
                                            explain=True, out=tmp / f"{name}.yaml")).plan
    return out


@pytest.mark.parametrize("where, said", [(0.5, "between them"), (1.5, "past the other price"),
                                         (-0.5, "on the prediction's other side")])
def test_a_measured_step_is_placed_against_the_band(plans, where: float, said: str) -> None:
    # a lower share prices slower; the 2025 Linear pair's faster x86 host (13.48 / 37.08 of Grace's time against the
    # priced 181.7 / 197.4) waits less, so that price is the faster one
    for plan, key, what, slower in ((plans["gb300"], "sustained", "sustained clock", True),
                                    (plans["b200"], "host_speed", "host's speed", False)):
        predicted = plan.prediction.step_time_s
        other = plan.explain[key]["step_time_s"]
        assert (other > predicted) == slower
        (line,) = open_figure_notes(plan.explain, predicted + where * (other - predicted), predicted)
        assert what in line and said in line


def test_a_plan_without_bands_says_nothing(plans) -> None:
    assert open_figure_notes(None, 1.0, 1.0) == []
    explain = {k: v for k, v in plans["gb300"].explain.items() if k != "sustained"}
    assert open_figure_notes(explain, 1.0, 1.0) == []
