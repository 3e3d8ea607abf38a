"""Workload presets: what a stack's launcher sets for one model on one GPU in one precision, beyond its library.

Megatron-Bridge's performance scripts run each (model, task, GPU, precision) from a preset of its own
(``scripts/performance/configs/<family>/*workload_base_configs.py``: ``WorkloadBaseConfig`` fields such as
``cuda_graph_impl``, ``moe_a2a_overlap``, ``recompute_modules``, ``pp_layout``), chosen by name with
``--config_variant`` (``v2`` by default, falling back to ``v1``, then to the unversioned name). A
``megatron-bridge-perf`` profile carries them in ``presets/stacks/workloads/<profile>.yaml``, read from the tag by
``workloads_extract``. Which preset runs is what the job states: its model, GPUs, precision and task, then the preset
whose parallel degrees, batch and GPU count differ least from the job's (its published table gives them), the
launcher's default variant on a tie. ``preset_pins`` turns the preset's fields into ``--fix`` values, each under the
request's own pins, its parallel degrees included where the job pins none: the launcher runs its preset's layout
and overrides only what it is told, so under such a profile a plan prices the preset rather than searching.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources
from typing import Mapping, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field

from meshplan.core.errors import MeshplanError

WORKLOADS_DIR = "presets/stacks/workloads"

# Bridge's compute dtype in a preset's name -> (meshplan's --dtype, its fp8 recipe)
PRECISIONS = {"bf16": ("bf16", "none"), "fp8_cs": ("fp8", "tensorwise"), "fp8_mx": ("fp8", "mxfp8"),
              "fp8_ds": ("fp8", "delayed"), "fp8_sc": ("fp8", "blockwise"), "nvfp4": ("nvfp4", "nvfp4"),
              "fp8_ss": ("fp8", "blockwise")}  # r0.1.0's subchannel scaling, its name for blockwise
# a preset's degree fields -> the --fix key the job states them with (WorkloadBaseConfig's defaults beside)
DEGREES = (("tensor_model_parallel_size", "tp", 1), ("pipeline_model_parallel_size", "pp", 1),
           ("context_parallel_size", "cp", 1), ("virtual_pipeline_model_parallel_size", "vpp", 1),
           ("expert_model_parallel_size", "ep", 1), ("micro_batch_size", "mbs", 1))


@dataclass(frozen=True)
class JobFacts:
    """What a job states beyond its model and precision that picks a preset: the GPU part (``meshplan devices``),
    the global batch, the GPU count, and whether it trains LoRA adapters."""

    device: str
    global_batch: int
    world_size: int
    lora: bool = False


class RecipeDispatcher(BaseModel):
    """The token dispatcher a performance script's recipe function sets for a model, task and GPU, and where."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    type: str = Field(pattern=r"^(alltoall|flex)$")
    file: str
    line: int


