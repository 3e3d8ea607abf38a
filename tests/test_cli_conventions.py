"""CLI conventions an experienced user expects (issue 15 item 7): --version, a JSON object from `plan --json`,
PyTorch's dtype names, "did you mean" for a mistyped preset, wide cells wrapped rather than cut."""
from __future__ import annotations

import json
from importlib import metadata

import pytest

from meshplan.cli.main import app
from meshplan.planner.plan.schema import PLAN_SCHEMA_VERSION, load_plan

ARGS = ["--model", "llama-3.1-8b", "--cluster", "2x8xH100", "--global-batch", "64", "--seq-len", "4096"]


def test_version_is_the_installed_distribution(runner):
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.stdout.strip() == f"meshplan {metadata.version('meshplan')}"


def test_plan_json_is_one_object(runner, tmp_path):
    out = tmp_path / "p.yaml"
    r = runner.invoke(app, ["plan", *ARGS, "--top", "3", "--json", "--out", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["plan_path"] == str(out) and d["schema_version"] == PLAN_SCHEMA_VERSION
    assert isinstance(d["warnings"], list) and len(d["plans"]) == 3
    assert d["plans"][0]["step_time_s"] == pytest.approx(load_plan(out).prediction.step_time_s)
    assert d["meshplan_version"] == load_plan(out).meshplan_version


@pytest.mark.parametrize("alias,canonical", [("bfloat16", "bf16"), ("torch.float16", "fp16"), ("FP32", "fp32")])
def test_pytorch_dtype_names_are_accepted(runner, tmp_path, alias, canonical):
    out = tmp_path / "p.yaml"
    r = runner.invoke(app, ["plan", *ARGS, "--top", "1", "--json", "--dtype", alias, "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert load_plan(out).dtype == canonical


def test_unknown_dtype_is_one_line(runner, tmp_path):
    r = runner.invoke(app, ["plan", *ARGS, "--dtype", "bfloat17", "--out", str(tmp_path / "p.yaml")])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1 and "bfloat17" in r.output


@pytest.mark.parametrize("flag,typo,suggested", [("--model", "llama-3.1-8", "llama-3.1-8b"),
                                                 ("--cluster", "2x8xH10", "A10")])
def test_mistyped_preset_gets_a_suggestion(runner, tmp_path, flag, typo, suggested):
    args = list(ARGS)
    args[args.index(flag) + 1] = typo
    r = runner.invoke(app, ["plan", *args, "--out", str(tmp_path / "p.yaml")])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1
    assert "did you mean" in r.output and suggested in r.output


def test_wide_cells_wrap_in_a_narrow_terminal(tmp_path):
    """At 60 columns the layout string (about 50 characters) is folded inside its cell, never cut with an ellipsis."""
    from typer.testing import CliRunner

    r = CliRunner().invoke(app, ["plan", *ARGS, "--top", "2", "--out", str(tmp_path / "p.yaml")],
                           env={"COLUMNS": "60"}, terminal_width=60)
    assert r.exit_code == 0, r.output
    assert "…" not in r.stdout
    best = load_plan(tmp_path / "p.yaml")
    text = "".join(ch for ch in r.stdout if ch.isalnum() or ch in "=()")
    assert f"tp={best.degrees.tp}" in text and f"zero={best.zero_stage}" in text
