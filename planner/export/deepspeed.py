"""DeepSpeed ``ds_config`` JSON.

Keys and rules: deepspeedai/DeepSpeed @ edaa72212672 / PyPI deepspeed 0.19.8 (``deepspeed/runtime/config.py``,
``deepspeed/runtime/zero/config.py``, ``docs/_pages/config-json.md``), as recorded in shared/notes/exports.md (c).

* ``train_batch_size == train_micro_batch_size_per_gpu * gradient_accumulation_steps * dp`` is asserted by
  ``DeepSpeedConfig._batch_assertion`` (dp = the mpu's data-parallel size, e.g. with Megatron-DeepSpeed); all
  three are written.
* The pipeline degree is not a JSON key (``PipelineModule(num_stages=pp)`` in user code); PP allows ZeRO <= 1.
* TP: AutoTP ``tensor_parallel.autotp_size``; EP: AutoEP ``expert_parallel.autoep_size`` (must divide world/pp);
  CP: Ulysses ``sequence_parallel_size`` + ``data_parallel_size``.
* Gradient compression: int8 buckets -> ZeRO++ ``zero_quantized_gradients`` (a ZeRO-3 feature); fp16/bf16
  buckets -> ``communication_data_type``. The 1-bit optimizers (OneBitAdam, ZeroOneAdam, OneBitLamb) listed in
  exports.md are gone from the installed 0.19.8 (not in ``DEEPSPEED_OPTIMIZERS``, no ``runtime/fp16/onebit``;
  the engine would look the name up in ``torch.optim`` and fail), so int8 under ZeRO 0-2 is reported as
  unsupported instead of rendered.
* Further decisions: ``etp`` -> AutoEP ``expert_parallel.expert_tensor_parallel_size`` (AutoEP folds the expert
  mesh over AutoTP, ``module_inject/auto_ep_config.py``); cp is Ulysses, so ``cp_kind`` ring / allgather is named
  as not carried; ``recompute full:N`` runs as full (PipelineModule checkpoints every layer) and ``op`` as nothing,
  both named; an fp8 recipe is refused (no key); ``stack``, ``moe_overlap``, ``moe_capacity`` named.
"""
from __future__ import annotations

import json

from meshplan.planner.export import _common as c
from meshplan.planner.export import placement
from meshplan.planner.layout.layout import reduce_dtype_of
from meshplan.planner.plan.schema import Plan

EXTENSION = "json"

# Defaults from deepspeed/runtime/zero/config.py that meshplan's estimator assumes too (5e8-element buckets).
REDUCE_BUCKET_SIZE = 500_000_000


def _comm_dtype(plan: Plan) -> str | None:
    methods = c.compression_methods(plan)
    if methods == {"fp16"}:
        return "fp16"
    if methods == {"bf16"}:
        return "bf16"
    return reduce_dtype_of(plan.reduce_dtype, plan.stack) or None  # the reduction dtype the plan priced, if set


def _int8(plan: Plan) -> bool:
    return "int8" in c.compression_methods(plan)


