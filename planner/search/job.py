"""The ``meshplan plan`` job as a library call: load inputs, pick the search or the solver, write the best plan.

* Homogeneous cluster, training: exhaustive layout search (``planner.search.exact``), ranked by predicted step time.
* Heterogeneous cluster, a quality budget, or ``--workload serve``: the CP-SAT solvers of ``planner.search.solve``
  (heterogeneous partition + per-layer precision, LLM-PQ / QSync style).
* ``--compress``: pure data parallelism with a per-bucket gradient compression choice (ByteComp style); the
  saving in exposed communication that the solver's backward timeline predicts is applied to the estimate.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Callable, Optional

from meshplan.core.atomic import file_state, refuse_overwrite, write_checked
from meshplan.core.errors import MeshplanError
from meshplan.core.units import canonical_dtype, parse_bandwidth
from meshplan.core.version import meshplan_version
from meshplan.costmodel.api import Pricer
from meshplan.planner.cluster.spec import ClusterSpec, load_cluster
from meshplan.planner.estimate.base import Estimate, Estimator, Workload
from meshplan.planner.estimate.explain import explain_gpu
from meshplan.planner.estimate.gpu import GpuEstimator
from meshplan.planner.estimate.select import estimator_for
from meshplan.planner.host.terms import Host
from meshplan.planner.layout.layout import Layout
from meshplan.planner.layout.space import Pins, fp8_recipe_choices, parse_fix
from meshplan.planner.layout.stacks import TASKS, StackProfile, load_stacks
from meshplan.planner.model.config import load_model
from meshplan.planner.model.peft import parse_lora
from meshplan.planner.model.spec import ModelSpec
from meshplan.planner.plan.build import model_ref, to_plan
from meshplan.planner.plan.schema import PLAN_NAME_PATTERN, Breakdown, Degrees, Plan, Prediction
from meshplan.planner.search.exact import Priced, layout_row, pinned_work, search
from meshplan.planner.search.open_figures import rank_under_open_figures, ranking_notes
from meshplan.planner.search.segments import Allocation, segment_advice
from meshplan.planner.search.solve.columns import base_dtype
from meshplan.planner.search.workloads import JobFacts, lora_default, stack_values

WORKLOADS = ("train", "serve")
# The workload dtypes the CP-SAT solvers plan: their 16-bit reference (bf16, or fp16 where a device lacks it) and
# fp32 (QSync's reference; CPU ranks)
SOLVER_DTYPES = ("bf16", "fp16", "fp32")


@dataclass(frozen=True)
class PlanOptions:
    """How a plan is answered and written, beside what is planned (``PlanRequest``)."""

    top: int = 10
    """How many ranked layouts to return."""
    name: Optional[str] = None
    """The plan's name (``None``: the model's, ``plan_name``)."""
    out: Optional[Path] = None
    """Where the best plan is written (``None``: ``plans_dir/<name>.yaml``)."""
    plans_dir: Path = Path("plans")
    costmodel: Optional[Path] = None
    """The cost-model folder that prices operators (``None``: the shipped one)."""
    explain: bool = False
    """The best plan carries ``planner.estimate.explain``'s breakdown (GPU clusters)."""
    breakdown: bool = False
    """The outcome carries that breakdown (GPU clusters; the plan only with ``explain``): a report draws it."""
    quality_budget: Optional[float] = None
    """Bound on the summed per-layer quantization sensitivity (the precision solver; ``None``: 16-bit layers)."""
    sensitivity: Optional[Path] = None
    """Measured per-layer indicators (``meshplan profile --sensitivity``) for the precision solver."""
    gen_len: int = 128
    """Tokens generated per request (serving)."""
    compress: bool = False
    """Choose gradient compression per bucket (ByteComp) for plain data parallelism."""
    error_budget: Optional[float] = None
    """Bound on the gradient compression error."""
    net: Optional[str] = None
    """Inter-node bandwidth per GPU that replaces the cluster's (e.g. ``25Gbps``)."""


