"""Search: evaluate every candidate layout, keep those that fit, rank by predicted step time, build ``Plan``s."""
from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

from meshplan.core.errors import MeshplanError
from meshplan.core.version import meshplan_version
from meshplan.planner.estimate import Estimate, Estimator, Workload
from meshplan.planner.estimators import estimator_for
from meshplan.planner.layout import Layout, format_pp_layout
from meshplan.planner.memory import GiB
from meshplan.planner.plan import Breakdown, ModelRef, Plan, Prediction, Stage
from meshplan.planner.space import MAX_LAYOUTS, Pins, check_space_size, enumerate_layouts, explain_empty


@dataclass
class SearchResult:
    """Ranked feasible candidates (best first) and the search's own figures."""

    ranked: list[tuple[Layout, Estimate]]
    evaluated: int
    feasible: int
    wall_s: float
    closest_miss: Optional[tuple[Layout, Estimate]] = None
    invalid_reasons: list[str] = field(default_factory=list)


def search(work: Workload, fix: Pins | Mapping[str, object] | None = None, top: int = 10,
           progress: Callable[[int], None] | None = None, estimator: Estimator | None = None,
           max_layouts: int = MAX_LAYOUTS) -> SearchResult:
    """Evaluate every layout in the space; keep the ``top`` fastest that fit in memory.

    Args:
        work: Model, cluster, batch, sequence, dtype.
        fix: Pinned decisions (``planner.space.Pins``, or a mapping of ``--fix`` keys).
        top: How many ranked layouts to keep.
        progress: Called with the count of layouts evaluated so far.
        estimator: What prices a layout (``planner.estimators.estimator_for``; ``None``: the cluster's, with the
            shipped cost model and neutral host terms).
        max_layouts: Refuse, before enumerating, a space that could hold more candidates
            (``planner.space.check_space_size``).

    Raises:
        MeshplanError: a pinned value breaks a rule (the rule and numbers), or nothing fits (the closest
            candidate and by how many GiB it misses).
    """
    t0 = time.perf_counter()
    model, cluster = work.model, work.cluster
    fix = Pins.of(fix)
    if cluster.is_heterogeneous:
        raise MeshplanError(f"cluster {cluster.spec} is heterogeneous; use the partition solver "
                            "(meshplan plan picks it automatically for mixed clusters)")
    check_space_size(model, cluster.world_size, cluster.devices_per_node, work.global_batch, fix, max_layouts)
    if estimator is None:
        estimator = estimator_for(cluster)
    estimate = estimator.estimate
    heap: list = []
    evaluated = feasible = 0
    closest = None
    invalid: list[str] = []
    seq = 0
    for layout in enumerate_layouts(model, cluster.world_size, cluster.devices_per_node, work.global_batch,
                                    work.seq_len, fix):
        try:
            layout.validate(world_size=cluster.world_size, num_layers=model.num_layers,
                            num_heads=model.num_heads, num_kv_heads=model.num_kv_heads,
                            seq_len=work.seq_len, global_batch=work.global_batch, num_experts=model.num_experts)
        except MeshplanError as exc:
            if len(invalid) < 5:
                invalid.append(str(exc))
            continue
        evaluated += 1
        if progress and evaluated % 512 == 0:
            progress(evaluated)
        est = estimate(work, layout)
        if not est.fits:
            miss = est.memory.total_bytes - est.memory_limit_bytes
            if closest is None or miss < closest[1].memory.total_bytes - closest[1].memory_limit_bytes:
                closest = (layout, est)
            continue
        feasible += 1
        seq += 1
        heap.append((_rank_key(layout, est), seq, layout, est))
    if progress:
        progress(evaluated)
    wall = time.perf_counter() - t0
    if evaluated == 0:
        why = invalid[0] if invalid else explain_empty(model, cluster.world_size, work.global_batch,
                                                       work.seq_len, fix)
        raise MeshplanError(f"no valid layout for {model.name} on {cluster.spec}: {why}")
    if not heap:
        lay, est = closest
        raise MeshplanError(
            f"{model.name} fits nowhere on {cluster.spec} ({evaluated} layouts tried): closest is "
            f"{describe(lay)} needing {est.memory.total_bytes / GiB:.1f} GiB of "
            f"{est.memory_limit_bytes / GiB:.1f} GiB usable — misses by "
            f"{(est.memory.total_bytes - est.memory_limit_bytes) / GiB:.1f} GiB")
    ranked = [(lay, est) for _, _, lay, est in heapq.nsmallest(top, heap)]
    return SearchResult(ranked, evaluated, feasible, wall, closest, invalid)


