"""``meshplan advise`` closing the loop for real on this host: a deliberately poor layout of the example trainer runs
under ``meshplan profile`` (``local:2``, gloo), is advised, and the advised plan runs through its torchrun export.

Asserted is what holds at any host speed: the layout inferred from the run's traces is the plan the run was
launched with (and the model's shape is examples/tiny-gpt/config.json), the shares of the gain add up to it, the
export launches the advised layout, and ``check --advise`` puts the advice in the CI summary. How the measured gain
compares with the predicted one is a measurement of this host: ``python bench/advise.py``, BENCHMARKS.md.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from meshplan.cli.main import app
from meshplan.planner.plan.schema import load_plan
from tests.helpers import REPO

CONFIG = REPO / "examples" / "tiny-gpt" / "config.json"
TRAINER = REPO / "examples" / "train_gpt.py"
POOR = "tp=2,mbs=1,recompute=full"  # gloo all-reduces in every layer, and every forward run twice
BATCH, SEQ = 8, 128


@pytest.fixture(scope="module")
def advised(tmp_path_factory, host_calibration):
    from typer.testing import CliRunner

    runner, tmp = CliRunner(), tmp_path_factory.mktemp("advise")
    bad = tmp / "poor.yaml"
    r = runner.invoke(app, ["plan", "--model", str(CONFIG), "--cluster", "local:2", "--global-batch", str(BATCH),
                            "--seq-len", str(SEQ), "--dtype", "fp32", "--no-host-terms", "--fix", POOR, "--out",
                            str(bad), "--json"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["profile", "--from-plan", str(bad), "--out", str(tmp / "run"), "--warmup", "1",
                            "--steps", "3", "--unprofiled-steps", "3", "--json", str(TRAINER)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["advise", str(tmp / "run"), "--out", str(tmp / "advised.yaml"), "--to", "torchrun",
                            "--json"])
    assert r.exit_code == 0, r.output
    return runner, tmp, bad, json.loads(r.stdout)


@pytest.mark.slow
def test_inferred_layout_is_the_plan_the_run_launched(advised):
    _, tmp, bad, a = advised
    plan = load_plan(bad)
    got = {k: v["value"] for k, v in a["inferred"].items()}
    want = {"world_size": 2, "tp": plan.degrees.tp, "pp": plan.degrees.pp, "dp_replicate": plan.degrees.dp_replicate,
            "dp_shard": plan.degrees.dp_shard, "micro_batch": plan.micro_batch, "recompute": plan.recompute,
            "micro_batches": plan.grad_accum, "global_batch": BATCH, "seq_len": SEQ, "dtype": "fp32"}
    assert {k: got[k] for k in want} == want
    cfg, model = json.loads(Path(a["model"]).read_text()), json.loads(CONFIG.read_text())
    assert {k: cfg[k] for k in ("n_embd", "n_layer", "n_head", "vocab_size")} == \
        {k: model[k] for k in ("n_embd", "n_layer", "n_head", "vocab_size")}
    assert cfg["n_inner"] == 4 * model["n_embd"]  # GPT-2's n_inner null = 4 x n_embd


@pytest.mark.slow
def test_advice_shares_add_up_and_its_export_runs(advised):
    _, tmp, _, a = advised
    assert a["ran_predicted_step_s"] > 0 and a["measured_step_s"] > 0
    assert a["price_error"] == pytest.approx((a["measured_step_s"] - a["ran_predicted_step_s"])
                                             / a["ran_predicted_step_s"])
    assert not a["still_best"] and a["predicted_gain"] > 0, a
    gain_s = a["ran_predicted_step_s"] - a["best_predicted_step_s"]
    assert sum(c["gain_s"] for c in a["changes"]) == pytest.approx(gain_s, rel=1e-9)
    more = {"none": 0, "selective": 1, "full": 2}  # what each recompute mode runs again in backward, in order
    for c in a["changes"]:  # more recomputation only adds work: never credited with any of the gain
        was, now = c["changes"].get("recompute", ("none", "none"))
        if more[now] > more[was]:
            assert c["gain_s"] <= 0.0, c
    best = load_plan(a["plan"])
    script = Path(a["export"])
    env = {**os.environ, "MESHPLAN_ENTRY": str(TRAINER)}
    r = subprocess.run(["bash", str(script), "--steps", "3"], capture_output=True, text=True, cwd=REPO, env=env,
                       timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    m = re.search(r"pp=(\d+) dp_replicate=(\d+) dp_shard=(\d+) tp=(\d+)", r.stdout + r.stderr)
    assert m and tuple(map(int, m.groups())) == (best.degrees.pp, best.degrees.dp_replicate, best.degrees.dp_shard,
                                                 best.degrees.tp)


@pytest.mark.slow
def test_check_advise_puts_the_advice_in_the_ci_summary(advised):
    runner, tmp, bad, a = advised
    md, xml = tmp / "summary.md", tmp / "report.xml"
    r = runner.invoke(app, ["check", str(bad), str(tmp / "run"), "--advise", "--advise-out",
                            str(tmp / "nightly-advised.yaml"), "--summary", str(md), "--junit", str(xml)])
    assert r.exit_code in (0, 1), r.output
    text = md.read_text()
    assert "### meshplan advise" in text and "a faster layout" in text
    assert 'name="layout"' in xml.read_text() and "FasterLayout" in xml.read_text()