@dataclass(frozen=True)
class PlanRequest:
    """One planning job, handed from the CLI through planning, search and the solvers: the application (model,
    batch, sequence, workload, dtype), the system (cluster), the decisions the user fixed, and the options."""

    model: str
    """A preset name or the path of a HF ``config.json``."""
    cluster: str
    """A shorthand (``16x8xH100``, ``4xT4+1xA100``, ``local:2``), a preset or a cluster YAML file."""
    global_batch: int
    """Sequences per optimizer step (requests per batch when serving)."""
    seq_len: int
    """Tokens per sequence (prompt length when serving)."""
    fix: Pins = field(default_factory=Pins)
    """The decisions pinned (``--fix``, ``planner.layout.space.parse_fix``)."""
    dtype: Optional[str] = None
    """Math dtype (``None``: bf16 on accelerators, fp32 on ``local:N`` CPUs)."""
    workload: str = "train"
    """``train`` or ``serve`` (LLM-PQ style)."""
    stack: Optional[str] = None
    """A stack profile, ``name[@version]`` (``planner.layout.stacks``): its values are the defaults ``fix``
    overrides."""
    options: PlanOptions = field(default_factory=PlanOptions)
    lora: str = ""
    """LoRA adapters over a frozen base, ``RANK[:MODULES]`` (``planner.model.peft``); "" trains every weight."""
    task: str = "pretrain"
    """What the job trains, as the stack's entry points tell them apart (``planner.layout.stacks.TASKS``): the
    profile's fine-tuning values hold for ``sft``; ``lora`` trains the adapters ``lora`` names, else those the
    profile's fine-tuning recipe trains by default (``StackProfile.lora``), on the values pre-training takes."""

    @classmethod
    def of(cls, model: str, cluster: str, global_batch: int, seq_len: int, *, fix: str | Pins | None = None,
           dtype: str | None = None, workload: str = "train", stack: str | None = None, lora: str | None = None,
           task: str = "pretrain", **options) -> "PlanRequest":
        """A request from ``meshplan plan``'s arguments: ``fix`` as the ``--fix`` text, ``options`` by
        ``PlanOptions`` field."""
        pins = fix if isinstance(fix, Pins) else parse_fix(fix)
        return cls(model, cluster, global_batch, seq_len, pins, dtype, workload, stack, PlanOptions(**options),
                   lora or "", task)

    def __post_init__(self) -> None:
        for flag, value in (("--global-batch", self.global_batch), ("--seq-len", self.seq_len),
                            ("--top", self.options.top), ("--gen-len", self.options.gen_len)):
            if value < 1:
                raise MeshplanError(f"{flag} {value} must be >= 1")
        if self.workload not in WORKLOADS:
            raise MeshplanError(f"--workload {self.workload}: expected one of {', '.join(WORKLOADS)}")
        parse_lora(self.lora)  # a malformed --lora is named before any work
        if self.task not in REQUEST_TASKS:
            raise MeshplanError(f"--task {self.task}: expected one of {', '.join(REQUEST_TASKS)}")


# What ``--task`` takes: the profile's tasks, and LoRA at the profile's adapters (``PlanRequest.task``)
REQUEST_TASKS = (*TASKS, "lora")


@dataclass
class PlanOutcome:
    """What the CLI renders: a title, ranked rows (dicts with a ``layout`` string), the written plan.

    ``priced``: every layout the search priced (``planner.search.exact.Priced``) and ``memory_limit_bytes`` what
    one may hold; ``breakdown``: ``planner.estimate.explain``'s breakdown of the best plan (GPU clusters, when
    ``PlanOptions.breakdown`` or ``explain``). Empty for solver plans.
    """

    title: str
    rows: list[dict]
    plan: Plan
    path: Path
    notes: tuple[str, ...] = ()
    priced: tuple[Priced, ...] = ()
    memory_limit_bytes: int = 0
    breakdown: Optional[dict] = None
    counts: dict = field(default_factory=dict)
    """The layout search's own figures (``layouts_in_space``, ``layouts_priced``: estimated in full,
    ``layouts_pruned``: never estimated in full, of which ``layouts_timed``: shown by their step time alone not to
    rank, and ``layouts_unfit``: shown by their activations alone not to fit); empty where a solver answered."""
    allocation: Optional[Allocation] = None
    """The same trays in rack segments, where that runs faster (``planner.search.segments``)."""


