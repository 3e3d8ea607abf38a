"""Plans built from priced layouts, and the layout a saved plan holds.

``to_plan`` is the one place a ``Layout`` and its ``Estimate`` become a ``Plan``; ``plan_layout`` is its inverse
for plans of the layout search (what ``meshplan check`` and ``costmodel fit`` re-price).
"""
from __future__ import annotations

from meshplan.core.errors import MeshplanError
from meshplan.core.version import meshplan_version
from meshplan.planner.estimate.base import Estimate, Workload
from meshplan.planner.layout.decisions import DECISIONS
from meshplan.planner.layout.layout import Layout
from meshplan.planner.plan.schema import Breakdown, ModelRef, Plan, Prediction, Stage

# The decisions a plan keeps as a field of the same value (pp_layout is its ``stages``; ``schedule`` names the
# schedule that runs, where the layout's "" means 1F1B or interleaved).
_PLAIN_DECISIONS = tuple(d for d in DECISIONS.values() if d.plan_field and d.plan_field != "schedule")


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
                    rope_scaling_type=m.rope_scaling_type, rope_scaling_factor=m.rope_scaling_factor,
                    qkv_bias=m.qkv_bias, qk_norm=m.qk_norm, rotary_percent=m.rotary_percent,
                    sliding_window=m.sliding_window, window_layers=tuple(m.window_layers),
                    attention_sinks=m.attention_sinks, glu_clamp=m.glu_clamp,
                    shared_expert_ffn_hidden_size=m.shared_expert_ffn_hidden_size, moe_latent_size=m.moe_latent_size,
                    layer_pattern=m.layer_pattern, mamba_heads=m.mamba_heads, mamba_head_dim=m.mamba_head_dim,
                    mamba_state=m.mamba_state, mamba_groups=m.mamba_groups, gdn_layers=tuple(m.gdn_layers),
                    gdn_key_heads=m.gdn_key_heads, gdn_value_heads=m.gdn_value_heads,
                    gdn_key_head_dim=m.gdn_key_head_dim, gdn_value_head_dim=m.gdn_value_head_dim,
                    gdn_conv_kernel=m.gdn_conv_kernel, attn_output_gate=m.attn_output_gate,
                    shared_expert_gate=m.shared_expert_gate)


def to_plan(work: Workload, layout: Layout, est: Estimate, name: str, model_source: str, costmodel: str) -> Plan:
    """The ``Plan`` value for one evaluated layout (``costmodel``: what priced it, ``Estimator.name``)."""
    return Plan(name=name, model=model_ref(work.model, model_source), cluster=work.cluster.to_ref(),
                global_batch=work.global_batch, seq_len=work.seq_len, degrees=layout.degrees, dtype=work.dtype,
                lora=work.lora,
                schedule=layout.schedule, stages=_stages(layout), prediction=prediction_of(est, costmodel),
                meshplan_version=meshplan_version(),
                **{d.plan_field: getattr(layout, d.name) for d in _PLAIN_DECISIONS})

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
    return Layout.of(plan.degrees, pp_layout=split,
                     pipeline_schedule=plan.schedule if plan.schedule in ("zbh1", "dualpipe") else "",
                     **{d.name: getattr(plan, d.plan_field) for d in _PLAIN_DECISIONS})
