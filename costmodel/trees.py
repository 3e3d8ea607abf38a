"""A trained xgboost tree ensemble as numpy arrays, evaluated without xgboost.

Prediction (``meshplan plan``, ``costmodel predict``) loads one ``<kind>.npz`` per op class and walks the trees here;
xgboost is needed only to train and to check (``costmodel.train`` writes the arrays next to each ``<kind>.ubj``).
Importing xgboost and loading nine UBJSON boosters cost ~0.7 s per process, more than a whole layout search.

Layout: every tree is stored as a complete binary tree of depth ``D`` (the ensemble's deepest tree) in heap order,
node ``p``'s children at ``2p + 1`` (left) and ``2p + 2`` (right). A leaf above depth ``D`` is copied into every
bottom slot below it, so each row takes exactly ``D`` steps in every tree, and a step is a few gathers over all
(tree, row) pairs at once; the padded internal slots under such a leaf may send a row either way.

Semantics are xgboost's own CPU predictor (``src/predictor/cpu_predictor.cc``, ``include/xgboost/tree_model.h``
``RegTree::GetNext``, xgboost 3.x): features are read as float32; a row goes left when ``x < split_condition``
(float32) and follows the node's default direction when ``x`` is NaN (missing); the prediction is
``base_score + tree_0 + tree_1 + ...`` accumulated in float32 in tree order; ``reg:squarederror`` returns the
margin as is. Only numerical splits and one output per tree (what ``costmodel.train`` trains) are accepted.
"""
from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from meshplan.core.atomic import write_atomic
from meshplan.core.errors import MeshplanError

FORMAT = "meshplan-trees/1"  # the "format" array of a trees file
MAX_DEPTH = 16  # 2^16 slots per tree: far above the trained depths (6 and 8), keeps a bad file from allocating GBs
DEDUP_ROWS = 64  # above this many rows, walk only the distinct ones (np.unique costs less than the repeats' walk)
ROW_CHUNK = 256  # rows walked at once: the (trees x rows) index arrays stay in cache (fastest of 64-2048 measured)
_OBJECTIVES = ("reg:squarederror",)  # objectives whose prediction is the raw margin (no link function)


