"""The step a plan takes if its GPU throttles like its measured lower-power sibling (``costmodel.sustained
.lower_power_sibling``, ``Pricer.with_shares``, ``planner.estimate.sustained_band``).

Truths the pricing does not compute: FlashInfer PR 2899's B200 run (1,450 TFLOP/s at the peak window, 1,237 once
throttled at 1,000 W: 0.853) and AIConfigurator's GEMM sweeps held at the B200's and the GB200's caps, read here from
their file, the datasheet board powers and SM counts (B200 1,000 W and GB200 1,200 W over 148 SMs, GB300 1,400 W over
160), and that a part with its own measurement or its die's has no band.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from meshplan.costmodel.api import Pricer
from meshplan.costmodel.devices import catalogue
from meshplan.costmodel.ops import OpSpec
from meshplan.costmodel.sustained import lower_power_sibling
from meshplan.planner.search.job import PlanRequest, plan_job

B200_SHARE = 1237 / 1450  # FlashInfer PR 2899: fully throttled window over the peak one
SWEEPS = json.loads((Path(__file__).resolve().parents[1] / "costmodel" / "data" / "published" /
                     "aic_gemm_sustained.json").read_text(encoding="utf-8"))["runs"]


def _sweep(part: str, framework: str) -> float:
    """Median one-shot / held time of a held sweep's shapes at 95% of the power limit or more."""
    rows = next(r["rows"] for r in SWEEPS if (r["part"], r["framework"]) == (part, framework))
    return statistics.median(one / held for _, _, _, held, one, watts, cap in rows if watts >= 0.95 * cap)


SIBLINGS = [B200_SHARE, _sweep("B200", "vllm"), _sweep("GB200", "vllm"), _sweep("GB200", "trtllm")]


def test_an_unmeasured_part_above_its_siblings_power_takes_their_share_as_the_bound() -> None:
    dev = catalogue()["GB300"]
    for name in ("B200", "GB200"):
        sib = catalogue()[name]
        assert dev.tdp_w / dev.sm_count > sib.tdp_w / sib.sm_count  # more watts an SM than the measured siblings
    assert lower_power_sibling(dev) == (pytest.approx(statistics.median(SIBLINGS), abs=1e-9), "B200 and GB200")


@pytest.mark.parametrize("part", ["B200", "B300", "GB200", "H100-SXM", "H200", "MI300X"])
def test_a_part_with_a_share_of_its_own_or_no_sibling_has_no_bound(part: str) -> None:
    assert lower_power_sibling(catalogue()[part]) is None


def test_a_pricer_with_another_share_rescales_tensor_core_work_only() -> None:
    """A GEMM on the GB300 (priced at share 1) costs 1 / 0.853 as much at the B200's share; an elementwise op runs
    at HBM speed, which the power cap leaves alone."""
    gb200 = catalogue()["GB300"]
    base = Pricer(None).under_load()
    other = base.with_shares({"GB300": B200_SHARE})
    gemm = OpSpec("matmul", (8192, 8192, 8192), "bf16")
    add = OpSpec("elementwise", (1 << 28,), "bf16")
    assert other.predict(gemm, gb200) == pytest.approx(base.predict(gemm, gb200) / B200_SHARE, rel=1e-9)
    assert other.predict(add, gb200) == pytest.approx(base.predict(add, gb200), rel=1e-12)
    b200 = catalogue()["B200"]  # a part the twin does not name keeps its own share
    assert other.predict(gemm, b200) == pytest.approx(base.predict(gemm, b200), rel=1e-12)


def _explain(tmp_path, cluster: str) -> dict:
    out = plan_job(PlanRequest.of("llama-3.1-8b-instruct", cluster, 128, 8192, fix="dp=8,tp=1,pp=1,mbs=2",
                                  top=1, dtype="fp8", explain=True, out=tmp_path / "plan.yaml"))
    return out.plan.explain


def test_a_gb300_plan_prices_the_siblings_share(tmp_path) -> None:
    """Only the tensor-core share of the step grows, so the step grows by less than 1 / the siblings' share."""
    ex = _explain(tmp_path, "2x4xGB300-NVL72")
    band, share = ex["sustained"], statistics.median(SIBLINGS)
    assert band["measured_on"] == "B200 and GB200" and band["share"] == pytest.approx(share, abs=1e-4)
    assert 1.0 < band["step_time_s"] / ex["step_time_s"] < 1 / share
    assert "sustained" not in _explain(tmp_path, "1x8xB200") and "sustained" not in _explain(tmp_path,
                                                                                               "2x4xGB200-NVL72")
