"""Heterogeneous pipelines launch as they were priced (issue 15 item 2): the planner puts Llama-3.1-8B's stages on
an A100 node and an H100 node; torchrun (and Megatron) scripts get static node ranks in stage order, Slurm a
heterogeneous job with one component per device type, and the other targets refuse in one line.

Run for real here: the torchrun script on two "nodes" (two torchrun agents on this host, gloo), and the Slurm
script's per-node task exactly as ``srun`` would start it on each node (no Slurm here: ``SLURM_PROCID`` and the
allocation's variables are set by the test). Each rank of the example trainer writes where it landed; the test
reads back that rank r ran stage r // (world / pp) with the plan's layers, on the node rank and device the
script's table gives. The model is shrunk to CPU size after planning (same 32 layers and stages)."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from meshplan.cli.main import app
from meshplan.planner.export import placement, render
from meshplan.planner.plan.schema import load_plan
from tests.helpers import REPO

BASH = shutil.which("bash")
TRAINER = REPO / "examples" / "train_gpt.py"
PLAN = ["--model", "llama-3.1-8b", "--cluster", "1x2xH100+1x2xA100", "--global-batch", "8", "--seq-len", "1024"]


@pytest.fixture(scope="module")
def het_plan(tmp_path_factory) -> Path:
    """The planner's heterogeneous plan, with the model shrunk to CPU size (layers and stages kept)."""
    from typer.testing import CliRunner

    d = tmp_path_factory.mktemp("het")
    r = CliRunner().invoke(app, ["plan", *PLAN, "--out", str(d / "het.yaml")])
    assert r.exit_code == 0, r.output
    raw = yaml.safe_load((d / "het.yaml").read_text())
    raw["model"].update(hidden_size=32, num_attention_heads=4, num_kv_heads=4, head_dim=8, v_head_dim=8,
                        ffn_hidden_size=64, vocab_size=128)
    raw["seq_len"] = 16
    (d / "small.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return d / "small.yaml"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MESHPLAN_", "SLURM_"))}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", OMP_NUM_THREADS="1",
               MESHPLAN_ENTRY=str(TRAINER), **extra)
    return env


def _run_nodes(argvs: list[list[str]], envs: list[dict], cwd: Path) -> None:
    procs = [subprocess.Popen(a, env=e, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for a, e in zip(argvs, envs)]
    outs = [p.communicate(timeout=400)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-3000:] for o in outs)


