"""Megatron-Bridge launch script: a recipe of ``scripts/training/run_recipe.py`` and Hydra overrides on its config.

The entry point and the override form are NVIDIA-NeMo/Megatron-Bridge v0.3.1's (the ``megatron-bridge==0.3.1`` wheel):
``torchrun ... run_recipe.py --recipe <name>_pretrain_config key=value ...`` builds the recipe's ``ConfigContainer``,
then ``training.utils.omegaconf_utils.process_config_with_overrides`` applies every ``section.field=value`` word
(Hydra's own override grammar) onto it and ``pretrain`` runs it. The recipe carries the model: its
``GPTModelProvider`` comes from the model's HF config (``AutoBridge.from_hf_pretrained``), so the model shape is
the recipe's and only the plan's decisions are written. A model without a v0.3.1 recipe is refused by name (export
it to ``megatron`` instead).

Field names are those of megatron-core 0.16.1's ``TransformerConfig`` / ``ModelParallelConfig`` (``model.*``, the
provider inherits them), megatron-core's ``DistributedDataParallelConfig`` (``ddp.*``) and ``OptimizerConfig``
(``optimizer.*``), and the bridge's ``TrainingConfig`` (``train.*``), ``GPTDatasetConfig`` (``dataset.*``: its
length is ``sequence_length``), ``CheckpointConfig``, ``CommOverlapConfig`` and the named presets of
``training/mixed_precision.py``. The checks are Megatron-Core's own (``megatron.check``): the bridge builds the same
``TransformerConfig``. The p2p and TP overlap are written where the recipe's setup reads them: on
``comm_overlap`` when the recipe has a ``CommOverlapConfig`` (its ``setup`` overwrites the model's flags), else on
the model. Precision is a whole preset (``mixed_precision=<name>``: a recipe holds either a name or a config, and
only a name replaces both); the mxfp8 preset also gathers parameters in MXFP8 (``fp8_param_gather``), as
Transformer Engine's MXFP8 recipe is meant to run. Everything else the recipe sets (optimizer, schedule, data,
logging, kernels) is the user's: extra ``key=value`` words after the script's name override it. The full-iteration
CUDA graph on a dropless MoE model is refused: this release's Hybrid-EP sizes its output on the host.

A LoRA plan runs the model's fine-tuning recipe (``<name>_peft_config``, ``--peft_scheme lora``: ``run_recipe.py``
then calls ``finetune``) from the base model's checkpoint (``$PRETRAINED_CHECKPOINT``, which ``ConfigContainer``
requires for PEFT). That release's overrides cannot reach ``peft`` (``create_omegaconf_dict_config`` leaves it out of
the tree they edit), so the plan's adapters must be the recipe's own, as the ``megatron-bridge@26.02.01`` profile
(the same release) reads them; other adapters are refused by name. The recipe packs sequences
(``dataset.packed_sequence_specs``), written at the plan's length, which takes micro-batch 1; at a larger one the
packing is turned off (each sample padded to the plan's length).
"""
from __future__ import annotations

from dataclasses import dataclass

from meshplan.core.errors import MeshplanError
from meshplan.planner.export import _common as c
from meshplan.planner.export import megatron, torchrun
from meshplan.planner.layout.layout import fsdp_impl
from meshplan.planner.layout.stacks import load_stacks
from meshplan.planner.plan.schema import Plan

EXTENSION = "sh"
ENTRY = "run_recipe.py"
SOURCE = "NVIDIA-NeMo/Megatron-Bridge v0.3.1"
PROFILE = "megatron-bridge@26.02.01"  # the stack profile of that release: the adapters its peft recipes train