@dataclass(frozen=True)
class _Job:
    """A request with its inputs loaded: the model, the cluster, the estimator that prices, the plan's file."""

    request: PlanRequest
    spec: ModelSpec
    cluster: ClusterSpec
    estimator: Estimator
    dtype: str
    name: str
    path: Path
    before: object  # the plan file's state when the job began (``core.atomic.file_state``)
    fix: Pins  # the request's pins over the stack profile's values
    profile: str  # the stack profile's ``name@version`` ("" = none)
    task_note: tuple[str, ...]  # ``_task_note``'s line where ``--task`` changes nothing


def plan_name(model_arg: str) -> str:
    """``llama-3.1-70b`` for a preset; the folder name for ``.../tiny-gpt/config.json``; else the file stem.

    Characters outside a plan name's alphabet (``PLAN_NAME_PATTERN``: a folder may be called ``x$(cmd)``) become
    ``-``.
    """
    p = Path(model_arg)
    if p.suffix == ".json":
        raw = p.parent.name if p.stem == "config" and p.parent.name else p.stem
    elif p.is_dir():
        raw = p.resolve().name
    else:
        raw = model_arg
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", raw).lstrip("-._")[:128].rstrip("-._")
    return name or "model"


def check_plan_name(name: str) -> str:
    """``name`` if it is a valid plan name (``--name``), else ``MeshplanError`` saying what is allowed."""
    if not re.fullmatch(PLAN_NAME_PATTERN, name):
        raise MeshplanError(f"--name {name!r}: a plan name is 1-128 letters, digits, '.', '_' or '-', starting "
                            "with a letter or digit (it becomes plans/<name>.yaml and a job name)")
    return name


def plan_job(request: PlanRequest, host: Host = Host(),
             progress: Optional[Callable[[int], None]] = None) -> PlanOutcome:
    """Plan ``request`` and write the best plan (``PlanOptions.out``, default ``plans/<name>.yaml``).

    ``host``: this host's calibration and learned terms (``planner.host.terms.load_host``), needed by ``local:N``
    clusters. ``progress``: called with the count of layouts priced so far.
    """
    job = _load_job(request, host)
    request = job.request  # --task lora: the adapters it trains (with_task_lora)
    if request.workload == "serve" or job.cluster.is_heterogeneous or job.request.options.quality_budget is not None \
            or request.options.sensitivity:
        if request.lora:
            raise MeshplanError(f"--lora {request.lora} (or --task lora) prices fine-tuning in the homogeneous layout "
                                "search; the heterogeneous / serving solver trains every weight")
        if request.fix.pinned():
            raise MeshplanError("--fix applies to the homogeneous layout search; the heterogeneous / serving "
                                "solver chooses stages and precisions itself")
        if job.dtype not in SOLVER_DTYPES:
            # the solvers price each layer at 16 bits or at the lower precision they choose under --quality-budget
            # (``solve.columns.MENU``); a low-precision --dtype would only relabel the plan and move its MFU's peak
            raise MeshplanError(f"--dtype {job.dtype}: the heterogeneous / serving solver chooses each layer's "
                                "precision itself (16-bit; fp8, int8 or int4 layers under --quality-budget); plan "
                                f"with --dtype bf16, or a {job.dtype} run on a homogeneous cluster")
        return _solver_plan(job)
    try:
        return _search_plan(job, progress)
    except MeshplanError as exc:  # a refusal under a workload preset's values names them: the user pinned none
        preset = next((n for n in job.task_note if "workload preset" in n), "")
        if not preset:
            raise
        raise MeshplanError(f"{exc} ({preset}; --fix any of them to override)", exc.exit_code) from None


