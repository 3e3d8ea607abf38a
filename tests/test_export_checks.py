"""Each target's ``check`` rejects plans its launcher would reject, naming the numbers; ``unsupported`` names the
plan decisions a target cannot carry. The rules come from upstream validation code (shared/notes/exports.md,
"What meshplan should check")."""
from __future__ import annotations

import dataclasses
import json

import pytest
import tomllib

from meshplan.core.errors import MeshplanError
from meshplan.planner.export import TARGETS, get_target, render
from meshplan.planner.plan.schema import BucketCompression, Plan, Stage
from tests.test_export_golden import PLANS, plan_dsv3, plan_fsdp8b, plan_hetero, plan_llama70b, plan_mixed, plans_for


def with_(plan: Plan, degrees: dict | None = None, **fields) -> Plan:
    if degrees:
        fields["degrees"] = dataclasses.replace(plan.degrees, **degrees)
    return plan.model_copy(update=fields)


# (plan, targets that must reject it, text the message must contain)
BAD = [
    (with_(plan_llama70b(), degrees={"dp_shard": 2}), list(TARGETS),
     "= 64, but cluster '16x8xH100' has 128 devices"),
    (with_(plan_llama70b(), global_batch=510), list(TARGETS),
     "global_batch=510 is not a multiple of micro_batch*dp = 1*4 = 4"),
    (with_(plan_fsdp8b(), zero_stage=0), list(TARGETS), "dp_shard=8 but zero_stage=0"),
    (with_(plan_fsdp8b(), sequence_parallel=True), list(TARGETS), "sequence_parallel=true needs tp > 1 (tp=1)"),
    (with_(plan_dsv3(), degrees={"ep": 3}), list(TARGETS), "num_experts=256 is not divisible by ep=3"),
    (with_(plan_hetero(), stages=(Stage(first_layer=0, num_layers=20), Stage(first_layer=20, num_layers=10))),
     list(TARGETS), "stages hold 30 layers but the model has num_layers=32"),
    (with_(plan_fsdp8b(), dtype="int4"), list(TARGETS), "dtype='int4' is not one of"),
    # Megatron: (layers/PP) must split into whole virtual stages; interleaving needs microbatches >= PP.
    (with_(plan_llama70b(), degrees={"vpp": 3}), ["megatron", "torchtitan"],
     "num_layers=80 is not divisible by pp*vpp = 4*3 = 12"),
    (with_(plan_llama70b(), global_batch=8), ["megatron"], "= 2 < pp=4"),
    (with_(plan_llama70b(), degrees={"tp": 16, "dp_shard": 2},
           model=plan_llama70b().model.model_copy(update={"num_attention_heads": 40})), ["megatron", "torchtitan"],
     "num_attention_heads=40 is not divisible by tp=16"),
    (with_(plan_dsv3(), sequence_parallel=False), ["megatron"], "MoE with tp=2 needs sequence_parallel=true"),
    # DeepSpeed: PipelineModule allows ZeRO <= 1; no fp8 key.
    (with_(plan_llama70b(), zero_stage=2), ["deepspeed"],
     "pipeline parallelism (pp=4) is incompatible with ZeRO stage 2"),
    (with_(plan_fsdp8b(), dtype="fp8"), ["deepspeed"], "the config has no fp8 key"),
    # TorchTitan: torch pipelining needs microbatches >= stages (1F1B) and a whole number of rounds (interleaved).
    (with_(plan_llama70b(), degrees={"vpp": 1}, schedule="1f1b", global_batch=8), ["torchtitan"],
     "2 pipeline microbatches < pp=4"),
    (with_(plan_llama70b(), global_batch=36), ["torchtitan"],
     "microbatches (9) to be a multiple of rounds = max(1, 9//pp4) = 2"),
    (with_(plan_llama70b(), degrees={"vpp": 1}), list(TARGETS), "schedule='interleaved' needs vpp >= 2"),
    (with_(plan_llama70b(), degrees={"dp_shard": 1, "dp_replicate": 4}, zero_stage=0), ["torchtitan"],
     "dp_replicate=4 without dp_shard/cp is DDP, which v0.2.2 cannot combine with tp=8/pp=4"),
    (with_(plan_fsdp8b(), dtype="fp16"), ["torchtitan"], "accepts bfloat16 or float32, not fp16"),
    # Accelerate's Megatron plugin has no ZeRO-3 with pipelining.
    (with_(plan_mixed(), zero_stage=3), ["accelerate"],
     "no ZeRO-3/FSDP option"),
    # Issue 12 decisions a target cannot express: refused in one line naming the decision.
    (with_(plan_llama70b(), recompute="op", schedule="1f1b", degrees={"vpp": 1}), ["megatron"],
     "megatron: recompute=op (torchtitan's op-level selective checkpointing) has no Megatron flag"),
    (with_(plan_llama70b(), recompute="full:11", schedule="1f1b", degrees={"vpp": 1}), ["torchtitan"],
     "torchtitan: recompute=full:11: no k makes layer-level selective AC (every k-th layer) recompute 11 layers"),
    (with_(plan_llama70b(), fp8="blockwise"), ["torchtitan", "accelerate", "deepspeed"], "fp8 recipe blockwise"),
    (with_(plan_fsdp8b(), fp8="mxfp8"), ["accelerate", "deepspeed"], "fp8 recipe mxfp8"),
    (with_(plan_fsdp8b(), fp8="nvfp4"), ["torchtitan", "accelerate", "deepspeed"], "fp8 recipe nvfp4"),
    (with_(plan_fsdp8b(), dtype="nvfp4"), ["torchtitan", "accelerate", "deepspeed"], "fp8 recipe nvfp4"),
    (with_(plan_llama70b(), cp_kind="a2a", degrees={"dp_shard": 2, "cp": 2}), ["torchtitan"],
     "torchtitan: cp_kind a2a (Ulysses all-to-all over heads) with cp=2"),
    (with_(plan_dsv3(), etp=4, degrees={"ep": 32}), ["torchtitan"],
     "torchtitan: etp=4 with tp=2: ParallelDims supports expert tensor parallelism 1 or tp only"),
    (with_(plan_dsv3(), etp=1, degrees={"ep": 512}), list(TARGETS), "num_experts=256 is not divisible by ep=512"),
    (with_(plan_dsv3(), etp=4, degrees={"ep": 128}), list(TARGETS), "ep*etp = 128*4 must divide tp*cp*dp = 2*1*128"),
    (with_(plan_llama70b(), etp=2), list(TARGETS), "etp=2 but model 'Llama-3.1-70B' has no experts"),
    (with_(plan_dsv3(), moe_overlap=True, recompute="full"), ["megatron"],
     "megatron: moe_overlap (--overlap-moe-expert-parallel-comm) needs no full recomputation"),
    (with_(plan_dsv3(), moe_overlap=True, degrees={"ep": 1}), ["megatron"],
     "megatron: moe_overlap (--overlap-moe-expert-parallel-comm) needs ep > 1"),
]


