"""Load a trained model folder (``metadata.json`` + ``<kind>.ubj`` + ``<kind>.npz``) and predict op latencies in batch.

Each class's trees are evaluated from ``<kind>.npz`` by ``costmodel.trees`` (numpy, xgboost's own semantics): the
prediction path never imports xgboost, which only trains and checks (``LearnedModel.boosters`` loads the ``.ubj``
boosters on demand). Every model file's sha256 is checked against the metadata before it is read, so a corrupt or
edited file is a ``MeshplanError`` naming the file, never a crash inside numpy or xgboost. Queries outside the trained
range (a kind without a model, a device class never trained on, sizes far outside the training rows) are
priced by the calibrated roofline (``costmodel.roofline.ROOFLINE_EFFICIENCY``) and flagged as such. On a GPU whose
class signature (``costmodel.features.device_signature``) the class never trained on, the trees' prediction is
blended geometrically with the calibrated roofline (for GEMM classes wave-quantised on that GPU, with separate
weights for small and large GEMMs) as stored in the metadata (``costmodel.train.unseen_device_weight``;
costmodel/data/model/README.md).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from meshplan.core.atomic import write_atomic
from meshplan.core.bounds import load_json_file
from meshplan.core.errors import MeshplanError, validation_line
from meshplan.costmodel.collective_model import CollectiveModel
from meshplan.costmodel.devices import DeviceSpec, device_from_dict
from meshplan.costmodel.features import (
    FEATURES,
    blend,
    calibrated_roofline_s,
    device_columns,
    device_signature,
    feature_matrix,
    flops_bytes,
    signature_seen,
)
from meshplan.costmodel.ops import COMPUTE_KINDS, OpSpec
from meshplan.costmodel.roofline import KERNEL_LAUNCH_S
from meshplan.costmodel.trees import TreeEnsemble, from_booster, load_trees

FORMAT = "meshplan-costmodel/1"  # metadata.json "format" of a model folder (written by costmodel.train)

SOURCE_LEARNED = "learned"
SOURCE_NO_MODEL = "roofline (no model for this op class)"
SOURCE_RANGE = "roofline (outside the trained range)"
SOURCE_DEVICE = "roofline (device class not trained on)"
SOURCE_CALIBRATED = "calibrated (costmodel fit)"
# A learned price on a GPU whose class signature the model never trained on (``features.device_signature``) that
# left the physical band [roofline bound, UNSEEN_MAX_ROOFLINE x it]: below is clipped to the bound, above is kept
# and flagged (``costmodel.api.Pricer.warnings`` collects both for the planner to report).
SOURCE_UNSEEN_CLIPPED = "learned (unseen device, clipped to roofline)"
SOURCE_UNSEEN_ABOVE = "learned (unseen device, above 3x roofline)"
# Upper edge of the band, in multiples of the roofline bound plus the GPU launch floor
# (``costmodel.roofline.KERNEL_LAUNCH_S``: no kernel finishes faster than its launch, and without the floor every
# microsecond-scale GEMM would be flagged). Measured GEMMs are not clipped there: 29% of the 181k measured GEMM rows
# of data/kernels lie above 3x it (small NeuSight shapes near the ~20-30 us timing floor; P100/V100/A100-PCIe
# train rows), so a price above it is plausible but unverified for a device the trees never saw, and is reported.
UNSEEN_MAX_ROOFLINE = 3.0


def is_learned(source) -> np.ndarray:
    """True where a source string says the trees priced the op (plain or flagged on an unseen device)."""
    return np.char.startswith(np.asarray(source, dtype=str), SOURCE_LEARNED)


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file (model files are checked against their metadata before they are read)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def op_fields(op: OpSpec) -> tuple[float, float, float, float]:
    """``(b, m, n, k)`` table fields of an OpSpec (see ``costmodel.datasets.table``)."""
    s = op.shape
    if op.kind == "matmul":
        return 1.0, s[0], s[1], s[2]
    if op.kind == "bmm":
        return s[0], s[1], s[2], s[3]
    if op.kind == "attention":
        return s[0] * s[1], s[2], s[3], s[4]
    if op.kind in ("layernorm", "rmsnorm", "softmax", "embedding"):
        return 1.0, s[0], s[1], 1.0
    return 1.0, s[0], 1.0, 1.0


def ideal_roofline_s(op: OpSpec, device: DeviceSpec) -> float:
    """The bound the learned model never goes below, seconds (``costmodel.features`` roofline for ``op``)."""
    b, m, n, k = op_fields(op)
    kinds = np.array([op.kind], dtype=object)
    dt = np.array([op.dtype], dtype=object)
    f, by = flops_bytes(kinds, [b], [m], [n], [k], dt)
    dev = device_columns(np.array([device.name], dtype=object), dt, {device.name: device})
    _, roof = feature_matrix(kinds, [b], [m], [n], [k], dt, f, by, dev)
    mult = (op.flops / OpSpec(op.kind, op.shape, op.dtype).flops) if op.backward and op.flops else 1.0
    return float(roof[0]) * mult


class _TreesFile(BaseModel):
    """A class's numpy trees (``costmodel.trees``), exported from the booster whose ``.ubj`` has ``ubj_sha256``."""

    model_config = ConfigDict(extra="allow")

    file: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,128}$")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    ubj_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class _KindFile(BaseModel):
    model_config = ConfigDict(extra="allow")

    file: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,128}$")  # a file of the folder itself, never a path out of it
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    trees: _TreesFile | None = None  # absent in folders written before the numpy trees: read from the .ubj