def _load_job(request: PlanRequest, host: Host) -> _Job:
    """Load the model and cluster, choose the estimator and the dtype, and claim the plan's file."""
    opts = request.options
    spec = load_model(request.model)
    request, lora_note = with_task_lora(request, spec)
    clus = load_cluster(request.cluster, calibration=host.calibration)
    estimator = estimator_for(clus, Pricer.from_dir(opts.costmodel), host.terms)
    if opts.net:
        clus = clus.with_inter_bandwidth(parse_bandwidth(opts.net))
    dtype = canonical_dtype(request.dtype) if request.dtype is not None else None  # bfloat16 -> bf16
    if dtype is None:  # bf16 mixed precision on accelerators; fp32 on CPU ranks (local:N), as PyTorch trains there
        dtype = "fp32" if all(g.device.vendor == "cpu" for g in clus.groups) else "bf16"
    name = check_plan_name(opts.name) if opts.name is not None else plan_name(request.model)
    path = Path(opts.out) if opts.out else opts.plans_dir / f"{name}.yaml"
    refuse_overwrite(path, {"--model": request.model if Path(request.model).exists() else None,
                            "--cluster": request.cluster if Path(request.cluster).exists() else None,
                            "--sensitivity": opts.sensitivity}, "--out")
    before = file_state(path)  # a second writer of the same plan meanwhile is told, not overwritten
    facts = None if clus.is_heterogeneous else JobFacts(clus.device.name, request.global_batch, clus.world_size,
                                                         bool(request.lora))  # a preset names one GPU part
    fix, prof, preset_note = profile_pins(request.stack, dtype, spec, request.fix, request.task, facts)
    return _Job(request, spec, clus, estimator, dtype, name, path, before, fix, prof.ref if prof else "",
                lora_note + _task_note(request.task, prof) + ((preset_note,) if preset_note else ()))


def with_task_lora(request: PlanRequest, spec) -> tuple[PlanRequest, tuple[str, ...]]:
    """(``request`` as the search takes it, a note): ``--task lora`` becomes the LoRA job it names, its adapters
    those of ``--lora`` or else the ones the stack profile trains by default for ``spec``'s model (``lora_default``),
    on the values pre-training takes (as ``--lora`` alone prices). Any other task passes through.

    Raises:
        MeshplanError: ``--task lora`` with neither ``--lora`` nor a profile that states LoRA defaults; ``--task sft``
            (every weight trained) with ``--lora`` (adapters over a frozen base).
    """
    if request.task == "sft" and request.lora:
        raise MeshplanError(f"--task sft trains every weight, --lora {request.lora} adapters over a frozen base: use "
                            f"--task lora --lora {request.lora}, or drop --lora")
    if request.task != "lora":
        return request, ()
    if request.lora:
        return replace(request, task="pretrain"), ()
    prof = load_stacks().get(request.stack) if request.stack else None
    found = lora_default(prof, spec) if prof else None
    if found is None:
        where = f"stack profile {prof.ref} states no LoRA default" if prof else "no --stack profile named"
        raise MeshplanError(f"--task lora: {where}; name the adapters with --lora RANK[:MODULES], e.g. 16:qkv")
    scope = f" for {found.model}" if found.model else ""
    return replace(request, lora=found.value, task="pretrain"), (
        f"--task lora: adapters {found.value}, stack profile {prof.ref}'s default{scope} ({found.source})",)


def profile_pins(stack: Optional[str], dtype: str, spec, fix: Pins, task: str = "pretrain",
                 job: Optional[JobFacts] = None) -> tuple[Pins, Optional[StackProfile], str]:
    """(the pins a ``dtype`` run of model ``spec`` plans under, the profile, a note naming the workload preset):
    stack profile ``stack``'s values for ``task``, its model's own and those of the workload preset its launcher runs
    for ``job`` (``workloads.stack_values``; no preset without ``job``), under ``fix`` (``_over_profile``); ``fix``,
    ``None`` and "" without a stack."""
    if not stack:
        return fix, None, ""
    prof = load_stacks().get(stack)
    own, preset, sets = stack_values(prof, spec, dtype, fix.pinned(), task, job)
    note = "" if preset is None else (
        f"stack profile {prof.ref}: workload preset {preset.name} ({preset.file} line {preset.line})"
        + (f" sets {', '.join(f'{k}={v}' for k, v in sets.items())}" if sets else " sets nothing more"))
    own_gpus = preset.degree("num_gpus", 0) if preset is not None else 0
    if job is not None and own_gpus and own_gpus != job.world_size:  # the closest preset is another job's layout
        note += f", a layout for {own_gpus} GPUs (this job has {job.world_size})"
    defaults = parse_fix(",".join(f"{k}={v}" for k, v in own.items())).pinned()
    if spec.attn_softcap:  # the model's own layer spec runs its capped attention, not the stack's fused kernel
        defaults.pop("attention", None)  # (Megatron-Bridge / NeMo Gemma 2: Gemma2DotProductAttention; space)
    return Pins(**_over_profile(defaults, fix)), prof, note


