"""The megatron-bridge export read back through the megatron-bridge package itself (0.3.1, installed --no-deps).

Each plan is rendered, its override words are taken from the script by bash itself (the ``OVERRIDES`` array), and
``tests/bridge_readback.py`` (a subprocess) does what ``scripts/training/run_recipe.py`` does with them: the
recipe's ``ConfigContainer``, ``process_config_with_overrides`` (Hydra's override parser), then
``runtime_config_update`` (mixed-precision preset, ``CommOverlapConfig.setup``, ``ConfigContainer.validate``: the
provider's ``TransformerConfig.__post_init__``, data-parallel size, sequence-length agreement). The independent truth
is that config: every field must equal the plan's decision, computed here from the plan. Recipes load their model's
HF config; the test serves them offline from the repository's preset configs (``planner/presets/models``). See
``tests/bridge_readback.py`` for the two things a CPU-only machine cannot run and what is done instead.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from meshplan.core.errors import MeshplanError
from meshplan.planner.export import _common as c
from meshplan.planner.export import bridge, render
from meshplan.planner.model.config import load_model
from meshplan.planner.plan.build import model_ref
from meshplan.planner.plan.schema import ClusterRef, Degrees, DeviceGroupRef, ModelRef, Plan
from tests.helpers import REPO
from tests.test_export_golden import ALL_PLANS, GOLDEN

BRIDGE_MISSING = importlib.util.find_spec("megatron.bridge") is None or importlib.util.find_spec("hydra") is None
needs_bridge = pytest.mark.skipif(BRIDGE_MISSING, reason="megatron-bridge not installed "
                                  "(pip install --no-deps megatron-bridge==0.3.1, as the README's test command does)")

PRESETS = REPO / "planner" / "presets" / "models"
# The HF id each recipe loads -> the repository's copy of that model's config.json (planner/presets/models).
HF_CONFIGS = {"meta-llama/Meta-Llama-3.1-8B": "llama-3.1-8b-instruct.json",
              "meta-llama/Meta-Llama-3.1-70B": "llama-3.1-70b-instruct.json",
              "Qwen/Qwen3-30B-A3B": "qwen3-30b-a3b.json", "Qwen/Qwen2.5-7B": "qwen2.5-7b.json",
              "deepseek-ai/DeepSeek-V3": "deepseek-v3.json", "zai-org/GLM-4.5": "glm-4.5.json",
              "zai-org/GLM-4.5-Air": "glm-4.5-air.json", "google/gemma-2-2b": "gemma-2-2b.json",
              "openai/gpt-oss-20b": "gpt-oss-20b.json",
              "Qwen/Qwen3-Next-80B-A3B-Instruct": "qwen3-next-80b-a3b.json"}
# Turned off for the CPU read-back only: TransformerConfig refuses RoPE and MoE-permute fusion without Transformer
# Engine. (NVFP4 cannot be validated at all without it, ``is_te_min_version``: its preset is checked alone below.)
CPU_OVERRIDES = ["model.apply_rope_fusion=false", "model.moe_permute_fusion=false"]

# Qwen3-30B-A3B (planner/presets/models/qwen3-30b-a3b.json; 30.5 B parameters, the preset's count).
QWEN3_MOE = ModelRef(name="Qwen3-30B-A3B", source="qwen3-30b-a3b", model_type="qwen3_moe", num_params=30_532_122_624,
                     hidden_size=2048, num_layers=48, num_attention_heads=32, num_kv_heads=4, ffn_hidden_size=6144,
                     vocab_size=151936, num_experts=128, experts_per_token=8, head_dim=128, moe_ffn_hidden_size=768,
                     tied_embeddings=False)


def plan_qwen25() -> Plan:
    """Qwen2.5-7B (the preset, as ``meshplan plan`` records it) on one H100 node: TP2 PP2, dp 2, ZeRO-1."""
    group = DeviceGroupRef(nodes=1, devices_per_node=8, device="H100")
    return Plan(name="qwen25-7b", model=model_ref(load_model("qwen2.5-7b"), "qwen2.5-7b"),
                cluster=ClusterRef(spec="1x8xH100", groups=(group,)), global_batch=64, micro_batch=2, seq_len=4096,
                degrees=Degrees(dp_shard=2, tp=2, pp=2), sequence_parallel=True, zero_stage=1, recompute="none",
                dtype="bf16")


def plan_qwen3_moe(**update) -> Plan:
    """Qwen3-30B-A3B on 2x8 H100: TP2 (SP), EP8 over the dp 8 ranks, ZeRO-1, selective recompute."""
    group = DeviceGroupRef(nodes=2, devices_per_node=8, device="H100")
    base = Plan(name="qwen3-30b-ep8", model=QWEN3_MOE, cluster=ClusterRef(spec="2x8xH100", groups=(group,)),
                global_batch=256, micro_batch=1, seq_len=4096, degrees=Degrees(dp_shard=8, tp=2, ep=8),
                sequence_parallel=True, zero_stage=1, recompute="selective", dtype="bf16")
    return base.model_copy(update=update)


def plan_glm(preset: str) -> Plan:
    """A GLM-4.5 preset (as ``meshplan plan`` records it) on 4x8 H100: TP2 (SP), EP8, ZeRO-1, its one MTP layer."""
    group = DeviceGroupRef(nodes=4, devices_per_node=8, device="H100")
    return Plan(name=preset, model=model_ref(load_model(preset), preset),
                cluster=ClusterRef(spec="4x8xH100", groups=(group,)), global_batch=256, micro_batch=1, seq_len=4096,
                degrees=Degrees(dp_shard=16, tp=2, ep=8), sequence_parallel=True, zero_stage=1, recompute="selective",
                dtype="bf16", mtp=1)


# The model fields Megatron-Bridge's own GLM bridge (models/glm/glm45_bridge.py) builds from a GLM preset's
# config.json, read back beside the plan's (test_glm_presets_build_the_bridges_own_glm_provider)
GLM_FIELDS = ["model.num_query_groups", "model.kv_channels", "model.ffn_hidden_size", "model.moe_ffn_hidden_size",
              "model.moe_shared_expert_intermediate_size", "model.moe_layer_freq", "model.qk_layernorm",
              "model.add_qkv_bias", "model.rotary_percent", "model.moe_router_enable_expert_bias",
              "model.moe_router_score_function", "model.vocab_size", "model.share_embeddings_and_output_weights"]


def plan_gemma(preset: str) -> Plan:
    """A Gemma preset (as ``meshplan plan`` records it) on one H100 node: TP2 (SP), dp 4, ZeRO-1, selective
    recompute; Gemma 2 with the unfused attention its capped scores need."""
    group = DeviceGroupRef(nodes=1, devices_per_node=8, device="H100")
    m = load_model(preset)
    return Plan(name=preset, model=model_ref(m, preset), cluster=ClusterRef(spec="1x8xH100", groups=(group,)),
                global_batch=64, micro_batch=1, seq_len=8192, degrees=Degrees(dp_shard=4, tp=2),
                sequence_parallel=True, zero_stage=1, recompute="selective", dtype="bf16",
                attention="unfused" if m.attn_softcap else "flash")


# The model fields Megatron-Bridge's Gemma providers hold (models/gemma/gemma2_bridge.py from a preset's config.json,
# models/gemma/gemma3_provider.py's Gemma3ModelProvider1B on its own), read back beside the plan's
# (test_gemma_presets_are_the_bridges_gemma_providers)
GEMMA_FIELDS = ["model.num_query_groups", "model.kv_channels", "model.ffn_hidden_size", "model.vocab_size",
                "model.share_embeddings_and_output_weights", "model.gated_linear_unit", "model.normalization",
                "model.window_size"]
GEMMA_FIELDS_BY_FAMILY = {"gemma2": ["model.attn_logit_softcapping", "model.final_logit_softcapping"],
                          "gemma3_text": ["model.interleaved_attn_pattern"]}


def plan_preset(preset: str, ep: int = 1) -> Plan:
    """A bundled model (as ``meshplan plan`` records it) on one H100 node: TP2 (SP), dp 4, ZeRO-1; an MoE model's
    experts over ``ep`` ranks without expert TP."""
    group = DeviceGroupRef(nodes=1, devices_per_node=8, device="H100")
    return Plan(name=preset, model=model_ref(load_model(preset), preset),
                cluster=ClusterRef(spec="1x8xH100", groups=(group,)), global_batch=64, micro_batch=1, seq_len=4096,
                degrees=Degrees(dp_shard=4, tp=2, ep=ep), sequence_parallel=True, zero_stage=1, recompute="none",
                dtype="bf16", etp=1 if ep > 1 else 0)


# The model fields of the GPT-OSS and Nemotron-H / Nemotron 3 models the bridge's recipes train (the GPT-OSS bridge
# from a preset's config.json; NemotronHModelProvider8B and Nemotron3NanoProvider on their own), read back beside the
# plan's (test_hybrid_and_gpt_oss_presets_are_the_bridges_models)
FAMILY_FIELDS = {
    "gpt_oss": ["model.num_query_groups", "model.kv_channels", "model.num_moe_experts", "model.moe_router_topk",
                "model.moe_ffn_hidden_size", "model.window_size", "model.window_attn_skip_freq",
                "model.softmax_type", "model.add_bias_linear", "model.vocab_size"],
    "nemotron_h": ["model.hybrid_override_pattern", "model.mamba_num_heads", "model.mamba_head_dim",
                   "model.mamba_state_dim", "model.mamba_num_groups", "model.ffn_hidden_size", "model.num_moe_experts",
                   "model.moe_ffn_hidden_size", "model.moe_shared_expert_intermediate_size", "model.num_query_groups",
                   "model.kv_channels", "model.vocab_size"],
    "qwen3_next": ["model.experimental_attention_variant", "model.linear_attention_freq",
                   "model.linear_num_key_heads", "model.linear_num_value_heads", "model.linear_key_head_dim",
                   "model.linear_value_head_dim", "model.linear_conv_kernel_dim", "model.attention_output_gate",
                   "model.num_query_groups", "model.kv_channels", "model.rotary_percent", "model.num_moe_experts",
                   "model.moe_router_topk", "model.moe_ffn_hidden_size", "model.moe_shared_expert_intermediate_size",
                   "model.moe_shared_expert_gate", "model.vocab_size"],
}


CASES = {
    "llama70b": ALL_PLANS["llama70b"], "fsdp8b": ALL_PLANS["fsdp8b"], "hetero": ALL_PLANS["hetero"],
    "fp8": ALL_PLANS["fp8"], "fp8-tensorwise": ALL_PLANS["fp8-tensorwise"], "fp8-mxfp8": ALL_PLANS["fp8-mxfp8"],
    "fp8-blockwise": ALL_PLANS["fp8-blockwise"], "bf16-layers-mxfp8": ALL_PLANS["bf16-layers-mxfp8"],
    "bf16-layers-tensorwise": ALL_PLANS["bf16-layers-tensorwise"],
    "cp2-a2a": ALL_PLANS["cp2-a2a"], "recompute-full2": ALL_PLANS["recompute-full2"],
    "uneven-interleaved": ALL_PLANS["uneven-interleaved"], "pp-overlap-off": ALL_PLANS["pp-overlap-off"],
    "no-recompute-1f1b": ALL_PLANS["no-recompute-1f1b"], "fsdp2": lambda: ALL_PLANS["fsdp8b"]().model_copy(
        update={"fsdp": "torch"}), "zero2": lambda: ALL_PLANS["fsdp8b"]().model_copy(update={"zero_stage": 2}),
    "hsdp": lambda: ALL_PLANS["llama70b"]().model_copy(update={"degrees": Degrees(dp_replicate=2, dp_shard=2, tp=8,
                                                                                  pp=4, vpp=2)}),
    "remainder": lambda: ALL_PLANS["llama70b"]().model_copy(update={"optim_dtype": "remainder"}),
    "dsv3": ALL_PLANS["dsv3"], "moe-deepep": ALL_PLANS["moe-deepep"], "moe-overlap": ALL_PLANS["moe-overlap"],
    "moe-shared-overlap": ALL_PLANS["moe-shared-overlap"], "moe-fold-ep256": ALL_PLANS["moe-fold-ep256"],
    "qwen25": plan_qwen25, "qwen3-moe": plan_qwen3_moe, "qwen3-moe-capacity": lambda: plan_qwen3_moe(moe_capacity=1.25),
    "qwen3-moe-etp1": lambda: plan_qwen3_moe(etp=1),
    "qwen3-moe-hybridep": lambda: plan_qwen3_moe(moe_dispatcher="hybridep", hybridep_sms=32),
    "qwen3-moe-router-fusion": lambda: plan_qwen3_moe(moe_router_fusion=True),
    "qwen3-moe-aux-loss": lambda: plan_qwen3_moe(moe_aux_loss="global_aux_loss"),
    "moe-recompute-modules": ALL_PLANS["moe-recompute-modules"], "moe-mtp-uneven": ALL_PLANS["moe-mtp-uneven"],
    "offload": lambda: ALL_PLANS["fsdp8b"]().model_copy(update={"recompute": "none", "offload_layers": 12}),
    "attention-fp8": ALL_PLANS["attention-fp8"], "attention-fp8-delayed": ALL_PLANS["attention-fp8-delayed"],
    "attention-fp8-mxfp8": ALL_PLANS["attention-fp8-mxfp8"],
    "graphs-layers": ALL_PLANS["graphs-layers"],
    "qwen3-moe-graphs-layers": lambda: plan_qwen3_moe(cuda_graphs="layers"),
    "qwen3-moe-graphs-iteration": lambda: plan_qwen3_moe(cuda_graphs="iteration", moe_capacity=1.0),
    "qwen3-moe-graphs-mixers": lambda: plan_qwen3_moe(cuda_graphs="mixers", recompute_modules="moe+layernorm"),
    # LoRA: the peft recipes of the 70B and the 8B, at the ranks those recipes train (the 26.02.01 profile's)
    "lora-70b": lambda: ALL_PLANS["llama70b"]().model_copy(update={"lora": "16"}),
    "lora-8b": lambda: ALL_PLANS["fsdp8b"]().model_copy(update={"lora": "8:qkv+proj+fc1+fc2"}),
    "glm45": lambda: plan_glm("glm-4.5"), "glm45-air": lambda: plan_glm("glm-4.5-air"),
    "gemma2-2b": lambda: plan_gemma("gemma-2-2b"), "gemma3-1b": lambda: plan_gemma("gemma-3-1b"),
    "gptoss-20b": lambda: plan_preset("gpt-oss-20b", ep=8), "nemotronh-8b": lambda: plan_preset("nemotron-h-8b"),
    "nemotron3-nano": lambda: plan_preset("nemotron-3-nano-30b-a3b", ep=8),
    "qwen3-next": lambda: plan_preset("qwen3-next-80b-a3b", ep=8),
}
# The base checkpoint a LoRA script asks for (its $PRETRAINED_CHECKPOINT)
CHECKPOINT = "/checkpoints/base"
FP8_ATTENTION_CASES = ("attention-fp8", "attention-fp8-delayed", "attention-fp8-mxfp8")


# Where validation stops on a CPU-only machine, past the overrides: the flex dispatcher (DeepEP, Hybrid-EP) is checked
# against the GPU's architecture (validate_flex_dispatcher_backend, validate's last step), and megatron-core's
# OptimizerConfig asks Transformer Engine's version for the precision-aware optimizer (is_te_min_version("2.1.0"):
# None without TE).
GPU_ONLY = {"moe-deepep": "AssertionError: Torch not compiled with CUDA enabled",
            "qwen3-moe-hybridep": "AssertionError: Torch not compiled with CUDA enabled",
            "remainder": "TypeError: '>=' not supported between instances of 'NoneType' and 'Version'"}


def _overrides_from_script(script: str, tmp_path: Path) -> list[str]:
    """The words of the rendered script's OVERRIDES array, as bash reads them (quotes and all)."""
    path = tmp_path / "bridge.sh"
    path.write_text(script)
    code = 'torchrun() { :; }; source "$1" >/dev/null; printf "%s\\n" "${OVERRIDES[@]}"'
    out = subprocess.run(["bash", "-c", code, "bash", str(path)], capture_output=True, text=True, timeout=30,
                         env={"PATH": os.environ["PATH"], "HEAD_NODE": "node-a", "NODE_RANK": "0",
                              "PRETRAINED_CHECKPOINT": CHECKPOINT}, check=True)
    return out.stdout.splitlines()


