"""The fields of a HuggingFace ``config.json`` that meshplan reads, typed at the edge (pydantic) with the bounds of
real models, before ``planner.model.config`` builds a ``ModelSpec`` from them. Other keys pass through untouched
(a config holds many meshplan never reads). A wrong type or an impossible size is one line naming the file and
the field, e.g. ``config.json: hidden_size: must be at most 1048576, got 5000000000``."""
from __future__ import annotations

import math
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr, ValidationError, field_validator

from meshplan.core.errors import MeshplanError

# Largest sizes of any published model, with room: hidden 2^20 (Llama 3.1 405B: 16,384), 2^16 layers and heads,
# vocabularies of 2^24 tokens (Gemma: 262,144), 2^16 experts (DeepSeek-V3: 256), contexts of 2^30 tokens.
_DIM = dict(ge=1, le=2**20)
_COUNT = dict(ge=1, le=2**16)


class HFConfig(BaseModel):
    """The keys of ``config.json`` meshplan reads; everything else passes through."""

    model_config = ConfigDict(extra="allow", frozen=True)

    model_type: Optional[StrictStr] = Field(None, max_length=128)
    architectures: Optional[list[StrictStr]] = Field(None, max_length=64)
    hidden_size: Optional[StrictInt] = Field(None, **_DIM)
    intermediate_size: Optional[StrictInt] = Field(None, ge=0, le=2**24)
    num_hidden_layers: Optional[StrictInt] = Field(None, **_COUNT)
    num_attention_heads: Optional[StrictInt] = Field(None, **_COUNT)
    num_key_value_heads: Optional[StrictInt] = Field(None, **_COUNT)
    head_dim: Optional[StrictInt] = Field(None, ge=0, le=2**16)
    vocab_size: Optional[StrictInt] = Field(None, ge=1, le=2**24)
    max_position_embeddings: Optional[StrictInt] = Field(None, ge=0, le=2**30)
    num_local_experts: Optional[StrictInt] = Field(None, ge=0, le=2**16)
    n_routed_experts: Optional[StrictInt] = Field(None, ge=0, le=2**16)
    num_experts: Optional[StrictInt] = Field(None, ge=0, le=2**16)
    num_experts_per_tok: Optional[StrictInt] = Field(None, ge=0, le=2**16)
    moe_intermediate_size: Optional[StrictInt] = Field(None, ge=0, le=2**24)
    rope_theta: Optional[StrictFloat | StrictInt] = None
    tie_word_embeddings: Optional[bool] = None
    # hybrid Mamba-2 stacks (nemotron_h) and sliding-window attention (gpt_oss)
    hybrid_override_pattern: Optional[StrictStr] = Field(None, max_length=2**16)
    mamba_num_heads: Optional[StrictInt] = Field(None, **_COUNT)
    mamba_head_dim: Optional[StrictInt] = Field(None, **_COUNT)
    ssm_state_size: Optional[StrictInt] = Field(None, **_COUNT)
    n_groups: Optional[StrictInt] = Field(None, **_COUNT)
    conv_kernel: Optional[StrictInt] = Field(None, **_COUNT)
    chunk_size: Optional[StrictInt] = Field(None, **_COUNT)
    moe_latent_size: Optional[StrictInt] = Field(None, ge=0, le=2**20)
    sliding_window: Optional[StrictInt] = Field(None, ge=0, le=2**30)

    @field_validator("rope_theta")
    @classmethod
    def _theta(cls, v):
        if v is not None and not (math.isfinite(v) and v > 0):
            raise ValueError(f"must be a positive finite number, got {v!r}")
        return v


def check_hf_config(cfg: dict, where: str) -> None:
    """Validate the keys meshplan reads.

    Raises:
        MeshplanError: one line naming ``where`` and the first bad field.
    """
    try:
        HFConfig.model_validate(cfg)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = str(err["loc"][0])
        value = err.get("input")
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        kind, ctx = err["type"], err.get("ctx") or {}
        if kind == "greater_than_equal":
            msg = f"must be an integer >= {ctx.get('ge')}"
        elif kind == "less_than_equal":
            msg = f"must be at most {ctx.get('le')} (no model is that large)"
        elif kind.startswith("bool"):
            msg = "must be true or false"
        elif kind.startswith("int") or kind.startswith("float"):
            msg = "must be a number" if key == "rope_theta" else "must be an integer"
        elif kind in ("string_type", "list_type"):
            msg = "must be a string" if kind == "string_type" else "must be a list of strings"
        else:
            msg = str(err["msg"]).removeprefix("Value error, ")
        raise MeshplanError(f"{where}: '{key}' {msg}, got {shown}") from None