@dataclass(frozen=True, eq=False)
class TreeEnsemble:
    """An ensemble in heap layout.

    Attributes:
        feature: (trees, 2^D - 1) uint8, the feature index each internal slot splits on.
        threshold: (trees, 2^D - 1) float32, ``x < threshold`` goes left.
        default_left: (trees, 2^D - 1) bool, where a missing (NaN) feature goes.
        leaf: (trees, 2^D) float32, the value of each bottom slot.
        base_score: float32 margin every prediction starts from.
        n_features: Columns a row must have.
    """

    feature: np.ndarray
    threshold: np.ndarray
    default_left: np.ndarray
    leaf: np.ndarray
    base_score: np.float32
    n_features: int

    def __post_init__(self):
        # feature indices as gather offsets, converted once rather than on every level of every call
        object.__setattr__(self, "_feature_flat", self.feature.ravel().astype(np.intp))

    @property
    def depth(self) -> int:
        return int(self.leaf.shape[1]).bit_length() - 1

    @property
    def n_trees(self) -> int:
        return int(self.leaf.shape[0])

    def predict(self, X) -> np.ndarray:
        """The margin (for ``reg:squarederror`` the prediction) of each row of ``X`` (rows x ``n_features``), float32,
        equal to xgboost's ``Booster.inplace_predict`` on the same rows."""
        with np.errstate(over="ignore"):  # xgboost casts its input to float32 first, beyond 3.4e38 to +-inf
            X = np.asarray(X, dtype=np.float32)
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise ValueError(f"expected rows x {self.n_features} features, got shape {X.shape}")
        if len(X) > DEDUP_ROWS:
            # The planner's batches repeat feature rows (ops that differ only in fields the features do not read:
            # Qwen3-30B-A3B's 1,120 matmul rows are 169 distinct), and the walk costs per row: walk each distinct
            # row once. Rows are compared as bytes, so a row and its copy get the same float32 sum.
            X = np.ascontiguousarray(X)
            keys = X.view(np.dtype((np.void, X.itemsize * X.shape[1]))).ravel()
            _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
            if len(first) < len(X):
                return self._walk(X[first])[inverse.ravel()]
        return self._walk(X)

    def _walk(self, X: np.ndarray) -> np.ndarray:
        out = np.empty(len(X), dtype=np.float32)
        for lo in range(0, len(X), ROW_CHUNK):
            out[lo:lo + ROW_CHUNK] = self._predict_chunk(X[lo:lo + ROW_CHUNK])
        return out

    def _predict_chunk(self, X: np.ndarray) -> np.ndarray:
        rows, n_trees = len(X), self.n_trees
        inner = (1 << self.depth) - 1
        tree = np.arange(n_trees, dtype=np.intp)[:, None]
        tree_base = tree * inner  # each tree's root slot in the flat arrays
        child_base = 1 - tree_base  # a child's flat slot is 2 * slot + right + 1 - tree_base (heap 2p + 1 + right)
        row_base = np.arange(rows, dtype=np.intp)[None, :] * self.n_features  # each row's first feature, flat
        xs, thr, feat = X.ravel(), self.threshold.ravel(), self._feature_flat
        missing = bool(np.isnan(X).any())
        # The roots by whole feature columns (one split per tree, no gather per row) ...
        x = X.T[self.feature[:, 0]]
        right = x >= self.threshold[:, :1]  # == not (x < threshold) for every non-NaN x
        if missing:
            nan = np.isnan(x)
            right[nan] = ~np.broadcast_to(self.default_left[:, :1], x.shape)[nan]
        slot = tree_base + 1 + right
        fi = np.empty(slot.shape, dtype=np.intp)
        # Every index below is in range by construction (``load_trees`` checks the feature indices), so the gathers
        # skip numpy's bounds check (mode="clip": about 1.8x faster than the default "raise").
        for _ in range(self.depth - 1):  # ... then one gather per level below them
            np.take(feat, slot, out=fi, mode="clip")
            fi += row_base
            x = np.take(xs, fi, mode="clip")
            np.greater_equal(x, np.take(thr, slot, mode="clip"), out=right)
            if missing:
                nan = np.isnan(x)
                right[nan] = ~np.take(self.default_left.ravel(), slot[nan])
            slot *= 2
            slot += right
            slot += child_base
        # Bottom heap positions inner .. 2 inner of tree t are its leaves 0 .. inner: leaf slot = slot + t - inner.
        vals = np.take(self.leaf.ravel(), slot + (tree - inner), mode="clip")
        # A running sum is sequential by definition, tree after tree in float32: xgboost's order. (``np.sum`` is not:
        # along a contiguous axis, as for a single row, numpy sums pairwise and differs in the last bit.)
        acc = np.full((1, rows), self.base_score, dtype=np.float32)
        return np.add.accumulate(np.concatenate([acc, vals]), axis=0, dtype=np.float32)[-1]

    def to_bytes(self) -> bytes:
        """The ``.npz`` content: stored, not deflated (loading is a copy), with fixed member timestamps so that the
        same trees always give the same bytes and sha256 (``np.savez`` stamps the current time)."""
        arrays = {"format": np.array(FORMAT), "feature": self.feature, "threshold": self.threshold,
                  "default_left": self.default_left, "leaf": self.leaf, "base_score": np.float32(self.base_score),
                  "n_features": np.int64(self.n_features)}
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
            for name, arr in arrays.items():
                member = io.BytesIO()
                np.lib.format.write_array(member, np.asarray(arr), allow_pickle=False)
                zf.writestr(zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0)), member.getvalue())
        return buf.getvalue()

    def save(self, path: str | Path) -> Path:
        """Write the ``.npz`` atomically."""
        return write_atomic(path, self.to_bytes())


def load_trees(path: str | Path) -> TreeEnsemble:
    """Read a trees file (``np.load``, no pickle) and check its arrays fit together.

    Raises:
        MeshplanError: unreadable, not a trees file, or arrays of the wrong type or shape (naming the file).
    """
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in ("format", "feature", "threshold", "default_left", "leaf", "base_score",
                                        "n_features")}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        raise MeshplanError(f"{path}: cannot read the trees file ({str(exc).splitlines()[0] if str(exc) else exc!r})"
                            ) from None
    problem = _problem(arrays)
    if problem:
        raise MeshplanError(f"{path}: {problem}")
    return TreeEnsemble(arrays["feature"], arrays["threshold"], arrays["default_left"], arrays["leaf"],
                        np.float32(arrays["base_score"]), int(arrays["n_features"]))


def _problem(a: dict) -> str | None:
    """What is wrong with a trees file's arrays, or ``None``."""
    if a["format"].shape != () or str(a["format"]) != FORMAT:
        return f"not a meshplan trees file (format {a['format']!s:.40}, expected {FORMAT})"
    leaf, feat = a["leaf"], a["feature"]
    if leaf.dtype != np.float32 or leaf.ndim != 2 or leaf.shape[1] < 2 or leaf.shape[1] & (leaf.shape[1] - 1):
        return "leaf values must be float32 (trees x a power of two)"
    if leaf.shape[1] > 1 << MAX_DEPTH:
        return f"trees deeper than {MAX_DEPTH} levels"
    inner = (leaf.shape[0], leaf.shape[1] - 1)
    for name, dt in (("feature", np.uint8), ("threshold", np.float32), ("default_left", np.bool_)):
        if a[name].dtype != dt or a[name].shape != inner:
            return f"{name} must be {np.dtype(dt).name} of shape {inner}, got {a[name].dtype} {a[name].shape}"
    if a["base_score"].shape != () or a["n_features"].shape != () or a["n_features"].dtype.kind != "i":
        return "base_score and n_features must be scalars"
    if not 0 < int(a["n_features"]) <= 256 or (feat.size and int(feat.max()) >= int(a["n_features"])):
        return f"feature indices outside the {int(a['n_features'])} features"
    if not (np.isfinite(leaf).all() and np.isfinite(a["base_score"])):
        return "non-finite leaf value or base score"
    return None


