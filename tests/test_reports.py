"""``--report FILE.html`` of ``meshplan plan``, ``check`` and ``replay``: each page opened in a real headless
Chromium (Debian's ``chromium``; ``.ci/run`` installs it), every chart rendered, no console message, a screenshot
saved for the review (its folder is printed; ``pytest -s`` shows it).

What is counted comes from elsewhere: the priced layouts from the search itself, the schedule's passes from the
schedule's definition (a forward and a backward per micro-batch, chunk and rank), the runs from the command's own
JSON. The schedule timing is checked against the published bubble formulas (``planner.layout.schedules``).
"""
from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from plotly.offline import get_plotlyjs

from meshplan.cli.main import app
from meshplan.planner.layout.pipeline_timeline import schedule_slots
from meshplan.planner.layout.schedules import bubble_s
from meshplan.planner.search.report import frontier
from meshplan.profiler.report_page import _covered
from tests.helpers import DATA

PLOTLY_JS_HEAD = get_plotlyjs()[:300]
CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium)")


def _render(pages: dict[str, Path], shots: Path) -> dict[str, tuple[str, list[str]]]:
    """Open each page in headless Chromium at once; name -> (the DOM after its scripts ran, console lines)."""
    procs = {}
    for name, html in pages.items():
        cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--enable-logging=stderr",
               "--v=0", "--window-size=1280,2400", f"--screenshot={shots / (name + '.png')}", "--dump-dom",
               html.resolve().as_uri()]
        procs[name] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                       cwd=shots)
    out = {}
    for name, p in procs.items():
        dom, err = p.communicate(timeout=300)  # a guard against a hang; ~5 s a page on an idle machine
        out[name] = (dom, [line for line in err.splitlines() if ":CONSOLE" in line])
    return out


def _charts(dom: str) -> list[str]:
    """The DOM of each chart div, in page order."""
    return re.split(r'<div class="mp-chart">', dom)[1:]


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """The three reports, written by the commands, and what the commands said (JSON)."""
    from typer.testing import CliRunner

    from meshplan.planner.search.job import PlanRequest, plan_job

    runner = CliRunner()
    tmp = tmp_path_factory.mktemp("reports")
    out: dict = {"tmp": tmp}
    # plan: a pinned interleaved pipeline, m = 32 / (dp 2 x mbs 1) = 16 micro-batches, all drawn (16 x 2 chunks <= 40)
    args = ["plan", "--model", "llama-3.1-70b", "--cluster", "8x8xH100", "--global-batch", "32", "--seq-len", "4096",
            "--fix", "tp=8,pp=4,vpp=2,mbs=1,cp=1", "--out", str(tmp / "p.yaml"), "--json"]
    r = runner.invoke(app, args + ["--report", str(tmp / "plan.html")])
    assert r.exit_code == 0, r.output
    out["plan_json"] = json.loads(r.stdout)
    out["outcome"] = plan_job(PlanRequest.of("llama-3.1-70b", "8x8xH100", 32, 4096, fix="tp=8,pp=4,vpp=2,mbs=1,cp=1",
                                             out=tmp / "q.yaml"))
    out["priced"] = len(out["outcome"].priced)
    # check: three runs of one plan (real gloo traces; the step times of run.json given)
    from tests.test_check import _plan, _run

    plan = _plan(tmp)
    runs = []
    for name, t in (("r1", 0.21), ("r2", 0.26), ("r3", 0.19)):
        d = _run(tmp, {"0": [t] * 6, "1": [t] * 6}, plan=plan, name=name)
        for f in (DATA / "profiler" / "gloo_ddp_2rank").glob("rank*.trace.json.gz"):
            shutil.copy(f, d / f.name)
        runs.append(str(d))
    r = runner.invoke(app, ["check", str(plan), *runs, "--json", "--report", str(tmp / "check.html")])
    assert r.exit_code == 1, r.output  # r2 is +30%: outside 15%
    out["check_json"] = json.loads(r.stdout)
    r = runner.invoke(app, ["replay", str(DATA / "profiler" / "gloo_ddp_2rank"), "--no-cache", "--json",
                            "--timeline", str(tmp / "replay.pftrace"), "--report", str(tmp / "replay.html")])
    assert r.exit_code == 0, r.output
    out["replay_json"] = json.loads(r.stdout)
    return out


