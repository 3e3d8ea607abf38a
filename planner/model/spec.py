"""``ModelSpec``: one normalised description of a decoder-only transformer, with exact parameter counts.

Every supported Hugging Face family (Llama, Mistral, Mixtral, Qwen2/2.5, Qwen2-MoE, Qwen3, Qwen3-MoE,
DeepSeek-V3, GPT-2, GPT-NeoX) maps onto these fields; :func:`load_model` builds one from a preset name or a
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
    shared_expert_gate: bool = False  # Qwen2-MoE: sigmoid gate Linear(h -> 1) on the shared expert
    router_bias: bool = False  # DeepSeek-V3: e_score_correction_bias, E parameters per MoE layer
    # Group-limited routing (DeepSeek-V3 §2.1.2 "node-limited routing", HF ``n_group`` / ``topk_group``): the experts
    # form ``routing_groups`` contiguous groups and a token's experts come from ``routing_groups_per_token`` of
    # them (0 = no limit). DeepSeek-V3: 8 and 4, so a token reaches at most 4 of 8 nodes at EP64.
    routing_groups: int = 1
    routing_groups_per_token: int = 0
    num_mtp_layers: int = 0  # DeepSeek-V3 multi-token-prediction modules counted (0 = MTP off)
    config_mtp_layers: int = 0  # MTP modules the config describes (``num_nextn_predict_layers``)
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
        if self.num_mtp_layers < 0 or self.num_mtp_layers > max(self.config_mtp_layers, 0):
            raise MeshplanError(f"model {self.name}: num_mtp_layers {self.num_mtp_layers} must be in "
                                f"0..{self.config_mtp_layers} (the config's num_nextn_predict_layers)")

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
        if self.qkv_bias:
            params += d_q + d_k + d_v
        if self.o_bias:
            params += h
        if self.qk_norm:
            params += 2 * self.head_dim
        return params

    def _dense_mlp_params(self, width: int) -> int:
        params = self.mlp_matrices * self.hidden_size * width
        if self.mlp_bias:  # gated: gate + up biases (2f) + down (h); plain: up (f) + down (h)
            params += (self.mlp_matrices - 1) * width + self.hidden_size
        return params

    def _expert_params(self) -> int:
        """One routed expert (gated MLP of width ``moe_ffn_hidden_size``, no biases in any supported family)."""
        return self.mlp_matrices * self.hidden_size * self.moe_ffn_hidden_size

    def _router_and_shared_params(self) -> int:
        params = self.hidden_size * self.num_experts  # router Linear(h -> E), no bias
        if self.router_bias:
            params += self.num_experts
        if self.shared_expert_ffn_hidden_size:
            params += self.mlp_matrices * self.hidden_size * self.shared_expert_ffn_hidden_size
        if self.shared_expert_gate:
            params += self.hidden_size
        return params

    def layer_attention_params(self, i: int) -> int:
        """Attention block of layer ``i`` incl. its biases and q/k norms (not the pre-attention norm)."""
        self._check_layer(i)
        return self._attention_params()

    def layer_mlp_params(self, i: int) -> int:
        """Dense MLP, or for MoE layers router + shared experts + all routed experts (no pre-MLP norm)."""
        self._check_layer(i)
        if self.is_moe_layer(i):
            return self._router_and_shared_params() + self.num_experts * self._expert_params()
        return self._dense_mlp_params(self.ffn_hidden_size)

    def layer_routed_expert_params(self, i: int) -> int:
        """Routed experts of layer ``i`` only (0 for dense layers): the part expert parallelism shards."""
        self._check_layer(i)
        return self.num_experts * self._expert_params() if self.is_moe_layer(i) else 0

    def layer_norm_params(self, i: int) -> int:
        """The two per-layer norms (pre-attention, pre-MLP)."""
        self._check_layer(i)
        return 2 * self.norm_params

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

    @property
    def mtp_params(self) -> int:
        """Counted MTP modules (DeepSeek-V3 §2.2): enorm + hnorm + eh_proj (2h -> h) + one decoder layer + final
        norm each; the embedding and output head are shared with the main model."""
        if not self.num_mtp_layers:
            return 0
        last = self.num_layers - 1
        per_module = 3 * self.norm_params + 2 * self.hidden_size * self.hidden_size + self.layer_params(last)
        return self.num_mtp_layers * per_module

    @property
    def mtp_active_params(self) -> int:
        if not self.num_mtp_layers:
            return 0
        last = self.num_layers - 1
        per_module = (3 * self.norm_params + 2 * self.hidden_size * self.hidden_size
                      + self.layer_active_params(last))
        return self.num_mtp_layers * per_module

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
