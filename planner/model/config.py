"""Hugging Face ``config.json`` -> :class:`planner.model.spec.ModelSpec`, and the bundled model presets.

Missing keys take the **per-family class default** of transformers' ``configuration_<type>.py`` (models.md §2):
``num_key_value_heads`` (Llama: = heads, Mistral/Mixtral 8, Qwen2/Qwen3 32, Qwen2-MoE 16, Qwen3-MoE 4),
``head_dim`` (Qwen3: 128, others ``h/a``), ``tie_word_embeddings`` (GPT-2 True, others False), GPT-2 ``n_inner``
(``4h``). Shape fields that decide the size of the model (hidden size, layers, heads, vocab, FFN/expert widths)
are required: a silently defaulted width would give a plausible but wrong plan. Unknown keys are ignored;
both transformers v4 and v5 spellings are accepted (``rope_scaling``/``rope_parameters``, ``torch_dtype``/
``dtype``, ``rotary_pct``/``partial_rotary_factor``).
"""
from __future__ import annotations

import difflib
import functools
import math
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping

from meshplan.core.bounds import load_json_file
from meshplan.core.errors import MeshplanError
from meshplan.core.frozen import freeze
from meshplan.core.yamlio import load_packaged
from meshplan.planner.model.hf_config import check_hf_config
from meshplan.planner.model.spec import ModelSpec

PRESET_DIR = Path(__file__).resolve().parents[1] / "presets" / "models"
PRESET_INDEX = PRESET_DIR / "index.yaml"

# architectures[0] -> model_type, used only when a file has no model_type.
ARCHITECTURES = {
    "LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "MixtralForCausalLM": "mixtral",
    "Qwen2ForCausalLM": "qwen2", "Qwen2MoeForCausalLM": "qwen2_moe", "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe", "DeepseekV3ForCausalLM": "deepseek_v3", "GPT2LMHeadModel": "gpt2",
    "GPTNeoXForCausalLM": "gpt_neox", "NemotronHForCausalLM": "nemotron_h", "GptOssForCausalLM": "gpt_oss",
    "NemotronForCausalLM": "nemotron", "Glm4MoeForCausalLM": "glm4_moe", "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3_text", "Qwen3NextForCausalLM": "qwen3_next", "Qwen3_5ForCausalLM": "qwen3_5_text",
    "Qwen3_5MoeForCausalLM": "qwen3_5_moe_text",
}
_REQUIRED = object()


class _Reader:
    """Typed access to one config dict; every error names the file and the key."""

    def __init__(self, cfg: dict[str, Any], where: str, model_type: str):
        self.cfg, self.where, self.model_type = cfg, where, model_type

    def fail(self, problem: str) -> MeshplanError:
        return MeshplanError(f"{self.where}: {problem}")

    def _raw(self, key: str, default: Any) -> Any:
        value = self.cfg.get(key)
        if value is None:  # absent or null both mean "class default"
            if default is _REQUIRED:
                raise self.fail(f"missing required field '{key}' for model_type '{self.model_type}'")
            return default
        return value

    def int(self, key: str, default: Any = _REQUIRED, *, minimum: int = 1) -> int:
        value = self._raw(key, default)
        if value is None:
            return value
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise self.fail(f"'{key}' must be an integer >= {minimum}, got {value!r}")
        return value

    def bool(self, key: str, default: bool) -> bool:
        value = self._raw(key, default)
        if not isinstance(value, bool):
            raise self.fail(f"'{key}' must be true or false, got {value!r}")
        return value

    def positive(self, key: str, default: float) -> float:
        value = self._raw(key, default)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise self.fail(f"'{key}' must be a positive number, got {value!r}")
        return float(value)

    def int_list(self, key: str) -> list[int]:
        value = self._raw(key, [])
        if not isinstance(value, list) or any(not isinstance(v, int) or isinstance(v, bool) for v in value):
            raise self.fail(f"'{key}' must be a list of layer indices, got {value!r}")
        return value

    def rope_theta(self) -> float:
        params = self.cfg.get("rope_parameters")  # transformers v5 moved rope_theta inside rope_parameters
        if isinstance(params, dict) and isinstance(params.get("rope_theta"), (int, float)):
            return float(params["rope_theta"])
        theta = self.cfg.get("rope_theta")
        return float(theta) if isinstance(theta, (int, float)) and not isinstance(theta, bool) else 0.0

    def rotary_fraction(self, default: float) -> float:
        """The share of each head RoPE rotates, ``partial_rotary_factor``: in ``rope_parameters`` (transformers v5
        moved it there) or at the top level, in (0, 1]."""
        params = self.cfg.get("rope_parameters")
        value = params.get("partial_rotary_factor") if isinstance(params, dict) else None
        value = self._raw("partial_rotary_factor", default) if value is None else value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            raise self.fail(f"'partial_rotary_factor' must be in (0, 1], got {value!r}")
        return float(value)

    def rope_scaling(self) -> tuple[str, float]:
        """(rope type, factor) of a scaled RoPE (``llama3``, ``yarn``, ``linear``, ...); ("", 0.0) when unscaled."""
        params = self.cfg.get("rope_parameters") or self.cfg.get("rope_scaling")
        if not isinstance(params, dict):
            return "", 0.0
        kind = params.get("rope_type") or params.get("type") or ""
        factor = params.get("factor", 0.0)
        kind = kind if isinstance(kind, str) and kind != "default" else ""
        ok = isinstance(factor, (int, float)) and not isinstance(factor, bool) and math.isfinite(factor)
        return kind, float(factor) if kind and ok and factor > 0 else 0.0

    def dtype(self) -> str:
        value = self.cfg.get("dtype") or self.cfg.get("torch_dtype")  # v5 renamed torch_dtype -> dtype
        return value if isinstance(value, str) else ""