class _Meta(BaseModel):
    """The keys of ``metadata.json`` this module reads (``costmodel.train`` writes it), typed at the edge."""

    model_config = ConfigDict(extra="allow")

    format: str
    features: list[str] = Field(max_length=1024)
    kinds: dict[str, _KindFile] = Field(default_factory=dict, max_length=64)
    measured_devices: list[dict] = Field(default_factory=list, max_length=1024)


def _check_meta(meta, mpath: Path) -> None:
    """One line naming the file and the first bad key of a model folder's metadata."""
    if not isinstance(meta, dict):
        raise MeshplanError(f"{mpath}: not a meshplan cost model (expected a JSON object)")
    try:
        _Meta.model_validate(meta)
    except ValidationError as exc:
        raise MeshplanError(f"{mpath}: {validation_line(exc)}") from None


def _checked(path: Path, sha256: str) -> Path:
    """``path`` if it exists and its sha256 is ``sha256``.

    Raises:
        MeshplanError: missing, or a checksum mismatch (naming the file).
    """
    if not path.is_file():
        raise MeshplanError(f"{path}: model file missing")
    got = file_sha256(path)
    if got != sha256:
        raise MeshplanError(f"{path}: checksum mismatch (sha256 {got[:12]}..., metadata says {sha256[:12]}...): the "
                            "model file is corrupt")
    return path


def _load_kind_trees(directory: Path, info: dict) -> TreeEnsemble:
    """A class's numpy trees, checked against the metadata (checksum, the booster they came from, the features)."""
    t = info["trees"]
    f = directory / t["file"]
    if t["ubj_sha256"] != info["sha256"]:
        raise MeshplanError(f"{f}: exported from another booster than {info['file']} (sha256 {t['ubj_sha256'][:12]}"
                            f"..., metadata says {info['sha256'][:12]}...): export the trees again")
    ens = load_trees(_checked(f, t["sha256"]))
    if ens.n_features != len(FEATURES):
        raise MeshplanError(f"{f}: trees over {ens.n_features} features, this meshplan version has {len(FEATURES)}")
    return ens


def _load_booster(path: Path, sha256: str):
    """An ``xgboost.Booster`` from a checked ``.ubj`` file (training and checking only: imports xgboost)."""
    import xgboost as xgb

    b = xgb.Booster()
    try:
        b.load_model(bytearray(_checked(path, sha256).read_bytes()))
    except xgb.core.XGBoostError as exc:
        raise MeshplanError(f"{path}: cannot load xgboost model ({str(exc).splitlines()[0]})") from None
    return b


