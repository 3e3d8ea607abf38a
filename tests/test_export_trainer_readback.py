"""What the torchrun / Slurm / Kubeflow launches run: the example trainer's own argument parser reads the exported
plan path (``examples/train_gpt.py --plan``), and the layout, batch, recompute, schedule, sharding and precision it
will use are compared with the plan, for every reference plan and decision-matrix variant. A decision the trainer
does not implement stops it at launch with the plan named, and the export's warnings name the same decision
(issue 15 item 1: refused or named, never dropped)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from meshplan.planner.export import render
from tests.helpers import REPO
from tests.test_export_golden import ALL_PLANS, all_plans_for


def _trainer():
    spec = importlib.util.spec_from_file_location("train_gpt", REPO / "examples" / "train_gpt.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("plan_name", all_plans_for("torchrun"))
def test_trainer_runs_what_the_plan_says_or_stops(plan_name: str, tmp_path: Path, capsys) -> None:
    plan = ALL_PLANS[plan_name]()
    path = plan.save(tmp_path / "plan.yaml")
    warnings = render(plan, "torchrun").warnings
    d = plan.degrees
    try:
        a = _trainer().parse_args(["--plan", str(path)])
    except SystemExit as stop:  # cp / ep / vpp / interleaved / recompute full:N, op: not implemented by the trainer
        msg = str(stop.code)
        assert str(path) in msg and "does not implement" in msg, msg
        missing = [f"no {k}" for k, v in (("cp", d.cp), ("ep", d.ep), ("vpp", d.vpp)) if v > 1]
        if plan.recompute not in ("none", "selective", "full"):
            missing.append(f"no recompute={plan.recompute}")
        assert missing and all(any(k in w for w in warnings) for k in missing), (msg, warnings)
        return
    assert (a.dp_replicate, a.dp_shard, a.tp, a.pp) == (d.dp_replicate, d.dp_shard, d.tp, d.pp)
    assert (a.micro_batch, a.global_batch, a.seq_len) == (plan.micro_batch, plan.global_batch, plan.seq_len)
    assert (a.recompute, a.schedule, a.zero_stage) == (plan.recompute, plan.schedule, plan.zero_stage)
    assert (a.layers, a.hidden, a.heads) == (plan.model.num_layers, plan.model.hidden_size,
                                             plan.model.num_attention_heads)
    if plan.stages:
        assert a.stages == [(s.first_layer, s.num_layers) for s in plan.stages]
    err = capsys.readouterr().err
    if a.dtype != plan.dtype:  # fp8: the trainer says so on stderr, and so does the export
        assert plan.dtype in err and any(plan.dtype in w for w in warnings)
    elif plan.fp8 != "none":  # an fp8 recipe on 16-bit GEMMs: named on stderr and in the export's warnings
        assert f"fp8 recipe {plan.fp8}" in err and any(f"fp8 ({plan.fp8} recipe)" in w for w in warnings)
    if plan.sequence_parallel:
        assert "sequence parallelism is not implemented" in err
    if plan.attention_dtype == "fp8":  # named on stderr and in the export's warnings
        assert "fp8 attention is not implemented" in err and any("attention_dtype=fp8" in w for w in warnings)