def _heads(r: _Reader, *, kv_default: int | None, head_dim_default: int | None) -> dict[str, int]:
    h, a = r.int("hidden_size"), r.int("num_attention_heads")
    a_kv = r.int("num_key_value_heads", kv_default if kv_default is not None else a)
    head_dim = r.int("head_dim", head_dim_default if head_dim_default is not None else 0, minimum=0)
    if not head_dim:
        if h % a:
            raise r.fail(f"hidden_size {h} is not divisible by num_attention_heads {a} and no head_dim is given")
        head_dim = h // a
    if a % a_kv:
        raise r.fail(f"num_attention_heads {a} is not a multiple of num_key_value_heads {a_kv}")
    return dict(hidden_size=h, num_heads=a, num_kv_heads=a_kv, head_dim=head_dim, v_head_dim=head_dim)


def _base(r: _Reader, tie_default: bool) -> dict[str, Any]:
    return dict(
        model_type=r.model_type,
        num_layers=r.int("num_hidden_layers"),
        vocab_size=r.int("vocab_size"),
        tied_embeddings=r.bool("tie_word_embeddings", tie_default),
        max_position_embeddings=r.int("max_position_embeddings", 0, minimum=0),
        rope_theta=r.rope_theta(),
        rope_scaling_type=r.rope_scaling()[0],
        rope_scaling_factor=r.rope_scaling()[1],
        dtype=r.dtype(),
        gated_mlp=True,
        norm="rmsnorm",
    )


def _moe_layers(r: _Reader, num_layers: int, num_experts: int) -> tuple[int, ...]:
    # Qwen2-MoE / Qwen3-MoE (modeling_qwen*_moe.py): layer i is sparse iff it is not in mlp_only_layers and
    # (i + 1) % decoder_sparse_step == 0.
    step = r.int("decoder_sparse_step", 1)
    dense_only = set(r.int_list("mlp_only_layers"))
    bad = sorted(i for i in dense_only if not 0 <= i < num_layers)
    if bad:
        raise r.fail(f"'mlp_only_layers' has layers {bad} outside 0..{num_layers - 1}")
    if num_experts <= 0:
        return ()
    return tuple(i for i in range(num_layers) if i not in dense_only and (i + 1) % step == 0)


def _llama(r: _Reader) -> dict[str, Any]:
    spec = _base(r, False) | _heads(r, kv_default=None, head_dim_default=None)
    bias = r.bool("attention_bias", False)  # LlamaAttention: q, k, v and o all use attention_bias
    return spec | dict(ffn_hidden_size=r.int("intermediate_size"), qkv_bias=bias, o_bias=bias,
                       mlp_bias=r.bool("mlp_bias", False))


def _mistral(r: _Reader) -> dict[str, Any]:
    return _base(r, False) | _heads(r, kv_default=8, head_dim_default=None) | dict(
        ffn_hidden_size=r.int("intermediate_size"))


def _mixtral(r: _Reader) -> dict[str, Any]:
    spec = _base(r, False) | _heads(r, kv_default=8, head_dim_default=None)
    experts = r.int("num_local_experts")
    return spec | dict(ffn_hidden_size=0, num_experts=experts, experts_per_token=r.int("num_experts_per_tok"),
                       moe_ffn_hidden_size=r.int("intermediate_size"), moe_layers=tuple(range(spec["num_layers"])))


