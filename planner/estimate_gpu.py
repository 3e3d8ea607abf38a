"""GPU estimator: step time of one homogeneous ``Layout`` (Megatron-style 1F1B / interleaved pipeline).

Per micro-batch and pipeline stage: forward and backward compute priced op by op with the ``Pricer`` it is given
(the learned model, or the roofline with per-op-class efficiency), plus the TP / EP collectives that sit on the
critical path and the CP KV exchange not hidden behind attention. Then:

    pipeline = m * t_max + bubble(schedule)                  (planner.schedules: 1F1B (p-1) t_avg, interleaved
                                                              / v, ZB-H1, DualPipe)
    step     = pipeline + exposed gradient sync + optimizer step

where t = forward + backward (+ recompute) of one micro-batch on a stage, including its p2p sends
(vpp times more of them when interleaved, §2.2.2). Gradient sync (ring all-reduce, or reduce-scatter +
all-gather under ZeRO) overlaps with the last micro-batch's backward; the last bucket is always exposed
(PyTorch DDP 25 MB buckets, Li et al. 2020 "PyTorch Distributed", §3.2.3). ZeRO-3/FSDP all-gathers parameters
for every micro-batch and overlaps them with compute (prefetch), exposing only the excess.
Units: seconds, bytes, FLOPs.
"""
from __future__ import annotations

from dataclasses import replace

from meshplan.costmodel.api import Pricer
from meshplan.costmodel.collectives import collective_time_s
from meshplan.costmodel.devices import DeviceSpec
from meshplan.costmodel.ops import OpSpec
from meshplan.planner.estimate import (Estimate, TablesCache, Workload, finish_estimate, stage_layers, stage_params,
                                       time_key)
from meshplan.planner.layout import Layout
from meshplan.planner.memory import GRAD_BYTES, PARAM_BYTES
from meshplan.planner.ops_graph import embedding_ops, head_ops, layer_ops
from meshplan.planner.schedules import bubble_s

DDP_BUCKET_BYTES = 25 * 1024**2  # PyTorch DDP default bucket_cap_mb=25


