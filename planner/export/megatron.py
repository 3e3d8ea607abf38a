"""Megatron-LM ``pretrain_gpt.py`` launch script (torchrun + argument arrays).

Flag names and the cross-field rules of ``validate_args`` are from NVIDIA/Megatron-LM @ d98e8a64ddf3
(``megatron/training/arguments.py``), as recorded in shared/notes/exports.md (b). ``--add-qkv-bias`` and
``--qk-layernorm`` are plain ``add_argument`` flags of the same file. DP is not a flag: Megatron derives
dp = world / (tp * pp * cp). Data, tokenizer, optimizer and schedule arguments are the user's: the script appends
its own command-line arguments ("$@") after the rendered ones.

The further decisions carried (flag names checked against megatron-core 0.16.1's ``TransformerConfig`` /
``ModelParallelConfig`` fields, whose names the parser's flags are generated from): uneven and interleaved pipelines
as ``--pipeline-model-parallel-layout`` (one entry per virtual stage, so it is exact for any split; the
first/last-stage flags only express a split whose middle stages are equal and cannot be combined with it), ``etp`` as
``--expert-tensor-parallel-size`` (MoE parallel folding), the fp8 recipe as ``--fp8-recipe`` (delayed with Transformer
Engine's DelayedScaling defaults for the amax history), ``cp_kind`` as ``--cp-comm-type p2p|all_gather|a2a``,
``moe_capacity`` as ``--moe-expert-capacity-factor`` + ``--moe-pad-expert-input-to-capacity`` (padded, as priced)
+ ``--moe-token-drop-policy probs``, ``moe_overlap`` as ``--overlap-moe-expert-parallel-comm`` (the combined 1F1B
EP all-to-all overlap; ``--delay-wgrad-compute`` is left to the user: it needs Transformer Engine's grouped GEMM),
``recompute full:N`` as ``--recompute-method block --recompute-num-layers N``, an interleaved pipeline priced
with its sends in line (``pp_overlap``) as ``--no-overlap-p2p-communication``, ``shared_overlap`` as
``--moe-shared-expert-overlap`` (refused with the DeepEP dispatcher or beside moe_overlap, as megatron-core refuses
it), ``recompute_modules`` as ``--recompute-modules`` (nargs='*'), ``mtp`` as ``--mtp-num-layers``,
``offload_layers`` as ``--cpu-offloading --cpu-offloading-num-layers N`` (ModelParallelConfig ``cpu_offloading``,
``cpu_offloading_num_layers``; refused with pp > 1 or recomputation, as megatron-core refuses it), the layers kept in
bf16 under a low-precision recipe (``bf16_first_layers``, ``bf16_last_layers``) as ``--first-last-layers-bf16
--num-layers-at-start-in-bf16 N --num-layers-at-end-in-bf16 M`` (refused where megatron-core refuses it:
``layout.bf16_layers_problem``), ``cuda_graphs`` as core_v0.16.0's ``--cuda-graph-impl`` and ``--cuda-graph-scope``
(``transformer_engine`` with ``attn``, the MoE router and preprocessing per layer; ``local`` with ``full_iteration``
for the whole iteration: the release megatron-core 0.16.1 reads back; Megatron-LM @ d98e8a64ddf3 renames
``--cuda-graph-scope`` to ``--cuda-graph-modules`` and still takes the old flags, migrating ``full_iteration`` to
``--cuda-graph-impl full_iteration``, and drops core_v0.16.0's refusal of the whole-iteration graph under expert
parallelism, which this export keeps for the release it writes), ``moe_fused_mlp`` as
``--use-transformer-engine-op-fuser --moe-mlp-glu-interleave-size 32`` with ``NVTE_CUTEDSL_FUSED_GROUPED_MLP=1``
exported (Megatron-LM @ d98e8a64ddf3's fields; megatron-core 0.16.1 predates them). Refused in one line:
``recompute op`` (Megatron has no op-level selective checkpointing) and ``moe_overlap`` where Megatron asserts
against it.
"""
from __future__ import annotations

from meshplan.planner.export import _common as c
from meshplan.planner.export import placement, torchrun
from meshplan.planner.layout.layout import (
    bf16_layers_problem,
    megatron_dispatch_refusal,
    megatron_moe_overlap_refusal,
    p2p_overlapped,
)
from meshplan.planner.plan.schema import Plan

EXTENSION = "sh"
ENTRY = "pretrain_gpt.py"
MAMBA_ENTRY = "pretrain_mamba.py"
# The families whose RoPE base the export writes (--rotary-base) and whose scaling it names where it has no flag
ROPE_THETA_FAMILIES = (*c.ROPE_SWIGLU_FAMILIES, "gpt_neox", "nemotron", "gpt_oss")
# plan cp_kind -> TransformerConfig.cp_comm_type ("p2p" ring, "all_gather", "a2a" Ulysses)
CP_COMM_TYPE = {"ring": "p2p", "allgather": "all_gather", "a2a": "a2a"}


