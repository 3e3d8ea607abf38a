"""Checks and helpers every exporter shares.

Conventions of the plan (``planner/plan/schema.py``, ``planner/estimate/memory.py``) that all targets rely on:

* world = dp_replicate * dp_shard * cp * tp * pp, and it must equal the cluster's device count;
* ZeRO (``zero_stage`` 1..3) shards over the ``dp_shard`` (x cp) group; ``dp_replicate`` replicates (HSDP), so
  ``dp_shard > 1`` with ``zero_stage == 0`` is contradictory;
* grad accumulation = global_batch / (micro_batch * dp), dp = dp_replicate * dp_shard (Megatron, DeepSpeed and
  TorchTitan all use this identity; exports.md sections (b), (c), (d));
* the expert mesh etp x ep (etp = tp unless the plan sets it) folds over a stage's tp x cp x dp ranks (MoE parallel
  folding), and with hybrid sharding over each replica's tp x cp x dp_shard (``layout.replicas_hold_whole_experts``);
  torchtitan lends it dp_shard x cp (x tp) alone, which its exporter checks.

The decisions added after plan schema 1 (``etp``, ``fp8``, ``cp_kind``, ``stack``, ``moe_overlap``, ``moe_capacity``,
``moe_router``, ``recompute`` full:N / op) are read through the helpers below, so every target reads them alike:
``expert_tp``, ``fp8_recipe`` (a ``dtype: fp8`` plan of before the field means delayed scaling), ``recompute_layers``,
``stack_notes`` and ``moe_notes`` (the one-line warnings of a target that cannot carry them).

Messages never name the plan file: the caller (CLI) prefixes it.
"""
from __future__ import annotations

import re
import shlex

from meshplan.core.errors import MeshplanError
from meshplan.planner.layout.decisions import DECISIONS, GRAD_BYTES_BY_DTYPE, OPTIMIZER_BYTES_BY_DTYPE, lowp_recipe
from meshplan.planner.layout.layout import fsdp_impl, p2p_overlapped, replicas_hold_whole_experts
from meshplan.planner.plan.schema import Plan

# Plan.dtype values the exporters understand, mapped to a canonical name.
DTYPES = {"bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16", "fp32": "fp32",
          "float32": "fp32", "fp8": "fp8", "fp8_e4m3": "fp8", "fp8-hybrid": "fp8", "fp8_hybrid": "fp8",
          "nvfp4": "nvfp4"}

# Families whose HF layout is pre-norm RMSNorm + SwiGLU + RoPE without linear biases (models.md section 1).
ROPE_SWIGLU_FAMILIES = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "deepseek_v3",
                        "glm4_moe", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")

# Gemma 2 and 3: a GeGLU under tanh GELU, post-block norms, scaled embeddings (Megatron-Bridge's Gemma providers)
GEMMA_FAMILIES = ("gemma2", "gemma3_text")

# HF decoder-layer class per model_type (transformers 5 ``modeling_*.py``): what FSDP wraps.
HF_LAYER_CLASS = {
    "llama": "LlamaDecoderLayer", "mistral": "MistralDecoderLayer", "mixtral": "MixtralDecoderLayer",
    "qwen2": "Qwen2DecoderLayer", "qwen2_moe": "Qwen2MoeDecoderLayer", "qwen3": "Qwen3DecoderLayer",
    "qwen3_moe": "Qwen3MoeDecoderLayer", "deepseek_v3": "DeepseekV3DecoderLayer", "gpt2": "GPT2Block",
    "gpt_neox": "GPTNeoXLayer", "glm4_moe": "Glm4MoeDecoderLayer", "gemma2": "Gemma2DecoderLayer",
    "gemma3_text": "Gemma3DecoderLayer", "qwen3_next": "Qwen3NextDecoderLayer", "qwen3_5_text": "Qwen3_5DecoderLayer",
    "qwen3_5_moe_text": "Qwen3_5MoeDecoderLayer",
}


# Megatron-Core's own SM count for Hybrid-EP (the decision's default: its TransformerConfig's)
HYBRIDEP_DEFAULT_SMS = DECISIONS["hybridep_sms"].default


def fail(message: str) -> None:
    """Raise the one-line user error."""
    raise MeshplanError(message)


