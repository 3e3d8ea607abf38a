"""Prices calibrated on the run's own kernels, and the step the run measured.

GPU runs: ``costmodel fit`` on the run's op records (``verify.op_fit.fit_runs``: each host op's kernels, joined by
correlation id, as rows for the traces' GPU), written to a folder the search prices with. Runs of ``local:N`` plans
(``meshplan profile --from-plan``): host terms fitted on the run (``verify.learn.fit_run``), in one of two ways:

* **in the run's conditions** (the default): the run's CPU work as it was measured, the host's load and the
  profiler's cost included, over its free-core price (``compute_scale``), and the waits it measured beyond the
  priced collectives (``sync_wait_s``). The layout that ran is then priced at about its measured step, and every
  candidate as if it ran under the same conditions, so the predicted gain is a ratio of like-measured steps.
  Measured here (BENCHMARKS.md): the free-core terms priced the layout that ran 2.3x under its step on a loaded
  host, and the gain taken from that underpriced step was over-predicted.
* **free-core** (``verify.learn``'s terms, which every ``local:N`` plan on this host shares): the run's contention
  divided out and the scale kept within ``planner.host.terms.SCALE_RANGE``; what ``meshplan costmodel fit --runs``
  stores.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from meshplan.core.errors import MeshplanError
from meshplan.planner.estimate.cpu import sync_points
from meshplan.planner.host.terms import Host, HostTerms
from meshplan.planner.plan.build import plan_layout
from meshplan.planner.plan.schema import load_plan
from meshplan.profiler.runs import Run
from meshplan.verify import learn
from meshplan.verify.learn import fit_run, learned_line, local_plan_of_run, terms_of
from meshplan.verify.measured import load_measured
from meshplan.verify.op_fit import fit_runs


@dataclass
class Calibration:
    """What priced the advice: an op-model folder (``None``: the shipped one), the host (with any terms the run
    taught), and one line per thing learned or not."""

    costmodel: Optional[Path]
    host: Host
    notes: list[str] = field(default_factory=list)
    free_core: Optional[HostTerms] = None  # local:N in the run's conditions: the free-core terms, to say their error


def measured_step_s(run_path: Path, run: Run) -> tuple[float, str]:
    """The step time the run measured and where it comes from: ``run.json`` (a ``meshplan profile`` folder, the
    steps timed with the profiler stopped when it has them), else the median over traced steps of the slowest
    rank's ``ProfilerStep#`` length."""
    if run.run_json is not None:
        m = load_measured(run_path)
        return m.median_s, f"median of {len(m.step_s)} {'unprofiled' if m.unprofiled else 'traced'} steps (run.json)"
    per_step: dict[int, float] = {}
    for t in run.ranks.values():
        for n, (_, dur_us) in t.steps.items():
            per_step[n] = max(per_step.get(n, 0.0), dur_us * 1e-6)
    if not per_step:
        raise MeshplanError(f"{run_path}: the traces have no ProfilerStep# markers, so no step was measured")
    return statistics.median(per_step.values()), f"median of {len(per_step)} ProfilerStep# length(s), slowest rank"


# a run's CPU work over its free-core price: beyond 16x it is a broken run, not load (the profiled runs of
# bench/advise.py on a host at load average 5-8 measured contention up to 9.9, so 8x clipped a real run)
IN_RUN_SCALE_RANGE = (0.5, 16.0)


def in_run_terms(fit: dict, measured_s: float, plan_path: Path, host: Host) -> HostTerms:
    """The host terms of one run in its own conditions (see the module docstring): ``fit`` is
    ``verify.learn.fit_run``'s result on the run, ``measured_s`` the step the fit judged (``measured_step_s``).

    The CPU work is the measured step less its traced waits (the load not divided out). What the waits hold beyond
    the priced collectives and bubble goes, as in ``verify.learn``, to the wait per collective when the run has
    enough collectives to say so (spread over the collectives the estimator counts, which is how it is priced back),
    else, for a pipeline, to its bubble (``HostTerms.bubble_scale``)."""
    lo, hi = IN_RUN_SCALE_RANGE
    compute_s = fit["measured_compute_s"] * fit["contention"]
    scale = min(max(compute_s / fit["predicted_compute_s"], lo), hi)
    plan = load_plan(plan_path)
    b = learn.unfitted_estimate(plan, host.calibration)
    extra_s = measured_s - compute_s - b.exposed_comm_s - b.bubble_s * scale  # the waits left unpriced
    lay = plan_layout(plan)
    priced_points = sync_points(lay, plan.grad_accum, lay.stage_num_layers(plan.model.num_layers, lay.pp - 1))
    if fit["sync_points"] >= learn.MIN_SYNC_POINTS and priced_points:
        return HostTerms(sync_wait_s=max(0.0, extra_s / priced_points), compute_scale=scale)
    bubble = min(max(1.0 + extra_s / (b.bubble_s * scale), lo), hi) if b.bubble_s > 0 else 1.0
    return HostTerms(sync_wait_s=host.terms.sync_wait_s, compute_scale=scale, bubble_scale=bubble)


def calibrate(run_path: Path, run: Run, host: Host, out_dir: Path, local: bool, measured_s: float,
              in_run: bool = True) -> Calibration:
    """Fit prices on the run: host terms for a run of a ``local:N`` plan (in the run's conditions, or free-core
    with ``in_run`` False), an op model (into ``out_dir``) for a GPU run. What cannot be fitted is said in
    ``notes`` and priced uncalibrated."""
    if local:
        plan = local_plan_of_run(run_path)
        if plan is None or host.calibration is None:
            return Calibration(None, host, ["host terms: the run has no local:N plan.yaml (not from "
                                            "`meshplan profile --from-plan`); priced with this host's stored terms"])
        try:
            fit = fit_run(plan, run_path, host.calibration, host.terms)
        except MeshplanError as exc:
            return Calibration(None, host, [f"host terms: not fitted ({exc})"])
        if not in_run:
            taught = Host(host.calibration, terms_of(fit), host.terms_path)
            return Calibration(None, taught, [f"host terms from this run, free-core: {learned_line(fit)}"])
        terms = in_run_terms(fit, measured_s, plan, host)
        return Calibration(None, Host(host.calibration, terms, host.terms_path), free_core=terms_of(fit), notes=[
            f"host terms from this run in its own conditions (load and profiler included): compute scale "
            f"{terms.compute_scale:.3f}, wait per collective {1e3 * terms.sync_wait_s:.2f} ms, pipeline wait "
            f"scale {terms.bubble_scale:.2f}; free-core they "
            f"would be {learned_line(fit)} (contention {fit['contention']:.2f})"])
    try:
        summary = fit_runs([run_path], None, out_dir)
    except MeshplanError as exc:
        return Calibration(None, host, [f"op model: not fitted on the run ({exc}); the shipped model prices"])
    cal = ", ".join(summary["calibrated"]) or "none (too few shapes per class)"
    return Calibration(out_dir, host, [f"op model fitted on {summary['rows']} op records of the run on "
                                       f"{summary['device']}; classes calibrated: {cal}"])