def _hf_cache(root: Path) -> Path:
    """An offline HF hub cache (``models--org--name/snapshots/<rev>/config.json``, ``refs/main``) of HF_CONFIGS."""
    rev = "0" * 40
    for repo, name in HF_CONFIGS.items():
        d = root / ("models--" + repo.replace("/", "--"))
        (d / "refs").mkdir(parents=True)
        (d / "refs" / "main").write_text(rev)
        (d / "snapshots" / rev).mkdir(parents=True)
        (d / "snapshots" / rev / "config.json").write_text((PRESETS / name).read_text())
    return root


def _case(name: str, plan: Plan, words: list[str]) -> dict:
    recipe = bridge.recipe_of(plan)
    moe = bool(plan.model.num_experts)
    return {"name": name, "recipe": recipe.name, "world": plan.cluster.world_size, "overrides": words,
            "cpu_overrides": CPU_OVERRIDES, "provider_from": recipe.hf_model if moe and not recipe.provider else None,
            "base_recipe": "llama31_70b_pretrain_config" if recipe.comm_overlap else "llama31_8b_pretrain_config",
            "extra": ["model.num_layers", "model.hidden_size", "model.num_moe_experts", "model.overlap_p2p_comm",
                      "model.tp_comm_overlap", "model.fp8", "model.fp8_recipe", "model.fp4", "ddp.grad_reduce_in_fp32",
                      "model.mtp_num_layers", "model.recompute_modules", "model.cpu_offloading",
                      "model.cpu_offloading_num_layers", "model.fp8_dot_product_attention",
                      "model.first_last_layers_bf16", "model.num_layers_at_start_in_bf16",
                      "model.num_layers_at_end_in_bf16", "model.cuda_graph_impl", "model.cuda_graph_scope",
                      "model.moe_hybridep_num_sms"]
            + (["peft.dim", "peft.target_modules", "checkpoint.pretrained_checkpoint"] if plan.lora else [])
            + (GLM_FIELDS if plan.model.model_type == "glm4_moe" else [])
            + (GEMMA_FIELDS + GEMMA_FIELDS_BY_FAMILY[plan.model.model_type]
               if plan.model.model_type in GEMMA_FIELDS_BY_FAMILY else [])
            + FAMILY_FIELDS.get(plan.model.model_type, [])}


