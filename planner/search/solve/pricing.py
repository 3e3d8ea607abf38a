"""Operator prices for one problem build, from the estimator the solver is given.

A builder runs twice (``OpPrices.build``): the first pass only collects the operators it will price, which are
then priced with one ``Estimator.op_times_s`` call per device (a learned model prices a batch in about the time
of one op); the second pass builds the problem from the memo. The memo belongs to the ``OpPrices`` of one build.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Optional, Sequence, TypeVar

from meshplan.costmodel.api import Pricer
from meshplan.costmodel.devices import DeviceSpec
from meshplan.costmodel.ops import OpSpec
from meshplan.costmodel.roofline import ROOFLINE_EFFICIENCY
from meshplan.planner.estimate.gpu import GpuEstimator
from meshplan.planner.estimate.host_wait import fc2_onward, moe_sync_wait_s, waits_for_host
from meshplan.planner.layout.space import free_cuda_graphs

T = TypeVar("T")


class OpPrices:
    """Seconds per operator for one build, priced through ``estimator`` (``planner.estimate.base.Estimator``)."""

    def __init__(self, estimator):
        self.estimator = estimator
        self._memo: dict[tuple[OpSpec, str], float] = {}
        self._pending: Optional[list[tuple[OpSpec, DeviceSpec]]] = None

    def time_s(self, op: OpSpec, device: DeviceSpec) -> float:
        """Seconds of ``op`` on ``device`` (0 during the collecting pass)."""
        key = (op, device.name)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        if self._pending is not None:
            self._pending.append((op, device))
            return 0.0
        t = self._memo[key] = self.estimator.op_time_s(op, device)
        return t

    def build(self, make: Callable[[], T]) -> T:
        """``make()`` twice: the first pass collects the operators, priced in one batch per device in between."""
        self._pending = []
        try:
            make()
        finally:
            pending, self._pending = self._pending, None
        by_dev: dict = {}
        for op, dev in pending:
            by_dev.setdefault(dev.name, (dev, {}))[1][op] = None
        for dev, ops in by_dev.values():
            ops = [o for o in ops if (o, dev.name) not in self._memo]
            for op, t in zip(ops, self.estimator.op_times_s(ops, dev)):
                self._memo[(op, dev.name)] = float(t)
        return make()

    def ops_s(self, ops: Sequence[OpSpec], device: DeviceSpec, precision: str, base: str, backward: bool) -> float:
        """Seconds of ``ops`` with GEMMs at ``precision`` (int4 = weight-only W4A16), other ops at ``base``."""
        total = 0.0
        for op in ops:
            op = replace(op, dtype=base) if op.dtype not in ("fp32",) else op
            passes = (op, replace(op, backward=True)) if backward else (op,)
            for o in passes:
                if o.kind != "matmul" or precision == base:
                    total += self.time_s(o, device)
                elif precision == "int4":  # W4A16: weight bytes at 4 bits, math in 16-bit
                    flop_s = o.flops / (device.peak(base) * ROOFLINE_EFFICIENCY["matmul"][0])
                    total += max(self.time_s(replace(o, dtype="int4"), device), flop_s)
                else:
                    total += self.time_s(replace(o, dtype=precision), device)
        return total

    def host_wait_s(self, model, ops, lay, device: DeviceSpec, precision: str, base: str) -> float:
        """The MoE layer's forward wait for the host after its token-count sync (``planner.estimate.host_wait``), as
        the exact search prices it: on NVIDIA GPUs under Megatron-Core's kernels, dropless, with the per-layer CUDA
        graphs a free search takes (``space.free_cuda_graphs``), every routed expert on the rank (no expert
        parallelism in these problems). ``ops``: the layer's ``LayerOps``."""
        if not ops.experts or not waits_for_host(lay, device):
            return 0.0
        experts_s = self.ops_s(ops.experts, device, precision, base, False)
        shared_s = self.ops_s(ops.shared, device, precision, base, False)
        captured_s = self.ops_s(ops.compute, device, precision, base, False) - experts_s - shared_s
        fc2_s = self.ops_s(fc2_onward(ops.experts), device, precision, base, False)
        return moe_sync_wait_s(free_cuda_graphs(lay), device.host_cpu, experts_s, shared_s, lay.shared_overlap,
                               max(1, model.num_experts // lay.ep), captured_s, fc2_gpu_s=fc2_s)


def default_estimator(estimator=None):
    """``estimator``, or the GPU estimator with the shipped cost model (what a library caller gets by default)."""
    if estimator is not None:
        return estimator
    return GpuEstimator(Pricer.shipped())