def save_kind(out_dir: Path, kind: str, booster) -> dict:
    """Write ``<kind>.ubj`` and its numpy trees ``<kind>.npz`` (atomically) and return the class's metadata keys
    ``file``, ``sha256`` and ``trees``."""
    ubj = write_atomic(Path(out_dir) / f"{kind}.ubj", bytes(booster.save_raw(raw_format="ubj")))
    ubj_sha = file_sha256(ubj)
    return {"file": ubj.name, "sha256": ubj_sha, "trees": save_trees(out_dir, kind, booster, ubj_sha)}


def save_trees(out_dir: Path, kind: str, booster, ubj_sha256: str) -> dict:
    """Write ``<kind>.npz``, the numpy trees of ``booster`` (whose ``.ubj`` has ``ubj_sha256``), atomically; return
    the class's ``trees`` metadata entry."""
    npz = from_booster(booster).save(Path(out_dir) / f"{kind}.npz")
    return {"file": npz.name, "sha256": file_sha256(npz), "ubj_sha256": ubj_sha256}


class LearnedModel:
    """A loaded model folder.

    Attributes:
        directory: Where it was loaded from.
        meta: The metadata dict.
        trees: ``{kind: costmodel.trees.TreeEnsemble}``, what predicts.
        measured_devices: ``{name: DeviceSpec}`` of the devices ``collect`` measured and the model was trained on
            (this machine's CPU): in no catalogue, so the model carries them (``costmodel.devices.resolve(name,
            extra=...)``).
    """

    def __init__(self, directory: Path, meta: dict, trees: dict[str, TreeEnsemble], boosters: dict | None = None):
        self.directory = directory
        self.meta = meta
        self.trees = trees
        self._boosters = boosters
        self.measured_devices = {dd["name"]: device_from_dict(dd, str(Path(directory) / "metadata.json"))
                                 for dd in meta.get("measured_devices", [])}
        self._coll = None

    @classmethod
    def from_boosters(cls, directory: Path, meta: dict, boosters: dict) -> "LearnedModel":
        """A model of freshly trained ``{kind: xgboost.Booster}`` (evaluation), predicting through their arrays."""
        return cls(directory, meta, {k: from_booster(b) for k, b in boosters.items()}, dict(boosters))

    @classmethod
    def load(cls, directory: str | Path) -> "LearnedModel":
        """Load and verify a model folder.

        Raises:
            MeshplanError: missing/unreadable metadata, wrong format, a checksum mismatch or an unloadable file.
        """
        d = Path(directory)
        mpath = d / "metadata.json"
        if not mpath.is_file():
            raise MeshplanError(f"{mpath}: model metadata not found (train one with `meshplan costmodel train`)")
        meta = load_json_file(mpath, f"{mpath}: corrupt metadata")  # nesting, integers, finite numbers bounded
        _check_meta(meta, mpath)
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            found = meta.get("format") if isinstance(meta, dict) else "?"
            raise MeshplanError(f"{mpath}: not a meshplan cost model (format {found}, expected {FORMAT})")
        if meta.get("features") != list(FEATURES):
            raise MeshplanError(f"{mpath}: model features differ from this meshplan version's; retrain the model")
        trees, boosters = {}, {}
        for kind, info in meta.get("kinds", {}).items():
            if info.get("trees"):
                trees[kind] = _load_kind_trees(d, info)
            else:  # a folder written before the numpy trees: convert its booster (needs xgboost, ~0.1 s a class)
                boosters[kind] = _load_booster(d / info["file"], info["sha256"])
                trees[kind] = from_booster(boosters[kind])
        return cls(d, meta, trees, boosters if boosters else None)

    @property
    def boosters(self) -> dict:
        """``{kind: xgboost.Booster}`` of the ``.ubj`` files, for training and checking code only (imports
        xgboost and loads each file on first use; prediction goes through :attr:`trees`).

        Raises:
            MeshplanError: a ``.ubj`` file missing, corrupt (checksum) or unloadable.
        """
        if self._boosters is None or set(self._boosters) != set(self.trees):
            have = self._boosters or {}
            self._boosters = {k: have[k] if k in have else _load_booster(Path(self.directory) / info["file"],
                                                                          info["sha256"])
                              for k, info in self.meta.get("kinds", {}).items() if k in self.trees}
        return self._boosters

    @property
    def model_id(self) -> str:
        """12 hex digits identifying what prices an op: the trees (the model files' checksums), the unseen-device
        fallback settings chosen at training, and the calibrations fitted on runs."""
        import hashlib

        h = hashlib.sha256()
        for kind in sorted(self.meta.get("kinds", {})):
            h.update(str(self.meta["kinds"][kind].get("sha256", kind)).encode())
            h.update(json.dumps(self.meta["kinds"][kind].get("unseen_device", {}), sort_keys=True).encode())
        h.update(json.dumps(self.meta.get("calibration", {}), sort_keys=True).encode())
        return h.hexdigest()[:12]

    @property
    def kinds(self) -> list[str]:
        return sorted(self.trees)

    def collective_model(self):
        """The fitted collective model stored in the metadata, or ``None``."""
        if self._coll is None and self.meta.get("collectives"):
            self._coll = CollectiveModel(self.meta["collectives"])
        return self._coll

    def predict_arrays(self, op, b, m, n, k, dtype, devices: np.ndarray, specs: dict[str, DeviceSpec],
                       use_fallback: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Vectorised prediction for table-form rows.

        Args:
            op, b, m, n, k, dtype: Row arrays (table convention).
            devices: Device name per row; ``specs`` maps each name to its ``DeviceSpec``.
            use_fallback: Price out-of-range rows by the roofline (``False``: always use the tree, for eval).

        Returns:
            ``(seconds, source)``: latency per row and a string array saying where each number came from.

        Raises:
            MeshplanError: an op class that is not a compute kind.
        """
        op = np.asarray(op, dtype=object)
        unknown = sorted(set(op) - set(COMPUTE_KINDS))
        if unknown:
            raise MeshplanError(f"unknown op class '{unknown[0]}' (known: {', '.join(COMPUTE_KINDS)})")
        dtype = np.asarray(dtype, dtype=object)
        devices = np.asarray(devices, dtype=object)
        flops, nbytes = flops_bytes(op, b, m, n, k, dtype)
        dev = device_columns(devices, dtype, specs)
        X, roof = feature_matrix(op, b, m, n, k, dtype, flops, nbytes, dev)
        # Calibrated roofline: max(F / (eff_f peak), B / (eff_b bw)) + a launch floor on GPUs.
        cal = calibrated_roofline_s(op, flops, nbytes, dev)
        out = cal.copy()
        sig = device_signature(op, dev)
        source = np.full(len(op), SOURCE_NO_MODEL, dtype=object)
        lo_m, hi_m = self.meta.get("range_margin_log2", [1.0, 4.0])
        for kind in np.unique(op):
            if kind not in self.trees:
                continue
            info = self.meta["kinds"][kind]
            idx = np.flatnonzero(op == kind)
            ok = np.ones(len(idx), dtype=bool)
            dev_ok = np.isin(dev["is_cpu"][idx].astype(int), info["is_cpu"])
            if use_fallback:
                for f, (lo, hi) in info["ranges"].items():
                    v = X[idx, FEATURES.index(f)]
                    ok &= (v >= lo - lo_m) & (v <= hi + hi_m)
                ok &= dev_ok
            source[idx[~ok]] = SOURCE_RANGE
            source[idx[~dev_ok]] = SOURCE_DEVICE
            use = idx[ok]
            if len(use):
                log_ratio = self.trees[kind].predict(X[use])
                out[use] = roof[use] * np.exp(np.maximum(log_ratio, 0.0))  # never below the ideal roofline
                source[use] = SOURCE_LEARNED
                # A GPU whose class signature the trees never saw: shrink toward the (wave-quantised) calibrated
                # roofline with the weights chosen by leave-one-signature-out at training time
                # (costmodel.train.unseen_device_weight).
                ud = info.get("unseen_device", {})
                new = (~signature_seen(sig[use], info["signatures"]) if "signatures" in info
                       else np.zeros(len(use), dtype=bool)) & (dev["is_cpu"][use] == 0)
                if min(ud.get("weight", 1.0), ud.get("weight_small", 1.0)) < 1.0 and new.any():
                    u = use[new]
                    tile, wave_s = ud.get("tile"), ud.get("wave_s", 0.0)
                    partner = cal[u] if not (tile or wave_s) else calibrated_roofline_s(
                        op[u], flops[u], nbytes[u], {c: v[u] for c, v in dev.items()},
                        (np.asarray(b, dtype=np.float64)[u], np.asarray(m, dtype=np.float64)[u],
                         np.asarray(n, dtype=np.float64)[u]), tuple(tile) if tile else None, wave_s)
                    w = ud.get("weight", 1.0)
                    w_rows = np.where(roof[u] < ud.get("split_roofline_s", 0.0), ud.get("weight_small", w), w)
                    out[u] = blend(roof[u], log_ratio[new], partner, w_rows)
                if new.any():
                    # The band check of a device the trees never saw: the trees alone below the roofline bound are
                    # clipped to it (blend / the clip above) and flagged; a price above 3x the bound (+ launch floor) is
                    # flagged. Seen devices keep the plain source.
                    u = use[new]
                    source[u[out[u] <= roof[u] * (1.0 + 1e-9)]] = SOURCE_UNSEEN_CLIPPED
                    high = out[u] > UNSEEN_MAX_ROOFLINE * (roof[u] + KERNEL_LAUNCH_S)
                    source[u[high]] = SOURCE_UNSEEN_ABOVE
        self._apply_calibrations(op, devices, roof, out, source)
        return out, source

    def _apply_calibrations(self, op: np.ndarray, devices: np.ndarray, roof: np.ndarray, out: np.ndarray,
                            source: np.ndarray) -> None:
        """Calibrations fitted on profiled runs of a device (costmodel.refit, `meshplan costmodel fit --out`) take
        precedence for that device: ``out`` and ``source`` are overwritten on its rows."""
        for dev_name, kinds in self.meta.get("calibration", {}).items():
            for kind, c in kinds.items():
                sel = (devices == dev_name) & (op == kind)
                if sel.any():
                    out[sel] = c["overhead_s"] + max(1.0, c["roofline_multiple"]) * roof[sel]
                    source[sel] = SOURCE_CALIBRATED

    def predict_ops(self, ops: list[OpSpec], device: DeviceSpec | list[DeviceSpec]) -> tuple[np.ndarray, np.ndarray]:
        """Latency (s) and source of each compute op on ``device`` (one device, or one per op).

        Backward ops are priced as their forward shape times the FLOP (or byte) multiple that
        ``costmodel.ops`` assigns to the backward (2x for GEMMs, 2.5x for flash attention).
        """
        devs = device if isinstance(device, list) else [device] * len(ops)
        specs = {d.name: d for d in devs}
        fields = np.array([op_fields(o) for o in ops], dtype=np.float64).reshape(-1, 4)
        sec, src = self.predict_arrays([o.kind for o in ops], fields[:, 0], fields[:, 1], fields[:, 2], fields[:, 3],
                                       [o.dtype for o in ops], np.array([d.name for d in devs], dtype=object), specs)
        for i, o in enumerate(ops):
            if o.backward:
                fwd = OpSpec(o.kind, o.shape, o.dtype, o.group_size, o.causal, False)
                base = fwd.flops if fwd.flops > 0 else fwd.bytes
                sec[i] *= (o.flops if fwd.flops > 0 else o.bytes) / base if base else 1.0
        return sec, src