def _read_back(cases: list[dict], tmp: Path) -> dict:
    env = {**os.environ, "HF_HUB_CACHE": str(_hf_cache(tmp / "hf")), "HF_HUB_OFFLINE": "1"}
    out = tmp / "readback.json"
    request = json.dumps({"cases": cases, "presets": sorted(set(bridge.PRESETS.values()))})
    subprocess.run([sys.executable, str(REPO / "tests" / "bridge_readback.py"), str(out)], input=request,
                   capture_output=True, text=True, env=env, cwd=tmp, timeout=900, check=True)
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def read_back(tmp_path_factory) -> dict:
    """Every case rendered, its overrides read back by the bridge in one subprocess, plus one tampered case."""
    tmp = tmp_path_factory.mktemp("bridge")
    cases, words = [], {}
    for name, make in CASES.items():
        words[name] = _overrides_from_script(render(make(), "megatron-bridge").text, tmp)
        cases.append(_case(name, make(), words[name]))
    # A mismatch the bridge catches: the dataset's sequence length left at the recipe's 8192 with a 4096 model.
    tampered = [w for w in words["hetero"] if not w.startswith("dataset.sequence_length=")]
    cases.append({**_case("tampered", CASES["hetero"](), tampered), "name": "tampered"})
    return _read_back(cases, tmp)


