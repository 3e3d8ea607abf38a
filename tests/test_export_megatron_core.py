"""The Megatron export read back through Megatron's own configuration code (issue 15 item 1).

Megatron-LM's ``megatron/training`` (``parse_args``, ``validate_args``) is not published on PyPI; megatron-core is,
and it holds the checks ``validate_args`` hands the model and parallel arguments to:
``core_transformer_config_from_args`` (megatron/training/arguments.py) copies every argument whose name is a
``TransformerConfig`` field (argparse ``dest``: dashes to underscores, ``--fp8-format`` -> ``fp8``,
``--disable-bias-linear`` -> ``add_bias_linear=False``), adds ``pipeline_dtype`` from the precision flags,
``num_moe_experts`` from ``--num-experts``, ``gated_linear_unit`` for ``--swiglu``, and uses
``MLATransformerConfig`` under ``--multi-latent-attention``; ``validate_args`` derives the virtual pipeline size from
``--num-layers-per-virtual-pipeline-stage``. This test does the same with the rendered flags, lets
``TransformerConfig.__post_init__`` / ``ModelParallelConfig.__post_init__`` validate them (head and layer
divisibility, MoE with TP needs SP, the pipeline layout string, recompute options, fp8 recipe), and compares what
Megatron will run with the plan: degrees, virtual stages, layers per stage, sequence parallel, recompute, precision,
and batch (data parallel = world / (tp x pp x cp)).
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from meshplan.planner.export import _common
from meshplan.planner.layout.layout import p2p_overlapped
from tests.test_export_golden import PLANS, VARIANTS
from tests.test_export_parsers import BASH, _argv, _megatron_args, _render_or_refusal, _torchrun_parse

core = pytest.importorskip("megatron.core", reason="megatron-core not installed")

# argparse dest of the exported flags whose dest is not the flag's own name (megatron/training/arguments.py)
_DEST = {"fp8_format": "fp8", "fp4_format": "fp4"}
_STORE_FALSE = {"disable_bias_linear": "add_bias_linear"}


ALL = {**PLANS, **VARIANTS}


def _moe_freq(v: str) -> list[int]:
    """``--moe-layer-freq`` as Megatron's ``moe_freq_type`` evaluates it, for the form meshplan writes:
    ``([0]*3+[1]*58)``."""
    out: list[int] = []
    for bit, times in re.findall(r"\[(\d)\]\*(\d+)", v):
        out += [int(bit)] * int(times)
    assert out, v
    return out


def _transformer_config(flags: dict[str, object]):
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer import MLATransformerConfig, TransformerConfig

    args: dict[str, object] = {}
    for flag, value in flags.items():
        name = flag[2:].replace("-", "_")
        if name in _STORE_FALSE:
            args[_STORE_FALSE[name]] = False
            continue
        if isinstance(value, str):
            value = value.strip("'")
            if re.fullmatch(r"-?\d+", value):
                value = int(value)
            elif re.fullmatch(r"-?\d+\.\d*(e-?\d+)?", value):
                value = float(value)
        args[_DEST.get(name, name)] = value
    cls = MLATransformerConfig if args.get("multi_latent_attention") else TransformerConfig
    kw = {f.name: args[f.name] for f in dataclasses.fields(cls) if f.name in args}
    dtype = torch.bfloat16 if args.get("bf16") else torch.float16 if args.get("fp16") else torch.float32
    kw.update(params_dtype=dtype, pipeline_dtype=dtype)
    if "num_experts" in args:
        kw["num_moe_experts"] = args["num_experts"]
    if isinstance(kw.get("moe_layer_freq"), str):
        kw["moe_layer_freq"] = _moe_freq(kw["moe_layer_freq"])
    if args.get("swiglu"):
        kw.update(gated_linear_unit=True, activation_func=F.silu)
    if args.get("quick_geglu"):  # core_transformer_config_from_args: quick_gelu, gated
        from megatron.core.activations import quick_gelu
        kw.update(gated_linear_unit=True, activation_func=quick_gelu)
    if isinstance(kw.get("window_size"), str):  # arguments.py tuple_type: "128,0"
        kw["window_size"] = tuple(int(v) for v in kw["window_size"].split(","))
    if isinstance(kw.get("window_attn_skip_freq"), str):  # moe_freq_type, as --moe-layer-freq
        kw["window_attn_skip_freq"] = _moe_freq(kw["window_attn_skip_freq"])
    if not args.get("group_query_attention"):
        kw.pop("num_query_groups", None)
    if args.get("num_layers_per_virtual_pipeline_stage"):  # validate_args
        kw["virtual_pipeline_model_parallel_size"] = (args["num_layers"] // args["pipeline_model_parallel_size"]
                                                      // args["num_layers_per_virtual_pipeline_stage"])
    if (kw.get("virtual_pipeline_model_parallel_size") or 1) > 1 or "pipeline_model_parallel_layout" in args:
        # megatron/training/arguments.py: --no-overlap-p2p-communication (store_false, dest overlap_p2p_comm) leaves
        # the interleaved schedule's p2p overlap on by default, and validate_args sets batch_p2p_comm to its opposite
        kw["overlap_p2p_comm"] = not args.get("no_overlap_p2p_communication", False)
        kw["batch_p2p_comm"] = not kw["overlap_p2p_comm"]
    return cls(**kw), args


def _layers_per_stage(cfg) -> list[int]:
    """Decoder layers per model chunk in model order (chunk v of pp rank r is stage v * pp + r)."""
    from megatron.core.transformer.enums import LayerType

    layout = cfg.pipeline_model_parallel_layout
    pp, vpp = layout.pipeline_model_parallel_size, layout.virtual_pipeline_model_parallel_size
    return [layout.layout[r][v].count(LayerType.decoder) for v in range(vpp) for r in range(pp)]


@pytest.mark.skipif(BASH is None, reason="bash not available")
@pytest.mark.parametrize("plan_name", list(ALL))
def test_megatron_core_accepts_and_runs_the_plan(plan_name: str, tmp_path: Path) -> None:
    plan = ALL[plan_name]()
    text = _render_or_refusal(plan, "megatron")  # recompute op: refused in one line naming it
    if text is None:
        return
    ns = _torchrun_parse(_argv(text, tmp_path, {"HEAD_NODE": "node-a", "NODE_RANK": "0"}))
    cfg, args = _transformer_config(_megatron_args(ns.training_script_args))  # raises on what Megatron refuses
    d = plan.degrees
    vpp = cfg.virtual_pipeline_model_parallel_size or 1
    assert (cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size, vpp, cfg.context_parallel_size) == \
        (d.tp, d.pp, d.vpp, d.cp)
    assert (cfg.expert_model_parallel_size, cfg.sequence_parallel) == (d.ep, plan.sequence_parallel)
    if d.ep > 1:
        assert cfg.expert_tensor_parallel_size == (plan.etp or d.tp)
    world = int(ns.nnodes) * int(ns.nproc_per_node)
    assert world == d.world_size and world // (d.tp * d.pp * d.cp) == d.dp
    assert (args["micro_batch_size"], args["global_batch_size"]) == (plan.micro_batch, plan.global_batch)
    assert args["global_batch_size"] // (args["micro_batch_size"] * d.dp) == plan.grad_accum
    assert cfg.num_layers == plan.model.num_layers
    if plan.stages:
        assert _layers_per_stage(cfg) == [s.num_layers for s in plan.stages]
    assert (cfg.recompute_granularity or "none") == plan.recompute.split(":")[0]
    if plan.recompute == "full":
        assert (cfg.recompute_method, cfg.recompute_num_layers) == ("uniform", 1)  # every layer recomputed
    elif plan.recompute.startswith("full:"):  # the first N layers of every stage / virtual chunk
        assert (cfg.recompute_method, cfg.recompute_num_layers) == ("block", _common.recompute_layers(plan))
    if plan.recompute == "selective":  # the module list, or TransformerConfig's default
        assert cfg.recompute_modules == (plan.recompute_modules.split("+") if plan.recompute_modules else ["core_attn"])
    assert (cfg.mtp_num_layers or 0) == plan.mtp
    recipe = _common.fp8_recipe(plan)
    want = {"bf16": (True, False), "fp16": (False, True), "fp8": (True, False), "nvfp4": (True, False)}[plan.dtype]
    assert (cfg.bf16, cfg.fp16) == want
    fp8 = recipe if recipe not in ("none", "nvfp4") else "none"  # NVFP4 is megatron-core's fp4 mode, not fp8
    assert (cfg.fp8, cfg.fp8_recipe if cfg.fp8 else "none") == (("hybrid", fp8) if fp8 != "none" else
                                                                 (None, "none"))
    assert (cfg.fp4, cfg.fp4_recipe) == (("e2m1", "nvfp4") if recipe == "nvfp4" else (None, "nvfp4"))
    # the layers kept in bf16: megatron-core's fp8 / fp4 context skips those its counts name (fp8_utils, fp4_utils)
    first, last = _common.bf16_layers(plan)
    assert cfg.first_last_layers_bf16 == bool(first or last)
    if cfg.first_last_layers_bf16:
        assert (cfg.num_layers_at_start_in_bf16, cfg.num_layers_at_end_in_bf16) == (first, last)
    if d.cp > 1:
        assert cfg.cp_comm_type == {"ring": "p2p", "allgather": "all_gather", "a2a": "a2a"}[plan.cp_kind]
    assert (cfg.moe_expert_capacity_factor or 0) == plan.moe_capacity
    assert cfg.moe_pad_expert_input_to_capacity == bool(plan.moe_capacity)
    assert cfg.overlap_moe_expert_parallel_comm == plan.moe_overlap
    assert cfg.moe_shared_expert_overlap == (plan.shared_overlap and bool(plan.model.num_experts))
    assert cfg.moe_router_fusion == (plan.moe_router_fusion and bool(plan.model.num_experts))
    if plan.model.num_experts:  # the loss's type (its coefficient is the user's: TransformerConfig's default 0.0)
        assert cfg.moe_router_load_balancing_type == ("aux_loss" if plan.moe_aux_loss == "none" else plan.moe_aux_loss)
    # what the plan priced: overlapped p2p unless in line (planner.layout.layout.p2p_overlapped)
    if vpp > 1 and d.pp > 2:
        assert cfg.overlap_p2p_comm == p2p_overlapped(plan.pp_overlap, plan.stack, d.pp, plan.schedule)
    if plan.moe_dispatcher == "deepep" and plan.model.num_experts:  # argparse keeps a repeated flag's last value
        assert args["moe_token_dispatcher_type"] == "flex"
    assert (cfg.num_moe_experts or 0) == plan.model.num_experts


def test_megatron_core_refuses_what_it_should() -> None:
    """The check can fail: heads not divisible by tp, and MoE with tp > 1 without sequence parallel."""
    from megatron.core.transformer import TransformerConfig

    with pytest.raises((ValueError, AssertionError)):
        _transformer_config({"--num-layers": "4", "--hidden-size": "64", "--num-attention-heads": "6",
                             "--tensor-model-parallel-size": "4", "--bf16": True})
    with pytest.raises((ValueError, AssertionError)):
        TransformerConfig(num_layers=4, hidden_size=64, num_attention_heads=8, num_moe_experts=8,
                          tensor_model_parallel_size=2, sequence_parallel=False, moe_router_topk=2)


# Free searches whose best plans Megatron-Core is asked to build: the flagship NVL72 one (issue 26), an H100 MoE one
# at 2048 GPUs, token dropping (the dispatcher rule), long context, with the decisions a free search takes itself.
FREE_SEARCHES = [("deepseek-v3", "144x4xGB200-NVL72", 4608, 4096, "bf16", ""),
                 ("deepseek-v3", "2048x8xH100", 16384, 4096, "bf16", ""),
                 ("qwen3-30b-a3b", "16x8xH100", 1024, 4096, "bf16", ""),
                 ("mixtral-8x7b", "2x8xH100", 64, 4096, "bf16", "moe_capacity=1.25"),
                 ("llama-3.1-70b", "8x8xH100", 64, 131072, "bf16", ""),
                 ("glm-4.5", "16x8xH100", 1024, 4096, "bf16", ""),
                 ("gpt-oss-20b", "2x8xH100", 128, 4096, "bf16", ""),
                 ("nemotron-3-nano-30b-a3b", "2x8xH100", 256, 8192, "bf16", ""),
                 ("nemotron-h-8b", "1x8xH100", 64, 4096, "bf16", ""),
                 ("qwen3-next-80b-a3b", "4x8xH100", 256, 4096, "bf16", ""),
                 ("qwen3.5-9b", "1x8xH100", 64, 4096, "bf16", "")]


@pytest.mark.skipif(BASH is None, reason="bash not available")
@pytest.mark.parametrize("model,cluster,batch,seq,dtype,fix", FREE_SEARCHES,
                         ids=[f"{s[0]}-{s[1]}" for s in FREE_SEARCHES])
def test_megatron_core_builds_what_a_free_search_recommends(model, cluster, batch, seq, dtype, fix, tmp_path):
    """Each of the five best plans of a free search, exported to Megatron and read back into megatron-core's own
    ``TransformerConfig``, which raises on any combination it does not run (issue 26: the NVL72 search once ranked
    ``moe_overlap`` under full recomputation first)."""
    from megatron.core.models.gpt.experimental_attention_variant_module_specs import get_linear_attention_pattern
    from megatron.core.transformer.utils import is_layer_window_attention

    from meshplan.planner.cluster.spec import load_cluster
    from meshplan.planner.estimate.base import Workload
    from meshplan.planner.layout.space import parse_fix
    from meshplan.planner.model.config import load_model
    from meshplan.planner.plan.build import to_plan
    from meshplan.planner.search.exact import search

    work = Workload(load_model(model), load_cluster(cluster), batch, seq, dtype)
    ranked = search(work, parse_fix(fix) if fix else {}, top=5).ranked
    assert ranked
    for i, (layout, est) in enumerate(ranked):
        plan = to_plan(work, layout, est, f"{model}-{i}", model, "shipped")
        ns = _torchrun_parse(_argv(render_megatron(plan), tmp_path, {"HEAD_NODE": "node-a", "NODE_RANK": "0"}))
        cfg, args = _transformer_config(_megatron_args(ns.training_script_args))
        assert (cfg.expert_model_parallel_size, cfg.pipeline_model_parallel_size) == (layout.ep, layout.pp)
        m = work.model  # the attention each config.json describes, as Megatron reads the exported flags
        assert (cfg.qk_layernorm, cfg.add_qkv_bias or cfg.add_bias_linear and m.model_type == "gpt_oss",
                float(args.get("rotary_percent", 1.0))) == (m.qk_norm, m.qkv_bias, m.rotary_percent)
        windowed = tuple(i for i in range(m.num_layers)
                         if is_layer_window_attention(cfg.window_size, cfg.window_attn_skip_freq, i + 1))
        assert windowed == (m.window_layers if m.sliding_window else ())
        assert (cfg.window_size or (0, 0))[0] == m.sliding_window
        assert (cfg.softmax_type == "learnable", cfg.activation_func_clamp_value or 0.0) == (
            m.attention_sinks, m.glu_clamp)
        hybrid = (args.get("hybrid_override_pattern", ""), cfg.is_hybrid_model) == (m.layer_pattern, m.is_hybrid)
        assert hybrid and ns.training_script == ("pretrain_mamba.py" if m.is_hybrid else "pretrain_gpt.py")
        linear = get_linear_attention_pattern(cfg) if cfg.experimental_attention_variant else []
        assert tuple(i for i, la in enumerate(linear) if la) == m.gdn_layers  # the layers Gated DeltaNet mixes
        if m.gdn_layers:  # its heads and widths, the gated attention and shared expert, as gpt_builders.py builds
            assert (cfg.experimental_attention_variant, cfg.linear_num_key_heads, cfg.linear_num_value_heads,
                    cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.linear_conv_kernel_dim) == (
                "gated_delta_net", m.gdn_key_heads, m.gdn_value_heads, m.gdn_key_head_dim, m.gdn_value_head_dim,
                m.gdn_conv_kernel)
            assert (cfg.attention_output_gate, cfg.layernorm_zero_centered_gamma, cfg.moe_shared_expert_gate) == (
                True, True, m.shared_expert_gate)
        if m.is_hybrid:  # the mixers and the experts as pretrain_mamba.py builds them
            assert (cfg.mamba_num_heads, cfg.mamba_head_dim, cfg.mamba_num_groups, cfg.mamba_state_dim) == (
                m.mamba_heads, m.mamba_head_dim, m.mamba_groups, m.mamba_state)
            assert (cfg.num_moe_experts or 0, cfg.moe_shared_expert_intermediate_size or 0) == (
                m.num_experts, m.shared_expert_ffn_hidden_size)
            assert (args["position_embedding_type"], cfg.add_bias_linear) == ("none", False)


def render_megatron(plan) -> str:
    from meshplan.planner.export import render

    return render(plan, "megatron").text