@dataclass(frozen=True)
class Recipe:
    """A v0.3.1 pretraining recipe: its function in ``megatron.bridge.recipes``, the HF model it loads (or the
    provider class it builds the model from, ``provider``), whether it sets a ``CommOverlapConfig``
    (``cfg.comm_overlap``; None otherwise) and whether it turns on multi-token prediction (``model.mtp_num_layers``),
    which the override sets to the plan's ``mtp`` (None when the plan has none)."""

    name: str
    hf_model: str
    comm_overlap: bool
    mtp: bool = False
    preset: str = ""
    """The bundled model (``meshplan models``) of the recipe's shapes, whose LoRA the profile names; "": the recipe
    has no peft variant in that release."""
    peft_comm_overlap: bool = False
    """Whether its peft variant sets a ``CommOverlapConfig`` (of v0.3.1's, only the 405B's: tp_comm_overlap off)."""
    provider: str = ""
    """The provider class in ``megatron.bridge.models`` the recipe builds its model from, reading no HF config;
    "": it reads ``hf_model``'s."""


# (model_type, num_layers, hidden_size, num_experts) -> recipe; from recipes/llama/llama3.py, recipes/qwen/qwen2.py,
# qwen3.py, qwen3_moe.py, qwen3_next.py (which sets mtp_num_layers 1: the override sets the plan's),
# recipes/deepseek/deepseek_v3.py, recipes/glm/glm45.py, recipes/gemma/gemma2.py and recipes/gpt_oss/gpt_oss.py of
# v0.3.1 (the HF id each passes to AutoBridge.from_hf_pretrained), and recipes/gemma/gemma3.py and
# recipes/nemotronh/{nemotronh,nemotron_3_nano}.py, which build their models from provider classes (the HF id: the
# checkpoint their sft recipes' tokenizer or HF path names). Same-shaped releases take the newer recipe (Llama 3 -> 3.1,
# Qwen2 -> Qwen2.5). Not here: Kimi K2 (deepseek_v3 with 384 experts; its recipe trains with Muon, which no plan
# prices), Mixtral and Mistral (no v0.3.1 recipe).
RECIPES: dict[tuple[str, int, int, int], Recipe] = {
    ("llama", 32, 4096, 0): Recipe("llama31_8b_pretrain_config", "meta-llama/Meta-Llama-3.1-8B", False,
                                   preset="llama-3.1-8b-instruct"),
    ("llama", 80, 8192, 0): Recipe("llama31_70b_pretrain_config", "meta-llama/Meta-Llama-3.1-70B", True,
                                   preset="llama-3.1-70b-instruct"),
    ("llama", 126, 16384, 0): Recipe("llama31_405b_pretrain_config", "meta-llama/Meta-Llama-3.1-405B", True,
                                     preset="llama-3.1-405b", peft_comm_overlap=True),
    ("qwen2", 28, 3584, 0): Recipe("qwen25_7b_pretrain_config", "Qwen/Qwen2.5-7B", False, preset="qwen2.5-7b"),
    ("qwen3", 36, 4096, 0): Recipe("qwen3_8b_pretrain_config", "Qwen/Qwen3-8B", False, preset="qwen3-8b"),
    ("qwen3_moe", 48, 2048, 128): Recipe("qwen3_30b_a3b_pretrain_config", "Qwen/Qwen3-30B-A3B", False,
                                         preset="qwen3-30b-a3b"),
    ("qwen3_moe", 94, 4096, 128): Recipe("qwen3_235b_a22b_pretrain_config", "Qwen/Qwen3-235B-A22B", False,
                                         preset="qwen3-235b-a22b"),
    ("qwen3_next", 48, 2048, 512): Recipe("qwen3_next_80b_a3b_pretrain_config", "Qwen/Qwen3-Next-80B-A3B-Instruct",
                                          False, mtp=True, preset="qwen3-next-80b-a3b"),
    ("deepseek_v3", 61, 7168, 256): Recipe("deepseek_v3_pretrain_config", "deepseek-ai/DeepSeek-V3", True, mtp=True),
    ("glm4_moe", 92, 5120, 160): Recipe("glm45_355b_pretrain_config", "zai-org/GLM-4.5", False, mtp=True,
                                        preset="glm-4.5"),
    ("glm4_moe", 46, 4096, 128): Recipe("glm45_air_106b_pretrain_config", "zai-org/GLM-4.5-Air", False, mtp=True,
                                        preset="glm-4.5-air"),
    ("gemma2", 26, 2304, 0): Recipe("gemma2_2b_pretrain_config", "google/gemma-2-2b", False, preset="gemma-2-2b"),
    ("gemma2", 42, 3584, 0): Recipe("gemma2_9b_pretrain_config", "google/gemma-2-9b", False, preset="gemma-2-9b"),
    ("gemma2", 46, 4608, 0): Recipe("gemma2_27b_pretrain_config", "google/gemma-2-27b", False, preset="gemma-2-27b"),
    ("gemma3_text", 26, 1152, 0): Recipe("gemma3_1b_pretrain_config", "google/gemma-3-1b-pt", False,
                                         preset="gemma-3-1b", provider="Gemma3ModelProvider1B"),
    ("gpt_oss", 24, 2880, 32): Recipe("gpt_oss_20b_pretrain_config", "openai/gpt-oss-20b", False,
                                      preset="gpt-oss-20b"),
    ("gpt_oss", 36, 2880, 128): Recipe("gpt_oss_120b_pretrain_config", "openai/gpt-oss-120b", False,
                                       preset="gpt-oss-120b"),
    ("nemotron_h", 52, 4096, 0): Recipe("nemotronh_8b_pretrain_config", "nvidia/Nemotron-H-8B-Base-8K", True,
                                        preset="nemotron-h-8b", provider="NemotronHModelProvider8B"),
    ("nemotron_h", 118, 8192, 0): Recipe("nemotronh_56b_pretrain_config", "nvidia/Nemotron-H-56B-Base-8K", True,
                                         preset="nemotron-h-56b", provider="NemotronHModelProvider56B"),
    ("nemotron_h", 52, 2688, 128): Recipe("nemotron_3_nano_pretrain_config",
                                          "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", True,
                                          preset="nemotron-3-nano-30b-a3b", provider="Nemotron3NanoProvider"),
}