def from_booster(booster) -> TreeEnsemble:
    """The arrays of a trained ``xgboost.Booster`` (through its own JSON dump: no xgboost import here).

    Raises:
        MeshplanError: a model this evaluator does not reproduce (categorical splits, several outputs, a
            non-tree booster, an objective with a link function).
    """
    config = json.loads(booster.save_config())["learner"]
    model = json.loads(booster.save_raw(raw_format="json"))["learner"]
    return from_xgboost_json(model, config)


def from_xgboost_json(model: dict, config: dict) -> TreeEnsemble:
    """Heap-layout arrays from a booster's JSON model (``save_raw('json')['learner']``) and config
    (``save_config()['learner']``)."""
    objective = config["objective"]["name"]
    param = model["learner_model_param"]
    gb = model["gradient_booster"]
    if gb.get("name") != "gbtree" or objective not in _OBJECTIVES or int(param.get("num_target", 1)) != 1 \
            or int(param.get("num_class", 0)) > 1:
        raise MeshplanError(f"booster {gb.get('name')} / {objective}: only single-output gbtree regressors "
                            f"({', '.join(_OBJECTIVES)}) have a numpy evaluator")
    trees = gb["model"]["trees"]
    if any(any(t["split_type"]) for t in trees):
        raise MeshplanError("categorical splits have no numpy evaluator")
    # base_score is saved as "[1.2007395E0]" (xgboost >= 3, one per target) or "1.2007395E0"
    base = np.float32(float(str(param["base_score"]).strip("[]")))
    return _heap(trees, base, int(param["num_feature"]))


def _heap(trees: list[dict], base_score: np.float32, n_features: int) -> TreeEnsemble:
    """Place every tree's nodes at their heap positions, level by level over all trees at once."""
    sizes = np.array([len(t["left_children"]) for t in trees])
    start = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    tree_of = np.repeat(np.arange(len(trees)), sizes)

    def cat(key, dtype):
        return np.concatenate([np.asarray(t[key], dtype=dtype) for t in trees])

    left, right = cat("left_children", np.int64), cat("right_children", np.int64)
    internal = left != -1
    left = np.where(internal, left + start[tree_of], -1)  # global node ids
    right = np.where(internal, right + start[tree_of], -1)
    pos = np.zeros(len(left), dtype=np.int64)  # heap position within its tree
    level = np.zeros(len(left), dtype=np.int64)
    frontier = start.copy()  # the roots
    while len(frontier):
        parents = frontier[internal[frontier]]
        pos[left[parents]], pos[right[parents]] = 2 * pos[parents] + 1, 2 * pos[parents] + 2
        level[left[parents]] = level[right[parents]] = level[parents] + 1
        frontier = np.concatenate([left[parents], right[parents]])
    depth = max(1, int(level.max()))  # a one-leaf ensemble still takes one step into two equal leaves
    if depth > MAX_DEPTH:
        raise MeshplanError(f"trees of depth {depth}: deeper than the {MAX_DEPTH} levels the evaluator allows")
    inner = (1 << depth) - 1
    feature = np.zeros((len(trees), inner), dtype=np.uint8)
    threshold = np.zeros((len(trees), inner), dtype=np.float32)
    default_left = np.ones((len(trees), inner), dtype=bool)
    cond = cat("split_conditions", np.float32)  # for a leaf: its value (xgboost keeps both in one field)
    n = np.flatnonzero(internal)
    feature[tree_of[n], pos[n]] = cat("split_indices", np.int64)[n]
    threshold[tree_of[n], pos[n]] = cond[n]
    default_left[tree_of[n], pos[n]] = cat("default_left", np.int64)[n] != 0
    # A leaf at level d covers the 2^(D-d) bottom slots of its subtree, which start at (pos + 1) 2^(D-d) - 1.
    lv = np.flatnonzero(~internal)
    span = np.left_shift(1, depth - level[lv])
    first = ((pos[lv] + 1) * span - 1 - inner) + tree_of[lv] * (inner + 1)
    offsets = np.arange(span.sum()) - np.repeat(np.cumsum(span) - span, span)
    leaf = np.zeros(len(trees) * (inner + 1), dtype=np.float32)
    leaf[np.repeat(first, span) + offsets] = np.repeat(cond[lv], span)
    return TreeEnsemble(feature, threshold, default_left, leaf.reshape(len(trees), inner + 1), base_score,
                        n_features)
