"""The gradient sync and the optimizer step of one pipeline stage, priced apart from the compute they overlap.

``SyncTerms`` holds every collective of one sharding priced once (``GpuEstimator._price_sync_terms``); what of them
stays exposed depends on the stage's per-micro-batch time, known only once the pipeline part is priced. The same
arithmetic runs on one sharding (floats) and on many at once (``ShardTable``: the terms of a search's shardings
stacked as numpy arrays, one element each), so a search's step times per sharding are the floats ``estimate`` gives.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np


class SyncTerms(NamedTuple):
    """One stage's gradient sync and optimizer step priced apart from the compute they overlap (seconds). ``groups``
    holds, per parameter group (dense; routed experts: the columns), the rows ``GROUP_ROWS``: its parameters, their
    share of the stage's, the last DDP bucket's share, the all-reduce (under ZeRO-3: over the replicas of a shard),
    and under ZeRO-3 the gather, the reduce-scatter, FSDP2's copy out and copy in, and whether it is sharded. For
    a ``ShardTable`` every number gains a last axis, one element per sharding."""

    groups: np.ndarray  # GROUP_ROWS x parameter groups (x shardings)
    params: float  # dense + expert parameters of the stage
    zero3: bool
    pp: int
    pp_runs: int
    torch_fsdp: bool
    sm_share: float
    optimizer_s: float
    cast_s: Optional[float]  # the fp8 weight casts (None: no fp8)
    recast_s: Optional[float] = None
    """The routed experts' weight casts again for every micro-batch but the first (None: none): the fused grouped
    MLP quantizes its weights, rowwise and columnwise, on every forward unless they are held quantized
    (``base.recast_expert_params``)."""

    def other_s(self, fsdp_copies: float, m: int = 1) -> float:
        """The step's time beside the pipeline and the sync: the optimizer, FSDP2's copies, the fp8 casts (with
        ``m`` micro-batches)."""
        optimizer = self.optimizer_s + fsdp_copies
        if self.cast_s is not None:
            optimizer += 2 * self.cast_s
        if self.recast_s is not None:
            optimizer += 2 * (m - 1) * self.recast_s
        return optimizer

    def exposed_s(self, stage_s: float, compute_s: float, m: int) -> tuple[float, float]:
        """(exposed gradient-sync seconds per step, FSDP2's copy passes) of a stage whose per-micro-batch time is
        ``stage_s`` (``compute_s`` of it compute), with ``m`` micro-batches.

        The sync (ring all-reduce, or ZeRO's reduce-scatter + all-gather) overlaps the last micro-batch's backward
        but for its last bucket. ZeRO-3 gathers per micro-batch, prefetched under the compute
        (``_zero3_exposed_s``), and all-reduces over the replicas of a shard. Each sum over the parameter groups
        adds them in order, as a loop over them would."""
        params, _, bucket, sync = self.groups[:4]
        last_bwd = stage_s * 2 / 3
        # what the last micro-batch's backward leaves of a group's all-reduce: all of it but its last bucket
        out = np.maximum(sync * bucket, sync - last_bwd * params / self.params)
        fsdp_copies = 0.0
        if self.zero3:
            gathered, comm_hidden, copies = self._zero3_exposed_s(compute_s, m)
            fsdp_copies = copies.sum(axis=0)
            dp_exposed = (gathered + out).sum(axis=0)
            hidden = (comm_hidden + sync - out).sum(axis=0)
        else:
            dp_exposed = out.sum(axis=0)
            hidden = (sync - out).sum(axis=0)
        # overlap is not free: the hidden collectives' kernels hold SMs the overlapped compute then lacks
        return dp_exposed + hidden * self.sm_share, fsdp_copies

    def _zero3_exposed_s(self, compute_s: float, m: int) -> tuple:
        """ZeRO-3 / FSDP per parameter group: (exposed gathers and reduce-scatters, the hidden part, FSDP2's copy
        passes), seconds per step."""
        _, share, _, _, gather, scatter, copy_s, copy_in_s, sharded = self.groups
        if self.pp > 1 and self.torch_fsdp:
            # torch.distributed.pipelining (PipelineStage.backward_maybe_with_nosync, torch 2.5+) keeps an FSDP2
            # stage gathered and its gradients unreduced over a schedule run: set_reshard_after_backward(False) and
            # set_requires_gradient_sync(False) until a chunk's last backward, which then runs FSDP's post_backward
            # (the reduce-scatter). One gather and one reduce-scatter per run; the gather prefetches under the
            # run's compute. Every chunk's reduce-scatter then holds the compute stream:
            # _root_post_backward_final_callback's is_last_backward branch waits on its event
            # (``current_stream().wait_event``, FSDP2's _fsdp_state.py since torch 2.4; from torch 2.10 the
            # schedule's REDUCE_GRAD action, stage.perform_reduce_grad)
            runs, comm = self.pp_runs, gather + scatter
            out = runs * (np.maximum(0.0, gather - compute_s * m / runs * share) + scatter)
        else:
            # per micro-batch: gathered in forward, again in backward, reduce-scattered. FSDP2 unpipelined; and
            # Megatron-FSDP under Megatron-Core's schedules, pipelined or not: its post-forward hook releases a
            # module's parameters (``release_module_parameters``), its pre-backward gathers them again, and its
            # post-backward reduce-scatters on every backward when it shards gradients (``grad_reduce_every_bprop``
            # for optim_grads and optim_grads_params)
            runs, comm = m, 2 * gather + scatter
            out = runs * np.maximum(0.0, comm - compute_s * share)
        copies = np.zeros_like(out)
        if self.torch_fsdp:
            gathers = runs * (1 if self.pp > 1 else 2)
            copies = np.where(sharded > 0, gathers * copy_s + runs * copy_in_s, 0.0)
        return out, runs * comm - out, copies


# The rows of ``SyncTerms.groups``
GROUP_ROWS = ("params", "share", "bucket", "allreduce", "gather", "reducescatter", "copy_s", "copy_in_s", "sharded")


def step_of(pipe: tuple, terms: SyncTerms, m: int) -> tuple:
    """(step, compute, pipeline, exposed comm, bubble, other, micro-batches) from a layout's pipeline part
    (``GpuEstimator._pipeline_part``) and its sync terms, seconds."""
    slow, stage_c, stage_q, t_max, bubble, straggle = pipe
    compute = m * stage_c
    comm_exposed = m * stage_q
    dp_exposed, fsdp_copies = terms.exposed_s(stage_c + stage_q, stage_c, m)
    dp_exposed, optimizer = float(dp_exposed), float(terms.other_s(fsdp_copies, m))
    # the slowest of the job's ranks sets the pace of every synchronous step
    compute += straggle
    step = m * t_max + straggle + bubble + dp_exposed + optimizer
    return step, compute, m * t_max + straggle, comm_exposed + dp_exposed, bubble, optimizer, m


class ShardTable(NamedTuple):
    """The sync terms of one pipeline part's shardings, stacked: ``parts`` holds (positions, ``SyncTerms`` of arrays)
    per kind of arithmetic (ZeRO-3 or not, one or two parameter groups), ``size`` the shardings in all."""

    parts: tuple
    size: int

    @classmethod
    def of(cls, terms: list[SyncTerms]) -> "ShardTable":
        kinds: dict[tuple, list[int]] = {}
        for i, t in enumerate(terms):
            kind = (t.zero3, t.groups.shape, t.cast_s is None, t.recast_s is None, t.pp, t.pp_runs,
                    t.torch_fsdp, t.sm_share)
            kinds.setdefault(kind, []).append(i)
        parts = []
        for at in kinds.values():
            rows = [terms[i] for i in at]
            stacked = rows[0]._replace(groups=np.stack([r.groups for r in rows], axis=-1),
                                       params=np.array([r.params for r in rows]),
                                       optimizer_s=np.array([r.optimizer_s for r in rows]),
                                       cast_s=None if rows[0].cast_s is None else np.array([r.cast_s for r in rows]),
                                       recast_s=None if rows[0].recast_s is None
                                       else np.array([r.recast_s for r in rows]))
            parts.append((np.array(at), stacked))
        return cls(tuple(parts), len(terms))

    def step_times_s(self, before_sync_s: float, stage_s: float, compute_s: float, m: int) -> list[float]:
        """Each sharding's step time: ``before_sync_s`` (the pipeline part, straggler and bubble) plus its exposed
        sync and other time (``step_of``'s step, summed in the same order)."""
        out = np.empty(self.size)
        for at, terms in self.parts:
            dp_exposed, copies = terms.exposed_s(stage_s, compute_s, m)
            out[at] = before_sync_s + dp_exposed + terms.other_s(copies, m)
        return out.tolist()