def dtype_of(plan: Plan) -> str:
    """Canonical training dtype of the plan (``bf16``/``fp16``/``fp32``/``fp8``)."""
    d = DTYPES.get(plan.dtype.lower())
    if d is None:
        fail(f"dtype={plan.dtype!r} is not one of {sorted(set(DTYPES))}")
    return d


def refuse_fp8_attention(plan: Plan, target: str, why: str) -> None:
    """Refuse a plan priced with fp8 attention (``attention_dtype``: Transformer Engine's fp8 dot-product
    attention) on a target that cannot run it, saying ``why`` and where it can be run."""
    if plan.attention_dtype == "fp8":
        fail(f"{target}: attention_dtype=fp8 (Transformer Engine's fp8 dot-product attention): {why}; re-plan with "
             "--fix attention_dtype=bf16, or export to megatron-bridge")


def check_plan(plan: Plan) -> None:
    """Target-independent consistency of a plan; every exporter's ``check`` calls this first.

    Raises:
        MeshplanError: naming the numbers that disagree.
    """
    d = plan.degrees
    world = plan.cluster.world_size
    if "workload=serve" in plan.notes:
        fail("a serving plan (meshplan plan --workload serve): the export targets launch training jobs; run its "
             "stages and per-layer precisions with an inference server (LLM-PQ style), which no target here is")
    if plan.stages:
        groups = plan.cluster.groups
        widths = sorted({groups[s.device_group].devices_per_node for s in plan.stages if s.device_group < len(groups)})
        if len(widths) > 1:
            fail(f"the pipeline stages run tensor parallel over nodes of {', '.join(map(str, widths))} devices: "
                 "uneven tensor parallelism per stage, which no target here launches (one tp and one "
                 "processes-per-node count for every stage)")
        if d.world_size != world:
            fail(f"the plan's {d.pp} pipeline stages x tp {d.tp} use {d.world_size} of cluster "
                 f"{plan.cluster.spec!r}'s {world} devices; a launcher starts a rank on every device (plan on the "
                 "devices the job gets)")
    if d.world_size != world:
        fail(f"dp_replicate*dp_shard*cp*tp*pp = {d.dp_replicate}*{d.dp_shard}*{d.cp}*{d.tp}*{d.pp} = "
             f"{d.world_size}, but cluster {plan.cluster.spec!r} has {world} devices")
    if plan.global_batch % (plan.micro_batch * d.dp):
        fail(f"global_batch={plan.global_batch} is not a multiple of micro_batch*dp = "
             f"{plan.micro_batch}*{d.dp} = {plan.micro_batch * d.dp}")
    if d.dp_shard > 1 and plan.zero_stage == 0:
        fail(f"dp_shard={d.dp_shard} but zero_stage=0: a sharded data-parallel group needs zero_stage 1, 2 or 3")
    if plan.sequence_parallel and d.tp == 1:
        fail("sequence_parallel=true needs tp > 1 (tp=1)")
    if d.vpp > 1 and d.pp == 1:
        fail(f"vpp={d.vpp} needs pp > 1 (pp=1)")
    if plan.schedule == "interleaved" and d.vpp < 2:
        fail(f"schedule='interleaved' needs vpp >= 2 virtual stages per rank (vpp={d.vpp})")
    m = plan.model
    if plan.etp and m.num_experts == 0:
        fail(f"etp={plan.etp} but model {m.name!r} has no experts")
    if d.ep > 1:
        if m.num_experts == 0:
            fail(f"ep={d.ep} but model {m.name!r} has no experts")
        if m.num_experts % d.ep:
            fail(f"num_experts={m.num_experts} is not divisible by ep={d.ep}")
    etp = plan.etp or d.tp
    if (d.ep > 1 or plan.etp) and (d.tp * d.cp * d.dp) % (d.ep * etp):
        fail(f"ep*etp = {d.ep}*{etp} must divide tp*cp*dp = {d.tp}*{d.cp}*{d.dp} = {d.tp * d.cp * d.dp} "
             "(the expert mesh folds over a stage's ranks)")
    if not replicas_hold_whole_experts(d.tp, d.cp, d.dp_shard, d.dp_replicate, d.ep, etp):
        fail(f"ep*etp = {d.ep}*{etp} must divide tp*cp*dp_shard = {d.tp}*{d.cp}*{d.dp_shard} = "
             f"{d.tp * d.cp * d.dp_shard} with dp_replicate={d.dp_replicate}: each replica holds whole experts")
    if plan.stages is not None:
        total = sum(s.num_layers for s in plan.stages)
        if total != m.num_layers:
            fail(f"stages hold {total} layers but the model has num_layers={m.num_layers}")
        if len(plan.stages) != d.pp * d.vpp:
            fail(f"{len(plan.stages)} stages given but pp*vpp = {d.pp}*{d.vpp} = {d.pp * d.vpp}")
        n_groups = len(plan.cluster.groups)
        for i, s in enumerate(plan.stages):
            if s.device_group >= n_groups:
                fail(f"stage {i} is on device_group {s.device_group}, but the cluster has {n_groups} group(s)")
    if plan.layer_precision is not None and len(plan.layer_precision) != m.num_layers:
        fail(f"layer_precision has {len(plan.layer_precision)} entries but num_layers={m.num_layers}")
    dtype_of(plan)


