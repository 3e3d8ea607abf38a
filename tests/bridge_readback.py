"""Read exported Megatron-Bridge overrides back through the megatron-bridge package (run as a subprocess by
tests/test_export_bridge.py, so that its HF cache, Transformer Engine stand-in and transformers 4 stay out of the
test process).

stdin: JSON ``{"cases": [{"name", "recipe", "world", "overrides", "cpu_overrides", "provider_from",
"base_recipe", "extra"}], "presets": [names]}`` (``presets``: mixed-precision presets reported as the registry
builds them, under ``"presets"``). The file named by the first argument gets one JSON object per case name: the fields
the bridge's config holds after ``run_recipe.py``'s two steps (``recipe()``, then
``omegaconf_utils.process_config_with_overrides(config, cli_overrides=...)``) and
``config.runtime_config_update`` (the mixed-precision preset and ``CommOverlapConfig.setup`` applied, then
``ConfigContainer.validate``) with ``validate_error`` (None, or ``"<type>: <first line>"`` of its refusal), or
``{"error": ...}`` where the recipe or the override parser refused them.

Two things the bridge cannot do on a CPU-only machine, and what this does instead:

* megatron-bridge 0.3.1 imports ``transformer_engine.pytorch`` unconditionally in three modules (LoRA adapters and
  a full-TE layer spec: ``peft/lora_layers.py``, ``peft/lora.py``, ``models/gpt_full_te_layer_autocast_spec.py``),
  which the package's ``__init__`` pulls in. Transformer Engine's CUDA extension cannot load without a GPU, so those
  three modules, and only while they execute, see a stand-in whose attributes are empty classes; every other import
  sees Transformer Engine absent, as megatron-core does on CPU (checked: ``transformer_engine`` is not left in
  ``sys.modules``). Nothing on the config path instantiates them.
* The MoE recipes query ``torch.cuda.get_device_properties(0)`` (``apply_flex_dispatcher_backend``) after building
  the model, which has no CPU answer. A case with ``provider_from`` takes the dense Llama-3.1-8B recipe and puts in
  the model provider the MoE recipe builds first: ``AutoBridge.from_hf_pretrained(<HF id>).to_megatron_provider``,
  into a dense recipe (``base_recipe``) that has a ``CommOverlapConfig`` where the MoE recipe has one.
* ``cpu_overrides`` (after the exported ones) turn off the fused kernels ``TransformerConfig.__post_init__`` refuses
  without Transformer Engine (RoPE fusion); they are no plan decision, and the test names them.
"""
from __future__ import annotations

import dataclasses
import importlib.abc
import importlib.machinery
import json
import os
import sys
import types

NEEDS_TE = ("megatron.bridge.peft.lora_layers", "megatron.bridge.peft.lora",
            "megatron.bridge.models.gpt_full_te_layer_autocast_spec")
TE_NAMES = ("transformer_engine", "transformer_engine.pytorch")


class _Placeholder(types.ModuleType):
    """Attributes are empty classes (capitalised names, for ``class X(te.Linear)``) or placeholder modules."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (), {}) if name[:1].isupper() else _Placeholder(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _ScopedTE(importlib.abc.MetaPathFinder):
    """Runs the modules of ``NEEDS_TE`` (their real source) with the stand-in in ``sys.modules``, and only them."""

    def find_spec(self, name, path, target=None):
        if name not in NEEDS_TE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        spec.loader = _ScopedLoader(spec.loader)
        return spec


class _ScopedLoader(importlib.abc.Loader):
    def __init__(self, real):
        self.real = real

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        te = _Placeholder("transformer_engine")
        te.pytorch = _Placeholder("transformer_engine.pytorch")
        sys.modules.update({"transformer_engine": te, "transformer_engine.pytorch": te.pytorch})
        try:
            self.real.exec_module(module)
        finally:
            for name in TE_NAMES:
                sys.modules.pop(name, None)


def _field(cfg, dotted: str):
    obj = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part)
    if hasattr(obj, "value") and type(obj).__module__.startswith("megatron"):  # enums (cp_comm_type is a str)
        obj = obj.value
    plain = (bool, int, float, str, type(None))
    if isinstance(obj, list) and all(isinstance(x, plain) for x in obj):  # a list field (recompute_modules)
        return obj
    if isinstance(obj, list) and all(type(x).__module__.startswith("megatron") and hasattr(x, "name") for x in obj):
        return [x.name for x in obj]  # a list of enums (cuda_graph_scope: CudaGraphScope members)
    return obj if isinstance(obj, plain) else str(obj)


def _read(case: dict, recipes, process, update, auto_bridge) -> dict:
    os.environ["WORLD_SIZE"] = str(case["world"])  # get_world_size_safe's fallback outside torch.distributed
    if case.get("provider_from"):
        cfg = getattr(recipes, case["base_recipe"])()
        cfg.model = auto_bridge.from_hf_pretrained(case["provider_from"]).to_megatron_provider(load_weights=False)
    else:
        cfg = getattr(recipes, case["recipe"])()
    cfg = process(cfg, cli_overrides=case["overrides"] + case.get("cpu_overrides", []))
    mixed_precision_name = cfg.mixed_precision if isinstance(cfg.mixed_precision, str) else None
    try:
        update(cfg)
        refused = None
    except Exception as exc:  # validation's refusal: reported beside the fields it left
        refused = _one_line(exc)
    keys = [o.split("=", 1)[0] for o in case["overrides"] if o.split("=", 1)[0] != "mixed_precision"]
    out = {k: _field(cfg, k) for k in keys + case.get("extra", [])}
    mp = cfg.mixed_precision
    if not isinstance(mp, str):
        out.update({"mp.fp8": mp.fp8, "mp.fp8_recipe": mp.fp8_recipe, "mp.fp4": mp.fp4, "mp.bf16": mp.bf16,
                    "mp.fields": _fields(mp)})
    out.update({"mixed_precision": mixed_precision_name, "validate_error": refused,
                "data_parallel_size": getattr(cfg, "data_parallel_size", None)})
    return out


def _fields(mp) -> dict:
    """Every field of a ``MixedPrecisionConfig``, plain (dtypes as their names)."""
    plain = (bool, int, float, str, type(None))
    return {f.name: (v if isinstance(v, plain) else str(v)) for f in dataclasses.fields(mp)
            for v in [getattr(mp, f.name)]}


def _one_line(exc: Exception) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"


def main() -> None:
    request = json.load(sys.stdin)
    sys.meta_path.insert(0, _ScopedTE())
    import megatron.bridge.recipes as recipes
    from megatron.bridge import AutoBridge
    from megatron.bridge.training.config import runtime_config_update
    from megatron.bridge.training.mixed_precision import get_mixed_precision_config
    from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides

    result = {"transformer_engine_left": [n for n in TE_NAMES if n in sys.modules], "presets": {}}
    for name in request.get("presets", []):
        mp = get_mixed_precision_config(name)
        result["presets"][name] = {"fp8": mp.fp8, "fp8_recipe": mp.fp8_recipe, "fp4": mp.fp4,
                                   "fp4_recipe": mp.fp4_recipe, "bf16": mp.bf16, "fields": _fields(mp)}
    for case in request["cases"]:
        try:
            result[case["name"]] = _read(case, recipes, process_config_with_overrides, runtime_config_update,
                                         AutoBridge)
        except Exception as exc:  # the recipe or the override parser refused: the answer for this case
            result[case["name"]] = {"error": _one_line(exc)}
    with open(sys.argv[1], "w", encoding="utf-8") as f:  # stdout carries the bridge's own prints
        json.dump(result, f)


if __name__ == "__main__":
    main()