# plan low-precision recipe -> the bridge's mixed-precision preset (training/mixed_precision.py, bf16 base):
# "tensorwise" is TE's current scaling, "blockwise" its sub-channel (1x128 / 128x128) scaling.
PRESETS = {"none": "bf16_mixed", "delayed": "bf16_with_fp8_delayed_scaling_mixed",
           "tensorwise": "bf16_with_fp8_current_scaling_mixed", "blockwise": "bf16_with_fp8_subchannel_scaling_mixed",
           "mxfp8": "bf16_with_mxfp8_mixed", "nvfp4": "bf16_with_nvfp4_mixed"}

# The fields each preset above sets beyond the recipes' own bf16 config (v0.3.1 training/mixed_precision.py: the
# preset functions over bf16_mixed()), for the recipes fp8 attention runs under. A preset name is a string the
# overrides cannot reach into, and the preset overwrites the model's fp8_dot_product_attention
# (MixedPrecisionConfig.setup), so fp8 attention is written as these fields on the recipe's own config, plus
# mixed_precision.fp8_dot_product_attention=true (tests/test_export_bridge.py checks them against the preset).
PRESET_FIELDS = {
    "delayed": {"fp8": "hybrid", "fp8_recipe": "delayed", "fp8_amax_history_len": 1024, "fp8_amax_compute_algo": "max",
                "fp8_param_gather": True},
    "tensorwise": {"fp8": "hybrid", "fp8_recipe": "tensorwise", "first_last_layers_bf16": True,
                   "num_layers_at_start_in_bf16": 1, "num_layers_at_end_in_bf16": 1, "fp8_param_gather": True},
    "blockwise": {"fp8": "hybrid", "fp8_recipe": "blockwise", "fp8_param_gather": False},
    "mxfp8": {"fp8": "e4m3", "fp8_recipe": "mxfp8", "fp8_param_gather": True,
              "reuse_grad_buf_for_mxfp8_param_ag": True},
    "nvfp4": {"fp8": None, "fp4": "e2m1", "fp4_recipe": "nvfp4", "fp8_param_gather": False},
}
FP8_ATTENTION = ("delayed", "tensorwise", "mxfp8")  # the presets Transformer Engine runs fp8 attention under