class GpuEstimator:
    """Analytic step-time estimate on accelerators, every op priced by ``pricer`` (memoised per instance)."""

    def __init__(self, pricer: Pricer):
        self.pricer = pricer
        self.name = pricer.name
        self.tables = TablesCache()
        self._layer: dict[tuple, tuple[float, float, float, float]] = {}
        self._edge: dict[tuple, tuple[float, float]] = {}

    # ---- operators
    def op_time_s(self, op: OpSpec, device: DeviceSpec) -> float:
        return self.pricer.predict(op, device)

    def op_times_s(self, ops: list[OpSpec], device: DeviceSpec) -> list[float]:
        return [float(t) for t in self.pricer.predict_batch(ops, device)]

    def _bwd_s(self, op: OpSpec, device) -> float:
        if op.kind in ("matmul", "bmm", "attention"):
            return self.pricer.predict(replace(op, backward=True), device)
        return 2.0 * self.pricer.predict(op, device)  # memory-bound ops: read grad + saved input, write grad

    # ---- one micro-batch
    def _layer_times(self, tb, device, key: Layout, moe: bool, seq_len: int, dtype: str,
                     tp_link, ep_link, cp_link) -> tuple[float, float, float, float]:
        """(fwd compute, bwd compute, recompute, exposed comm fwd+bwd) of one layer for one micro-batch, s."""
        k = (tb, device, key, moe, seq_len, dtype, tp_link, ep_link, cp_link)
        hit = self._layer.get(k)
        if hit is not None:
            return hit
        predict = self.pricer.predict
        lo = layer_ops(tb.model, tb.rep[moe], key, seq_len, dtype)
        fwd = sum(predict(op, device) for op in lo.compute)
        bwd = sum(self._bwd_s(op, device) for op in lo.compute)
        if key.recompute == "full":
            re = fwd
        elif key.recompute == "selective":
            re = sum(predict(op, device) for op in lo.core_attention)
        else:
            re = 0.0
        n_fwd = 2.0 if key.recompute == "full" else 1.0  # forward collectives run again during full recompute
        comm = 0.0
        for kind, nbytes in lo.tp_comm:
            comm += (n_fwd + 1.0) * collective_time_s(kind, nbytes, key.tp, tp_link)  # + backward mirror
        for kind, nbytes in lo.ep_comm:
            comm += (n_fwd + 1.0) * collective_time_s(kind, nbytes, key.ep, ep_link)
        if lo.cp_comm:
            attn_fwd = sum(predict(op, device) for op in lo.core_attention)
            for kind, nbytes in lo.cp_comm:  # ring attention overlaps the KV exchange with attention blocks
                c = collective_time_s(kind, nbytes, key.cp, cp_link)
                comm += max(0.0, c - attn_fwd) * (1.0 + n_fwd)
        out = self._layer[k] = (fwd, bwd, re, comm)
        return out

    def _edge_times(self, tb, device, key: Layout, seq_len: int, dtype: str) -> tuple[float, float]:
        """(embedding fwd+bwd, LM head + loss fwd+bwd) for one micro-batch, seconds."""
        k = (tb, device, key, seq_len, dtype)
        hit = self._edge.get(k)
        if hit is None:
            emb = embedding_ops(tb.model, key, seq_len, dtype)
            head = head_ops(tb.model, key, seq_len, dtype)
            predict = self.pricer.predict
            hit = self._edge[k] = (sum(predict(o, device) + self._bwd_s(o, device) for o in emb),
                                   sum(predict(o, device) + self._bwd_s(o, device) for o in head))
        return hit

    # ---- the estimate
    def estimate(self, work: Workload, layout: Layout) -> Estimate:
        """Predict step time, throughput and peak memory of ``layout`` (validated beforehand)."""
        model, cluster = work.model, work.cluster
        dev = cluster.device
        m = layout.num_microbatches(work.global_batch)
        pp, vpp = layout.pp, layout.vpp
        tp_link = cluster.collective_link(*layout.tp_group)
        ep_link = cluster.collective_link(*layout.ep_group)
        cp_link = cluster.collective_link(*layout.cp_group)
        pp_link = cluster.collective_link(*layout.pp_neighbours)

        tb = self.tables(model)
        key = time_key(layout)
        times = {k: self._layer_times(tb, dev, key, k, work.seq_len, work.dtype, tp_link, ep_link, cp_link)
                 for k in tb.rep}
        kinds = {k: sum(t[:3]) for k, t in times.items()}
        kcomm = {k: t[3] for k, t in times.items()}
        emb, head = self._edge_times(tb, dev, key, work.seq_len, work.dtype)

        # p2p activations per micro-batch boundary (Megatron scatter/gather: 1/t of the tensor crosses nodes)
        act_bytes = 2.0 * layout.micro_batch * work.seq_len / layout.cp * model.hidden_size / layout.tp
        p2p = collective_time_s("sendrecv", act_bytes, 2, pp_link) * vpp * 2 if pp > 1 else 0.0

        stage_compute, stage_comm, stage_bwd = [], [], []
        for st in range(pp):
            counts = tb.kind_counts(stage_layers(model, layout, st))
            c = sum(kinds[k] * n for k, n in counts.items() if n)
            q = sum(kcomm[k] * n for k, n in counts.items() if n)
            stage_bwd.append(sum((times[k][1] + times[k][2]) * n for k, n in counts.items() if n))
            if st == 0:
                c += emb
            if st == pp - 1:
                c += head
            stage_compute.append(c)
            stage_comm.append(q + p2p)
        per_mb = [c + q for c, q in zip(stage_compute, stage_comm)]
        slow = max(range(pp), key=lambda i: per_mb[i])
        t_max = per_mb[slow]
        bubble = bubble_s(layout.schedule, pp, vpp, sum(per_mb) / pp, sum(stage_bwd) / pp)
        compute = m * stage_compute[slow]
        comm_exposed = m * stage_comm[slow]

        # gradient sync over the data-parallel (x context-parallel) group
        dense, expert = stage_params(tb, layout, slow)
        grad_bytes = (dense + expert) * GRAD_BYTES
        if layout.zero_stage == 3:
            shard, _ = layout.shard_group
            shard_link = cluster.collective_link(*layout.shard_group)
            pbytes = (dense + expert) * PARAM_BYTES
            per_mb_comm = (2 * collective_time_s("allgather", pbytes, shard, shard_link)
                           + collective_time_s("reducescatter", grad_bytes, shard, shard_link))
            fsdp_exposed = m * max(0.0, per_mb_comm - stage_compute[slow])
            rep_link = cluster.collective_link(*layout.replicate_group)
            rep = collective_time_s("allreduce", grad_bytes / shard, layout.dp_replicate, rep_link)
            dp_exposed = fsdp_exposed + max(rep * min(1.0, DDP_BUCKET_BYTES / max(grad_bytes, 1.0)),
                                            rep - stage_compute[slow] * 2 / 3)
        else:
            dp_group = layout.grad_group
            sync = collective_time_s("allreduce", grad_bytes, dp_group.size, cluster.collective_link(*dp_group))
            last_bwd = (stage_compute[slow] + stage_comm[slow]) * 2 / 3
            dp_exposed = max(sync * min(1.0, DDP_BUCKET_BYTES / max(grad_bytes, 1.0)), sync - last_bwd)

        opt_numel = (dense + expert) / (layout.shard_group.size if layout.zero_stage >= 1 else 1)
        optimizer = self.pricer.predict(OpSpec("optimizer", (int(opt_numel),), "fp32"), dev)

        step = m * t_max + bubble + dp_exposed + optimizer
        return finish_estimate(work, tb, layout, m, step=step, compute_s=compute,
                               exposed_comm_s=comm_exposed + dp_exposed, bubble_s=bubble, other_s=optimizer)
