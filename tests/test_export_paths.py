"""The launched job runs what was priced (issue 15 item 3): the exported plan file is the one the scripts hand to
the trainer, the trainer ships with the package, and the Megatron export keeps the plan's optimizer sharding and the
model's RoPE. Read back through torchrun's own argument parser and the Megatron flag list of
tests/test_export_parsers."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from meshplan.cli.main import app
from meshplan.planner.export import render
from meshplan.planner.plan.schema import Degrees, load_plan
from tests.helpers import REPO
from tests.test_export_golden import PLANS
from tests.test_export_parsers import _argv, _megatron_args, _megatron_flags_from_notes, _torchrun_parse

BASH = shutil.which("bash")


@pytest.mark.skipif(BASH is None, reason="bash not available")
def test_scripts_launch_the_file_that_was_exported(tmp_path: Path, runner) -> None:
    """A plan saved outside plans/ (a folder name with a space) and exported from there: torchrun and Slurm hand
    that file to the trainer with MESHPLAN_PLAN unset, and the PyTorchJob's env and command name it."""
    path = PLANS["fsdp8b"]().save(tmp_path / "my plans" / "candidate 3.yaml")
    plan = load_plan(path)
    assert plan.source_path == str(path) and "source_path" not in yaml.safe_load(path.read_text())
    for target, env in (("torchrun", {}), ("slurm", {"SLURM_JOB_NODELIST": "a", "SLURM_NNODES": "1",
                                                    "SLURM_JOB_ID": "7"})):
        out = tmp_path / f"launch.{target}"
        r = runner.invoke(app, ["export", str(path), "--to", target, "--out", str(out)])
        assert r.exit_code == 0, r.output
        ns = _torchrun_parse(_argv(out.read_text(), tmp_path, env))
        assert ns.training_script_args[:2] == ["--plan", str(path)], target
        assert load_plan(ns.training_script_args[1]) == PLANS["fsdp8b"]()
    manifest = yaml.safe_load(render(plan, "kubeflow").text)
    container = manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert {"name": "MESHPLAN_PLAN", "value": str(path)} in container["env"]
    assert container["command"][-2:] == ["--plan", str(path)]


def test_a_plan_made_in_memory_keeps_the_default_path() -> None:
    text = render(PLANS["fsdp8b"](), "torchrun").text
    assert "MESHPLAN_PLAN=plans/llama8b-fsdp8.yaml" in text


def test_example_trainer_ships_and_never_overwrites(tmp_path: Path, runner) -> None:
    dest = tmp_path / "train_gpt.py"
    r = runner.invoke(app, ["example-trainer", str(dest), "--json"])
    assert r.exit_code == 0, r.output
    assert dest.read_bytes() == (REPO / "examples" / "train_gpt.py").read_bytes()
    dest.write_text("# my edits\n")
    r = runner.invoke(app, ["example-trainer", str(dest)])
    assert r.exit_code == 2 and "already exists" in r.output and len(r.output.strip().splitlines()) == 1
    assert dest.read_text() == "# my edits\n"  # nothing the user had is lost
    assert runner.invoke(app, ["example-trainer", str(tmp_path), "--force"]).exit_code == 0  # a folder: file inside
    assert dest.read_bytes() == (REPO / "examples" / "train_gpt.py").read_bytes()
    assert "meshplan example-trainer examples/train_gpt.py" in render(PLANS["fsdp8b"](), "torchrun").text


