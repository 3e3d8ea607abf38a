"""`meshplan plan` routes heterogeneous clusters, serving and --compress to the CP-SAT solvers (issue 5 examples)."""
import json

import pytest

from meshplan.cli.main import app
from meshplan.planner.plan.schema import load_plan


def _run(runner, tmp_path, *args):
    return runner.invoke(app, ["plan", *args, "--out", str(tmp_path / "p.yaml"), "--json"])


def test_heterogeneous_training_partition(runner, tmp_path):
    res = _run(runner, tmp_path, "--model", "llama-3.1-70b", "--cluster", "mixed-a100-l4", "--global-batch", "512",
               "--seq-len", "4096")
    assert res.exit_code == 0, res.output
    plan = load_plan(tmp_path / "p.yaml")
    assert plan.stages, "a pipeline partition over the device groups"
    covered = sorted(i for s in plan.stages for i in range(s.first_layer, s.first_layer + s.num_layers))
    assert covered == list(range(80))  # contiguous runs covering every layer exactly once
    assert {s.device_group for s in plan.stages} == {0, 1}
    rows = json.loads(res.stdout)["plans"]
    best = rows[0]["tokens_per_s"]
    assert all(best >= r["tokens_per_s"] * (1 - 1e-6) for r in rows[1:])  # never worse than its baselines


def test_serving_with_quality_budget(runner, tmp_path):
    res = _run(runner, tmp_path, "--model", "qwen2.5-7b", "--cluster", "4xT4+1xA100", "--workload", "serve",
               "--quality-budget", "0.5", "--global-batch", "8", "--seq-len", "512")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["plans"]
    assert rows[0]["quality"] <= 0.5 + 1e-9
    plan = load_plan(tmp_path / "p.yaml")
    assert plan.layer_precision and len(plan.layer_precision) == 28


# Llama-3.1-70B in 16 bits (131.4 GiB of weights) does not fit on 3xT4+1xA100 (128 GiB): serving it needs quantizing.
# (On 4xT4+1xA100, 144 GiB, it fits since the memory limit counts its terms explicitly: planner/estimate/memory.py.)
def test_impossible_quality_budget_exits_2(runner, tmp_path):
    res = _run(runner, tmp_path, "--model", "llama-3.1-70b", "--cluster", "3xT4+1xA100", "--workload", "serve",
               "--quality-budget", "0", "--global-batch", "8", "--seq-len", "512")
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and "error:" in res.stderr


@pytest.mark.parametrize("dtype, extra", [("fp8", ()), ("nvfp4", ()),
                                          ("fp8", ("--workload", "serve", "--quality-budget", "0.5"))])
def test_solver_refuses_a_low_precision_dtype_it_would_not_price(runner, tmp_path, dtype, extra):
    """The solvers price each layer at 16 bits or at the precision they choose under --quality-budget
    (``solve.columns.MENU``); a --dtype fp8 / nvfp4 there changed only the plan's label and its MFU's peak (an
    nvfp4 plan for a cluster with H100s, whose 'nvfp4' layers all ran bf16), so it is refused in one line."""
    res = _run(runner, tmp_path, "--model", "llama-3.1-8b", "--cluster", "1x8xB200+1x8xH100", "--global-batch", "64",
               "--seq-len", "4096", "--dtype", dtype, *extra)
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert f"--dtype {dtype}" in res.stderr and "chooses each layer's precision" in " ".join(res.stderr.split())
    assert not (tmp_path / "p.yaml").exists()
    ok = _run(runner, tmp_path, "--model", "llama-3.1-8b", "--cluster", "1x8xB200+1x8xH100", "--global-batch", "64",
              "--seq-len", "4096", "--dtype", "bf16")
    assert ok.exit_code == 0, ok.output


def test_compress_attaches_bucket_choices(runner, tmp_path):
    res = _run(runner, tmp_path, "--model", "gpt2-large", "--cluster", "4x8xA100", "--net", "10Gbps",
               "--compress", "--global-batch", "256", "--seq-len", "1024", "--top", "1")
    assert res.exit_code == 0, res.output
    plan = load_plan(tmp_path / "p.yaml")
    assert plan.compression and plan.degrees.tp == plan.degrees.pp == 1
    assert sum(b.size_bytes for b in plan.compression) > 0