def _preset_bf16_layers(recipe: str) -> tuple[int, int]:
    """(start, end) decoder layers the recipe's preset keeps in bf16 (its ``first_last_layers_bf16``)."""
    f = PRESET_FIELDS.get(recipe, {})
    if not f.get("first_last_layers_bf16"):
        return 0, 0
    return f["num_layers_at_start_in_bf16"], f["num_layers_at_end_in_bf16"]


def precision_overrides(plan: Plan) -> dict[str, object]:
    """The mixed-precision preset by name where it runs the plan as priced; else its fields on the recipe's own
    config (``PRESET_FIELDS``), with fp8_dot_product_attention for fp8 attention and the plan's bf16 layers
    (``bf16_first_layers`` / ``bf16_last_layers``: the tensorwise preset keeps 1 and 1, which a plan priced
    without them must turn off)."""
    recipe = c.fp8_recipe(plan)
    layers = c.bf16_layers(plan)
    if plan.attention_dtype != "fp8" and layers == _preset_bf16_layers(recipe):
        return {"mixed_precision": PRESETS[recipe]}
    if plan.attention_dtype == "fp8" and recipe not in FP8_ATTENTION:
        c.fail(f"megatron-bridge: attention_dtype=fp8 with fp8 recipe {recipe}: Transformer Engine runs fp8 attention "
               "under tensorwise, delayed or mxfp8 scaling")
    fields = dict(PRESET_FIELDS[recipe])
    if plan.attention_dtype == "fp8":
        fields["fp8_dot_product_attention"] = True
    if layers != _preset_bf16_layers(recipe):
        fields.update(first_last_layers_bf16=any(layers), num_layers_at_start_in_bf16=layers[0],
                      num_layers_at_end_in_bf16=layers[1])
    return {f"mixed_precision.{k}": v for k, v in fields.items()}


def recipe_of(plan: Plan) -> Recipe:
    """The recipe that builds the plan's model, or ``MeshplanError`` naming the model and the recipes there are."""
    m = plan.model
    found = RECIPES.get((m.model_type, m.num_layers, m.hidden_size, m.num_experts))
    if found is None:
        known = ", ".join(r.name for r in RECIPES.values())
        experts = f", {m.num_experts} experts" if m.num_experts else ""
        c.fail(f"megatron-bridge: no {SOURCE} pretraining recipe builds model {m.name!r} ({m.model_type}, "
               f"{m.num_layers} layers, hidden {m.hidden_size}{experts}); recipes: {known} (export to megatron "
               "instead)")
    if plan.lora:
        if not found.preset:
            c.fail(f"megatron-bridge: lora {plan.lora}: {SOURCE} has no peft recipe for model {m.name!r} (only "
                   f"{found.name}); export to megatron, which names what it cannot train")
        return Recipe(found.name.replace("_pretrain_config", "_peft_config"), found.hf_model,
                      found.peft_comm_overlap, preset=found.preset)
    return found


def _lora_parts(text: str) -> tuple[str, frozenset]:
    """(rank, modules) of a ``--lora`` text (``RANK[:MODULES]``, all four linears when it names none)."""
    rank, _, mods = text.partition(":")
    return rank, frozenset(mods.split("+") if mods else ("qkv", "proj", "fc1", "fc2"))


def check_lora(plan: Plan, recipe: Recipe) -> None:
    """The plan's adapters are those the peft recipe trains (``PROFILE``'s LoRA for its model), the only ones the
    release's overrides can run."""
    own = load_stacks().get(PROFILE).lora_default(recipe.preset)
    if own is not None and _lora_parts(own.value) == _lora_parts(plan.lora):
        return
    said = f"trains lora {own.value} ({own.source})" if own else "is not in the profile"
    c.fail(f"megatron-bridge: lora {plan.lora}: the {SOURCE} recipe {recipe.name} {said}, and its overrides cannot "
           f"reach peft; re-plan with --task lora --stack {PROFILE}, or export to megatron")


def _renamed(message: str) -> str:
    return "megatron-bridge:" + message[len("megatron:"):] if message.startswith("megatron:") else message