def _expected(plan: Plan) -> dict[str, object]:
    """What the bridge's config must hold for the plan: its decisions, worked out here from the plan alone."""
    d, m = plan.degrees, plan.model
    n_full = int(plan.recompute.split(":")[1]) if plan.recompute.startswith("full:") else 0
    sharded = plan.zero_stage >= 1 and d.dp_shard * d.cp > 1
    torch_fsdp = plan.zero_stage == 3 and sharded and plan.fsdp == "torch"
    fsdp = plan.zero_stage >= 2 and sharded and not torch_fsdp
    # MX scales E4M3 blocks in both passes (OCP MX v1.0), so the bridge's mxfp8 preset is e4m3, not hybrid.
    recipe_fp8 = {"none": (None, None), "delayed": ("hybrid", "delayed"), "tensorwise": ("hybrid", "tensorwise"),
                  "blockwise": ("hybrid", "blockwise"), "mxfp8": ("e4m3", "mxfp8"), "nvfp4": (None, None)}
    fp8 = plan.fp8 if plan.fp8 != "none" else ("delayed" if plan.dtype == "fp8" else "none")
    e = {"model.tensor_model_parallel_size": d.tp, "model.pipeline_model_parallel_size": d.pp,
         "model.virtual_pipeline_model_parallel_size": d.vpp if d.vpp > 1 else None,
         "model.context_parallel_size": d.cp, "model.sequence_parallel": plan.sequence_parallel,
         "model.seq_length": plan.seq_len,
         "train.micro_batch_size": plan.micro_batch, "train.global_batch_size": plan.global_batch,
         "data_parallel_size": d.dp, "model.num_layers": m.num_layers, "model.hidden_size": m.hidden_size,
         "model.recompute_granularity": "full" if plan.recompute.startswith("full") else
         "selective" if plan.recompute == "selective" else None,
         "model.recompute_method": "block" if n_full else "uniform" if plan.recompute == "full" else None,
         "model.recompute_num_layers": n_full or (1 if plan.recompute == "full" else None),
         "ddp.use_distributed_optimizer": sharded and not fsdp and not torch_fsdp,
         "optimizer.use_distributed_optimizer": sharded and not fsdp and not torch_fsdp,
         "ddp.use_megatron_fsdp": fsdp, "dist.use_torch_fsdp2": torch_fsdp,
         "optimizer.use_precision_aware_optimizer": plan.optim_dtype == "remainder",
         "model.tp_comm_overlap": plan.tp_overlap,
         "ddp.num_distributed_optimizer_instances": d.dp_replicate if sharded and not fsdp else 1,
         "model.fp8": recipe_fp8[fp8][0], "model.fp8_recipe": recipe_fp8[fp8][1] or "tensorwise",
         "model.fp4": "e2m1" if fp8 == "nvfp4" else None, "ddp.grad_reduce_in_fp32": True,
         "model.cpu_offloading": bool(plan.offload_layers), "model.cpu_offloading_num_layers": plan.offload_layers,
         "model.fp8_dot_product_attention": plan.attention_dtype == "fp8",
         # every decoder layer in the plan's recipe but those it keeps in bf16: the tensorwise preset's own 1 and 1
         # are turned off unless the plan priced them
         "model.first_last_layers_bf16": any(c.bf16_layers(plan))}
    if plan.lora:  # the peft recipe: its dataset's length and packing, its adapters, the base checkpoint
        rank, _, mods = plan.lora.partition(":")
        packed = "dataset.packed_sequence_specs" + (".packed_sequence_size" if plan.micro_batch == 1 else "")
        e.update({"dataset.seq_length": plan.seq_len, packed: plan.seq_len if plan.micro_batch == 1 else None,
                  "peft.dim": int(rank), "checkpoint.pretrained_checkpoint": CHECKPOINT,
                  "peft.target_modules": [f"linear_{x}" for x in (mods.split("+") if mods else
                                                                  ("qkv", "proj", "fc1", "fc2"))]})
    else:
        e["dataset.sequence_length"] = plan.seq_len
    if any(c.bf16_layers(plan)):
        e["model.num_layers_at_start_in_bf16"], e["model.num_layers_at_end_in_bf16"] = c.bf16_layers(plan)
    if m.model_type in ("deepseek_v3", "glm4_moe"):  # the recipe's one MTP layer, kept where the plan prices it
        e["model.mtp_num_layers"] = plan.mtp or None
    if plan.recompute_modules:
        e["model.recompute_modules"] = plan.recompute_modules.split("+")
    # CUDA graphs: TE's per-layer scopes (the whole MoE block where it drops and pads) or the full-iteration graph,
    # written from Megatron-Core's CudaGraphScope names here, not from the exporter's helper
    impl = {"none": "none", "mixers": "transformer_engine", "layers": "transformer_engine", "iteration": "local"}
    e["model.cuda_graph_impl"] = impl[plan.cuda_graphs]
    if plan.cuda_graphs == "iteration":
        e["model.cuda_graph_scope"] = ["full_iteration"]
    elif plan.cuda_graphs == "mixers":
        e["model.cuda_graph_scope"] = ["attn", "mamba"] if m.model_type == "nemotron_h" else ["attn"]
    elif plan.cuda_graphs == "layers":
        e["model.cuda_graph_scope"] = (["attn", "mlp"] if not m.num_experts else ["attn", "moe"] if plan.moe_capacity
                                       else ["attn", "moe_router", "moe_preprocess"])
    if fsdp:
        e["ddp.data_parallel_sharding_strategy"] = "optim_grads_params" if plan.zero_stage == 3 else "optim_grads"
    if d.cp > 1:
        e["model.cp_comm_type"] = {"ring": "p2p", "allgather": "all_gather", "a2a": "a2a"}[plan.cp_kind]
    if d.vpp > 1:  # Megatron-Core overlaps interleaved sends unless the plan priced them in line
        e["model.overlap_p2p_comm"] = plan.pp_overlap is not False
    if plan.stages and len({s.num_layers for s in plan.stages}) > 1:
        e["model.pipeline_model_parallel_layout"] = "layout of " + "+".join(str(s.num_layers) for s in plan.stages)
    if m.num_experts:
        e.update({"model.num_moe_experts": m.num_experts, "model.expert_model_parallel_size": d.ep,
                  "model.expert_tensor_parallel_size": plan.etp or d.tp,
                  "model.moe_token_dispatcher_type": "alltoall" if plan.moe_dispatcher == "alltoall" else "flex",
                  "model.moe_flex_dispatcher_backend": None if plan.moe_dispatcher == "alltoall" else
                  plan.moe_dispatcher,
                  "model.moe_shared_expert_overlap": plan.shared_overlap,
                  "model.moe_router_fusion": plan.moe_router_fusion,
                  "model.overlap_moe_expert_parallel_comm": plan.moe_overlap,
                  "model.moe_expert_capacity_factor": plan.moe_capacity or None,
                  "model.moe_pad_expert_input_to_capacity": bool(plan.moe_capacity)})
        if plan.moe_capacity:  # dropping by router probability, as Megatron-LM's export sets it
            e["model.moe_token_drop_policy"] = "probs"
        if plan.moe_aux_loss != "none":  # its type; the coefficient stays the model bridge's
            e["model.moe_router_load_balancing_type"] = plan.moe_aux_loss
        if plan.moe_dispatcher == "hybridep":  # its SMs as the plan priced them (megatron-core 0.16.1's own: 16)
            e["model.moe_hybridep_num_sms"] = plan.hybridep_sms
    return e


