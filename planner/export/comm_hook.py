"""A DDP communication hook that applies a plan's per-bucket gradient compression (ByteComp-style choices).

``register_plan_hook(ddp_model, plan)`` dispatches every DDP gradient bucket to the method the plan chose for
it (``plan.compression``, indexed by DDP bucket index; DDP's default ``bucket_cap_mb=25`` matches the buckets the
solver planned, ``planner.search.solve.compression``):

* ``none``     — plain all-reduce and average.
* ``fp16``/``bf16`` — cast, all-reduce, cast back (torch's ``fp16_compress_hook`` / ``bf16_compress_hook``).
* ``int8``     — per-rank symmetric max-abs quantization; int8 values and scales are all-gathered (an int8
  all-reduce would overflow) and dequantized before averaging (1-byte payload + one fp32 scale per rank).
* ``topk``     — each rank keeps its ``param`` fraction of largest-magnitude entries; values and indices are
  all-gathered and scattered back (Aji & Heafield 2017 sparsification, no error feedback).
* ``powersgd`` — torch's ``powerSGD_hook`` with rank ``param`` (Vogels et al. 2019), one state per bucket.

Two-level and CPU placement choices are scheduling decisions of the solver; this hook compresses the whole
bucket on the device that holds it (the plan note says so).
"""

import torch
import torch.distributed as dist


class PlanHookState:
    """Per-bucket method table plus the PowerSGD states the ``powersgd`` buckets need."""

    def __init__(self, plan, process_group=None):
        self.process_group = process_group
        self.methods = {b.bucket: (b.method, b.param) for b in (plan.compression or ())}
        self.powersgd: dict[int, object] = {}


def _allreduce_mean(t: torch.Tensor, group) -> torch.futures.Future:
    world = dist.get_world_size(group)
    fut = dist.all_reduce(t.div_(world), group=group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def _int8(t: torch.Tensor, group) -> torch.Tensor:
    world = dist.get_world_size(group)
    scale = t.abs().max().clamp_min(1e-30) / 127.0
    q = torch.round(t / scale).clamp_(-127, 127).to(torch.int8)
    qs = [torch.empty_like(q) for _ in range(world)]
    scales = [torch.empty_like(scale.reshape(1)) for _ in range(world)]
    dist.all_gather(qs, q, group=group)
    dist.all_gather(scales, scale.reshape(1), group=group)
    return sum(qi.to(t.dtype) * si for qi, si in zip(qs, scales)) / world


def _topk(t: torch.Tensor, ratio: float, group) -> torch.Tensor:
    world = dist.get_world_size(group)
    k = max(1, int(t.numel() * ratio))
    _, idx = t.abs().topk(k)
    vals = t[idx]
    all_idx = [torch.empty_like(idx) for _ in range(world)]
    all_vals = [torch.empty_like(vals) for _ in range(world)]
    dist.all_gather(all_idx, idx, group=group)
    dist.all_gather(all_vals, vals, group=group)
    out = torch.zeros_like(t)
    for i, v in zip(all_idx, all_vals):
        out.index_add_(0, i, v)
    return out / world


def _done(t: torch.Tensor) -> torch.futures.Future:
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(t)
    return fut


def plan_comm_hook(state: PlanHookState, bucket) -> torch.futures.Future[torch.Tensor]:  # DDP checks this
    """The DDP hook: route this bucket to its planned method."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    group = state.process_group or dist.group.WORLD
    method, param = state.methods.get(bucket.index(), ("none", 0.0))
    buf = bucket.buffer()
    if method == "fp16":
        return default_hooks.fp16_compress_hook(group, bucket)
    if method == "bf16":
        return default_hooks.bf16_compress_hook(group, bucket)
    if method == "int8":
        buf.copy_(_int8(buf, group))
        return _done(buf)
    if method == "topk":
        buf.copy_(_topk(buf, float(param) or 0.01, group))
        return _done(buf)
    if method == "powersgd":
        ps = state.powersgd.get(bucket.index())
        if ps is None:
            ps = state.powersgd[bucket.index()] = powerSGD_hook.PowerSGDState(
                process_group=group, matrix_approximation_rank=max(1, int(param) or 1), start_powerSGD_iter=2,
                min_compression_rate=1.0, use_error_feedback=True, warm_start=True)
        return powerSGD_hook.powerSGD_hook(ps, bucket)
    return _allreduce_mean(buf, group)


def register_plan_hook(ddp_model, plan, process_group=None) -> bool:
    """Register the plan's compression on a ``DistributedDataParallel`` model; False when the plan has none."""
    if not plan.compression or all(b.method == "none" for b in plan.compression):
        return False
    ddp_model.register_comm_hook(PlanHookState(plan, process_group), plan_comm_hook)
    return True
