"""TorchTitan job config (TOML), for torchtitan v0.2.2.

Format and option names: torchtitan v0.2.2 (tag 73a0e6979dd1, 2026-02-20, PyPI ``torchtitan==0.2.2``; the last
release that reads TOML), ``torchtitan/config/job_config.py`` and ``torchtitan/config/manager.py``; the checks are
those of ``torchtitan/distributed/parallel_dims.py`` and ``torchtitan/distributed/pipeline_parallel.py`` and of
``torch/distributed/pipelining/schedules.py`` (torch 2.13). shared/notes/exports.md (d) explains why v0.2.x:
0.3.0 replaced TOML by Python config functions. Launch with
``torchrun ... -m torchtitan.train --job.config_file plan.toml``.

Batch mapping: torchtitan's ``local_batch_size`` is per DP rank per optimizer micro-step and is split into
pipeline microbatches of ``pipeline_parallel_microbatch_size``; grad-accum = global / (local * dp). Without PP the
plan's micro-batch is the local batch and accumulation covers the rest; with PP the pipeline itself runs the
plan's grad_accum microbatches, so local = micro * grad_accum and no accumulation steps remain.

The further decisions (names from v0.2.2's ``job_config.py``): the layer split per virtual stage as
``pipeline_parallel_layers_per_stage`` (even) or ``module_fqns_per_model_part`` (uneven, one part per virtual stage in
model order, which is torchtitan's looped stage order: rank r runs stages r, r + pp, ...); the schedule as
``pipeline_parallel_schedule`` 1F1B / Interleaved1F1B / GPipe / LoopedBFS (ZB-H1 and DualPipe have no one-chunk
counterpart here: ``InterleavedZeroBubble`` needs two chunks per rank, ``ZBVZeroBubble`` and ``DualPipeV`` are
V-shaped with one parameter copy, so the plan's schedule is named as not launched); the fp8 recipe as the
``quantize.linear.float8`` converter (tensorwise; delayed scaling is gone from torchao, so delayed runs tensorwise
with a warning) or ``quantize.linear.mx`` (mxfp8), blockwise refused; recompute as ``activation_checkpoint``
(op: selective ``op``; full:N: selective every k-th layer when that recomputes N layers per chunk on every rank,
else refused); ``etp`` as ``expert_tensor_parallel_degree`` (1 or tp only, ``ParallelDims``); ``cp_kind`` as
``context_parallel_rotate_method`` (ring = ``alltoall`` rotation, allgather = ``allgather``; Ulysses refused);
``moe_overlap`` and ``moe_capacity`` named as not carried (v0.2.2 overlaps the expert all-to-all under DualPipeV only;
its routing is dropless).
"""
from __future__ import annotations

import math
import re

import tomli_w

from meshplan.planner.export import _common as c
from meshplan.planner.export import placement
from meshplan.planner.layout.layout import replicas_hold_whole_experts
from meshplan.planner.plan.schema import Plan

EXTENSION = "toml"

# torchtitan v0.2.2 model registry (torchtitan/models/<name>/__init__.py) and its flavors.
MODEL_NAME = {"llama": "llama3", "deepseek_v3": "deepseek_v3", "qwen3": "qwen3", "qwen3_moe": "qwen3",
              "gpt_oss": "gpt_oss"}
FLAVORS = {
    "llama3": ("8B", "70B", "405B"),
    "deepseek_v3": ("16B", "236B", "671B"),
    "qwen3": ("0.6B", "1.7B", "4B", "8B", "14B", "32B", "30B-A3B", "235B-A22B"),
    "gpt_oss": ("20b", "120b"),
}
# Registered models whose TrainSpec has no pipelining_fn (torchtitan/models/gpt_oss/__init__.py @ v0.2.2)
NO_PIPELINE = ("gpt_oss",)
SCHEDULES = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved": "Interleaved1F1B"}
# plan cp_kind -> context_parallel_rotate_method (torch's "alltoall" rotation passes KV shards around the ring)
ROTATE = {"ring": "alltoall", "allgather": "allgather"}
# plan fp8 recipe -> (converter, its section, recipe_name); "delayed" runs tensorwise (warned), blockwise is refused
FP8 = {"tensorwise": ("quantize.linear.float8", "tensorwise"), "delayed": ("quantize.linear.float8", "tensorwise"),
       "mxfp8": ("quantize.linear.mx", "mxfp8_cublas")}
