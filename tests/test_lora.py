"""LoRA fine-tuning (``--lora``, ``planner.model.peft``) as a property of the job: adapters counted against a
golden count worked from the model's config by the LoRA paper's r x (d_in + d_out) per adapted matrix, the frozen
base's states and backward, the plan file, the exporters' notes and the CLI's one-line refusal."""
from __future__ import annotations

import ast
import importlib.metadata

import pytest

from meshplan.cli.main import app
from meshplan.core.errors import MeshplanError
from meshplan.planner.cluster.spec import load_cluster
from meshplan.planner.estimate.base import Workload, stage_params, trainable_params
from meshplan.planner.estimate.select import estimator_for
from meshplan.planner.export import render
from meshplan.planner.layout.layout import Degrees, Layout
from meshplan.planner.model.config import load_model
from meshplan.planner.model.peft import Lora, parse_lora
from meshplan.planner.plan.schema import load_plan
from tests.test_export_golden import ALL_PLANS

# Llama-3.1-8B (config.json: hidden 4096, 32 heads and 8 KV heads of 128, 32 layers, MLP 14336, SwiGLU):
# rank 16 on the fused QKV projection, 4096 -> 4096 + 2 * 1024, is 16 * (4096 + 6144) per layer; on all four
# linears add proj 16 * (4096 + 4096), fc1 16 * (4096 + 2 * 14336) and fc2 16 * (14336 + 4096).
QKV_16 = 32 * 16 * (4096 + 6144)
ALL_16 = QKV_16 + 32 * 16 * ((4096 + 4096) + (4096 + 2 * 14336) + (14336 + 4096))


def _work(lora: str) -> Workload:
    return Workload(load_model("llama-3.1-8b-instruct"), load_cluster("1x8xH100"), 64, 4096, "bf16", lora=lora)


def _layout(**kw) -> Layout:
    return Layout.of(Degrees(dp_shard=2, pp=2, tp=2), micro_batch=1, zero_stage=1, recompute="none", **kw)


@pytest.mark.parametrize("lora,want", [("16:qkv", QKV_16), ("16", ALL_16)])
def test_adapter_count_is_the_golden_count(lora: str, want: int) -> None:
    work, lay = _work(lora), _layout()
    tb = estimator_for(work.cluster).tables(work.model)
    got = sum(trainable_params(work, tb, lay, st)[0] for st in range(lay.pp)) * lay.tp
    assert got == pytest.approx(want)
    assert trainable_params(_work(""), tb, lay, 0) == stage_params(tb, lay, 0)


def test_frozen_linears_save_no_input() -> None:
    """Transformer Engine saves a linear's input only when its weight takes a gradient ("backward_needs_input =
    is_grad_enabled and weight.requires_grad"): with adapters on QKV alone, a Llama-3.1-8B layer (bf16, tp 1) drops
    FC1's input (h) and FC2's (the SwiGLU product, ffn), 2 B each; QKV's input stays (the adapter's copy), and so
    does the projection's (the fused attention's saved output)."""
    from meshplan.planner.estimate.memory import activation_bytes_per_layer, layer_shape

    model, s, b = load_model("llama-3.1-8b-instruct"), 4096, 1
    lay = Layout.of(Degrees(dp_shard=8), micro_batch=1, zero_stage=1, recompute="none")
    full = activation_bytes_per_layer(layer_shape(model, 0), s, b, lay, 2.0, "none")
    lora = activation_bytes_per_layer(layer_shape(model, 0), s, b, lay, 2.0, "none", adapted=("qkv",))
    assert full - lora == 2 * s * b * (4096 + 14336)


def test_frozen_base_keeps_weights_and_sheds_states_and_wgrad() -> None:
    est = estimator_for(load_cluster("1x8xH100"))
    full, lora = est.estimate(_work(""), _layout()), est.estimate(_work("16:qkv"), _layout())
    assert lora.memory.weights_bytes >= full.memory.weights_bytes  # the base, plus its adapters
    assert lora.memory.grads_bytes < full.memory.grads_bytes / 100
    assert lora.memory.optimizer_bytes < full.memory.optimizer_bytes / 100
    # weight GEMMs run three passes in full training (forward, input and weight gradients) and two frozen: the
    # compute falls, but by no more than the GEMMs' third
    assert 2 / 3 * full.compute_s < lora.compute_s < full.compute_s
    assert lora.step_time_s < full.step_time_s


def test_plan_field_takes_what_parse_lora_takes() -> None:
    """The plan file's pattern (planner.plan.schema sees no planner.model) is the parser's."""
    from meshplan.planner.model.peft import LORA_PATTERN
    from meshplan.planner.plan.schema import Plan

    assert Plan.model_json_schema()["properties"]["lora"]["pattern"] == LORA_PATTERN


def test_parse_and_refusals() -> None:
    assert parse_lora("16:qkv+fc1") == Lora(16, ("qkv", "fc1"))
    assert parse_lora("") is None
    for bad in ("0", "16:q", "x", "16:qkv+"):
        with pytest.raises(MeshplanError, match=f"--lora {bad}"):
            parse_lora(bad)