def _check_reports(plan_path: Path, folder: Path) -> None:
    plan = load_plan(plan_path)
    blocks = placement.node_blocks(plan)
    device_of_node = {n: b.device for b in blocks for n in range(b.first_node, b.last_node + 1)}
    reports = [json.loads((folder / f"rank{r}.json").read_text()) for r in range(plan.degrees.world_size)]
    per_node = plan.cluster.groups[blocks[0].group].devices_per_node
    per_stage = plan.degrees.world_size // plan.degrees.pp
    for rep in reports:
        r = rep["rank"]
        stage = plan.stages[r // per_stage]
        assert rep["node_rank"] == r // per_node and rep["pp_rank"] == r // per_stage, rep
        assert (rep["first_layer"], rep["num_layers"]) == (stage.first_layer, stage.num_layers), rep
        want = plan.cluster.groups[stage.device_group].device
        assert rep["planned_device"] == want == device_of_node[rep["node_rank"]] == rep["node_device_env"], rep
        assert (rep["tp"], rep["pp"], rep["global_batch"], rep["micro_batch"]) == (
            plan.degrees.tp, plan.degrees.pp, plan.global_batch, plan.micro_batch)
    # the planner put the first stage on the A100 node: node rank 0 must be that node, whatever the group order
    assert [b.device for b in blocks] == [plan.cluster.groups[s.device_group].device for s in plan.stages]


def test_planner_output_is_a_heterogeneous_pipeline(het_plan):
    plan = load_plan(het_plan)
    assert placement.is_heterogeneous_pipeline(plan) and plan.degrees.pp == len(plan.stages) == 2
    assert plan.stages[0].device_group != plan.stages[1].device_group
    assert sum(s.num_layers for s in plan.stages) == plan.model.num_layers == 32


@pytest.mark.parametrize("target", ["deepspeed", "torchtitan", "accelerate", "kubeflow"])
def test_targets_that_cannot_pin_stages_refuse(het_plan, runner, tmp_path, target):
    r = runner.invoke(app, ["export", str(het_plan), "--to", target, "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert "cannot pin a stage to a node" in r.output and "A100-80GB" in r.output and not (tmp_path / "x").exists()


@pytest.mark.slow  # 21 s of torchrun; the default suite runs an exported torchrun script in test_export_e2e
@pytest.mark.skipif(BASH is None, reason="bash not available")
def test_torchrun_script_places_each_stage_on_its_node(het_plan, tmp_path):
    script = tmp_path / "launch.sh"
    script.write_text(render(load_plan(het_plan), "torchrun").text)
    megatron = render(load_plan(het_plan), "megatron").text
    assert '--node-rank "$NODE_RANK"' in megatron and "'Et*" in megatron  # the same placement, uneven layout
    port = str(_free_port())
    bad = subprocess.run([BASH, str(script)], env=_env(NODE_RANK="2", HEAD_NODE="127.0.0.1"), cwd=tmp_path,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "this plan has node ranks 0-1" in bad.stderr
    report = tmp_path / "report"
    args = ["--steps", "1", "--layout-report", str(report)]
    _run_nodes([[BASH, str(script), *args]] * 2,
               [_env(NODE_RANK=str(n), HEAD_NODE="127.0.0.1", MASTER_PORT=port) for n in (1, 0)], tmp_path)
    _check_reports(het_plan, report)


@pytest.mark.skipif(BASH is None, reason="bash not available")
def test_slurm_hetjob_components_and_task_per_node(het_plan, tmp_path):
    plan = load_plan(het_plan)
    text = render(plan, "slurm").text
    assert subprocess.run([BASH, "-n"], input=text, text=True).returncode == 0
    sbatch = [ln.split(None, 1)[1] for ln in text.splitlines() if ln.startswith("#SBATCH")]
    components, cur = [], {}
    for opt in sbatch[1:]:
        if opt == "hetjob":
            components.append(cur)
            cur = {}
        else:
            k, _, v = opt.partition("=")
            cur[k] = v
    components.append(cur)
    blocks = placement.node_blocks(plan)
    assert [(int(c["--nodes"]), c["--gpus-per-node"]) for c in components] == [
        (b.nodes, f"{placement.gres_type(b.device)}:{plan.cluster.groups[b.group].devices_per_node}") for b in blocks]
    # the srun step: one task per node, each started as srun would (SLURM_PROCID = node rank); run it under -m slow
    srun = shlex.split(text[text.index("\nsrun ") + 1:].replace("\\\n", " "))
    assert srun[:2] == ["srun", f"--het-group={','.join(map(str, range(len(blocks))))}"] and srun[2:4] == ["bash",
                                                                                                           "-c"]
    assert '--node-rank "$NODE_RANK"' in srun[4] and srun[5:] == ["meshplan-task", "$@"]


@pytest.mark.slow
@pytest.mark.skipif(BASH is None, reason="bash not available")
def test_slurm_task_per_node_places_each_stage(het_plan, tmp_path):
    text = render(load_plan(het_plan), "slurm").text
    task = shlex.split(text[text.index("\nsrun ") + 1:].replace("\\\n", " "))[4]
    devices = next(ln for ln in text.splitlines() if ln.startswith("export MESHPLAN_NODE_DEVICES="))
    env = dict(MESHPLAN_PLAN=str(het_plan), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
               MESHPLAN_NODE_DEVICES=shlex.split(devices.split("=", 1)[1])[0])
    report = tmp_path / "report"
    _run_nodes([[BASH, "-c", task, "meshplan-task", "--steps", "1", "--layout-report", str(report)]] * 2,
               [_env(SLURM_PROCID=str(n), **env) for n in (0, 1)], tmp_path)
    _check_reports(het_plan, report)