class WorkloadPreset(BaseModel):
    """One preset as its file sets it."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    file: str
    line: int
    model: str
    """meshplan's bundled model of the preset's shapes (``meshplan models``)."""
    task: str = Field(pattern=r"^(pretrain|sft|lora)$")
    gpu: str
    dtype: str
    variant: str
    """``v1``, ``v2``, a named variant (``large_scale``) or "" (unversioned)."""
    settings: Mapping[str, object]
    recipe_dispatcher: Optional[RecipeDispatcher] = None
    """The token dispatcher the job's recipe function sets last (``cfg.model.moe_token_dispatcher_type``, with no
    ``apply_flex_dispatcher_backend`` after it), which Megatron-Core runs over any flex backend the preset names;
    ``None`` where the function leaves the type to the preset."""

    def degree(self, field: str, default: int) -> int:
        value = self.settings.get(field)
        return default if value is None else int(value)


class WorkloadFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    profile: str
    source: str
    default_variant: str
    default_variant_source: str
    left_out: int
    presets: tuple[WorkloadPreset, ...]


@functools.lru_cache(maxsize=None)
def load_workloads(ref: str) -> Optional[WorkloadFile]:
    """The workload presets of profile ``name@version`` (``None``: it has none)."""
    path = resources.files("meshplan.planner").joinpath(WORKLOADS_DIR, f"{ref}.yaml")
    if not path.is_file():
        return None
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml reads the 150 kB files 8x faster
    return WorkloadFile.model_validate(yaml.load(path.read_text(encoding="utf-8"), Loader=loader))  # noqa: S506


def _same_shapes(a, b) -> bool:
    keys = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "ffn_hidden_size", "num_experts",
            "experts_per_token", "moe_ffn_hidden_size")
    return all(getattr(a, k) == getattr(b, k) for k in keys)


def model_values(prof, spec, dtype: str, fp8: str = "", task: str = "pretrain") -> dict[str, str]:
    """What stack profile ``prof`` sets for ``spec``'s model alone (``ProfileValue.model``): the values of the bundled
    model whose shapes ``spec`` has, none where no such model has values."""
    name = _bundled_model(prof, spec)
    return {} if name is None else _trained(spec, prof.model_defaults(name, dtype, spec.is_moe, fp8, task))


def _bundled_model(prof, spec) -> Optional[str]:
    """The bundled model some value of ``prof`` holds for alone whose shapes ``spec`` has, or ``None``."""
    from meshplan.planner.model.config import load_model

    return next((name for name in prof.models if _same_shapes(spec, load_model(name))), None)


def lora_default(prof, spec):
    """The LoRA adapters stack profile ``prof`` trains by default for ``spec``'s model (``StackProfile.lora``): its
    recipe's for the bundled model whose shapes ``spec`` has, else the one for every model, else ``None``."""
    from meshplan.planner.model.config import load_model

    named = next((d.model for d in prof.lora if d.model and _same_shapes(spec, load_model(d.model))), None)
    return prof.lora_default(named)


def _trained(spec, values: dict[str, str]) -> dict[str, str]:
    """``values`` less MTP where ``spec``'s config describes no MTP module: it trains none, whatever the recipe."""
    if not spec.config_mtp_layers:
        values.pop("mtp", None)
    return values


def stack_values(prof, spec, dtype: str, pinned: Mapping[str, object], task: str = "pretrain",
                 job: Optional[JobFacts] = None) -> tuple[dict[str, str], Optional[WorkloadPreset], dict[str, str]]:
    """(``{--fix key: value}`` stack profile ``prof`` sets for a ``dtype`` ``task`` job of model ``spec``, the workload
    preset its launcher runs, what that preset set): the profile's values, its model's own over them
    (``model_values``), those that hold only on some mesh (``ProfileValue.mesh``, judged on the job's pins, its
    preset's mesh and its GPU), then the preset's (``choose_preset``, ``preset_pins``; none without ``job``).
    ``pinned``: the job's own pins, whose fp8 recipe resolves the profile's and whose keys the preset leaves alone."""
    fp8 = str(pinned.get("fp8", ""))
    own = prof.defaults(dtype, spec.is_moe, fp8, task) | model_values(prof, spec, dtype, fp8, task)
    preset, sets = None, {}
    if job is not None:
        from meshplan.planner.layout.decisions import lowp_recipe

        recipe = lowp_recipe(fp8 or own.get("fp8", "none"), dtype)
        preset = choose_preset(prof.ref, spec, dtype, recipe, task, pinned, job)
        sets = preset_pins(preset, spec.is_moe, pinned, spec.num_layers) if preset else {}
    held = {**sets, **pinned} | ({"gpu": job.device.lower()} if job is not None else {})  # ``ProfileValue.mesh``
    on_mesh = prof.mesh_defaults(_bundled_model(prof, spec), dtype, spec.is_moe, held, fp8, task)
    return own | _trained(spec, on_mesh) | sets, preset, sets


def _variant_rank(variant: str, default: str) -> int:
    """The launcher's order of preference: its default variant, v1 (its fallback), the unversioned name, the rest."""
    return {default: 0, "v1": 1, "": 2}.get(variant, 3)


