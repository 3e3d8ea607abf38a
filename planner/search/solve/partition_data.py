"""The partition problem as plain numbers (``PartitionProblem``), its answer, and ``evaluate``: a partition priced
with the step-time and memory formulas of :mod:`planner.search.solve.partition` in floats (the solver's answer and the
baselines alike; the brute-force tests use it as the truth).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from meshplan.core.errors import MeshplanError
from meshplan.planner.plan.schema import Stage
from meshplan.planner.search.solve.common import (
    DEFAULT_MEMORY_QUANTUM_BYTES,
    DEFAULT_QUALITY_QUANTUM,
    DEFAULT_TIME_QUANTUM_S,
    SolverStatus,
)

GiB = 2**30
Table = Sequence[Sequence[Sequence[Optional[float]]]]  # [layer][group][precision]; None = not supported


@dataclass(frozen=True)
class GroupSlot:
    """A device group as the partition solver sees it.

    Attributes:
        name: Device name shown in messages (e.g. ``T4``).
        max_stages: Stage units the group offers (devices, or nodes when a stage spans a node).
        memory_bytes: Memory of one stage unit, bytes (per device when a stage is one device).
    """

    name: str
    max_stages: int
    memory_bytes: float


@dataclass(frozen=True)
class Phase:
    """One pipeline pass.

    Attributes:
        name: ``step`` (training), ``prefill`` or ``decode``.
        num_micro_batches: ``m`` in the step-time formula.
        weight: Times the pass counts in the objective (1; ``gen_len - 1`` for decode).
        layer_time_s: Seconds per micro-batch, ``[layer][group][precision]``; ``None`` = unsupported.
        link_time_s: Seconds per micro-batch to cross one stage boundary, ``[from group][to group]``.
    """

    name: str
    num_micro_batches: int
    weight: int
    layer_time_s: Table
    link_time_s: Sequence[Sequence[float]]


@dataclass(frozen=True)
class PipelineOption:
    """One candidate micro-batching (and everything that depends on the micro-batch size).

    Attributes:
        label: Shown in results, e.g. ``micro_batch=2 x 16``.
        phases: The passes of one step / one request batch.
        static_bytes: Per-device bytes of each layer independent of micro-batches in flight,
        ``[layer][group][precision]``.
        act_bytes: Per-device activation bytes of each layer for one micro-batch in flight (0 when serving).
        inflight_cap: Micro-batches a 1F1B stage holds at most (the step's ``m``).
        micro_batch: Sequences per micro-batch (reported only).
    """

    label: str
    phases: tuple[Phase, ...]
    static_bytes: Table
    act_bytes: Table
    inflight_cap: int = 1
    micro_batch: int = 1


@dataclass(frozen=True)
class PartitionProblem:
    """Plain numbers for one partition + precision problem.

    Attributes:
        precisions: Names of the precision columns, e.g. ``("bf16", "fp8")``.
        groups: Device groups (columns of the tables).
        options: Micro-batching candidates; the solver returns the best over all of them.
        sensitivity: Quality indicator per ``[layer][precision]`` (0 for the reference precision).
        quality_budget: Bound on the sum of the chosen indicators; ``None`` = unbounded.
        time_quantum_s, memory_quantum_bytes, quality_quantum: Integer scaling of the CP-SAT model.
    """

    precisions: tuple[str, ...]
    groups: tuple[GroupSlot, ...]
    options: tuple[PipelineOption, ...]
    sensitivity: Sequence[Sequence[float]]
    quality_budget: Optional[float] = None
    time_quantum_s: float = DEFAULT_TIME_QUANTUM_S
    memory_quantum_bytes: float = DEFAULT_MEMORY_QUANTUM_BYTES
    quality_quantum: float = DEFAULT_QUALITY_QUANTUM

    @property
    def num_layers(self) -> int:
        return len(self.sensitivity)


@dataclass(frozen=True)
class StageRun:
    """A stage of a solution: layers ``[first, first + count)`` on group ``group``."""

    first: int
    count: int
    group: int


@dataclass(frozen=True)
class Evaluation:
    """A partition priced in unscaled units.

    Attributes:
        objective_s: Weighted sum of the phases' pass times, seconds.
        phase_times_s: Each phase's pass time (unweighted), seconds.
        stage_memory_bytes: Peak bytes per device of each stage.
        quality: Sum of the chosen indicators.
        violations: Human-readable constraint violations (empty = feasible).
    """

    objective_s: float
    phase_times_s: tuple[float, ...]
    stage_memory_bytes: tuple[float, ...]
    quality: float
    violations: tuple[str, ...] = ()

    @property
    def feasible(self) -> bool:
        return not self.violations


@dataclass(frozen=True)
class PartitionSolution:
    """The solver's answer.

    Attributes:
        option: Index of the chosen :class:`PipelineOption`.
        stages: Stage runs in pipeline order.
        layer_precision: Precision name per layer.
        evaluation: The plan priced in unscaled units.
        status: How the solve ended (objective and bound in seconds).
    """

    option: int
    stages: tuple[StageRun, ...]
    layer_precision: tuple[str, ...]
    evaluation: Evaluation
    status: SolverStatus
    label: str = ""
    notes: tuple[str, ...] = field(default=())

    def plan_stages(self) -> tuple[Stage, ...]:
        """The stages as :class:`planner.plan.schema.Stage` values for a ``Plan``."""
        return tuple(Stage(first_layer=s.first, num_layers=s.count, device_group=s.group) for s in self.stages)


def evaluate(problem: PartitionProblem, option: int, stages: Sequence[StageRun],
             layer_precision: Sequence[str]) -> Evaluation:
    """Price a given partition (the solver's or a baseline's) with the same formulas, in floats.

    Args:
        problem: The problem.
        option: Index of the micro-batching option.
        stages: Contiguous stage runs covering every layer in order.
        layer_precision: Precision name of every layer.

    Raises:
        MeshplanError: a precision a stage's device lacks, or runs that do not cover the layers.
    """
    opt = problem.options[option]
    L = problem.num_layers
    covered = [l for s in stages for l in range(s.first, s.first + s.count)]
    if covered != list(range(L)):
        raise MeshplanError(f"partition: stages {[(s.first, s.count) for s in stages]} do not cover layers 0..{L - 1}")
    pidx = [problem.precisions.index(p) for p in layer_precision]
    S = len(stages)
    violations = []
    used = [0] * len(problem.groups)
    for s in stages:
        used[s.group] += 1
    for g, n in enumerate(used):
        if n > problem.groups[g].max_stages:
            violations.append(f"{problem.groups[g].name}: {n} stages > {problem.groups[g].max_stages} available")
    for s in stages:
        for l in range(s.first, s.first + s.count):
            if any(ph.layer_time_s[l][s.group][pidx[l]] is None for ph in opt.phases) \
                    or opt.static_bytes[l][s.group][pidx[l]] is None:
                raise MeshplanError(f"device {problem.groups[s.group].name} does not support {layer_precision[l]} "
                                    f"(layer {l})")
    phase_times = []
    for ph in opt.phases:
        st = [sum(ph.layer_time_s[l][s.group][pidx[l]] for l in range(s.first, s.first + s.count)) for s in stages]
        links = [ph.link_time_s[stages[i].group][stages[i + 1].group] for i in range(S - 1)]
        phase_times.append(sum(st) + sum(links) + (ph.num_micro_batches - 1) * max(st + links))
    objective = sum(ph.weight * t for ph, t in zip(opt.phases, phase_times))
    mem = []
    for i, s in enumerate(stages):
        inflight = min(opt.inflight_cap, S - i)
        mb = sum(opt.static_bytes[l][s.group][pidx[l]] + opt.act_bytes[l][s.group][pidx[l]] * inflight
                 for l in range(s.first, s.first + s.count))
        mem.append(mb)
        cap = problem.groups[s.group].memory_bytes
        if mb > cap:
            violations.append(f"stage {i} on {problem.groups[s.group].name}: {mb / GiB:.2f} GiB > {cap / GiB:.2f} GiB")
    quality = sum(problem.sensitivity[l][pidx[l]] for l in range(L))
    if problem.quality_budget is not None and quality > problem.quality_budget * (1 + 1e-9):
        violations.append(f"quality cost {quality:.4g} > budget {problem.quality_budget:.4g}")
    return Evaluation(objective, tuple(phase_times), tuple(mem), quality, tuple(violations))
