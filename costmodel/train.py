"""Train the learned latency model: one xgboost regressor per op kind predicting log(latency / roofline).

The target is the log of the ratio between the measured time and the *ideal* roofline time
max(flops / peak, bytes / bw) (notes/costmodel.md sec. 5.1). Predictions are clipped at ratio 1, so the model
never predicts below the roofline bound. Saved as xgboost UBJSON (one file per kind), the same trees as numpy
arrays (``<kind>.npz``, what predicts: ``costmodel.trees``) plus ``metadata.json`` (features, data files and their
sha256, per-kind training ranges and metrics, sha256 of every model file).
No pickle anywhere. The shipped default is rebuilt by
``meshplan costmodel train --data data/kernels --out costmodel/data/model`` (the repository's copy of the kernel
tables, ``data/README.md``).
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import xgboost as xgb

from meshplan.core.atomic import refuse_overlap, write_atomic
from meshplan.core.errors import MeshplanError
from meshplan.costmodel import collective_fit
from meshplan.costmodel.datasets import load
from meshplan.costmodel.datasets.devices import resolve_many
from meshplan.costmodel.datasets.table import KernelTable, table_bytes, table_name
from meshplan.costmodel.devices import DeviceSpec, device_to_dict
from meshplan.costmodel.features import (
    FEATURES,
    GEMM_KINDS,
    blend,
    calibrated_roofline_s,
    device_columns,
    device_signature,
    feature_matrix,
)
from meshplan.costmodel.learned import FORMAT, save_kind, save_trees
from meshplan.costmodel.ops import COMPUTE_KINDS

MIN_ROWS = 30  # fewer training rows than this for a kind: no model, the roofline fallback prices it
# Features whose training range defines "in distribution" (sec. 5.1 item 5 of the notes): a query more than
# 2x below or 16x above the trained sizes falls back to the calibrated roofline.
RANGE_FEATURES = ("log2_flops", "log2_bytes")
RANGE_MARGIN_LO, RANGE_MARGIN_HI = 1.0, 4.0
# Measurements faster than 0.8x the ideal roofline are not physical for DRAM-resident data; they come from
# L2-resident working sets (small NeuSight shapes). They are kept, but the clip below the roofline is the
# model's promise, so such rows cannot be predicted exactly; see ``ratio_floor`` in the metadata.

PARAMS = dict(max_depth=8, eta=0.08, subsample=0.8, colsample_bytree=0.8, min_child_weight=2.0,
              tree_method="hist", max_bin=256, nthread=2, seed=0, objective="reg:squarederror")
N_ROUNDS = 300
SMALL_CLASS_ROWS = 20000
# Rows per op class for the default model: keeps training under 3 minutes on 2 shared cores (bmm has 101k).
DEFAULT_MAX_ROWS = 60000
# Unseen-device shrinkage: on a device whose class signature (``features.device_signature``) the class never
# trained on, the prediction is the geometric blend roofline_cal^(1-w) * learned^w. ``w`` is chosen per class by
# leave-one-signature-out over the class's own training GPUs (no row of the device being predicted is used): trees
# extrapolate device features flatly while the calibrated roofline errs in the other direction, so the blend
# cancels part of both errors (NeuSight train GPUs, LODO MAPE: LayerNorm 21 -> 17%, softmax 26 -> 16%, bmm 29 -> 25%,
# linear 35 -> 27%).
BLEND_GRID = tuple(np.round(np.arange(0.0, 1.0001, 0.05), 2))
BLEND_MIN_GROUPS, BLEND_MAX_FOLDS, BLEND_MIN_ROWS = 3, 6, 50
BLEND_TRAIN_ROWS, BLEND_TEST_ROWS, BLEND_ROUNDS = 6000, 3000, 100
# Blend partner of the GEMM classes: the calibrated roofline as is (None) or with its FLOP term raised by the wave
# quantisation of ``tm x tn`` output tiles on the device being priced (``features.wave_quantisation``), so the
# partner knows the target GPU's SM count. The tile is chosen with ``w`` by the same leave-one-signature-out folds
# (cuBLAS SIMT SGEMM kernels use 32x32 to 128x128 tiles, e.g. NeuSight's ``ampere_sgemm_64x64`` / ``_128x64``).
# NeuSight split (train GPUs only choose it, together with the split below): bmm picks 64x64, linear the plain
# roofline; H100 bmm 17.0 -> 14.0%, linear 13.4 -> 12.4% (costmodel/data/model/README.md).
PARTNER_TILES = (None, (32, 32), (64, 32), (64, 64), (128, 64), (128, 128))
# ... plus a fixed cost per wave of those tiles (seconds; ``features.calibrated_roofline_s``), also chosen by the
# folds: tile prologue/epilogue latency does not shrink on a GPU with faster SMs, so a new GPU with fast SMs runs
# small and mid-sized GEMMs further from its roofline (NeuSight split: bmm 64x64 tiles + 0.5 us, linear 4 us per
# 128x128 wave; H100 bmm 14.0 -> 11.8%, linear 12.4 -> 11.7%).
PARTNER_WAVE_S = (0.0, 0.5e-6, 1e-6, 2e-6, 4e-6, 8e-6)
# GEMM classes: rows faster than the split (ideal roofline, seconds) get their own weight. Small GEMMs are latency-
# and occupancy-bound, which the trees learned on every GPU; large ones are throughput-bound, where the partner's
# figures of the new device carry more (NeuSight split, chosen on the train GPUs: bmm splits at 30 us, weights
# 0.85 / 0.35, linear at 0.3 ms, 0.85 / 0.5). Not offered to the memory-bound classes: there LOSO picks a split too, but
# held-out A100-80GB softmax gets worse (12.4 -> 13.4%; costmodel/data/model/README.md).
BLEND_SPLITS_S = (0.0, 1e-5, 3e-5, 1e-4, 3e-4, 1e-3)


@dataclass
class Prepared:
    """Features, targets and bookkeeping for one table."""

    X: np.ndarray
    roof_s: np.ndarray
    y: np.ndarray
    table: KernelTable
    cal_s: np.ndarray  # calibrated roofline (seconds), the blend partner on unseen devices
    sig: np.ndarray  # per-row class signature (rows x 2), see ``features.device_signature``
    dev: dict = field(default_factory=dict)  # per-row device columns (``features.device_columns``)
    skipped_devices: list[str] = field(default_factory=list)


def prepare(table: KernelTable, measured: tuple[DeviceSpec, ...] = ()) -> Prepared:
    """Featurise the compute rows of ``table`` whose device is known (to the catalogues or ``measured``: the devices
    ``collect`` measured, ``datasets.Dataset.measured``); drop (and list) the others."""
    comp = table.select(np.isin(table.op, COMPUTE_KINDS))
    specs, missing = resolve_many(comp.device, measured)
    if missing:
        comp = comp.select(~np.isin(comp.device, missing))
    dev = device_columns(comp.device, comp.dtype, specs)
    X, roof = feature_matrix(comp.op, comp.b, comp.m, comp.n, comp.k, comp.dtype, comp.flops, comp.bytes, dev)
    y = np.log(comp.latency_s / roof)
    cal = calibrated_roofline_s(comp.op, comp.flops, comp.bytes, dev)
    return Prepared(X=X, roof_s=roof, y=y, table=comp, cal_s=cal, sig=device_signature(comp.op, dev),
                    skipped_devices=missing, dev=dev)


def fit_kind(X: np.ndarray, y: np.ndarray, n_estimators: int | None = None) -> xgb.Booster:
    """One booster on (features, log ratio); squared error on the log target ~ relative error.

    Classes with fewer than ``SMALL_CLASS_ROWS`` rows get depth-6 trees: same accuracy, a quarter of the file.
    """
    dtrain = xgb.QuantileDMatrix(X, label=y, max_bin=PARAMS["max_bin"], feature_names=list(FEATURES))
    params = PARAMS if len(y) >= SMALL_CLASS_ROWS else dict(PARAMS, max_depth=6)
    return xgb.train(params, dtrain, num_boost_round=n_estimators or N_ROUNDS)


def predict_ratio(model: xgb.Booster, X: np.ndarray) -> np.ndarray:
    """Predicted latency / ideal roofline, clipped at 1 (never below the roofline bound)."""
    return np.exp(np.maximum(model.inplace_predict(X), 0.0))


def _signature_groups(sig: np.ndarray) -> np.ndarray:
    """Integer group id per row: rows with the same signature (4 significant digits) share one."""
    keys = np.array([f"{a:.4g}|{b:.4g}" for a, b in sig])
    return np.unique(keys, return_inverse=True)[1]


def partner_s(prep: Prepared, rows: np.ndarray, tile, wave_s: float = 0.0) -> np.ndarray:
    """The blend partner of ``rows``, seconds: the calibrated roofline, wave-quantised with ``tile`` when given,
    plus ``wave_s`` per wave of output tiles (``features.calibrated_roofline_s``)."""
    if tile is None and not wave_s:
        return prep.cal_s[rows]
    t = prep.table
    return calibrated_roofline_s(t.op[rows], t.flops[rows], t.bytes[rows], {k: v[rows] for k, v in prep.dev.items()},
                                 (t.b[rows], t.m[rows], t.n[rows]), tile, wave_s)


def unseen_device_weight(prep: Prepared, idx: np.ndarray) -> dict:
    """Choose the unseen-device blend of one class by leave-one-signature-out over its GPU training rows: the
    weight ``w`` of rows whose ideal roofline is at least ``split_roofline_s`` (``weight``), the weight of the
    faster rows (``weight_small``), the split itself from ``BLEND_SPLITS_S`` (0: one weight for all rows) and, for
    GEMM classes, the partner's tile from ``PARTNER_TILES`` and its cost per wave from ``PARTNER_WAVE_S``.

    Each fold holds out every row of one signature group (the largest ``BLEND_MAX_FOLDS`` groups with at least
    ``BLEND_MIN_ROWS`` rows), trains a small model of the same recipe on the rest and scores every choice on the
    held-out group; the choice minimises the mean of the per-fold MAPEs. A fold's MAPE is a sum over its rows, so
    for a given tile and split the two weights are chosen independently.

    Returns:
        ``{"weight": w, "weight_small": w, "split_roofline_s": s, "tile": [tm, tn] or None, "wave_s": s,
        "folds": n, "lodo_mape_learned": %, "lodo_mape_blend": %}``; weight 1 (no blending) when fewer than
        ``BLEND_MIN_GROUPS`` GPU groups exist.
    """
    gpu = idx[prep.X[idx, FEATURES.index("is_cpu")] == 0]
    groups = _signature_groups(prep.sig[gpu])
    ids, counts = np.unique(groups, return_counts=True)
    big = [int(g) for c, g in sorted(zip(-counts, ids)) if -c >= BLEND_MIN_ROWS][:BLEND_MAX_FOLDS]
    if len(big) < BLEND_MIN_GROUPS:
        return {"weight": 1.0, "folds": len(big)}
    rng = np.random.default_rng(0)
    gemm = prep.table.op[idx[0]] in GEMM_KINDS
    tiles, splits = (PARTNER_TILES, BLEND_SPLITS_S) if gemm else ((None,), (0.0,))
    partners = [(t, c) for t in tiles for c in (PARTNER_WAVE_S if gemm else (0.0,))]
    # per fold: mean APE contribution of small / large rows, shape (tiles, splits, weights)
    small_part, large_part, learned = [], [], []
    for g in big:
        held = gpu[groups == g]
        rest = np.setdiff1d(idx, held)
        tr = np.sort(rng.choice(rest, min(len(rest), BLEND_TRAIN_ROWS), replace=False))
        te = np.sort(rng.choice(held, min(len(held), BLEND_TEST_ROWS), replace=False))
        model = fit_kind(prep.X[tr], prep.y[tr], BLEND_ROUNDS)
        lr = model.inplace_predict(prep.X[te])
        true = prep.table.latency_s[te]
        small = prep.roof_s[te][None, :] < np.array(splits)[:, None]  # (splits, rows)
        s_t, l_t = [], []
        for tile, wave_s in partners:
            part = partner_s(prep, te, tile, wave_s)
            e = np.array([ape(blend(prep.roof_s[te], lr, part, w), true) for w in BLEND_GRID])
            s_t.append((small[:, None, :] * e[None]).sum(axis=2) / len(te))
            l_t.append((~small[:, None, :] * e[None]).sum(axis=2) / len(te))
        small_part.append(s_t)
        large_part.append(l_t)
        learned.append(e[-1].mean())
    S, L = np.mean(small_part, axis=0), np.mean(large_part, axis=0)  # (partners, splits, weights)
    total = S.min(axis=2) + L.min(axis=2)
    ti, si = np.unravel_index(int(np.argmin(total)), total.shape)
    (tile, wave_s), split = partners[ti], splits[si]
    w_small, w_large = BLEND_GRID[int(np.argmin(S[ti, si]))], BLEND_GRID[int(np.argmin(L[ti, si]))]
    if split == 0.0:
        w_small = w_large
    return {"weight": float(w_large), "weight_small": float(w_small), "split_roofline_s": float(split),
            "tile": list(tile) if tile else None, "wave_s": float(wave_s), "folds": len(big),
            "lodo_mape_learned": round(float(np.mean(learned)), 2), "lodo_mape_blend": round(float(total[ti, si]), 2)}


def ape(pred_s: np.ndarray, true_s: np.ndarray) -> np.ndarray:
    """Absolute percentage error, %."""
    return 100.0 * np.abs(pred_s - true_s) / true_s


def train_models(prep: Prepared, progress=None, n_estimators: int | None = None,
                 max_rows_per_kind: int | None = None, kinds: tuple[str, ...] | None = None,
                 blend_unseen: bool = True) -> dict[str, dict]:
    """Fit one model per op kind present in ``prep``.

    Returns:
        ``{kind: {"model": Booster, "ranges": ..., "devices": [...], "dtypes": [...], "n_train": int,
        "train_mape": float, "signatures": [[a, b], ...], "unseen_device": {"weight": w, ...}}}``
        (``blend_unseen=False``: weight 1, the trees alone on every device).
    """
    out = {}
    for kind in [k for k in COMPUTE_KINDS if (prep.table.op == k).sum() >= MIN_ROWS]:
        if kinds is not None and kind not in kinds:
            continue
        idx = np.flatnonzero(prep.table.op == kind)
        if max_rows_per_kind and len(idx) > max_rows_per_kind:
            rng = np.random.default_rng(0)  # per kind, so retraining one kind reproduces its subsample
            idx = np.sort(rng.choice(idx, max_rows_per_kind, replace=False))
        X, y = prep.X[idx], prep.y[idx]
        model = fit_kind(X, y, n_estimators)
        pred = prep.roof_s[idx] * predict_ratio(model, X)
        cols = [FEATURES.index(f) for f in RANGE_FEATURES]
        out[kind] = {
            "model": model,
            "ranges": {f: [float(X[:, c].min()), float(X[:, c].max())] for f, c in zip(RANGE_FEATURES, cols)},
            "is_cpu": sorted({int(v) for v in X[:, FEATURES.index("is_cpu")]}),
            "devices": sorted(set(prep.table.device[idx])),
            "dtypes": sorted(set(prep.table.dtype[idx])),
            "n_train": int(len(idx)),
            "train_mape": float(np.mean(ape(pred, prep.table.latency_s[idx]))),
            "signatures": [[float(a), float(b)] for a, b in
                           np.unique(np.array([[float(f"{a:.4g}"), float(f"{b:.4g}")] for a, b in prep.sig[idx]]),
                                     axis=0)],
            "unseen_device": unseen_device_weight(prep, idx) if blend_unseen else {"weight": 1.0, "folds": 0},
        }
        if progress:
            progress(kind)
    return out


def save(models: dict[str, dict], out_dir: Path, data_files: list[tuple[str, str]], extra: dict | None = None) -> Path:
    """Write ``<kind>.ubj`` per kind and ``metadata.json`` (atomically; sha256 of each model file inside).

    Args:
        models: From :func:`train_models`.
        out_dir: Destination folder.
        data_files: ``(name relative to the data root, sha256)`` of every training file.
        extra: More metadata (collective model, timings).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {"format": FORMAT, "features": list(FEATURES), "target": "log(latency_s / ideal_roofline_s), clipped >= 0",
            "params": PARAMS | {"rounds": N_ROUNDS}, "range_margin_log2": [RANGE_MARGIN_LO, RANGE_MARGIN_HI],
            "data": [{"file": f, "sha256": h} for f, h in data_files], "kinds": {}}
    for kind, m in models.items():
        meta["kinds"][kind] = {k: v for k, v in m.items() if k != "model"} | save_kind(out_dir, kind, m["model"])
    meta.update(extra or {})
    write_atomic(out_dir / "metadata.json", json.dumps(meta, indent=1, sort_keys=True))
    return out_dir