def _rank_key(layout: Layout, est: Estimate) -> tuple:
    """Fastest first; within 0.1% of step time, the simpler layout (fewer parallel dimensions), then less memory."""
    dims = sum(d > 1 for d in (layout.dp_shard, layout.tp, layout.pp, layout.vpp, layout.cp, layout.ep))
    return (float(f"{est.step_time_s:.3g}"), dims, est.memory.total_bytes)


def describe(layout: Layout) -> str:
    """Short human form: ``dp=4(2x2) tp=8 pp=4 vpp=2 cp=1 ep=1 mbs=1 zero=1 recompute=full sp``."""
    parts = [f"dp={layout.dp}" + (f"({layout.dp_replicate}x{layout.dp_shard})" if layout.dp_shard > 1 else ""),
             f"tp={layout.tp}", f"pp={layout.pp}" + (f"({format_pp_layout(layout.pp_layout)})"
                                                       if layout.pp_layout else "")]
    if layout.vpp > 1:
        parts.append(f"vpp={layout.vpp}")
    if layout.pipeline_schedule in ("zbh1", "dualpipe"):
        parts.append(layout.pipeline_schedule)
    if layout.cp > 1:
        parts.append(f"cp={layout.cp}" + (f"({layout.cp_kind})" if layout.cp_kind != "ring" else ""))
    if layout.ep > 1:
        parts.append(f"ep={layout.ep}")
    if layout.etp:
        parts.append(f"etp={layout.etp}")
    parts += [f"mbs={layout.micro_batch}", f"zero={layout.zero_stage}", f"recompute={layout.recompute}"]
    if layout.sequence_parallel:
        parts.append("sp")
    if layout.tp_overlap:
        parts.append("tp_overlap")
    if layout.fp8 != "none":
        parts.append(f"fp8={layout.fp8}")
    if layout.moe_overlap:
        parts.append("moe_overlap")
    if layout.moe_dispatcher != "alltoall":
        parts.append(f"moe_dispatcher={layout.moe_dispatcher}")
    if layout.stack != "megatron":
        parts.append(f"stack={layout.stack}")
    return " ".join(parts)


def model_ref(m, model_source: str) -> ModelRef:
    """The plan's copy of what exporters need of the model."""
    return ModelRef(name=m.name, source=model_source, model_type=m.model_type, num_params=m.num_params,
                    hidden_size=m.hidden_size, num_layers=m.num_layers, num_attention_heads=m.num_heads,
                    num_kv_heads=m.num_kv_heads, ffn_hidden_size=m.ffn_hidden_size or m.moe_ffn_hidden_size,
                    vocab_size=m.vocab_size, num_experts=m.num_experts, experts_per_token=m.experts_per_token,
                    head_dim=m.head_dim, moe_ffn_hidden_size=m.moe_ffn_hidden_size,
                    num_shared_experts=m.num_shared_experts, moe_layers=tuple(m.moe_layers),
                    tied_embeddings=m.tied_embeddings, q_lora_rank=m.q_lora_rank, kv_lora_rank=m.kv_lora_rank,
                    qk_rope_head_dim=m.qk_rope_head_dim, v_head_dim=m.v_head_dim, rope_theta=m.rope_theta,
                    rope_scaling_type=m.rope_scaling_type, rope_scaling_factor=m.rope_scaling_factor)


