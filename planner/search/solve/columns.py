"""What the solvers choose between, per layer: the precision columns of a workload, the bytes a weight takes at each,
the device memory a plan may use, and the quality indicator of every (layer, precision) choice.

Precision semantics:

- ``train``: the base dtype (bf16, or fp16 where a device lacks bf16) or fp8 GEMMs (Transformer-Engine style,
  fp8 forward and backward GEMMs); model states stay 16 + 2 + 12 bytes/param (ZeRO paper §3.1).
- ``serve``: fp8 / int8 are W8A8 (GEMMs run in that dtype: SmoothQuant, Xiao et al. 2023); int4 is weight-only
  W4A16 (AWQ/GPTQ): weight bytes at 4 bits (+ one fp16 scale per 128 weights), math in fp16.
- ``qsync``: fp32 reference, fp16 or int8 GEMMs on the slower group (QSync, Zhao et al. 2023).
"""
from __future__ import annotations

import os
from typing import Optional, Sequence

from meshplan.core.errors import MeshplanError
from meshplan.costmodel.devices import DeviceSpec
from meshplan.planner.estimate.memory import RUNTIME_OVERHEAD_BYTES, USABLE_FRACTION
from meshplan.planner.search.solve.sensitivity import default_layer_indicators

MENU = {"train": ("bf16", "fp8"), "serve": ("bf16", "fp8", "int8", "int4"), "qsync": ("fp32", "fp16", "int8")}
KV_BYTES = 2  # fp16/bf16 KV cache
INT4_SCALE_BYTES_PER_WEIGHT = 2 / 128  # one fp16 scale per group of 128 weights (AWQ/GPTQ default group)


def usable_bytes(device: DeviceSpec) -> float:
    """Memory a plan may use on one device, bytes (``planner.estimate.memory`` headroom rules)."""
    return USABLE_FRACTION * device.memory_bytes - RUNTIME_OVERHEAD_BYTES


def base_dtype(devices: Sequence[DeviceSpec]) -> str:
    """bf16 where every device has it, else fp16 (T4, V100).

    Raises:
        MeshplanError: a device with neither (names it).
    """
    if all(d.supports("bf16") for d in devices):
        return "bf16"
    for d in devices:
        if not d.supports("fp16"):
            raise MeshplanError(f"device {d.name} supports neither bf16 nor fp16 (supports: "
                                f"{', '.join(sorted(d.peak_flops))}); it cannot run a 16-bit plan")
    return "fp16"


def precision_columns(devices: Sequence[DeviceSpec], workload: str,
                      precisions: Optional[Sequence[str]] = None) -> tuple[str, ...]:
    """Precision columns of a problem: the workload's menu, or the user's list checked strictly.

    The 16-bit reference column is named after :func:`base_dtype`. A precision the user asks for must be
    supported by every device; one that only some devices lack is left out of those devices' columns when it
    comes from the default menu.

    Raises:
        MeshplanError: a requested precision a device lacks (names the device) or an unknown precision.
    """
    if workload not in MENU:
        raise MeshplanError(f"workload '{workload}': expected one of {', '.join(MENU)}")
    base = base_dtype(devices) if workload != "qsync" else "fp32"
    if precisions is None:
        cols = [base] + [p for p in MENU[workload] if p not in ("bf16", "fp16", base)
                         and any(d.supports(p) for d in devices)]
        if workload == "qsync":
            cols = ["fp32"] + [p for p in ("fp16", "int8") if any(d.supports(p) for d in devices)]
        return tuple(cols)
    cols = []
    for p in precisions:
        p = p.lower()
        if p in ("bf16", "fp16") and workload != "qsync":
            p = base
        if p not in MENU[workload] and p != base:
            raise MeshplanError(f"precision '{p}': not available for --workload {workload} "
                                f"(choose from {', '.join(MENU[workload])})")
        for d in devices:
            if not d.supports(p):
                raise MeshplanError(f"precision {p}: device {d.name} does not support it "
                                    f"(supports: {', '.join(sorted(d.peak_flops))})")
        if p not in cols:
            cols.append(p)
    if base not in cols:
        cols.insert(0, base)
    return tuple(cols)


def weight_bytes(p: str) -> float:
    return {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0,
            "int4": 0.5 + INT4_SCALE_BYTES_PER_WEIGHT}[p]


def layer_matrices(model, i: int) -> list[tuple[str, int, int]]:
    """(type, fan_in, params) of layer i's weight matrices, for the default indicators."""
    h = model.hidden_size
    mlp = model.layer_mlp_params(i)
    ffn = model.moe_ffn_hidden_size if model.is_moe_layer(i) else model.ffn_hidden_size
    gate = 2 if model.gated_mlp else 1
    return [("attention", h, model.layer_attention_params(i)),
            ("mlp", h, mlp * gate // (gate + 1)), ("mlp", max(1, ffn), mlp // (gate + 1))]


def layer_sensitivity(model, precisions: Sequence[str], reference: str, operands: int) -> list[list[float]]:
    """Default indicators ``[layer][precision]`` (see ``planner.search.solve.sensitivity``)."""
    return [default_layer_indicators(layer_matrices(model, i), precisions, reference, operands)
            for i in range(model.num_layers)]


def resolve_sensitivity(sensitivity, model, cols, base: str, operands: int):
    """Measured indicators: a table ``[layer][precision]``, a file from ``meshplan profile --sensitivity``
    (resampled to the model's depth, columns picked by name), or ``None`` for the documented defaults."""
    if sensitivity is None:
        return layer_sensitivity(model, cols, base, operands=operands)
    if isinstance(sensitivity, (str, os.PathLike)):
        from meshplan.planner.search.solve.sensitivity import read_sensitivity

        return read_sensitivity(sensitivity, cols, model.num_layers)
    return sensitivity


def check_sensitivity(sens, L: int, cols) -> None:
    if len(sens) != L or any(len(r) != len(cols) for r in sens):
        raise MeshplanError(f"sensitivity table: expected {L} layers x {len(cols)} precisions ({', '.join(cols)}), "
                            f"got {len(sens)} rows")


def edge_params(model) -> tuple[int, int]:
    """(parameters added to the first stage: embedding, to the last: final norm + LM head)."""
    return model.embedding_params, model.final_norm_params + model.lm_head_params