def choose_preset(ref: str, spec, dtype: str, recipe: str, task: str, pinned: Mapping[str, object],
                  job: JobFacts) -> Optional[WorkloadPreset]:
    """The preset profile ``ref``'s launcher runs for this job (module docstring), or ``None``: no preset of this
    model on the job's device in this precision and task. ``recipe``: the job's low-precision recipe (``none`` for bf16,
    ``nvfp4`` for an nvfp4 job)."""
    wl = load_workloads(ref)
    if wl is None:
        return None
    from meshplan.planner.model.config import load_model

    want_task = "lora" if job.lora else task
    cands = []
    for p in wl.presets:
        if p.gpu != job.device or p.task != want_task or PRECISIONS[p.dtype] != (dtype, recipe):
            continue
        if not _same_shapes(spec, load_model(p.model)):
            continue
        facts = [(p.degree(f, d), pinned.get(k)) for f, k, d in DEGREES if k in pinned]
        facts += [(p.degree("global_batch_size", 1), job.global_batch), (p.degree("num_gpus", 1), job.world_size)]
        differ = sum(int(a) != int(b) for a, b in facts)
        cands.append((differ, _variant_rank(p.variant, wl.default_variant), p.name, p))
    return min(cands, key=lambda c: c[:3])[3] if cands else None


def preset_graphs(settings: Mapping[str, object]) -> Optional[str]:
    """meshplan's ``cuda_graphs`` of a preset's ``cuda_graph_impl`` / ``cuda_graph_scope``: the whole iteration
    (``full_iteration``, or Megatron's ``local`` graphs scoped to it), per-layer graphs of the attention and Mamba
    mixers alone (a scope of ``attn`` / ``mamba`` only), other per-layer graphs, none (impl ``none``), or
    ``None`` where the preset sets no impl. r0.1.0's perf matrix says ``cuda_graphs`` instead, a flag
    set_cuda_graph_overrides (utils/helpers.py @ r0.1.0 lines 114-120) turns into Megatron-Core's per-layer graphs
    (``enable_cuda_graph``)."""
    if "cuda_graphs" in settings:
        return "layers" if settings["cuda_graphs"] else "none"
    impl, scope = settings.get("cuda_graph_impl"), settings.get("cuda_graph_scope")
    scopes = scope if isinstance(scope, list) else [scope]
    if impl == "full_iteration" or (impl == "local" and "full_iteration" in scopes):
        return "iteration"
    if impl in ("transformer_engine", "local") and scope and set(scopes) <= {"attn", "mamba"}:
        return "mixers"  # the sequence mixers alone: every MLP and MoE block eager
    if impl in ("transformer_engine", "local"):
        return "layers"
    return "none" if impl == "none" else None


def _graphs(settings: Mapping[str, object]) -> str:
    """``preset_graphs``, with none where the preset sets no impl: ``_set_cuda_graph_overrides`` (overrides.py @ v0.5.1
    line 113) then keeps the library recipe's ``cfg.model.cuda_graph_impl = "none"`` (recipes/qwen/qwen3_moe.py line
    70, recipes/deepseek/deepseek_v3.py line 163 @ v0.5.1)."""
    return preset_graphs(settings) or "none"


def _recompute(settings: Mapping[str, object], pp: int) -> dict[str, str]:
    """What ``_set_recompute_overrides`` (scripts/performance/utils/overrides.py @ v0.5.1 lines 139-153) makes of a
    preset: ``recompute_num_layers`` N is full recomputation of N layers per chunk (method block), a
    ``recompute_modules`` list selective recomputation of those modules (an empty list recomputes nothing,
    ``core_attn`` alone is Megatron-Core's default list), ``cpu_offloading_num_layers`` activation offloading, which
    Megatron-Core refuses at pp > 1 (TransformerConfig.__post_init__), so it is dropped there."""
    out: dict[str, str] = {}
    off = int(settings.get("cpu_offloading_num_layers") or 0)
    if off and pp == 1:
        out["offload_layers"] = str(off)
    mods = settings.get("recompute_modules")
    if settings.get("recompute_num_layers") is not None:
        out["recompute"] = f"full:{int(settings['recompute_num_layers'])}"
    elif isinstance(mods, list):
        out["recompute"] = "selective" if mods else "none"
        if mods and mods != ["core_attn"]:
            out["recompute_modules"] = "+".join(str(m) for m in mods)
    return out