@pytest.mark.skipif(BASH is None, reason="bash not available")
def test_megatron_shards_the_optimizer_over_cp_and_keeps_rope(tmp_path: Path, runner) -> None:
    """Llama-3.1-8B with dp=1 and the optimizer state sharded over cp=8 (ZeRO-1): Megatron's distributed optimizer
    shards over data x context parallel ranks, so the flag must be there (it was not: 316 GiB per device by
    meshplan's own estimate). RoPE: config.json rope_theta 500000 and Llama 3 scaling, factor 8 (Megatron's default
    base is 10000)."""
    out = tmp_path / "cp.yaml"
    r = runner.invoke(app, ["plan", "--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "64",
                            "--seq-len", "8192", "--fix", "tp=1,cp=8,dp_shard=1,zero=1", "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    plan = load_plan(out)
    assert (plan.degrees.dp, plan.degrees.cp, plan.zero_stage) == (1, 8, 1)
    result = render(plan, "megatron")
    ns = _torchrun_parse(_argv(result.text, tmp_path, {"HEAD_NODE": "node-a", "NODE_RANK": "0"}))
    args = _megatron_args(ns.training_script_args)
    assert not set(args) - _megatron_flags_from_notes()
    assert "--use-distributed-optimizer" in args and args["--context-parallel-size"] == "8"
    assert args["--rotary-base"] == "500000" and "--use-rope-scaling" in args and args["--rope-scaling-factor"] == "8"
    assert not any("rope" in w for w in result.warnings), result.warnings


@pytest.mark.skipif(BASH is None, reason="bash not available")
def test_heterogeneous_pipeline_exports_as_priced(tmp_path: Path, runner) -> None:
    """Issue 15 item 2: Llama-3.1-8B on one H100 node + one A100 node is a 2-stage pipeline with tensor parallel
    over each node (the solver's pricing); the degrees say so, torchrun, Slurm and Megatron pin each stage to its
    device type with static node ranks (tests/test_export_hetero.py runs them; Megatron-Bridge launches the same way),
    the other targets refuse, Megatron
    keeps the uneven split, and no layer left 16 bits unasked."""
    from meshplan.core.errors import MeshplanError
    from meshplan.planner.export import TARGETS, export_file
    from meshplan.planner.export.placement import node_blocks

    out = tmp_path / "het.yaml"
    r = runner.invoke(app, ["plan", "--model", "llama-3.1-8b", "--cluster", "1x8xH100+1x8xA100", "--global-batch",
                            "256", "--seq-len", "4096", "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    plan = load_plan(out)
    assert (plan.degrees.tp, plan.degrees.pp, plan.degrees.world_size) == (8, 2, 16)
    assert set(plan.layer_precision) == {"bf16"}
    for target in TARGETS:
        if target in ("torchrun", "slurm", "megatron", "megatron-bridge"):
            result = export_file(out, target)
            assert any("static node ranks" in w or "heterogeneous job" in w for w in result.warnings), target
        else:
            with pytest.raises(MeshplanError, match="cannot pin a stage"):
                export_file(out, target)
    ns = _torchrun_parse(_argv(render(plan, "torchrun").text, tmp_path, {"HEAD_NODE": "node-a", "NODE_RANK": "0"}))
    assert (ns.nnodes, ns.nproc_per_node, ns.node_rank) == ("2", "8", 0)
    blocks = node_blocks(plan)  # node rank 0 holds stage 0, on the device group the solver gave it
    assert [b.group for b in blocks] == [s.device_group for s in plan.stages]
    args = _megatron_args(_torchrun_parse(_argv(render(plan, "megatron").text, tmp_path,
                                                {"HEAD_NODE": "node-a", "NODE_RANK": "0"})).training_script_args)
    assert [part.count("t*") and int(part.split("t*")[1].rstrip("L")) for part in
            args["--pipeline-model-parallel-layout"].split("|")] == [s.num_layers for s in plan.stages]


def test_uneven_tensor_parallel_stages_are_refused_with_a_reason(tmp_path: Path, runner) -> None:
    """Stages on a 4-GPU T4 node and a 1-GPU A100 node run tensor parallel 4 and 1: no target launches that, and
    the export says so in one line (it said "dp*...*pp = 2, but cluster has 5 devices" before)."""
    from tests.test_export_golden import cluster

    base = PLANS["hetero"]()
    plan = base.model_copy(update={
        "cluster": cluster("4xT4+1xA100", (1, 4, "T4"), (1, 1, "A100")),
        "degrees": Degrees(tp=1, pp=2), "zero_stage": 0,
        "sequence_parallel": False, "compression": None, "layer_precision": ()})
    path = plan.save(tmp_path / "uneven.yaml")
    r = runner.invoke(app, ["export", str(path), "--to", "torchrun"])
    assert r.exit_code == 2 and "uneven tensor parallelism" in r.output and len(r.output.strip().splitlines()) == 1


def test_serving_plans_are_refused_by_training_targets_with_a_reason(tmp_path: Path, runner) -> None:
    out = tmp_path / "serve.yaml"
    r = runner.invoke(app, ["plan", "--model", "qwen2.5-7b", "--cluster", "4xT4+1xA100", "--workload", "serve",
                            "--global-batch", "8", "--seq-len", "512", "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    from meshplan.planner.export import TARGETS

    for target in TARGETS:
        r = runner.invoke(app, ["export", str(out), "--to", target])
        assert r.exit_code == 2 and "a serving plan" in r.output and len(r.output.strip().splitlines()) == 1, target
