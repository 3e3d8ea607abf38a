"""The step an MoE plan takes at the other published host speed: how far the x86 / Grace ratio moves it.

An MoE layer's wait for the host (``planner.estimate.host_wait``) is read off a GB200's Grace timeline and priced on
an x86 host at 181.7 / 197.4 of it (pytorch issue 187862, 2026: PyTorch's op call on each host). A ``torch.nn.Linear``
forward measured in 2025 took an x86 host 13.48 us against Grace's 37.08 (TransformerEngine issue 2053), and no
measurement of the MoE layer's own stretch on both hosts settles which of the two it follows. ``host_speed_band``
prices the plan's layout again at the second ratio (``host_wait.HOST_SPEED_LINEAR``) with an estimator of its own, so
a plan says how much of its step rests on that open figure. Only a plan that waits for the host on an x86 host moves:
on Grace both ratios are 1, a whole-iteration graph or token dropping leaves no wait.
"""
from __future__ import annotations

from typing import Optional

from meshplan.planner.estimate.base import Workload
from meshplan.planner.estimate.gpu import GpuEstimator
from meshplan.planner.estimate.host_wait import HOST_SPEED_LINEAR, waits_for_host
from meshplan.planner.layout.layout import Layout

SOURCE = ("x86 host at 13.48 / 37.08 of Grace's time (a torch.nn.Linear forward, TransformerEngine issue 2053, 2025) "
          "instead of 181.7 / 197.4 (PyTorch's op call, pytorch issue 187862, 2026)")


def alternative(estimator: GpuEstimator, work: Workload) -> Optional[GpuEstimator]:
    """An estimator like ``estimator`` with the job's host at the other published speed, or ``None`` where that
    speed is the one priced (Grace), the model has no experts to wait for the host, or the GPUs are not NVIDIA's
    (where the figures were read: ``host_wait.waits_for_host``)."""
    dev = work.cluster.device
    priced, other = estimator.host_speed.get(dev.host_cpu), HOST_SPEED_LINEAR.get(dev.host_cpu)
    if (not work.model.num_experts or dev.vendor != "nvidia" or priced is None or other is None
            or other == priced):
        return None
    return GpuEstimator(estimator.pricer, host_speed={**estimator.host_speed, dev.host_cpu: other})


def host_speed_band(estimator: GpuEstimator, work: Workload, layout: Layout, step_s: float) -> Optional[dict]:
    """``{"step_time_s", "change", "host_over_grace": {"priced", "alternative"}, "source"}``: the plan's step at the
    alternative host speed, or ``None`` where that speed changes nothing (no MoE wait, or a host both ratios agree
    on). ``step_s``: the step as ``estimator`` priced it."""
    dev = work.cluster.device
    alt = alternative(estimator, work)
    if alt is None or not waits_for_host(layout, dev) or layout.cuda_graphs == "iteration":
        return None
    alt_s = alt.estimate(work, layout).step_time_s
    ratios = {"priced": estimator.host_speed[dev.host_cpu], "alternative": alt.host_speed[dev.host_cpu]}
    return {"step_time_s": alt_s, "change": alt_s / step_s - 1.0, "host_over_grace": ratios, "source": SOURCE}
