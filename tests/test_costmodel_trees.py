"""The numpy tree evaluator (costmodel.trees) against xgboost's own prediction, the .npz files' checks, and the
plan path without xgboost."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from meshplan.core.errors import MeshplanError
from meshplan.costmodel.features import FEATURES, NUMEL_KINDS, device_columns, feature_matrix, flops_bytes
from meshplan.costmodel.learned import LearnedModel
from tests.helpers import REPO

SHIPPED = REPO / "costmodel" / "data" / "model"
GPUS = ("H100", "A100-40GB", "V100", "T4", "MI300X", "B200", "L4")  # trained-on and unseen classes alike


@pytest.fixture(scope="module")
def shipped():
    return LearnedModel.load(SHIPPED)


def _range_rows(model: LearnedModel, kind: str, rng: np.random.Generator, n: int = 3000) -> np.ndarray:
    """Feature rows of ``kind`` built like the planner's (``feature_matrix`` of random shapes, dtypes of its training
    and catalogue GPUs), kept where ``predict_arrays`` hands them to the trees: log2 FLOPs and bytes inside the
    class's training range widened by the metadata's margins."""
    from meshplan.costmodel.datasets.devices import resolve_many

    info = model.meta["kinds"][kind]
    specs, _ = resolve_many(list(info["devices"]) + list(GPUS))
    names = np.array(sorted(specs), dtype=object)
    lo_m, hi_m = model.meta["range_margin_log2"]
    keep = []
    for _ in range(20):
        c = 4 * n
        dev = rng.choice(names, c)
        dt = rng.choice(np.array(info["dtypes"], dtype=object), c)
        b = np.round(2 ** rng.uniform(0, 9, c)) if kind == "bmm" else np.ones(c)
        top = 36 if kind in NUMEL_KINDS else 18  # log2 of the largest m (the element count of a numel class)
        m, nn, k = np.round(2 ** rng.uniform(0, top, c)), np.round(2 ** rng.uniform(0, 18, c)), \
            np.round(2 ** rng.uniform(0, 16, c))
        kinds = np.full(c, kind, dtype=object)
        f, by = flops_bytes(kinds, b, m, nn, k, dt)
        X, _ = feature_matrix(kinds, b, m, nn, k, dt, f, by, device_columns(dev, dt, specs))
        ok = np.ones(c, dtype=bool)
        for feat, (lo, hi) in info["ranges"].items():
            v = X[:, FEATURES.index(feat)]
            ok &= (v >= lo - lo_m) & (v <= hi + hi_m)
        keep.append(X[ok])
        if sum(len(x) for x in keep) >= n:
            break
    return np.concatenate(keep)[:n]


def _edge_rows(ens, rng: np.random.Generator, n: int = 2000) -> np.ndarray:
    """Rows whose features sit on a split threshold of their column, one float32 step either side of it, NaN, +-0,
    +-inf, the largest float32 and values that overflow or underflow the float32 cast."""
    X = rng.normal(0.0, 20.0, (n, ens.n_features))
    for j in range(ens.n_features):
        th = ens.threshold[ens.feature == j]
        if len(th):
            v = rng.choice(th, n).astype(np.float32)
            X[:, j] = rng.choice(3, n).choose([v, np.nextafter(v, np.float32(np.inf)),
                                               np.nextafter(v, np.float32(-np.inf))])
    special = np.array([np.nan, 0.0, -0.0, np.inf, -np.inf, 3.4028235e38, 1e300, -1e300, 1e-46, -1e-46])
    mask = rng.random(X.shape) < 0.05
    X[mask] = rng.choice(special, int(mask.sum()))
    X[0] = np.nan  # a row missing everything: every default direction
    return X


def _shipped_copy(tmp_path):
    """A copy of the shipped model folder to break, and its metadata."""
    bad = tmp_path / "model"
    shutil.copytree(SHIPPED, bad)
    return bad, json.loads((bad / "metadata.json").read_text())


def _write_meta(folder, meta) -> None:
    (folder / "metadata.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("kind", sorted(json.loads((SHIPPED / "metadata.json").read_text())["kinds"]))
def test_numpy_trees_equal_xgboost_inplace_predict(shipped, kind):
    """Every shipped class, bit for bit: rows spanning its training range, threshold and special values, repeated
    rows (walked once each), and rows one at a time (a single row's sum runs along the contiguous axis, where numpy
    would sum pairwise)."""
    rng = np.random.default_rng(27)
    ens, booster = shipped.trees[kind], shipped.boosters[kind]
    real = _range_rows(shipped, kind, rng)
    assert len(real) >= 1000, f"{kind}: only {len(real)} in-range rows generated"
    edge = _edge_rows(ens, rng)
    for X in (real, edge, rng.permutation(np.concatenate([np.repeat(real[:300], 3, axis=0), edge[:300]]))):
        want = booster.inplace_predict(X)
        got = ens.predict(X)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, want)
    one = np.concatenate([ens.predict(real[i:i + 1]) for i in range(40)])
    np.testing.assert_array_equal(one, booster.inplace_predict(real[:40]))


def test_predict_arrays_price_equals_the_booster_formula(shipped):
    """End to end on a seen GPU: the price is roofline x exp(max(trees, 0)) with xgboost's own log ratio."""
    from meshplan.costmodel.devices import get_device

    dev = get_device("H100")
    rng = np.random.default_rng(3)
    m, n, k = (np.round(2 ** rng.uniform(6, 14, 300)) for _ in range(3))
    kinds, dt = np.full(300, "matmul", dtype=object), np.full(300, "bf16", dtype=object)
    devs = np.full(300, dev.name, dtype=object)
    sec, src = shipped.predict_arrays(kinds, np.ones(300), m, n, k, dt, devs, {dev.name: dev})
    f, by = flops_bytes(kinds, np.ones(300), m, n, k, dt)
    X, roof = feature_matrix(kinds, np.ones(300), m, n, k, dt, f, by, device_columns(devs, dt, {dev.name: dev}))
    learned = src == "learned"
    assert learned.sum() > 250
    want = roof * np.exp(np.maximum(shipped.boosters["matmul"].inplace_predict(X), 0.0))
    np.testing.assert_array_equal(sec[learned], want[learned])