@pytest.fixture(scope="module")
def rendered(pages):
    if CHROMIUM is None:
        pytest.skip("no chromium on PATH (apt-get install chromium)")
    shots = pages["tmp"] / "screenshots"
    shots.mkdir()
    print(f"\nreport screenshots: {shots}")
    names = {n: pages["tmp"] / f"{n}.html" for n in ("plan", "check", "replay")}
    return _render(names, shots), shots


def test_the_pages_are_one_self_contained_file_each(pages):
    for name in ("plan", "check", "replay"):
        html = (pages["tmp"] / f"{name}.html").read_text()
        assert html.count(PLOTLY_JS_HEAD) == 1, "plotly.js is inlined, once"
        assert html.count("Plotly.newPlot") >= 3
        assert not re.search(r"<(script|link)[^>]+(src|href)=", html), "a page loads nothing from elsewhere"
        assert len(html) < 8e6
    assert pages["plan_json"]["plans"][0]["pp"] == 4  # --json still says what it said
    assert len(pages["check_json"]["runs"]) == 3 and pages["check_json"]["exit_code"] == 1
    assert (pages["tmp"] / "replay.pftrace").stat().st_size > 0 and pages["replay_json"]["steps"]


@needs_chromium
def test_every_chart_renders_without_a_console_message(rendered):
    out, shots = rendered
    for name, (dom, console) in out.items():
        assert console == [], f"{name}: {console}"
        charts = _charts(dom)
        assert len(charts) >= 3, name
        for i, c in enumerate(charts):
            assert 'class="main-svg"' in c, f"{name} chart {i} did not render"
        assert (shots / f"{name}.png").stat().st_size > 20_000


@needs_chromium
def test_the_plan_page_draws_every_priced_layout_and_every_pass(rendered, pages):
    dom, _ = rendered[0]["plan"]
    scatter, stages, schedule, memory = _charts(dom)[:4]
    first = scatter.split('class="trace scatter')[1]  # the priced layouts' trace
    assert first.count('class="point"') == pages["priced"]
    # interleaved, 4 ranks x 2 chunks x 16 micro-batches, a forward and a backward each
    assert schedule.count('class="point"') == 2 * 4 * 2 * 16
    assert "weights" in memory and "stage 3" in stages


@needs_chromium
def test_the_check_page_charts_every_run(rendered):
    dom, _ = rendered[0]["check"]
    assert "meshplan check: FAIL" in dom  # r2 is outside the tolerance: the page says what the exit code says
    over_runs = _charts(dom)[-1]
    for run in ("1: r1", "2: r2", "3: r3"):
        assert run in over_runs


@pytest.mark.parametrize("schedule,pp,vpp,m", [("1f1b", 4, 1, 8), ("1f1b", 3, 1, 2), ("interleaved", 4, 2, 8),
                                               ("interleaved", 2, 4, 6), ("zbh1", 4, 1, 8), ("zbh1", 8, 1, 16),
                                               ("dualpipe", 4, 1, 8), ("dualpipe", 8, 1, 20), ("dualpipe", 2, 1, 4)])
def test_drawn_schedules_idle_as_their_published_bubbles(schedule, pp, vpp, m):
    # backward = 2 x forward (the estimator's ratio): every stage idles exactly planner.layout.schedules' bubble, the
    # formulas of Narayanan et al. (1F1B, interleaved), Qi et al. (ZB-H1) and DeepSeek-V3's Table 2 (DualPipe)
    f, b = 0.7, 1.4
    slots = schedule_slots(schedule, pp, vpp, m, [f] * pp, [b] * pp)
    end = max(s.end_s for s in slots)
    for r in range(pp):
        busy = sum(s.end_s - s.start_s for s in slots if s.rank == r)
        assert busy == pytest.approx(m * (f + b))
        assert end - busy == pytest.approx(bubble_s(schedule, pp, vpp, f + b, b))
    chunks = vpp if schedule == "interleaved" else 1
    for kind in "FB":
        assert sum(s.kind == kind for s in slots) == pp * chunks * m
    # a micro-batch's forward reaches a stage only after the stage before it is done with it
    by = {(s.kind, s.chunk, s.microbatch, s.rank): s for s in slots}
    for s in slots:
        if s.kind == "F" and schedule != "dualpipe" and (s.rank, s.chunk) != (0, 0):
            prev = by[("F", s.chunk, s.microbatch, s.rank - 1)] if s.rank else by[("F", s.chunk - 1, s.microbatch,
                                                                                  pp - 1)]
            assert s.start_s >= prev.end_s - 1e-12


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved"])
def test_1f1b_bubbles_hold_at_any_backward_share(schedule):
    f, b, pp, vpp, m = 0.3, 0.9, 4, (2 if schedule == "interleaved" else 1), 8
    slots = schedule_slots(schedule, pp, vpp, m, [f] * pp, [b] * pp)
    assert max(s.end_s for s in slots) - m * (f + b) == pytest.approx(bubble_s(schedule, pp, vpp, f + b, b))