def check(plan: Plan, flags: bool = True) -> None:
    """Megatron's own constraints (exports.md, "What meshplan should check", item 1); ``flags``: the plan runs from
    Megatron-LM's command line (Megatron-Bridge builds the same ``TransformerConfig`` from its own config)."""
    c.check_plan(plan)
    if flags:  # arguments.py generates flags from TransformerConfig but excludes this field (_add_network_size_args)
        c.refuse_fp8_attention(plan, "megatron", "Megatron-LM's arguments.py has no flag for TransformerConfig."
                               "fp8_dot_product_attention (its generated flags exclude it)")
    d, m = plan.degrees, plan.model
    if flags and m.model_type in c.GEMMA_FAMILIES:
        caps = ", its embedding scaling and its soft-capped attention scores and logits" if m.model_type == "gemma2" \
            else " and its embedding scaling"
        c.fail(f"megatron: {m.name} ({m.model_type}): Gemma's gated MLP under tanh GELU (Megatron-LM's arguments.py "
               f"has --swiglu and --quick-geglu only), its post-block norms{caps} have no Megatron-LM flag; export "
               "--to megatron-bridge, whose Gemma providers build them")
    world = plan.cluster.world_size
    if world % (d.tp * d.pp * d.cp):
        c.fail(f"megatron: world {world} is not divisible by tp*pp*cp = {d.tp}*{d.pp}*{d.cp}")
    if m.num_attention_heads % d.tp:
        c.fail(f"megatron: num_attention_heads={m.num_attention_heads} is not divisible by tp={d.tp}")
    if m.num_kv_heads % d.tp and d.tp % m.num_kv_heads:
        c.fail(f"megatron: num_query_groups={m.num_kv_heads} and tp={d.tp}: one must divide the other")
    if c.layers_evenly_split(plan):
        if m.num_layers % d.pp:
            c.fail(f"megatron: num_layers={m.num_layers} is not divisible by pp={d.pp}")
        if d.vpp > 1 and m.num_layers % (d.pp * d.vpp):
            c.fail(f"megatron: num_layers={m.num_layers} is not divisible by pp*vpp = {d.pp}*{d.vpp} = "
                   f"{d.pp * d.vpp} (--num-layers-per-virtual-pipeline-stage must be whole)")
    if d.vpp > 1 and plan.grad_accum < d.pp:
        # Interleaved schedule: microbatch group size (default pp) <= number of microbatches (schedules.py).
        c.fail(f"megatron: interleaved pipeline needs microbatches >= pp, got global/(micro*dp) = "
               f"{plan.global_batch}/({plan.micro_batch}*{d.dp}) = {plan.grad_accum} < pp={d.pp}")
    if m.num_experts and d.tp > 1 and not plan.sequence_parallel:
        # validate_args: "When using MoE and tensor parallelism, sequence parallelism must be used."
        c.fail(f"megatron: MoE with tp={d.tp} needs sequence_parallel=true")
    etp = c.expert_tp(plan)
    if d.ep > 1 and world % (etp * d.ep * d.pp):
        c.fail(f"megatron: world {world} is not divisible by expert_tp*ep*pp = {etp}*{d.ep}*{d.pp}")
    if plan.recompute == "op":
        c.fail("megatron: recompute=op (torchtitan's op-level selective checkpointing) has no Megatron flag; "
               "Megatron's selective recompute keeps every GEMM output and recomputes core attention (re-plan with "
               "--fix recompute=selective, or export to torchtitan)")
    if plan.fp8_params and c.fp8_recipe(plan) != "none" and plan.zero_stage == 0:
        c.fail("megatron: fp8_params (--fp8-param-gather) needs the distributed optimizer or an FSDP (zero >= 1)")
    problem = bf16_layers_problem(*c.bf16_layers(plan), m.num_layers, d.pp, c.fp8_recipe(plan))
    if problem:  # TransformerConfig.__post_init__ (megatron-core 0.16.1) raises for it
        c.fail(f"megatron: {problem} (--first-last-layers-bf16)")
    if plan.offload_layers and (d.pp > 1 or plan.recompute != "none" or plan.offload_layers >= m.num_layers):
        # TransformerConfig.__post_init__ (megatron-core 0.16.1) raises for each of these
        c.fail(f"megatron: offload_layers={plan.offload_layers} (--cpu-offloading-num-layers) needs pp=1, no "
               f"recomputation and fewer than the {m.num_layers} layers (pp={d.pp}, recompute={plan.recompute})")
    if plan.moe_overlap and m.num_experts:
        # TransformerConfig.__post_init__ asserts these for overlap_moe_expert_parallel_comm (megatron-core 0.16.1);
        # the pipeline, recomputation and MTP ones as the planner states them (layout.megatron_moe_overlap_refusal)
        rule = megatron_moe_overlap_refusal(d.pp, d.vpp, plan.recompute, plan.mtp)
        why = ("needs ep > 1" if d.ep == 1 else f"needs {rule}" if rule else
               f"needs bf16 or fp16, not {plan.dtype}" if c.dtype_of(plan) == "fp32" else "")
        if why:
            c.fail(f"megatron: moe_overlap (--overlap-moe-expert-parallel-comm) {why}")
    dispatch = megatron_dispatch_refusal(plan.moe_dispatcher, plan.moe_capacity) if m.num_experts else ""
    if dispatch:
        c.fail(f"megatron: {dispatch}")
    if plan.shared_overlap and m.num_experts:
        # TransformerConfig.__post_init__ (megatron-core 0.16.1): moe_shared_expert_overlap "only works with alltoall
        # token dispatcher", and not beside overlap_moe_expert_parallel_comm
        why = ("needs shared experts" if not m.num_shared_experts else
               f"works only with the alltoall dispatcher, not {plan.moe_dispatcher}"
               if plan.moe_dispatcher != "alltoall" else
               "cannot run beside moe_overlap (--overlap-moe-expert-parallel-comm)" if plan.moe_overlap else "")
        if why:
            c.fail(f"megatron: shared_overlap (--moe-shared-expert-overlap) {why}")
    if d.vpp > 1 and plan.pp_overlap is False and d.pp <= 2:
        # validate_args: an interleaved pipeline without p2p overlap needs pp > 2 (shared/notes/exports.md (b))
        c.fail(f"megatron: pp_overlap=false (--no-overlap-p2p-communication) with vpp={d.vpp} needs pp > 2, got "
               f"pp={d.pp}")
    if plan.cuda_graphs in ("layers", "mixers") and plan.recompute.startswith("full"):
        c.fail(f"megatron: cuda_graphs={plan.cuda_graphs} with recompute={plan.recompute}: Megatron-Core recomputes "
               f"whole layers only under the full-iteration graph")
    if plan.cuda_graphs == "iteration" and plan.moe_overlap and m.num_experts:
        # TransformerConfig.__post_init__ (megatron-core 0.16.1): under overlap_moe_expert_parallel_comm the graphs
        # must be Transformer Engine's and hold no moe or mlp scope
        c.fail("megatron: cuda_graphs=iteration with moe_overlap: Megatron-Core 0.16 graphs an EP-overlapped model "
               "only per layer (cuda_graphs=layers)")
    if flags and plan.cuda_graphs == "iteration" and m.num_experts and d.ep > 1:
        # arguments.py (core_v0.16.0) validate_args: cuda_graph_impl local with expert parallelism asserts
        # --moe-pad-experts-for-cuda-graph-inference, an inference option
        c.fail(f"megatron: cuda_graphs=iteration with ep={d.ep}: Megatron-LM core_v0.16.0's validate_args takes the "
               f"local graph with expert parallelism for inference only (--moe-pad-experts-for-cuda-graph-inference); "
               f"Megatron-Bridge's performance scripts train it (export to megatron-bridge)")
    if d.cp > 1 and plan.seq_len % (2 * d.cp):
        # Load-balanced CP splits the sequence into 2*cp chunks (megatron/core/utils.get_batch_on_this_cp_rank).
        c.fail(f"megatron: seq_len={plan.seq_len} is not divisible by 2*cp = {2 * d.cp}")


