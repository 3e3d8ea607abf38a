"""Hugging Face Accelerate config YAML (``accelerate launch --config_file``).

Keys: huggingface/accelerate @ 16cb6eb80dd9 / PyPI accelerate 1.15.0 (``commands/config/config_args.py``
``ClusterConfig``, ``commands/launch.py`` ``launch_command_parser`` / ``_validate_launch_command``,
``parallelism_config.py``), as recorded in shared/notes/exports.md (e).

Which ``distributed_type`` a plan becomes:

* pp > 1, vpp > 1 or ep > 1 -> ``MEGATRON_LM`` (the only Accelerate backend with pipeline / expert parallelism);
* tp > 1 or cp > 1, or FSDP (zero 3) -> ``FSDP`` v2 + ``parallelism_config`` (``--use_parallelism_config`` is only
  accepted with FSDP2);
* ZeRO-1/2 over plain data parallelism -> ``DEEPSPEED`` with an inline ``deepspeed_config``;
* otherwise ``MULTI_GPU`` (DDP), or ``NO`` on one device.

Further decisions: the fp8 recipe -> ``fp8_config`` backend TE (delayed scaling, Accelerate's ``TERecipeKwargs``)
or AO (torchao float8, tensorwise); blockwise and mxfp8 refused (no config key). ``cp_kind`` -> FSDP2's
``parallelism_config_cp_comm_strategy`` (ring = torch's ``alltoall`` rotation). ``etp`` and ``recompute full:N`` ->
the Megatron-LM plugin's expert-TP and block recompute keys. The rest is named as not carried.
"""
from __future__ import annotations

import yaml

from meshplan.planner.export import _common as c
from meshplan.planner.export import placement
from meshplan.planner.plan.schema import Plan

EXTENSION = "yaml"
MIXED_PRECISION = {"bf16": "bf16", "fp16": "fp16", "fp32": "no", "fp8": "fp8"}
# plan fp8 recipe -> fp8_config (Accelerate's TE backend builds DelayedScaling; AO is torchao's tensorwise float8)
FP8_CONFIG = {"delayed": {"backend": "TE", "fp8_format": "HYBRID", "amax_history_len": 1024,
                          "amax_compute_algo": "max"},
              "tensorwise": {"backend": "AO"}}
# plan cp_kind -> parallelism_config_cp_comm_strategy (torch context parallel rotation)
CP_COMM = {"ring": "alltoall", "allgather": "allgather"}


def mixed_precision(plan: Plan) -> str:
    """``mixed_precision``: fp8 whenever the plan runs its GEMMs in fp8, else the plan's dtype."""
    return "fp8" if c.fp8_recipe(plan) != "none" else MIXED_PRECISION[c.dtype_of(plan)]


def distributed_type(plan: Plan) -> str:
    """The Accelerate backend the plan needs (see module docstring)."""
    d = plan.degrees
    if d.pp > 1 or d.vpp > 1 or d.ep > 1:
        return "MEGATRON_LM"
    if d.tp > 1 or d.cp > 1 or plan.zero_stage == 3:
        return "FSDP"
    if plan.zero_stage in (1, 2) and d.dp > 1:
        return "DEEPSPEED"
    return "MULTI_GPU" if d.world_size > 1 else "NO"


def check(plan: Plan) -> None:
    """Accelerate's constraints (exports.md, "What meshplan should check", item 4)."""
    c.check_plan(plan)
    c.refuse_fp8_attention(plan, "accelerate", "its fp8 recipes (TE, torchao, MS-AMP) quantize linear layers, "
                           "not attention")
    placement.refuse(plan, "accelerate")
    d = plan.degrees
    kind = distributed_type(plan)
    if kind == "FSDP":
        prod = d.dp_replicate * d.dp_shard * d.tp * d.cp
        if prod != plan.cluster.world_size:
            c.fail(f"accelerate: parallelism_config dp_replicate*dp_shard*tp*cp = {prod} != num_processes "
                   f"{plan.cluster.world_size}")
    recipe = c.fp8_recipe(plan)
    if recipe != "none" and recipe not in FP8_CONFIG:
        c.fail(f"accelerate: fp8 recipe {recipe} has no fp8_config key (backends TE: delayed scaling, AO: "
               "tensorwise); re-plan with --dtype fp8 --fix fp8=delayed or tensorwise, or export to megatron")
    if kind == "MEGATRON_LM":
        if plan.model.num_layers % d.pp:
            c.fail(f"accelerate: Megatron-LM needs num_layers={plan.model.num_layers} divisible by pp={d.pp}")
        if plan.zero_stage == 3:
            c.fail("accelerate: the Megatron-LM plugin has no ZeRO-3/FSDP option; use zero_stage <= 2 with pp/ep")