def data_hashes(files: list[str], roots: list[str | Path]) -> list[tuple[str, str]]:
    """``(path relative to its data root's parent, sha256)`` for each file: no absolute paths in metadata.

    A compressed table is recorded by its own name and the sha256 of its content (``gemm.csv.xz`` as ``gemm.csv``),
    so a model trained on the repository's compressed copy names the same data as one trained on the plain files.
    """
    out = []
    for f in files:
        fp = Path(f).resolve()
        rel = table_name(fp).name
        for r in roots:
            rp = Path(r).resolve()
            if rp in fp.parents:
                rel = str(table_name(fp).relative_to(rp.parent))
                break
        out.append((rel, hashlib.sha256(table_bytes(fp)).hexdigest()))
    return out


def train(data: list[str | Path], out_dir: str | Path, progress=None, n_estimators: int | None = None,
          max_rows_per_kind: int | None = None) -> dict:
    """Load ``data``, fit the per-kind models and the collective model, save them to ``out_dir``.

    Returns:
        The metadata dict that was written (plus ``seconds``).

    Raises:
        MeshplanError: ``n_estimators`` or ``max_rows_per_kind`` below 1 (zero rounds or rows fit nothing; the
            subsampling loop never ended on them), no data, or ``out_dir`` overlapping the data.
    """
    for flag, count in (("--rounds", n_estimators), ("--max-rows", max_rows_per_kind)):
        if count is not None and count < 1:
            raise MeshplanError(f"{flag} {count}: expected a count >= 1")
    refuse_overlap(out_dir, {"--data": list(data)}, "--out")
    t0 = time.perf_counter()
    ds = load([Path(p) for p in data])
    table = ds.table
    prep = prepare(table, ds.measured)
    if len(prep.table) == 0:
        raise MeshplanError(f"{', '.join(map(str, data))}: no compute rows with a known device to train on")
    models = train_models(prep, progress=progress, n_estimators=n_estimators,
                          max_rows_per_kind=max_rows_per_kind or DEFAULT_MAX_ROWS)
    coll = collective_fit.fit(table)
    # Devices measured by `collect` (this machine's CPU) are in no catalogue: keep their vectors with the model so
    # that `costmodel predict --device cpu-1t --model DIR` can price them later, in another process.
    specs, _ = resolve_many(prep.table.device[prep.table.source == "local"], ds.measured)
    extra = {"collectives": coll, "skipped_devices": prep.skipped_devices,
             **({"measured_devices": [device_to_dict(d) for _, d in sorted(specs.items())]} if specs else {}),
             "train_seconds": round(time.perf_counter() - t0, 2)}
    save(models, Path(out_dir), data_hashes(list(ds.files), data), extra)
    return json.loads((Path(out_dir) / "metadata.json").read_text(encoding="utf-8"))


