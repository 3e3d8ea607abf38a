"""Launch configs for existing launchers, rendered from a :class:`planner.plan.schema.Plan`.

Every target module has three pure functions:

* ``check(plan) -> None`` raises :class:`MeshplanError` for the target's own constraints (divisibility, batch
  arithmetic, option conflicts), naming the numbers;
* ``unsupported(plan) -> list[str]`` names plan decisions the target cannot express (one line each);
* ``render(plan) -> str`` the config text.

Option names and the checks come from the upstream snapshots listed in ``shared/notes/exports.md``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from meshplan.core.atomic import refuse_overwrite, write_atomic
from meshplan.core.errors import MeshplanError
from meshplan.planner.export import accelerate, bridge, deepspeed, kubeflow, megatron, slurm, torchrun, torchtitan
from meshplan.planner.plan.schema import Plan, load_plan

TARGETS: dict[str, ModuleType] = {
    "torchrun": torchrun,
    "megatron": megatron,
    "megatron-bridge": bridge,
    "deepspeed": deepspeed,
    "torchtitan": torchtitan,
    "accelerate": accelerate,
    "slurm": slurm,
    "kubeflow": kubeflow,
}

# File extension of each target's output (for golden files and default output names).
EXTENSIONS: dict[str, str] = {name: mod.EXTENSION for name, mod in TARGETS.items()}


@dataclass(frozen=True)
class ExportResult:
    """A rendered config and the plan decisions the target could not express.

    Attributes:
        target: Target name (a key of ``TARGETS``).
        text: The config file / script text.
        warnings: One line per unsupported decision.
    """

    target: str
    text: str
    warnings: list[str] = field(default_factory=list)


def get_target(target: str) -> ModuleType:
    """The target module, or ``MeshplanError`` naming the known targets."""
    mod = TARGETS.get(target)
    if mod is None:
        raise MeshplanError(f"unknown export target {target!r}; known: {', '.join(TARGETS)}")
    return mod


def render(plan: Plan, target: str) -> ExportResult:
    """Check the plan against ``target`` and render it.

    Raises:
        MeshplanError: unknown target, or the plan breaks one of the target's constraints.
    """
    mod = get_target(target)
    if target in ("deepspeed", "torchtitan", "accelerate"):
        _megatron_only(plan, target)
    mod.check(plan)
    return ExportResult(target=target, text=mod.render(plan), warnings=list(mod.unsupported(plan)))


def _megatron_only(plan: Plan, target: str) -> None:
    """Refuse, naming it, a decision only Megatron-Core's configuration expresses: the selective module list
    (``recompute_modules``) and multi-token prediction (``mtp_num_layers``): DeepSpeed, torchtitan 0.2.2 and
    Accelerate's configs have neither (torchrun, Slurm and Kubeflow launch a script of the user's: they name them
    among what the example trainer does not run, ``torchrun.unsupported``)."""
    if plan.recompute_modules:
        raise MeshplanError(f"{target}: recompute_modules={plan.recompute_modules} is Megatron-Core's selective "
                            "module list, which this target cannot set; export to megatron or megatron-bridge")
    if plan.mtp:
        raise MeshplanError(f"{target}: mtp={plan.mtp} multi-token-prediction modules are built by Megatron-Core "
                            "(mtp_num_layers), which this target cannot set; export to megatron or megatron-bridge")


def export_file(plan_path: str | Path, target: str, out: str | Path | None = None) -> ExportResult:
    """Load a plan file, render it for ``target`` and, if ``out`` is given, write the text there atomically.

    Raises:
        MeshplanError: unknown target, unreadable plan, or a failed target check (prefixed with the plan file).
    """
    get_target(target)
    if out is not None:
        refuse_overwrite(out, {"PLAN": plan_path}, "--out")
    plan = load_plan(plan_path)
    try:
        result = render(plan, target)
    except MeshplanError as exc:
        raise MeshplanError(f"{plan_path}: {exc}", exc.exit_code) from None
    if out is not None:
        write_atomic(out, result.text)
    return result


def write_example_trainer(dest: str | Path, force: bool = False) -> Path:
    """Write the shipped example trainer (``meshplan.examples``'s ``train_gpt.py``, the torchrun, Slurm and Kubeflow
    exports' default entry script) to ``dest`` atomically; a folder gets ``train_gpt.py`` inside it.

    Raises:
        MeshplanError: ``dest`` exists and ``force`` is not set (nothing the user had is overwritten).
    """
    from importlib import resources

    path = Path(dest)
    if path.is_dir():
        path = path / "train_gpt.py"
    if path.exists() and not force:
        raise MeshplanError(f"{path}: already exists; choose another path or pass --force to replace it")
    text = resources.files("meshplan.examples").joinpath("train_gpt.py").read_text(encoding="utf-8")
    return write_atomic(path, text)