# Multi-stage (looped) counterparts used when vpp > 1.
MULTI_STAGE = {"1f1b": "Interleaved1F1B", "interleaved": "Interleaved1F1B", "gpipe": "LoopedBFS"}


def _flavor(plan: Plan, name: str) -> str | None:
    """The flavor named in the model's name, else the one nearest in parameter count."""
    flavors = FLAVORS.get(name)
    if not flavors:
        return None
    for f in sorted(flavors, key=len, reverse=True):
        if re.search(rf"(?<![0-9.]){re.escape(f)}(?![0-9A-Za-z])", plan.model.name, re.IGNORECASE):
            return f
    size = plan.model.num_params / 1e9
    return min(flavors, key=lambda f: abs(math.log(float(f.upper().split("B")[0]) / size)) if size > 0 else 0)


def _batches(plan: Plan) -> tuple[int, int]:
    """(local_batch_size, pipeline_parallel_microbatch_size)."""
    if plan.degrees.pp > 1:
        return plan.micro_batch * plan.grad_accum, plan.micro_batch
    return plan.micro_batch, plan.micro_batch


def _schedule(plan: Plan) -> str:
    return (MULTI_STAGE if plan.degrees.vpp > 1 else SCHEDULES).get(plan.schedule, "1F1B")  # c.common_notes