def expert_tp(plan: Plan) -> int:
    """Expert tensor parallelism in effect: the plan's ``etp``, or the dense tp when 0."""
    return plan.etp or plan.degrees.tp


def fp8_recipe(plan: Plan) -> str:
    """The low-precision recipe of the decoder GEMMs: ``none``, ``tensorwise``, ``delayed``, ``blockwise``,
    ``mxfp8`` or ``nvfp4``. A plan with ``dtype: fp8`` and no ``fp8`` field (written before the field existed) means
    Transformer Engine's delayed scaling; ``dtype: nvfp4`` NVFP4 (``decisions.lowp_recipe``)."""
    return lowp_recipe(plan.fp8, dtype_of(plan))


def recompute_layers(plan: Plan) -> int:
    """``full:N``: layers fully recomputed per pipeline stage (per virtual chunk when interleaved); 0 otherwise."""
    head, _, n = plan.recompute.partition(":")
    return int(n) if head == "full" and n else 0


def layers_per_stage(plan: Plan) -> list[int]:
    """Decoder layers per (virtual) pipeline stage in model order: the plan's ``stages``, else an even split into
    pp * vpp stages."""
    if plan.stages:
        return [s.num_layers for s in plan.stages]
    n = plan.degrees.pp * plan.degrees.vpp
    return [plan.model.num_layers // n] * n


def rank_layers(plan: Plan) -> list[int]:
    """Decoder layers each pipeline rank holds (virtual stage v * pp + r is chunk v of rank r)."""
    pp, per_stage = plan.degrees.pp, layers_per_stage(plan)
    return [sum(per_stage[r::pp]) for r in range(pp)]


# What each target's launched job runs (the kernels ``stack`` prices): Megatron-Core + Transformer Engine, torchtitan's
# FSDP2 + torch.compile, or the user's / example trainer's eager PyTorch.
STACK_RUNS = {"megatron": "Megatron-Core with Transformer Engine's fused kernels",
              "torchtitan": "torchtitan's FSDP2 and torch.compile fusions",
              "eager": "eager PyTorch model code (one kernel per op)"}


def stack_notes(plan: Plan, target: str, runs: str) -> list[str]:
    """A warning when the plan priced another stack's kernels than the target's job runs. ``stack: megatron`` is also
    what every plan written before the field holds, so only a stack chosen otherwise is named. Likewise a plan priced
    on batch-first model code (``sequence_first`` false, NeMo AutoModel's) or on NeMo AutoModel's MoE layer
    (``moe_impl``) launched as Megatron-Core."""
    out = []
    if runs == "megatron" and plan.stack == "megatron" and not plan.sequence_first:
        out.append(f"{target}: sequence_first=false: the plan priced batch-first model code, but Megatron-Core runs "
                   "sequence-first, and its Mamba mixer copies its activations to batch-first and back at a "
                   "micro-batch above 1, which the plan did not price (re-plan with --fix sequence_first=true)")
    if runs == "megatron" and plan.stack == "megatron" and plan.moe_impl == "automodel" and plan.model.num_experts:
        out.append(f"{target}: moe_impl=automodel: the plan priced NeMo AutoModel's MoE layer, but Megatron-Core "
                   "runs its own, whose wait for the host after each layer's token-count sync the plan did not "
                   "price (re-plan with --fix moe_impl=megatron)")
    if plan.stack == "megatron" or plan.stack == runs:
        return out
    return out + [f"{target}: stack={plan.stack}: the plan priced {STACK_RUNS[plan.stack]}, but the job runs "
                  f"{STACK_RUNS[runs]}; the predicted step time does not carry over (re-plan with --fix stack={runs})"]


def tp_overlap_notes(plan: Plan, target: str, *, carried: bool = False) -> list[str]:
    """A warning when the plan priced TP collectives hidden behind the GEMMs and the target cannot overlap them."""
    if not plan.tp_overlap or carried:
        return []
    return [f"{target}: tp_overlap: no option overlaps the tensor-parallel collectives with the GEMMs here; they run "
            "exposed, which the plan did not price"]


def pp_overlap_notes(plan: Plan, target: str) -> list[str]:
    """A warning when the plan priced the pipeline's sends overlapped with compute and the target's pipeline
    waits for them in line (every target but Megatron-LM's interleaved schedule)."""
    if not p2p_overlapped(plan.pp_overlap, plan.stack, plan.degrees.pp, plan.schedule):
        return []
    return [f"{target}: pp_overlap: the pipeline's sends and receives wait in line here; the plan priced them "
            "overlapped with the next chunk's compute (re-plan with --fix pp_overlap=false to compare)"]


def fsdp_notes(plan: Plan, target: str, runs: str) -> list[str]:
    """A warning when a ZeRO-3 plan priced another FSDP implementation than the target launches (``runs``: "torch"
    for FSDP2, "megatron" for Megatron-FSDP): FSDP2's copy passes are in the price or not. As ``stack_notes``: a
    plan left at ``stack: megatron`` without ``fsdp`` (every plan written before the fields) is not named."""
    priced = fsdp_impl(plan.fsdp, plan.stack)
    if plan.zero_stage != 3 or priced == runs or (not plan.fsdp and plan.stack == "megatron"):
        return []
    names = {"torch": "torch FSDP2 (fully_shard, with its copy passes)", "megatron": "Megatron-FSDP (no copy passes)"}
    return [f"{target}: fsdp={priced}: the plan priced {names[priced]}, the job runs {names[runs]}"]


def cuda_graph_notes(plan: Plan, target: str) -> list[str]:
    """A warning when the plan priced CUDA graphs and the target launches every op from Python (every target but
    Megatron-LM and Megatron-Bridge)."""
    if plan.cuda_graphs == "none":
        return []
    return [f"{target}: cuda_graphs={plan.cuda_graphs}: no option captures CUDA graphs here; every op launches "
            "eagerly, and an MoE layer waits on the host longer than the plan priced"]


def cuda_graph_scope(plan: Plan) -> tuple[str, list[str]]:
    """(Megatron-Core ``cuda_graph_impl``, ``cuda_graph_scope``) of the plan's ``cuda_graphs``: Transformer Engine's
    per-layer graphs of the attention and Mamba mixers alone (``mixers``), or of the attention and the MoE router
    and dispatch preprocessing (the dense MLP in a dense
    layer; the whole MoE block where it drops and pads to capacity, which TransformerConfig requires of the "moe"
    scope and which keeps "moe_preprocess" out under the alltoall dispatcher), or Megatron's own full-iteration
    graph (``megatron/core/transformer/enums.py`` CudaGraphScope)."""
    if plan.cuda_graphs == "iteration":
        return "local", ["full_iteration"]
    if plan.cuda_graphs == "mixers":  # the attention and, in a hybrid, the Mamba mixers
        return "transformer_engine", ["attn"] + (["mamba"] if plan.model.model_type == "nemotron_h" else [])
    if plan.cuda_graphs == "layers" and not plan.model.num_experts:
        return "transformer_engine", ["attn", "mlp"]
    if plan.cuda_graphs == "layers":
        # a drop-and-pad MoE layer has static shapes: captured whole ("moe"), but not beside the overlapped expert
        # all-to-all (TransformerConfig: "CUDA graph scope on moe and mlp is not supported with
        # overlap_moe_expert_parallel_comm"), where its router and preprocessing are (no host wait is priced either
        # way: a padded layer does not sync)
        whole = plan.moe_capacity and not plan.moe_overlap
        return "transformer_engine", ["attn", "moe"] if whole else ["attn", "moe_router", "moe_preprocess"]
    return "none", []


def shared_overlap_notes(plan: Plan, target: str) -> list[str]:
    """A warning when the plan priced the shared experts overlapped with the dispatch and the target's MoE code
    runs them in line (every target but Megatron-LM)."""
    if not (plan.shared_overlap and plan.model.num_experts and plan.model.num_shared_experts):
        return []
    return [f"{target}: shared_overlap: no option runs the shared experts beside the token dispatch here; the plan "
            "priced them overlapped"]


def fused_moe_mlp_notes(plan: Plan, target: str) -> list[str]:
    """A warning when the plan priced Megatron-Core's fused grouped MLP (``moe_fused_mlp``) and the target's MoE code
    runs the activation and its quantize as kernels of their own (every target but Megatron-LM)."""
    if not plan.moe_fused_mlp:
        return []
    return [f"{target}: moe_fused_mlp: no option fuses the experts' activation and quantize into their grouped GEMMs "
            "here; they run as kernels of their own, which the plan did not price"]


def fp8_params_notes(plan: Plan, target: str) -> list[str]:
    """A warning when the plan priced the decoder weights held only in their low-precision copies
    (``fp8_params``, Megatron-Core's ``--fp8-param-gather``) and the target keeps the 16-bit weights beside them."""
    if not plan.fp8_params or fp8_recipe(plan) == "none":
        return []
    return [f"{target}: fp8_params: no option holds the weights in fp8 alone here; the 16-bit weights stay beside "
            "their fp8 copies, which the plan did not count in memory"]


def bf16_layers(plan: Plan) -> tuple[int, int]:
    """(decoder layers at the start, at the end) whose GEMMs the plan keeps in bf16 under its low-precision recipe
    (``bf16_first_layers``, ``bf16_last_layers``); (0, 0) without a recipe, where they have no effect."""
    if fp8_recipe(plan) == "none":
        return 0, 0
    return plan.bf16_first_layers, plan.bf16_last_layers


def bf16_layers_notes(plan: Plan, target: str) -> list[str]:
    """A warning when the plan priced decoder layers kept in bf16 under its low-precision recipe (Megatron-Core's
    ``first_last_layers_bf16``) and the target runs every layer in the recipe."""
    first, last = bf16_layers(plan)
    if not first and not last:
        return []
    return [f"{target}: bf16_first_layers={first}, bf16_last_layers={last}: no option keeps layers out of the "
            f"{fp8_recipe(plan)} recipe here; every layer runs it, faster than the plan priced those layers (export "
            "to megatron / megatron-bridge, or re-plan without them)"]


def state_dtype_notes(plan: Plan, target: str, *, optim: tuple[str, ...] = ("fp32",),
                      grads: tuple[str, ...] = (), reduce: tuple[str, ...] = ()) -> list[str]:
    """Warnings when the plan priced optimizer states, gradients or their reduction in a precision the target cannot
    set (``optim`` / ``grads`` / ``reduce``: the ``optim_dtype`` / ``grad_dtype`` / ``reduce_dtype`` values it
    carries)."""
    out = []
    if plan.optim_dtype not in optim:
        out.append(f"{target}: optim_dtype={plan.optim_dtype}: no option keeps Adam's states that way here; the job "
                   f"keeps fp32 master weights and moments ({OPTIMIZER_BYTES_BY_DTYPE['fp32']} B per parameter, the "
                   f"plan priced {OPTIMIZER_BYTES_BY_DTYPE[plan.optim_dtype]} B)")
    if plan.grad_dtype and plan.grad_dtype not in grads:
        out.append(f"{target}: grad_dtype={plan.grad_dtype}: no option sets the gradients' dtype here; the plan priced "
                   f"{GRAD_BYTES_BY_DTYPE[plan.grad_dtype]} B per parameter and its data-parallel traffic in it")
    if plan.reduce_dtype and plan.reduce_dtype not in reduce:
        out.append(f"{target}: reduce_dtype={plan.reduce_dtype}: no option sets the dtype gradients are reduced in "
                   f"here; the plan priced the data-parallel traffic at {GRAD_BYTES_BY_DTYPE[plan.reduce_dtype]} B "
                   "per parameter")
    return out


def moe_notes(plan: Plan, target: str, *, overlap: bool = False, capacity: bool = False,
              deepep: bool = False, router_fusion: bool = False, aux_loss: bool = False) -> list[str]:
    """Warnings for the MoE decisions a target cannot carry (``overlap`` / ``capacity`` / ``deepep`` /
    ``router_fusion`` / ``aux_loss``: it can; one that can still takes the loss's coefficient from the user), and
    under Hybrid-EP an SM count other than Megatron-Core's, which no target's flags set (the bridge drops the
    warning: it writes the field)."""
    if not plan.model.num_experts:
        return []
    out = []
    if plan.moe_dispatcher in ("deepep", "hybridep") and not deepep:
        out.append(f"{target}: moe_dispatcher={plan.moe_dispatcher}: no such dispatcher here; tokens travel by "
                   "all-to-all, one copy per routed expert (the plan priced one per destination node)")
    elif plan.moe_dispatcher == "hybridep" and plan.hybridep_sms != HYBRIDEP_DEFAULT_SMS:
        out.append(f"{target}: hybridep_sms={plan.hybridep_sms}: no option sets Hybrid-EP's SMs here; Megatron-Core "
                   f"runs it on {HYBRIDEP_DEFAULT_SMS}, a dispatch the plan did not price")
    if plan.moe_overlap and not overlap:
        out.append(f"{target}: moe_overlap: no option overlaps the expert all-to-all with computation here; it runs "
                   "on the critical path, which the plan did not price")
    if plan.moe_router_fusion and not router_fusion:
        out.append(f"{target}: moe_router_fusion: no option fuses the router's score function and top-k here; they "
                   "run as torch kernels, slower than the plan priced")
    if plan.moe_aux_loss != "none":
        out.append(f"{target}: moe_aux_loss={plan.moe_aux_loss}: " + (
            "the loss's coefficient is your model's, not the plan's; at Megatron-Core's default of 0 no loss is "
            "computed, a little faster than the plan priced" if aux_loss else
            "no option computes Megatron-Core's load-balancing loss here; the plan priced its second scoring pass "
            "over the router's logits"))
    if plan.moe_capacity and not capacity:
        out.append(f"{target}: moe_capacity={plan.moe_capacity:g}: no token-dropping capacity factor here; routing "
                   "runs dropless (the plan priced padded, capacity-bounded experts)")
    # NeMo AutoModel's FakeBalancedGate, which no export target has: named where it changed the priced dispatch
    if plan.moe_router == "contiguous" and plan.degrees.ep > 1 and plan.moe_dispatcher in ("deepep", "hybridep"):
        out.append(f"{target}: moe_router=contiguous: no router sends each token to adjacent experts here (NeMo "
                   "AutoModel's fake balanced gate); the trained router spreads a token's copies over more ranks "
                   "than the plan priced its dispatch for")
    return out


def layers_evenly_split(plan: Plan) -> bool:
    """True when the plan's stages (if any) all hold num_layers / (pp * vpp) layers."""
    if plan.stages is None:
        return True
    return len({s.num_layers for s in plan.stages}) == 1


def stage_groups(plan: Plan) -> set[int]:
    """Device groups used by the plan's stages ({0} without explicit stages)."""
    return {s.device_group for s in plan.stages} if plan.stages else {0}


def mixed_layer_precision(plan: Plan) -> set[str]:
    """The distinct per-layer precisions when they differ from one layer to another, else an empty set."""
    if not plan.layer_precision:
        return set()
    kinds = {p.lower() for p in plan.layer_precision}
    return kinds if len(kinds) > 1 or DTYPES.get(next(iter(kinds))) != dtype_of(plan) else set()


def compression_methods(plan: Plan) -> set[str]:
    """Gradient-compression methods used by any bucket (``none`` left out)."""
    return {b.method for b in plan.compression or () if b.method != "none"}


def heterogeneous_cluster_notes(plan: Plan, target: str, placed: bool = False) -> list[str]:
    """Warnings for a cluster whose groups differ (device type or devices per node). ``placed``: the target pins
    each stage's ranks to its device type (static node ranks, :mod:`planner.export.placement`)."""
    groups = plan.cluster.groups
    out = []
    if len({g.devices_per_node for g in groups}) > 1:
        per = ", ".join(f"{g.nodes}x{g.devices_per_node}x{g.device}" for g in groups)
        out.append(f"{target}: one processes-per-node count for every node, but the cluster groups differ ({per}); "
                   f"rendered {plan.cluster.devices_per_node} per node")
    mixed = len({g.device for g in groups}) > 1
    if mixed and placed:
        out.append(f"{target}: stages pinned to device types by static node ranks; start each node with the "
                   "NODE_RANK the script's table gives its device")
    elif mixed:
        out.append(f"{target}: the cluster mixes device types ({', '.join(sorted({g.device for g in groups}))}); "
                   "the launcher cannot pin ranks to a device type")
    return out


# Schedules no target here launches: ZB-H1 needs the backward split into input and weight passes (Qi et al. 2024),
# DualPipe two parameter copies per rank (DeepSeek-V3 §3.2.1); Megatron-LM, DeepSpeed and the example trainer
# run 1F1B, torchtitan v0.2.2's zero-bubble schedules are the V-shaped ZBVZeroBubble / DualPipeV (two chunks per
# rank, one parameter copy), which are not what was priced.
UNLAUNCHED_SCHEDULES = ("zbh1", "dualpipe")


def common_notes(plan: Plan, target: str, placed: bool = False) -> list[str]:
    """What no target expresses: mixed device groups (``heterogeneous_cluster_notes``), the schedules above, LoRA,
    AutoModel's pipeline runs and a fused linear cross-entropy (Megatron-Core 0.16 and torchtitan 0.2 have none)."""
    out = heterogeneous_cluster_notes(plan, target, placed)
    if plan.schedule in UNLAUNCHED_SCHEDULES and plan.degrees.pp > 1:
        out.append(f"{target}: no {plan.schedule} pipeline schedule; the launched job runs 1F1B, whose bubble the "
                   "plan did not price (re-plan with --fix schedule=1f1b to compare)")
    if plan.lora:
        out.append(f"{target}: lora {plan.lora}: the launched job trains every weight; the plan priced LoRA adapters "
                   "over a frozen base (no weight gradients or optimizer states for it)")
    if plan.pp_runs > 1:
        out.append(f"{target}: pp_runs={plan.pp_runs}: the launched job runs its {plan.grad_accum} micro-batches "
                   "in one pipeline schedule, one fill and drain, not the plan's "
                   f"{plan.pp_runs} (re-plan without pp_runs to compare)")
    if plan.linear_ce:
        out.append(f"{target}: linear_ce: no option fuses the output layer with its cross-entropy here; the launched "
                   "job stores the logits, which the plan did not count in memory (re-plan without linear_ce to "
                   "compare)")
    return out


def offload_notes(plan: Plan, target: str) -> list[str]:
    """A warning when the plan priced activation offloading (``offload_layers``: Megatron-Core's
    ``--cpu-offloading``, Transformer Engine's offload context) and the target has no such option."""
    if not plan.offload_layers:
        return []
    return [f"{target}: offload_layers={plan.offload_layers}: no option offloads activations to host memory here; "
            "the launched job keeps every layer's activations on the GPU, which the plan did not price (re-plan "
            "without offload_layers, or export to megatron / megatron-bridge)"]


def size_tag(plan: Plan) -> str:
    """Size tag of the model name, e.g. ``70B`` from ``Llama-3.1-70B`` ('' when the name has none)."""
    found = re.findall(r"(\d+(?:\.\d+)?[BbMm])(?![a-zA-Z0-9])", plan.model.name)
    return found[-1].upper() if found else ""


def slug(text: str) -> str:
    """Lower-case name usable as a Slurm job name or Kubernetes object name (RFC 1123 label)."""
    s = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return s[:63].rstrip("-") or "meshplan"


def plan_env(plan: Plan) -> list[tuple[str, str]]:
    """The plan's decisions as ``MESHPLAN_*`` environment variables (read by examples/train_gpt.py)."""
    d = plan.degrees
    return [
        ("MESHPLAN_DP_REPLICATE", str(d.dp_replicate)), ("MESHPLAN_DP_SHARD", str(d.dp_shard)),
        ("MESHPLAN_TP", str(d.tp)), ("MESHPLAN_PP", str(d.pp)), ("MESHPLAN_VPP", str(d.vpp)),
        ("MESHPLAN_CP", str(d.cp)), ("MESHPLAN_EP", str(d.ep)),
        ("MESHPLAN_MICRO_BATCH", str(plan.micro_batch)), ("MESHPLAN_GLOBAL_BATCH", str(plan.global_batch)),
        ("MESHPLAN_GRAD_ACCUM", str(plan.grad_accum)), ("MESHPLAN_SEQ_LEN", str(plan.seq_len)),
        ("MESHPLAN_ZERO_STAGE", str(plan.zero_stage)), ("MESHPLAN_RECOMPUTE", plan.recompute),
        ("MESHPLAN_SCHEDULE", plan.schedule), ("MESHPLAN_DTYPE", plan.dtype),
    ]


def default_plan_path(plan: Plan) -> str:
    """The plan file the launched job reads: the file this plan was exported from (as the user named it), else
    where ``meshplan plan`` saves a plan of this name (``plans/<name>.yaml``)."""
    return plan.source_path or f"plans/{plan.name}.yaml"


def entry_note(entry: str) -> str:
    """Header line saying where the default entry script comes from (it ships in the package, not beside it)."""
    return comment_text(f"entry script: $MESHPLAN_ENTRY, default {entry}; `meshplan example-trainer {entry}` writes "
                        "the shipped one there")


def torchrun_args(plan: Plan, endpoint: str, rdzv_id: str) -> list[str]:
    """torchrun launcher options (torch 2.13 ``torch/distributed/run.py``), already shell-quoted where static.

    Single node: ``--standalone``. Several nodes: c10d rendezvous, the same line on every node (exports.md (a)).
    """
    nodes = plan.cluster.nodes
    per_node = plan.cluster.devices_per_node
    if nodes == 1:
        return ["--standalone", "--nnodes", "1", "--nproc-per-node", str(per_node)]
    return ["--nnodes", str(nodes), "--nproc-per-node", str(per_node),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", rdzv_id]


def comment_text(text: str) -> str:
    """``text`` made safe for one comment line of a shell script, YAML or TOML file.

    Values in the header come from user files (a HF config's ``_name_or_path``, a cluster file's name); a line
    break in one would end the comment and make the rest a command or a key. Every character that is not
    printable (``\n``, ``\r``, ``\x85``, ``\u2028`` ..., all line breaks of bash, YAML and TOML among them) is
    written as its Python escape instead.
    """
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


def header(plan: Plan, target: str, source: str) -> list[str]:
    """Comment lines (without the comment marker) describing what was rendered and from which upstream version;
    every line is safe to put after a ``#`` (:func:`comment_text`)."""
    d = plan.degrees
    lines = [
        f"meshplan export of plan {plan.name!r} -> {target} ({source})",
        f"model {plan.model.name} ({plan.model.model_type}) on {plan.cluster.spec}: {d.world_size} ranks = "
        f"dp_replicate {d.dp_replicate} x dp_shard {d.dp_shard} x cp {d.cp} x tp {d.tp} x pp {d.pp}"
        + (f", vpp {d.vpp}" if d.vpp > 1 else "") + (f", ep {d.ep}" if d.ep > 1 else ""),
        f"batch: global {plan.global_batch} = micro {plan.micro_batch} x dp {d.dp} x grad-accum {plan.grad_accum}; "
        f"seq_len {plan.seq_len}; zero {plan.zero_stage}; recompute {plan.recompute}; dtype {plan.dtype}",
    ]
    return [comment_text(line) for line in lines]


def bash_lines(words: list[str], indent: str = "  ") -> str:
    """Join shell words, breaking lines before every ``--option`` and ``"${...}"`` word for readability."""
    out: list[str] = []
    line: list[str] = []
    for w in words:
        if (w.startswith("--") or w.startswith('"${')) and line:
            out.append(" ".join(line))
            line = []
        line.append(w)
    if line:
        out.append(" ".join(line))
    return (" \\\n" + indent).join(out)


def quote(word: str) -> str:
    """Shell-quote a static word (variables are written by the caller in double quotes)."""
    return shlex.quote(word)


def default_assignment(var: str, default: str) -> list[str]:
    """Bash lines that set ``var`` to ``default`` unless the caller's environment sets it, and export it.

    Not ``"${VAR:-default}"``: inside double quotes a default holding ``$(...)`` or a backtick would run. Here the
    default is one single-quoted word (:func:`shlex.quote`) on the right of a plain assignment.
    """
    if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", var):
        raise ValueError(f"not a shell variable name: {var!r}")
    return [f'if [ -z "${{{var}:-}}" ]; then {var}={quote(default)}; fi', f"export {var}"]
