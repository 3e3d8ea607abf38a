"""Parameter-efficient fine-tuning as a property of the training job: LoRA adapters over a frozen base model.

``lora`` is written ``RANK`` or ``RANK:MODULE+MODULE`` (``16:qkv``); "" trains every weight. The modules are
Megatron-Core's linear layers of a transformer layer (Megatron-Bridge ``peft/lora.py`` ``LoRA.target_modules``:
``linear_qkv``, ``linear_proj``, ``linear_fc1``, ``linear_fc2``, all four by default; its ``llama3_70b_peft_config``
uses rank 16, and the performance scripts' LoRA runs set ``target_modules = ['linear_qkv']``). What it changes
(``planner.estimate``): the base weights get no gradient and no optimizer state, their backward GEMMs compute the
input gradient only (no weight gradient), and gradients are reduced and the optimizer steps over the adapters only.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from meshplan.core.errors import MeshplanError

LORA_MODULES = ("qkv", "proj", "fc1", "fc2")
LORA_PATTERN = r"^$|^[1-9][0-9]{0,4}(:(qkv|proj|fc1|fc2)(\+(qkv|proj|fc1|fc2))*)?$"


@dataclass(frozen=True)
class Lora:
    """LoRA adapters of rank ``rank`` on the linear layers ``modules`` of every decoder layer."""

    rank: int
    modules: tuple[str, ...] = LORA_MODULES


def parse_lora(text: str) -> Lora | None:
    """``16`` / ``16:qkv`` / ``32:qkv+fc1`` -> ``Lora``; "" -> None (full training).

    Raises:
        MeshplanError: another form, naming the text and what it expects.
    """
    text = (text or "").strip()
    if not text:
        return None
    if not re.fullmatch(LORA_PATTERN, text):
        raise MeshplanError(f"--lora {text}: expected RANK or RANK:MODULES, e.g. 16 or 16:qkv (modules "
                            f"{', '.join(LORA_MODULES)} joined by +)")
    rank, _, mods = text.partition(":")
    return Lora(int(rank), tuple(dict.fromkeys(mods.split("+"))) if mods else LORA_MODULES)


def adapter_params_per_layer(model, lora: Lora, layer: int, tp: int) -> float:
    """Adapter parameters one tensor-parallel rank holds for decoder layer ``layer``: rank x (in + out) per adapted
    linear layer (A: in -> rank, B: rank -> out), split over tp. Mamba and Gated DeltaNet mixers and routed experts
    carry none (the targets are the attention and dense-MLP linears)."""
    kind = model.layer_kind(layer)
    h, r = model.hidden_size, lora.rank
    q, kv = model.num_heads * model.head_dim, model.num_kv_heads * (model.head_dim + model.v_head_dim)
    attn_out = model.num_heads * model.v_head_dim
    ffn = model.ffn_hidden_size
    shapes = {}
    if "*" in kind or "S" in kind:
        shapes.update(qkv=(h, q + kv), proj=(attn_out, h))
    if "-" in kind and ffn:
        shapes.update(fc1=(h, ffn * (2 if model.gated_mlp else 1)), fc2=(ffn, h))
    return sum(r * sum(shapes[m]) for m in lora.modules if m in shapes) / tp