def _layout_of(value: str) -> str:
    """``Et*9|t*10|...L`` (``...mL``: an MTP module) as ``layout of 9+10+...`` (layers per virtual stage, in model
    order)."""
    return "layout of " + "+".join(part.strip("EmL").split("*")[1] for part in value.split("|"))


@needs_bridge
@pytest.mark.parametrize("name", list(CASES))
def test_bridge_config_holds_the_plan(read_back: dict, name: str) -> None:
    assert read_back["transformer_engine_left"] == []
    got = read_back[name]
    assert "error" not in got, got
    if isinstance(got.get("model.pipeline_model_parallel_layout"), str):
        got = {**got, "model.pipeline_model_parallel_layout": _layout_of(got["model.pipeline_model_parallel_layout"])}
    want = _expected(CASES[name]())
    assert {k: got.get(k) for k in want} == want
    assert got["validate_error"] == GPU_ONLY.get(name)


@needs_bridge
@pytest.mark.parametrize("name,preset", [("glm45", "glm-4.5"), ("glm45-air", "glm-4.5-air")])
def test_glm_presets_build_the_bridges_own_glm_provider(read_back: dict, name: str, preset: str) -> None:
    """Megatron-Bridge's GLM bridge reads the bundled config.json (offline, as zai-org's) into the provider its GLM
    recipes train: every shape and flag it derives agrees with what meshplan's reader made of the same file."""
    m, got = load_model(preset), read_back[name]
    want = {"model.num_query_groups": m.num_kv_heads, "model.kv_channels": m.head_dim,
            "model.ffn_hidden_size": m.ffn_hidden_size, "model.moe_ffn_hidden_size": m.moe_ffn_hidden_size,
            "model.moe_shared_expert_intermediate_size": m.shared_expert_ffn_hidden_size,
            "model.moe_layer_freq": [int(i in m.moe_layers) for i in range(m.num_layers)],
            "model.qk_layernorm": m.qk_norm, "model.add_qkv_bias": m.qkv_bias,
            "model.rotary_percent": m.rotary_percent, "model.moe_router_enable_expert_bias": m.router_bias,
            "model.moe_router_score_function": "sigmoid", "model.vocab_size": m.vocab_size,
            "model.share_embeddings_and_output_weights": m.tied_embeddings}
    assert {k: got.get(k) for k in want} == want