def test_frontier_is_the_brute_force_pareto_set():
    rng = random.Random(7)
    pts = [("x", rng.choice([1.0, 1.5, 2.0, 3.0]) * rng.random(), rng.randrange(1, 50), rng.random() > 0.3, {})
           for _ in range(300)]
    brute = {i for i, p in enumerate(pts) if p[3] and not any(
        q[3] and q[2] <= p[2] and q[1] < p[1] for q in pts)}
    # ties in memory keep the fastest only; a tie in both keeps one
    assert set(frontier(pts)) <= brute
    assert {(pts[i][1], pts[i][2]) for i in frontier(pts)} == {(pts[i][1], pts[i][2]) for i in brute}


def test_rank_parts_are_interval_unions():
    # [0,3) + [2,5) + [7,8): 5 + 1 = 6; nested and touching intervals
    assert _covered([(0, 3), (2, 5), (7, 8)]) == 6
    assert _covered([(0, 10), (2, 3), (10, 12)]) == 12
    assert _covered([]) == 0


def test_the_replay_page_parts_sum_to_each_replayed_step():
    from meshplan.profiler.report import analyze_run
    from meshplan.profiler.report_page import rank_step_parts

    a = analyze_run(DATA / "profiler" / "gloo_ddp_2rank")
    parts = rank_step_parts(a.timeline)
    assert set(parts) == set(a.timeline.steps)
    for s, ranks in parts.items():
        assert set(ranks) == {0, 1}
        for r, p in ranks.items():
            assert min(p.values()) >= -1e-12
            assert sum(p.values()) == pytest.approx(a.timeline.steps[s])


@pytest.mark.parametrize("cmd", ["plan", "check", "replay"])
def test_a_report_path_that_is_a_folder_or_an_input_is_one_line(cmd, tmp_path, runner):
    from tests.test_check import _plan, _run

    plan = _plan(tmp_path)
    run = _run(tmp_path, {"0": [0.2] * 4, "1": [0.2] * 4}, plan=plan)
    argv = {"plan": ["plan", "--model", "llama-3.1-8b", "--cluster", "2x8xH100", "--global-batch", "16",
                     "--seq-len", "1024", "--out", str(tmp_path / "p.yaml")],
            "check": ["check", str(plan), str(run), "--no-breakdown"],
            "replay": ["replay", str(DATA / "profiler" / "gloo_ddp_2rank"), "--no-cache"]}[cmd]
    for bad in (tmp_path, plan if cmd == "check" else tmp_path / "p.yaml" if cmd == "plan" else
                DATA / "profiler" / "gloo_ddp_2rank" / "rank0.trace.json.gz"):
        r = runner.invoke(app, argv + ["--report", str(bad)])
        assert r.exit_code == 2, r.output
        assert len(r.output.strip().splitlines()) == 1 and "--report" in r.output


def test_a_plan_without_an_op_breakdown_still_gets_its_page(pages):
    # host-measured clusters (local:N) have no per-op breakdown: the page splits the step as the estimate does
    from meshplan.planner.search.report import plan_page, plan_report

    o = pages["outcome"]
    assert o.breakdown is None  # plan_job was not asked for it
    rep = plan_report(o)
    html = plan_page(rep)
    assert rep.stages is None and "the step" in html and html.count("Plotly.newPlot") == 4
    assert sum(rep.step_parts_s.values()) == pytest.approx(o.plan.prediction.step_time_s)


def test_solver_plans_refuse_a_report_before_planning(tmp_path, runner):
    r = runner.invoke(app, ["plan", "--model", "llama-3.1-8b", "--cluster", "2x8xH100", "--global-batch", "8",
                            "--seq-len", "1024", "--workload", "serve", "--out", str(tmp_path / "p.yaml"),
                            "--report", str(tmp_path / "r.html")])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1 and "solver" in r.output
    assert not (tmp_path / "p.yaml").exists()
