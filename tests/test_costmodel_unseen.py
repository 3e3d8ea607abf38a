"""Unseen GPUs (issue 13 item 4): power-limited clocks in the roofline partner, and the band check that flags a
learned price on a device the model never trained on.

Truth is measured kernel latencies (NeuSight fp32 GEMMs, data/kernels/neusight); the held-out GPU's rows never
reach training. Per-device leave-one-device-out figures: ``python bench/costmodel_bench.py --splits lodo-gemm``.
"""
from __future__ import annotations

import numpy as np
import pytest

from meshplan.costmodel.devices import get_device
from tests.helpers import data_path


def _gemm_rows():
    from meshplan.costmodel.datasets.neusight import load_file
    from meshplan.costmodel.datasets.table import KernelTable, table_files

    root = data_path("kernels", "neusight")
    parts = [load_file(p, "neusight/train") for p in table_files(root / "train" / "linear", "*.csv")]
    assert len(parts) == 5  # the five training GPUs (data/kernels/neusight/PROVENANCE.md)
    parts.append(load_file(root / "test" / "linear.csv", "neusight/test"))
    return KernelTable.concat(parts)


@pytest.fixture(scope="module")
def linear():
    return _gemm_rows()


def test_power_limited_boards_run_large_fp32_gemms_at_base_clock(linear):
    """L4 and T4 (70-72 W, slot-powered) hold their base clock under long fp32 GEMMs: GEMMs above 2^36 FLOPs run
    near the base-clock peak the catalogue gives them, about half the boost-clock one. A 250-400 W board (V100,
    A100) is unaffected (sustained = boost). (The cost-model feature built on this was not kept: it moved NeuSight's
    held-out H100 bmm from 11.8 to 12.5% MAPE, past issue 4's 12%; BENCHMARKS.md "Unseen GPUs".)"""
    from meshplan.costmodel.train import prepare

    for name in ("L4", "T4"):
        dev = get_device(name)
        assert dev.tdp_w <= 75 and dev.sustained_clock_hz == dev.base_clock_hz < 0.45 * dev.clock_hz
    for name in ("V100-PCIe-32GB", "A100-PCIe-40GB", "H100-SXM"):
        dev = get_device(name)
        assert dev.sustained_clock_hz == dev.clock_hz and dev.base_clock_hz > 0
    p = prepare(linear)
    t = p.table
    for name in ("L4", "T4"):
        s = (t.device == name) & (t.flops > 2**36)
        assert s.sum() > 100
        dev = get_device(name)
        eff_boost = np.median(p.roof_s[s] / t.latency_s[s])  # achieved fraction of the boost-clock peak
        # the measured rate sits near the base-clock peak (base / boost 0.37-0.39), not the boost one
        assert 0.7 < eff_boost / (dev.sustained_clock_hz / dev.clock_hz) < 1.5, (name, eff_boost)
        assert eff_boost < 0.5, (name, eff_boost)  # the 0.75 boost-clock efficiency would be ~2x too fast


@pytest.fixture(scope="module")
def pricer_without_l4(linear):
    """A small GEMM model trained on every NeuSight GPU but L4 (L4's rows never reach training)."""
    from meshplan.costmodel.api import Pricer
    from meshplan.costmodel.eval import _as_model
    from meshplan.costmodel.train import prepare, train_models

    train = linear.select(linear.device != "L4")
    models = train_models(prepare(train), n_estimators=80, max_rows_per_kind=8000, kinds=("matmul",))
    assert "L4" not in models["matmul"]["devices"]
    return Pricer(_as_model(models))


def test_unseen_device_prices_stay_in_band_or_are_flagged(linear, pricer_without_l4):
    """Every price of L4's measured linear shapes by a model that never saw L4 is >= the roofline bound; those on
    the bound or above 3x it carry an ``unseen device`` source, and the pricer lists them in ``warnings``."""
    from meshplan.costmodel.learned import (
        SOURCE_UNSEEN_ABOVE,
        SOURCE_UNSEEN_CLIPPED,
        UNSEEN_MAX_ROOFLINE,
        ideal_roofline_s,
    )
    from meshplan.costmodel.ops import OpSpec
    from meshplan.costmodel.roofline import KERNEL_LAUNCH_S

    l4 = get_device("L4")
    rows = linear.select(linear.device == "L4")
    idx = np.random.default_rng(0).choice(len(rows), 300, replace=False)
    pricer = pricer_without_l4
    pred, true, flagged = [], [], 0
    for i in idx:
        op = OpSpec("matmul", (int(rows.m[i]), int(rows.n[i]), int(rows.k[i])), "fp32")
        sec, src = pricer.predict_with_source(op, l4)
        bound = ideal_roofline_s(op, l4)
        assert sec >= bound * (1 - 1e-9)
        over = sec > UNSEEN_MAX_ROOFLINE * (bound + KERNEL_LAUNCH_S)
        on = sec <= bound * (1 + 1e-9)
        assert src == (SOURCE_UNSEEN_ABOVE if over else SOURCE_UNSEEN_CLIPPED if on else "learned"), (sec, bound, src)
        flagged += over or on
        pred.append(sec)
        true.append(rows.latency_s[i])
    # Small GEMMs on L4 (launch-bound: NeuSight's smallest measured L4 linears run at 4-7x the bound) are priced
    # above 3x it and flagged.
    for shape in ((128, 128, 128), (256, 256, 256), (64, 4096, 64)):
        op = OpSpec("matmul", shape, "fp32")
        sec, src = pricer.predict_with_source(op, l4)
        assert sec > UNSEEN_MAX_ROOFLINE * (ideal_roofline_s(op, l4) + KERNEL_LAUNCH_S) and src == SOURCE_UNSEEN_ABOVE
        flagged += 1
    assert pricer.warnings and all(w.startswith("L4: ") and "not trained on this device" in w for w in pricer.warnings)
    assert sum(int(w.split()[1]) for w in pricer.warnings) == flagged
    pricer.clear_warnings()
    assert pricer.warnings == []
    # Against the measured rows: the shipped features (boost-clock figures) leave L4 at 59% MAPE on all its linear
    # rows (costmodel/data/model/README.md); the band check bounds what it may do, not how close it lands
    ape = np.abs(np.array(pred) - np.array(true)) / np.array(true)
    assert ape.mean() < 0.65, ape.mean()


def test_seen_device_is_not_flagged(linear, pricer_without_l4):
    """A device the model trained on keeps the plain ``learned`` source and adds no warning."""
    from meshplan.costmodel.ops import OpSpec

    pricer = pricer_without_l4
    pricer.clear_warnings()
    t4 = get_device("T4")
    rows = linear.select(linear.device == "T4")
    for i in range(0, len(rows), max(1, len(rows) // 50)):
        _, src = pricer.predict_with_source(OpSpec("matmul", (int(rows.m[i]), int(rows.n[i]), int(rows.k[i])),
                                                   "fp32"), t4)
        assert src in ("learned", "roofline (outside the trained range)")
    assert pricer.warnings == []