@needs_bridge
@pytest.mark.parametrize("name,preset", [("gemma2-2b", "gemma-2-2b"), ("gemma3-1b", "gemma-3-1b")])
def test_gemma_presets_are_the_bridges_gemma_providers(read_back: dict, name: str, preset: str) -> None:
    """The model the bridge's Gemma recipe trains, from its Gemma 2 bridge reading the bundled config.json (offline,
    as google's) or from its own Gemma3ModelProvider1B: every shape, the window and its layers, and Gemma 2's caps,
    as meshplan's reader made them of the same file."""
    m, got = load_model(preset), read_back[name]
    want = {"model.num_query_groups": m.num_kv_heads, "model.kv_channels": m.head_dim,
            "model.ffn_hidden_size": m.ffn_hidden_size, "model.vocab_size": m.vocab_size,
            "model.share_embeddings_and_output_weights": m.tied_embeddings, "model.gated_linear_unit": m.gated_mlp,
            "model.normalization": "RMSNorm"}
    if m.model_type == "gemma2":  # every other layer local (the provider's layer_number % 2), a (left, 0) window
        assert len(m.window_layers) * 2 == m.num_layers
        want |= {"model.window_size": [m.sliding_window, 0], "model.attn_logit_softcapping": m.attn_softcap,
                 "model.final_logit_softcapping": m.logit_softcap}
    else:  # (local, global) layers in turn: the first global layer ends the first run of local ones
        first_global = min(set(range(m.num_layers)) - set(m.window_layers))
        want |= {"model.window_size": m.sliding_window, "model.interleaved_attn_pattern": [first_global, 1]}
    assert {k: got.get(k) for k in want} == want
    assert got["validate_error"] is None


@needs_bridge
@pytest.mark.parametrize("name,preset", [("gptoss-20b", "gpt-oss-20b"), ("nemotronh-8b", "nemotron-h-8b"),
                                         ("nemotron3-nano", "nemotron-3-nano-30b-a3b")])
def test_hybrid_and_gpt_oss_presets_are_the_bridges_models(read_back: dict, name: str, preset: str) -> None:
    """The model the bridge's recipe trains: GPT-OSS from its GPT-OSS bridge reading the bundled config.json
    (offline, as openai's), Nemotron-H 8B and Nemotron 3 Nano from the recipes' own provider classes (no HF read;
    their vocabulary comes from the tokenizer at run time). Every shape, the layer pattern and the Mamba mixer's
    sizes, the window and its layers, the sinks and the biases are meshplan's reading of the same model."""
    m, got = load_model(preset), read_back[name]
    want = {"model.num_query_groups": m.num_kv_heads, "model.kv_channels": m.head_dim}
    if m.model_type == "gpt_oss":  # Megatron-Core windows layer n (1-based) unless n % window_attn_skip_freq == 0
        assert m.window_layers == tuple(range(0, m.num_layers, 2))
        want |= {"model.num_moe_experts": m.num_experts, "model.moe_router_topk": m.experts_per_token,
                 "model.moe_ffn_hidden_size": m.moe_ffn_hidden_size, "model.window_size": [m.sliding_window, 0],
                 "model.window_attn_skip_freq": 2, "model.softmax_type": "learnable",
                 "model.add_bias_linear": m.qkv_bias and m.expert_bias, "model.vocab_size": m.vocab_size}
    else:
        want |= {"model.hybrid_override_pattern": m.layer_pattern, "model.mamba_num_heads": m.mamba_heads,
                 "model.mamba_head_dim": m.mamba_head_dim, "model.mamba_state_dim": m.mamba_state,
                 "model.mamba_num_groups": m.mamba_groups, "model.ffn_hidden_size": m.ffn_hidden_size,
                 "model.num_moe_experts": m.num_experts or None,
                 "model.moe_ffn_hidden_size": m.moe_ffn_hidden_size or None,
                 "model.moe_shared_expert_intermediate_size": m.shared_expert_ffn_hidden_size or None}
    assert {k: got.get(k) for k in want} == want
    assert got["validate_error"] is None