def _ac_every(plan: Plan) -> int:
    """``full:N`` as torchtitan's layer-level selective AC: the k for which checkpointing every k-th layer of a rank
    (``selective_ac_option = k``; torchtitan counts the rank's blocks, ``_layer_sac_count % k == 0``) recomputes
    N layers per virtual chunk on every pipeline rank, i.e. floor(layers of rank / k) == N * vpp; 0 when none does."""
    n, vpp, per_rank = c.recompute_layers(plan), plan.degrees.vpp, c.rank_layers(plan)
    for k in range(1, max(per_rank) + 1):
        if all(layers // k == n * vpp for layers in per_rank):
            return k
    return 0


def check(plan: Plan) -> None:
    """TorchTitan's constraints (exports.md, "What meshplan should check", item 3)."""
    c.check_plan(plan)
    c.refuse_fp8_attention(plan, "torchtitan", "v0.2.2 runs PyTorch SDPA, which has no fp8 attention")
    placement.refuse(plan, "torchtitan")
    d, m = plan.degrees, plan.model
    if not replicas_hold_whole_experts(d.tp, d.cp, d.dp_shard, d.dp_replicate, d.ep, plan.etp or d.tp, "torchtitan"):
        # ParallelDims.build_mesh: the expert mesh (pp, dp_replicate, efsdp, ep, etp), efsdp = dp_shard*cp*tp // etp*ep
        c.fail(f"torchtitan: ep*etp = {d.ep}*{plan.etp or d.tp} must divide tp*cp*dp_shard = {d.tp}*{d.cp}*"
               f"{d.dp_shard} = {d.tp * d.cp * d.dp_shard}: its expert mesh borrows only the sharded ranks")
    dt = c.dtype_of(plan)
    if dt == "fp16":
        c.fail("torchtitan: training.mixed_precision_param accepts bfloat16 or float32, not fp16")
    local, pp_mbs = _batches(plan)
    if plan.global_batch % (local * d.dp):
        c.fail(f"torchtitan: global_batch_size {plan.global_batch} is not a multiple of local_batch_size*dp = "
               f"{local}*{d.dp}")
    if local % pp_mbs:
        c.fail(f"torchtitan: local_batch_size {local} is not a multiple of pipeline_parallel_microbatch_size {pp_mbs}")
    if d.tp > 1 and m.num_attention_heads % d.tp:
        c.fail(f"torchtitan: num_attention_heads={m.num_attention_heads} is not divisible by tp={d.tp}")
    if d.pp > 1 and MODEL_NAME.get(m.model_type) in NO_PIPELINE:
        c.fail(f"torchtitan: pp={d.pp}: v0.2.2's {MODEL_NAME[m.model_type]} TrainSpec has no pipelining_fn "
               "(torchtitan/models/gpt_oss/__init__.py); re-plan with --fix pp=1, or export to megatron")
    if d.pp > 1:
        stages = d.pp * d.vpp
        if c.layers_evenly_split(plan) and m.num_layers % stages:
            # num_virtual_stages = ceil(n_layers / layers_per_stage) must be divisible by pp (pipeline_parallel.py)
            c.fail(f"torchtitan: num_layers={m.num_layers} is not divisible by pp*vpp = {d.pp}*{d.vpp} = {stages}, "
                   "so no pipeline_parallel_layers_per_stage gives pp*vpp stages")
        n_mb = local // pp_mbs
        if d.vpp == 1 and n_mb < d.pp:
            # Schedule1F1B / ScheduleGPipe: "Number of microbatches must be >= the number of stages".
            c.fail(f"torchtitan: {n_mb} pipeline microbatches < pp={d.pp} (torch pipelining requires >=)")
        if d.vpp > 1:
            rounds = max(1, n_mb // d.pp)
            if n_mb % rounds:
                c.fail(f"torchtitan: Interleaved1F1B needs microbatches ({n_mb}) to be a multiple of "
                       f"rounds = max(1, {n_mb}//pp{d.pp}) = {rounds}")
    if d.dp_replicate > 1 and d.dp_shard == 1 and d.cp == 1 and d.dp_replicate != d.world_size:
        # models/llama3/infra/parallelize.py: without FSDP, dp_replicate means DDP, which must be the only dimension.
        c.fail(f"torchtitan: dp_replicate={d.dp_replicate} without dp_shard/cp is DDP, which v0.2.2 cannot combine "
               f"with tp={d.tp}/pp={d.pp} (\"DDP has not supported > 1D parallelism\"); shard instead (zero_stage>=1)")
    etp = c.expert_tp(plan)
    if d.ep > 1 and etp not in (1, d.tp):
        c.fail(f"torchtitan: etp={etp} with tp={d.tp}: ParallelDims supports expert tensor parallelism 1 or tp only")
    if d.ep > 1 and (d.dp_shard * d.cp * d.tp) % (etp * d.ep):
        c.fail(f"torchtitan: dp_shard*cp*tp = {d.dp_shard * d.cp * d.tp} is not divisible by etp*ep = {etp}*{d.ep}")
    recipe = c.fp8_recipe(plan)
    if recipe == "nvfp4":
        c.fail("torchtitan: fp8 recipe nvfp4 (Transformer Engine's NVFP4BlockScaling: 1x16 E4M3-scaled E2M1 blocks, "
               "random Hadamard transforms, stochastic rounding) has no v0.2.2 converter (quantize.linear.mx is "
               "mxfp8); export to megatron or re-plan with --dtype fp8 --fix fp8=mxfp8")
    if recipe == "blockwise":
        c.fail("torchtitan: fp8 recipe blockwise (128x128 weight blocks, 1x128 activation tiles) has no v0.2.2 "
               "converter (quantize.linear.float8 is tensorwise/rowwise, quantize.linear.mx is mxfp8); export to "
               "megatron or re-plan with --fix fp8=tensorwise")
    if plan.cp_kind == "a2a" and d.cp > 1:
        c.fail(f"torchtitan: cp_kind a2a (Ulysses all-to-all over heads) with cp={d.cp}: v0.2.2's context parallelism "
               "rotates KV shards (allgather or ring) only; export to megatron or deepspeed")
    if c.recompute_layers(plan) and not _ac_every(plan):
        c.fail(f"torchtitan: recompute={plan.recompute}: no k makes layer-level selective AC (every k-th layer) "
               f"recompute {c.recompute_layers(plan) * d.vpp} layers on every pipeline rank (layers per rank "
               f"{c.rank_layers(plan)}); export to megatron (--recompute-method block)")
    if d.cp > 1 and plan.seq_len % (2 * d.cp):
        c.fail(f"torchtitan: seq_len={plan.seq_len} is not divisible by 2*cp = {2 * d.cp} (head-tail load balancer)")


def unsupported(plan: Plan) -> list[str]:
    """Plan decisions the v0.2.2 TOML cannot carry."""
    d, m = plan.degrees, plan.model
    out = c.common_notes(plan, "torchtitan")
    out += c.offload_notes(plan, "torchtitan")
    # the job runs the kernels the plan priced when it priced torchtitan's own: compiled (stack=torchtitan, rendered
    # compile.enable) or eager model code (compile off, v0.2.2's Compile default)
    out += c.stack_notes(plan, "torchtitan", plan.stack if plan.stack in ("torchtitan", "eager") else "torchtitan")
    # pipeline_parallel_expert_parallel_overlap acts only under DualPipeV, which no plan schedule renders
    out += c.moe_notes(plan, "torchtitan")
    out += c.state_dtype_notes(plan, "torchtitan", reduce=("fp32",))  # mixed_precision_reduce: float32 only
    out += c.fsdp_notes(plan, "torchtitan", "torch")
    out += c.pp_overlap_notes(plan, "torchtitan")
    out += c.shared_overlap_notes(plan, "torchtitan")
    out += c.fused_moe_mlp_notes(plan, "torchtitan")
    out += c.cuda_graph_notes(plan, "torchtitan")
    out += c.fp8_params_notes(plan, "torchtitan")
    out += c.bf16_layers_notes(plan, "torchtitan")
    if plan.tp_overlap and plan.stack != "torchtitan":
        out.append("torchtitan: tp_overlap as enable_async_tensor_parallel, which acts only with torch.compile on; "
                   f"the plan priced stack={plan.stack}, rendered with compile off (re-plan with --fix "
                   "stack=torchtitan to compile)")
    if c.fp8_recipe(plan) == "delayed":
        out.append("torchtitan: fp8 recipe delayed (amax history) has no torchao counterpart; rendered tensorwise "
                   "(current scaling, one amax per tensor per step)")
    name = MODEL_NAME.get(m.model_type)
    if name is None:
        out.append(f"torchtitan: v0.2.2 ships no model for model_type {m.model_type!r} "
                   f"(has {', '.join(sorted(FLAVORS))}); register a TrainSpec and set [model] name")
    if d.tp > 1 and not plan.sequence_parallel:
        out.append("torchtitan: tensor parallelism always shards norms/dropout along the sequence "
                   "(sequence_parallel=false cannot be expressed in v0.2.2)")
    if plan.zero_stage in (1, 2) and d.dp_shard > 1:
        out.append(f"torchtitan: no ZeRO-{plan.zero_stage}; rendered as FSDP2 over dp_shard={d.dp_shard} with "
                   "fsdp_reshard_after_forward = \"never\" (ZeRO-2-like: parameters stay gathered)")
    if not c.layers_evenly_split(plan):
        out.append(f"torchtitan: uneven stages {[s.num_layers for s in plan.stages]} rendered via "
                   "module_fqns_per_model_part with llama-style module names (tok_embeddings, layers.N, norm, output)")
    kinds = c.mixed_layer_precision(plan)
    if kinds:
        out.append(f"torchtitan: no per-layer precision ({', '.join(sorted(kinds))}); every layer trains in "
                   f"{plan.dtype} (float8 converters, when on, cover every Linear except filter_fqns)")
    if c.compression_methods(plan):
        out.append("torchtitan: no gradient compression (mixed_precision_reduce only allows float32); plan uses "
                   + ", ".join(sorted(c.compression_methods(plan))))
    return out


def _activation_checkpoint(plan: Plan) -> dict:
    """``[activation_checkpoint]``: none / full as they are; Megatron-style selective (core attention) and op both as
    op-level selective AC (the closest torchtitan has); full:N as layer-level selective every k-th layer."""
    if plan.recompute in ("none", "full"):
        return {"mode": plan.recompute}
    if c.recompute_layers(plan):
        return {"mode": "selective", "selective_ac_option": str(_ac_every(plan))}
    return {"mode": "selective", "selective_ac_option": "op"}


def sections(plan: Plan) -> dict[str, dict]:
    """The job config as ``{section: {key: value}}`` (dotted section names, output order)."""
    d, m = plan.degrees, plan.model
    dt = c.dtype_of(plan)
    name = MODEL_NAME.get(m.model_type, m.model_type)
    model: dict = {"name": name}
    flavor = _flavor(plan, name)
    if flavor:
        model["flavor"] = flavor
    recipe = c.fp8_recipe(plan)
    if recipe in FP8:
        model["converters"] = [FP8[recipe][0]]
    local, pp_mbs = _batches(plan)
    training = {"local_batch_size": local, "global_batch_size": plan.global_batch, "seq_len": plan.seq_len,
                "mixed_precision_param": "float32" if dt == "fp32" else "bfloat16",
                "mixed_precision_reduce": "float32"}
    par: dict = {"data_parallel_replicate_degree": d.dp_replicate, "data_parallel_shard_degree": d.dp_shard}
    if d.dp_shard > 1:
        par["fsdp_reshard_after_forward"] = "default" if plan.zero_stage == 3 else "never"
    par["tensor_parallel_degree"] = d.tp
    if plan.tp_overlap:
        par["enable_async_tensor_parallel"] = True
    par["pipeline_parallel_degree"] = d.pp
    if d.pp > 1:
        par["pipeline_parallel_schedule"] = _schedule(plan)
        if c.layers_evenly_split(plan):
            # Embedding and output are not counted as layers, so ceil(L / lps) = pp * vpp exactly.
            par["pipeline_parallel_first_stage_less_layers"] = 0
            par["pipeline_parallel_last_stage_less_layers"] = 0
            par["pipeline_parallel_layers_per_stage"] = m.num_layers // (d.pp * d.vpp)
        else:
            parts, first = [], 0
            for i, s in enumerate(plan.stages):
                fqns = ["tok_embeddings"] if i == 0 else []
                fqns += [f"layers.{j}" for j in range(first, first + s.num_layers)]
                if i == len(plan.stages) - 1:
                    fqns += ["norm", "output"]
                parts.append(fqns)
                first += s.num_layers
            par["module_fqns_per_model_part"] = parts
        par["pipeline_parallel_microbatch_size"] = pp_mbs
    par["context_parallel_degree"] = d.cp
    if d.cp > 1:
        par["context_parallel_rotate_method"] = ROTATE[plan.cp_kind]
    par["expert_parallel_degree"] = d.ep
    if d.ep > 1:
        par["expert_tensor_parallel_degree"] = c.expert_tp(plan)  # the plan's etp, else experts stay over tp
    out = {"model": model, "training": training, "parallelism": par,
           "activation_checkpoint": _activation_checkpoint(plan)}
    if plan.stack == "torchtitan":  # the compiled kernels the plan priced; off (eager) is v0.2.2's Compile default
        out["compile"] = {"enable": True, "components": ["model", "loss"]}
    if recipe in FP8:
        out[FP8[recipe][0]] = {"recipe_name": FP8[recipe][1], "filter_fqns": ["output"]}
    return out


def document(plan: Plan) -> dict:
    """The job config as nested tables (``quantize.linear.float8`` becomes ``quantize -> linear -> float8``)."""
    doc: dict = {}
    for sec, kv in sections(plan).items():
        table = doc
        for part in sec.split("."):
            table = table.setdefault(part, {})
        table.update(kv)
    return doc


def render(plan: Plan) -> str:
    """The TOML text, written by tomli-w (strings from user files are escaped by the TOML writer, not by hand)."""
    lines = [f"# {h}" for h in c.header(plan, "TorchTitan job config", "torchtitan v0.2.2 TOML")]
    lines.append("# torchrun ... -m torchtitan.train --job.config_file this.toml")
    return "\n".join(lines) + "\n\n" + tomli_w.dumps(document(plan))
