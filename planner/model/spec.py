"""``ModelSpec``: one normalised description of a decoder-only transformer, with exact parameter counts.

Every supported Hugging Face family (Llama, Mistral, Mixtral, Qwen2/2.5, Qwen2-MoE, Qwen3, Qwen3-MoE,
DeepSeek-V3, GPT-2, GPT-NeoX, Nemotron-4, Nemotron-H / Nemotron 3, GPT-OSS, GLM-4.5, Gemma 2, Gemma 3) maps onto
these fields; :func:`load_model` builds one from a preset name or a
``config.json`` (the parsing lives in :mod:`planner.model.config`).

Counting rules follow ``shared/notes/models.md`` §3 and each family's ``modeling_*.py`` in transformers:
embedding and LM head are counted once each unless tied; biases and norms are counted where the modelling
code creates them (e.g. Qwen2's hard-coded q/k/v bias, Qwen3's per-head q/k RMSNorm, DeepSeek-V3's
``e_score_correction_bias``). All counts are numbers of scalar parameters (not bytes).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from meshplan.core.errors import MeshplanError
from meshplan.planner.model.flops import megatron_flops_per_token

NORMS = ("layernorm", "rmsnorm")
# The blocks a layer is made of (Megatron's hybrid_override_pattern symbols, plus S for sliding-window attention and
# G for Gated DeltaNet): a hybrid layer is one block, a transformer layer two ("*-", "*E", "S-", "SE", "GE").
LAYER_KINDS = ("M", "*", "S", "G", "-", "E")


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer, normalised across Hugging Face families.

    Widths are in elements (not bytes). ``head_dim`` is the query/key head width (for MLA
    ``qk_nope_head_dim + qk_rope_head_dim``); ``v_head_dim`` the value head width (equal to ``head_dim`` for
    every non-MLA family). ``ffn_hidden_size`` is the dense MLP width, 0 when no layer is dense.
    ``shared_expert_ffn_hidden_size`` is the total width of all shared experts of one MoE layer (Megatron's
    ``moe_shared_expert_intermediate_size``; DeepSeek-V3: ``n_shared_experts * moe_intermediate_size``).
    """

    name: str
    source: str
    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    tied_embeddings: bool
    gated_mlp: bool
    norm: str
    num_experts: int = 0
    experts_per_token: int = 0
    moe_ffn_hidden_size: int = 0
    num_shared_experts: int = 0
    shared_expert_ffn_hidden_size: int = 0
    moe_layers: tuple[int, ...] = ()
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    position_embeddings: int = 0
    max_position_embeddings: int = 0
    # Additive fields (not in the first published interface): biases, extra norms and MTP.
    qkv_bias: bool = False  # bias on the q/k/v (MLA: q_a/kv_a) projections
    o_bias: bool = False  # bias on the attention output projection
    mlp_bias: bool = False  # bias on the dense MLP projections
    qk_norm: bool = False  # Qwen3: RMSNorm of width head_dim on q and on k
    rotary_percent: float = 1.0
    """Fraction of each q/k head's width that RoPE rotates (HF ``partial_rotary_factor``, Megatron
    ``--rotary-percent``; GLM-4.5: 0.5). It moves no parameter; the RoPE pass stays priced over the whole head,
    a sliver of elementwise work either way, and the exports carry it."""
    shared_expert_gate: bool = False  # Qwen2-MoE: sigmoid gate Linear(h -> 1) on the shared expert
    router_bias: bool = False  # DeepSeek-V3: e_score_correction_bias, E parameters per MoE layer
    # Group-limited routing (DeepSeek-V3 §2.1.2 "node-limited routing", HF ``n_group`` / ``topk_group``): the experts
    # form ``routing_groups`` contiguous groups and a token's experts come from ``routing_groups_per_token`` of
    # them (0 = no limit). DeepSeek-V3: 8 and 4, so a token reaches at most 4 of 8 nodes at EP64.
    routing_groups: int = 1
    routing_groups_per_token: int = 0
    num_mtp_layers: int = 0  # DeepSeek-V3 multi-token-prediction modules counted (0 = MTP off)
    config_mtp_layers: int = 0  # MTP modules the config describes (``num_nextn_predict_layers``)
    # Hybrid stacks (Megatron's ``hybrid_override_pattern``): one character per layer, each layer one block,
    # M = Mamba-2, * = attention, - = dense MLP, E = MoE. Empty: every layer is attention + MLP (or MoE).
    layer_pattern: str = ""
    mtp_pattern: str = ""  # the blocks of one MTP module of a hybrid (Nemotron 3 Super: "*E")
    mamba_heads: int = 0  # Mamba-2 heads H; d_inner = H * mamba_head_dim (megatron-core MambaMixer)
    mamba_head_dim: int = 0  # P
    mamba_state: int = 0  # N, the SSM state size
    mamba_groups: int = 0  # G: B and C are shared by the heads of a group
    mamba_conv_kernel: int = 0  # width of the depthwise causal conv1d over x, B, C
    mamba_chunk: int = 0  # SSD chunk length Q (megatron-core MambaMixer chunk_size 128)
    moe_latent_size: int = 0  # LatentMoE: routed experts run in this width, between two h <-> latent projections
    sliding_window: int = 0  # keys a sliding-window layer attends to (GPT-OSS: 128); 0 = none
    window_layers: tuple[int, ...] = ()  # the layers that use the window (GPT-OSS: every other layer)
    attention_sinks: bool = False  # GPT-OSS: one learned sink logit per head in the softmax
    expert_bias: bool = False  # GPT-OSS: biases on every expert's projections and on the router
    glu_clamp: float = 0.0  # GPT-OSS ``swiglu_limit``: the gated activation's inputs clamped to this; 0 = none
    post_norms: bool = False
    """Gemma 2 / 3: a second norm on each block's output before the residual add (HF ``post_attention_layernorm``
    and ``post_feedforward_layernorm``; Megatron-Bridge's ``TERowParallelLinearLayerNorm``), beside the pre-norms."""
    attn_softcap: float = 0.0
    """Gemma 2 ``attn_logit_softcapping``: attention scores become ``cap * tanh(scores / cap)`` before the softmax;
    0 = none. cuDNN's fused attention and PyTorch SDPA have no such step (``layout.space.attention_choices``)."""
    logit_softcap: float = 0.0
    """Gemma 2 ``final_logit_softcapping``: the output logits become ``cap * tanh(logits / cap)``; 0 = none."""
    attn_output_gate: bool = False
    """Qwen3-Next: q_proj also yields a gate of the query heads' width, and the attention's output is multiplied by
    its sigmoid before o_proj (transformers ``Qwen3NextAttention``; Megatron-Core ``attention_output_gate``)."""
    gdn_layers: tuple[int, ...] = ()
    """The layers whose mixer is Gated DeltaNet (Yang, Kautz & Hatamizadeh, ICLR 2025, arXiv:2412.06464) instead of
    attention: HF ``layer_types`` ``linear_attention`` (Qwen3-Next: three layers in four)."""
    gdn_key_heads: int = 0  # HF linear_num_key_heads: heads of q and k (repeated to the value heads in the scan)
    gdn_value_heads: int = 0  # HF linear_num_value_heads: heads of v, of the gate z and of the scan
    gdn_key_head_dim: int = 0  # HF linear_key_head_dim
    gdn_value_head_dim: int = 0  # HF linear_value_head_dim
    gdn_conv_kernel: int = 0  # HF linear_conv_kernel_dim: the depthwise causal conv1d over q, k and v
    rope_theta: float = 0.0
    rope_scaling_type: str = ""  # config.json rope_scaling.rope_type: "llama3" (Llama 3.1), "yarn" (DeepSeek-V3), ...
    rope_scaling_factor: float = 0.0  # its factor; 0 = RoPE unscaled
    dtype: str = ""

    def __post_init__(self) -> None:
        positive = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "v_head_dim",
                    "vocab_size")
        for field in positive:
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise MeshplanError(f"model {self.name}: {field} must be a positive integer, got {value!r}")
        if self.norm not in NORMS:
            raise MeshplanError(f"model {self.name}: norm must be one of {NORMS}, got {self.norm!r}")
        if self.num_heads % self.num_kv_heads:
            raise MeshplanError(f"model {self.name}: num_heads {self.num_heads} is not a multiple of "
                                f"num_kv_heads {self.num_kv_heads}")
        if any(not 0 <= i < self.num_layers for i in self.moe_layers):
            raise MeshplanError(f"model {self.name}: moe_layers {list(self.moe_layers)} outside "
                                f"0..{self.num_layers - 1}")
        if self.moe_layers:
            if self.num_experts <= 0 or self.moe_ffn_hidden_size <= 0:
                raise MeshplanError(f"model {self.name}: MoE layers need num_experts > 0 and "
                                    f"moe_ffn_hidden_size > 0, got {self.num_experts} and {self.moe_ffn_hidden_size}")
            if not 0 < self.experts_per_token <= self.num_experts:
                raise MeshplanError(f"model {self.name}: experts_per_token {self.experts_per_token} must be in "
                                    f"1..num_experts ({self.num_experts})")
        if len(self.moe_layers) < self.num_layers and self.ffn_hidden_size <= 0:
            raise MeshplanError(f"model {self.name}: dense layers need ffn_hidden_size > 0, "
                                f"got {self.ffn_hidden_size}")
        if self.is_mla and not 0 < self.qk_rope_head_dim < self.head_dim:
            raise MeshplanError(f"model {self.name}: MLA needs 0 < qk_rope_head_dim < head_dim, "
                                f"got {self.qk_rope_head_dim} and {self.head_dim}")
        self._check_hybrid()
        if self.num_mtp_layers < 0 or self.num_mtp_layers > max(self.config_mtp_layers, 0) * self._mtp_repeat:
            raise MeshplanError(f"model {self.name}: num_mtp_layers {self.num_mtp_layers} must be in "
                                f"0..{self.config_mtp_layers} (the config's num_nextn_predict_layers)")

    # Megatron-Bridge applies one hybrid MTP module repeatedly (``mtp_use_repeated_layer``; Nemotron 3 Super runs
    # ``mtp_num_layers = 2`` over one module, shared/published_runs/configs/PROVENANCE.md): depth up to this many
    # times the modules the config describes, parameters counted once.
    MTP_REPEAT_MAX = 4

    @property
    def _mtp_repeat(self) -> int:
        return self.MTP_REPEAT_MAX if self.mtp_pattern else 1

    def _check_hybrid(self) -> None:
        if self.layer_pattern:
            if len(self.layer_pattern) != self.num_layers or set(self.layer_pattern) - set(LAYER_KINDS):
                raise MeshplanError(f"model {self.name}: layer pattern {self.layer_pattern!r} must have one of "
                                    f"{''.join(LAYER_KINDS)} per layer ({self.num_layers} layers)")
            if "M" in self.layer_pattern:
                dims = ("mamba_heads", "mamba_head_dim", "mamba_state", "mamba_groups", "mamba_conv_kernel",
                        "mamba_chunk")
                bad = [d for d in dims if getattr(self, d) <= 0]
                if bad:
                    raise MeshplanError(f"model {self.name}: Mamba layers need {', '.join(bad)} > 0")
                if self.mamba_heads % self.mamba_groups:
                    raise MeshplanError(f"model {self.name}: mamba heads {self.mamba_heads} are not a multiple of "
                                        f"its groups {self.mamba_groups}")
        if any(not 0 <= i < self.num_layers for i in self.window_layers):
            raise MeshplanError(f"model {self.name}: window_layers outside 0..{self.num_layers - 1}")
        self._check_gdn()

    def _check_gdn(self) -> None:
        if not self.gdn_layers:
            return
        if any(not 0 <= i < self.num_layers for i in self.gdn_layers):
            raise MeshplanError(f"model {self.name}: Gated DeltaNet layers outside 0..{self.num_layers - 1}")
        dims = ("gdn_key_heads", "gdn_value_heads", "gdn_key_head_dim", "gdn_value_head_dim", "gdn_conv_kernel")
        bad = [d for d in dims if getattr(self, d) <= 0]
        if bad:
            raise MeshplanError(f"model {self.name}: Gated DeltaNet layers need {', '.join(bad)} > 0")
        if self.gdn_value_heads % self.gdn_key_heads:
            raise MeshplanError(f"model {self.name}: Gated DeltaNet value heads {self.gdn_value_heads} are not a "
                                f"multiple of its key heads {self.gdn_key_heads}")

    # ---- shape helpers -------------------------------------------------------------------------------------
    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2/V3): KV compressed to ``kv_lora_rank``."""
        return self.kv_lora_rank > 0

    @property
    def is_moe(self) -> bool:
        return bool(self.moe_layers)

    @property
    def q_dim(self) -> int:
        """Width of all query heads together, ``num_heads * head_dim`` (elements)."""
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of all key heads together, ``num_kv_heads * head_dim`` (elements). For MLA, K is per head."""
        return self.num_kv_heads * self.head_dim

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices per MLP: 3 for gated (SwiGLU: gate, up, down), 2 otherwise."""
        return 3 if self.gated_mlp else 2

    @property
    def norm_params(self) -> int:
        """Parameters of one norm over ``hidden_size``: RMSNorm has a scale only, LayerNorm scale + bias."""
        return self.hidden_size * (2 if self.norm == "layernorm" else 1)

    def _check_layer(self, i: int) -> None:
        if not 0 <= i < self.num_layers:
            raise IndexError(f"layer {i} outside 0..{self.num_layers - 1} of {self.name}")

    @property
    def is_hybrid(self) -> bool:
        return bool(self.layer_pattern)

    @property
    def mamba_inner(self) -> int:
        """d_inner = heads x head dim (megatron-core ``MambaMixer``: ``self.d_inner = self.nheads * self.headdim``)."""
        return self.mamba_heads * self.mamba_head_dim

    def mamba_split_problem(self, tp: int, cp: int) -> str:
        """Why megatron-core cannot split this model's Mamba mixers over ``tp`` x ``cp`` ranks ("" when it can):
        ``MambaMixer`` asserts that tp divides the heads and the groups; ``MambaContextParallel`` (all-to-all CP,
        heads split over the CP group) that cp divides the heads per tp rank, and the groups per tp rank or
        the other way round (groups are then repeated)."""
        if not self.is_hybrid or "M" not in self.layer_pattern:
            return ""
        heads, groups = self.mamba_heads, self.mamba_groups
        if heads % tp or groups % tp:
            return f"tp={tp} must divide the {heads} Mamba heads and {groups} Mamba groups (megatron-core MambaMixer)"
        if cp > 1 and ((heads // tp) % cp or ((groups // tp) % cp and cp % (groups // tp))):
            return (f"cp={cp} must divide the {heads // tp} Mamba heads per tp rank, and divide or be a multiple of "
                    f"its {groups // tp} groups (megatron-core MambaContextParallel)")
        return ""

    def gdn_split_problem(self, tp: int, cp: int) -> str:
        """Why megatron-core cannot split this model's Gated DeltaNet mixers over ``tp`` x ``cp`` ranks ("" when it
        can): ``GatedDeltaNet`` splits its key and value heads over tp (core_v0.16.0 ``ssm/gated_delta_net.py``:
        ``num_value_heads // tp_size``, the q and k widths likewise) and has no context parallelism (its
        ``GatedDeltaNetContextParallel`` import is commented out; Megatron-Bridge's Qwen3-Next recipes set cp 1)."""
        if not self.gdn_layers:
            return ""
        keys, values = self.gdn_key_heads, self.gdn_value_heads
        if keys % tp or values % tp:
            return (f"tp={tp} must divide the {keys} Gated DeltaNet key heads and {values} value heads "
                    "(megatron-core GatedDeltaNet)")
        if cp > 1:
            return f"cp={cp}: megatron-core's GatedDeltaNet has no context parallelism (core_v0.16.0)"
        return ""

    def split_problem(self, tp: int, cp: int) -> str:
        """Why megatron-core cannot split this model's mixers over ``tp`` x ``cp`` ranks ("" when it can): its Mamba-2
        mixers' (``mamba_split_problem``) or its Gated DeltaNet mixers' (``gdn_split_problem``)."""
        return self.mamba_split_problem(tp, cp) or self.gdn_split_problem(tp, cp)

    def is_window_layer(self, i: int) -> bool:
        return bool(self.sliding_window) and i in self.window_layers

    def layer_kind(self, i: int) -> str:
        """The blocks of layer ``i`` in order (``LAYER_KINDS``): a hybrid's pattern character, else attention
        (``*``, or ``S`` with a sliding window) then MLP (``-``) or MoE (``E``)."""
        self._check_layer(i)
        if self.layer_pattern:
            return self.layer_pattern[i]
        mixer = "G" if i in self.gdn_layers else "S" if self.is_window_layer(i) else "*"
        return mixer + ("E" if i in self.moe_layers else "-")

    def is_moe_layer(self, i: int) -> bool:
        """True when decoder layer ``i`` (0-based) has a routed-expert MLP."""
        self._check_layer(i)
        return i in self.moe_layers

    # ---- parameter counts ----------------------------------------------------------------------------------
    @property
    def embedding_params(self) -> int:
        """Input token embedding ``V*h`` plus learned position embedding (GPT-2: ``n_positions*h``)."""
        return (self.vocab_size + self.position_embeddings) * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """Output projection ``V*h``; 0 when tied to the input embedding."""
        return 0 if self.tied_embeddings else self.vocab_size * self.hidden_size

    @property
    def final_norm_params(self) -> int:
        return self.norm_params

    def _attention_params(self) -> int:
        h, a = self.hidden_size, self.num_heads
        if self.is_mla:
            # DeepSeek-V3 MLA (modeling_deepseek_v3.py): q_a_proj, q_a_layernorm, q_b_proj (or q_proj without
            # q-LoRA), kv_a_proj_with_mqa (kv_rank + rope), kv_a_layernorm, kv_b_proj, o_proj.
            nope = self.head_dim - self.qk_rope_head_dim
            if self.q_lora_rank:
                q = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * a * self.head_dim
                q += self.q_lora_rank if self.qkv_bias else 0
            else:
                q = h * a * self.head_dim
            kv_a = self.kv_lora_rank + self.qk_rope_head_dim
            kv = h * kv_a + self.kv_lora_rank + self.kv_lora_rank * a * (nope + self.v_head_dim)
            kv += kv_a if self.qkv_bias else 0
            o = a * self.v_head_dim * h + (h if self.o_bias else 0)
            return q + kv + o
        d_q, d_k, d_v = self.q_dim, self.kv_dim, self.num_kv_heads * self.v_head_dim
        params = h * (d_q + d_k + d_v) + a * self.v_head_dim * h
        if self.attn_output_gate:  # q_proj's second half: the output gate, one per query element
            params += h * d_q
        if self.qkv_bias:
            params += d_q + d_k + d_v
        if self.o_bias:
            params += h
        if self.qk_norm:
            params += 2 * self.head_dim
        if self.attention_sinks:  # GPT-OSS: one sink logit per head (modeling_gpt_oss.py ``self.sinks``)
            params += a
        return params

    def _mamba_params(self) -> int:
        """One Mamba-2 mixer (megatron-core ``MambaMixer``; transformers ``NemotronHMamba2Mixer``): in_proj
        h -> (z, x, B, C, dt) = 2 d_inner + 2 G N + H, the depthwise conv1d over x, B, C (weight and bias), dt_bias,
        A_log and D per head, the gated RMSNorm over d_inner, out_proj d_inner -> h; no linear biases."""
        h, di = self.hidden_size, self.mamba_inner
        conv = di + 2 * self.mamba_groups * self.mamba_state
        in_proj = h * (2 * di + 2 * self.mamba_groups * self.mamba_state + self.mamba_heads)
        return in_proj + conv * (self.mamba_conv_kernel + 1) + 3 * self.mamba_heads + di + di * h

    @property
    def gdn_key_dim(self) -> int:
        """Width of q (and of k) in a Gated DeltaNet mixer: key heads x key head dim."""
        return self.gdn_key_heads * self.gdn_key_head_dim

    @property
    def gdn_value_dim(self) -> int:
        """Width of v (and of the gate z) in a Gated DeltaNet mixer: value heads x value head dim."""
        return self.gdn_value_heads * self.gdn_value_head_dim

    def _gdn_params(self) -> int:
        """One Gated DeltaNet mixer (transformers ``Qwen3NextGatedDeltaNet``; megatron-core ``GatedDeltaNet``):
        in_proj h -> (q, k, v, z) and h -> (b, a) per value head, the depthwise conv1d over q, k, v (no bias), dt_bias
        and A_log per value head, the gated RMSNorm over one value head's width, out_proj v -> h; no linear biases."""
        h, kd, vd, hv = self.hidden_size, self.gdn_key_dim, self.gdn_value_dim, self.gdn_value_heads
        in_proj = h * (2 * kd + 2 * vd) + h * 2 * hv
        conv = (2 * kd + vd) * self.gdn_conv_kernel
        return in_proj + conv + 2 * hv + self.gdn_value_head_dim + vd * h

    def _dense_mlp_params(self, width: int) -> int:
        params = self.mlp_matrices * self.hidden_size * width
        if self.mlp_bias:  # gated: gate + up biases (2f) + down (h); plain: up (f) + down (h)
            params += (self.mlp_matrices - 1) * width + self.hidden_size
        return params

    def _expert_params(self) -> int:
        """One routed expert: an MLP of width ``moe_ffn_hidden_size`` over the hidden size, or over the latent width
        of a LatentMoE (megatron-core ``MLP``: ``use_latent_size`` for routed experts); GPT-OSS adds its gate/up
        and down biases."""
        width = self.moe_latent_size or self.hidden_size
        params = self.mlp_matrices * width * self.moe_ffn_hidden_size
        if self.expert_bias:
            params += (self.mlp_matrices - 1) * self.moe_ffn_hidden_size + width
        return params

    def _router_and_shared_params(self) -> int:
        params = self.hidden_size * self.num_experts  # router Linear(h -> E)
        if self.router_bias or self.expert_bias:  # e_score_correction_bias, or GPT-OSS's router Linear bias
            params += self.num_experts
        if self.moe_latent_size:  # megatron-core MoELayer fc1_latent_proj / fc2_latent_proj, no bias
            params += 2 * self.hidden_size * self.moe_latent_size
        if self.shared_expert_ffn_hidden_size:
            params += self.mlp_matrices * self.hidden_size * self.shared_expert_ffn_hidden_size
        if self.shared_expert_gate:
            params += self.hidden_size
        return params

    def layer_attention_params(self, i: int) -> int:
        """The mixer of layer ``i``: attention incl. its biases, q/k norms, sinks and output gate, a Mamba-2 or a
        Gated DeltaNet mixer (not the pre-norm); 0 for a hybrid's MLP-only layers."""
        kind = self.layer_kind(i)
        if "M" in kind:
            return self._mamba_params()
        if "G" in kind:
            return self._gdn_params()
        return self._attention_params() if ("*" in kind or "S" in kind) else 0

    def layer_mlp_params(self, i: int) -> int:
        """Dense MLP, or for MoE layers router + shared experts + all routed experts (no pre-MLP norm); 0 for a
        hybrid's Mamba and attention layers."""
        kind = self.layer_kind(i)
        if "E" in kind:
            return self._router_and_shared_params() + self.num_experts * self._expert_params()
        return self._dense_mlp_params(self.ffn_hidden_size) if "-" in kind else 0

    def layer_routed_expert_params(self, i: int) -> int:
        """Routed experts of layer ``i`` only (0 for dense layers): the part expert parallelism shards."""
        self._check_layer(i)
        return self.num_experts * self._expert_params() if self.is_moe_layer(i) else 0

    def layer_norm_params(self, i: int) -> int:
        """The per-layer norms: one pre-norm per block (two in a transformer layer, one in a hybrid's), and with
        ``post_norms`` one more on each block's output."""
        return len(self.layer_kind(i)) * self.norm_params * (2 if self.post_norms else 1)

    def layer_params(self, i: int) -> int:
        """All parameters of decoder layer ``i`` (every expert counted)."""
        return self.layer_attention_params(i) + self.layer_mlp_params(i) + self.layer_norm_params(i)

    def layer_active_params(self, i: int) -> int:
        """Parameters one token touches in layer ``i``: MoE layers count ``experts_per_token`` experts."""
        if not self.is_moe_layer(i):
            return self.layer_params(i)
        inactive = (self.num_experts - self.experts_per_token) * self._expert_params()
        if self.router_bias:
            # DeepSeek-V3 §2.1.2: e_score_correction_bias only steers top-k selection (it does not enter the
            # gating value) and is updated by a fixed-step rule, not by backprop, so it is not "activated".
            inactive += self.num_experts
        return self.layer_params(i) - inactive

    def _mtp_module_params(self, active: bool) -> int:
        """One MTP module (DeepSeek-V3 §2.2): enorm + hnorm + eh_proj (2h -> h) + its blocks + final norm; the
        embedding and output head are shared with the main model. Its blocks: one decoder layer like the last, or
        a hybrid's ``mtp_pattern`` (Nemotron 3 Super: attention then MoE, one norm each)."""
        base = 3 * self.norm_params + 2 * self.hidden_size * self.hidden_size
        if self.mtp_pattern:
            spec = dataclasses.replace(self, num_layers=len(self.mtp_pattern), layer_pattern=self.mtp_pattern,
                                       moe_layers=tuple(i for i, c in enumerate(self.mtp_pattern) if c == "E"),
                                       mtp_pattern="", num_mtp_layers=0, config_mtp_layers=0)
            layers = range(spec.num_layers)
            return base + sum(spec.layer_active_params(i) if active else spec.layer_params(i) for i in layers)
        last = self.num_layers - 1
        return base + (self.layer_active_params(last) if active else self.layer_params(last))

    @property
    def mtp_modules(self) -> int:
        """MTP modules holding parameters: a repeated hybrid module is one module applied ``num_mtp_layers``
        times."""
        return min(self.num_mtp_layers, self.config_mtp_layers) if self.mtp_pattern else self.num_mtp_layers

    @property
    def mtp_params(self) -> int:
        """Counted MTP modules' parameters (0 with MTP off)."""
        return self.mtp_modules * self._mtp_module_params(False) if self.num_mtp_layers else 0

    @property
    def mtp_routed_expert_params(self) -> int:
        """The routed experts among ``mtp_params`` (the part expert parallelism shards)."""
        if not self.num_mtp_layers:
            return 0
        kinds = self.mtp_pattern or self.layer_kind(self.num_layers - 1)
        return self.mtp_modules * kinds.count("E") * self.num_experts * self._expert_params()

    @property
    def mtp_active_params(self) -> int:
        return self.mtp_modules * self._mtp_module_params(True) if self.num_mtp_layers else 0

    @property
    def num_params(self) -> int:
        """Exact total parameter count (embedding and LM head once each unless tied; MTP only if counted)."""
        layers = sum(self.layer_params(i) for i in range(self.num_layers))
        return (self.embedding_params + layers + self.final_norm_params + self.lm_head_params
                + self.mtp_params)

    @property
    def active_params(self) -> int:
        """Parameters used per token (MoE: ``experts_per_token`` routed experts); ``num_params`` if dense."""
        layers = sum(self.layer_active_params(i) for i in range(self.num_layers))
        return (self.embedding_params + layers + self.final_norm_params + self.lm_head_params
                + self.mtp_active_params)

    @property
    def non_embedding_params(self) -> int:
        """``num_params`` minus the input (token + position) embedding; an untied LM head stays in."""
        return self.num_params - self.embedding_params

    # ---- FLOPs -----------------------------------------------------------------------------------------------
    def model_flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token (forward + backward, causal attention, no recompute), Megatron-LM counter.

        See :func:`planner.model.flops.megatron_flops_per_token` (models.md §4.4).

        Args:
            seq_len: Training sequence length, tokens.

        Returns:
            FLOPs per token.
        """
        return megatron_flops_per_token(self, seq_len)

    # ---- output --------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Normalised spec as plain JSON-able values, with the derived counts."""
        out = dataclasses.asdict(self)
        out["moe_layers"] = list(self.moe_layers)
        out.update(
            num_params=self.num_params,
            active_params=self.active_params,
            embedding_params=self.embedding_params,
            lm_head_params=self.lm_head_params,
            non_embedding_params=self.non_embedding_params,
            is_moe=self.is_moe,
            is_mla=self.is_mla,
        )
        return out

    def with_mtp(self, num_mtp_layers: int) -> "ModelSpec":
        """Copy with ``num_mtp_layers`` MTP modules counted (0 switches MTP off)."""
        return dataclasses.replace(self, num_mtp_layers=num_mtp_layers)
