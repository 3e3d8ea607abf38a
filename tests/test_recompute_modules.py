"""Megatron-Core's selective module list (``recompute_modules``) and the MTP depth (``mtp``) as decisions.

The bytes each module frees are counted here from megatron-core 0.16.1's module code, with the HF config's own
numbers (not meshplan's ``LayerShape``): the tensors the output-discarding checkpoints drop, at the shapes the code
gives them. ``qkv_up_proj_and_rope_apply`` (transformer/multi_latent_attention.py) returns ``query`` [s, b, n,
qk_nope + qk_rope], ``key`` [s, b, n, qk_nope + qk_rope] and ``value`` [s, b, n, v_head_dim], n the heads per tp
rank; ``TEGroupedMLP.forward`` (transformer/moe/experts.py) discards ``bias_act_output`` [routed tokens,
moe_intermediate_size / etp]; ``TransformerLayer`` (transformer/transformer_layer.py) discards the pre-MLP norm's
output [s / tp under SP, b, h]. Times: re-running a module never makes a step faster nor frees nothing.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshplan.core.errors import MeshplanError
from meshplan.planner.cluster.spec import load_cluster
from meshplan.planner.estimate.base import Workload
from meshplan.planner.estimate.memory import activation_bytes_per_layer, layer_shape
from meshplan.planner.estimate.ops_graph import layer_ops
from meshplan.planner.estimate.select import estimator_for
from meshplan.planner.layout.layout import Layout
from meshplan.planner.layout.space import parse_fix
from meshplan.planner.model.config import load_model
from meshplan.planner.presets.models import __file__ as PRESETS_INIT
from meshplan.planner.search.exact import pinned_work, search

HF = json.loads((Path(PRESETS_INIT).parent / "deepseek-v3.json").read_text())
S, B, TP, EP = 4096, 1, 2, 8
MOE_LAYER = HF["first_k_dense_replace"]  # the first MoE layer (the first three are dense)


def _layout(modules: str = "", recompute: str = "selective") -> Layout:
    return Layout(dp_shard=EP, tp=TP, ep=EP, etp=1, sequence_parallel=True, zero_stage=1, recompute=recompute,
                  recompute_modules=modules)


def _freed(modules: str) -> float:
    ls = layer_shape(load_model("deepseek-v3"), MOE_LAYER)
    return (activation_bytes_per_layer(ls, S, B, _layout()) - activation_bytes_per_layer(ls, S, B, _layout(modules)))


def test_mla_up_proj_frees_the_query_key_and_value_the_up_projection_returns() -> None:
    n = HF["num_attention_heads"] // TP
    qk = HF["qk_nope_head_dim"] + HF["qk_rope_head_dim"]
    want = 2 * S * B * n * (qk + qk + HF["v_head_dim"])  # bf16 query, key, value
    assert _freed("mla_up_proj") == want


def test_moe_act_frees_the_routed_experts_activation_output() -> None:
    routed = S * B * HF["num_experts_per_tok"]  # token copies this rank's experts take at etp 1 (balanced routing)
    want = 2 * routed * HF["moe_intermediate_size"] / TP  # bf16, the tp ranks of a stage split the copies
    assert _freed("moe_act") == want


def test_layernorm_frees_the_mla_input_norm_and_the_moe_pre_mlp_norm_outputs() -> None:
    want = 2 * 2 * (S // TP) * B * HF["hidden_size"]  # two bf16 [s/tp, b, h] norm outputs (sequence parallel)
    assert _freed("layernorm") == want
    dense = layer_shape(load_model("llama-3.1-8b"), 0)  # TE fuses both norms into linear_qkv / linear_fc1
    lay = Layout(tp=TP, sequence_parallel=True, recompute="selective")
    assert activation_bytes_per_layer(dense, S, B, lay) == activation_bytes_per_layer(
        dense, S, B, Layout(tp=TP, sequence_parallel=True, recompute="selective", recompute_modules="layernorm"))


def test_modules_add_up_and_moe_holds_its_inner_modules() -> None:
    both = _freed("moe_act+mla_up_proj")
    assert both == _freed("moe_act") + _freed("mla_up_proj")
    assert _freed("moe") == _freed("moe+moe_act+shared_experts") > _freed("moe_act") + _freed("shared_experts")


@pytest.mark.parametrize("modules", ["mla_up_proj", "moe_act", "layernorm", "moe", "shared_experts",
                                     "mla_up_proj+moe_act"])
def test_each_module_frees_memory_and_costs_time(modules: str) -> None:
    model = load_model("deepseek-v3")
    work = Workload(model, load_cluster("8x8xH100"), 512, S)
    est = estimator_for(work.cluster)
    lay = Layout(dp_shard=32, tp=TP, pp=1, ep=64, etp=1, sequence_parallel=True, zero_stage=1, micro_batch=1)
    base = est.estimate(work, lay)
    more = est.estimate(work, lay.with_(recompute="selective", recompute_modules=modules))
    assert more.memory.activations_bytes < base.memory.activations_bytes
    assert more.step_time_s > base.step_time_s
    # one module more re-runs more and keeps less (core attention added to the list)
    most = est.estimate(work, lay.with_(recompute="selective", recompute_modules="core_attn+" + modules))
    assert most.step_time_s > more.step_time_s and most.memory.activations_bytes <= more.memory.activations_bytes


def test_fix_pins_selective_and_the_checks_are_megatron_cores() -> None:
    assert parse_fix("recompute_modules=MLA_UP_PROJ+moe_act").recompute_modules == "moe_act+mla_up_proj"
    with pytest.raises(MeshplanError, match="'router' is not one of"):
        parse_fix("recompute_modules=router")
    work = Workload(load_model("llama-3.1-8b"), load_cluster("1x8xH100"), 64, 4096)
    with pytest.raises(MeshplanError, match="has no MLA"):
        search(work, parse_fix("recompute_modules=mla_up_proj"), top=1)
    with pytest.raises(MeshplanError, match="has no experts"):
        search(work, parse_fix("recompute_modules=moe_act"), top=1)
    with pytest.raises(MeshplanError, match="needs recompute=selective"):
        search(work, parse_fix("recompute_modules=mlp,recompute=full,tp=8"), top=1)
    res = search(work, parse_fix("recompute_modules=mlp,tp=8"), top=3)
    assert {lay.recompute for lay, _ in res.ranked} == {"selective"}


def test_mtp_counts_the_modules_on_the_last_stage() -> None:
    model = load_model("deepseek-v3")
    work = Workload(model, load_cluster("32x8xH100"), 1024, S)
    with_mtp, pins = pinned_work(work, parse_fix("mtp=1"))
    assert with_mtp.model.num_mtp_layers == HF["num_nextn_predict_layers"] == 1 and pins.mtp == 1
    assert with_mtp.model.num_params > model.num_params
    with pytest.raises(MeshplanError, match="--fix mtp=2: .*must be in 0..1"):
        pinned_work(work, parse_fix("mtp=2"))
    with pytest.raises(MeshplanError, match="no multi-token-prediction module"):
        pinned_work(Workload(load_model("llama-3.1-8b"), work.cluster, 64, S), parse_fix("mtp=1"))
    est = estimator_for(work.cluster)
    lay = Layout(dp_shard=16, tp=2, pp=8, ep=32, etp=1, sequence_parallel=True, zero_stage=1, recompute="full",
                 pp_layout=(7, 8, 8, 8, 8, 8, 8, 6))
    base, more = est.estimate(work, lay), est.estimate(with_mtp, lay.with_(mtp=1))
    assert more.step_time_s > base.step_time_s
    assert more.memory.total_bytes >= base.memory.total_bytes


def test_recomputed_flops_are_the_modules_forward() -> None:
    """core_attn alone re-runs what the FLOP counter's selective recomputation counts; a dense MLP re-runs its
    three GEMMs, 2 x 3 x h x ffn per token and layer (plus its norm and activation, under 0.1%)."""
    from meshplan.planner.estimate.base import ModelTables
    from meshplan.planner.model.flops import recompute_flops_per_token

    model = load_model("llama-3.1-8b")
    tb = ModelTables(model)
    for tp in (1, 2, 8):
        lay = Layout(tp=tp, recompute="selective", recompute_modules="core_attn")
        assert tb.flops_per_token(S, lay)[1] == pytest.approx(recompute_flops_per_token(model, S, "selective"))
    mlp = tb.flops_per_token(S, Layout(tp=2, recompute="selective", recompute_modules="mlp"))[1]
    assert mlp == pytest.approx(6 * model.hidden_size * model.ffn_hidden_size * model.num_layers, rel=1e-3)


def test_a_layout_read_back_prices_its_mtp_modules() -> None:
    """A plan's layout priced on the main model (as ``meshplan check`` loads it) counts the MTP modules it names."""
    work = Workload(load_model("deepseek-v3"), load_cluster("32x8xH100"), 1024, S)
    lay = Layout(dp_shard=16, tp=2, pp=8, ep=32, etp=1, sequence_parallel=True, zero_stage=1, recompute="full",
                 pp_layout=(7, 8, 8, 8, 8, 8, 8, 6), mtp=1)
    est = estimator_for(work.cluster)
    with_mtp = pinned_work(work, parse_fix("mtp=1"))[0]
    assert est.estimate(work, lay).step_time_s == est.estimate(with_mtp, lay).step_time_s


