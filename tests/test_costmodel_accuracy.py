"""Held-out accuracy of the learned model on NeuSight's own split, pinned (issue 4 item 4).

Truth is NeuSight's measured kernel latencies (sitar-lab/NeuSight, ../shared/kernels/neusight/test); the model
trains only on ``neusight/train`` (P4, P100, T4, V100, A100-40GB). The unseen-device blend weight is chosen by
leave-one-signature-out over those five training GPUs (for GEMMs also the partner's tile and cost per wave of output
tiles, and a separate weight for small GEMMs), so no row of a test device is used to fit anything.
Figures were measured with ``python bench/costmodel_bench.py --splits neusight`` (model README, before/after).
"""
from __future__ import annotations

import numpy as np
import pytest

from meshplan.costmodel.datasets.table import table_file
from meshplan.costmodel.eval import _fit_eval
from meshplan.costmodel.train import prepare, train_models
from tests.helpers import data_path


def _neusight(files: tuple[str, ...], gemm: bool = False):
    from meshplan.costmodel.datasets.neusight import load_file
    from meshplan.costmodel.datasets.table import KernelTable, table_files

    root = data_path("kernels", "neusight")
    parts = []
    for split in ("train", "test"):
        # GEMM training files are per GPU under train/<op>/; everything else is one CSV per split (stored plain or
        # compressed beside its name: table_file / table_files find either).
        paths = [table_file(root / split / f) for f in files] if not (gemm and split == "train") else [
            p for f in files for p in table_files(root / split / f.removesuffix(".csv"), "*.csv")]
        parts += [load_file(p, f"neusight/{split}") for p in paths if p is not None]
    table = KernelTable.concat(parts)
    return table.select(table.source == "neusight/train"), table.select(table.source == "neusight/test")


@pytest.fixture(scope="module")
def ln_softmax():
    return _neusight(("ln.csv", "softmax.csv"))


def _by(rows):
    return {(r["device"], r["op"]): r for r in rows}


def test_blend_weight_comes_from_training_gpus_only(ln_softmax):
    train, _ = ln_softmax
    models = train_models(prepare(train))
    for kind in ("layernorm", "softmax"):
        info = models[kind]
        assert info["unseen_device"]["folds"] == 5  # one fold per training GPU's memory signature
        # Shrinking toward the calibrated roofline helped on the held-out training GPUs, so w < 1 was chosen.
        assert info["unseen_device"]["weight"] < 1.0
        assert info["unseen_device"]["lodo_mape_blend"] < info["unseen_device"]["lodo_mape_learned"]
        # The test GPUs' memory signatures (A100-80GB PCIe 1935 GB/s, L4 300 GB/s) are not among the trained ones.
        bws = {round(a / 1e9) for a, _ in info["signatures"]}
        assert bws == {192, 320, 732, 900, 1555}


@pytest.fixture(scope="module")
def ln_softmax_cli_eval(tmp_path_factory):
    """``meshplan costmodel eval --split neusight [--no-blend] --json`` on NeuSight's LN + softmax files only: (rows
    blended, rows of the trees alone), each by (device, op). One pair of fits for the CLI test and the pinned
    figures below, which the command computes as ``costmodel.eval`` does in this process."""
    import json
    import shutil

    from typer.testing import CliRunner

    from meshplan.cli.main import app

    root, data = data_path("kernels", "neusight"), tmp_path_factory.mktemp("ln_softmax")
    for split in ("train", "test"):
        (data / "neusight" / split).mkdir(parents=True)
        for f in ("ln.csv", "softmax.csv"):
            src = table_file(root / split / f)
            shutil.copy(src, data / "neusight" / split / src.name)
    out = {}
    for flag in ([], ["--no-blend"]):
        res = CliRunner().invoke(app, ["costmodel", "eval", "--split", "neusight", "--data", str(data), "--json",
                                       *flag])
        assert res.exit_code == 0, res.output
        out[bool(flag)] = _by(json.loads(res.output[res.output.index("["):]))
    return out[False], out[True]


