"""Calibrating a learned model on measured op records (the costmodel half of ``meshplan costmodel fit --out``).

Op records (an aten op name, its input shapes, a duration) become training rows (``op_row``); for each op class
present a calibration ``t = overhead + multiple * roofline`` is fitted on those rows (``affine_fit``: a run holds
a handful of shapes per class, too few for trees, which cannot interpolate a fixed per-op overhead between them)
and stored in the model's metadata (``refit``); queries for that device and class then use it, all others keep
the learned trees. Reading the records out of a profiled run is ``verify.op_fit``'s job.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from meshplan.core.atomic import write_atomic
from meshplan.core.errors import MeshplanError
from meshplan.costmodel.datasets.table import KernelTable
from meshplan.costmodel.devices import DeviceSpec
from meshplan.costmodel.learned import LearnedModel, save_kind
from meshplan.costmodel.train import prepare

MIN_SHAPES = 2  # distinct shapes of a class a run must hold for that class to be calibrated


def _dims(shapes, i):
    try:
        d = shapes[i]
        return tuple(int(x) for x in d) if d is not None else None
    except (IndexError, TypeError, ValueError):
        return None


def op_row(name: str, shapes) -> tuple[str, float, float, float, float] | None:
    """``(kind, b, m, n, k)`` for an aten op with its ``Input Dims``, or ``None`` if not a priced leaf op."""
    a, w = _dims(shapes, 0), _dims(shapes, 1)
    if name == "aten::mm" and a and w and len(a) == 2 and len(w) == 2:
        return "matmul", 1, a[0], w[1], a[1]
    if name == "aten::addmm":  # addmm(bias, x, w)
        x, w2 = _dims(shapes, 1), _dims(shapes, 2)
        if x and w2 and len(x) == 2 and len(w2) == 2:
            return "matmul", 1, x[0], w2[1], x[1]
    if name == "aten::bmm" and a and w and len(a) == 3:
        return "bmm", a[0], a[1], w[2], a[2]
    if name in ("aten::native_layer_norm",) and a:
        return "layernorm", 1, int(np.prod(a[:-1])), a[-1], 1
    if name in ("aten::_softmax",) and a:
        return "softmax", 1, int(np.prod(a[:-1])), a[-1], 1
    if name in ("aten::add", "aten::mul", "aten::sub", "aten::div") and a and w:  # tensor-tensor only
        return "elementwise", 1, int(np.prod(a)), 1, 1
    if name in ("aten::gelu", "aten::relu", "aten::silu", "aten::tanh", "aten::sigmoid") and a:
        return "activation", 1, int(np.prod(a)), 1, 1
    if name == "aten::embedding" and a and w:
        return "embedding", 1, int(np.prod(w)), a[-1], 1
    return None


def affine_fit(roof_s: np.ndarray, lat_s: np.ndarray) -> tuple[float, float]:
    """Fit ``t = overhead + multiple * roofline`` minimising relative error, with overhead >= 0, multiple >= 1.

    The multiple >= 1 keeps every calibrated prediction at or above the ideal roofline; the overhead is the
    per-op dispatch cost a profiled run pays (notes/costmodel.md sec. 5.1 item 6, launch floor).
    """
    if len(lat_s) == 1:
        return 0.0, float(max(1.0, lat_s[0] / roof_s[0]))
    A = np.column_stack([1.0 / lat_s, roof_s / lat_s])
    (a, c), *_ = np.linalg.lstsq(A, np.ones_like(lat_s), rcond=None)
    if a < 0:  # no overhead: pure multiple, fitted in relative error
        a, c = 0.0, float(np.sum(roof_s / lat_s) / np.sum((roof_s / lat_s) ** 2))
    if c < 1.0:  # cannot beat the roofline: refit the overhead alone
        c = 1.0
        a = float(max(0.0, np.sum((lat_s - roof_s) / lat_s ** 2) / np.sum(1.0 / lat_s ** 2)))
    return float(a), float(c)


def refit(base: LearnedModel, rows: KernelTable, measured: tuple[DeviceSpec, ...] = ()) -> LearnedModel:
    """A new model: ``base`` plus a per-(device, op class) calibration fitted on ``rows`` (``measured``: the devices
    ``collect`` measured that the rows may name, e.g. this host's CPU; catalogue devices resolve by name).

    For each op class with at least ``MIN_SHAPES`` distinct shapes in the run, ``t = overhead + multiple *
    roofline`` is fitted on that device's rows
    (``affine_fit``); queries for that device and class use it ("calibrated"), others keep the base model.
    """
    prep = prepare(rows, measured)
    if len(prep.table) == 0:
        raise MeshplanError(f"device {rows.device[0]} is unknown; pass a collect folder with its device.json")
    meta = json.loads(json.dumps(base.meta))
    cal = meta.setdefault("calibration", {})
    for dev in np.unique(prep.table.device):
        for kind in np.unique(prep.table.op):
            idx = (prep.table.op == kind) & (prep.table.device == dev)
            if idx.sum() < MIN_SHAPES:  # one shape cannot tell a per-op overhead from a multiple of the roofline
                continue
            a, c = affine_fit(prep.roof_s[idx], prep.table.latency_s[idx])
            cal.setdefault(str(dev), {})[str(kind)] = {"overhead_s": a, "roofline_multiple": c, "rows": int(idx.sum())}
    return LearnedModel(base.directory, meta, dict(base.trees))  # boosters: base's files, loaded if saved


def save_model(model: LearnedModel, out_dir: str | Path) -> Path:
    """Write a (refitted) model folder with fresh checksums."""
    out = Path(out_dir)
    meta = json.loads(json.dumps(model.meta))
    for kind, booster in model.boosters.items():
        meta["kinds"].setdefault(kind, {}).update(save_kind(out, kind, booster))
    write_atomic(out / "metadata.json", json.dumps(meta, indent=1, sort_keys=True))
    return out