def _qwen2(r: _Reader) -> dict[str, Any]:
    # modeling_qwen2.py hard-codes bias=True on q/k/v (no config key); o_proj has none.
    return _base(r, False) | _heads(r, kv_default=32, head_dim_default=None) | dict(
        ffn_hidden_size=r.int("intermediate_size"), qkv_bias=True)


def _qwen_moe_common(r: _Reader, spec: dict[str, Any], dense_default: int | None = None) -> dict[str, Any]:
    """Qwen2/3-MoE's experts; ``dense_default``: the dense width when the config has no ``intermediate_size``
    (Qwen3.5-MoE's has none: every layer is MoE), None where it must have one."""
    experts = r.int("num_experts")
    layers = _moe_layers(r, spec["num_layers"], experts)
    dense = len(layers) < spec["num_layers"]
    width = r.int("intermediate_size") if dense_default is None else r.int("intermediate_size", dense_default,
                                                                            minimum=0)
    return dict(num_experts=experts, experts_per_token=r.int("num_experts_per_tok"),
                moe_ffn_hidden_size=r.int("moe_intermediate_size"), moe_layers=layers,
                ffn_hidden_size=width if dense else 0)


def _qwen2_moe(r: _Reader) -> dict[str, Any]:
    spec = _base(r, False) | _heads(r, kv_default=16, head_dim_default=None)
    shared = r.int("shared_expert_intermediate_size", 0, minimum=0)
    return spec | _qwen_moe_common(r, spec) | dict(
        qkv_bias=r.bool("qkv_bias", True), num_shared_experts=1 if shared else 0,
        shared_expert_ffn_hidden_size=shared, shared_expert_gate=bool(shared))


def _qwen3(r: _Reader) -> dict[str, Any]:
    bias = r.bool("attention_bias", False)
    return _base(r, False) | _heads(r, kv_default=32, head_dim_default=128) | dict(
        ffn_hidden_size=r.int("intermediate_size"), qkv_bias=bias, o_bias=bias, qk_norm=True)


def _qwen3_moe(r: _Reader) -> dict[str, Any]:
    spec = _base(r, False) | _heads(r, kv_default=4, head_dim_default=128)
    bias = r.bool("attention_bias", False)
    return spec | _qwen_moe_common(r, spec) | dict(qkv_bias=bias, o_bias=bias, qk_norm=True)


