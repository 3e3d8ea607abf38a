"""Golden-file tests for planner.export: every reference plan x every target is rendered and compared byte for byte
with tests/golden/export/<plan>.<target>.<ext>. ``MESHPLAN_UPDATE_GOLDEN=1`` rewrites them; each golden file was
reviewed by hand against shared/notes/exports.md.

The reference plans are built here directly from the Plan schema. Model shapes are copied from the HF config.json
files in shared/model_configs (Llama-3.1-70B/8B-Instruct, DeepSeek-V3); parameter counts are the golden counts of
shared/model_configs/PROVENANCE.md.
"""
from __future__ import annotations

import os

import pytest

from meshplan.core.errors import MeshplanError
from meshplan.planner.export import EXTENSIONS, TARGETS, render
from meshplan.planner.model.config import load_model
from meshplan.planner.plan.build import model_ref
from meshplan.planner.plan.schema import BucketCompression, ClusterRef, Degrees, DeviceGroupRef, ModelRef, Plan, Stage
from tests.helpers import REPO

GOLDEN = REPO / "tests" / "golden" / "export"

LLAMA_70B = ModelRef(name="Llama-3.1-70B", source="llama-3.1-70b-instruct", model_type="llama",
                     num_params=70_553_706_496, hidden_size=8192, num_layers=80, num_attention_heads=64,
                     num_kv_heads=8, ffn_hidden_size=28672, vocab_size=128256, head_dim=128, tied_embeddings=False)
LLAMA_8B = ModelRef(name="Llama-3.1-8B", source="llama-3.1-8b-instruct", model_type="llama",
                    num_params=8_030_261_248, hidden_size=4096, num_layers=32, num_attention_heads=32,
                    num_kv_heads=8, ffn_hidden_size=14336, vocab_size=128256, head_dim=128, tied_embeddings=False)
# DeepSeek-V3 main model (MTP off): MLA, 256 routed + 1 shared expert of width 2048, first 3 layers dense.
DSV3 = ModelRef(name="DeepSeek-V3", source="deepseek-v3", model_type="deepseek_v3", num_params=671_026_419_200,
                hidden_size=7168, num_layers=61, num_attention_heads=128, num_kv_heads=128, ffn_hidden_size=18432,
                vocab_size=129280, num_experts=256, experts_per_token=8, head_dim=192, moe_ffn_hidden_size=2048,
                num_shared_experts=1, moe_layers=tuple(range(3, 61)), tied_embeddings=False, q_lora_rank=1536,
                kv_lora_rank=512, qk_rope_head_dim=64, v_head_dim=128)


def cluster(spec: str, *groups: tuple[int, int, str]) -> ClusterRef:
    return ClusterRef(spec=spec, groups=tuple(DeviceGroupRef(nodes=n, devices_per_node=g, device=d)
                                              for n, g, d in groups))


def plan_llama70b() -> Plan:
    """Llama-3.1-70B on 16x8 H100: TP8 PP4 vpp2, dp 4 with ZeRO-1, SP, full recompute; 128 microbatches."""
    return Plan(name="llama70b-tp8pp4", model=LLAMA_70B, cluster=cluster("16x8xH100", (16, 8, "H100")),
                global_batch=512, micro_batch=1, seq_len=8192,
                degrees=Degrees(dp_shard=4, tp=8, pp=4, vpp=2), sequence_parallel=True, zero_stage=1,
                recompute="full", schedule="interleaved", dtype="bf16")


def plan_dsv3() -> Plan:
    """DeepSeek-V3 on 32x8 H100: TP2 (SP), dp 128 with ZeRO-1, EP64 borrowed from dp, selective recompute."""
    return Plan(name="dsv3-ep64", model=DSV3, cluster=cluster("32x8xH100", (32, 8, "H100")),
                global_batch=2048, micro_batch=1, seq_len=4096,
                degrees=Degrees(dp_shard=128, tp=2, ep=64), sequence_parallel=True, zero_stage=1,
                recompute="selective", dtype="bf16")