def test_plan_file_records_it_and_targets_name_it(runner, tmp_path) -> None:
    out = tmp_path / "p.yaml"
    r = runner.invoke(app, ["plan", "--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "64",
                            "--seq-len", "4096", "--lora", "16:qkv", "--fix", "tp=2,pp=2,mbs=1",
                            "--out", str(out), "--top", "1"])
    assert r.exit_code == 0, r.output
    plan = load_plan(out)
    assert plan.lora == "16:qkv"
    for target in ("megatron", "torchrun", "deepspeed"):
        assert any("lora 16:qkv" in w for w in render(plan, target).warnings)
    assert not any("lora" in w for w in render(ALL_PLANS["fsdp8b"](), "megatron").warnings)


def test_bad_lora_is_one_line_exit_2(runner, tmp_path) -> None:
    r = runner.invoke(app, ["plan", "--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "64",
                            "--seq-len", "4096", "--lora", "16:attn", "--out", str(tmp_path / "p.yaml")])
    assert r.exit_code == 2 and "--lora 16:attn" in r.output
    assert len(r.output.strip().splitlines()) == 1


def _bridge_lora_source() -> tuple[int, list[str], dict[str, int]]:
    """(LoRA's default dim, its default target modules, {peft recipe: the dim it sets}), read from the installed
    megatron-bridge's own source files (its ``__init__`` needs Transformer Engine, so they are parsed)."""
    dist = importlib.metadata.distribution("megatron-bridge")
    lora = ast.parse(dist.locate_file("megatron/bridge/peft/lora.py").read_text(encoding="utf-8"))
    fields = {ast.unparse(a.target): a.value for n in ast.walk(lora) if isinstance(n, ast.ClassDef)
              and n.name == "LoRA" for a in n.body if isinstance(a, ast.AnnAssign)}
    modules = ast.literal_eval(next(k.value.body for k in fields["target_modules"].keywords))
    recipe = ast.parse(dist.locate_file("megatron/bridge/recipes/llama/llama3.py").read_text(encoding="utf-8"))
    dims = {fn.name: next(ast.literal_eval(a.value) for a in ast.walk(fn) if isinstance(a, ast.Assign)
                          and ast.unparse(a.targets[0]).endswith(".dim"))
            for fn in recipe.body if isinstance(fn, ast.FunctionDef)
            and fn.name in ("llama31_8b_peft_config", "llama31_70b_peft_config")}
    return ast.literal_eval(fields["dim"]), modules, dims


def test_task_lora_trains_the_adapters_the_stacks_recipes_set(runner, tmp_path) -> None:
    """``--task lora`` names no adapters: the Megatron-Bridge profile of the installed release (0.3.1, NeMo
    26.02.01) prices what that release's source sets, each Llama 3.1 recipe's rank on its model and LoRA's own
    defaults on a model whose recipe sets none (Qwen3-8B: ``default_peft_config`` alone); a stack stating no LoRA
    default is refused in one line."""
    dim, modules, dims = _bridge_lora_source()
    assert importlib.metadata.version("megatron-bridge") == "0.3.1"
    assert modules == ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]  # meshplan's four: no modules named
    for model, rank in (("llama-3.1-8b", dims["llama31_8b_peft_config"]),
                        ("llama-3.1-70b-instruct", dims["llama31_70b_peft_config"]), ("qwen3-8b", dim)):
        out = tmp_path / f"{model}.yaml"
        r = runner.invoke(app, ["plan", "--model", model, "--cluster", "2x8xH100", "--global-batch", "64",
                                "--seq-len", "4096", "--task", "lora", "--stack", "megatron-bridge@26.02.01",
                                "--fix", "tp=8,pp=2,mbs=1", "--out", str(out), "--top", "1"])
        assert r.exit_code == 0, r.output
        assert load_plan(out).lora == str(rank) and f"--task lora: adapters {rank}," in r.output
    assert len({dim, *dims.values()}) == 3  # three ranks: the test tells the three sources apart
    r = runner.invoke(app, ["plan", "--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "64",
                            "--seq-len", "4096", "--task", "lora", "--stack", "megatron-lm",
                            "--out", str(tmp_path / "p.yaml")])
    assert r.exit_code == 2 and "--task lora: stack profile megatron-lm@" in r.output
    assert len(r.output.strip().splitlines()) == 1
    # the solver for mixed device groups trains every weight: the stack's adapters are refused there as --lora is
    r = runner.invoke(app, ["plan", "--model", "llama-3.1-8b", "--cluster", "1x8xH100+1x8xA100", "--global-batch",
                            "64", "--seq-len", "4096", "--task", "lora", "--stack", "megatron-bridge@26.02.01",
                            "--out", str(tmp_path / "h.yaml")])
    assert r.exit_code == 2 and f"--lora {dims['llama31_8b_peft_config']} (or --task lora)" in r.output


def test_task_sft_with_lora_is_refused(runner, tmp_path) -> None:
    """``--task sft`` trains every weight (the stacks' SFT recipes: peft none) and ``--lora`` adapters over a frozen
    base (their LoRA recipes); asked for both, the plan priced the adapters under the SFT task's defaults. One line,
    naming both and the task that trains the adapters; nothing written."""
    out = tmp_path / "p.yaml"
    r = runner.invoke(app, ["plan", "--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "64",
                            "--seq-len", "4096", "--task", "sft", "--lora", "16:qkv", "--stack",
                            "megatron-bridge@26.02.01", "--out", str(out)])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert "--task sft" in r.output and "--task lora --lora 16:qkv" in r.output and not out.exists()