def check(plan: Plan) -> None:
    """Megatron-Core's constraints (the bridge builds the same ``TransformerConfig``), the fp32 workload (no fp32
    preset), and a recipe for the model."""
    try:
        megatron.check(plan, flags=False)
    except MeshplanError as exc:
        raise MeshplanError(_renamed(str(exc)), exc.exit_code) from None
    if c.dtype_of(plan) == "fp32":
        c.fail(f"megatron-bridge: dtype={plan.dtype}: the bridge's mixed-precision presets train in bf16 or fp16 "
               "(training/mixed_precision.py); re-plan with --dtype bf16")
    if plan.cuda_graphs == "iteration" and plan.model.num_experts and not plan.moe_capacity:
        # megatron-core 0.16.1 token_dispatcher.py _HybridEPManager.dispatch: dropless, hybrid_ep_dispatch sizes its
        # output on the host (num_permuted_tokens None, then tokens_per_expert.sum()); core_v0.18.0 adds
        # moe_expert_rank_capacity_factor, a static budget that lifts the sync, which Megatron-Bridge v0.5.0's
        # performance recipes set (1.5) beside the full-iteration graph
        c.fail("megatron-bridge: cuda_graphs=iteration on a dropless MoE model: Hybrid-EP sizes its buffers on the "
               f"host in the Megatron-Core of {SOURCE}, a sync the graph cannot capture; Megatron-Core >= 0.18 "
               "lifts it with model.moe_expert_rank_capacity_factor (Megatron-Bridge >= v0.5.0's performance "
               "recipes set 1.5), or re-plan with cuda_graphs=layers or token dropping (moe_capacity)")
    if plan.moe_fused_mlp:
        c.fail("megatron-bridge: moe_fused_mlp: the fused grouped MLP needs model.moe_mlp_glu_interleave_size=32, a "
               f"field the Megatron-Core of {SOURCE} has not; Megatron-Bridge >= v0.5.0 runs it "
               "(model.use_transformer_engine_op_fuser=true, model.moe_mlp_glu_interleave_size=32, "
               "NVTE_CUTEDSL_FUSED_GROUPED_MLP=1), or export --to megatron")
    recipe = recipe_of(plan)
    if plan.lora:
        check_lora(plan, recipe)


# Megatron-LM notes about flags the recipe's model already carries (rope, router, expert width from the HF config).
_MODEL_NOTES = ("rope_theta", "RoPE scaling", "router details", "expert FFN width", "sliding window",
                "hybrid layer pattern", "MTP modules (their own")


def _torch_fsdp(plan: Plan) -> bool:
    """ZeRO-3 priced as torch FSDP2: the bridge runs it (``dist.use_torch_fsdp2``), Megatron-LM's export cannot."""
    return megatron._uses_fsdp(plan) and plan.zero_stage == 3 and fsdp_impl(plan.fsdp, plan.stack) == "torch"


def unsupported(plan: Plan) -> list[str]:
    """Megatron-LM's notes (the same Megatron-Core runs), less those about the model, which the recipe builds (the
    load-balancing loss's coefficient with it: the model bridge sets it), and the FSDP2 and Hybrid-EP SM ones, which
    the bridge carries."""
    skip = _MODEL_NOTES + ("hybridep_sms=", "moe_aux_loss=", f"lora {plan.lora}:") + (
        ("fsdp=torch:",) if _torch_fsdp(plan) else ())
    out = [_renamed(n) for n in megatron.unsupported(plan) if not any(k in n for k in skip)]
    if plan.lora and plan.micro_batch == 1:
        out.append(f"megatron-bridge: lora {plan.lora}: the peft recipe packs sequences of {plan.seq_len} tokens, "
                   "each document attending within itself; the plan priced causal attention over the whole sequence")
    elif plan.lora:
        out.append(f"megatron-bridge: lora {plan.lora}: micro-batch {plan.micro_batch} turns the peft recipe's "
                   "sequence packing off (it takes micro-batch 1): each sample is padded to the plan's length")
    if plan.grad_dtype == "bf16" or plan.reduce_dtype == "bf16" or "bf16" in c.compression_methods(plan):
        out.append("megatron-bridge: bf16 gradient reduction: the mixed-precision presets reduce in fp32 "
                   "(MixedPrecisionConfig.grad_reduce_in_fp32); the plan priced bf16")
    recipe = c.fp8_recipe(plan)
    if _preset_bf16_layers(recipe) != (0, 0) and c.bf16_layers(plan) != _preset_bf16_layers(recipe):
        first, last = _preset_bf16_layers(recipe)
        out.append(f"megatron-bridge: fp8 recipe {recipe}: the preset {PRESETS[recipe]} keeps the first {first} and "
                   f"last {last} decoder layers in bf16; the plan priced bf16_first_layers={plan.bf16_first_layers}, "
                   f"bf16_last_layers={plan.bf16_last_layers}, so the script writes the preset's fields with the "
                   "plan's counts (re-plan with --stack megatron-bridge, whose profile keeps the preset's, to run it "
                   "as the library does)")
    return out