def _sends_in_line(plan: Plan) -> bool:
    """Whether the job gets ``--no-overlap-p2p-communication``: an interleaved plan that priced its pipeline sends in
    line (``planner.layout.layout.p2p_overlapped``), except where Megatron refuses in-line sends (pp <= 2) and the plan
    did
    not pin them (another stack's default): that job keeps Megatron's overlap, and ``unsupported`` says so."""
    d = plan.degrees
    if d.vpp == 1 or _p2p_priced_overlapped(plan):
        return False
    return plan.pp_overlap is False or d.pp > 2


def _p2p_priced_overlapped(plan: Plan) -> bool:
    return p2p_overlapped(plan.pp_overlap, plan.stack, plan.degrees.pp, plan.schedule)


def _shards_over(plan: Plan) -> int:
    """Ranks the plan shards optimizer state over: dp_shard x cp (design.md; Megatron's distributed optimizer
    shards over the data-parallel group with context parallel,
    ``get_data_parallel_group(with_context_parallel=True)``)."""
    return plan.degrees.dp_shard * plan.degrees.cp


def _uses_fsdp(plan: Plan) -> bool:
    return plan.zero_stage >= 2 and _shards_over(plan) > 1


def unsupported(plan: Plan) -> list[str]:
    """Plan decisions Megatron-LM's arguments cannot carry."""
    out = c.common_notes(plan, "megatron", placed=placement.is_heterogeneous_pipeline(plan))
    if plan.cuda_graphs != "none" and plan.recompute == "selective":
        out.append("megatron: cuda_graphs with selective recomputation: Megatron-Core graphs a recomputed module "
                   "only without dropout; rendered --attention-dropout 0.0 --hidden-dropout 0.0 (meshplan prices no "
                   "dropout)")
    out += c.stack_notes(plan, "megatron", "megatron")
    out += c.moe_notes(plan, "megatron", overlap=True, capacity=True, deepep=True, router_fusion=True,
                       aux_loss=True)
    out += c.state_dtype_notes(plan, "megatron", optim=("fp32", "remainder"), grads=("bf16", "fp32"),
                               reduce=("bf16", "fp32"))
    if plan.reduce_dtype and plan.grad_dtype and plan.reduce_dtype != plan.grad_dtype:
        out.append(f"megatron: reduce_dtype={plan.reduce_dtype}: Megatron-Core reduces gradients in their buffer's "
                   f"dtype (grad_dtype={plan.grad_dtype}, which the arguments set)")
    out += c.fsdp_notes(plan, "megatron", "megatron")
    d = plan.degrees
    if d.vpp > 1 and not _p2p_priced_overlapped(plan) and not _sends_in_line(plan):
        out.append(f"megatron: pp_overlap: the plan priced the pipeline's sends in line (stack={plan.stack}); Megatron "
                   f"overlaps them here, as it refuses in-line sends with vpp > 1 at pp={d.pp}")
    if plan.pp_overlap and d.pp > 1 and d.vpp == 1:
        out.append("megatron: pp_overlap: Megatron-LM overlaps the pipeline's sends only in the interleaved schedule "
                   "(vpp > 1); this 1F1B job waits for them in line, which the plan did not price")
    if plan.schedule == "gpipe" and plan.degrees.pp > 1:
        out.append("megatron: no GPipe schedule; Megatron runs 1F1B (interleaved when vpp > 1)")
    kinds = c.mixed_layer_precision(plan)
    if kinds:
        out.append(f"megatron: no per-layer precision ({', '.join(sorted(kinds))} in the plan); "
                   f"every layer runs in {plan.dtype}")
    methods = c.compression_methods(plan)
    lossy = methods - {"bf16"}
    if lossy:
        out.append(f"megatron: no gradient compression option for {', '.join(sorted(lossy))}; "
                   "gradients are reduced uncompressed")
    if plan.compression and any(b.where == "cpu" for b in plan.compression):
        out.append("megatron: no CPU-side gradient compression")
    m = plan.model
    if m.model_type == "nemotron":
        out.append("megatron: Nemotron's rotary embedding on part of each head (partial_rotary_factor) and its "
                   "LayerNorm1P are not in the plan; add the model's --rotary-percent and zero-centred-gamma flags")
    if m.model_type in ROPE_THETA_FAMILIES:
        if not m.rope_theta:
            out.append("megatron: the plan does not record rope_theta; add --rotary-base <config.json rope_theta> "
                       "(Megatron's default is 10000)")
        if m.rope_scaling_type and m.rope_scaling_type != "llama3":
            out.append(f"megatron: RoPE scaling {m.rope_scaling_type!r} (factor {m.rope_scaling_factor:g}) has no "
                       "flag here (only Llama 3.x scaling: --use-rope-scaling); add the model's own rope flags")
    if m.model_type in ("deepseek_v3", "glm4_moe"):
        family = "DeepSeek-V3" if m.model_type == "deepseek_v3" else "GLM-4.5"
        out.append(f"megatron: {family} router details (sigmoid scores, expert bias, group-limited top-k, "
                   "routed scaling factor) are not in the plan; add Megatron's --moe-router-* flags")
    if m.model_type == "gpt_oss" and not (m.sliding_window and m.window_layers):
        out.append("megatron: the plan does not record GPT-OSS's sliding window (made before the field); add "
                   "--window-size 128,0 --window-attn-skip-freq 2")
    if m.model_type == "nemotron_h" and not m.layer_pattern:
        out.append("megatron: the plan does not record the hybrid layer pattern and Mamba-2 mixers (made before "
                   "the fields); add the model's --hybrid-override-pattern and --mamba-* flags")
    if m.model_type == "nemotron_h" and plan.mtp:
        out.append(f"megatron: mtp={plan.mtp}: a hybrid's MTP modules (their own block pattern) have no Megatron-LM "
                   "core_v0.16.0 flag; export to megatron-bridge")
    if m.model_type == "nemotron_h" and m.num_experts:
        out.append("megatron: Nemotron 3 router details (sigmoid scores, expert bias, top-k scaling) are not in the "
                   "plan; add Megatron's --moe-router-* flags")
    if m.num_experts and not m.moe_ffn_hidden_size:
        out.append("megatron: the plan does not record the expert FFN width; Megatron uses --ffn-hidden-size "
                   "for experts unless --moe-ffn-hidden-size is given")
    if _uses_fsdp(plan) and plan.degrees.pp > 1:
        out.append(f"megatron: Megatron-FSDP (zero_stage={plan.zero_stage}) with pp={plan.degrees.pp} is not "
                   "validated upstream; prefer zero_stage 1 (--use-distributed-optimizer) with pipelining")
    return out