@pytest.mark.parametrize("plan,targets,needle", BAD, ids=[b[2][:40] for b in BAD])
def test_check_rejects(plan: Plan, targets: list[str], needle: str) -> None:
    for t in targets:
        with pytest.raises(MeshplanError) as exc:
            render(plan, t)
        assert needle in str(exc.value), (t, str(exc.value))
        assert "\n" not in str(exc.value)


def test_checks_pass_on_reference_plans() -> None:
    for t in TARGETS:
        for name in plans_for(t):
            get_target(t).check(PLANS[name]())


def test_unknown_target() -> None:
    with pytest.raises(MeshplanError, match="unknown export target 'ray'; known: torchrun, megatron"):
        render(plan_fsdp8b(), "ray")


def test_unsupported_names_what_is_dropped() -> None:
    mixed = plan_mixed()
    for t in ("megatron", "deepspeed", "torchtitan", "accelerate"):
        warns = get_target(t).unsupported(mixed)
        assert any("per-layer precision" in w for w in warns), (t, warns)
        assert any("powersgd" in w for w in warns), (t, warns)
        assert all(w.startswith(f"{t}: ") for w in warns)
    assert any("static node ranks" in w for w in get_target("megatron").unsupported(plan_hetero()))
    assert any("uneven stage sizes" in w for w in get_target("deepspeed").unsupported(mixed))
    # A plain FSDP plan is fully expressible by DeepSpeed, TorchTitan and torchrun.
    for t in ("deepspeed", "torchtitan", "torchrun", "slurm", "kubeflow"):
        assert get_target(t).unsupported(plan_fsdp8b()) == [], t