def _task_note(task: str, prof: Optional[StackProfile]) -> tuple[str, ...]:
    """A line where ``--task`` changes nothing: no profile named, or one without values for that task."""
    if task == "pretrain" or (prof is not None and prof.holds_for(task)):
        return ()
    where = f"stack profile {prof.ref} holds no {task} value" if prof else "no --stack profile named"
    return (f"--task {task}: {where}, so the plan is priced as pre-training would be",)


def _over_profile(defaults: dict, fix: Pins) -> dict:
    """The profile's values under the request's pins. ``recompute`` and ``recompute_modules`` go together (a module
    list is selective recomputation): pinning one drops the profile's value of the other."""
    out = {**defaults, **fix.pinned()}
    if "recompute_modules" in fix and "recompute" not in fix:
        out.pop("recompute", None)
    if "recompute" in fix and "recompute_modules" not in fix:
        out.pop("recompute_modules", None)
    return out


def _search_plan(job: _Job, progress: Optional[Callable[[int], None]]) -> PlanOutcome:
    """The homogeneous layout search (and ``--compress``'s choice), the best plan written."""
    req, opts, clus, estimator = job.request, job.request.options, job.cluster, job.estimator
    clus.device.peak(job.dtype)  # refuses a dtype the device lacks, naming the device
    work, fixes = pinned_work(Workload(job.spec, clus, req.global_batch, req.seq_len, job.dtype, lora=req.lora),
                              job.fix)
    if opts.compress:
        for k in ("tp", "pp", "cp", "ep"):
            if fixes.get(k, 1) != 1:
                raise MeshplanError(f"--compress plans pure data parallelism; --fix {k}={fixes.get(k)} conflicts")
        fixes = fixes.with_(tp=1, pp=1, cp=1, ep=1)
    result = search(work, fixes, top=opts.top, progress=progress, estimator=estimator,
                    fp8_recipes=fp8_recipe_choices(job.dtype, clus.device))
    best_layout, best_est = result.ranked[0]
    plan = to_plan(work, best_layout, best_est, job.name, req.model, estimator.name)
    if opts.explain and not isinstance(estimator, GpuEstimator):
        raise MeshplanError(f"--explain breaks down GPU plans; {clus.spec} is priced by the host's measurements")
    why = None
    if (opts.explain or opts.breakdown) and isinstance(estimator, GpuEstimator):
        why = explain_gpu(estimator, work, best_layout)
    rows = [layout_row(lay, est) for lay, est in result.ranked]
    notes: tuple[str, ...] = ()
    if opts.explain:
        ranks = rank_under_open_figures(estimator, work, result.ranked)
        plan = plan.model_copy(update={"explain": {**why, "stack_profile": job.profile or None,
                                                   **({"open_figures_ranking": ranks} if ranks else {})}})
        notes += ranking_notes(ranks, rows)
    allocation = None
    if isinstance(estimator, GpuEstimator):  # the same trays in rack segments that keep its groups on NVLink
        allocation = segment_advice(estimator, work, best_layout, best_est.step_time_s, partial(_best_of, job, fixes))
        notes += (allocation.note(),) if allocation else ()
    if result.uneven_pp:  # no pipeline degree dividing the layers left a data-parallel degree that splits the batch
        notes += (f"search: no layout with pp dividing the {work.model.num_layers} layers splits global batch "
                  f"{work.global_batch} over {clus.world_size} GPUs; searched pp={result.uneven_pp} with uneven "
                  "stages as well (global batch " + " or ".join(map(str, result.even_batches)) +
                  " splits with even stages)",)
    if result.fallback:  # the same answer, slower: an estimator change contradicts what the bounds assume
        notes += (f"search: pruning fell back to pricing all {result.candidates:,} candidates ({result.fallback})",)
    if opts.compress:
        plan, rows, more = _choose_compression(job, work, fixes, plan, best_est, rows)
        notes += more
    pricer = getattr(estimator, "pricer", None)
    if pricer is not None:  # prices on a GPU the cost model never saw that fall outside [roofline, 3x roofline]
        notes += tuple(f"warning: {w}" for w in pricer.warnings)
    if job.profile:
        plan = plan.model_copy(update={"stack_profile": job.profile})
    notes += job.task_note
    write_checked(job.path, plan.to_yaml(), job.before)
    title = (f"{job.spec.name} on {clus.spec}: global batch {req.global_batch}, seq {req.seq_len} — "
             f"{result.feasible} of {result.evaluated} layouts priced fit, of {result.candidates:,} in the space "
             f"({result.wall_s:.2f} s)")
    counts = {"layouts_in_space": result.candidates, "layouts_priced": result.evaluated,
              "layouts_pruned": result.candidates - result.evaluated,
              # of those pruned: shown by their step time alone not to rank, or by their activations not to fit
              "layouts_timed": result.timed, "layouts_unfit": result.unfit}
    return PlanOutcome(title, rows, plan, job.path, notes, priced=tuple(result.priced),
                       memory_limit_bytes=best_est.memory_limit_bytes, breakdown=why, counts=counts,
                       allocation=allocation)