@needs_bridge
def test_qwen3_next_preset_is_the_bridges_model(read_back: dict) -> None:
    """Qwen3-Next as the bridge's recipe trains it (its Qwen3Next bridge reading the bundled config.json, offline as
    Qwen's): Gated DeltaNet on the layers meshplan reads as linear attention (Megatron-Core's linear_attention_freq 4:
    every fourth layer attention), its heads and widths, the gated attention, the experts and the shared expert's
    gate are meshplan's reading of the same model; the plan trains no MTP, so the recipe's one MTP layer is off."""
    m, got = load_model("qwen3-next-80b-a3b"), read_back["qwen3-next"]
    every = got["model.linear_attention_freq"]
    assert m.gdn_layers == tuple(i for i in range(m.num_layers) if (i + 1) % every)
    want = {"model.experimental_attention_variant": "gated_delta_net",
            "model.linear_num_key_heads": m.gdn_key_heads, "model.linear_num_value_heads": m.gdn_value_heads,
            "model.linear_key_head_dim": m.gdn_key_head_dim, "model.linear_value_head_dim": m.gdn_value_head_dim,
            "model.linear_conv_kernel_dim": m.gdn_conv_kernel, "model.attention_output_gate": m.attn_output_gate,
            "model.num_query_groups": m.num_kv_heads, "model.kv_channels": m.head_dim,
            "model.rotary_percent": m.rotary_percent, "model.num_moe_experts": m.num_experts,
            "model.moe_router_topk": m.experts_per_token, "model.moe_ffn_hidden_size": m.moe_ffn_hidden_size,
            "model.moe_shared_expert_intermediate_size": m.shared_expert_ffn_hidden_size,
            "model.moe_shared_expert_gate": m.shared_expert_gate, "model.vocab_size": m.vocab_size,
            "model.mtp_num_layers": None}
    assert {k: got.get(k) for k in want} == want
    assert got["validate_error"] is None


@needs_bridge
def test_bridge_catches_a_mismatch(read_back: dict) -> None:
    """Dropping one override (the dataset's sequence length) leaves the recipe's 8192 beside the plan's 4096 model:
    ConfigContainer.validate refuses it."""
    error = read_back["tampered"]["validate_error"]
    assert error.startswith("AssertionError: Please ensure sequence length configuration"), error


def test_recipe_refused_by_name() -> None:
    """A model with no v0.3.1 recipe is refused in one line naming it (the CLI exits 2 on it)."""
    plan = ALL_PLANS["llama70b"]()
    odd = plan.model_copy(update={"model": plan.model.model_copy(update={"name": "Llama-odd", "num_layers": 40})})
    with pytest.raises(MeshplanError, match=r"^megatron-bridge: no .* recipe builds model 'Llama-odd'") as exc:
        render(odd, "megatron-bridge")
    assert "\n" not in str(exc.value) and exc.value.exit_code == 2


def test_lora_other_than_the_peft_recipes_is_refused_by_name() -> None:
    """The release's overrides cannot reach ``peft``: adapters other than the recipe's, or a model with no peft
    recipe (DeepSeek-V3 in v0.3.1), are refused in one line saying what the recipe trains."""
    said = r"^megatron-bridge: lora 16:qkv: .* llama31_8b_peft_config trains lora 8 "
    with pytest.raises(MeshplanError, match=said) as exc:
        render(ALL_PLANS["fsdp8b"]().model_copy(update={"lora": "16:qkv"}), "megatron-bridge")
    assert "\n" not in str(exc.value) and exc.value.exit_code == 2
    with pytest.raises(MeshplanError, match="has no peft recipe for model"):
        render(ALL_PLANS["dsv3"]().model_copy(update={"lora": "8"}), "megatron-bridge")
    warnings = render(CASES["lora-70b"](), "megatron-bridge").warnings
    assert not any("trains every weight" in w for w in warnings) and any("packs sequences" in w for w in warnings)


def test_cli_refusal_is_one_line_exit_2(runner, tmp_path: Path) -> None:
    from meshplan.cli.main import app

    plan = ALL_PLANS["llama70b"]()
    odd = plan.model_copy(update={"model": plan.model.model_copy(update={"name": "Llama-odd", "num_layers": 40})})
    path = odd.save(tmp_path / "odd.yaml")
    res = runner.invoke(app, ["export", str(path), "--to", "megatron-bridge"])
    assert res.exit_code == 2 and res.stdout == ""
    assert res.stderr.count("\n") == 1 and "megatron-bridge: no " in res.stderr and "Traceback" not in res.stderr
    ok = runner.invoke(app, ["export", str(plan.save(tmp_path / "ok.yaml")), "--to", "megatron-bridge"])
    assert ok.exit_code == 0 and ok.stdout == (GOLDEN / "llama70b.megatron-bridge.sh").read_text()


