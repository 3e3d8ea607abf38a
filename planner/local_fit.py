"""Learning from its own runs (issue 6 item 5) for the CPU path: per-micro-batch overhead and sync waits.

``planner.estimate_cpu`` prices a collective or a pipeline send/recv with the calibrated gloo alpha-beta:
the transfer on an idle link. In a real run a rank also waits at every synchronisation point for its peer to
arrive: ranks drift apart by scheduler noise and uneven work, so a 2-rank FSDP step with 23 collectives spends
far more in ``gloo:*`` than 23 transfers (issue 6 measurements, see the report). That wait depends on the host,
not on the plan, so it is learned from a measured run and applied to every later ``local:N`` plan:

    sync_wait_s = max(0, (measured comm + bubble) / contention - (predicted comm + bubble)) / sync points

per step of the run's critical rank, in free-core seconds (the run's contention, ``planner.contention``, is
divided out), where the sync points are the collectives the trace holds per step (a pipeline stage's wait in
recv is its bubble, which the estimate prices itself; a run without collectives keeps the earlier figure).
The same run also prices what a training step does beyond the timed blocks (wrapper hooks per module,
autograd bookkeeping across blocks, the trainer's own Python), per layer and micro-batch of a stage:

    layer_overhead_s = max(0, measured compute / contention - predicted compute) / (micro-batches x layers)

Both figures are stored beside the host calibration (``local-fit.json``) and added by ``estimate_cpu`` (once
per sync point, once per layer and micro-batch) to every later ``local:N`` plan. ``meshplan check PLAN RUN --learn``
fits them.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from planner.atomic import write_atomic
from planner.errors import MeshplanError

FIT_VERSION = 1


def fit_file() -> Path:
    """``$MESHPLAN_LOCAL_FIT_FILE``, else ``local-fit.json`` beside the host calibration."""
    import os

    from planner.calibrate import cache_dir

    env = os.environ.get("MESHPLAN_LOCAL_FIT_FILE")
    return Path(env) if env else cache_dir() / "local-fit.json"


def learned() -> dict:
    """``{"sync_wait_s", "layer_overhead_s"}`` learned on this host, free-core seconds (zeros before any
    fit, or when ``MESHPLAN_NO_LOCAL_FIT`` is set: tests that must not depend on what this host learned set it)."""
    import os

    from planner.calibrate import _fingerprint

    zero = {"sync_wait_s": 0.0, "layer_overhead_s": 0.0}
    if os.environ.get("MESHPLAN_NO_LOCAL_FIT"):
        return zero
    try:
        rec = json.loads(fit_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return zero
    if rec.get("version") != FIT_VERSION or rec.get("fingerprint") != _fingerprint():
        return zero
    return {k: max(0.0, float(rec.get(k, 0.0))) for k in zero}


def sync_wait_s() -> float:
    """The learned wait per synchronisation point, free-core seconds (see :func:`learned`)."""
    return learned()["sync_wait_s"]


def _sync_points_per_step(run_dir, rank: int) -> float:
    from profiler.runs import load_run

    t = load_run(run_dir).ranks[rank]
    from planner.run_breakdown import P2P

    counts = {s: 0 for s in t.steps}
    for e in t.events:
        if e.kind == "comm" and e.step in counts and e.coll not in P2P:  # p2p waits are the bubble
            counts[e.step] += 1
    return statistics.median(counts.values()) if counts else 0.0


def _unfitted_estimate(plan):
    """``Estimate`` of the plan's layout on this host with no learned figures (``MESHPLAN_NO_LOCAL_FIT``)."""
    import os

    from planner.search import estimate_plan

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
    """Fit ``sync_wait_s`` from one measured run of a ``local:N`` plan (and store it unless ``save`` is False).

    Returns:
        ``{"sync_wait_s", "layer_overhead_s", "sync_points", "microbatches", "contention", ...}``.

    Raises:
        MeshplanError: not a local plan, or a run without repeated operators to measure its contention.
    """
    from planner.calibrate import _fingerprint
    from planner.check import check
    from planner.contention import run_contention
    from planner.plan import load_plan

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
    b = _unfitted_estimate(plan)  # the plan re-priced without what any earlier fit added
    n = _sync_points_per_step(run_dir, res.breakdown_rank)
    old = learned()
    m = plan.grad_accum
    layers = plan.model.num_layers // plan.degrees.pp  # layers of a stage (train_gpt splits them evenly)
    predicted_wait = b.exposed_comm_s + b.bubble_s
    predicted_compute = b.compute_s + b.other_s
    measured_wait = (meas["exposed comm"] + meas["bubble"]) / f
    measured_compute = meas["compute"] / f
    out = {"sync_wait_s": max(0.0, (measured_wait - predicted_wait) / n) if n > 0 else old["sync_wait_s"],
           "layer_overhead_s": max(0.0, (measured_compute - predicted_compute) / (m * layers)),
           "sync_points": n, "microbatches": m, "layers": layers, "contention": f, "measured_wait_s": measured_wait,
           "predicted_wait_s": predicted_wait, "measured_compute_s": measured_compute,
           "predicted_compute_s": predicted_compute, "rank": res.breakdown_rank}
    if save:
        write_atomic(fit_file(), json.dumps({"version": FIT_VERSION, "fingerprint": _fingerprint(),
                                             "fitted_from": str(run_dir), **out}, indent=2) + "\n")
    return out


def local_plan_of_run(run_dir: str | Path):
    """The ``local:N`` plan file a profiled run was launched with (``meshplan profile --from-plan``), or None."""
    from planner.check import launched_plan_path, load_measured
    from planner.plan import load_plan

    try:
        run = load_measured(run_dir)
    except MeshplanError:
        return None  # a bare trace or folder of traces: no run.json, so no plan
    found = launched_plan_path(run)
    if found is None or not load_plan(found[0]).cluster.spec.lower().startswith("local:"):
        return None
    return found[0]


def fit_runs_local(runs: list[str | Path], save: bool = True) -> dict:
    """Fit the host's figures on every run launched from a ``local:N`` plan; the median over runs is stored.

    Returns:
        ``{"sync_wait_s", "layer_overhead_s", "runs": [per-run fit_run() dicts with "run" and "plan"]}``;
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
    from planner.calibrate import _fingerprint

    out = {k: statistics.median(p[k] for p in per) for k in ("sync_wait_s", "layer_overhead_s")}
    if save:
        write_atomic(fit_file(), json.dumps({"version": FIT_VERSION, "fingerprint": _fingerprint(),
                                             "fitted_from": [p["run"] for p in per], **out}, indent=2) + "\n")
    return {**out, "runs": per}
