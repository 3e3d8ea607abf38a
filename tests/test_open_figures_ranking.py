"""Whether the best layout stays best at the other value of each open figure (``planner.search.open_figures``).

Truths the ranking does not compute: the host time of a routed stretch grows with the experts a rank holds (the
DeepSeek-V3 timeline's grouped linears, 90 us an expert on Grace), so a slower host favours the layout with fewer
experts a rank; the first layout's price at the other value is the one its band says (``host_band`` /
``sustained_band``, a second code path over the same figure).
"""
from __future__ import annotations

import pytest

from meshplan.planner.search.job import PlanRequest, plan_job
from meshplan.planner.search.open_figures import NAMED_GAIN, ranking_notes


def _plan(tmp_path, model: str, cluster: str, batch: int, seq: int, fix: str):
    return plan_job(PlanRequest.of(model, cluster, batch, seq, fix=fix, dtype="fp8", explain=True,
                                   out=tmp_path / "plan.yaml"))


def test_a_slower_host_favours_fewer_experts_a_rank(tmp_path) -> None:
    """Qwen3-235B-A22B on 32 DGX-B300 nodes: ranked at the priced x86 host speed the first layout holds 8 experts a
    rank (EP 16); at the other published speed the layout named holds fewer, and runs faster there than the first
    by more than the margin a layout is named at."""
    out = _plan(tmp_path, "qwen3-235b-a22b", "32x8xB300", 8192, 4096, "tp=1,pp=1,cp=1")
    rank = out.plan.explain["open_figures_ranking"]["host_speed"]
    first, named = out.rows[0], out.rows[rank["best_rank"] - 1]
    assert rank["best_rank"] > 1 and named["ep"] > first["ep"]
    assert rank["best_step_time_s"] < rank["first_step_time_s"] * (1 - NAMED_GAIN)
    assert rank["first_step_time_s"] == pytest.approx(out.plan.explain["host_speed"]["step_time_s"], rel=1e-9)
    assert any(f"#{rank['best_rank']} ({named['layout']})" in n for n in out.notes)


def test_the_first_layout_at_the_siblings_share_is_its_band(tmp_path) -> None:
    out = _plan(tmp_path, "llama-3.1-8b-instruct", "2x4xGB300-NVL72", 128, 8192, "tp=1,pp=1")
    ex = out.plan.explain
    rank = ex["open_figures_ranking"]["sustained"]
    assert rank["first_step_time_s"] == pytest.approx(ex["sustained"]["step_time_s"], rel=1e-9)
    assert rank["best_step_time_s"] <= rank["first_step_time_s"] and "host_speed" not in ex["open_figures_ranking"]


def test_notes_name_another_layout_only_past_the_margin() -> None:
    rows = [{"layout": f"layout {i}"} for i in range(1, 4)]
    close = {"host_speed": {"best_rank": 3, "best_step_time_s": 0.995, "first_step_time_s": 1.0}}
    far = {"sustained": {"best_rank": 3, "best_step_time_s": 0.9, "first_step_time_s": 1.0}}
    same = {"sustained": {"best_rank": 1, "best_step_time_s": 1.0, "first_step_time_s": 1.0}}
    assert "#1 stays the fastest of the 3 ranked" in ranking_notes(close, rows)[0]
    assert "#1 stays" in ranking_notes(same, rows)[0]
    said = "#3 (layout 3) runs fastest of the 3 ranked: 0.900 s a step against #1's 1.000 s"
    assert said in ranking_notes(far, rows)[0]


def test_no_ranking_where_no_figure_applies(tmp_path) -> None:
    """An MI300X's host waits were never read (the figures are NVIDIA's) and it has its own measured peers: no open
    figure applies, so the plan ranks nothing again."""
    out = plan_job(PlanRequest.of("mixtral-8x7b-v0.1", "1x8xMI300X", 256, 4096, fix="tp=1,pp=1", dtype="bf16",
                                  explain=True, out=tmp_path / "plan.yaml"))
    assert "open_figures_ranking" not in out.plan.explain and not any("open figure" in n for n in out.notes)