def plan_fsdp8b() -> Plan:
    """Llama-3.1-8B, FSDP (ZeRO-3) over the 8 GPUs of one node, micro 2, 4 accumulation steps."""
    return Plan(name="llama8b-fsdp8", model=LLAMA_8B, cluster=cluster("1x8xH100", (1, 8, "H100")),
                global_batch=64, micro_batch=2, seq_len=8192, degrees=Degrees(dp_shard=8), zero_stage=3,
                recompute="full", dtype="bf16")


def plan_hetero() -> Plan:
    """Llama-3.1-8B on one H100 node + one A100 node: TP4 PP2, dp 2 with ZeRO-1, uneven stages (20 + 12 layers)
    on different device groups, fp8 in the first 16 layers, int8 and PowerSGD gradient buckets."""
    return Plan(name="llama8b-hetero", model=LLAMA_8B,
                cluster=cluster("1x8xH100+1x8xA100", (1, 8, "H100"), (1, 8, "A100")),
                global_batch=32, micro_batch=1, seq_len=4096, degrees=Degrees(dp_shard=2, tp=4, pp=2),
                sequence_parallel=True, zero_stage=1, recompute="selective", dtype="bf16",
                layer_precision=("fp8",) * 16 + ("bf16",) * 16,
                stages=(Stage(first_layer=0, num_layers=20, device_group=0),
                        Stage(first_layer=20, num_layers=12, device_group=1)),
                compression=(BucketCompression(bucket=0, size_bytes=100_000_000, method="int8"),
                             BucketCompression(bucket=1, size_bytes=100_000_000, method="powersgd", param=4)))


def plan_mixed() -> Plan:
    """``plan_hetero``'s decisions (uneven stages, per-layer precision, compressed buckets) on two H100 nodes: what
    the targets that cannot pin a stage to a device type (``placement.refuse``) are checked on."""
    base = plan_hetero()
    return base.model_copy(update={
        "name": "llama8b-mixed", "cluster": cluster("2x8xH100", (2, 8, "H100")),
        "stages": tuple(s.model_copy(update={"device_group": 0}) for s in base.stages)})


PLANS = {"llama70b": plan_llama70b, "dsv3": plan_dsv3, "fsdp8b": plan_fsdp8b, "hetero": plan_hetero,
         "mixed": plan_mixed}
def _variant(**update) -> Plan:
    degrees = update.pop("degrees", None)
    base = plan_llama70b()
    return base.model_copy(update={**update, **({"degrees": Degrees(**degrees)} if degrees else {})})


# Decision matrix: one decision changed at a time from the Llama-3.1-70B reference (TP8 PP4 vpp2, dp 4, ZeRO-1, SP,
# full recompute).
VARIANTS = {
    "cp2": lambda: _variant(degrees=dict(dp_shard=2, tp=8, pp=4, vpp=2, cp=2)),
    "fp8": lambda: _variant(dtype="fp8"),
    "selective": lambda: _variant(recompute="selective"),
    "no-recompute-1f1b": lambda: _variant(recompute="none", schedule="1f1b", degrees=dict(dp_shard=4, tp=8, pp=4)),
    "no-sp": lambda: _variant(sequence_parallel=False),
    "fp16-zero0": lambda: _variant(dtype="fp16", zero_stage=0, degrees=dict(dp_replicate=4, tp=8, pp=4, vpp=2)),
}


def _stages(*layers: int) -> tuple[Stage, ...]:
    """Contiguous stages of the given layer counts, in model (virtual stage) order."""
    return tuple(Stage(first_layer=sum(layers[:i]), num_layers=n) for i, n in enumerate(layers))


def _moe_variant(**update) -> Plan:
    degrees = update.pop("degrees", None)
    base = plan_dsv3()
    return base.model_copy(update={**update, **({"degrees": Degrees(**degrees)} if degrees else {})})


