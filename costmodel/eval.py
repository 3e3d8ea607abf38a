"""Held-out accuracy of the learned model on named splits (``meshplan costmodel eval``).

Each split retrains the model recipe (``train.PARAMS``) on the split's training rows only and reports, per
(device, op class), ``n``, MAPE, median and p90 absolute percentage error of the held-out rows, next to the
calibrated roofline's MAPE on the same rows and the fraction priced by the fallback.

Splits:
    neusight              NeuSight's own: train/ (5 older GPUs, small shapes) -> test/ (larger shapes, + A100-80GB,
                          L4, H100).
    vidur-h100            Vidur fp16 layer ops: train A100 + A40, test H100.
    vidur-network         NCCL all-reduce and send/recv: 20% of the sizes held out (every config); and
                          one-node -> two-node (train single-node collectives + two-node send/recv, test two-node
                          all-reduce).
    leave-one-device-out  every GPU in turn is held out (all its rows), trained on the others.
    unseen-device:NAME    one fold of the above.
    local                 this machine (``collect`` output): 25% of the shapes held out; also reports the noise floor.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from meshplan.core.errors import MeshplanError
from meshplan.costmodel import collective_fit as F
from meshplan.costmodel.collective_model import CollectiveModel
from meshplan.costmodel.datasets import load
from meshplan.costmodel.datasets.devices import canonical, resolve_many
from meshplan.costmodel.datasets.table import KernelTable
from meshplan.costmodel.devices import DeviceSpec, get_device
from meshplan.costmodel.features import FEATURES
from meshplan.costmodel.learned import FORMAT, LearnedModel, is_learned
from meshplan.costmodel.ops import COMPUTE_KINDS
from meshplan.costmodel.train import RANGE_MARGIN_HI, RANGE_MARGIN_LO, ape, prepare, train_models

SPLITS = ("neusight", "vidur-h100", "vidur-network", "leave-one-device-out", "local", "unseen-device:NAME")


def metrics(pred_s: np.ndarray, true_s: np.ndarray) -> dict:
    e = ape(pred_s, true_s)
    return {"n": int(len(e)), "mape": round(float(e.mean()), 2), "median_ape": round(float(np.median(e)), 2),
            "p90_ape": round(float(np.percentile(e, 90)), 2)}


def _as_model(models: dict) -> LearnedModel:
    meta = {"format": FORMAT, "features": list(FEATURES), "range_margin_log2": [RANGE_MARGIN_LO, RANGE_MARGIN_HI],
            "kinds": {k: {kk: vv for kk, vv in v.items() if kk != "model"} for k, v in models.items()}}
    return LearnedModel.from_boosters(Path("."), meta, {k: v["model"] for k, v in models.items()})


def _fit_eval(train: KernelTable, test: KernelTable, n_estimators=None, max_rows=None, progress=None,
              blend_unseen: bool = True, measured: tuple[DeviceSpec, ...] = ()) -> list[dict]:
    """Train on ``train``, report per (device, op) on ``test`` (``blend_unseen=False``: trees alone, for A/B;
    ``measured``: the devices ``collect`` measured, which the rows may name)."""
    prep = prepare(train, measured)
    model = _as_model(train_models(prep, n_estimators=n_estimators, max_rows_per_kind=max_rows,
                                   blend_unseen=blend_unseen))
    specs, missing = resolve_many(test.device, measured)
    test = test.select(~np.isin(test.device, missing))
    test = test.select(np.isin(test.op, COMPUTE_KINDS))
    pred, src = model.predict_arrays(test.op, test.b, test.m, test.n, test.k, test.dtype, test.device, specs)
    # The calibrated roofline alone on the same rows, for comparison (notes/costmodel.md sec. 5.7 item 4).
    roof, _ = LearnedModel(Path("."), {"kinds": {}}, {}).predict_arrays(
        test.op, test.b, test.m, test.n, test.k, test.dtype, test.device, specs)
    rows = []
    for dev, op in sorted(set(zip(test.device, test.op))):
        s = (test.device == dev) & (test.op == op)
        r = {"device": dev, "op": op} | metrics(pred[s], test.latency_s[s])
        r["roofline_mape"] = round(float(ape(roof[s], test.latency_s[s]).mean()), 2)
        r["fallback_frac"] = round(float((~is_learned(src[s])).mean()), 3)
        rows.append(r)
    if progress:
        progress()
    return rows


def _network(table: KernelTable) -> list[dict]:
    coll = table.select(np.isin(table.op, ("allreduce", "sendrecv")) & np.char.endswith(table.device.astype(str),
                                                                                        "_dgx"))
    if len(coll) == 0:
        raise MeshplanError("vidur-network: no Vidur network rows in the data (expected vidur/network/*/*.csv)")
    rows = []

    def report(model_dict, test, tag):
        M = CollectiveModel(model_dict)
        ok, bw, al = F.row_links(test, model_dict["links"])
        test = test.select(ok)
        pred = M.predict_rows(test.op, test.m, test.group_size, test.nodes, bw[ok], al[ok])
        for dev, op in sorted(set(zip(test.device, test.op))):
            s = (test.device == dev) & (test.op == op)
            rows.append({"device": dev, "op": f"{op} ({tag})"} | metrics(pred[s], test.latency_s[s]))

    sizes = np.unique(coll.m)
    held = np.random.default_rng(0).choice(sizes, len(sizes) // 5, replace=False)
    te = np.isin(coll.m, held)
    report(F.fit(coll.select(~te)), coll.select(te), "held-out sizes")
    train = coll.select((coll.nodes == 1) | (coll.op == "sendrecv"))
    report(F.fit(train), coll.select((coll.nodes > 1) & (coll.op == "allreduce")), "1-node -> 2-node")
    return rows


def _local(table: KernelTable, measured: tuple[DeviceSpec, ...], progress=None,
           blend_unseen: bool = True) -> list[dict]:
    loc = table.select(table.source == "local")
    if len(loc) == 0:
        raise MeshplanError("local: no local measurements in the data (run `meshplan costmodel collect --out DIR`)")
    keys = np.array([f"{o}|{b}|{m}|{n}|{k}|{d}"
                     for o, b, m, n, k, d in zip(loc.op, loc.b, loc.m, loc.n, loc.k, loc.dtype)])
    uniq = np.unique(keys)
    held = np.random.default_rng(0).choice(uniq, max(1, len(uniq) // 4), replace=False)
    te = np.isin(keys, held)
    rows = _fit_eval(loc.select(~te), loc.select(te), progress=progress, blend_unseen=blend_unseen,
                     measured=measured)
    for r in rows:
        s = (loc.device == r["device"]) & (loc.op == r["op"])
        r["noise_floor_pct"] = round(float(100 * np.nanmedian(loc.noise[s])), 2)
    return rows


def evaluate(split: str, data: list[str | Path], progress=None, quick: bool = False,
             blend_unseen: bool = True, model: str | Path | None = None) -> list[dict]:
    """Run one split; returns rows ``{"device","op","n","mape","median_ape","p90_ape", ...}``.

    Args:
        split: One of ``SPLITS`` (``unseen-device:H100`` etc.).
        data: Dataset folders (``data/kernels``, a ``collect`` output).
        progress: Called once per trained fold.
        quick: Fewer trees and rows (for tests); the figures in BENCHMARKS.md use ``quick=False``.
        blend_unseen: ``False`` prices unseen devices by the trees alone (the pre-blend model, for before/after).
        model: A model folder whose recipe is evaluated: checked first (a corrupt or foreign folder is reported,
            not evaluated).

    Raises:
        MeshplanError: unknown split or the data it needs is absent; a corrupt ``model``.
    """
    if model is not None:
        LearnedModel.load(model)
    n_est, max_rows = (120, 15000) if quick else (None, None)
    name = split.split(":", 1)[0]
    if name not in {s.split(":")[0] for s in SPLITS}:
        raise MeshplanError(f"unknown split '{split}' (known: {', '.join(SPLITS)})")
    ds = load(list(data), collectives=(name == "vidur-network"))
    table = ds.table
    if name == "neusight":
        ns = table.select(np.char.startswith(table.source.astype(str), "neusight/"))
        if len(ns) == 0:
            raise MeshplanError("neusight: no NeuSight rows in the data (expected neusight/train and neusight/test)")
        return _fit_eval(ns.select(ns.source == "neusight/train"), ns.select(ns.source == "neusight/test"),
                         n_est, max_rows, progress, blend_unseen)
    if name == "vidur-h100":
        vd = table.select(np.char.startswith(table.source.astype(str), "vidur/") & (table.op != "allreduce")
                          & (table.op != "sendrecv"))
        if len(vd) == 0:
            raise MeshplanError("vidur-h100: no Vidur compute rows in the data (expected vidur/compute/*/*/mlp.csv)")
        return _fit_eval(vd.select(np.isin(vd.device, ("A100-80GB", "A40"))), vd.select(vd.device == "H100-SXM"),
                         n_est, max_rows, progress, blend_unseen)
    if name == "vidur-network":
        return _network(table)
    if name == "local":
        return _local(table, ds.measured, progress, blend_unseen)
    gpus = table.select(table.source != "local")
    if name == "unseen-device":
        target = split.split(":", 1)[1] if ":" in split else ""
        specs, _ = resolve_many([canonical(target)] if target else [])
        if not specs:
            get_device(target)  # raises the catalogue's "unknown device" message
        dev_name = canonical(target) if canonical(target) in set(gpus.device) else next(iter(specs.values())).name
        if dev_name not in set(gpus.device):
            raise MeshplanError(f"unseen-device:{target}: no measurements of {dev_name} in the data")
        s = gpus.device == dev_name
        return _fit_eval(gpus.select(~s), gpus.select(s), n_est, max_rows, progress, blend_unseen)
    rows = []  # leave-one-device-out
    n_est, max_rows = (n_est or 200), (max_rows or 20000)
    for dev in sorted(set(gpus.device)):
        s = gpus.device == dev
        if s.sum() < 50:
            continue
        rows += _fit_eval(gpus.select(~s), gpus.select(s), n_est, max_rows, progress, blend_unseen)
    return rows
