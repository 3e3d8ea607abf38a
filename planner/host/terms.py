"""This host as the ``local:N`` CPU estimator sees it: its calibration and the terms learned from its runs.

``HostTerms`` is a value the CPU estimator is given (``NEUTRAL_TERMS`` = unfitted): the ratio of measured to
priced compute (``compute_scale``) and the wait per collective (``sync_wait_s``), both learned from measured runs
by ``verify.learn`` (the docstring there derives them). They are kept in a small JSON record beside the host
calibration (``local-fit.json``; ``meshplan plan --host-terms FILE`` names another, ``--no-host-terms`` prices
unfitted), written by ``verify.learn`` and read here. ``load_host`` is the one call the CLI makes to get both.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from meshplan.core.cache import cache_dir
from meshplan.planner.host.calibrate import Calibration, calibration_for, host_fingerprint

FIT_VERSION = 3  # 2: per-mechanism terms, sync wait only from runs with enough collectives; 3: compute_scale
# (judged on unprofiled steps, the runs' compute sat below the contention-scaled pricing: additive overheads
# that could only grow could not learn that)
SCALE_RANGE = (0.5, 2.0)  # a compute scale outside this is a broken run, not this host


def clamp_scale(x: float) -> float:
    return min(max(x, SCALE_RANGE[0]), SCALE_RANGE[1])


@dataclass(frozen=True)
class HostTerms:
    """What this host's runs taught the CPU estimator (``verify.learn``): every plan on the host shares them.

    Attributes:
        sync_wait_s: Wait for peers per collective a rank waits on, seconds (free-core time).
        compute_scale: Measured over priced CPU work (contention divided out), a ratio in ``SCALE_RANGE``.
        bubble_scale: A pipeline's measured wait for its neighbour stages over its priced bubble (after
            ``compute_scale``). Only ``meshplan advise`` sets it, pricing candidates in one run's own conditions
            (``verify.advise.calibrate``): on a loaded host a stage's wait in recv grows beyond its neighbour's
            compute. Not a stored term (not in ``as_dict``): what a host's runs teach every plan stays the two above.
    """

    sync_wait_s: float = 0.0
    compute_scale: float = 1.0
    bubble_scale: float = 1.0

    def as_dict(self) -> dict[str, float]:
        return {"sync_wait_s": self.sync_wait_s, "compute_scale": self.compute_scale}


NEUTRAL_TERMS = HostTerms()  # an unfitted estimate
TERMS = tuple(NEUTRAL_TERMS.as_dict())


def default_terms_path() -> Path:
    """``local-fit.json`` in the host cache folder, beside the calibration."""
    return cache_dir() / "local-fit.json"


def read_host_terms(path: str | Path) -> HostTerms:
    """The terms stored in ``path``; ``NEUTRAL_TERMS`` when it is absent, unreadable, of another fit version or of
    another host (fingerprint)."""
    try:
        rec = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return NEUTRAL_TERMS
    if not isinstance(rec, dict) or rec.get("version") != FIT_VERSION or rec.get("fingerprint") != host_fingerprint():
        return NEUTRAL_TERMS
    try:
        return HostTerms(sync_wait_s=max(0.0, float(rec.get("sync_wait_s", 0.0))),
                         compute_scale=clamp_scale(float(rec.get("compute_scale", 1.0))))
    except (TypeError, ValueError):
        return NEUTRAL_TERMS


def host_terms_record(terms: HostTerms, runs: list[str]) -> str:
    """The JSON text ``read_host_terms`` reads back: the terms, this host's fingerprint and the runs they came from."""
    return json.dumps({"version": FIT_VERSION, "fingerprint": host_fingerprint(), "fitted_from": runs,
                       **terms.as_dict()}, indent=2) + "\n"


@dataclass(frozen=True)
class Host:
    """This host's inputs to a plan: its calibration (``local:N`` only) and the learned terms.

    Attributes:
        calibration: ``planner.host.calibrate.Calibration``; None for clusters that are not ``local:N``.
        terms: The learned terms (``NEUTRAL_TERMS``: unfitted).
        terms_path: Where the terms are kept (``verify.learn`` writes its fits there).
    """

    calibration: Optional[Calibration] = None
    terms: HostTerms = NEUTRAL_TERMS
    terms_path: Optional[Path] = None


def load_host(cluster_spec: str, terms_file: str | Path | None = None, use_terms: bool = True,
              progress: Optional[Callable[[str], None]] = None) -> Host:
    """What a plan on ``cluster_spec`` needs of this host: for ``local:N`` the calibration (measured only when the
    cache is absent or stale) and the learned terms (``terms_file``, else ``default_terms_path()``; neutral when
    ``use_terms`` is False); nothing for any other cluster."""
    cal = calibration_for(cluster_spec, progress)
    if cal is None:
        return Host()
    path = Path(terms_file) if terms_file is not None else default_terms_path()
    return Host(cal, read_host_terms(path) if use_terms else NEUTRAL_TERMS, path)