def _layout(plan: Plan) -> str:
    """``--pipeline-model-parallel-layout`` for uneven stages: E = embedding, t = decoder layer, m = MTP module,
    L = loss head, stages separated by ``|`` in model order (virtual stage v of rank r is stage v*pp + r); ``t*n``
    repeats (``PipelineParallelLayerLayout.parse_str_to_list``,
    megatron/core/transformer/pipeline_parallel_layer_layout.py).
    """
    parts = [f"t*{s.num_layers}" if s.num_layers else "" for s in plan.stages]  # "E" / "L" alone: no decoder layer
    parts[0] = "E" + parts[0]
    parts[-1] = parts[-1] + "m" * plan.mtp + "L"  # the MTP modules (m) on the last stage, before the loss
    return "|".join(parts)


def parallel_args(plan: Plan) -> list[str]:
    """Parallelism, batch, recompute, optimizer-sharding and precision flags."""
    d = plan.degrees
    a = ["--tensor-model-parallel-size", str(d.tp), "--pipeline-model-parallel-size", str(d.pp),
         "--context-parallel-size", str(d.cp)]
    if not c.layers_evenly_split(plan):
        a += ["--pipeline-model-parallel-layout", c.quote(_layout(plan))]
    elif d.vpp > 1:
        a += ["--num-layers-per-virtual-pipeline-stage", str(plan.model.num_layers // (d.pp * d.vpp))]
    if d.cp > 1:
        a += ["--cp-comm-type", CP_COMM_TYPE[plan.cp_kind]]
    if d.ep > 1 or (plan.etp and plan.model.num_experts):
        # Expert TP is the plan's etp (MoE parallel folding), else the dense tp (ep borrows from dp_shard*cp).
        a += ["--expert-model-parallel-size", str(d.ep), "--expert-tensor-parallel-size", str(c.expert_tp(plan))]
    if plan.moe_overlap and plan.model.num_experts:
        a.append("--overlap-moe-expert-parallel-comm")
    if plan.moe_dispatcher in ("deepep", "hybridep") and plan.model.num_experts:
        a += ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", plan.moe_dispatcher]
    if plan.tp_overlap:
        a.append("--tp-comm-overlap")
    if plan.shared_overlap and plan.model.num_experts:
        a.append("--moe-shared-expert-overlap")
    if plan.moe_router_fusion and plan.model.num_experts:  # TransformerConfig.moe_router_fusion (core_r0.16.0 on)
        a.append("--moe-router-fusion")
    if plan.moe_aux_loss != "none" and plan.model.num_experts:  # its coefficient is the model's (unsupported())
        a += ["--moe-router-load-balancing-type", plan.moe_aux_loss]
    if plan.moe_fused_mlp:  # TransformerConfig fields of Megatron-LM @ d98e8a64ddf3 (not in megatron-core 0.16.1)
        a += ["--use-transformer-engine-op-fuser", "--moe-mlp-glu-interleave-size", "32"]
    if plan.cuda_graphs != "none":  # arguments.py: --cuda-graph-impl, --cuda-graph-scope (nargs='+')
        impl, scope = c.cuda_graph_scope(plan)
        a += ["--cuda-graph-impl", impl, "--cuda-graph-scope", *scope]
        if plan.cuda_graphs == "iteration":  # validate_args: "--no-check-for-nan-in-loss-and-grad should be set
            a.append("--no-check-for-nan-in-loss-and-grad")  # with full_iteration CUDA graph"
        if plan.recompute == "selective":  # TransformerConfig.__post_init__ refuses graphed recomputation under
            # dropout ("attention dropout is not supported with graphed attention recomputation", "hidden dropout is
            # not supported with graphed MLP/MoE recomputation"); both default to 0.1 in arguments.py
            a += ["--attention-dropout", "0.0", "--hidden-dropout", "0.0"]
    if _sends_in_line(plan):  # Megatron-LM overlaps interleaved p2p by default
        a.append("--no-overlap-p2p-communication")
    if plan.sequence_parallel:
        a.append("--sequence-parallel")
    a += ["--micro-batch-size", str(plan.micro_batch), "--global-batch-size", str(plan.global_batch)]
    if plan.recompute == "full":
        a += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    elif c.recompute_layers(plan):  # the first N layers of every stage / virtual chunk
        a += ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers",
              str(c.recompute_layers(plan))]
    elif plan.recompute == "selective":
        a += ["--recompute-granularity", "selective"]
        if plan.recompute_modules:  # nargs='*' (megatron/training/arguments.py); TransformerConfig.recompute_modules
            a += ["--recompute-modules", *plan.recompute_modules.split("+")]
    if plan.mtp:  # --mtp-num-layers (arguments.py _add_mtp_args): the MTP modules, built on the last stage
        a += ["--mtp-num-layers", str(plan.mtp)]
    if plan.offload_layers:  # Transformer Engine offloads the saved tensors of the first N layers
        a += ["--cpu-offloading", "--cpu-offloading-num-layers", str(plan.offload_layers)]
    if plan.zero_stage >= 1 and _shards_over(plan) > 1:
        if _uses_fsdp(plan):
            strategy = "optim_grads_params" if plan.zero_stage == 3 else "optim_grads"
            a += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", strategy, "--ckpt-format",
                  "fsdp_dtensor"]
        else:
            a += ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"]
        if d.dp_replicate > 1 and d.dp_shard > 1:
            # Shard over dp_shard, replicate over dp_replicate (HSDP-like distributed optimizer).
            a += ["--num-distributed-optimizer-instances", str(d.dp_replicate)]
    a += _precision_args(plan)
    if c.compression_methods(plan) & {"bf16"}:
        a.append("--grad-reduce-in-bf16")
    if plan.optim_dtype == "remainder":  # OptimizerConfig.store_param_remainders defaults to True under it
        if not any(f in a for f in ("--use-distributed-optimizer", "--use-megatron-fsdp")):
            a.append("--use-distributed-optimizer")  # the precision-aware optimizer runs inside it (validate_args)
        a.append("--use-precision-aware-optimizer")
    if plan.grad_dtype == "fp32":  # Megatron-LM's own choice for --bf16 runs, stated for fp16 ones
        a.append("--accumulate-allreduce-grads-in-fp32")
    elif "bf16" in (plan.grad_dtype, plan.reduce_dtype) and "--grad-reduce-in-bf16" not in a:
        a.append("--grad-reduce-in-bf16")
    return a


