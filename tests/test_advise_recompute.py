"""Recomputation on ``local:N`` never prices faster than none, on real timings of this host.

Activation checkpointing runs part of the forward a second time in backward and changes nothing else of a step, so
with everything else equal a recomputing layout's step can only be longer. On ``local:N`` the blocks are timed on
this host (``planner.host.cpu_bench``); timed apart, under a shared host's load, a checkpointed block once timed
faster than the plain one, and ``meshplan advise`` credited recomputation with most of a predicted gain. What is
asserted is the invariant on real measurements (never their values): every recompute mode's layer and step price
at least the no-recompute one, and the attribution credits recomputation with no gain.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.core.errors import MeshplanError
from meshplan.planner.cluster.spec import load_cluster
from meshplan.planner.estimate.base import Workload
from meshplan.planner.estimate.cpu import CpuEstimator
from meshplan.planner.host.calibrate import load_calibration
from meshplan.planner.host.cpu_bench import RECOMPUTE_MODES, _one_thread, paired_layer_s
from meshplan.planner.layout.layout import Degrees, Layout
from meshplan.planner.model.config import load_model
from meshplan.verify.advise.attribute import attribute
from tests.helpers import REPO

CONFIG = REPO / "examples" / "tiny-gpt" / "config.json"
BATCH, SEQ = 8, 128


@pytest.mark.parametrize("micro_batch", [1, 4])
def test_paired_layer_timings_never_price_recompute_below_none(micro_batch):
    model = load_model(str(CONFIG))
    with _one_thread():
        t = paired_layer_s(model, 1, micro_batch, SEQ, "fp32")
    assert set(t) == set(RECOMPUTE_MODES) and t["none"] > 0
    assert all(t[m] >= t["none"] for m in RECOMPUTE_MODES), t


@pytest.fixture(scope="module")
def local2(host_calibration):
    cal = load_calibration()
    cluster = load_cluster("local:2", calibration=cal)
    est = CpuEstimator(cal)
    work = Workload(load_model(str(CONFIG)), cluster, BATCH, SEQ, "fp32")
    m = work.model

    def step_s(lay: Layout):
        try:
            lay.validate(world_size=2, num_layers=m.num_layers, num_heads=m.num_heads, num_kv_heads=m.num_kv_heads,
                         seq_len=SEQ, global_batch=BATCH, num_experts=m.num_experts)
        except MeshplanError:
            return None
        return est.estimate(work, lay).step_time_s

    return step_s


MESHES = [Degrees(dp_replicate=2), Degrees(tp=2), Degrees(pp=2), Degrees(dp_shard=2)]


@pytest.mark.parametrize("deg", MESHES, ids=lambda d: f"dp{d.dp_replicate}x{d.dp_shard}-tp{d.tp}-pp{d.pp}")
@pytest.mark.parametrize("micro_batch", [1, 4])
def test_recompute_never_prices_a_step_faster(local2, deg, micro_batch):
    base = Layout.of(deg, micro_batch=micro_batch, zero_stage=3 if deg.dp_shard > 1 else 0, recompute="none")
    none_s = local2(base)
    assert none_s is not None and none_s > 0
    for mode in CpuEstimator.recompute_kinds:
        assert local2(replace(base, recompute=mode)) >= none_s, mode


def test_attribution_credits_recompute_with_no_gain(local2):
    # the pp=2 row of BENCHMARKS.md's advise table: once advised to dp_replicate=2, mbs=4, recompute=full
    ran = Layout.of(Degrees(pp=2), micro_batch=1, recompute="none")
    advised = Layout.of(Degrees(dp_replicate=2), micro_batch=4, recompute="full")
    changes = attribute(ran, advised, local2)
    rc = [c for c in changes if "recompute" in c.fields]
    assert rc and rc[0].gain_s <= 0.0, [c.as_dict() for c in changes]
    assert sum(c.gain_s for c in changes) == pytest.approx(local2(ran) - local2(advised), rel=1e-9)