def test_compression_mapping() -> None:
    """bf16 buckets -> Megatron --grad-reduce-in-bf16 / DeepSpeed communication_data_type; int8 under ZeRO-3 ->
    ZeRO++ zero_quantized_gradients (deepspeed/runtime/zero/config.py)."""
    bf16 = (BucketCompression(bucket=0, size_bytes=1 << 26, method="bf16"),)
    p = with_(plan_fsdp8b(), compression=bf16)
    assert "--grad-reduce-in-bf16" in render(p, "megatron").text
    assert json.loads(render(p, "deepspeed").text)["communication_data_type"] == "bf16"
    assert not any("compression" in w for w in render(p, "deepspeed").warnings)
    int8 = (BucketCompression(bucket=0, size_bytes=1 << 26, method="int8"),)
    ds = json.loads(render(with_(plan_fsdp8b(), compression=int8), "deepspeed").text)
    assert ds["zero_optimization"]["zero_quantized_gradients"] is True


def test_fp8_spellings() -> None:
    """``dtype: fp8`` without an ``fp8`` recipe (plans of before the field) is Transformer Engine's delayed scaling:
    Megatron --fp8-recipe delayed with TE's amax defaults, Accelerate's TE backend; torchtitan runs tensorwise and
    says so."""
    p = with_(plan_fsdp8b(), dtype="fp8")
    meg = render(p, "megatron").text
    assert "--fp8-format hybrid" in meg and "--fp8-recipe delayed" in meg and "--bf16" in meg
    assert "--fp8-amax-history-len 1024" in meg and "--fp8-amax-compute-algo max" in meg
    tt = render(p, "torchtitan")
    doc = tomllib.loads(tt.text)
    assert doc["model"]["converters"] == ["quantize.linear.float8"]
    assert doc["quantize"]["linear"]["float8"]["recipe_name"] == "tensorwise"
    assert any("fp8 recipe delayed" in w for w in tt.warnings)
    acc = render(p, "accelerate").text
    assert "mixed_precision: fp8" in acc and "backend: TE" in acc


@pytest.mark.parametrize("recipe", ["tensorwise", "blockwise", "mxfp8"])
def test_fp8_recipe_spellings(recipe: str) -> None:
    """An fp8 recipe on a bf16 plan: Megatron --bf16 + --fp8-recipe; torchtitan's float8 / mx converter."""
    p = with_(plan_fsdp8b(), fp8=recipe)
    meg = render(p, "megatron").text
    assert f"--fp8-format hybrid --fp8-recipe {recipe}" in " ".join(meg.split()) and "--bf16" in meg
    assert "--fp8-amax-history-len" not in meg
    if recipe == "blockwise":
        return
    doc = tomllib.loads(render(p, "torchtitan").text)
    section = "mx" if recipe == "mxfp8" else "float8"
    assert doc["model"]["converters"] == [f"quantize.linear.{section}"]
    assert doc["quantize"]["linear"][section]["recipe_name"] == ("mxfp8_cublas" if recipe == "mxfp8" else recipe)


@pytest.mark.parametrize("update", [{"fp8": "nvfp4"}, {"dtype": "nvfp4"}])
def test_nvfp4_spelling(update: dict) -> None:
    """NVFP4: megatron-core 0.16.1's fp4 mode (TransformerConfig ``fp4`` from ``--fp4-format``, ``fp4_recipe``
    from ``--fp4-recipe``) beside --bf16, and no fp8 flags (megatron-core refuses fp4 with fp8)."""
    meg = " ".join(render(with_(plan_fsdp8b(), **update), "megatron").text.split())
    assert "--fp4-format e2m1 --fp4-recipe nvfp4" in meg and "--bf16" in meg and "--fp8-format" not in meg