def test_measured_sensitivity_feeds_the_solver(runner, tmp_path):
    res = runner.invoke(app, ["profile", "--sensitivity", "--out", str(tmp_path / "s"), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    cols = data["precisions"]
    for row in data["layers"]:  # fewer mantissa / integer bits inject more gradient noise
        r = dict(zip(cols, row))
        assert r["fp32"] == 0.0 < r["fp16"] < r["bf16"] < r["fp8"] and r["int8"] < r["int4"]
    res = _run(runner, tmp_path, "--model", "qwen2.5-7b", "--cluster", "4xT4+1xA100", "--workload", "serve",
               "--quality-budget", "0.5", "--global-batch", "8", "--seq-len", "512",
               "--sensitivity", str(tmp_path / "s" / "sensitivity.json"))
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["plans"][0]["quality"] <= 0.5 + 1e-9


def test_serving_lowers_precision_only_when_asked(runner, tmp_path):
    """Issue 15: without --quality-budget no layer is quantized (the plan states every layer's precision in its
    first line); with one, the same request writes a byte-identical plan three times."""
    res = _run(runner, tmp_path, "--model", "qwen2.5-7b", "--cluster", "4xT4+1xA100", "--workload", "serve",
               "--global-batch", "8", "--seq-len", "512")
    assert res.exit_code == 0, res.output
    plan = load_plan(tmp_path / "p.yaml")
    assert set(plan.layer_precision) == {"fp16"} and plan.dtype == "fp16"  # T4 has no bf16
    first = (tmp_path / "p.yaml").read_text().splitlines()[0]
    assert first.startswith("# precision per layer: layers 0-27 fp16")
    texts = []
    for i in range(3):
        out = tmp_path / f"q{i}.yaml"
        r = runner.invoke(app, ["plan", "--model", "llama-3.1-70b", "--cluster", "4xT4+1xA100", "--workload",
                                "serve", "--global-batch", "8", "--seq-len", "512", "--quality-budget", "0.05",
                                "--out", str(out), "--json"])
        assert r.exit_code == 0, r.output
        texts.append(out.read_bytes())
    assert texts[0] == texts[1] == texts[2]
    assert set(load_plan(tmp_path / "q0.yaml").layer_precision) - {"fp16"}  # the budget lets layers go lower


def test_serving_a_model_that_needs_quantizing_says_so(runner, tmp_path):
    res = _run(runner, tmp_path, "--model", "llama-3.1-70b", "--cluster", "3xT4+1xA100", "--workload", "serve",
               "--global-batch", "8", "--seq-len", "512")
    assert res.exit_code == 2 and "--quality-budget" in res.output and len(res.output.strip().splitlines()) == 1


@pytest.mark.parametrize("net,chosen", [("10Gbps", True), ("100Gbps", False)])
def test_compress_is_weighed_against_zero_and_exported_as_applied(runner, tmp_path, net, chosen):
    """Issue 15: compression is what a plain-DDP job's gradient all-reduce sends (the DDP hook); it is chosen only
    when that beats the best layout with ZeRO, and then every choice is one the torchrun target applies."""
    from meshplan.planner.export import render

    res = _run(runner, tmp_path, "--model", "gpt2-large", "--cluster", "4x8xA100", "--net", net, "--compress",
               "--global-batch", "256", "--seq-len", "1024", "--top", "2")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    plan = load_plan(tmp_path / "p.yaml")
    assert bool(plan.compression) == chosen
    if chosen:
        assert (plan.zero_stage, plan.degrees.dp_shard) == (0, 1)
        assert all(b.method != "none" and not b.two_level and b.where == "gpu" for b in plan.compression)
        assert plan.prediction.step_time_s < min(r["step_time_s"] for r in out["plans"][1:])
        assert not [w for w in render(plan, "torchrun").warnings if "compression" in w]
    else:
        assert any(w.startswith("compression: not chosen") for w in out["warnings"])
        assert plan.prediction.step_time_s == out["plans"][0]["step_time_s"]