def _precision_args(plan: Plan) -> list[str]:
    """The training dtype, the low-precision recipe and the decoder layers kept out of it."""
    a: list[str] = []
    dt = c.dtype_of(plan)
    if dt == "bf16":
        a.append("--bf16")
    elif dt == "fp16":
        a.append("--fp16")
    elif dt in ("fp8", "nvfp4"):
        a.append("--bf16")
    recipe = c.fp8_recipe(plan)
    if recipe == "nvfp4":  # TE NVFP4BlockScaling (megatron-core 0.16.1 TransformerConfig fp4 / fp4_recipe)
        a += ["--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"]
    elif recipe != "none":  # e4m3 forward, e5m2 gradients; the rest of the model in the 16-bit dtype above
        a += ["--fp8-format", "hybrid", "--fp8-recipe", recipe]
        if recipe == "delayed":  # Transformer Engine DelayedScaling's own defaults (Megatron's are 1, most_recent)
            a += ["--fp8-amax-history-len", "1024", "--fp8-amax-compute-algo", "max"]
        if plan.fp8_params:  # weights held only as fp8 tensors, gathered in fp8 (Layout.fp8_params)
            a.append("--fp8-param-gather")
    first, last = c.bf16_layers(plan)
    if first or last:  # both counts written: TransformerConfig defaults each to 1 under --first-last-layers-bf16
        a += ["--first-last-layers-bf16", "--num-layers-at-start-in-bf16", str(first),
              "--num-layers-at-end-in-bf16", str(last)]
    return a


