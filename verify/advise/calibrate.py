"""Prices calibrated on the run's own kernels, and the step the run measured.

GPU runs: ``costmodel fit`` on the run's op records (``verify.op_fit.fit_runs``: each host op's kernels, joined by
correlation id, as rows for the traces' GPU), written to a folder the search prices with. Runs of ``local:N`` plans
(``meshplan profile --from-plan``): the host terms the run teaches (``verify.learn.fit_run``: compute scale, wait
per collective), which every ``local:N`` price on this host shares.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from meshplan.core.errors import MeshplanError
from meshplan.planner.host.terms import Host
from meshplan.profiler.runs import Run
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


def calibrate(run_path: Path, run: Run, host: Host, out_dir: Path, local: bool) -> Calibration:
    """Fit prices on the run: host terms for a run of a ``local:N`` plan, an op model (into ``out_dir``) for a GPU
    run. What cannot be fitted is said in ``notes`` and priced uncalibrated."""
    if local:
        plan = local_plan_of_run(run_path)
        if plan is None or host.calibration is None:
            return Calibration(None, host, ["host terms: the run has no local:N plan.yaml (not from "
                                            "`meshplan profile --from-plan`); priced with this host's stored terms"])
        try:
            fit = fit_run(plan, run_path, host.calibration, host.terms)
        except MeshplanError as exc:
            return Calibration(None, host, [f"host terms: not fitted ({exc})"])
        taught = Host(host.calibration, terms_of(fit), host.terms_path)
        return Calibration(None, taught, [f"host terms from this run: {learned_line(fit)}"])
    try:
        summary = fit_runs([run_path], None, out_dir)
    except MeshplanError as exc:
        return Calibration(None, host, [f"op model: not fitted on the run ({exc}); the shipped model prices"])
    cal = ", ".join(summary["calibrated"]) or "none (too few shapes per class)"
    return Calibration(out_dir, host, [f"op model fitted on {summary['rows']} op records of the run on "
                                       f"{summary['device']}; classes calibrated: {cal}"])