def _mesh(preset: WorkloadPreset, pinned: Mapping[str, object], is_moe: bool) -> dict[str, int]:
    """The job's degrees: its own pins, the preset's where it pins none (the launcher runs its preset's layout and
    overrides only what its command line says: utils/utils.py get_exp_name_config @ v0.5.1), and the expert tensor
    parallelism the preset states on an expert-parallel MoE job (the launcher sets it, equal to tp or not)."""
    out = {k: int(pinned.get(k, preset.degree(f, d))) for f, k, d in DEGREES}
    etp = preset.settings.get("expert_tensor_parallel_size")
    if is_moe and "etp" not in pinned and etp is not None and out["ep"] > 1:
        out["etp"] = int(etp)
    if not is_moe:
        out.pop("ep")
    return out


def dispatcher_of(preset: WorkloadPreset) -> str:
    """The MoE dispatcher a preset's job runs: its flex backend (none named: the all-to-all, overrides.py @ v0.5.1
    lines 258-261), unless its recipe function sets a non-flex type last (``recipe_dispatcher``), which Megatron-Core
    runs instead (the flex backend is read only under ``moe_token_dispatcher_type`` "flex"). Under whole-iteration
    graphs the function pre-sizes that all-to-all's buffers (``set_full_iter_cg_configs``, qwen3_llm_pretrain.py @
    v0.5.1 lines 48-56: a rank capacity factor of 1.5 and padded experts), so it runs without the host sync, a mode
    meshplan's ``moe_dispatcher`` does not name: there the preset's flex backend, whose pre-sized dispatch is
    sync-free too, stands for it (the all-to-all's wire time is Hybrid-EP's)."""
    forced = preset.recipe_dispatcher
    if forced is not None and forced.type != "flex" and _graphs(preset.settings) != "iteration":
        return forced.type
    return str(preset.settings.get("moe_flex_dispatcher_backend") or "alltoall")


def preset_pins(preset: WorkloadPreset, is_moe: bool, pinned: Mapping[str, object], num_layers: int) -> dict[str, str]:
    """``{--fix key: value}`` the preset sets for the job (``pinned``: the job's own pins, which keep theirs): its
    mesh where the job leaves a degree free (``_mesh``); its recomputation and offloading, CUDA graphs, and on an MoE
    model its dispatcher (none named: the all-to-all, overrides.py @ v0.5.1 lines 258-261), all-to-all overlap and
    fused grouped MLP; fp8 attention; its pipeline layout when the job runs the preset's pp and vpp."""
    from meshplan.planner.layout.splits import format_pp_layout, megatron_layout_stages

    s = preset.settings
    mesh = _mesh(preset, pinned, is_moe)
    out = {k: str(v) for k, v in mesh.items()} | _recompute(s, mesh["pp"])
    out["cuda_graphs"] = _graphs(s)
    if is_moe:
        out["moe_dispatcher"] = dispatcher_of(preset)
        out["moe_overlap"] = "true" if s.get("moe_a2a_overlap") else "false"
        if s.get("cutedsl_fused_grouped_mlp"):
            out["moe_fused_mlp"] = "true"
    if s.get("fp8_dot_product_attention"):
        out["attention_dtype"] = "fp8"
    own = (preset.degree("pipeline_model_parallel_size", 1), preset.degree("virtual_pipeline_model_parallel_size", 1))
    if s.get("pp_layout") and (mesh["pp"], mesh["vpp"]) == own:
        stages = megatron_layout_stages(str(s["pp_layout"]))
        if len(stages) == own[0] * own[1] and sum(stages) == num_layers and min(stages) >= 1:
            out["pp_layout"] = format_pp_layout(stages)
    if mesh["vpp"] > 1:
        out["schedule"] = "interleaved"
    return {k: v for k, v in out.items() if k not in pinned}


def check_workloads(ref: str) -> None:
    """Raise ``MeshplanError`` when profile ``ref``'s workloads file names a model meshplan does not bundle or a
    precision it does not know."""
    from meshplan.planner.model.config import preset_names

    wl = load_workloads(ref)
    for p in wl.presets if wl else ():
        if p.model not in preset_names() or p.dtype not in PRECISIONS:
            raise MeshplanError(f"{WORKLOADS_DIR}/{ref}.yaml: preset {p.name}: model {p.model} or precision "
                                f"{p.dtype} unknown")