def model_args(plan: Plan) -> list[str]:
    """Model-shape flags derived from the plan's ModelRef and the family's HF layout (models.md section 1)."""
    m = plan.model
    a = ["--num-layers", str(m.num_layers), "--hidden-size", str(m.hidden_size),
         "--ffn-hidden-size", str(m.ffn_hidden_size), "--num-attention-heads", str(m.num_attention_heads)]
    if m.q_lora_rank or m.kv_lora_rank:
        a += ["--multi-latent-attention", "--kv-lora-rank", str(m.kv_lora_rank)]
        if m.q_lora_rank:
            a += ["--q-lora-rank", str(m.q_lora_rank)]
        if m.head_dim:
            a += ["--qk-head-dim", str(m.head_dim - m.qk_rope_head_dim)]
        a += ["--qk-pos-emb-head-dim", str(m.qk_rope_head_dim)]
        if m.v_head_dim:
            a += ["--v-head-dim", str(m.v_head_dim)]
    else:
        if m.num_kv_heads != m.num_attention_heads:
            a += ["--group-query-attention", "--num-query-groups", str(m.num_kv_heads)]
        if m.head_dim:
            a += ["--kv-channels", str(m.head_dim)]
    a += ["--seq-length", str(plan.seq_len), "--max-position-embeddings", str(plan.seq_len)]
    fam = m.model_type
    if fam in c.ROPE_SWIGLU_FAMILIES:
        a += ["--position-embedding-type", "rope", "--swiglu", "--normalization", "RMSNorm",
              "--disable-bias-linear"]
        if fam == "qwen2" or (fam == "glm4_moe" and m.qkv_bias):
            a.append("--add-qkv-bias")  # Qwen2 hard-codes them (models.md section 2, trap 5); GLM by attention_bias
        if fam in ("qwen3", "qwen3_moe") or m.qk_norm:
            a.append("--qk-layernorm")
        if m.attn_output_gate:  # Qwen3-Next / Qwen3.5: q_proj's second half gates the output (TransformerConfig
            # attention_output_gate); their RMSNorms scale by 1 + w (layernorm_zero_centered_gamma, as Megatron-Bridge's
            # Qwen3NextModelProvider sets it)
            a += ["--attention-output-gate", "--layernorm-zero-centered-gamma"]
        if m.rotary_percent < 1.0:  # GLM-4.5 rotates half of each head (partial_rotary_factor)
            a += ["--rotary-percent", f"{m.rotary_percent:g}"]
    elif fam == "gpt_neox":
        a += ["--position-embedding-type", "rope"]
    elif fam == "nemotron":  # Nemotron-4: rope, the two-matrix squared-ReLU MLP (--squared-relu), no biases
        a += ["--position-embedding-type", "rope", "--squared-relu", "--disable-bias-linear"]
    elif fam == "gpt_oss":  # Megatron-Bridge GPTOSSProvider @ v0.3.1: quick_gelu GLU with the linear part + 1,
        # clamped; learnable softmax (the sinks); biases everywhere (Megatron's default add_bias_linear)
        a += ["--position-embedding-type", "rope", "--normalization", "RMSNorm", "--quick-geglu",
              "--glu-linear-offset", "1.0"]
        if m.glu_clamp:
            a += ["--activation-func-clamp-value", f"{m.glu_clamp:g}"]
        if m.attention_sinks:
            a += ["--softmax-type", "learnable"]
    elif fam == "nemotron_h" and m.layer_pattern:  # pretrain_mamba.py (NVIDIA's own Nemotron-H / Nemotron 3
        # confs, Megatron-LM examples/post_training/modelopt/conf/nvidia @ core_v0.16.0): the pattern, the Mamba-2
        # mixers, squared ReLU, no position embedding, no biases
        a += ["--is-hybrid-model", "--hybrid-override-pattern", c.quote(m.layer_pattern), "--mamba-num-heads",
              str(m.mamba_heads), "--mamba-head-dim", str(m.mamba_head_dim), "--mamba-num-groups",
              str(m.mamba_groups), "--mamba-state-dim", str(m.mamba_state), "--squared-relu",
              "--disable-bias-linear", "--normalization", "RMSNorm", "--position-embedding-type", "none"]
        if m.moe_latent_size:
            a += ["--moe-latent-size", str(m.moe_latent_size)]
    a += window_args(m) + gdn_args(m)
    if fam in ROPE_THETA_FAMILIES and m.rope_theta:
        # Megatron-LM arguments.py: --rotary-base is an int (default 10000); Llama 3.1's rope_theta is 500000.
        a += ["--rotary-base", str(int(round(m.rope_theta)))]
        if m.rope_scaling_type == "llama3":  # --use-rope-scaling applies Llama 3.x scaling; factor default 8.0
            a += ["--use-rope-scaling", "--rope-scaling-factor", f"{m.rope_scaling_factor:g}"]
    elif fam == "gpt2":
        a += ["--position-embedding-type", "learned_absolute"]
    tied = m.tied_embeddings if m.tied_embeddings is not None else fam == "gpt2"
    if not tied:
        a.append("--untie-embeddings-and-output-weights")
    if m.num_experts:
        a += ["--num-experts", str(m.num_experts), "--moe-router-topk", str(m.experts_per_token)]
        if m.moe_ffn_hidden_size:
            a += ["--moe-ffn-hidden-size", str(m.moe_ffn_hidden_size)]
        shared = m.shared_expert_ffn_hidden_size or m.num_shared_experts * m.moe_ffn_hidden_size
        if m.num_shared_experts and shared:
            a += ["--moe-shared-expert-intermediate-size", str(shared)]
            if m.shared_expert_gate:
                a.append("--moe-shared-expert-gate")
        if m.moe_layers and len(m.moe_layers) != m.num_layers and not m.layer_pattern:  # a hybrid's: its pattern
            pattern = _run_length([1 if i in set(m.moe_layers) else 0 for i in range(m.num_layers)])
            a += ["--moe-layer-freq", c.quote(pattern)]
        a.append("--moe-grouped-gemm")
        if plan.moe_dispatcher == "alltoall":  # the flex dispatcher is set with the parallel flags above
            a += ["--moe-token-dispatcher-type", "alltoall"]
        if plan.moe_capacity:  # token dropping, each expert padded to its capacity (as the plan prices it)
            a += ["--moe-expert-capacity-factor", f"{plan.moe_capacity:g}", "--moe-pad-expert-input-to-capacity",
                  "--moe-token-drop-policy", "probs"]
    return a