def test_same_shape_other_experts_is_refused() -> None:
    """Kimi K2 has DeepSeek-V3's layers and width but 384 experts: not DeepSeek-V3's recipe."""
    plan = ALL_PLANS["dsv3"]()
    kimi = plan.model_copy(update={"model": plan.model.model_copy(update={"name": "Kimi-K2", "num_experts": 384})})
    with pytest.raises(MeshplanError, match=r"'Kimi-K2' \(deepseek_v3, 61 layers, hidden 7168, 384 experts\)"):
        render(kimi, "megatron-bridge")


def test_megatron_constraints_named_for_the_bridge() -> None:
    """Megatron-Core's own refusals (here op-level recompute) come out under the bridge's name."""
    plan = ALL_PLANS["recompute-op"]()
    with pytest.raises(MeshplanError, match=r"^megatron-bridge: recompute=op"):
        render(plan, "megatron-bridge")


@needs_bridge
@pytest.mark.parametrize("name", FP8_ATTENTION_CASES)
def test_fp8_attention_keeps_the_preset(read_back: dict, name: str) -> None:
    """fp8 attention is written field by field on the recipe's own config (a preset's name cannot take a field
    override): what the bridge runs is the plan recipe's preset, as its registry builds it, in every field but
    fp8_dot_product_attention, which reaches the model (``_expected``), and the layers kept in bf16, the plan's."""
    plan = CASES[name]()
    preset = read_back["presets"][bridge.PRESETS[c.fp8_recipe(plan)]]["fields"]
    first, last = c.bf16_layers(plan)  # the plan's, which the tensorwise preset's 1 and 1 give way to
    assert read_back[name]["mp.fields"] == {**preset, "fp8_dot_product_attention": True,
                                            "first_last_layers_bf16": bool(first or last),
                                            "num_layers_at_start_in_bf16": first, "num_layers_at_end_in_bf16": last}


@needs_bridge
@pytest.mark.parametrize("recipe", list(bridge.PRESET_FIELDS))
def test_preset_fields_are_the_presets_own(read_back: dict, recipe: str) -> None:
    """Where the export must write a preset's fields rather than its name (fp8 attention, the plan's own bf16
    layers), each field holds the value the bridge's own preset function sets."""
    fields = read_back["presets"][bridge.PRESETS[recipe]]["fields"]
    assert {k: fields[k] for k in bridge.PRESET_FIELDS[recipe]} == bridge.PRESET_FIELDS[recipe]


def test_turning_the_tensorwise_presets_bf16_layers_off_is_said() -> None:
    """A tensor-wise plan priced with every layer in fp8 exports the preset with its 1 and 1 off, and says so."""
    warned = render(ALL_PLANS["fp8-tensorwise"](), "megatron-bridge").warnings
    assert any("bf16_with_fp8_current_scaling_mixed keeps the first 1 and last 1" in w for w in warned)
    assert not any("keeps the first" in w for w in render(ALL_PLANS["bf16-layers-tensorwise"](),
                                                          "megatron-bridge").warnings)


@needs_bridge
def test_library_profile_keeps_the_tensorwise_presets_bf16_layers(read_back: dict) -> None:
    """The megatron-bridge@26.02.01 profile (v0.3.1, the installed package) keeps as many layers in bf16 under
    tensor-wise fp8 as the package's own preset does, and the plan exported with them names the preset."""
    from meshplan.planner.layout.stacks import load_stacks

    fields = read_back["presets"]["bf16_with_fp8_current_scaling_mixed"]["fields"]
    got = load_stacks().get("megatron-bridge@26.02.01").defaults("fp8", False)
    assert fields["first_last_layers_bf16"]
    assert (int(got["bf16_first_layers"]), int(got["bf16_last_layers"])) == (
        fields["num_layers_at_start_in_bf16"], fields["num_layers_at_end_in_bf16"])
    assert read_back["bf16-layers-tensorwise"]["mixed_precision"] == "bf16_with_fp8_current_scaling_mixed"


@needs_bridge
@pytest.mark.parametrize("recipe", list(bridge.PRESETS))
def test_precision_presets(read_back: dict, recipe: str) -> None:
    """Each low-precision recipe's preset, as the bridge's own registry builds it (get_mixed_precision_config)."""
    want = {"none": (None, None), "delayed": ("hybrid", "delayed"), "tensorwise": ("hybrid", "tensorwise"),
            "blockwise": ("hybrid", "blockwise"), "mxfp8": ("e4m3", "mxfp8"), "nvfp4": (None, None)}[recipe]
    preset = read_back["presets"][bridge.PRESETS[recipe]]
    assert (preset["fp8"], preset["fp8"] and preset["fp8_recipe"]) == want
    assert preset["bf16"] and preset["fp4"] == ("e2m1" if recipe == "nvfp4" else None)
    if recipe == "nvfp4":
        assert preset["fp4_recipe"] == "nvfp4"


def test_a_dropless_full_iteration_graph_is_refused_at_its_release() -> None:
    """Megatron-Core 0.16.1 (the bridge release's) sizes Hybrid-EP's dropless output on the host, inside what the
    full-iteration graph would capture: refused in one line naming the decision and the field that lifts it in
    later releases; token dropping (fixed sizes) still exports."""
    with pytest.raises(MeshplanError, match=r"^megatron-bridge: cuda_graphs=iteration on a dropless MoE model: .*"
                                            r"moe_expert_rank_capacity_factor"):
        render(plan_qwen3_moe(cuda_graphs="iteration", moe_dispatcher="hybridep", hybridep_sms=32), "megatron-bridge")
    assert "full_iteration" in render(plan_qwen3_moe(cuda_graphs="iteration", moe_capacity=1.0), "megatron-bridge").text