_ONE_F_ONE_B = dict(recompute="none", schedule="1f1b", degrees=dict(dp_shard=4, tp=8, pp=4))
# Issue 12 decisions, one at a time: uneven (and interleaved uneven) pipelines, recompute full:N and op, fp8 recipes,
# cp comm kinds, the priced stack, and on DeepSeek-V3 expert-TP folding, token-dropping capacity and EP overlap.
# Not golden (no reference plan changes): read back by each target's parser, or refused in one line.
VARIANTS.update({
    "uneven-interleaved": lambda: _variant(stages=_stages(9, 10, 10, 11, 10, 10, 10, 10)),
    "uneven-1f1b": lambda: _variant(**_ONE_F_ONE_B, stages=_stages(19, 21, 21, 19)),
    "recompute-full2": lambda: _variant(**{**_ONE_F_ONE_B, "recompute": "full:2"}),
    "recompute-full2-interleaved": lambda: _variant(recompute="full:2"),
    "recompute-op": lambda: _variant(**{**_ONE_F_ONE_B, "recompute": "op"}),
    "fp8-tensorwise": lambda: _variant(fp8="tensorwise"),
    "fp8-blockwise": lambda: _variant(fp8="blockwise"),
    "fp8-mxfp8": lambda: _variant(fp8="mxfp8"),
    "fp8-nvfp4": lambda: _variant(fp8="nvfp4"),
    "dtype-nvfp4": lambda: _variant(dtype="nvfp4"),
    "cp2-allgather": lambda: _variant(cp_kind="allgather", degrees=dict(dp_shard=2, tp=8, pp=4, vpp=2, cp=2)),
    "cp2-a2a": lambda: _variant(cp_kind="a2a", degrees=dict(dp_shard=2, tp=8, pp=4, vpp=2, cp=2)),
    "stack-torchtitan": lambda: _variant(stack="torchtitan"),
    "moe-etp1": lambda: _moe_variant(etp=1),
    "moe-fold-ep256": lambda: _moe_variant(etp=1, degrees=dict(dp_shard=128, tp=2, ep=256)),
    "moe-capacity": lambda: _moe_variant(moe_capacity=1.25, moe_imbalance=1.3),
    "moe-overlap": lambda: _moe_variant(moe_overlap=True),
    "pp-overlap-off": lambda: _variant(pp_overlap=False),
    "moe-shared-overlap": lambda: _moe_variant(shared_overlap=True),
    "moe-deepep": lambda: _moe_variant(moe_dispatcher="deepep"),
    "moe-router-fusion": lambda: _moe_variant(moe_router_fusion=True),
    "moe-seq-aux-loss": lambda: _moe_variant(moe_aux_loss="seq_aux_loss"),
    # CUDA graphs: Transformer Engine's per-layer graphs (attention, MoE router and preprocessing; the dense MLP in a
    # dense layer) and the full-iteration graph a dropless MoE layer takes with Hybrid-EP's sync-free dispatch
    "graphs-layers": lambda: _variant(cuda_graphs="layers", recompute="selective"),
    "moe-graphs-layers": lambda: _moe_variant(cuda_graphs="layers"),
    "moe-graphs-iteration": lambda: _moe_variant(cuda_graphs="iteration", moe_dispatcher="hybridep"),
    # graphs of the attention alone (Megatron-Bridge's H100 Nemotron 3 Nano presets): the MoE block stays eager, so
    # Megatron-Core lets it be recomputed
    "moe-graphs-mixers": lambda: _moe_variant(cuda_graphs="mixers", recompute="selective", recompute_modules="moe"),
    # Nemotron-4 340B on the reference's mesh: rope, the two-matrix squared-ReLU MLP, 8 query groups, untied
    "nemotron4-340b": lambda: _variant(model=model_ref(load_model("nemotron-4-340b"), "nemotron-4-340b")),
    "graphs-layers-mlp-recompute": lambda: _variant(cuda_graphs="layers", recompute="selective",
                                                    recompute_modules="mlp"),
    "reduce-fp32": lambda: _variant(reduce_dtype="fp32"),
    "reduce-bf16": lambda: _variant(reduce_dtype="bf16"),
    # Megatron-Core's selective module list and DeepSeek-V3's MTP module (one uneven pipeline: the layout names it)
    "moe-recompute-modules": lambda: _moe_variant(recompute_modules="moe_act+layernorm+mla_up_proj"),
    "moe-mtp": lambda: _moe_variant(mtp=1),
    "moe-mtp-uneven": lambda: _moe_variant(mtp=1, etp=1, degrees=dict(dp_shard=32, tp=2, pp=4, ep=64),
                                           stages=_stages(16, 16, 16, 13)),
    # Transformer Engine's fp8 dot-product attention under each recipe it runs with (Megatron-Bridge only)
    "attention-fp8": lambda: _variant(dtype="fp8", fp8="tensorwise", attention_dtype="fp8"),
    "attention-fp8-delayed": lambda: _variant(dtype="fp8", attention_dtype="fp8"),
    "attention-fp8-mxfp8": lambda: _variant(dtype="fp8", fp8="mxfp8", attention_dtype="fp8"),
    # decoder layers kept in bf16 under the recipe: Megatron-Core's first_last_layers_bf16 (the tensorwise one is
    # Megatron-Bridge's own preset, the NVFP4 one as Megatron-Bridge's Nemotron 3 Super recipe keeps its last layers)
    "bf16-layers-mxfp8": lambda: _variant(fp8="mxfp8", bf16_first_layers=1, bf16_last_layers=2),
    "bf16-layers-tensorwise": lambda: _variant(fp8="tensorwise", bf16_first_layers=1, bf16_last_layers=1),
    "bf16-layers-nvfp4": lambda: _variant(dtype="nvfp4", bf16_last_layers=14),
})
# Targets that refuse a pipeline whose stages sit on different device types (planner/export/placement.py).
UNPINNED_TARGETS = ("deepspeed", "torchtitan", "accelerate", "kubeflow")


