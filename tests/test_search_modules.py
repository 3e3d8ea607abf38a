"""A free search tries the recompute module lists NVIDIA's own presets run (``recompute_modules`` beside
recompute=selective), checked against independent truths: its best equals the brute-force best over every
recompute choice pinned in turn, the lists it tries name only modules the model has (Megatron-Core's own
``TransformerConfig`` accepts them), and delayed fp8 scaling gets none Megatron-Core refuses there."""
from __future__ import annotations

import pytest

from meshplan.core.errors import MeshplanError
from meshplan.planner.cluster.spec import load_cluster
from meshplan.planner.estimate.base import Workload
from meshplan.planner.estimate.select import estimator_for
from meshplan.planner.layout.layout import Degrees, Layout
from meshplan.planner.layout.space import PRESET_MODULE_SETS, Pins, model_modules, module_choices, parse_fix
from meshplan.planner.model.config import load_model
from meshplan.planner.search.exact import search

# DeepSeek-V3 on 256 GB300 at the mesh of Megatron-Bridge's preset (DEEPSEEK_V3_PRETRAIN_CONFIG_GB300_FP8_MX_V1,
# deepseek_workload_base_configs.py v0.4.0: pp 2, vpp 8, ep 32, recompute_modules ["mla_up_proj"]), with the stack
# profile's weights held in fp8 and bf16 gradients (megatron-bridge-perf@26.04) and its stage split pinned, so that
# the search's time-balanced re-split of its best (``exact._time_balanced``) moves no stage
MESH = ("dp=128,tp=1,pp=2,vpp=8,cp=1,ep=32,mbs=2,zero=1,fp8=mxfp8,moe_dispatcher=hybridep,schedule=interleaved,"
        "fp8_params=true,grad_dtype=bf16,pp_layout=4*15+1")


@pytest.fixture(scope="module")
def dsv3():
    cluster = load_cluster("64x4xGB300-NVL64")
    work = Workload(load_model("deepseek-v3"), cluster, 4096, 4096, "fp8")
    return work, estimator_for(cluster)


def test_search_best_is_the_brute_force_best(dsv3):
    """The free search's best against each recompute kind and each module list pinned in turn."""
    work, est = dsv3
    best, best_est = search(work, fix=parse_fix(MESH), estimator=est, top=1).ranked[0]
    pins = [f"recompute={r}" for r in ("none", "selective", "full")]
    pins += [f"recompute=selective,recompute_modules={m}" for m in PRESET_MODULE_SETS]
    tried = []
    for p in pins:
        try:
            res = search(work, fix=parse_fix(f"{MESH},{p}"), estimator=est, top=1)
        except MeshplanError:  # fits nowhere
            continue
        lay, e = res.ranked[0]
        tried.append((e.step_time_s, lay.recompute, lay.recompute_modules))
    brute = min(tried)
    assert best_est.step_time_s == pytest.approx(brute[0], rel=1e-9)
    assert (best.recompute, best.recompute_modules) == brute[1:]
    # the preset's own list: recompute=none does not fit, Megatron-Core's default selective recomputes more
    assert best.recompute_modules == "mla_up_proj"


def test_model_modules_golden():
    assert model_modules(load_model("deepseek-v3")) == {"core_attn", "mla_up_proj", "mlp", "moe", "moe_act",
                                                        "layernorm", "shared_experts"}
    assert model_modules(load_model("llama-3.1-8b")) == {"core_attn", "mlp"}
    assert model_modules(load_model("gpt-oss-120b")) == {"core_attn", "moe", "moe_act", "layernorm"}


@pytest.mark.parametrize("fix,stack,fp8,expect", [
    ({}, "megatron", "none", PRESET_MODULE_SETS),
    ({}, "megatron", "delayed", ("mla_up_proj", "mla_up_proj+mlp", "mlp")),  # no moe_act, no layernorm
    ({}, "torchtitan", "none", ()),                                   # Megatron-Core's list only
    ({"recompute": "full"}, "megatron", "none", ()),
    ({"recompute": "selective"}, "megatron", "none", ()),             # Megatron-Core's default list, as its CLI
    ({"recompute_modules": "mla_up_proj"}, "megatron", "none", ()),   # a pinned list is the user's
    ({"moe_fused_mlp": True}, "megatron", "mxfp8", ("mla_up_proj", "mla_up_proj+mlp", "mlp", "layernorm+moe")),
])
def test_module_choices(fix, stack, fp8, expect):
    assert module_choices(Pins.of(fix), load_model("deepseek-v3"), stack, fp8) == expect


def test_delayed_scaling_refuses_moe_act_and_layernorm():
    lay = Layout.of(Degrees(dp_shard=8), micro_batch=1, zero_stage=1, recompute="selective",
                    recompute_modules="moe_act+layernorm", fp8="delayed")
    with pytest.raises(MeshplanError, match="delayed"):
        lay.validate(world_size=8, num_layers=8, num_heads=8, num_kv_heads=8, seq_len=1024, global_batch=64,
                     num_experts=8)


@pytest.mark.parametrize("modules", PRESET_MODULE_SETS)
def test_megatron_core_accepts_each_list(modules):
    """Megatron-Core's ``TransformerConfig`` (MLA on, grouped-GEMM MoE) takes every list as a module list (its
    delayed-scaling rule needs Transformer Engine to check, which this machine lacks: the Layout test above)."""
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    cfg = MLATransformerConfig(num_layers=4, hidden_size=64, num_attention_heads=4, num_moe_experts=8,
                               moe_grouped_gemm=True, moe_ffn_hidden_size=32, multi_latent_attention=True,
                               recompute_granularity="selective", recompute_modules=modules.split("+"))
    assert set(cfg.recompute_modules) >= set(modules.split("+"))
