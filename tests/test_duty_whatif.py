"""``bench/duty_whatif.py``: the sustained share by the step's tensor-core busy fraction, a what-if beside the flat
share meshplan prices. Truths: the H200's measured duty cycles (``costmodel/data/measured/nvidia-h200-sustained-
duty.json``: kept 0.991 at busy 0.38, 0.933 at 0.78) and its held share, read here from the files."""
from __future__ import annotations

import pytest

from meshplan.costmodel.devices import catalogue
from meshplan.costmodel.sustained import duty_depth, duty_points, sustained_share
from tests.helpers import load_bench


def test_a_step_busy_as_the_held_runs_keeps_the_full_throttle_and_a_waiting_one_little():
    held = sustained_share(catalogue()["H200"])[0]
    (b_low, kept_low), *_ = duty_points()
    assert duty_depth(0.95) == 1.0 and duty_depth(0.78) == 1.0
    assert duty_depth(b_low) == pytest.approx((1 - kept_low) / (1 - held))
    assert 0.1 < duty_depth(b_low) < 0.2  # 0.991 kept against 0.939 held: a seventh of the throttle


def test_only_the_tensor_core_seconds_are_repriced():
    """A B200 row busy 40%: its tensor-core seconds run at flat / (1 - depth x (1 - flat)) of their price; a GB200
    row fully busy keeps its whole throttle, as priced; a part priced at 1 (the GB300) has none to scale."""
    bench = load_bench("duty_whatif", "repriced_s")
    b200 = {"part": "B200", "step_s": 10.0, "tc_s": 4.0, "published_s": 10.0}
    flat = sustained_share(catalogue()["B200"])[0]
    share = 1 - duty_depth(0.4) * (1 - flat)
    assert bench.repriced_s(b200, "now") == 10.0
    assert bench.repriced_s(b200, "duty") == pytest.approx(10.0 - 4.0 * (1 - flat / share))
    # bounded by the measured flat share: no slower than priced, no faster than those seconds at one-shot rates
    assert 10.0 - 4.0 * (1 - flat) < bench.repriced_s(b200, "duty") < 10.0
    assert bench.repriced_s({**b200, "tc_s": 9.0}, "duty") == 10.0  # busy 0.9: the full throttle, as priced
    gb200 = {"part": "GB200", "step_s": 10.0, "tc_s": 9.0, "published_s": 10.0}
    assert bench.repriced_s(gb200, "duty") == 10.0
    assert bench.repriced_s({**gb200, "part": "GB300", "tc_s": 4.0}, "duty") == 10.0  # priced at 1