def _corrupt(path, at: float = 0.5) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0xFF
    path.write_bytes(bytes(data))


def test_corrupt_npz_is_refused_by_name(tmp_path, runner):
    from meshplan.cli.main import app

    bad, _ = _shipped_copy(tmp_path)
    _corrupt(bad / "bmm.npz")
    with pytest.raises(MeshplanError, match=r"bmm\.npz: checksum mismatch"):
        LearnedModel.load(bad)
    r = runner.invoke(app, ["costmodel", "predict", "--op", "bmm", "--shape", "8x512x512x64", "--device", "H100",
                            "--model", str(bad)])
    assert r.exit_code == 2 and "bmm.npz: checksum mismatch" in r.output and "Traceback" not in r.output


def test_npz_with_matching_checksum_but_bad_content_is_refused(tmp_path):
    """A file the metadata vouches for but whose arrays do not fit (hand-edited metadata): one line naming it."""
    from meshplan.costmodel.learned import file_sha256

    bad, meta = _shipped_copy(tmp_path)
    ens = LearnedModel.load(SHIPPED).trees["softmax"]
    np.savez(bad / "softmax.npz", format=np.array("meshplan-trees/1"), feature=ens.feature.astype(np.int64),
             threshold=ens.threshold, default_left=ens.default_left, leaf=ens.leaf, base_score=ens.base_score,
             n_features=np.int64(ens.n_features))
    meta["kinds"]["softmax"]["trees"]["sha256"] = file_sha256(bad / "softmax.npz")
    _write_meta(bad, meta)
    with pytest.raises(MeshplanError, match=r"softmax\.npz: feature must be uint8"):
        LearnedModel.load(bad)
    (bad / "softmax.npz").write_bytes(b"PK\x03\x04 not a zip")
    meta["kinds"]["softmax"]["trees"]["sha256"] = file_sha256(bad / "softmax.npz")
    _write_meta(bad, meta)
    with pytest.raises(MeshplanError, match=r"softmax\.npz: cannot read the trees file"):
        LearnedModel.load(bad)