def plans_for(target: str) -> list[str]:
    """Reference plans a target renders (the heterogeneous pipeline only where stages can be pinned)."""
    return [p for p in PLANS if not (p == "hetero" and target in UNPINNED_TARGETS)]


ALL_PLANS = {**PLANS, **VARIANTS}


def all_plans_for(target: str) -> list[str]:
    """``plans_for`` plus the decision-matrix variants (no golden files: read back by the targets' parsers)."""
    return plans_for(target) + list(VARIANTS)

@pytest.mark.parametrize("target", UNPINNED_TARGETS)
def test_heterogeneous_pipeline_refused(target: str) -> None:
    with pytest.raises(MeshplanError, match="cannot pin a stage to a node"):
        render(PLANS["hetero"](), target)
    assert not (GOLDEN / f"hetero.{target}.{EXTENSIONS[target]}").exists()


@pytest.mark.parametrize("plan_name,target", [(p, t) for t in TARGETS for p in plans_for(t)])
def test_golden(plan_name: str, target: str) -> None:
    result = render(PLANS[plan_name](), target)
    path = GOLDEN / f"{plan_name}.{target}.{EXTENSIONS[target]}"
    text = result.text
    if os.environ.get("MESHPLAN_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        warn_path = path.with_name(path.name + ".warnings")
        warn_path.write_text("".join(w + "\n" for w in result.warnings), encoding="utf-8")
    assert path.exists(), f"golden file missing: {path} (run with MESHPLAN_UPDATE_GOLDEN=1, then review it)"
    assert text == path.read_text(encoding="utf-8")
    warn_path = path.with_name(path.name + ".warnings")
    assert "".join(w + "\n" for w in result.warnings) == warn_path.read_text(encoding="utf-8")


def test_render_is_pure() -> None:
    """Rendering twice gives the same text, and does not touch the plan (frozen value)."""
    p = plan_llama70b()
    assert render(p, "megatron").text == render(p, "megatron").text
    assert p == plan_llama70b()
