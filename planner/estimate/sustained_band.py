"""The step a plan takes if its GPU throttles like its measured sibling: the open sustained clock.

A training step holds the GPU at its power limit, and meshplan prices tensor-core work at the share of its one-shot
rate a part sustains there (``costmodel.sustained``). A part nobody has measured under sustained load, and with no
measured part of its die and power, is priced at 1. Where a part of the same SM design was measured at fewer board
watts per SM (the B200 at 1,000 W: 0.853, FlashInfer PR 2899), the unmeasured part's share lies between that and 1:
more power per SM throttles its clock less, never more (the GB200 at 1,200 W, the GB300 at 1,400 W).
``sustained_band`` prices the plan's layout again at the sibling's share, with an estimator of its own, so a plan
says how much of its step rests on that open figure.
"""
from __future__ import annotations

from typing import Optional

from meshplan.costmodel.sustained import lower_power_sibling
from meshplan.planner.estimate.base import Workload
from meshplan.planner.estimate.gpu import GpuEstimator
from meshplan.planner.layout.layout import Layout


def alternative(estimator: GpuEstimator, work: Workload) -> Optional[GpuEstimator]:
    """An estimator like ``estimator`` with the job's GPU at its lower-power sibling's sustained share, or ``None``
    where the part has its own share or no such sibling."""
    dev = work.cluster.device
    sibling = lower_power_sibling(dev)
    if sibling is None:
        return None
    return GpuEstimator(estimator.pricer.with_shares({dev.name: sibling[0]}), host_speed=estimator.host_speed)


def sustained_band(estimator: GpuEstimator, work: Workload, layout: Layout, step_s: float) -> Optional[dict]:
    """``{"step_time_s", "change", "share", "measured_on", "source"}``: the plan's step with its GPU at the sustained
    share its lower-power sibling measured, or ``None`` where the part has its own share or no such sibling.
    ``step_s``: the step as ``estimator`` priced it."""
    dev = work.cluster.device
    sibling = lower_power_sibling(dev)
    if sibling is None:
        return None
    share, part = sibling
    alt_s = alternative(estimator, work).estimate(work, layout).step_time_s
    return {"step_time_s": alt_s, "change": alt_s / step_s - 1.0, "share": share, "measured_on": part,
            "source": f"{dev.name} sustaining {share:.3f} of its one-shot rates, as the {part} of the same SM design "
                      f"measured at fewer watts per SM, instead of 1 (no sustained measurement of the {dev.name})"}