def _best_of(job: _Job, fixes: Pins, work: Workload) -> Optional[tuple[Layout, Estimate]]:
    """The best (layout, estimate) of ``work`` under ``fixes``; ``None`` where none fits."""
    try:
        return search(work, fixes, top=1, estimator=job.estimator,
                      fp8_recipes=fp8_recipe_choices(job.dtype, work.cluster.device)).ranked[0]
    except MeshplanError:  # nothing fits there either: the segment advice keeps to the re-priced best
        return None


def _choose_compression(job: _Job, work: Workload, fixes: Pins, best: Plan, best_est: Estimate,
                        rows: list[dict]) -> tuple[Plan, list[dict], tuple[str, ...]]:
    """ZeRO or compression, decided in one model: what a job compresses is the gradient all-reduce of
    plain DDP (the DDP communication hook, ``planner.export.comm_hook``: ZeRO/FSDP reduce-scatter gradients and gather
    parameters, which no launcher's hook compresses). The best DDP layout (``dp_shard=1, zero=0``) is priced with
    the compression the hook applies (one level, on the GPU); the plan is that one when it beats the best layout
    of the search (ZeRO included), else the best layout, uncompressed, and the note says why."""
    if fixes.get("zero", 0) or fixes.get("dp_shard", 1) != 1:
        raise MeshplanError(f"--compress compresses the gradient all-reduce of plain DDP; --fix zero="
                            f"{fixes.get('zero', 0)} / dp_shard={fixes.get('dp_shard', 1)} shard gradients instead "
                            "(drop them, or drop --compress)")
    try:
        ddp = search(work, fixes.with_(dp_shard=1, zero=0), top=1, estimator=job.estimator)
    except MeshplanError as exc:
        note = f"compression: not chosen; plain DDP, the layout gradient compression applies to, has no plan ({exc})"
        return best, rows, (note,)
    ddp_layout, ddp_est = ddp.ranked[0]
    ddp_plan = to_plan(work, ddp_layout, ddp_est, job.name, job.request.model, job.estimator.name)
    compressed, notes = _with_compression(job, ddp_plan, work, ddp_est)
    step = compressed.prediction.step_time_s
    if compressed.compression and step < best_est.step_time_s:
        p = compressed.prediction
        row = {**layout_row(ddp_layout, ddp_est), "step_time_s": step, "tokens_per_s": p.tokens_per_s,
               "mfu": p.mfu, "tflops_per_device": p.tflops_per_device, "compressed": True}
        return compressed, [row] + rows, notes
    why = ("no bucket gains from compressing" if not compressed.compression else
           f"DDP with compression {step:.4g} s vs {best_est.step_time_s:.4g} s for {rows[0]['layout']}")
    return best, rows, (f"compression: not chosen ({why}); the plan is the best layout, uncompressed",)