def entry(plan: Plan) -> str:
    """Megatron-LM's training script for the model: ``pretrain_mamba.py`` builds a hybrid's ``MambaModel``."""
    return MAMBA_ENTRY if plan.model.model_type == "nemotron_h" else ENTRY


def window_args(m) -> list[str]:
    """``--window-size`` and ``--window-attn-skip-freq`` for a model with sliding-window layers: megatron-core's
    ``is_layer_window_attention`` (core_v0.16.0 transformer/utils.py) windows layer n (1-based) unless
    ``n % freq == 0``, or where a list holds 1; every layer without the frequency."""
    if not m.sliding_window or not m.window_layers:
        return []
    own = set(m.window_layers)
    windowed = [int(i in own) for i in range(m.num_layers)]
    a = ["--window-size", f"{m.sliding_window},0"]
    return a if all(windowed) else a + ["--window-attn-skip-freq", _skip_freq(windowed)]


def gdn_args(m) -> list[str]:
    """Megatron-Core's Gated DeltaNet flags for a model with such layers (core_v0.16.0 ``TransformerConfig``
    ``experimental_attention_variant`` gated_delta_net, the ``linear_*`` dims, built by gpt_builders.py's
    experimental-attention-variant block spec): ``--linear-attention-freq`` N makes every layer but each Nth
    (1-based) Gated DeltaNet, or a list of 1s (Gated DeltaNet) and 0s (attention); nothing for other models."""
    if not m.gdn_layers:
        return []
    own = set(m.gdn_layers)
    linear = [int(i in own) for i in range(m.num_layers)]
    return ["--experimental-attention-variant", "gated_delta_net", "--linear-attention-freq", _skip_freq(linear),
            "--linear-conv-kernel-dim", str(m.gdn_conv_kernel), "--linear-key-head-dim", str(m.gdn_key_head_dim),
            "--linear-value-head-dim", str(m.gdn_value_head_dim), "--linear-num-key-heads", str(m.gdn_key_heads),
            "--linear-num-value-heads", str(m.gdn_value_heads)]


