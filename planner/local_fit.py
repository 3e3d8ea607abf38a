"""Learning from its own runs (issue 6 item 5) for the CPU path: the host's compute ratio and sync waits.

``planner.estimate_cpu`` prices a step from blocks timed on a free core (the fastest repetition), the calibrated
in-step collectives and counted framework work; ``meshplan check --contention`` scales the CPU part by the run's
contention factor (``planner.contention``: traced over fastest call of its repeated operators). Both use the
fastest of noisy samples, and what that leaves of a real run is learned from measured runs, as terms every
plan shares, so what one plan teaches transfers to the others:

* ``compute_scale``: measured compute / contention / priced compute of a run: how far this host's real steps
  sit from the free-core pricing, all CPU work alike (blocks, framework work, optimizer; the pipeline bubble is
  the other stages' compute). Measured here on unprofiled steps: 0.84-0.96 over DDP, FSDP, TP and PP runs (the
  contention factor of a traced run overstates the slowdown a little). Any run teaches it.
* ``sync_wait_s``: per collective the rank waits on, the time ranks drift apart by scheduler noise and uneven
  work. Learned only from runs with at least ``MIN_SYNC_POINTS`` collectives per step: a 2-collective DDP step
  holds a few milliseconds of it, noise that would be multiplied by the 50 collectives of a TP step.

For a run of plan P, with the run's contention f divided out and P re-priced with no learned term
(``planner.search.estimate_plan``):

    compute_scale = ((measured step - comm - bubble) / f) / predicted compute   (kept within [0.5, 2])
    sync_wait_s   = max(0, measured comm + bubble / f - predicted (comm + bubble x scale)) / sync points

(the pipeline bubble is in the second line because a stage's wait in recv is measured as comm or bubble
depending on where it falls). Each fit updates the terms its run informs and keeps the others
(``local-fit.json`` beside the host calibration); ``meshplan costmodel fit --runs RUN`` and ``meshplan check
PLAN RUN --learn`` fit them.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from meshplan.core.atomic import write_atomic
from meshplan.core.errors import MeshplanError

FIT_VERSION = 3  # 2: per-mechanism terms, sync wait only from runs with enough collectives; 3: compute_scale
# (judged on unprofiled steps, the runs' compute sat below the contention-scaled pricing: additive overheads
# that could only grow could not learn that)
TERMS = ("sync_wait_s", "compute_scale")
NEUTRAL = {"sync_wait_s": 0.0, "compute_scale": 1.0}
SCALE_RANGE = (0.5, 2.0)
MIN_SYNC_POINTS = 8  # collectives per step a run needs to teach sync_wait_s


def fit_file() -> Path:
    """``$MESHPLAN_LOCAL_FIT_FILE``, else ``local-fit.json`` beside the host calibration."""
    import os

    from meshplan.core.cache import cache_dir

    env = os.environ.get("MESHPLAN_LOCAL_FIT_FILE")
    return Path(env) if env else cache_dir() / "local-fit.json"


def learned() -> dict:
    """``{term: value}`` for ``TERMS`` learned on this host (``sync_wait_s`` in free-core seconds, ``compute_scale``
    a ratio); ``NEUTRAL`` before any fit, or when ``MESHPLAN_NO_LOCAL_FIT`` is set (tests that must not depend
    on what this host learned set it)."""
    import os

    from meshplan.planner.calibrate import _fingerprint

    if os.environ.get("MESHPLAN_NO_LOCAL_FIT"):
        return dict(NEUTRAL)
    try:
        rec = json.loads(fit_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return dict(NEUTRAL)
    if rec.get("version") != FIT_VERSION or rec.get("fingerprint") != _fingerprint():
        return dict(NEUTRAL)
    try:
        return {"sync_wait_s": max(0.0, float(rec.get("sync_wait_s", 0.0))),
                "compute_scale": _clamp_scale(float(rec.get("compute_scale", 1.0)))}
    except (TypeError, ValueError):
        return dict(NEUTRAL)


def _clamp_scale(x: float) -> float:
    return min(max(x, SCALE_RANGE[0]), SCALE_RANGE[1])


def _sync_points_per_step(run_dir, rank: int) -> float:
    from meshplan.profiler.runs import load_run

    t = load_run(run_dir).ranks[rank]
    from meshplan.planner.run_breakdown import P2P

    counts = {s: 0 for s in t.steps}
    for e in t.events:
        if e.kind == "comm" and e.step in counts and e.coll not in P2P:  # p2p waits are the bubble
            counts[e.step] += 1
    return statistics.median(counts.values()) if counts else 0.0


def _unfitted_estimate(plan):
    """``Estimate`` of the plan's layout on this host with no learned figures (``MESHPLAN_NO_LOCAL_FIT``)."""
    import os

    from meshplan.planner.search import estimate_plan

    was = os.environ.get("MESHPLAN_NO_LOCAL_FIT")
    os.environ["MESHPLAN_NO_LOCAL_FIT"] = "1"
    try:
        return estimate_plan(plan)
    finally:
        if was is None:
            os.environ.pop("MESHPLAN_NO_LOCAL_FIT", None)
        else:
            os.environ["MESHPLAN_NO_LOCAL_FIT"] = was


