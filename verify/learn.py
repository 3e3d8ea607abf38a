"""Learning from its own runs for the CPU path: the host's compute ratio and sync waits.

``planner.estimate.cpu`` prices a step from blocks timed on a free core (the fastest repetition), the calibrated
in-step collectives and counted framework work; ``meshplan check --contention`` scales the CPU part by the run's
contention factor (``verify.contention``: traced over fastest call of its repeated operators). Both use the
fastest of noisy samples, and what that leaves of a real run is learned from measured runs, as terms every
plan shares (``planner.host.terms.HostTerms``), so what one plan teaches transfers to the others:

* ``compute_scale``: measured compute / contention / priced compute of a run: how far this host's real steps
  sit from the free-core pricing, all CPU work alike (blocks, framework work, optimizer; the pipeline bubble is
  the other stages' compute). Measured here on unprofiled steps: 0.84-0.96 over DDP, FSDP, TP and PP runs (the
  contention factor of a traced run overstates the slowdown a little). Any run teaches it.
* ``sync_wait_s``: per collective the rank waits on, the time ranks drift apart by scheduler noise and uneven
  work. Learned only from runs with at least ``MIN_SYNC_POINTS`` collectives per step: a 2-collective DDP step
  holds a few milliseconds of it, noise that would be multiplied by the 50 collectives of a TP step.

For a run of plan P, with the run's contention f divided out and P re-priced with neutral terms (the CPU
estimator given ``NEUTRAL_TERMS``):

    compute_scale = ((measured step - comm - bubble) / f) / predicted compute   (kept within [0.5, 2])
    sync_wait_s   = max(0, measured comm + bubble / f - predicted (comm + bubble x scale)) / sync points

(the pipeline bubble is in the second line because a stage's wait in recv is measured as comm or bubble
depending on where it falls). Each fit updates the terms its run informs and keeps the others (the host's
terms file, ``planner.host.terms``); ``meshplan costmodel fit --runs RUN`` and ``meshplan check PLAN RUN --learn`` fit
them.
"""
from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

from meshplan.core.atomic import write_atomic
from meshplan.core.errors import MeshplanError
from meshplan.planner.cluster.spec import load_cluster
from meshplan.planner.estimate.base import Estimate, Workload
from meshplan.planner.estimate.select import estimator_for
from meshplan.planner.host.calibrate import Calibration, is_local_spec
from meshplan.planner.host.terms import NEUTRAL_TERMS, TERMS, HostTerms, clamp_scale, host_terms_record
from meshplan.planner.model.config import load_model
from meshplan.planner.plan.build import plan_layout
from meshplan.planner.plan.schema import Plan, load_plan
from meshplan.profiler.runs import Run
from meshplan.verify.breakdown import P2P
from meshplan.verify.check import check
from meshplan.verify.contention import run_contention
from meshplan.verify.measured import ProfiledRun, launched_plan_path, profiled

MIN_SYNC_POINTS = 8  # collectives per step a run needs to teach sync_wait_s


def _sync_points_per_step(traces: Run, rank: int) -> float:
    t = traces.ranks[rank]
    counts = {s: 0 for s in t.steps}
    for e in t.events:
        if e.kind == "comm" and e.step in counts and e.coll not in P2P:  # p2p waits are the bubble
            counts[e.step] += 1
    return statistics.median(counts.values()) if counts else 0.0


def unfitted_estimate(plan: Plan, calibration: Calibration) -> Estimate:
    """``Estimate`` of a ``local:N`` plan's layout on this host with neutral terms (nothing learned)."""
    cluster = load_cluster(plan.cluster.spec, calibration=calibration)
    work = Workload(load_model(plan.model.source), cluster, plan.global_batch, plan.seq_len, plan.dtype,
                    lora=plan.lora)
    return estimator_for(cluster, terms=NEUTRAL_TERMS).estimate(work, plan_layout(plan))