def to_plan(work: Workload, layout: Layout, est: Estimate, name: str, model_source: str, costmodel: str) -> Plan:
    """The ``Plan`` value for one evaluated layout (``costmodel``: what priced it, ``Estimator.name``)."""
    return Plan(
        name=name,
        model=model_ref(work.model, model_source),
        cluster=work.cluster.to_ref(),
        global_batch=work.global_batch, micro_batch=layout.micro_batch, seq_len=work.seq_len,
        degrees=layout.degrees,
        sequence_parallel=layout.sequence_parallel, zero_stage=layout.zero_stage, recompute=layout.recompute,
        schedule=layout.schedule, attention=layout.attention, dtype=work.dtype, etp=layout.etp, fp8=layout.fp8,
        cp_kind=layout.cp_kind, stack=layout.stack, moe_overlap=layout.moe_overlap,
        moe_capacity=layout.moe_capacity, moe_imbalance=layout.moe_imbalance, moe_dispatcher=layout.moe_dispatcher,
        tp_overlap=layout.tp_overlap,
        stages=_stages(layout),
        prediction=prediction_of(est, costmodel),
        meshplan_version=meshplan_version(),
    )


def _stages(layout: Layout):
    """Uneven pipeline stages as the plan's ``stages`` (all on the one device group); ``None`` when even."""
    if not layout.pp_layout:
        return None
    firsts = [sum(layout.pp_layout[:i]) for i in range(len(layout.pp_layout))]
    return tuple(Stage(first_layer=f, num_layers=n, device_group=0) for f, n in zip(firsts, layout.pp_layout))


def prediction_of(est: Estimate, costmodel: str) -> Prediction:
    return Prediction(
        step_time_s=est.step_time_s, tokens_per_s=est.tokens_per_s, tflops_per_device=est.tflops_per_device,
        hw_tflops_per_device=est.hw_tflops_per_device, mfu=est.mfu, peak_memory_bytes=est.memory.total_bytes,
        breakdown=Breakdown(compute_s=est.compute_s, exposed_comm_s=est.exposed_comm_s, bubble_s=est.bubble_s,
                            other_s=est.other_s),
        memory_bytes=est.memory.as_dict(), costmodel=costmodel,
    )


def layout_row(layout: Layout, est: Estimate) -> dict:
    """JSON row for ``meshplan plan --json``: every degree plus the headline predictions."""
    return {
        "layout": describe(layout),
        "dp_replicate": layout.dp_replicate, "dp_shard": layout.dp_shard, "dp": layout.dp, "tp": layout.tp,
        "pp": layout.pp, "vpp": layout.vpp, "cp": layout.cp, "ep": layout.ep, "sp": layout.sequence_parallel,
        "mbs": layout.micro_batch, "zero": layout.zero_stage, "recompute": layout.recompute,
        "attention": layout.attention, "etp": layout.expert_tp, "fp8": layout.fp8, "cp_kind": layout.cp_kind,
        "stack": layout.stack, "moe_overlap": layout.moe_overlap, "schedule": layout.schedule,
        "step_time_s": est.step_time_s, "tokens_per_s": est.tokens_per_s,
        "tflops_per_device": est.tflops_per_device, "hw_tflops_per_device": est.hw_tflops_per_device,
        "mfu": est.mfu, "peak_memory_bytes": est.memory.total_bytes,
        "compute_s": est.compute_s, "exposed_comm_s": est.exposed_comm_s, "bubble_s": est.bubble_s,
    }


def plan_layout(plan: Plan) -> Layout:
    """The ``Layout`` a saved plan of the layout search holds.

    Raises:
        MeshplanError: a solver plan (per-stage layers or per-layer precision): it has no single layout.
    """
    one_group = plan.stages and all(st.device_group == 0 for st in plan.stages) and len(plan.cluster.groups) == 1
    if (plan.stages and not one_group) or plan.layer_precision:
        raise MeshplanError(f"plan {plan.name}: a solver plan (stages / per-layer precision) cannot be re-priced "
                            "by the layout estimator")
    split = tuple(st.num_layers for st in plan.stages) if plan.stages else ()
    return Layout.of(plan.degrees, micro_batch=plan.micro_batch, zero_stage=plan.zero_stage,
                     recompute=plan.recompute, sequence_parallel=plan.sequence_parallel, attention=plan.attention,
                     pp_layout=split,
                     pipeline_schedule=plan.schedule if plan.schedule in ("zbh1", "dualpipe") else "",
                     etp=plan.etp, fp8=plan.fp8, cp_kind=plan.cp_kind, stack=plan.stack, moe_overlap=plan.moe_overlap,
                     moe_capacity=plan.moe_capacity, moe_imbalance=plan.moe_imbalance,
                     moe_dispatcher=plan.moe_dispatcher, tp_overlap=plan.tp_overlap)
