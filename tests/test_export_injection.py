"""Generated launch files never run what a user file smuggles in (hostile-input issue, item 1).

Hostile values reach the exporters through the real paths: a HF config whose ``_name_or_path`` holds line breaks,
``$(...)``, backticks, quotes and ``;`` (it becomes the model name), a model folder named like a command (it becomes
the default plan name), a cluster file whose *path* holds the same (it becomes ``cluster.spec``), and a hand-edited
plan. Each generated shell script is run by bash with stub ``torchrun`` / ``srun`` / ``scontrol`` on PATH, and no
marker file may appear; each YAML / TOML / JSON output is parsed by its own parser and must hold exactly the keys a
benign plan's does.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import tomllib
import yaml

from meshplan.core.errors import MeshplanError
from meshplan.planner.export import TARGETS, render
from meshplan.planner.plan.schema import load_plan
from meshplan.planner.search.job import PlanRequest, plan_job

SHELL_TARGETS = ("torchrun", "megatron", "slurm")
# Shell targets that launch a recipe of their own and refuse a model without one: run on a recipe's model shape.
RECIPE_SHELL_TARGETS = ("megatron-bridge",)
DATA_TARGETS = {"deepspeed": json.loads, "accelerate": yaml.safe_load, "kubeflow": yaml.safe_load,
                "torchtitan": tomllib.loads}


def payloads() -> list[str]:
    """Strings that create a file ``pwnedN`` in the working directory if any part of a generated file lets them
    through (relative names, so they also fit in a folder name)."""
    m = [f"pwned{i}" for i in range(8)]
    return [f"$(touch {m[0]})", f"`touch {m[1]}`", f'"; touch {m[2]}; "', f"'; touch {m[3]}; '",
            f"x\ntouch {m[4]}\n", f"x\r\ntouch {m[5]}\r\n", f"x\u2028touch {m[6]}", f"x\x85touch {m[7]} #"]


TINY_CONFIG = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
               "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 4096,
               "max_position_embeddings": 2048, "tie_word_embeddings": False}


def _stub_bin(tmp: Path) -> Path:
    """A folder of launcher stubs that only record their arguments (so the scripts run to the end)."""
    bindir = tmp / "bin"
    bindir.mkdir()
    for tool in ("torchrun", "srun", "scontrol"):
        stub = bindir / tool
        stub.write_text(f'#!/bin/bash\nprintf "%s\\n" "$@" >> "{tmp}/{tool}.args"\necho node0\n')
        stub.chmod(0o755)
    return bindir


def _hostile_plans(tmp: Path) -> list[Path]:
    """Plans written by ``meshplan plan`` from hostile inputs (one and two nodes)."""
    hostile = "".join(payloads())
    model_dir = tmp / "x$(touch pwned-folder) `touch pwned-folder`"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({**TINY_CONFIG, "_name_or_path": hostile}))
    cluster_file = tmp / "c$(touch pwned-cluster)\n;touch pwned-cluster;`touch pwned-cluster`.yaml"
    cluster_file.write_text("groups:\n  - nodes: 2\n    devices_per_node: 8\n    device: H100-SXM\n")
    out = []
    for i, cluster in enumerate(("1x8xH100", str(cluster_file))):
        res = plan_job(PlanRequest.of(str(model_dir / "config.json"), cluster, 64, 1024, top=1, out=tmp / f"p{i}.yaml"))
        assert res.plan.name.startswith("x-touch")  # the folder name, with the shell characters replaced
        out.append(res.path)
    return out


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not available")
def test_generated_scripts_run_no_smuggled_command(tmp_path: Path) -> None:
    bindir = _stub_bin(tmp_path)
    plans = _hostile_plans(tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    loaded = [load_plan(p) for p in plans]
    assert any("\n" in p.model.name for p in loaded) and "\n" in loaded[1].cluster.spec  # the payload got in
    env = {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "HEAD_NODE": "node0", "SLURM_JOB_NODELIST": "n0",
           "SLURM_NNODES": "2", "SLURM_JOB_ID": "1", "HOME": str(tmp_path)}
    ran = 0
    for plan in loaded:
        for target in SHELL_TARGETS:
            script = tmp_path / f"{target}-{plan.cluster.nodes}.sh"
            script.write_text(render(plan, target).text)
            res = subprocess.run(["bash", str(script)], cwd=run_dir, env=env, capture_output=True, text=True,
                                 timeout=60)
            assert res.returncode == 0, (target, res.stderr[-2000:])
            ran += 1
    assert ran == 6
    assert sorted(p.name for p in run_dir.iterdir()) == []
    assert not list(tmp_path.glob("pwned*"))
    assert (tmp_path / "torchrun.args").exists()  # the stubs ran: the scripts reached their launch line


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not available")
def test_recipe_scripts_run_no_smuggled_command(tmp_path: Path) -> None:
    """The hostile plans' names and cluster specs on Llama-3.1-8B's shape (a model the recipe targets build)."""
    from tests.test_export_golden import LLAMA_8B

    bindir = _stub_bin(tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "HEAD_NODE": "node0", "HOME": str(tmp_path)}
    for i, path in enumerate(_hostile_plans(tmp_path)):
        plan = load_plan(path)
        plan = plan.model_copy(update={"model": LLAMA_8B.model_copy(update={"name": plan.model.name})})
        for target in RECIPE_SHELL_TARGETS:
            script = tmp_path / f"{target}-{i}.sh"
            script.write_text(render(plan, target).text)
            res = subprocess.run(["bash", str(script)], cwd=run_dir, env=env, capture_output=True, text=True,
                                 timeout=60)
            assert res.returncode == 0, (target, res.stderr[-2000:])
    assert sorted(p.name for p in run_dir.iterdir()) == []
    assert not list(tmp_path.glob("pwned*"))
    assert (tmp_path / "torchrun.args").exists()


def test_data_targets_hold_no_smuggled_keys(tmp_path: Path) -> None:
    hostile = load_plan(_hostile_plans(tmp_path)[1])
    benign = hostile.model_copy(update={
        "model": hostile.model.model_copy(update={"name": "m"}),
        "cluster": hostile.cluster.model_copy(update={"spec": "2x8xH100"})})
    for target, parse in DATA_TARGETS.items():
        got, want = parse(render(hostile, target).text), parse(render(benign, target).text)
        assert got == want, target  # header comments are the only place the hostile strings go


@pytest.mark.parametrize("name", ["x$(touch F)", "../../x", "a\nb", "a;b", "a b", ".hidden", "-rf", ""])
def test_plan_names_outside_the_safe_alphabet_are_refused(tmp_path: Path, name: str) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(TINY_CONFIG))
    with pytest.raises(MeshplanError, match="a plan name is"):
        plan_job(PlanRequest.of(str(tmp_path / "m" / "config.json"), "1x8xH100", 64, 1024, top=1, name=name,
                 plans_dir=tmp_path / "plans"))
    assert not (tmp_path / "plans").exists() or not any((tmp_path / "plans").iterdir())


def test_hand_edited_plan_with_hostile_name_is_refused(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(TINY_CONFIG))
    path = plan_job(PlanRequest.of(str(tmp_path / "m" / "config.json"), "1x8xH100", 64, 1024, top=1,
                                   out=tmp_path / "p.yaml")).path
    raw = yaml.safe_load(path.read_text())
    for field, value in (("name", "x$(touch F)"), ("name", "a\nb")):
        edited = tmp_path / "edited.yaml"
        edited.write_text(yaml.safe_dump({**raw, field: value}))
        with pytest.raises(MeshplanError, match=r"edited\.yaml: not a valid plan: name"):
            load_plan(edited)
    raw["model"]["model_type"] = "llama\ntouch F"
    edited.write_text(yaml.safe_dump(raw))
    with pytest.raises(MeshplanError, match="model.model_type"):
        load_plan(edited)


def test_every_target_is_covered() -> None:
    assert set(SHELL_TARGETS) | set(RECIPE_SHELL_TARGETS) | set(DATA_TARGETS) == set(TARGETS)