def _value(v: object) -> str:
    """A Hydra override value: ``true`` / ``false`` / ``null``, numbers as they are, lists as ``[a,b]``, strings
    quoted when they hold grammar characters (Hydra's ``OverridesParser``)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):  # Hydra's list syntax (recompute_modules)
        return "[" + ",".join(map(_value, v)) + "]"
    text = str(v)
    return f'"{text}"' if any(ch in text for ch in "|*[]{}(),= '\"") else text


def parallel_overrides(plan: Plan) -> dict[str, object]:
    """Degrees, pipeline split, batch and sequence length."""
    d, m = plan.degrees, plan.model
    o: dict[str, object] = {
        "model.tensor_model_parallel_size": d.tp, "model.pipeline_model_parallel_size": d.pp,
        "model.virtual_pipeline_model_parallel_size": d.vpp if d.vpp > 1 else None,
        "model.pipeline_model_parallel_layout": None if c.layers_evenly_split(plan) else megatron._layout(plan),
        "model.context_parallel_size": d.cp, "model.sequence_parallel": plan.sequence_parallel}
    if d.cp > 1:
        o["model.cp_comm_type"] = megatron.CP_COMM_TYPE[plan.cp_kind]
    if m.num_experts:
        o["model.expert_model_parallel_size"] = d.ep
        o["model.expert_tensor_parallel_size"] = c.expert_tp(plan)
    o["model.seq_length"] = plan.seq_len
    if plan.lora:  # the peft recipes' HFDatasetConfig: its length, and the packed sequences it builds, which
        # take micro-batch 1 (finetune's check: "Micro batch size should be 1 when training with packed sequence")
        o["dataset.seq_length"] = plan.seq_len
        if plan.micro_batch == 1:
            o["dataset.packed_sequence_specs.packed_sequence_size"] = plan.seq_len
        else:
            o["dataset.packed_sequence_specs"] = None
    else:
        o["dataset.sequence_length"] = plan.seq_len
    o.update({"train.micro_batch_size": plan.micro_batch, "train.global_batch_size": plan.global_batch})
    return o


def recompute_overrides(plan: Plan) -> dict[str, object]:
    """``recompute``: full = every layer (uniform, 1 per group), full:N = the first N layers of every stage (block),
    selective = the plan's ``recompute_modules`` (TransformerConfig's default, core attention, when it names none),
    none = null; ``offload_layers`` (only without recomputation: megatron.check) as ``cpu_offloading`` /
    ``cpu_offloading_num_layers``."""
    n = c.recompute_layers(plan)
    if plan.recompute == "full":
        return {"model.recompute_granularity": "full", "model.recompute_method": "uniform",
                "model.recompute_num_layers": 1}
    if n:
        return {"model.recompute_granularity": "full", "model.recompute_method": "block",
                "model.recompute_num_layers": n}
    granularity = "selective" if plan.recompute == "selective" else None
    o: dict[str, object] = {"model.recompute_granularity": granularity, "model.recompute_method": None,
                            "model.recompute_num_layers": None}
    if granularity and plan.recompute_modules:
        o["model.recompute_modules"] = plan.recompute_modules.split("+")
    if plan.offload_layers:  # the perf recipes' cpu_offloading_num_layers (megatron-core ModelParallelConfig)
        o.update({"model.cpu_offloading": True, "model.cpu_offloading_num_layers": plan.offload_layers})
    return o


def optimizer_overrides(plan: Plan) -> dict[str, object]:
    """ZeRO: 1 = the distributed optimizer (ddp and optimizer both, the bridge checks they agree), 2/3 = Megatron-FSDP
    (its checkpoint format) or, where the plan priced FSDP2 for ZeRO-3, torch FSDP2; HSDP-like instances over
    dp_replicate; the precision-aware optimizer for remainder."""
    d = plan.degrees
    sharded = plan.zero_stage >= 1 and megatron._shards_over(plan) > 1
    torch_fsdp = _torch_fsdp(plan)
    fsdp = megatron._uses_fsdp(plan) and not torch_fsdp
    dist_opt = sharded and not fsdp and not torch_fsdp
    o: dict[str, object] = {
        "ddp.use_distributed_optimizer": dist_opt, "optimizer.use_distributed_optimizer": dist_opt,
        "ddp.use_megatron_fsdp": fsdp, "dist.use_torch_fsdp2": torch_fsdp,
        "ddp.data_parallel_sharding_strategy": ("optim_grads_params" if plan.zero_stage == 3 else "optim_grads")
        if fsdp else "no_shard",
        "checkpoint.ckpt_format": "fsdp_dtensor" if fsdp else "torch_dist",
        "ddp.overlap_grad_reduce": d.dp > 1, "ddp.overlap_param_gather": sharded,
        "ddp.num_distributed_optimizer_instances": d.dp_replicate if sharded and d.dp_shard > 1 else 1,
        "optimizer.use_precision_aware_optimizer": plan.optim_dtype == "remainder"}
    return o


def moe_overrides(plan: Plan) -> dict[str, object]:
    """Dispatcher (DeepEP = the flex dispatcher's deepep backend; Hybrid-EP with its SMs), EP all-to-all overlap,
    shared-expert overlap, the router's fused top-k, its load-balancing loss's type and token dropping (capacity
    factor, padded to it, dropping by probability as the plan prices it)."""
    if not plan.model.num_experts:
        return {}
    flex = plan.moe_dispatcher in ("deepep", "hybridep")
    o: dict[str, object] = {
        "model.moe_token_dispatcher_type": "flex" if flex else "alltoall",
        "model.moe_flex_dispatcher_backend": plan.moe_dispatcher if flex else None,
        "model.overlap_moe_expert_parallel_comm": plan.moe_overlap,
        "model.moe_shared_expert_overlap": plan.shared_overlap and bool(plan.model.num_shared_experts),
        "model.moe_router_fusion": plan.moe_router_fusion,
        "model.moe_expert_capacity_factor": plan.moe_capacity or None,
        "model.moe_pad_expert_input_to_capacity": bool(plan.moe_capacity)}
    if plan.moe_dispatcher == "hybridep":  # another dispatcher keeps the library's own field
        o["model.moe_hybridep_num_sms"] = plan.hybridep_sms
    if plan.moe_aux_loss != "none":  # the coefficient stays the model bridge's (or the user's)
        o["model.moe_router_load_balancing_type"] = plan.moe_aux_loss
    if plan.moe_capacity:
        o["model.moe_token_drop_policy"] = "probs"
    return o


def graph_overrides(plan: Plan) -> dict[str, object]:
    """CUDA graphs, where the plan captures them (the recipes set ``cuda_graph_impl = "none"``)."""
    if plan.cuda_graphs == "none":
        return {}
    impl, scope = c.cuda_graph_scope(plan)
    # GPTModelProvider.provide asserts Transformer Engine's RNG tracker under CUDA graphs (the bridge's CUDA-graph
    # guide sets both: cfg.model.use_te_rng_tracker = True; cfg.rng.te_rng_tracker = True)
    o: dict[str, object] = {"model.cuda_graph_impl": impl, "model.cuda_graph_scope": scope,
                            "model.use_te_rng_tracker": True, "rng.te_rng_tracker": True}
    if plan.cuda_graphs == "iteration":  # ConfigContainer.validate: "check_for_nan_in_loss must be disabled when
        # using full_iteration CUDA graph"; the bridge's CUDA-graph guide turns the gradient check off with it
        o.update({"rerun_state_machine.check_for_nan_in_loss": False, "ddp.check_for_nan_in_grad": False})
    return o


def overlap_overrides(plan: Plan, recipe: Recipe) -> dict[str, object]:
    """TP overlap and the interleaved pipeline's p2p overlap, on the recipe's ``CommOverlapConfig`` when it has one
    (its ``setup`` writes them onto the model), else on the model."""
    where = "comm_overlap" if recipe.comm_overlap else "model"
    o: dict[str, object] = {f"{where}.tp_comm_overlap": plan.tp_overlap}
    if plan.degrees.vpp > 1:
        o[f"{where}.overlap_p2p_comm"] = not megatron._sends_in_line(plan)
    if recipe.comm_overlap and plan.model.num_experts:
        o["comm_overlap.overlap_moe_expert_parallel_comm"] = plan.moe_overlap
    return o


def overrides(plan: Plan) -> list[str]:
    """Every override word, ``section.field=value``, in the order the sections above are written."""
    recipe = recipe_of(plan)
    o = {**parallel_overrides(plan), **recompute_overrides(plan), **optimizer_overrides(plan),
         **precision_overrides(plan), **moe_overrides(plan), **graph_overrides(plan), **overlap_overrides(plan, recipe)}
    if recipe.mtp or plan.mtp:  # "Set to 0 or None to disable MTP" (recipes/deepseek/deepseek_v3.py)
        o["model.mtp_num_layers"] = plan.mtp or None
    return [f"{k}={_value(v)}" for k, v in o.items()]


def render(plan: Plan) -> str:
    """A bash script: the recipe, one array of Hydra overrides, and the torchrun line."""
    recipe = recipe_of(plan)
    lines = ["#!/bin/bash"] + [f"# {h}" for h in c.header(plan, "Megatron-Bridge", SOURCE)]
    model = (f"its provider class {recipe.provider}" if recipe.provider else f"{recipe.hf_model}'s HF config")
    lines.append(f"# recipe {recipe.name}: the model from {model}; "
                 f"{ENTRY} is scripts/training/{ENTRY} of the bridge's repository ($BRIDGE_ENTRY)")
    lines.append("# Extra overrides (data, optimizer, train.train_iters ...) are passed through: "
                 "./this.sh train.train_iters=1000 optimizer.lr=3e-4")
    lines += torchrun.preamble(plan)
    if (plan.degrees.tp > 1 or plan.degrees.cp > 1) and not megatron._uses_fsdp(plan):
        lines.append("export CUDA_DEVICE_MAX_CONNECTIONS=1")  # as Megatron-LM's validate_args asks (megatron.py)
    lines.append(f"RECIPE={recipe.name}")
    lines.append("OVERRIDES=(\n  " + "\n  ".join(c.quote(w) for w in overrides(plan)) + "\n)")
    peft: list[str] = []
    if plan.lora:  # LoRA fine-tunes the base model's checkpoint (ConfigContainer.validate requires one for PEFT)
        lines.append('OVERRIDES+=("checkpoint.pretrained_checkpoint=${PRETRAINED_CHECKPOINT:?set PRETRAINED_CHECKPOINT '
                     'to the Megatron checkpoint of the base model}")')
        peft = ["--peft_scheme", "lora"]
    launch = (["torchrun"] + torchrun.launcher_args(plan)
              + [f'"${{BRIDGE_ENTRY:-{ENTRY}}}"', "--recipe", '"$RECIPE"', *peft, '"${OVERRIDES[@]}"', '"$@"'])
    lines.append(c.bash_lines(launch))
    return "\n".join(lines) + "\n"
