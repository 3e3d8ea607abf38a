"""Nothing the user had is lost (issue 16 item 3): an output never overwrites an input of the same command, and a
plan file changed by another writer while a command ran is not overwritten (compare-and-swap under a lock file)."""
from __future__ import annotations

import os
import shutil

import pytest

from meshplan.cli.main import app
from meshplan.core.atomic import file_state, write_checked
from meshplan.core.errors import MeshplanError
from tests.helpers import REPO

PLAN = ["--global-batch", "64", "--seq-len", "4096", "--top", "1"]


def _one_line_exit_2(r, needle: str) -> None:
    assert r.exit_code == 2 and needle in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_plan_out_onto_its_own_inputs_is_refused(runner, tmp_path):
    cluster = tmp_path / "c.yaml"
    shutil.copy(REPO / "planner" / "presets" / "clusters" / "dgx-h100-16.yaml", cluster)
    model = tmp_path / "config.json"
    shutil.copy(REPO / "examples" / "tiny-gpt" / "config.json", model)
    before = {p: p.read_bytes() for p in (cluster, model)}
    r = runner.invoke(app, ["plan", "--model", "llama-3.1-8b", "--cluster", str(cluster), *PLAN, "--out", str(cluster)])
    _one_line_exit_2(r, "would overwrite the --cluster input")
    r = runner.invoke(app, ["plan", "--model", str(model), "--cluster", "8xH100", *PLAN, "--out",
                            str(tmp_path / "." / "config.json")])
    _one_line_exit_2(r, "would overwrite the --model input")
    assert {p: p.read_bytes() for p in before} == before


def test_export_and_check_outputs_onto_their_inputs_are_refused(runner, tmp_path):
    plan = tmp_path / "p.yaml"
    assert runner.invoke(app, ["plan", "--model", "llama-3.1-8b", "--cluster", "8xH100", *PLAN, "--out",
                               str(plan)]).exit_code == 0
    text = plan.read_bytes()
    os.symlink(plan, tmp_path / "link.yaml")
    _one_line_exit_2(runner.invoke(app, ["export", str(plan), "--to", "torchrun", "--out",
                                         str(tmp_path / "link.yaml")]),
                     "would overwrite the PLAN input")
    run = tmp_path / "run"
    run.mkdir()
    _one_line_exit_2(runner.invoke(app, ["check", str(plan), str(run), "--junit", str(plan)]),
                     "would overwrite the PLAN input")
    assert plan.read_bytes() == text


def test_a_plan_changed_meanwhile_is_not_overwritten(tmp_path):
    out = tmp_path / "plans" / "x.yaml"
    seen = file_state(out)  # absent when the command started
    out.parent.mkdir()
    out.write_text("name: theirs\n")  # another writer got there first
    with pytest.raises(MeshplanError, match="changed since this command started"):
        write_checked(out, "name: mine\n", seen)
    assert out.read_text() == "name: theirs\n"
    write_checked(out, "name: mine\n", file_state(out))  # unchanged since read: replaced
    assert out.read_text() == "name: mine\n" and not list(out.parent.glob(".*lock"))


def test_a_writer_holding_the_lock_is_told(runner, tmp_path):
    out = tmp_path / "p.yaml"
    (tmp_path / ".p.yaml.lock").write_text("12345")
    r = runner.invoke(app, ["plan", "--model", "llama-3.1-8b", "--cluster", "8xH100", *PLAN, "--out", str(out)])
    _one_line_exit_2(r, "another meshplan process is writing it")
    assert not out.exists()


def test_costmodel_outputs_onto_their_inputs_are_refused(runner, tmp_path):
    data, model, run = tmp_path / "data", tmp_path / "model", tmp_path / "run"
    for folder, name in ((data, "local.csv"), (model, "metadata.json"), (run, "run.json")):
        folder.mkdir()
        (folder / name).write_text("kept\n")
    cases = [
        (["costmodel", "train", "--data", str(data), "--out", str(data)], "--data input"),
        (["costmodel", "train", "--data", str(data), "--out", str(data / "model")], "--data input"),
        (["costmodel", "train", "--data", str(data / "."), "--out", str(tmp_path)], "--data input"),
        (["costmodel", "fit", "--runs", str(run), "--out", str(model), "--model", str(model)], "--model input"),
        (["costmodel", "fit", "--runs", str(run), "--out", str(run)], "--runs input"),
        (["costmodel", "fit", "--runs", str(run), "--out", str(tmp_path / "m2"), "--device-json", str(data),
          "--model", str(model)], None),
        (["costmodel", "fit", "--runs", str(run), "--out", str(data), "--device-json", str(data)], "--device-json"),
        (["costmodel", "fit", "--runs", str(run), "--host-terms", str(run / "terms.json")], "--runs input"),
    ]
    for argv, needle in cases:
        r = runner.invoke(app, argv)
        if needle is None:  # no overlap: refused later, for what the folders hold, not for the overlap
            assert "of this command" not in r.output, r.output
            continue
        _one_line_exit_2(r, needle)
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["local.csv", "metadata.json", "run.json"]
    assert all(p.read_text() == "kept\n" for p in tmp_path.rglob("*") if p.is_file())
