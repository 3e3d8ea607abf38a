"""``meshplan check PLAN RUN``: does a measured run keep the step time and memory its plan predicted?

How the run is read and matched to the plan: ``verify.measured``. Noise: the spread of the measured steps is
``(p90 - p10) / median``; when it exceeds the tolerance the verdict cannot be trusted and a warning says so.
Memory: compared when the run records a peak (``run.json`` ``peak_memory_bytes`` or ``max_rss_bytes`` per rank);
otherwise reported as not recorded. ``check_run`` is the
whole command: the host contention measured from the run (``verify.contention``), the check, and optionally
learning this host's terms from the run (``verify.learn``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from meshplan.core.errors import MeshplanError
from meshplan.planner.estimate.cpu import world_cores
from meshplan.planner.plan.schema import Plan, load_plan
from meshplan.profiler.runs import Run
from meshplan.verify.breakdown import measured_breakdown
from meshplan.verify.measured import ProfiledRun, identity_mismatches, profiled

PHASE_LABEL = {"compute_s": "compute", "exposed_comm_s": "exposed comm", "bubble_s": "bubble"}



def parse_tolerance(text: str | float) -> float:
    """``15%``, ``0.15`` or ``15`` (percent when > 1) -> fraction.

    Raises:
        MeshplanError: not a number in (0, 100%].
    """
    raw = str(text).strip()
    try:
        v = float(raw[:-1]) / 100.0 if raw.endswith("%") else float(raw)
    except ValueError:
        raise MeshplanError(f"--tolerance {raw!r}: expected a percentage such as 15% or a fraction such as 0.15") \
            from None
    if not raw.endswith("%") and v > 1.0:
        v /= 100.0
    if not 0.0 < v <= 1.0:
        raise MeshplanError(f"--tolerance {raw!r}: must be between 0 and 100%")
    return v


@dataclass
class CheckResult:
    """Everything ``meshplan check`` reports. Times in seconds, memory in bytes, error as a fraction."""

    plan_path: str
    run_path: str
    tolerance: float
    predicted_s: float
    measured_s: float
    error: float  # (measured - predicted) / predicted
    passed: bool
    spread: float
    noisy: bool
    steps: int
    step_s: list[float]
    predicted_peak_bytes: int
    measured_peak_bytes: Optional[int]
    phases: list[dict] = field(default_factory=list)  # [{"phase", "predicted_s", "measured_s", "delta_s"}]
    moved_phase: Optional[str] = None
    breakdown_rank: Optional[int] = None
    warnings: list[str] = field(default_factory=list)
    raw_error: Optional[float] = None  # vs the plan's own prediction, when judged on a contention-scaled one
    contention: Optional[float] = None  # traced / fastest time of the run's repeated ops (verify.contention)
    traced_s: Optional[float] = None  # median of the traced steps when measured_s comes from unprofiled ones
    profiler_overhead_s: float = 0.0  # traced minus unprofiled median: taken off the measured compute phase

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def as_dict(self) -> dict:
        d = asdict(self)
        d["exit_code"] = self.exit_code
        return d


def check(plan_path: str | Path, run_path: str | Path | ProfiledRun, tolerance: float = 0.15,
          breakdown: bool = True, contention: Optional[float] = None) -> CheckResult:
    """Compare a plan's prediction with a measured run.

    Args:
        plan_path: Plan YAML with a prediction.
        run_path: ``meshplan profile`` run folder (run.json + one trace per rank), or that folder as already
            read (:class:`verify.measured.ProfiledRun`, so that one read serves every analysis of the command).
        tolerance: Allowed relative step-time error (fraction).
        breakdown: Also split the measured steps into phases from the traces (slower: loads every trace).
        contention: Host contention factor (``verify.contention.run_contention``, 1.0 = free cores): when
            given, the prediction's CPU work (compute, optimizer, bubble) is scaled by it before judging (a rank
            that gets 1/f of its core runs f times slower) and the unscaled error is kept in ``raw_error``. The
            exposed communication is not scaled: its price is already what ranks paid on this host (the
            calibration's in-step collectives, timed with the gloo thread on the rank's core), while compute
            is priced at free-core speed.

    Raises:
        MeshplanError: unreadable inputs, a plan without prediction, or a run of another job (names the field).
    """
    plan = load_plan(plan_path)
    if plan.prediction is None:
        raise MeshplanError(f"{plan_path}: the plan has no prediction to check (re-run `meshplan plan`)")
    read = profiled(run_path)
    run_path = read.path
    run = read.measured
    diffs, warns = identity_mismatches(plan, run)
    if diffs:
        raise MeshplanError(f"{run_path}: not a run of {plan_path}: " + "; ".join(diffs))
    pred = plan.prediction
    if contention:
        # An op's stretch in an oversubscribed run includes the plan's own ranks sharing cores, which the
        # prediction already holds: only the part beyond ranks/cores is other people's load.
        contention = max(1.0, contention / _own_oversubscription(plan))
    predicted_s = scaled_step_s(pred, contention or 1.0)
    err = (run.median_s - predicted_s) / predicted_s
    noisy = run.spread > tolerance
    if noisy:
        warns.append(f"measured steps vary {100 * run.spread:.0f}% (p10-p90 over {len(run.step_s)} steps), more "
                     f"than the {100 * tolerance:.0f}% tolerance: the verdict is not reliable (noisy host? pin "
                     f"ranks, run more steps)")
    if len(run.step_s) < 5:
        warns.append(f"only {len(run.step_s)} measured steps: a median of fewer than 5 steps is fragile")
    pinned = run.record.get("pinned")
    if pinned is False:
        warns.append("ranks were not pinned to cores (or shared them): expect step-time noise")
    res = CheckResult(str(plan_path), str(run_path), tolerance, predicted_s, run.median_s, err,
                      abs(err) <= tolerance, run.spread, noisy, len(run.step_s), list(run.step_s),
                      pred.peak_memory_bytes, run.peak_memory_bytes, warnings=warns)
    if run.window_note:
        res.warnings.append(run.window_note)
    if run.unprofiled:
        res.traced_s, res.profiler_overhead_s = run.traced_median_s, run.profiler_overhead_s
        res.warnings.append(f"judged on {len(run.step_s)} steps timed with the profiler stopped (median "
                            f"{1e3 * run.median_s:.1f} ms; the traced steps' {1e3 * run.traced_median_s:.1f} ms, "
                            f"{100 * run.profiler_overhead_s / run.median_s:+.1f}%, hold the profiler's cost, "
                            "taken off the measured compute phase)")
    if contention:
        res.contention = contention
        res.raw_error = (run.median_s - pred.step_time_s) / pred.step_time_s
        res.warnings.append(f"host contention {contention:.2f}x (the run's repeated operators took {contention:.2f}x "
                            f"their fastest time): prediction scaled from {1e3 * pred.step_time_s:.1f} ms to "
                            f"{1e3 * predicted_s:.1f} ms; unscaled error {100 * res.raw_error:+.1f}%")
    res.warnings += open_figure_notes(plan.explain, run.median_s, predicted_s)
    if run.peak_memory_bytes is None:
        res.warnings.append("the run records no peak memory; memory not compared")
    if breakdown:
        _add_phases(res, plan, read.traces)
    return res


# The open figures a plan written with ``--explain`` prices both ways (planner.estimate.host_band, sustained_band)
OPEN_FIGURES = {"host_speed": "the x86 host's speed", "sustained": "the GPU's sustained clock"}


def open_figure_notes(explain: Optional[dict], measured_s: float, predicted_s: float) -> list[str]:
    """One line per open figure the plan priced both ways (its ``explain``, ``meshplan plan --explain``): whether
    the measured step lies between the prediction and the price at the figure's other published value (the gap is
    that figure's to explain), past it, or on the prediction's other side."""
    out = []
    for key, what in OPEN_FIGURES.items():
        band = (explain or {}).get(key)
        if not band:
            continue
        other = band["step_time_s"]
        lo, hi = sorted((predicted_s, other))
        where = ("between them: that figure can explain the gap" if lo <= measured_s <= hi else
                 "past the other price: that figure alone does not explain the gap"
                 if (measured_s - predicted_s) * (other - predicted_s) > 0 else
                 "on the prediction's other side: that figure does not explain the gap")
        out.append(f"{what} is an open figure: at {band['source']} the plan prices {1e3 * other:.1f} ms "
                   f"({100 * band['change']:+.1f}%); the measured step ({1e3 * measured_s:.1f} ms) lies {where}")
    return out


def scaled_step_s(pred, f: float) -> float:
    """Predicted step time with its CPU work stretched by contention ``f`` (see ``check``), seconds."""
    return f * (pred.step_time_s - pred.breakdown.exposed_comm_s) + pred.breakdown.exposed_comm_s


def _own_oversubscription(plan: Plan) -> float:
    if not plan.cluster.spec.lower().startswith("local:"):
        return 1.0
    return max(1.0, plan.degrees.world_size / world_cores(None))


def _add_phases(res: CheckResult, plan: Plan, traces: Run) -> None:
    mb = measured_breakdown(traces)
    b = plan.prediction.breakdown
    f = res.contention or 1.0
    predicted = {"compute_s": f * (b.compute_s + b.other_s), "exposed_comm_s": b.exposed_comm_s,
                 "bubble_s": f * b.bubble_s}
    measured = mb.as_dict()
    # the traces hold the profiler's own cost per op (main-thread CPU time): the unprofiled steps show how much
    measured["compute_s"] = max(0.0, measured["compute_s"] - res.profiler_overhead_s)
    rows = [{"phase": PHASE_LABEL[k], "predicted_s": predicted[k], "measured_s": measured[k],
             "delta_s": measured[k] - predicted[k]} for k in PHASE_LABEL]
    res.phases = rows
    res.breakdown_rank = mb.rank
    res.moved_phase = max(rows, key=lambda r: abs(r["delta_s"]))["phase"]