def test_trees_of_another_booster_are_refused(tmp_path):
    bad, meta = _shipped_copy(tmp_path)
    meta["kinds"]["matmul"]["trees"]["ubj_sha256"] = meta["kinds"]["bmm"]["sha256"]
    _write_meta(bad, meta)
    with pytest.raises(MeshplanError, match=r"matmul\.npz: exported from another booster than matmul\.ubj"):
        LearnedModel.load(bad)


def test_corrupt_ubj_is_refused_when_the_boosters_are_read(tmp_path):
    """The .ubj files no longer predict; training and checking code reads them through ``boosters``, checked."""
    bad, _ = _shipped_copy(tmp_path)
    _corrupt(bad / "matmul.ubj")
    m = LearnedModel.load(bad)  # prices from the intact .npz
    with pytest.raises(MeshplanError, match=r"matmul\.ubj: checksum mismatch"):
        m.boosters


def test_export_writes_the_shipped_trees_again(tmp_path, shipped):
    """A folder without the numpy trees (older than them; two small classes, to stay quick) still loads, through
    xgboost; the export command writes .npz files byte-identical to the shipped ones and leaves the .ubj alone."""
    from meshplan.costmodel.train import export_trees

    old = tmp_path / "model"
    old.mkdir()
    meta = json.loads((SHIPPED / "metadata.json").read_text())
    meta["kinds"] = {k: v for k, v in meta["kinds"].items() if k in ("layernorm", "swiglu")}
    for kind, info in meta["kinds"].items():
        info.pop("trees")
        shutil.copy(SHIPPED / info["file"], old / info["file"])
    (old / "metadata.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
    legacy = LearnedModel.load(old)
    X = _range_rows(shipped, "layernorm", np.random.default_rng(5), 500)
    np.testing.assert_array_equal(legacy.trees["layernorm"].predict(X), shipped.trees["layernorm"].predict(X))
    assert export_trees(old, check_rows=500) == {k: shipped.meta["kinds"][k]["trees"]["sha256"] for k in meta["kinds"]}
    written = json.loads((old / "metadata.json").read_text())["kinds"]
    for kind in meta["kinds"]:
        assert written[kind]["trees"] == shipped.meta["kinds"][kind]["trees"]
        assert (old / f"{kind}.ubj").read_bytes() == (SHIPPED / f"{kind}.ubj").read_bytes()
    assert LearnedModel.load(old).model_id == legacy.model_id


def test_training_saves_trees_that_equal_the_booster(tmp_path):
    """``train.save`` writes each class's .npz with its .ubj; the loaded trees predict as the booster."""
    from meshplan.costmodel.datasets.neusight import load_file
    from meshplan.costmodel.train import prepare, save, train_models
    from tests.helpers import data_path

    table = load_file(data_path("kernels", "neusight", "train", "ln.csv"), "neusight/train")
    prep = prepare(table)
    models = train_models(prep, n_estimators=20, blend_unseen=False)
    save(models, tmp_path, [])
    m = LearnedModel.load(tmp_path)
    assert m.meta["kinds"]["layernorm"]["trees"]["file"] == "layernorm.npz"
    np.testing.assert_array_equal(m.trees["layernorm"].predict(prep.X),
                                  models["layernorm"]["model"].inplace_predict(prep.X))


def test_plan_path_never_imports_xgboost():
    """A fresh process builds the shipped estimator and prices ops without importing xgboost."""
    code = ("import sys\n"
            "from meshplan.planner.estimate.select import estimator_for\n"
            "from meshplan.planner.cluster.spec import load_cluster\n"
            "from meshplan.costmodel.devices import get_device\n"
            "from meshplan.costmodel.ops import OpSpec\n"
            "est = estimator_for(load_cluster('2x8xH100'))\n"
            "print(est.pricer.name, est.pricer.predict(OpSpec('matmul', (4096, 4096, 4096), 'bf16'), "
            "get_device('H100')))\n"
            "assert 'xgboost' not in sys.modules, 'xgboost imported'\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("learned:")