def test_issue12_spellings() -> None:
    """etp, cp_kind, moe_capacity / moe_overlap and full:N as each target spells them."""
    moe = with_(plan_dsv3(), etp=1, moe_capacity=1.25, moe_overlap=True)
    meg = " ".join(render(moe, "megatron").text.split())
    assert "--expert-model-parallel-size 64 --expert-tensor-parallel-size 1" in meg
    assert "--moe-expert-capacity-factor 1.25 --moe-pad-expert-input-to-capacity --moe-token-drop-policy probs" in meg
    assert "--overlap-moe-expert-parallel-comm" in meg
    assert "expert_tensor_parallel_degree = 1" in render(moe, "torchtitan").text
    assert json.loads(render(moe, "deepspeed").text)["expert_parallel"]["expert_tensor_parallel_size"] == 1
    for t in ("torchtitan", "deepspeed", "accelerate", "torchrun"):
        warns = render(moe, t).warnings
        assert any(w.startswith(f"{t}: moe_overlap") for w in warns), (t, warns)
        assert any(w.startswith(f"{t}: moe_capacity=1.25") for w in warns), (t, warns)
    cp = with_(plan_fsdp8b(), degrees={"dp_shard": 4, "cp": 2}, global_batch=32)
    for kind, megatron_type, rotate in (("ring", "p2p", "alltoall"), ("allgather", "all_gather", "allgather")):
        p = with_(cp, cp_kind=kind)
        assert f"--cp-comm-type {megatron_type}" in render(p, "megatron").text
        assert f'context_parallel_rotate_method = "{rotate}"' in render(p, "torchtitan").text
        assert f"parallelism_config_cp_comm_strategy: {rotate}" in render(p, "accelerate").text
    assert "--cp-comm-type a2a" in render(with_(cp, cp_kind="a2a"), "megatron").text
    assert any("cp_kind=ring" in w for w in render(cp, "deepspeed").warnings)
    full2 = with_(plan_llama70b(), recompute="full:2")
    assert "--recompute-method block --recompute-num-layers 2" in " ".join(render(full2, "megatron").text.split())
    assert 'selective_ac_option = "5"' in render(full2, "torchtitan").text  # 20 layers per rank: every 5th = 2 x vpp 2
    assert any("recompute=full:2" in w for w in render(full2, "deepspeed").warnings)
    stack = with_(plan_llama70b(), stack="eager")
    assert any(w.startswith("megatron: stack=eager") for w in render(stack, "megatron").warnings)
    assert not any("stack=" in w for w in render(stack, "torchrun").warnings)  # the example trainer is eager
    # torchtitan v0.2.2 runs either: eager model code with compile off (its Compile.enable default, what the
    # torchtitan profile prices), or torch.compile's kernels when the plan priced them (compile.enable rendered)
    eager = render(stack, "torchtitan")
    assert not any("stack=" in w for w in eager.warnings) and "[compile]" not in eager.text
    compiled = render(with_(plan_llama70b(), stack="torchtitan"), "torchtitan")
    assert not any("stack=" in w for w in compiled.warnings)
    assert tomllib.loads(compiled.text)["compile"] == {"enable": True, "components": ["model", "loss"]}


def test_hsdp_spellings() -> None:
    """dp_replicate x dp_shard: Megatron distributed-optimizer instances, TorchTitan both degrees, Accelerate
    parallelism_config sizes."""
    p = with_(plan_fsdp8b(), cluster=plan_fsdp8b().cluster.model_copy(update={"spec": "2x8xH100", "groups": (
        plan_fsdp8b().cluster.groups[0].model_copy(update={"nodes": 2}),)}), degrees={"dp_replicate": 2},
        global_batch=128)
    assert "--num-distributed-optimizer-instances 2" in render(p, "megatron").text
    tt = render(p, "torchtitan").text
    assert "data_parallel_replicate_degree = 2" in tt and "data_parallel_shard_degree = 8" in tt
    acc = render(p, "accelerate").text
    assert "parallelism_config_dp_replicate_size: 2" in acc and "parallelism_config_dp_shard_size: 8" in acc
    assert any("HSDP" in w for w in render(p, "deepspeed").warnings)


def test_cp_spellings() -> None:
    """Context parallelism: Megatron --context-parallel-size, DeepSpeed Ulysses sequence_parallel_size +
    data_parallel_size, TorchTitan context_parallel_degree, Accelerate parallelism_config_cp_size (exports.md
    section 0)."""
    base = plan_fsdp8b()
    p = with_(base, degrees={"dp_shard": 4, "cp": 2}, global_batch=32)
    assert "--context-parallel-size 2" in render(p, "megatron").text
    ds = json.loads(render(p, "deepspeed").text)
    assert (ds["sequence_parallel_size"], ds["data_parallel_size"]) == (2, 4)
    assert "context_parallel_degree = 2" in render(p, "torchtitan").text
    assert "parallelism_config_cp_size: 2" in render(p, "accelerate").text
    with pytest.raises(MeshplanError, match="seq_len=8191 is not divisible by 2\\*cp = 4"):
        render(with_(p, seq_len=8191), "megatron")