def check(plan: Plan) -> None:
    """DeepSpeed's own constraints (exports.md, "What meshplan should check", item 2)."""
    c.check_plan(plan)
    c.refuse_fp8_attention(plan, "deepspeed", "the trainer calls PyTorch SDPA, which has no fp8 attention")
    placement.refuse(plan, "deepspeed")
    d = plan.degrees
    mbs, gas, dp = plan.micro_batch, plan.grad_accum, d.dp
    if plan.global_batch != mbs * gas * dp:
        c.fail(f"deepspeed: train_batch_size {plan.global_batch} != micro {mbs} * grad_accum {gas} * dp {dp}")
    if d.pp > 1 and plan.zero_stage > 1:
        c.fail(f"deepspeed: pipeline parallelism (pp={d.pp}) is incompatible with ZeRO stage {plan.zero_stage}; "
               "use zero_stage <= 1 (PipelineModule docstring)")
    if d.ep > 1 and (plan.cluster.world_size // d.pp) % d.ep:
        c.fail(f"deepspeed: autoep_size={d.ep} must divide world/pp = {plan.cluster.world_size}/{d.pp}")
    if d.cp > 1 and plan.model.num_attention_heads % d.cp:
        # Ulysses all-to-all splits heads across the sequence-parallel group.
        c.fail(f"deepspeed: Ulysses sequence_parallel_size={d.cp} must divide "
               f"num_attention_heads={plan.model.num_attention_heads}")
    if c.fp8_recipe(plan) != "none":
        c.fail(f"deepspeed: the config has no fp8 key for the plan's fp8 recipe {c.fp8_recipe(plan)} (FP8 comes from "
               f"Transformer Engine in the model code); re-plan with --dtype bf16 (the plan trains in --dtype "
               f"{plan.dtype}) or use another target")


def unsupported(plan: Plan) -> list[str]:
    """Plan decisions a ds_config cannot carry."""
    d = plan.degrees
    out = c.common_notes(plan, "deepspeed")
    out += c.offload_notes(plan, "deepspeed")
    out += c.stack_notes(plan, "deepspeed", "eager")
    out += c.moe_notes(plan, "deepspeed")
    out += c.state_dtype_notes(plan, "deepspeed", reduce=("bf16", "fp32"))
    out += c.tp_overlap_notes(plan, "deepspeed")
    out += c.pp_overlap_notes(plan, "deepspeed")
    out += c.shared_overlap_notes(plan, "deepspeed")
    out += c.fused_moe_mlp_notes(plan, "deepspeed")
    out += c.cuda_graph_notes(plan, "deepspeed")
    out += c.fp8_params_notes(plan, "deepspeed")
    if d.cp > 1 and plan.cp_kind != "a2a":
        out.append(f"deepspeed: cp_kind={plan.cp_kind}: DeepSpeed's sequence parallelism is Ulysses (all-to-all over "
                   f"heads, cp_kind a2a); rendered sequence_parallel_size={d.cp} as Ulysses")
    if c.recompute_layers(plan):
        out.append(f"deepspeed: recompute={plan.recompute} ({c.recompute_layers(plan)} layers per stage) has no config "
                   "key; rendered as full recompute of every layer")
    if plan.recompute == "op":
        out.append("deepspeed: recompute=op (op-level selective checkpointing) has no config key; not applied")
    if d.pp > 1:
        out.append(f"deepspeed: pp={d.pp} is not a config key; build PipelineModule(num_stages={d.pp}) in code")
    if d.pp > 1 and plan.schedule == "gpipe":
        out.append("deepspeed: PipelineEngine runs its own 1F1B-style TrainSchedule; GPipe cannot be selected")
    if d.vpp > 1:
        out.append(f"deepspeed: no interleaved pipeline schedule (vpp={d.vpp}); PipelineModule runs 1F1B")
    if not c.layers_evenly_split(plan):
        out.append("deepspeed: uneven stage sizes need PipelineModule(partition_method=...) in code "
                   f"({[s.num_layers for s in plan.stages]})")
    if plan.sequence_parallel:
        out.append("deepspeed: Megatron-style sequence parallelism has no config key")
    if d.dp_replicate > 1 and d.dp_shard > 1:
        out.append(f"deepspeed: ZeRO-{plan.zero_stage} shards over all of dp={d.dp}; the plan's "
                   f"{d.dp_replicate} replicas x {d.dp_shard} shards (HSDP) cannot be expressed")
    kinds = c.mixed_layer_precision(plan)
    if kinds:
        out.append(f"deepspeed: no per-layer precision ({', '.join(sorted(kinds))}); one dtype for the model")
    methods = c.compression_methods(plan)
    for m in sorted(methods - {"int8", "fp16", "bf16"}):
        out.append(f"deepspeed: no gradient compression option for {m}")
    if len(methods) > 1:
        out.append(f"deepspeed: one compression setting for all buckets; the plan mixes {', '.join(sorted(methods))}")
    if _int8(plan) and plan.zero_stage < 3:
        out.append(f"deepspeed: int8 gradient quantization (ZeRO++ zero_quantized_gradients) needs ZeRO-3, plan has "
                   f"zero_stage {plan.zero_stage}; gradients go uncompressed (1-bit Adam was removed in 0.19)")
    if plan.compression and any(b.where == "cpu" or b.two_level for b in plan.compression):
        out.append("deepspeed: CPU-side or two-level compression has no config key")
    if plan.recompute == "selective":
        out.append("deepspeed: selective recompute has no config key; activation_checkpointing only configures "
                   "deepspeed.checkpointing, which the model must call")
    return out


def config(plan: Plan) -> dict:
    """The ds_config as a dict (key order = output order)."""
    d = plan.degrees
    cfg: dict = {
        "train_batch_size": plan.global_batch,
        "train_micro_batch_size_per_gpu": plan.micro_batch,
        "gradient_accumulation_steps": plan.grad_accum,
    }
    dt = c.dtype_of(plan)
    if dt == "bf16":
        cfg["bf16"] = {"enabled": True}
    elif dt == "fp16":
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    comm = _comm_dtype(plan)
    if comm:
        cfg["communication_data_type"] = comm
    zero: dict = {"stage": plan.zero_stage}
    if plan.zero_stage > 0:
        zero.update({"overlap_comm": True, "contiguous_gradients": True, "reduce_bucket_size": REDUCE_BUCKET_SIZE})
    if plan.zero_stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
        if _int8(plan):
            zero["zero_quantized_gradients"] = True
    cfg["zero_optimization"] = zero
    if d.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": d.tp}
    if d.ep > 1:
        cfg["expert_parallel"] = {"enabled": True, "autoep_size": d.ep}
        if plan.etp:
            cfg["expert_parallel"]["expert_tensor_parallel_size"] = plan.etp
    if d.cp > 1:
        cfg["sequence_parallel_size"] = d.cp
        cfg["data_parallel_size"] = d.dp
    full = plan.recompute.startswith("full")
    if d.pp > 1:
        cfg["pipeline"] = {"activation_checkpoint_interval": 1 if full else 0}
    if full:
        cfg["activation_checkpointing"] = {"partition_activations": d.tp > 1, "cpu_checkpointing": False,
                                           "contiguous_memory_optimization": False,
                                           "synchronize_checkpoint_boundary": False}
    return cfg


def render(plan: Plan) -> str:
    """The ds_config JSON text (2-space indent, trailing newline)."""
    return json.dumps(config(plan), indent=2) + "\n"