def test_neusight_layernorm_softmax_pinned(ln_softmax_cli_eval):
    """A100-80GB PCIe (unseen) LN / softmax, measured 10.7 / 12.4% MAPE after; 10.6 / 15.8% with trees alone."""
    after, before = ln_softmax_cli_eval
    a100, l4 = "A100-PCIe-80GB", "L4"
    assert after[(a100, "layernorm")]["mape"] <= 11.5
    assert after[(a100, "softmax")]["mape"] <= 13.5
    assert after[(a100, "softmax")]["mape"] < before[(a100, "softmax")]["mape"] - 2.0
    # L4 (power-limited, unseen): trees alone 36 / 26%; the blend roughly halves both.
    for op in ("layernorm", "softmax"):
        assert after[(l4, op)]["mape"] < 0.75 * before[(l4, op)]["mape"]
    # Seen GPUs (their signatures were trained on) are priced by the trees alone: identical either way.
    for dev in ("P100", "T4", "V100-PCIe-32GB", "A100-PCIe-40GB"):
        assert after[(dev, "layernorm")]["mape"] == before[(dev, "layernorm")]["mape"]


def test_neusight_gemm_unseen_h100_quick(monkeypatch):
    """Reduced GEMM split (linear only, 15k rows, 120 trees): the blend lowers H100 error, and its wave-quantised
    partner with a separate weight for small GEMMs lowers it further; A100-80GB untouched."""
    import meshplan.costmodel.train as T

    train, test = _neusight(("linear.csv",), gemm=True)
    after = _by(_fit_eval(train, test, n_estimators=120, max_rows=15000))
    before = _by(_fit_eval(train, test, n_estimators=120, max_rows=15000, blend_unseen=False))
    # The blend of the previous model: the plain calibrated roofline as partner, one weight for every row.
    monkeypatch.setattr(T, "PARTNER_TILES", (None,))
    monkeypatch.setattr(T, "PARTNER_WAVE_S", (0.0,))
    monkeypatch.setattr(T, "BLEND_SPLITS_S", (0.0,))
    plain = _by(_fit_eval(train, test, n_estimators=120, max_rows=15000))
    h100 = ("H100-SXM", "matmul")
    assert after[h100]["mape"] < plain[h100]["mape"] - 1.0 < before[h100]["mape"] - 1.0
    assert after[h100]["mape"] <= 12.8  # measured 12.2 (14.1 plain blend, 15.2 with trees alone)
    # A100-80GB PCIe shares the A100-40GB's GEMM signature (108 SMs, 19.5 TFLOP/s fp32): trees alone.
    a = ("A100-PCIe-80GB", "matmul")
    assert after[a]["mape"] == before[a]["mape"] and after[a]["mape"] <= 12.0


@pytest.mark.slow  # 13-35 s; test_neusight_gemm_unseen_h100_quick is its smaller instance in the default run
def test_neusight_gemm_full_split_pinned():
    """Full NeuSight GEMM split (13 s on 2 cores): H100 bmm 21.5 (trees alone) -> 17.0 (plain blend) -> 11.8,
    linear 14.1 -> 13.4 -> 11.7 (issue 4's <= 12 met, thinly); A100-80GB kept (costmodel/data/model/README.md)."""
    train, test = _neusight(("bmm.csv", "linear.csv"), gemm=True)
    models = train_models(prepare(train))
    for kind in ("bmm", "matmul"):
        ud = models[kind]["unseen_device"]
        # chosen on the five training GPUs: a partner with a cost per wave of output tiles, a split between small
        # and large GEMMs with the small ones trusting the trees more, and a blend that beats the trees there
        assert ud["folds"] == 5 and ud["split_roofline_s"] > 0 and ud["weight_small"] > ud["weight"]
        assert ud["wave_s"] > 0 and ud["lodo_mape_blend"] < ud["lodo_mape_learned"] - 5.0
    assert models["bmm"]["unseen_device"]["tile"] is not None
    by = _by(_fit_eval(train, test))
    assert by[("H100-SXM", "bmm")]["mape"] <= 12.0
    assert by[("H100-SXM", "matmul")]["mape"] <= 12.0
    assert by[("A100-PCIe-80GB", "bmm")]["mape"] <= 12.0
    assert by[("A100-PCIe-80GB", "matmul")]["mape"] <= 12.0
    assert np.isfinite([r["mape"] for r in by.values()]).all()


def test_cli_eval_no_blend_flag(ln_softmax_cli_eval):
    """``meshplan costmodel eval --split neusight [--no-blend] --json``: the rows' fields, and the flag turns the blend
    off."""
    after, before = ln_softmax_cli_eval
    key = ("A100-PCIe-80GB", "softmax")
    assert set(after[key]) >= {"device", "op", "n", "mape", "median_ape", "p90_ape"}
    assert after[key]["mape"] < before[key]["mape"] - 2.0  # 12.4 blended vs 15.8 trees alone