def unsupported(plan: Plan) -> list[str]:
    """Plan decisions the Accelerate YAML cannot carry."""
    d = plan.degrees
    kind = distributed_type(plan)
    out = c.common_notes(plan, "accelerate")
    out += c.offload_notes(plan, "accelerate")
    out += c.stack_notes(plan, "accelerate", "megatron" if kind == "MEGATRON_LM" else "eager")
    out += c.moe_notes(plan, "accelerate")
    out += c.state_dtype_notes(plan, "accelerate")
    out += c.fsdp_notes(plan, "accelerate", "torch")
    out += c.tp_overlap_notes(plan, "accelerate")
    out += c.pp_overlap_notes(plan, "accelerate")
    out += c.shared_overlap_notes(plan, "accelerate")
    out += c.fused_moe_mlp_notes(plan, "accelerate")
    out += c.cuda_graph_notes(plan, "accelerate")
    out += c.fp8_params_notes(plan, "accelerate")
    out += c.bf16_layers_notes(plan, "accelerate")
    if plan.recompute == "op":
        out.append("accelerate: recompute=op (op-level selective checkpointing) has no config key; not applied")
    if kind != "MEGATRON_LM" and c.recompute_layers(plan):
        out.append(f"accelerate: recompute={plan.recompute}: activation checkpointing is whole-model here; rendered "
                   "as full recompute of every layer")
    if d.cp > 1 and kind == "FSDP" and plan.cp_kind == "a2a":
        out.append("accelerate: cp_kind=a2a (Ulysses) is parallelism_config_sp_* under DeepSpeed, not FSDP2; "
                   "rendered torch context parallel with the ring rotation")
    if d.cp > 1 and kind == "MEGATRON_LM" and plan.cp_kind != "ring":
        out.append(f"accelerate: cp_kind={plan.cp_kind}: megatron_lm_config has no cp comm type; Megatron's p2p ring "
                   "runs")
    if kind in ("FSDP", "MULTI_GPU", "NO"):
        out.append(f"accelerate: micro_batch={plan.micro_batch} and grad_accum={plan.grad_accum} are set in the "
                   f"script (DataLoader batch size, Accelerator(gradient_accumulation_steps={plan.grad_accum}))")
    if kind == "FSDP" and plan.zero_stage in (1, 2):
        out.append(f"accelerate: FSDP2 has no ZeRO-{plan.zero_stage}; rendered fsdp_reshard_after_forward: false "
                   "(ZeRO-2-like)")
    if kind == "FSDP" and plan.recompute == "selective":
        out.append("accelerate: FSDP activation checkpointing is whole-layer only; selective recompute not applied")
    if kind == "FSDP" and d.tp > 1 and not plan.sequence_parallel:
        out.append("accelerate: parallelism_config TP follows the model's own tp_plan; sequence_parallel=false "
                   "cannot be forced")
    if kind == "MEGATRON_LM":
        if d.vpp > 1:
            out.append(f"accelerate: megatron_lm_config has no virtual pipeline option (vpp={d.vpp})")
        if plan.zero_stage == 2:
            out.append("accelerate: Megatron-LM plugin offers the distributed optimizer (ZeRO-1-like) only; "
                       "zero_stage 2 rendered as megatron_lm_use_distributed_optimizer")
        if d.dp_replicate > 1 and d.dp_shard > 1:
            out.append(f"accelerate: the distributed optimizer shards over all of dp={d.dp}; "
                       f"{d.dp_replicate} replicas x {d.dp_shard} shards cannot be expressed")
    if kind == "DEEPSPEED" and d.dp_replicate > 1:
        out.append(f"accelerate: DeepSpeed ZeRO shards over all of dp={d.dp}; {d.dp_replicate} replicas x "
                   f"{d.dp_shard} shards cannot be expressed")
    if not c.layers_evenly_split(plan):
        out.append("accelerate: no per-stage layer counts; stages are split evenly")
    kinds = c.mixed_layer_precision(plan)
    if kinds:
        out.append(f"accelerate: no per-layer precision ({', '.join(sorted(kinds))}); mixed_precision applies to "
                   "the whole model")
    if c.compression_methods(plan):
        out.append("accelerate: no gradient compression option; plan uses "
                   + ", ".join(sorted(c.compression_methods(plan))))
    return out


