"""Stack profiles: what a training stack does by default, at one version, each value citing the stack's own file.

A profile (``planner/presets/stacks/<name>@<version>.yaml``) names, for the decisions of ``decisions.DECISIONS``
that the stack fixes by default, the value it runs and the file and version that say so; a value may hold only for
an fp8 or a bf16 workload, only for MoE (or dense) models, only under tensor-wise fp8 scaling, or only when the job
is supervised fine-tuning (``when``; ``TASKS``), where it replaces the value that holds otherwise. What
the stack does that meshplan does not price (CUDA graphs, fused RoPE, ...) is listed under ``unpriced`` with its
source, so a user sees it was not forgotten.
A profile may add to another (``base``: an entry point of the same release, such as Megatron-Bridge's performance
scripts on top of its library): it holds the base's values and unpriced items, its own value of a key replacing
the base's. A value may hold for one model alone (``model``: what the library's recipe for it sets), and a
launcher's profile may say how it lays a job over NVLink racks (``placement``) and which LoRA adapters its
fine-tuning recipes train when the user names none (``lora``); its per-workload presets sit beside it
(``planner.search.workloads``).

``meshplan plan --stack NAME[@VERSION]`` plans with the profile's values as defaults: ``--fix`` overrides any of
them; the plan records the profile (``Plan.stack_profile``). ``meshplan stacks`` lists them with their sources.
"""
from __future__ import annotations

import functools
import itertools
import re
from dataclasses import dataclass
from importlib import resources
from types import MappingProxyType
from typing import Mapping, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from meshplan.core.errors import MeshplanError, validation_line
from meshplan.planner.layout.decisions import BY_FIX_KEY, lowp_recipe

STACKS_DIR = "presets/stacks"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ProfileValue(_Frozen):
    """One decision's default under a stack: its ``--fix`` key, the ``--fix`` text of the value and where the stack
    says it."""

    key: str
    value: str
    source: str = Field(min_length=8)
    when: Optional[str] = Field(None, pattern=r"^(fp8|bf16|nvfp4|moe|dense|tensorwise|mxfp8|sft)"
                                              r"(\+(fp8|bf16|nvfp4|moe|dense|sft))*$")
    """Holds only for an fp8 (or a bf16, or an nvfp4) workload, only for MoE / dense models, only for a workload whose
    GEMMs run tensor-wise current scaling or MXFP8 (``tensorwise``, ``mxfp8``: the recipe pinned, else the profile's
    own ``fp8``, resolved with the dtype by ``lowp_recipe``, as a stack's preset for that recipe sets more than the
    recipe), or only for a supervised fine-tuning job (``sft``: what the stack's fine-tuning entry point sets over its
    pre-training default, which it replaces); conditions joined by ``+`` hold together (``sft+fp8``); ``None``:
    always."""
    model: Optional[str] = Field(None, pattern=r"^[a-z0-9][a-z0-9._-]*$")
    """Holds only for this bundled model (``meshplan models``) and models of its shapes, replacing the value the
    profile holds for every model (``StackProfile.model_defaults``): what a library's recipe for that model sets."""
    mesh: Optional[str] = Field(None, pattern=r"^[a-z_]+(=|!=|>)[a-z0-9.-]+(,[a-z_]+(=|!=|>)[a-z0-9.-]+)*$")
    """Holds only where the job's mesh, as pinned (by the request or its workload preset), meets every condition:
    ``pp=4,vpp=4`` (those degrees pinned to these values: a recipe's map from its mesh to a pipeline layout),
    ``tp>1,sp!=false`` (tp pinned above 1, sp not pinned off: what a stack turns on only where it can, such as
    Megatron-Bridge's tensor-parallel overlap, which ``CommOverlapConfig`` turns off at TP 1 or without sequence
    parallelism), ``gpu=gb200`` (the job's GPU part as ``meshplan devices`` names it, lower case: what a launcher
    sets by the GPU it runs on, as Megatron-Bridge r0.1.0's ``run_script.py`` does). A ``k=v`` or ``k>n`` condition
    on a degree left free, or on the GPU of a job on no one GPU part, does not hold (``mesh_holds``)."""


class Unpriced(_Frozen):
    """Something the stack does by default that meshplan does not price, and where it says so."""

    what: str
    source: str = Field(min_length=8)


class LoraDefault(_Frozen):
    """The LoRA adapters a stack's fine-tuning entry point trains when its user names none (``--task lora``), and
    where the stack says so."""

    value: str = Field(pattern=r"^[1-9][0-9]*(:[a-z0-9]+(\+[a-z0-9]+)*)?$")
    """``--lora`` text, ``RANK[:MODULES]`` (``planner.model.peft``): the rank and the layers the adapters sit on."""
    model: Optional[str] = Field(None, pattern=r"^[a-z0-9][a-z0-9._-]*$")
    """Holds only for this bundled model and models of its shapes (what the library's recipe for it sets), over the
    value for every model; ``None``: every model."""
    source: str = Field(min_length=8)