def fit_run(plan_path: str | Path, run_dir: str | Path | ProfiledRun, calibration: Calibration,
            before: HostTerms = NEUTRAL_TERMS) -> dict:
    """The terms one measured run of a ``local:N`` plan teaches (nothing is stored).

    Args:
        plan_path: The plan the run was launched with.
        run_dir: The ``meshplan profile`` folder, or that folder as already read (``verify.measured.ProfiledRun``).
        calibration: This host's calibration (``planner.host.calibrate``), to re-price the plan.
        before: The terms learned before; the ones this run does not teach are kept.

    Returns:
        Every term of ``planner.host.terms.TERMS`` (taught ones updated, the rest as ``before``), ``taught`` (their
        names), and the figures behind them: ``sync_points``, ``microbatches``, ``layers``, ``contention``,
        measured and predicted compute and wait (seconds, free-core).

    Raises:
        MeshplanError: not a local plan, or a run without repeated operators to measure its contention.
    """
    plan = load_plan(plan_path)
    if not is_local_spec(plan.cluster.spec):
        raise MeshplanError(f"{plan_path}: --learn fits the local:N CPU path; this plan is for "
                            f"{plan.cluster.spec}")
    run = profiled(run_dir)
    f, _ = run_contention(run.traces)
    if f is None:
        raise MeshplanError(f"{run.path}: the traces hold too few repeated operators (record_shapes off?), so the "
                            f"run's contention is unknown")
    res = check(plan_path, run, 1.0, breakdown=True, contention=None)
    meas = {p["phase"]: p["measured_s"] for p in res.phases}
    b = unfitted_estimate(plan, calibration)  # the plan re-priced without any learned term
    n = _sync_points_per_step(run.traces, res.breakdown_rank)
    m = plan.grad_accum
    layers = plan.model.num_layers // plan.degrees.pp  # layers of a stage (train_gpt splits them evenly)
    predicted_compute = b.compute_s + b.other_s
    measured_wait = meas["exposed comm"] + meas["bubble"] / f  # comm prices are host-measured: not scaled
    # the step's CPU part: the measured step (unprofiled when the run has such steps) less the traced waits; the
    # traced compute phase alone misses what lies between the phase medians and the step (10-20 ms a DDP step)
    measured_compute = max(0.0, res.measured_s - meas["exposed comm"] - meas["bubble"]) / f
    scale = clamp_scale(measured_compute / predicted_compute)
    taught = {"compute_scale": scale}
    predicted_wait = b.exposed_comm_s + b.bubble_s * scale
    if n >= MIN_SYNC_POINTS:
        taught["sync_wait_s"] = max(0.0, (measured_wait - predicted_wait) / n)
    return {**before.as_dict(), **taught, "taught": sorted(taught), "sync_points": n, "microbatches": m,
            "layers": layers, "contention": f, "measured_wait_s": measured_wait, "predicted_wait_s": predicted_wait,
            "measured_compute_s": measured_compute, "predicted_compute_s": predicted_compute,
            "rank": res.breakdown_rank}


def save_terms(path: str | Path, terms: HostTerms, runs: list[str]) -> Path:
    """Store ``terms`` for this host in ``path`` (``planner.host.terms.read_host_terms`` reads them back)."""
    return write_atomic(path, host_terms_record(terms, runs))


def terms_of(fit: dict) -> HostTerms:
    """The ``HostTerms`` a ``fit_run`` / ``fit_runs_local`` result holds."""
    return HostTerms(**{k: fit[k] for k in TERMS})


def local_plan_of_run(run_dir: str | Path | ProfiledRun):
    """The ``local:N`` plan file a profiled run was launched with (``meshplan profile --from-plan``), or None."""
    try:
        run = profiled(run_dir).measured
    except MeshplanError:
        return None  # a bare trace or folder of traces: no run.json, so no plan
    found = launched_plan_path(run)
    if found is None or not is_local_spec(load_plan(found[0]).cluster.spec):
        return None
    return found[0]


def fit_runs_local(runs: list[str | Path], calibration_of, before: HostTerms = NEUTRAL_TERMS) -> dict:
    """Fit the host's terms on every run launched from a ``local:N`` plan (per term, the median of the runs that
    teach it; terms no run teaches keep their value in ``before``). Nothing is stored.

    Args:
        runs: Run folders (others, e.g. bare traces, are skipped).
        calibration_of: Called once, when the first local run is found: this host's calibration.
        before: The terms learned before.

    Returns:
        ``{term: value for TERMS, "runs": [per-run fit_run() dicts with "run" and "plan"]}``; ``runs`` is empty
        when none of them is a local plan's run.
    """
    per, cal = [], None
    for r in runs:
        if not Path(r).exists():
            raise MeshplanError(f"{r}: run folder not found")
        read = ProfiledRun(r)  # run.json and the traces read once for both steps
        plan = local_plan_of_run(read)
        if plan is not None:
            cal = cal if cal is not None else calibration_of()
            per.append({"run": str(r), "plan": str(plan), **fit_run(plan, read, cal, before)})
    if not per:
        return {"runs": []}
    terms = before
    for k in TERMS:  # a term only moves when some run taught it: the median of what those runs say
        said = [p[k] for p in per if k in p["taught"]]
        if said:
            terms = replace(terms, **{k: statistics.median(said)})
    return {**terms.as_dict(), "runs": per}


def learned_line(fit: dict) -> str:
    """One line naming every term a fit holds (ms), the ones it was taught marked."""
    taught = set(fit.get("taught", TERMS))
    parts = [f"wait per collective {1e3 * fit['sync_wait_s']:.2f} ms", f"compute scale {fit['compute_scale']:.3f}"]
    return ", ".join(p + ("" if k in taught else " (kept)") for p, k in zip(parts, TERMS))