def config(plan: Plan) -> dict:
    """The config as a dict (key order = output order)."""
    d, m = plan.degrees, plan.model
    kind = distributed_type(plan)
    cfg: dict = {"compute_environment": "LOCAL_MACHINE", "distributed_type": kind,
                 "mixed_precision": mixed_precision(plan), "num_machines": plan.cluster.nodes,
                 "num_processes": plan.cluster.world_size, "machine_rank": 0, "rdzv_backend": "static",
                 "same_network": True, "use_cpu": False}
    if c.fp8_recipe(plan) in FP8_CONFIG:
        cfg["fp8_config"] = dict(FP8_CONFIG[c.fp8_recipe(plan)])
    if kind == "FSDP":
        cfg["fsdp_config"] = {
            "fsdp_version": 2,
            "fsdp_reshard_after_forward": plan.zero_stage == 3,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_transformer_layer_cls_to_wrap": c.HF_LAYER_CLASS.get(m.model_type, "DecoderLayer"),
            "fsdp_activation_checkpointing": plan.recompute.startswith("full"),
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_offload_params": False,
        }
        if d.dp_replicate > 1 or d.tp > 1 or d.cp > 1:
            cfg["parallelism_config"] = {
                "parallelism_config_dp_replicate_size": d.dp_replicate,
                "parallelism_config_dp_shard_size": d.dp_shard,
                "parallelism_config_tp_size": d.tp,
                "parallelism_config_cp_size": d.cp,
            }
            if d.cp > 1:
                cfg["parallelism_config"]["parallelism_config_cp_comm_strategy"] = CP_COMM.get(plan.cp_kind, "alltoall")
    elif kind == "DEEPSPEED":
        cfg["deepspeed_config"] = {
            "zero_stage": plan.zero_stage,
            "gradient_accumulation_steps": plan.grad_accum,
            "offload_optimizer_device": "none",
            "offload_param_device": "none",
            "zero3_init_flag": False,
            "deepspeed_multinode_launcher": "standard",
        }
    elif kind == "MEGATRON_LM":
        mc: dict = {"megatron_lm_tp_degree": d.tp, "megatron_lm_pp_degree": d.pp,
                    "megatron_lm_num_micro_batches": plan.grad_accum,
                    "megatron_lm_sequence_parallelism": plan.sequence_parallel,
                    "megatron_lm_recompute_activations": plan.recompute == "selective",
                    "megatron_lm_use_distributed_optimizer": plan.zero_stage >= 1}
        if plan.recompute == "full":
            mc.update({"megatron_lm_recompute_granularity": "full", "megatron_lm_recompute_method": "uniform",
                       "megatron_lm_recompute_num_layers": 1})
        elif c.recompute_layers(plan):
            mc.update({"megatron_lm_recompute_granularity": "full", "megatron_lm_recompute_method": "block",
                       "megatron_lm_recompute_num_layers": c.recompute_layers(plan)})
        if d.cp > 1:
            mc["megatron_lm_context_parallel_size"] = d.cp
        if d.ep > 1:
            mc["megatron_lm_expert_model_parallel_size"] = d.ep
            mc["megatron_lm_expert_tensor_parallel_size"] = c.expert_tp(plan)
        cfg["megatron_lm_config"] = mc
    return cfg


def render(plan: Plan) -> str:
    """The YAML text, with a comment saying what each node must add on the command line."""
    lines = [f"# {h}" for h in c.header(plan, "Accelerate config", "accelerate 1.15.0")]
    if plan.cluster.nodes > 1:
        lines.append("# Per node: accelerate launch --config_file this.yaml --machine_rank $NODE_RANK "
                     "--main_process_ip $HEAD_NODE --main_process_port 29500 train.py")
    return "\n".join(lines) + "\n" + yaml.safe_dump(config(plan), sort_keys=False)