def segment_nodes(nodes: int, at_most: int) -> int:
    """The nodes of one ``sbatch --segment`` a launcher asks for: the largest divisor of the job's node count up to
    ``at_most`` (a rack's trays; Megatron-Bridge's ``scripts/performance/utils/executors.py``)."""
    return next(s for s in range(at_most, 0, -1) if nodes % s == 0)


class Placement(_Frozen):
    """How a stack's launcher asks the scheduler to lay a job over NVLink racks."""

    segment_nodes_at_most: int = Field(ge=1)
    """On systems of ``gpus_per_node``-GPU trays, a job of more nodes than this runs in segments (``sbatch --segment``)
    of the largest divisor of its node count up to it, each segment inside one rack."""
    gpus_per_node: int = Field(ge=1)
    source: str = Field(min_length=8)

    def rack_gpus(self, n_gpus: int, gpus_per_node: int) -> Optional[int]:
        """The GPUs of the job in each rack, or ``None`` where the launcher asks for no segments."""
        nodes = n_gpus // gpus_per_node
        if gpus_per_node != self.gpus_per_node or nodes <= self.segment_nodes_at_most:
            return None
        return gpus_per_node * segment_nodes(nodes, self.segment_nodes_at_most)


class StackProfile(_Frozen):
    """A training stack at one version (``name@version``)."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    version: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    title: str
    source: str = Field(min_length=8)
    """The repository and the tag or commit every value below was read at."""
    values: tuple[ProfileValue, ...]
    """At most one that holds per ``--fix`` key for any workload (``when`` tells them apart); with a ``base``, what
    this profile sets beyond it (read from the file) and then, once loaded, the base's values it keeps too."""
    unpriced: tuple[Unpriced, ...] = ()
    base: Optional[str] = Field(None, pattern=r"^[a-z0-9][a-z0-9._-]*@[A-Za-z0-9][A-Za-z0-9._-]*$")
    """``name@version`` of the profile this one adds to (``None``: it stands alone)."""
    placement: Optional[Placement] = None
    """How its launcher lays a job over NVLink racks (``None``: it says nothing)."""
    lora: tuple[LoraDefault, ...] = ()
    """The LoRA adapters its fine-tuning entry point trains by default, at most one per model (and one for every
    model); with a ``base``, the base's for the models this profile names none for."""

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    def defaults(self, dtype: str, is_moe: bool, fp8: str = "", task: str = "pretrain") -> dict[str, str]:
        """``{--fix key: value text}`` of what the profile sets for a ``dtype`` workload of a MoE or dense model;
        ``fp8``: the fp8 recipe the user pinned ("": the profile's own); ``task``: one of ``TASKS``."""
        if task not in TASKS:
            raise MeshplanError(f"--task {task}: not a task (known: {', '.join(TASKS)})")
        return _resolved([v for v in self.values if v.model is None and v.mesh is None], dtype, is_moe, fp8, task)

    def model_defaults(self, model: str, dtype: str, is_moe: bool, fp8: str = "", task: str = "pretrain"
                       ) -> dict[str, str]:
        """What the profile sets for bundled model ``model`` beyond ``defaults`` (its values with ``model``), under
        the recipe ``defaults`` resolves."""
        recipe = fp8 or self.defaults(dtype, is_moe, "", task).get("fp8", "")
        return _resolved([v for v in self.values if v.model == model and v.mesh is None], dtype, is_moe, recipe, task)

    def mesh_defaults(self, model: Optional[str], dtype: str, is_moe: bool, pinned: Mapping[str, object],
                      fp8: str = "", task: str = "pretrain") -> dict[str, str]:
        """What the profile sets, for every model and for bundled model ``model`` (``None``: none of its own), only
        where the mesh ``pinned`` gives meets the value's ``mesh`` conditions (``mesh_holds``)."""
        recipe = fp8 or self.defaults(dtype, is_moe, "", task).get("fp8", "")
        held = [v for v in self.values
                if v.mesh is not None and v.model in (None, model) and mesh_holds(v.mesh, pinned)]
        # the model's own after the others, so that it replaces theirs
        return _resolved(sorted(held, key=lambda v: v.model is not None), dtype, is_moe, recipe, task)

    @property
    def models(self) -> tuple[str, ...]:
        """The bundled models some value holds for alone."""
        return tuple(sorted({v.model for v in self.values if v.model}))

    def lora_default(self, model: Optional[str]) -> Optional[LoraDefault]:
        """The LoRA default for bundled model ``model`` (``None``: a model no value holds for alone), else the one
        for every model, else ``None``."""
        by_model = {d.model: d for d in self.lora}
        return by_model.get(model) or by_model.get(None)

    def holds_for(self, task: str) -> bool:
        """Whether any value of the profile holds only for ``task`` (``when`` names it)."""
        return any(task in (v.when or "").split("+") for v in self.values)


