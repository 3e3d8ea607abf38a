"""``meshplan check`` as one library call: the host's contention measured from the run, the check, and (``learn``)
this host's terms fitted on the run and stored (the CI gate of ``docs/ci.md``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from meshplan.core.errors import MeshplanError
from meshplan.planner.host.calibrate import Calibration
from meshplan.planner.host.terms import read_host_terms
from meshplan.verify.advise.job import AdviseRequest
from meshplan.verify.advise.job import advise as advise_run
from meshplan.verify.check import CheckResult, check, parse_tolerance
from meshplan.verify.contention import run_contention
from meshplan.verify.learn import fit_run, save_terms, terms_of
from meshplan.verify.measured import ProfiledRun


@dataclass
class GateResult:
    """The check, the notices about how it was made, and what was learned (``learned`` is a ``fit_run`` dict)."""

    result: CheckResult
    notices: list[str] = field(default_factory=list)
    learned: Optional[dict] = None
    learned_path: Optional[Path] = None
    advice: Optional[object] = None  # verify.advise.job.Advice, with ``advise``


def check_run(plan: str | Path, run: str | Path, tolerance: str | float = "15%", breakdown: bool = True,
              contention: bool = False, learn: bool = False, terms_path: str | Path | None = None,
              calibration_of: Callable[[], Calibration] | None = None, advise: bool = False,
              advise_out: Optional[Path] = None, host_for: Optional[Callable] = None) -> GateResult:
    """Judge ``run`` against ``plan``; optionally scaled by the run's contention and learning from the run.

    Args:
        plan, run: The plan YAML and the ``meshplan profile`` folder.
        tolerance: Allowed step-time error (``15%``, ``0.15``).
        breakdown: Split the measured steps into phases (loads every trace).
        contention: Scale the prediction's CPU work by the contention the run's own operators show.
        learn: Fit this host's terms on the run (``verify.learn``) and store them in ``terms_path``.
        terms_path: The host's terms file (``planner.host.terms.default_terms_path()`` for the CLI default).
        calibration_of: This host's calibration, obtained only when ``learn``
            (``planner.host.calibrate.load_calibration``).
        advise: Also advise on the run (``verify.advise.job.advise``): a faster layout, written to ``advise_out``;
            traces advice cannot read become a notice, not an error (the check stands on its own).
        host_for: This host's inputs for a ``local:N`` cluster spec (``planner.host.terms.load_host``), for advise.

    Raises:
        MeshplanError: unreadable inputs, a run of another job, ``learn`` on a plan that is not ``local:N``.
    """
    tol = parse_tolerance(tolerance)
    read = ProfiledRun(run)  # run.json parsed once and the traces loaded once, for every step below
    notices = []
    factor = None
    if contention:
        factor = run_contention(read.traces)[0]
        if factor is None:
            notices.append("--contention: the run's traces hold too few repeated operators; prediction not scaled")
    out = GateResult(check(plan, read, tol, breakdown=breakdown, contention=factor), notices)
    if learn:
        if terms_path is None or calibration_of is None:
            raise ValueError("learn needs the host's terms file and a way to get its calibration")
        fitted = fit_run(plan, read, calibration_of(), read_host_terms(terms_path))
        out.learned, out.learned_path = fitted, save_terms(terms_path, terms_of(fitted), [str(run)])
    if advise:
        try:
            out.advice = advise_run(AdviseRequest(Path(run), out=advise_out), **({"host_for": host_for} if host_for
                                                                               else {}))
        except MeshplanError as exc:
            out.notices.append(f"--advise: {exc}")
    return out
