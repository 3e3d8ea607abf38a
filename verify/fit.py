"""``meshplan costmodel fit --runs RUN`` as one library call: what measured runs teach.

From runs of ``local:N`` plans, this host's terms (``verify.learn``, stored in the host's terms file); with
``out``, an op model calibrated on the runs' op records (``verify.op_fit``, any device).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from meshplan.core.atomic import refuse_overlap
from meshplan.core.errors import MeshplanError
from meshplan.costmodel.devices import get_device
from meshplan.planner.host.calibrate import Calibration
from meshplan.planner.host.terms import read_host_terms
from meshplan.verify.learn import fit_runs_local, save_terms, terms_of
from meshplan.verify.op_fit import fit_runs


def fit_from_runs(runs: list[str | Path], terms_path: str | Path, calibration_of: Callable[[], Calibration],
                  out: Optional[Path] = None, model: Optional[Path] = None, device_dir: Optional[Path] = None,
                  device: Optional[str] = None) -> dict:
    """Fit on ``runs``: ``{"local": host terms fit (fit_runs_local), "ops": op-model summary (fit_runs) or None}``.

    Args:
        runs: Run folders or traces.
        terms_path: The host's terms file: read for the terms runs do not teach, written with the new ones.
        calibration_of: This host's calibration, obtained when a run of a ``local:N`` plan is found.
        out, model, device_dir, device: The op model to write, its base, the CPU's ``collect`` folder and the
            device name (``verify.op_fit.fit_runs``).

    Raises:
        MeshplanError: no run of a ``local:N`` plan and no ``out``; a missing run; an unknown device; ``out`` or
            ``terms_path`` overlapping an input (it would replace what is read).
    """
    if out is not None:
        refuse_overlap(out, {"--runs": list(runs), "--model": model, "--device-json": device_dir}, "--out")
    refuse_overlap(terms_path, {"--runs": list(runs)}, "--host-terms")
    local = fit_runs_local(runs, calibration_of, read_host_terms(terms_path))
    if out is None and not local["runs"]:
        raise MeshplanError(f"{runs[0]}: not a run of a local:N plan (made by `meshplan profile --from-plan`), "
                            "so there is no host figure to fit; pass --out DIR to write an op model calibrated "
                            "on its op records")
    if local["runs"]:
        save_terms(terms_path, terms_of(local), [p["run"] for p in local["runs"]])
        local["taught"] = sorted({k for r in local["runs"] for k in r["taught"]})
    if device is not None:
        device = get_device(device).name  # unknown: one line naming the known devices
    ops = fit_runs(runs, model, out, device_dir=device_dir, device=device) if out is not None else None
    return {"local": local, "ops": ops}