def _resolved(values: list, dtype: str, is_moe: bool, fp8: str, task: str) -> dict[str, str]:
    """``{--fix key: value}`` of ``values`` that hold: the plain ones, then those that need the recipe resolved,
    then a fine-tuning value over any other."""
    own = {v.key: v.value for v in values if _phase(v.when) == 0 and _holds(v.when, dtype, is_moe, "")}
    recipe = fp8 or own.get("fp8", "")
    for later in (1, 2):  # the recipe resolved first; a fine-tuning value replaces any other
        own |= {v.key: v.value for v in values
                if _phase(v.when) == later and _holds(v.when, dtype, is_moe, recipe, task)}
    return own


# What a job trains, as a stack's entry points tell them apart: pre-training, or supervised fine-tuning of every weight
# (NeMo's ``conf/peft/<model>/sft.yaml``, Megatron-Bridge's finetune recipes); LoRA is ``--lora``, on either, or
# ``--task lora``: the adapters the profile's fine-tuning recipe trains (``StackProfile.lora``) on pre-training's values
TASKS = ("pretrain", "sft")


def mesh_holds(mesh: str, pinned: Mapping[str, object]) -> bool:
    """Whether the pins ``pinned`` (``--fix`` keys, and ``gpu``: the job's part) meet every condition of ``mesh``
    (``ProfileValue.mesh``): ``k=v`` and ``k>n`` need ``k`` pinned; ``k!=v`` holds unless ``k`` is pinned to ``v``.
    Numbers compare as numbers (a capacity pinned as 1.0 is ``moe_capacity=1``)."""
    for cond in mesh.split(","):
        key, op, want = re.match(r"([a-z_]+)(=|!=|>)(.+)$", cond).groups()
        got = pinned.get(key)
        same = got is not None and _same_value(got, want)
        if op == "!=" and same:
            return False
        if op == "=" and not same:
            return False
        if op == ">" and (got is None or float(got) <= float(want)):
            return False
    return True


def _same_value(got: object, want: str) -> bool:
    """``got`` (a pin) is ``want`` (a condition's text): as numbers where both are, else as lower-case text."""
    text = str(got).lower()
    try:
        return float(text) == float(want)
    except ValueError:
        return text == want


def _phase(when: Optional[str]) -> int:
    """When a value applies: with the plain ones (0), once the recipe is resolved (1: ``tensorwise``, ``mxfp8``), or
    over both (2: a fine-tuning value)."""
    parts = (when or "").split("+")
    return 2 if "sft" in parts else 1 if {"tensorwise", "mxfp8"} & set(parts) else 0


def _holds(when: Optional[str], dtype: str, is_moe: bool, recipe: str, task: str = "pretrain") -> bool:
    """Whether every condition of ``when`` holds. ``recipe``: the fp8 recipe pinned or the profile's own ("": none),
    which ``lowp_recipe`` resolves with the dtype (a bf16 run with ``fp8=tensorwise`` pinned runs tensor-wise fp8
    GEMMs)."""
    if when is None:
        return True
    facts = {"fp8": dtype == "fp8", "bf16": dtype == "bf16", "nvfp4": dtype == "nvfp4", "moe": is_moe,
             "dense": not is_moe, "tensorwise": lowp_recipe(recipe or "none", dtype) == "tensorwise",
             "mxfp8": lowp_recipe(recipe or "none", dtype) == "mxfp8", "sft": task == "sft"}
    return all(facts[part] for part in when.split("+"))


def _read(name: str, text: str) -> StackProfile:
    try:
        return StackProfile.model_validate(yaml.safe_load(text))
    except ValidationError as exc:
        raise MeshplanError(f"{STACKS_DIR}/{name}: not a stack profile: {validation_line(exc)}") from None
    except yaml.YAMLError as exc:
        raise MeshplanError(f"{STACKS_DIR}/{name}: not YAML: {str(exc).splitlines()[0]}") from None


def _on_base(prof: StackProfile, profiles: Mapping[str, StackProfile]) -> StackProfile:
    """``prof`` with its base's values (those of keys it does not set itself) and unpriced items added."""
    if prof.base is None:
        return prof
    base = profiles.get(prof.base)
    if base is None or base.base is not None:
        raise MeshplanError(f"{STACKS_DIR}/{prof.ref}.yaml: base {prof.base} is not a shipped profile that stands "
                            "alone")
    own = {(v.key, v.model, v.mesh) for v in prof.values}
    lora_models = {d.model for d in prof.lora}
    return prof.model_copy(update={"values": prof.values + tuple(v for v in base.values
                                                                  if (v.key, v.model, v.mesh) not in own),
                                   "unpriced": prof.unpriced + base.unpriced,
                                   "lora": prof.lora + tuple(d for d in base.lora if d.model not in lora_models)})