def export_trees(model_dir: str | Path, check_rows: int = 4000) -> dict[str, str]:
    """Write the numpy trees (``<kind>.npz``) of every class of a model folder from its ``.ubj`` boosters and record
    them in its ``metadata.json`` (for folders trained before the trees were saved with the boosters).

    Each class is checked before anything is written: ``check_rows`` rows whose every feature sits on, or one
    float32 step beside, a split threshold of that class (a few NaN among them) must predict exactly as xgboost's
    ``inplace_predict``.

    Returns:
        ``{kind: sha256 of its .npz}``.

    Raises:
        MeshplanError: an unreadable folder or booster, or trees that disagree with xgboost on a check row.
    """
    from meshplan.core.bounds import load_json_file
    from meshplan.costmodel.learned import _check_meta, _load_booster
    from meshplan.costmodel.trees import from_booster

    d = Path(model_dir)
    mpath = d / "metadata.json"
    meta = load_json_file(mpath, f"{mpath}: corrupt metadata")
    _check_meta(meta, mpath)
    entries = {}
    for kind, info in sorted(meta.get("kinds", {}).items()):
        booster = _load_booster(d / info["file"], info["sha256"])
        X = threshold_rows(from_booster(booster), check_rows, np.random.default_rng(0))
        got, want = from_booster(booster).predict(X), booster.inplace_predict(X)
        if not np.array_equal(got, want):
            raise MeshplanError(f"{d / info['file']}: numpy trees differ from xgboost on {int((got != want).sum())} of "
                                f"{len(X)} check rows (max {float(np.abs(got - want).max()):.3g}); nothing written")
        entries[kind] = save_trees(d, kind, booster, info["sha256"])  # the .ubj stays byte for byte (model id)
    for kind, entry in entries.items():
        meta["kinds"][kind]["trees"] = entry
    write_atomic(mpath, json.dumps(meta, indent=1, sort_keys=True))
    return {k: e["sha256"] for k, e in entries.items()}


def threshold_rows(ens, n: int, rng: np.random.Generator, nan_share: float = 0.02) -> np.ndarray:
    """``n`` float32 rows for checking an evaluator: each feature a split threshold of ``ens`` on that feature, or
    the next float32 above or below it (the comparisons where ``<`` against ``<=`` or a float64 cast would show),
    ``nan_share`` of the cells NaN (the default directions); features no tree splits on are 0."""
    X = np.zeros((n, ens.n_features), dtype=np.float32)
    internal = ens.threshold.ravel(), ens.feature.ravel()
    for j in range(ens.n_features):
        th = internal[0][internal[1] == j]
        if len(th):
            v = rng.choice(th, n)
            step = rng.integers(-1, 2, n)
            X[:, j] = np.where(step == 0, v, np.nextafter(v, np.where(step > 0, np.inf, -np.inf).astype(np.float32)))
    X[rng.random(X.shape) < nan_share] = np.nan
    return X
