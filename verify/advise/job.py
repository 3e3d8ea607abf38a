"""``meshplan advise RUN`` as one library call: infer the layout that ran, calibrate on the run, re-price it against
the measured step, search, write the best plan with the decisions that changed and their share of the gain, and
export it.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from meshplan.core.atomic import refuse_overwrite, write_atomic
from meshplan.core.errors import MeshplanError
from meshplan.costmodel.api import Pricer
from meshplan.costmodel.devices import get_device
from meshplan.planner.cluster.spec import load_cluster
from meshplan.planner.estimate.base import Workload
from meshplan.planner.estimate.select import estimator_for
from meshplan.planner.export import EXTENSIONS, export_file, get_target
from meshplan.planner.host.terms import Host
from meshplan.planner.layout.layout import Degrees, Layout
from meshplan.planner.layout.space import Pins, fp8_recipe_choices
from meshplan.planner.model.config import load_model
from meshplan.planner.plan.build import to_plan
from meshplan.planner.search.exact import search
from meshplan.profiler.runs import Run, load_run
from meshplan.verify.advise.attribute import ATTRIBUTION, Change, attribute
from meshplan.verify.advise.calibrate import Calibration, calibrate, measured_step_s
from meshplan.verify.advise.evidence import rank_evidence
from meshplan.verify.advise.infer import InferredLayout, infer_layout
from meshplan.verify.advise.readable import missing
from meshplan.verify.advise.shape import hf_config


@dataclass(frozen=True)
class AdviseRequest:
    """What ``meshplan advise`` was asked: the run, and optionally the cluster, model, export target and plan
    path (default ``plans/<name>-advised.yaml``)."""

    run: Path
    cluster: Optional[str] = None
    model: Optional[str] = None
    to: Optional[str] = None
    out: Optional[Path] = None
    plans_dir: Path = Path("plans")
    in_run_terms: bool = True  # local:N: host terms in the run's own conditions (verify.advise.calibrate)


@dataclass
class Advice:
    """The answer: what ran (inferred, priced, measured), the best plan, the changes and their shares."""

    run: str
    inferred: InferredLayout
    cluster: str
    model: str
    ran_layout: str
    measured_s: float
    measured_from: str
    ran_predicted_s: float
    best_layout: str
    best_predicted_s: float
    plan_path: Path
    changes: list[Change]
    calibration: list[str]
    export: Optional[Path] = None
    export_warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def price_error(self) -> float:
        """(measured - predicted) / predicted of the layout that ran."""
        return (self.measured_s - self.ran_predicted_s) / self.ran_predicted_s

    @property
    def gain(self) -> float:
        """Predicted speed-up of the advised layout over the one that ran, as a fraction of the ran step."""
        return (self.ran_predicted_s - self.best_predicted_s) / self.ran_predicted_s

    @property
    def still_best(self) -> bool:
        return not self.changes or self.gain <= 0.0

    def as_dict(self) -> dict:
        return {"run": self.run, "inferred": self.inferred.as_dict(), "cluster": self.cluster, "model": self.model,
                "ran_layout": self.ran_layout, "measured_step_s": self.measured_s,
                "measured_from": self.measured_from, "ran_predicted_step_s": self.ran_predicted_s,
                "price_error": self.price_error, "best_layout": self.best_layout,
                "best_predicted_step_s": self.best_predicted_s, "predicted_gain": self.gain,
                "still_best": self.still_best, "plan": str(self.plan_path), "attribution": ATTRIBUTION,
                "changes": [c.as_dict() for c in self.changes], "calibration": self.calibration,
                "export": str(self.export) if self.export else None, "export_warnings": self.export_warnings,
                "notes": self.notes}


def cluster_of(run: Run, world: int) -> str:
    """The cluster the run ran on: ``local:N`` for CPU traces, else ``nodes x devices x GPU`` from the traces'
    ``deviceProperties`` (devices one process sees = devices per node)."""
    t = next(iter(run.ranks.values()))
    if not t.has_gpu:
        return f"local:{world}"
    if not t.devices:
        raise MeshplanError(f"{run.source}: the traces name no GPU (deviceProperties); pass --cluster")
    per_node = min(len(t.devices), world)
    name = get_device(t.devices[0]).name
    return f"{max(1, world // per_node)}x{per_node}x{name}"


def _stack(run: Run) -> str:
    """The training code whose kernels ran: Megatron-Core's tensor-parallel linears, torch.compile regions, or
    plain PyTorch."""
    names = {e.name for t in run.ranks.values() for e in t.events[:200000] if e.cat == "cpu_op"}
    if any(n.startswith(("LinearWithGradAccumulation", "_ReduceFromModelParallelRegion")) for n in names):
        return "megatron"
    if "Torch-Compiled Region" in names:
        return "torchtitan"
    return "eager"


def ran_layout(inf: InferredLayout, stack: str, num_experts: int = 0) -> Layout:
    """The ``Layout`` the inferred parts describe (what the trace cannot show stays at its default). CUDA graphs
    follow Megatron-Core's capture rules: it graphs a fully recomputed layer only within the whole iteration, and a
    dropless MoE model's whole iteration only behind Hybrid-EP's sync-free dispatch (the one such dispatcher), so a
    run that replayed it must have run that."""
    v = inf.value
    deg = Degrees(dp_replicate=v("dp_replicate"), dp_shard=v("dp_shard"), tp=v("tp"), pp=v("pp"), ep=v("ep"))
    graphs = v("cuda_graphs", "none")
    if graphs == "layers" and v("recompute") == "full":
        graphs = "iteration"
    more = {"moe_dispatcher": "hybridep"} if graphs == "iteration" and num_experts else {}
    return Layout.of(deg, micro_batch=v("micro_batch", 1), zero_stage=v("zero"), recompute=v("recompute"),
                     fp8=v("fp8"), stack=stack, sequence_parallel=bool(v("sp", False)), cuda_graphs=graphs, **more)


def _label(lay: Layout) -> str:
    parts = [f"dp={lay.dp_replicate}x{lay.dp_shard}", f"tp={lay.tp}", f"pp={lay.pp}"]
    parts += [f"{k}={getattr(lay, k)}" for k in ("vpp", "cp", "ep") if getattr(lay, k) != 1]
    parts += [f"mbs={lay.micro_batch}", f"zero={lay.zero_stage}", f"recompute={lay.recompute}"]
    return " ".join(parts + (["sp"] if lay.sequence_parallel else []))


def _model(req: AdviseRequest, inf: InferredLayout, name: str, stack: str) -> str:
    """``--model``, else the inferred shape written as a HF config.json beside the plan."""
    if req.model:
        return req.model
    cfg = hf_config(inf.shape, inf.value("tp"), inf.value("pp"), vocab_parallel=stack == "megatron",
                    global_linears=inf.dtensor)
    path = (req.out.parent if req.out else req.plans_dir) / f"{name}-config.json"
    write_atomic(path, json.dumps(cfg, indent=1) + "\n")
    return str(path)


def advise(req: AdviseRequest, host_for=lambda spec: Host()) -> Advice:
    """Advise on ``req.run``; ``host_for(cluster_spec)`` gives this host's calibration and terms for ``local:N``
    (``planner.host.terms.load_host``; the CLI passes it in).

    Raises:
        MeshplanError: traces advice cannot read (one line saying what is missing), or bad inputs.
    """
    if req.to:
        get_target(req.to)  # an unknown target is refused before the run is read
    run = load_run(req.run)
    world = run.world_size or len(run.ranks)
    evs = [rank_evidence(t) for t in run.ranks.values()]
    inf = infer_layout(evs, world)
    lack = missing(str(req.run), evs, inf, world, req.model is not None)
    if lack:
        raise MeshplanError(lack)
    stack = _stack(run)
    spec = req.cluster or cluster_of(run, world)
    name = f"{Path(req.run).resolve().name}-advised"
    out = req.out or req.plans_dir / f"{name}.yaml"
    model = _model(req, inf, name, stack)
    measured_s, measured_from = measured_step_s(Path(req.run), run)
    host = host_for(spec) if spec.startswith("local:") else Host()
    cal = calibrate(Path(req.run), run, host, out.parent / f"{name}-costmodel", spec.startswith("local:"),
                    measured_s, req.in_run_terms)
    return _search(req, inf, stack, spec, model, out, cal, measured_s, measured_from)


def _search(req, inf, stack, spec, model, out, cal: Calibration, measured_s, measured_from) -> Advice:
    """Re-price the layout that ran, search, attribute, export."""
    v = inf.value
    seq, gb, dtype = v("seq_len"), v("global_batch"), v("dtype")
    cluster = load_cluster(spec, calibration=cal.host.calibration)
    estimator = estimator_for(cluster, Pricer.from_dir(cal.costmodel), cal.host.terms)
    work = Workload(load_model(model), cluster, gb, seq, dtype)
    ran = ran_layout(inf, stack, work.model.num_experts)

    def priced(lay: Layout):
        try:
            lay.validate(world_size=cluster.world_size, num_layers=work.model.num_layers,
                         num_heads=work.model.num_heads, num_kv_heads=work.model.num_kv_heads, seq_len=seq,
                         global_batch=gb, num_experts=work.model.num_experts)
            return estimator.estimate(work, lay)
        except MeshplanError:
            return None

    def price(lay: Layout) -> Optional[float]:  # a layout that can run: valid and within memory
        est = priced(lay)
        return est.step_time_s if est is not None and est.fits else None

    def step_of(lay: Layout) -> Optional[float]:  # a point on the attribution's way: memory aside
        est = priced(lay)
        return est.step_time_s if est is not None else None

    ran_s = price(ran)
    if ran_s is None:
        raise MeshplanError(f"{req.run}: the inferred layout ({_label(ran)}) does not price on {spec} (invalid or "
                            "over memory there); pass --model or --cluster")
    notes = list(cal.notes)
    if cal.free_core is not None:  # the terms are fitted on this run's step: the free-core price says more of the model
        free_s = estimator_for(cluster, estimator.pricer, cal.free_core).estimate(work, ran).step_time_s
        notes.append(f"with free-core terms the layout that ran prices {1e3 * free_s:.1f} ms: "
                     f"{100 * (measured_s - free_s) / free_s:+.1f}% to its measured step")
    # one estimator prices the layout that ran, every candidate and every step of the attribution: a local:N
    # estimator times operators on this host as it goes, so two estimators would price the same layout twice
    result = search(work, Pins.of({"stack": stack}), top=5, estimator=estimator,
                    fp8_recipes=fp8_recipe_choices(dtype, cluster.device))
    best, best_est = result.ranked[0]
    best_s = best_est.step_time_s
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", out.stem).lstrip("-._")[:128] or "advised"  # a plan name's alphabet
    plan = to_plan(work, best, best_est, name, model, estimator.name)
    refuse_overwrite(out, {"RUN": req.run, "--model": model}, "--out")
    write_atomic(out, plan.to_yaml())
    changes = attribute(ran, best, step_of) if best_s < ran_s else []
    exported, warns = None, []
    if req.to:
        exported = out.with_name(f"{out.stem}.{req.to}.{EXTENSIONS[req.to]}")
        warns = list(export_file(out, req.to, exported).warnings)
    return Advice(str(req.run), inf, spec, model, _label(ran), measured_s, measured_from, ran_s, _label(best),
                  best_s, out, changes, notes, exported, warns,
                  [f"search: {result.feasible} of {result.evaluated} layouts priced fit, of {result.candidates:,}",
                   *getattr(getattr(estimator, "pricer", None), "warnings", ())])