def _skip_freq(flags: list[int]) -> str:
    """A per-layer 0/1 list as Megatron's frequency arguments take it (``--window-attn-skip-freq``,
    ``--linear-attention-freq``): N where every layer but each Nth (1-based) holds 1, else the list expression."""
    for freq in range(2, len(flags) + 1):
        if flags == [int((i + 1) % freq != 0) for i in range(len(flags))]:
            return str(freq)
    return c.quote(_run_length(flags))


def _run_length(flags: list[int]) -> str:
    """Megatron's list-expression form of --moe-layer-freq, e.g. ``[0]*3+[1]*58`` (exports.md (b))."""
    runs: list[list[int]] = []
    for f in flags:
        if runs and runs[-1][0] == f:
            runs[-1][1] += 1
        else:
            runs.append([f, 1])
    return "+".join(f"[{f}]*{n}" for f, n in runs)


def data_args(plan: Plan) -> list[str]:
    """Synthetic data with the model's vocabulary; replace with your dataset and tokenizer."""
    return ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(plan.model.vocab_size), "--mock-data"]


def _array(name: str, words: list[str]) -> str:
    return f"{name}=(\n  " + c.bash_lines(words, indent="  ").replace(" \\\n", "\n") + "\n)"


def render(plan: Plan) -> str:
    """A bash script: env, three argument arrays, and the torchrun line."""
    d = plan.degrees
    lines = ["#!/bin/bash"] + [f"# {h}" for h in c.header(plan, "Megatron-LM", "NVIDIA/Megatron-LM @ d98e8a64ddf3")]
    lines.append("# Extra arguments (data, optimizer, --train-iters, --lr, --rotary-base ...) are passed through: "
                 "./this.sh --train-iters 1000 --lr 3e-4")
    lines += torchrun.preamble(plan)
    if (d.tp > 1 or d.cp > 1) and not _uses_fsdp(plan):
        # validate_args asserts this on pre-Blackwell GPUs when TP or CP > 1 (exports.md (b), runtime env gotcha).
        lines.append("export CUDA_DEVICE_MAX_CONNECTIONS=1")
    if plan.moe_fused_mlp:  # Transformer Engine fuses the grouped MLP only with it (ops/fused/forward_grouped_mlp.py)
        lines.append("export NVTE_CUTEDSL_FUSED_GROUPED_MLP=1")
    lines.append(_array("PARALLEL_ARGS", parallel_args(plan)))
    lines.append(_array("MODEL_ARGS", model_args(plan)))
    lines.append(_array("DATA_ARGS", data_args(plan)))
    launch = (["torchrun"] + torchrun.launcher_args(plan)
              + [f'"${{MEGATRON_ENTRY:-{entry(plan)}}}"', '"${PARALLEL_ARGS[@]}"', '"${MODEL_ARGS[@]}"',
                 '"${DATA_ARGS[@]}"', '"$@"'])
    lines.append(c.bash_lines(launch))
    return "\n".join(lines) + "\n"