def _with_compression(job: _Job, plan: Plan, work: Workload, est: Estimate) -> tuple[Plan, tuple[str, ...]]:
    """``plan`` with the per-bucket compression the solver chooses, and its saving applied to the prediction."""
    # CP-SAT (ortools, and the pandas it loads: 0.35 s) is imported where a plan asks for it, not by every search
    from meshplan.planner.search.solve.compression import solve_compression

    # only what a launcher applies: one-level, on-GPU choices (the DDP hook; targets name the rest unapplied)
    res = solve_compression(work.model, work.cluster, work.global_batch, work.seq_len,
                            error_budget=job.request.options.error_budget, estimator=job.estimator,
                            hook_choices_only=True)
    saving = max(0.0, res.baseline_step_s - res.step_s)
    saving = min(saving, est.exposed_comm_s)  # never more than the exposed communication there is
    step = est.step_time_s - saving
    p = plan.prediction
    scale = est.step_time_s / step
    pred = p.model_copy(update={
        "step_time_s": step, "tokens_per_s": p.tokens_per_s * scale, "mfu": p.mfu * scale,
        "tflops_per_device": p.tflops_per_device * scale, "hw_tflops_per_device": p.hw_tflops_per_device * scale,
        "breakdown": p.breakdown.model_copy(update={"exposed_comm_s": p.breakdown.exposed_comm_s - saving}),
    })
    sol = res.solution
    chosen = tuple(b for b in sol.buckets if b.method != "none")  # a bucket not listed is all-reduced as is
    if not chosen or saving <= 0.0:
        return plan, ()
    note = (f"compression: {len(chosen)} of {len(sol.buckets)} buckets compressed, predicted step {step:.4g} s "
            f"vs {est.step_time_s:.4g} s uncompressed (solver {sol.status.status}, gradient error {sol.error:.3g})")
    return plan.model_copy(update={"compression": chosen, "prediction": pred,
                                   "notes": plan.notes + (note,)}), (note,)


def _solver_plan(job: _Job) -> PlanOutcome:
    """The CP-SAT solvers' plan (heterogeneous clusters, serving, per-layer precision)."""
    quality_budget = job.request.options.quality_budget
    asked = quality_budget is not None
    if not asked:
        # Precision is lowered only when asked: without --quality-budget no layer may cost quality, so every layer
        # keeps the 16-bit reference precision (each lower one has a positive indicator).
        quality_budget = 0.0
    try:
        return _solve_and_save(job, quality_budget)
    except MeshplanError as exc:
        if asked:
            raise
        raise MeshplanError(f"without --quality-budget every layer stays 16-bit, and then: {exc} (pass "
                            "--quality-budget to allow fp8/int8/int4 layers)", exc.exit_code) from None


