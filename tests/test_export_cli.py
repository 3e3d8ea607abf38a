"""``meshplan export`` through typer's CliRunner: stdout / --out / --json, warnings on stderr, bad input -> exit 2
with one line."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshplan.cli.main import app
from meshplan.planner.export import render
from tests.test_export_golden import GOLDEN, plan_fsdp8b, plan_hetero, plan_mixed


@pytest.fixture
def plan_file(tmp_path: Path) -> Path:
    return plan_hetero().save(tmp_path / "hetero.yaml")


def test_stdout_matches_golden(runner, plan_file: Path) -> None:
    res = runner.invoke(app, ["export", str(plan_file), "--to", "megatron"])
    assert res.exit_code == 0, res.output
    assert res.stdout == (GOLDEN / "hetero.megatron.sh").read_text()
    warnings = [ln for ln in res.stderr.splitlines() if ln]
    assert warnings == ["warning: " + w for w in render(plan_hetero(), "megatron").warnings]


def test_out_writes_file(runner, plan_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "cfg" / "ds.json"
    mixed = plan_mixed().save(tmp_path / "mixed.yaml")
    res = runner.invoke(app, ["export", str(mixed), "--to", "deepspeed", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert out.read_text() == (GOLDEN / "mixed.deepspeed.json").read_text()
    assert "written" in res.stdout and '"train_batch_size"' not in res.stdout
    assert str(len(out.read_bytes())) in res.stdout
    assert not list(out.parent.glob(".*.tmp"))  # atomic write left no temp file


def test_json(runner, tmp_path: Path) -> None:
    path = plan_fsdp8b().save(tmp_path / "fsdp.yaml")
    res = runner.invoke(app, ["export", str(path), "--to", "torchtitan", "--json"])
    assert res.exit_code == 0, res.output
    obj = json.loads(res.stdout)
    assert obj["target"] == "torchtitan" and obj["warnings"] == []
    assert obj["text"] == (GOLDEN / "fsdp8b.torchtitan.toml").read_text()


def _one_error_line(res) -> str:
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "Traceback" not in res.output
    return lines[0]


def test_unknown_target(runner, plan_file: Path) -> None:
    line = _one_error_line(runner.invoke(app, ["export", str(plan_file), "--to", "ray"]))
    assert "unknown export target 'ray'" in line


def test_missing_plan(runner, tmp_path: Path) -> None:
    line = _one_error_line(runner.invoke(app, ["export", str(tmp_path / "nope.yaml"), "--to", "torchrun"]))
    assert "nope.yaml: plan file not found" in line


def test_not_a_plan(runner, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nglobal_batch: [1\n")
    assert "not valid YAML" in _one_error_line(runner.invoke(app, ["export", str(bad), "--to", "torchrun"]))
    bad.write_text("name: x\nglobal_batch: 4\n")
    assert "not a valid plan" in _one_error_line(runner.invoke(app, ["export", str(bad), "--to", "torchrun"]))


def test_failed_check_names_file_and_numbers(runner, tmp_path: Path) -> None:
    p = plan_mixed().model_copy(update={"zero_stage": 2})
    path = p.save(tmp_path / "zero2pp.yaml")
    out = tmp_path / "never.json"
    line = _one_error_line(runner.invoke(app, ["export", str(path), "--to", "deepspeed", "--out", str(out)]))
    assert "zero2pp.yaml: deepspeed: pipeline parallelism (pp=2) is incompatible with ZeRO stage 2" in line
    assert not out.exists()