def _check(name: str, prof: StackProfile) -> StackProfile:
    """``prof`` (its base's values included), each value checked against the decision registry."""
    lora_models = [d.model for d in prof.lora]
    if len(lora_models) != len(set(lora_models)):
        raise MeshplanError(f"{STACKS_DIR}/{name}: two LoRA defaults for one model")
    for val in prof.values:
        if val.key not in BY_FIX_KEY:
            raise MeshplanError(f"{STACKS_DIR}/{name}: '{val.key}' is not a decision (known: {', '.join(BY_FIX_KEY)})")
        if not BY_FIX_KEY[val.key].by_stack and val.mesh is None:  # on a given mesh, a recipe may set more
            raise MeshplanError(f"{STACKS_DIR}/{name}: '{val.key}' is the search's to choose, not a stack default")
        BY_FIX_KEY[val.key].parse(val.value)  # a value the decision refuses is refused here, by name
    for dtype, moe, recipe in itertools.product(("bf16", "fp8", "nvfp4"), (False, True), ("", "tensorwise", "mxfp8")):
        # an sft value replaces the others of its key, so it is checked against the sft values alone
        for sft in (False, True):
            holding = [(v.key, v.model, v.mesh) for v in prof.values if (_phase(v.when) == 2) == sft
                       and _holds(v.when, dtype, moe, recipe, "sft")]
            if len(holding) != len(set(holding)):
                raise MeshplanError(f"{STACKS_DIR}/{name}: two values of one decision hold for a {dtype} "
                                    f"{'MoE' if moe else 'dense'} workload{' under ' + recipe if recipe else ''}"
                                    f"{' fine-tuning' if sft else ''}")
    return prof


@dataclass(frozen=True)
class StackCatalogue:
    """Every shipped profile, and which version of each stack is its default (the newest)."""

    profiles: Mapping[str, StackProfile]
    newest: Mapping[str, str]

    def get(self, ref: str) -> StackProfile:
        """The profile ``name`` (its newest version) or ``name@version``.

        Raises:
            MeshplanError: an unknown stack or version, naming the known ones.
        """
        name, _, version = ref.strip().lower().partition("@")
        if name not in self.newest:
            raise MeshplanError(f"--stack {ref}: unknown stack (known: {', '.join(sorted(self.newest))})")
        key = f"{name}@{version or self.newest[name]}"
        if key not in self.profiles:
            known = sorted(p.version for p in self.profiles.values() if p.name == name)
            raise MeshplanError(f"--stack {ref}: no profile of {name} at {version} (known: {', '.join(known)})")
        return self.profiles[key]


def load_stacks() -> StackCatalogue:
    """The shipped profiles (``planner/presets/stacks``), read and checked against the decision registry; parsed
    once per content of the folder's files (a plan reads them several times, the dev set once per row: 0.15 s each)."""
    folder = resources.files("meshplan.planner").joinpath(STACKS_DIR)
    texts = tuple((e.name, e.read_text(encoding="utf-8")) for e in sorted(folder.iterdir(), key=lambda e: e.name)
                  if e.name.endswith(".yaml"))
    return _catalogue(texts)


@functools.lru_cache(maxsize=4)
def _catalogue(texts: tuple[tuple[str, str], ...]) -> StackCatalogue:
    read = {}
    for name, text in texts:
        prof = _read(name, text)
        if name != f"{prof.ref}.yaml":
            raise MeshplanError(f"{STACKS_DIR}/{name}: holds {prof.ref}; name the file {prof.ref}.yaml")
        read[prof.ref] = prof
    profiles = {ref: _check(f"{ref}.yaml", _on_base(prof, read)) for ref, prof in read.items()}
    newest: dict[str, str] = {}
    for prof in profiles.values():
        if prof.name not in newest or _version_key(prof.version) > _version_key(newest[prof.name]):
            newest[prof.name] = prof.version
    return StackCatalogue(MappingProxyType(profiles), MappingProxyType(newest))


def _version_key(version: str) -> tuple:
    """Numeric runs compare as numbers (25.09 < 26.06.01; 0.2.2 < 0.16.1), and the r / v a tag puts before its
    number does not order it (Megatron-LM's core_r0.16.0 < core_v0.17.0)."""
    return tuple((0, int(t)) if t.isdigit() else (1, re.sub(r"[rv]$", "", t))
                 for t in re.findall(r"\d+|[^\d.\-]+", version))