def _gated_linear_hybrid(r: _Reader, kv_default: int, moe: bool) -> dict[str, Any]:
    """Qwen3-Next and Qwen3.5's text decoders (transformers ``modeling_qwen3_next.py``, v5's
    ``modeling_qwen3_5.py`` / ``modeling_qwen3_5_moe.py``): the layers ``layer_types`` names ``linear_attention``
    (default: three in four, ``full_attention_interval`` 4) mix with Gated DeltaNet, the others with gated attention
    (q_proj also yields an output gate; q/k norms over ``head_dim``; ``partial_rotary_factor`` of it rotated, at the
    top level or in ``rope_parameters``); ``moe``: Qwen3-MoE's experts (``decoder_sparse_step``, ``mlp_only_layers``)
    with one shared expert behind a sigmoid gate, else a dense SwiGLU MLP; untied. Qwen3.5's multi-token-prediction
    module (``mtp_num_hidden_layers``) is not read: transformers builds none (it skips ``mtp.*`` weights)."""
    spec = _base(r, False) | _heads(r, kv_default=kv_default, head_dim_default=256)
    layers = spec["num_layers"]
    types = r.cfg.get("layer_types")
    if types is None:
        every = r.int("full_attention_interval", 4)
        types = ["linear_attention" if (i + 1) % every else "full_attention" for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers or \
            set(types) - {"linear_attention", "full_attention"}:
        raise r.fail(f"'layer_types' must list 'linear_attention' or 'full_attention' for each of the {layers} "
                     f"layers, got {types!r}")
    bias = r.bool("attention_bias", False)
    out = spec | dict(
        qkv_bias=bias, o_bias=bias, qk_norm=True, attn_output_gate=r.bool("attn_output_gate", True),
        rotary_percent=r.rotary_fraction(0.25),
        gdn_layers=tuple(i for i, t in enumerate(types) if t == "linear_attention"),
        gdn_key_heads=r.int("linear_num_key_heads"), gdn_value_heads=r.int("linear_num_value_heads"),
        gdn_key_head_dim=r.int("linear_key_head_dim"), gdn_value_head_dim=r.int("linear_value_head_dim"),
        gdn_conv_kernel=r.int("linear_conv_kernel_dim", 4))
    if not moe:
        return out | dict(ffn_hidden_size=r.int("intermediate_size"))
    shared = r.int("shared_expert_intermediate_size", 0, minimum=0)
    return out | _qwen_moe_common(r, spec, dense_default=0) | dict(
        num_shared_experts=1 if shared else 0, shared_expert_ffn_hidden_size=shared, shared_expert_gate=bool(shared))


def _qwen3_next(r: _Reader) -> dict[str, Any]:
    return _gated_linear_hybrid(r, kv_default=2, moe=True)


def _qwen3_5_text(r: _Reader) -> dict[str, Any]:
    return _gated_linear_hybrid(r, kv_default=4, moe=False)


def _qwen3_5_moe_text(r: _Reader) -> dict[str, Any]:
    return _gated_linear_hybrid(r, kv_default=2, moe=True)


def _deepseek_v3(r: _Reader) -> dict[str, Any]:
    spec = _base(r, False)
    h, a, layers = r.int("hidden_size"), r.int("num_attention_heads"), spec["num_layers"]
    nope, rope, v = r.int("qk_nope_head_dim"), r.int("qk_rope_head_dim"), r.int("v_head_dim")
    experts = r.int("n_routed_experts")
    width = r.int("moe_intermediate_size")
    shared = r.int("n_shared_experts", 0, minimum=0)
    first_dense = r.int("first_k_dense_replace", 0, minimum=0)
    freq = r.int("moe_layer_freq", 1)
    # DeepSeek's modeling_deepseek.py: layer i is MoE iff i >= first_k_dense_replace and i % moe_layer_freq == 0.
    moe = tuple(i for i in range(layers) if i >= first_dense and i % freq == 0)
    bias = r.bool("attention_bias", False)
    return spec | dict(
        hidden_size=h, num_heads=a, num_kv_heads=a, head_dim=nope + rope, v_head_dim=v,
        q_lora_rank=r.int("q_lora_rank", 0, minimum=0), kv_lora_rank=r.int("kv_lora_rank"),
        qk_rope_head_dim=rope, ffn_hidden_size=r.int("intermediate_size") if len(moe) < layers else 0,
        num_experts=experts, experts_per_token=r.int("num_experts_per_tok"), moe_ffn_hidden_size=width,
        num_shared_experts=shared, shared_expert_ffn_hidden_size=shared * width, moe_layers=moe,
        router_bias=True, qkv_bias=bias, o_bias=bias, **_group_limited(r, experts),
        config_mtp_layers=r.int("num_nextn_predict_layers", 0, minimum=0))


def _glm4_moe(r: _Reader) -> dict[str, Any]:
    """GLM-4.5 / 4.5-Air (transformers ``configuration_glm4_moe.py`` / ``modeling_glm4_moe.py``; Megatron-Bridge
    ``GLMMoEModelProvider``): grouped-query attention with biases on q/k/v only (``attention_bias``; ``o_proj`` has
    none), RMSNorm on q and k where ``use_qk_norm``, RoPE on ``partial_rotary_factor`` of each head, dense SwiGLU
    layers before ``first_k_dense_replace`` and MoE after it (sigmoid router with ``e_score_correction_bias``, shared
    experts of ``n_shared_experts`` x ``moe_intermediate_size``), and ``num_nextn_predict_layers`` MTP modules."""
    spec = _base(r, False) | _heads(r, kv_default=8, head_dim_default=None)
    layers = spec["num_layers"]
    experts = r.int("n_routed_experts")
    width = r.int("moe_intermediate_size")
    shared = r.int("n_shared_experts", 1, minimum=0)
    first_dense = r.int("first_k_dense_replace", 1, minimum=0)
    moe = tuple(range(min(first_dense, layers), layers))  # Glm4MoeDecoderLayer: MoE iff layer_idx >= it
    rotary = r.rotary_fraction(0.5)  # the config class's default
    return spec | dict(
        ffn_hidden_size=r.int("intermediate_size") if len(moe) < layers else 0, num_experts=experts,
        experts_per_token=r.int("num_experts_per_tok"), moe_ffn_hidden_size=width, num_shared_experts=shared,
        shared_expert_ffn_hidden_size=shared * width, moe_layers=moe, router_bias=True,
        qkv_bias=r.bool("attention_bias", False), qk_norm=r.bool("use_qk_norm", False), rotary_percent=rotary,
        **_group_limited(r, experts), config_mtp_layers=r.int("num_nextn_predict_layers", 0, minimum=0))


def _group_limited(r: _Reader, experts: int) -> dict[str, int]:
    """``routing_groups`` / ``routing_groups_per_token`` from ``n_group`` / ``topk_group`` (DeepSeek's
    ``MoEGate``: group scores, ``topk_group`` groups kept, the top-k experts among theirs); none when every group
    is kept."""
    groups = r.int("n_group", 1, minimum=1)
    per_token = r.int("topk_group", groups, minimum=1)
    if groups == 1 or per_token >= groups:
        return {}
    if experts % groups:
        raise r.fail(f"n_routed_experts {experts} is not divisible by n_group {groups}")
    return dict(routing_groups=groups, routing_groups_per_token=per_token)


def _gpt2(r: _Reader) -> dict[str, Any]:
    h, a = r.int("n_embd"), r.int("n_head")
    if h % a:
        raise r.fail(f"n_embd {h} is not divisible by n_head {a}")
    positions = r.int("n_positions")
    return dict(
        model_type="gpt2", hidden_size=h, num_layers=r.int("n_layer"), num_heads=a, num_kv_heads=a,
        head_dim=h // a, v_head_dim=h // a, ffn_hidden_size=r.int("n_inner", 4 * h), vocab_size=r.int("vocab_size"),
        tied_embeddings=r.bool("tie_word_embeddings", True), gated_mlp=False, norm="layernorm",
        position_embeddings=positions, max_position_embeddings=positions, qkv_bias=True, o_bias=True,
        mlp_bias=True, dtype=r.dtype())


def _gpt_neox(r: _Reader) -> dict[str, Any]:
    spec = _base(r, False) | _heads(r, kv_default=None, head_dim_default=None)
    bias = r.bool("attention_bias", True)
    return spec | dict(num_kv_heads=spec["num_heads"], ffn_hidden_size=r.int("intermediate_size"),
                       gated_mlp=False, norm="layernorm", qkv_bias=bias, o_bias=bias, mlp_bias=True)


def _nemotron(r: _Reader) -> dict[str, Any]:
    """Nemotron-4 (transformers ``configuration_nemotron.py``): Llama's attention with query groups, a two-matrix
    squared-ReLU MLP (``hidden_act`` relu2), LayerNorm1P, untied, no biases unless the config says so."""
    bias = r.bool("attention_bias", False)
    return _base(r, False) | _heads(r, kv_default=None, head_dim_default=None) | dict(
        ffn_hidden_size=r.int("intermediate_size"), gated_mlp=False, norm="layernorm", qkv_bias=bias, o_bias=bias,
        mlp_bias=r.bool("mlp_bias", False))


def _nemotron_h(r: _Reader) -> dict[str, Any]:
    """Nemotron-H / Nemotron 3 (transformers ``configuration_nemotron_h.py``; Megatron-Bridge ``MambaModelProvider``):
    one block per layer from ``hybrid_override_pattern`` (M Mamba-2, * attention, - MLP, E MoE), squared-ReLU MLPs
    (``mlp_hidden_act`` relu2: two matrices), MoE with one shared expert, an optional latent width for the routed
    experts and hybrid MTP modules (``mtp_hybrid_override_pattern``)."""
    spec = _base(r, False) | _heads(r, kv_default=None, head_dim_default=None)
    pattern = r.cfg.get("hybrid_override_pattern")
    if not isinstance(pattern, str) or len(pattern) != spec["num_layers"] or set(pattern) - set("M*-E"):
        raise r.fail(f"'hybrid_override_pattern' must be a string of M, *, - and E, one per layer "
                     f"({spec['num_layers']}), got {pattern!r}")
    mtp = r.cfg.get("mtp_hybrid_override_pattern") or ""
    if not isinstance(mtp, str) or set(mtp) - set("M*-E"):
        raise r.fail(f"'mtp_hybrid_override_pattern' must be a string of M, *, - and E, got {mtp!r}")
    experts = r.int("n_routed_experts", 0, minimum=0) if "E" in pattern + mtp else 0
    act = r.cfg.get("mlp_hidden_act", "relu2")
    out = spec | dict(
        layer_pattern=pattern, gated_mlp=act not in ("relu2", "relu", "gelu"),
        ffn_hidden_size=r.int("intermediate_size") if "-" in pattern + mtp else r.int("intermediate_size", 0,
                                                                                         minimum=0),
        moe_layers=tuple(i for i, c in enumerate(pattern) if c == "E"),
        qkv_bias=r.bool("attention_bias", False), o_bias=r.bool("attention_bias", False),
        mlp_bias=r.bool("mlp_bias", False))
    if "M" in pattern:
        out |= dict(mamba_heads=r.int("mamba_num_heads"), mamba_head_dim=r.int("mamba_head_dim"),
                    mamba_state=r.int("ssm_state_size"), mamba_groups=r.int("n_groups"),
                    mamba_conv_kernel=r.int("conv_kernel"), mamba_chunk=r.int("chunk_size", 128))
    if experts:
        width = r.int("moe_intermediate_size")
        shared = r.int("moe_shared_expert_intermediate_size", 0, minimum=0) * max(1, r.int("n_shared_experts", 1))
        out |= dict(num_experts=experts, experts_per_token=r.int("num_experts_per_tok"), moe_ffn_hidden_size=width,
                    num_shared_experts=r.int("n_shared_experts", 1, minimum=0), shared_expert_ffn_hidden_size=shared,
                    moe_latent_size=r.int("moe_latent_size", 0, minimum=0))
    mtp_layers = r.int("num_nextn_predict_layers", 0, minimum=0)
    return out | dict(config_mtp_layers=mtp_layers, mtp_pattern=mtp if mtp_layers else "")


def _gpt_oss(r: _Reader) -> dict[str, Any]:
    """GPT-OSS (transformers ``configuration_gpt_oss.py`` / ``modeling_gpt_oss.py``): MoE on every layer, biases on
    q/k/v/o, on every expert and on the router, the gated activation's inputs clamped to ``swiglu_limit`` (the config
    class's default 7.0), one learned sink logit per head, and ``sliding_window`` attention
    on the layers ``layer_types`` names ``sliding_attention`` (default: every other layer from the first, the
    config class's own default; Megatron-Bridge ``GPTOSSProvider``: window (128, 0), ``window_attn_skip_freq`` 2)."""
    spec = _base(r, False) | _heads(r, kv_default=None, head_dim_default=None)
    layers = spec["num_layers"]
    bias = r.bool("attention_bias", True)
    return spec | dict(
        ffn_hidden_size=0, num_experts=r.int("num_local_experts"), experts_per_token=r.int("num_experts_per_tok"),
        moe_ffn_hidden_size=r.int("intermediate_size"), moe_layers=tuple(range(layers)), qkv_bias=bias,
        o_bias=bias, expert_bias=True, attention_sinks=True, sliding_window=r.int("sliding_window", 128),
        glu_clamp=r.positive("swiglu_limit", 7.0),
        window_layers=_window_layers(r, layers, 2))


def _window_layers(r: _Reader, layers: int, pattern: int) -> tuple[int, ...]:
    """The layers ``layer_types`` names ``sliding_attention``; without it, every layer but each ``pattern``-th
    (transformers' own default: ``"sliding_attention" if bool((i + 1) % pattern) else "full_attention"``)."""
    kinds = r.cfg.get("layer_types") or ["sliding_attention" if (i + 1) % pattern else "full_attention"
                                         for i in range(layers)]
    if not isinstance(kinds, list) or len(kinds) != layers or set(kinds) - {"sliding_attention", "full_attention"}:
        raise r.fail(f"'layer_types' must list sliding_attention or full_attention for each of {layers} layers")
    return tuple(i for i, k in enumerate(kinds) if k == "sliding_attention")


def _softcap(r: _Reader, key: str, default: float) -> float:
    """A logit soft-cap (``cap * tanh(x / cap)``): absent takes the config class's ``default``, null none (0)."""
    if key not in r.cfg:
        return default
    return 0.0 if r.cfg[key] is None else r.positive(key, default)


def _gemma(r: _Reader, pattern: int) -> dict[str, Any]:
    """What Gemma 2 and Gemma 3 share (transformers ``modeling_gemma2.py`` / ``modeling_gemma3.py``): grouped-query
    attention with its own ``head_dim``, a gated MLP under tanh-approximated GELU (GeGLU: the gated kernel's
    traffic, priced as SwiGLU's), a pre- and a post-norm around each block, tied embeddings scaled by sqrt(hidden),
    and ``sliding_window`` attention on the layers ``layer_types`` names (default: all but every ``pattern``-th)."""
    spec = _base(r, True) | _heads(r, kv_default=None, head_dim_default=256)
    act = r.cfg.get("hidden_activation", r.cfg.get("hidden_act", "gelu_pytorch_tanh"))
    if act not in ("gelu_pytorch_tanh", "gelu"):
        raise r.fail(f"'hidden_activation' must be gelu_pytorch_tanh (Gemma's GeGLU), got {act!r}")
    bias = r.bool("attention_bias", False)
    return spec | dict(ffn_hidden_size=r.int("intermediate_size"), qkv_bias=bias, o_bias=bias, post_norms=True,
                       sliding_window=r.int("sliding_window", 4096),
                       window_layers=_window_layers(r, spec["num_layers"], pattern))


def _gemma2(r: _Reader) -> dict[str, Any]:
    """Gemma 2 (``Gemma2Config``): local and global attention alternating, and soft-capped attention scores and
    output logits (defaults 50 and 30; Megatron-Bridge ``Gemma2ModelProvider``: the same, and its unfused
    ``Gemma2DotProductAttention`` for the attention's cap)."""
    return _gemma(r, 2) | dict(attn_softcap=_softcap(r, "attn_logit_softcapping", 50.0),
                               logit_softcap=_softcap(r, "final_logit_softcapping", 30.0))


def _gemma3_text(r: _Reader) -> dict[str, Any]:
    """Gemma 3's text decoder (``Gemma3TextConfig``): five local layers to one global (``sliding_window_pattern``
    6), RMSNorm on q and k instead of Gemma 2's soft-caps (both null in its configs)."""
    pattern = r.int("sliding_window_pattern", 6)
    return _gemma(r, pattern) | dict(qk_norm=True, attn_softcap=_softcap(r, "attn_logit_softcapping", 0.0),
                                     logit_softcap=_softcap(r, "final_logit_softcapping", 0.0))


FAMILIES: dict[str, Callable[[_Reader], dict[str, Any]]] = {
    "llama": _llama, "mistral": _mistral, "mixtral": _mixtral, "qwen2": _qwen2, "qwen2_moe": _qwen2_moe,
    "qwen3": _qwen3, "qwen3_moe": _qwen3_moe, "qwen3_next": _qwen3_next, "qwen3_5_text": _qwen3_5_text,
    "qwen3_5_moe_text": _qwen3_5_moe_text, "deepseek_v3": _deepseek_v3, "gpt2": _gpt2, "gpt_neox": _gpt_neox,
    "nemotron_h": _nemotron_h, "gpt_oss": _gpt_oss, "nemotron": _nemotron, "glm4_moe": _glm4_moe,
    "gemma2": _gemma2, "gemma3_text": _gemma3_text,
}


# Configs of models whose language decoder meshplan prices but which hold more than it (the reason, after "is")
NOT_DECODERS = {
    "gemma3": "Gemma 3's vision-language model (a SigLIP image encoder beside the decoder); meshplan prices the text "
              "decoder alone: save its 'text_config' as a config.json with model_type gemma3_text",
    "qwen3_5": "Qwen3.5's vision-language model (a vision encoder beside the decoder); meshplan prices the text "
               "decoder alone: save its 'text_config' as a config.json with model_type qwen3_5_text",
    "qwen3_5_moe": "Qwen3.5-MoE's vision-language model (a vision encoder beside the decoder); meshplan prices the "
                   "text decoder alone: save its 'text_config' as a config.json with model_type qwen3_5_moe_text",
}


def spec_from_config(cfg: Any, *, where: str, name: str, source: str, mtp: bool = False) -> ModelSpec:
    """Build a spec from a parsed ``config.json`` dict.

    Args:
        cfg: The parsed JSON object.
        where: File label used in error messages.
        name: Model name to record.
        source: What :func:`load_model` accepts to load it again (preset name or path).
        mtp: Count the config's MTP modules (DeepSeek-V3 ``num_nextn_predict_layers``).
    """
    if not isinstance(cfg, dict):
        raise MeshplanError(f"{where}: expected a JSON object at the top level, got {type(cfg).__name__}")
    check_hf_config(cfg, where)  # types and bounds of the keys read below (planner.model.hf_config)
    model_type = cfg.get("model_type")
    if not model_type:
        archs = cfg.get("architectures")
        arch = archs[0] if isinstance(archs, list) and archs else None
        model_type = ARCHITECTURES.get(arch) if isinstance(arch, str) else None
        if model_type is None:
            said = f"its 'architectures' {archs!r} names none meshplan knows" if archs else "no 'architectures'"
            raise MeshplanError(f"{where}: no 'model_type' and {said}; supported model types: {', '.join(FAMILIES)}")
    if model_type in NOT_DECODERS:
        raise MeshplanError(f"{where}: model_type {model_type!r} is {NOT_DECODERS[model_type]}")
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        raise MeshplanError(f"{where}: unknown model_type {model_type!r}; supported: {', '.join(FAMILIES)}")
    fields = FAMILIES[model_type](_Reader(cfg, where, model_type))
    spec = ModelSpec(name=name, source=source, **fields)
    return spec.with_mtp(spec.config_mtp_layers) if mtp and spec.config_mtp_layers else spec


def read_config(path: Path) -> Any:
    """Parse a JSON file within ``core.bounds`` (depth, integer size, finite numbers); every failure is one
    ``MeshplanError`` line naming the file."""
    try:
        return load_json_file(path)
    except FileNotFoundError:
        raise MeshplanError(f"{path}: file not found") from None


# ---- presets -----------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _index() -> tuple[Mapping[str, Mapping[str, Any]], Mapping[str, str]]:
    """(presets by canonical name, lower-cased name/alias -> canonical name) from ``index.yaml``, read-only (cached)."""
    data = load_packaged(PRESET_INDEX.read_text(encoding="utf-8"))["presets"]
    lookup: dict[str, str] = {}
    for name, entry in data.items():
        for key in [name, *entry.get("aliases", [])]:
            if lookup.setdefault(key.lower(), name) != name:
                raise MeshplanError(f"{PRESET_INDEX}: alias {key!r} names two presets")
    return freeze(data), MappingProxyType(lookup)


def preset_names() -> list[str]:
    return sorted(_index()[0])


def _resolve_preset(name: str) -> str | None:
    return _index()[1].get(name.strip().lower())


@functools.lru_cache(maxsize=None)
def _load_preset(canonical: str, mtp: bool) -> ModelSpec:
    path = PRESET_DIR / f"{canonical}.json"
    return spec_from_config(read_config(path), where=str(path), name=canonical, source=canonical, mtp=mtp)


def load_model(name_or_path: str, *, mtp: bool = False) -> ModelSpec:
    """A model from a preset name/alias (see ``meshplan models``) or a path to a HF ``config.json``.

    Args:
        name_or_path: Preset name, alias or HF id of a preset, a ``config.json`` path, or a folder holding one.
        mtp: Count DeepSeek-V3's multi-token-prediction modules (off by default: training plans use the
            671B main model).

    Raises:
        MeshplanError: file not found, malformed JSON, unknown ``model_type``, missing or invalid field.
    """
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise MeshplanError(f"model {name_or_path!r}: give a preset name or a config.json path")
    path = Path(name_or_path).expanduser()
    file = path / "config.json" if path.is_dir() else path
    if file.is_file():
        cfg = read_config(file)
        stem = file.parent.name if file.name == "config.json" and file.parent.name else file.stem
        name = cfg.get("_name_or_path") if isinstance(cfg, dict) else None
        return spec_from_config(cfg, where=str(file), name=name if isinstance(name, str) and name else stem,
                                source=str(name_or_path), mtp=mtp)
    canonical = _resolve_preset(name_or_path)
    if canonical is not None:
        return _load_preset(canonical, mtp)
    if path.is_dir():
        raise MeshplanError(f"{file}: file not found (the folder has no config.json)")
    if path.suffix == ".json" or "/" in name_or_path or "\\" in name_or_path:
        raise MeshplanError(f"{name_or_path}: file not found (and not a preset name; see `meshplan models`)")
    close = difflib.get_close_matches(name_or_path.strip().lower(), list(_index()[1]), n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise MeshplanError(f"{name_or_path}: unknown model; not a preset or alias ({hint}see `meshplan models`) "
                        f"and no such file")


def list_presets() -> list[dict[str, Any]]:
    """Bundled presets: ``name``, ``model_type``, ``num_params``, ``active_params``, ``source`` (upstream
    checkpoint or paper), ``aliases``; sorted by type, then size."""
    entries, _ = _index()
    out = []
    for name in entries:
        spec = _load_preset(name, False)
        out.append(dict(name=name, model_type=spec.model_type, num_params=spec.num_params,
                        active_params=spec.active_params, source=entries[name].get("source", ""),
                        aliases=list(entries[name].get("aliases", []))))
    return sorted(out, key=lambda p: (p["model_type"], p["num_params"], p["name"]))