def fit_run(plan_path: str | Path, run_dir: str | Path, save: bool = True) -> dict:
    """Fit the terms one measured run of a ``local:N`` plan teaches (and store them unless ``save`` is False).

    Returns:
        Every term of ``TERMS`` (taught ones updated, the rest as learned before), ``taught`` (their names),
        and the figures behind them: ``sync_points``, ``microbatches``, ``layers``, ``contention``, measured and
        predicted compute and wait (seconds, free-core).

    Raises:
        MeshplanError: not a local plan, or a run without repeated operators to measure its contention.
    """
    from meshplan.planner.check import check
    from meshplan.planner.contention import run_contention
    from meshplan.planner.plan import load_plan

    plan = load_plan(plan_path)
    if not plan.cluster.spec.lower().startswith("local:"):
        raise MeshplanError(f"{plan_path}: --learn fits the local:N CPU path; this plan is for "
                            f"{plan.cluster.spec}")
    f, _ = run_contention(run_dir)
    if f is None:
        raise MeshplanError(f"{run_dir}: the traces hold too few repeated operators (record_shapes off?), so the "
                            f"run's contention is unknown")
    res = check(plan_path, run_dir, 1.0, breakdown=True, contention=None)
    meas = {p["phase"]: p["measured_s"] for p in res.phases}
    b = _unfitted_estimate(plan)  # the plan re-priced without any learned term
    n = _sync_points_per_step(run_dir, res.breakdown_rank)
    old = learned()
    m = plan.grad_accum
    layers = plan.model.num_layers // plan.degrees.pp  # layers of a stage (train_gpt splits them evenly)
    predicted_compute = b.compute_s + b.other_s
    measured_wait = meas["exposed comm"] + meas["bubble"] / f  # comm prices are host-measured: not scaled
    # the step's CPU part: the measured step (unprofiled when the run has such steps) less the traced waits; the
    # traced compute phase alone misses what lies between the phase medians and the step (10-20 ms a DDP step)
    measured_compute = max(0.0, res.measured_s - meas["exposed comm"] - meas["bubble"]) / f
    scale = _clamp_scale(measured_compute / predicted_compute)
    taught = {"compute_scale": scale}
    predicted_wait = b.exposed_comm_s + b.bubble_s * scale
    if n >= MIN_SYNC_POINTS:
        taught["sync_wait_s"] = max(0.0, (measured_wait - predicted_wait) / n)
    out = {**old, **taught, "taught": sorted(taught), "sync_points": n, "microbatches": m, "layers": layers,
           "contention": f, "measured_wait_s": measured_wait, "predicted_wait_s": predicted_wait,
           "measured_compute_s": measured_compute, "predicted_compute_s": predicted_compute,
           "rank": res.breakdown_rank}
    if save:
        _save({k: out[k] for k in TERMS}, [str(run_dir)])
    return out


def _save(terms: dict, runs: list[str]) -> None:
    from meshplan.planner.calibrate import _fingerprint

    write_atomic(fit_file(), json.dumps({"version": FIT_VERSION, "fingerprint": _fingerprint(),
                                         "fitted_from": runs, **terms}, indent=2) + "\n")


def local_plan_of_run(run_dir: str | Path):
    """The ``local:N`` plan file a profiled run was launched with (``meshplan profile --from-plan``), or None."""
    from meshplan.planner.check import launched_plan_path, load_measured
    from meshplan.planner.plan import load_plan

    try:
        run = load_measured(run_dir)
    except MeshplanError:
        return None  # a bare trace or folder of traces: no run.json, so no plan
    found = launched_plan_path(run)
    if found is None or not load_plan(found[0]).cluster.spec.lower().startswith("local:"):
        return None
    return found[0]


def fit_runs_local(runs: list[str | Path], save: bool = True) -> dict:
    """Fit the host's terms on every run launched from a ``local:N`` plan and store them (per term, the median of
    the runs that teach it; terms no run teaches keep their earlier value).

    Returns:
        ``{term: s for TERMS, "runs": [per-run fit_run() dicts with "run" and "plan"]}``;
        ``runs`` is empty when none of them is a local plan's run (nothing is stored then).
    """
    per = []
    for r in runs:
        if not Path(r).exists():
            raise MeshplanError(f"{r}: run folder not found")
        plan = local_plan_of_run(r)
        if plan is not None:
            per.append({"run": str(r), "plan": str(plan), **fit_run(plan, r, save=False)})
    if not per:
        return {"runs": []}
    terms = learned()
    for k in TERMS:  # a term only moves when some run taught it: the median of what those runs say
        said = [p[k] for p in per if k in p["taught"]]
        if said:
            terms[k] = statistics.median(said)
    if save:
        _save(terms, [p["run"] for p in per])
    return {**terms, "runs": per}


def learned_line(fit: dict) -> str:
    """One line naming every term a fit holds (ms), the ones it was taught marked."""
    taught = set(fit.get("taught", TERMS))
    parts = [f"wait per collective {1e3 * fit['sync_wait_s']:.2f} ms", f"compute scale {fit['compute_scale']:.3f}"]
    return ", ".join(p + ("" if k in taught else " (kept)") for p, k in zip(parts, TERMS))