def test_a_pinned_module_list_overrides_a_profiles_recompute() -> None:
    """A stack profile's recompute default gives way to a pinned module list (selective), and a profile's module
    list to a pinned recompute: the request's pin decides, never a contradiction between the two."""
    from meshplan.planner.search.job import _over_profile

    assert _over_profile({"recompute": "full", "zero": 1}, parse_fix("recompute_modules=moe_act")) == {
        "zero": 1, "recompute_modules": "moe_act"}
    assert _over_profile({"recompute_modules": "moe_act"}, parse_fix("recompute=full")) == {"recompute": "full"}
    assert _over_profile({"recompute": "selective"}, parse_fix("mbs=2")) == {"recompute": "selective", "mbs": 2}


@pytest.mark.parametrize("fp8,requantized", [("mxfp8", True), ("tensorwise", True), ("delayed", False)])
def test_a_recomputed_norm_or_activation_makes_its_readers_quantize_again(fp8: str, requantized: bool) -> None:
    """Megatron-Core (core_v0.16.1) sets the linears that read a recomputed module's output to save their original
    input under fp8 recipes but delayed scaling (``set_save_original_input``): MLA's q and kv down-projections under
    the input norm's recompute, the shared experts' fc1 under the pre-MLP norm's (both the ``layernorm`` module), the
    grouped MLP's fc2 under ``moe_act``'s. Their backward quantizes that input again, column-wise: 3 of the cast
    class's 4 B an element. DeepSeek-V3's config (hidden 7168, q_lora_rank 1536, top 8, expert width 2048), one
    micro-batch of 4096 tokens at EP 8, balanced."""
    cfg = json.loads((Path(PRESETS_INIT).parent / "deepseek-v3.json").read_text(encoding="utf-8"))
    tokens, h, k, f = 4096, cfg["hidden_size"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]
    model = load_model("deepseek-v3")
    lay = Layout(dp_shard=8, ep=8, zero_stage=1, fp8=fp8, recompute="selective",
                 recompute_modules="moe_act+layernorm", moe_dispatcher="hybridep")
    modules = dict(layer_ops(model, model.num_layers - 1, lay, tokens, "fp8").modules)
    extra = {m: [op.shape for op in ops if op.kind == "cast" and len(op.shape) == 1] for m, ops in modules.items()}
    want = {"layernorm": [(3 * 2 * tokens * h // 4,), (3 * tokens * h // 4,)], "moe_act": [(3 * tokens * k * f // 4,)]}
    assert {m: extra[m] for m in want} == (want if requantized else {m: [] for m in want})