def _solve_and_save(job: _Job, quality_budget: float) -> PlanOutcome:
    """Solve, write the plan and return its rows: the solution and the solvers' baselines."""
    res = _solve(job, quality_budget)
    spec, clus, req = job.spec, job.cluster, job.request
    global_batch, seq_len, workload, gen_len = req.global_batch, req.seq_len, req.workload, req.options.gen_len
    name, model_arg, dtype = job.name, req.model, job.dtype
    fields = res.plan_fields()
    world = clus.world_size
    if dtype in ("bf16", "fp16"):  # the 16-bit type every device has (T4, V100: fp16), as the solver priced it
        dtype = base_dtype([g.device for g in clus.groups])
    if res.stages:
        # each stage runs on one node with tensor parallel over that node's devices (the solver's pricing)
        widths = sorted({clus.groups[st.device_group].devices_per_node for st in res.stages})
        pp, dp = len(res.stages), 1
        tp = widths[0] if len(widths) == 1 else 1
        notes = fields["notes"] + (("tensor parallel inside each stage's node: tp = that node's devices"
                                    + ("" if len(widths) == 1 else f" ({', '.join(map(str, widths))}: uneven, "
                                       "recorded per stage by its device group)")),)
    else:
        pp, tp, dp = 1, 1, world
        notes = fields["notes"]
    mem = res.detail.get("stage_memory_bytes") or (0,)
    tokens = global_batch * (gen_len if workload == "serve" else seq_len)
    flops = spec.model_flops_per_token(seq_len) * tokens / (3.0 if workload == "serve" else 1.0)
    peak_sum = sum(g.nodes * g.devices_per_node * g.device.peak_flops.get(dtype, g.device.peak_flops.get(
        "fp16", max(g.device.peak_flops.values()))) for g in clus.groups)
    pred = Prediction(step_time_s=res.time_s, tokens_per_s=res.tokens_per_s,
                      tflops_per_device=flops / res.time_s / world / 1e12,
                      hw_tflops_per_device=flops / res.time_s / world / 1e12, mfu=flops / res.time_s / peak_sum,
                      peak_memory_bytes=int(max(mem)),
                      breakdown=Breakdown(compute_s=res.time_s, exposed_comm_s=0.0, bubble_s=0.0),
                      costmodel=job.estimator.name)
    plan = Plan(name=name, model=model_ref(spec, model_arg), cluster=clus.to_ref(), global_batch=global_batch,
                micro_batch=max(1, fields["micro_batch"]), seq_len=seq_len,
                degrees=Degrees(dp_replicate=dp, tp=tp, pp=pp), dtype=dtype,
                layer_precision=fields["layer_precision"], stages=fields["stages"], prediction=pred,
                meshplan_version=meshplan_version(), notes=notes + (f"workload={res.workload}",))
    write_checked(job.path, plan.to_yaml(), job.before)
    row = {"layout": _solver_layout(res), "workload": res.workload, "step_time_s": res.time_s,
           "tokens_per_s": res.tokens_per_s, "tflops_per_device": pred.tflops_per_device, "mfu": pred.mfu,
           "peak_memory_bytes": pred.peak_memory_bytes, "quality": res.quality, "dp_replicate": dp, "dp_shard": 1,
           "dp": dp, "tp": tp, "pp": pp, "vpp": 1, "cp": 1, "ep": 1, "solver_status": res.status.status,
           "hit_time_limit": res.status.hit_time_limit, "best_bound_s": res.status.best_bound}
    rows = [row] + [{"layout": f"baseline: {k}", "tokens_per_s": v[0], "quality": v[1]}
                    for k, v in res.baselines.items()]
    title = (f"{spec.name} on {clus.spec} ({res.workload}): batch {global_batch}, seq {seq_len} — CP-SAT "
             f"{res.status.status}" + (" (time limit hit)" if res.status.hit_time_limit else ""))
    return PlanOutcome(title, rows, plan, job.path, notes)


def _solve(job: _Job, quality_budget: float):
    """The solver's result for ``job`` (serving: LLM-PQ; training: the heterogeneous partition or QSync)."""
    from meshplan.planner.search.solve.precision import solve_hetero_train, solve_serve  # CP-SAT: see above

    req = job.request
    if req.workload == "serve":
        return solve_serve(job.spec, job.cluster, req.global_batch, req.seq_len, req.options.gen_len,
                           quality_budget=quality_budget, sensitivity=req.options.sensitivity,
                           estimator=job.estimator)
    return solve_hetero_train(job.spec, job.cluster, req.global_batch, req.seq_len, quality_budget=quality_budget,
                              sensitivity=req.options.sensitivity, estimator=job.estimator)


def _solver_layout(res) -> str:
    if res.stages:
        return " | ".join(f"L{s.first_layer}-{s.first_layer + s.num_layers - 1}@g{s.device_group}"
                          for s in res.stages)
    return "data parallel (QSync): " + ", ".join(f"{k}:{v}" for k, v in res.detail.get("group_precision",
                                                                                         {}).items())
