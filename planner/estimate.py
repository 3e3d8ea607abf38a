"""Step-time and memory estimate of one homogeneous ``Layout`` (Megatron-style 1F1B / interleaved pipeline).

Per micro-batch and pipeline stage: forward and backward compute priced op by op with ``costmodel.predict``
(roofline with per-op-class efficiency until a learned model is loaded), plus the TP / EP collectives that sit
on the critical path and the CP KV exchange not hidden behind attention. Then:

    pipeline = m * t_max + (pp - 1) / vpp * t_avg            (Narayanan et al. 2021 §2.2: bubble (p-1)/(v*m))
    step     = pipeline + exposed gradient sync + optimizer step

where t = forward + backward (+ recompute) of one micro-batch on a stage, including its p2p sends
(vpp times more of them when interleaved, §2.2.2). Gradient sync (ring all-reduce, or reduce-scatter +
all-gather under ZeRO) overlaps with the last micro-batch's backward; the last bucket is always exposed
(PyTorch DDP 25 MB buckets, Li et al. 2020 "PyTorch Distributed", §3.2.3). ZeRO-3/FSDP all-gathers parameters
for every micro-batch and overlaps them with compute (prefetch), exposing only the excess.
Units: seconds, bytes, FLOPs.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from meshplan.costmodel.api import active_model, predict
from meshplan.costmodel.collectives import collective_time_s
from meshplan.costmodel.ops import OpSpec
from meshplan.planner.flops import recompute_flops_per_token
from meshplan.planner.layout import Layout
from meshplan.planner.memory import (
    GRAD_BYTES, PARAM_BYTES, RUNTIME_OVERHEAD_BYTES, USABLE_FRACTION, LayerShape, MemoryBreakdown,
    activation_bytes_per_layer, inflight_factor, model_state_bytes,
)
from meshplan.planner.ops_graph import _dropout, embedding_ops, head_ops, layer_ops

DDP_BUCKET_BYTES = 25 * 1024**2  # PyTorch DDP default bucket_cap_mb=25


@dataclass(frozen=True)
class Workload:
    model: object  # planner.model_spec.ModelSpec
    cluster: object  # planner.cluster.ClusterSpec (homogeneous)
    global_batch: int
    seq_len: int
    dtype: str = "bf16"


@dataclass(frozen=True)
class Estimate:
    """Prediction for one layout. Times in seconds, memory in bytes, rates per device."""

    step_time_s: float
    compute_s: float
    exposed_comm_s: float
    bubble_s: float
    other_s: float
    memory: MemoryBreakdown
    model_flops: float  # per step, whole job, no recompute (Megatron counter)
    hw_flops: float  # incl. recompute
    tokens_per_s: float
    tflops_per_device: float
    hw_tflops_per_device: float
    mfu: float
    fits: bool
    memory_limit_bytes: int


# ---------------------------------------------------------------- per-model tables (the search hot path)

class _Tables:
    """Per-model prefix sums so that any contiguous stage's parameters cost O(1); built once per model."""

    def __init__(self, model):
        self.model = model
        dense, expert, moe = [0.0], [0.0], [0]
        for i in range(model.num_layers):
            e = model.layer_routed_expert_params(i)
            dense.append(dense[-1] + model.layer_params(i) - e)
            expert.append(expert[-1] + e)
            moe.append(moe[-1] + (1 if model.is_moe_layer(i) else 0))
        self.dense, self.expert, self.moe = dense, expert, moe
        self.rep: dict[bool, int] = {}  # one representative layer per kind (dense / MoE)
        for i in range(model.num_layers):
            self.rep.setdefault(model.is_moe_layer(i), i)
        self.shape = {k: layer_shape(model, i) for k, i in self.rep.items()}


_TABLES: dict[int, _Tables] = {}


def tables(model) -> _Tables:
    t = _TABLES.get(id(model))
    if t is None or t.model is not model:
        t = _TABLES[id(model)] = _Tables(model)
    return t


def _time_key(layout: Layout) -> Layout:
    """The fields that change one micro-batch's per-layer time (cache key)."""
    return Layout(tp=layout.tp, cp=layout.cp, ep=layout.ep, micro_batch=layout.micro_batch,
                  recompute=layout.recompute, sequence_parallel=layout.sequence_parallel,
                  attention=layout.attention)


def _bwd_s(op: OpSpec, device) -> float:
    if op.kind in ("matmul", "bmm", "attention"):
        return predict(replace(op, backward=True), device)
    return 2.0 * predict(op, device)  # memory-bound ops: read grad + saved input, write grad


@lru_cache(maxsize=100_000)
def _layer_times(model_id: int, device, key: Layout, moe: bool, seq_len: int, dtype: str,
                 tp_link, ep_link, cp_link, pricer=None) -> tuple[float, float, float, float]:
    """(fwd compute, bwd compute, recompute, exposed comm fwd+bwd) of one layer for one micro-batch, seconds.

    ``pricer`` (the active cost model, ``costmodel.api.active_model()``) is only part of the cache key: a model
    loaded later in the same process (``meshplan plan --costmodel``, library use) must not get these prices.
    """
    tb = _TABLES[model_id]
    lo = layer_ops(tb.model, tb.rep[moe], key, seq_len, dtype)
    fwd = sum(predict(op, device) for op in lo.compute)
    bwd = sum(_bwd_s(op, device) for op in lo.compute)
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
    return fwd, bwd, re, comm


@lru_cache(maxsize=100_000)
def _edge_times(model_id: int, device, key: Layout, seq_len: int, dtype: str, pricer=None) -> tuple[float, float]:
    """(embedding fwd+bwd, LM head + loss fwd+bwd) for one micro-batch, seconds (``pricer``: as ``_layer_times``)."""
    model = _TABLES[model_id].model
    emb = embedding_ops(model, key, seq_len, dtype)
    head = head_ops(model, key, seq_len, dtype)
    return (sum(predict(o, device) + _bwd_s(o, device) for o in emb),
            sum(predict(o, device) + _bwd_s(o, device) for o in head))


# ---------------------------------------------------------------- parameters per rank

def stage_layers(model, layout: Layout, stage: int) -> range:
    n = model.num_layers // layout.pp
    return range(stage * n, (stage + 1) * n)


def stage_params(model, layout: Layout, stage: int) -> tuple[float, float]:
    """(dense, routed-expert) parameters held by one rank of pipeline stage ``stage``."""
    tb = tables(model)
    r = stage_layers(model, layout, stage)
    dense = (tb.dense[r.stop] - tb.dense[r.start]) / layout.tp
    expert = (tb.expert[r.stop] - tb.expert[r.start]) / (layout.ep * layout.tp)
    if stage == 0:
        dense += model.embedding_params / layout.tp
    if stage == layout.pp - 1:
        head = model.lm_head_params or (model.vocab_size * model.hidden_size if layout.pp > 1 else 0)
        dense += (head + model.final_norm_params) / layout.tp
    return dense, expert


def layer_shape(model, layer: int) -> LayerShape:
    moe = model.is_moe_layer(layer)
    mla = bool(model.kv_lora_rank)
    return LayerShape(
        hidden=model.hidden_size, heads=model.num_heads, q_dim=model.num_heads * model.head_dim,
        kv_dim=(model.num_heads if mla else model.num_kv_heads) * model.head_dim,
        v_dim=(model.num_heads if mla else model.num_kv_heads) * model.v_head_dim,
        ffn=model.moe_ffn_hidden_size if moe else model.ffn_hidden_size, gated=model.gated_mlp,
        dropout=_dropout(model), experts_per_token=model.experts_per_token if moe else 0,
        shared_ffn=model.shared_expert_ffn_hidden_size if moe else 0,
    )


def stage_memory(work: Workload, layout: Layout, stage: int, m: int) -> MemoryBreakdown:
    model = work.model
    tb = tables(model)
    dense, expert = stage_params(model, layout, stage)
    w, g, o = model_state_bytes(dense, expert, layout)
    s = work.seq_len // layout.cp
    b = layout.micro_batch
    r = stage_layers(model, layout, stage)
    n_moe = tb.moe[r.stop] - tb.moe[r.start]
    counts = {True: n_moe, False: len(r) - n_moe}
    per_mb = sum(n * activation_bytes_per_layer(tb.shape[k], s, b, layout) for k, n in counts.items() if n)
    act = per_mb * inflight_factor(layout, m, stage)
    if layout.recompute == "full":  # one layer re-materialised during its backward
        act += max(activation_bytes_per_layer(tb.shape[k], s, b, layout.with_(recompute="none"))
                   for k, n in counts.items() if n)
    if layout.zero_stage == 3:  # FSDP: the current and the prefetched layer are held unsharded
        act += 2 * (dense + expert) / max(1, len(r)) * PARAM_BYTES
    if stage == layout.pp - 1:  # logits (bf16) + fp32 softmax of the vocab-parallel cross-entropy
        act += 6.0 * s * b * model.vocab_size / layout.tp
    return MemoryBreakdown(int(w), int(g), int(o), int(act), RUNTIME_OVERHEAD_BYTES)


# ---------------------------------------------------------------- the estimate

def estimate(work: Workload, layout: Layout) -> Estimate:
    """Predict step time, throughput and peak memory of ``layout`` (validated beforehand)."""
    model, cluster = work.model, work.cluster
    dev = cluster.device
    if dev.vendor == "cpu":  # local:N CPU ranks: measured-op model (planner/estimate_cpu.py)
        from meshplan.planner.estimate_cpu import estimate_cpu

        return estimate_cpu(work, layout)
    m = layout.num_microbatches(work.global_batch)
    pp, vpp = layout.pp, layout.vpp
    tp_link = cluster.collective_link(layout.tp, 1)
    ep_link = cluster.collective_link(layout.ep, layout.tp)
    cp_link = cluster.collective_link(layout.cp, layout.cp_stride)
    pp_link = cluster.collective_link(2, layout.pp_stride)

    tb = tables(model)
    key = _time_key(layout)
    pricer = active_model()
    kinds = {k: sum(_layer_times(id(model), dev, key, k, work.seq_len, work.dtype, tp_link, ep_link, cp_link, pricer)[:3])
             for k in tb.rep}
    kcomm = {k: _layer_times(id(model), dev, key, k, work.seq_len, work.dtype, tp_link, ep_link, cp_link, pricer)[3]
             for k in tb.rep}
    emb, head = _edge_times(id(model), dev, key, work.seq_len, work.dtype, pricer)

    # p2p activations per micro-batch boundary (Megatron scatter/gather: 1/t of the tensor crosses nodes)
    act_bytes = 2.0 * layout.micro_batch * work.seq_len / layout.cp * model.hidden_size / layout.tp
    p2p = collective_time_s("sendrecv", act_bytes, 2, pp_link) * vpp * 2 if pp > 1 else 0.0

    stage_compute, stage_comm = [], []
    for st in range(pp):
        r = stage_layers(model, layout, st)
        n_moe = tb.moe[r.stop] - tb.moe[r.start]
        counts = {True: n_moe, False: len(r) - n_moe}
        c = sum(kinds[k] * n for k, n in counts.items() if n)
        q = sum(kcomm[k] * n for k, n in counts.items() if n)
        if st == 0:
            c += emb
        if st == pp - 1:
            c += head
        stage_compute.append(c)
        stage_comm.append(q + p2p)
    per_mb = [c + q for c, q in zip(stage_compute, stage_comm)]
    slow = max(range(pp), key=lambda i: per_mb[i])
    t_max = per_mb[slow]
    bubble = (pp - 1) / vpp * (sum(per_mb) / pp)
    compute = m * stage_compute[slow]
    comm_exposed = m * stage_comm[slow]

    # gradient sync over the data-parallel (x context-parallel) group
    dense, expert = stage_params(model, layout, slow)
    grad_bytes = (dense + expert) * GRAD_BYTES
    dp_group = layout.dp * layout.cp
    dp_link = cluster.collective_link(dp_group, layout.tp)
    if layout.zero_stage == 3:
        shard = layout.dp_shard * layout.cp
        shard_link = cluster.collective_link(shard, layout.tp)
        pbytes = (dense + expert) * PARAM_BYTES
        per_mb_comm = (2 * collective_time_s("allgather", pbytes, shard, shard_link)
                       + collective_time_s("reducescatter", grad_bytes, shard, shard_link))
        fsdp_exposed = m * max(0.0, per_mb_comm - stage_compute[slow])
        rep_link = cluster.collective_link(layout.dp_replicate, layout.tp * layout.cp * layout.dp_shard)
        rep = collective_time_s("allreduce", grad_bytes / shard, layout.dp_replicate, rep_link)
        dp_exposed = fsdp_exposed + max(rep * min(1.0, DDP_BUCKET_BYTES / max(grad_bytes, 1.0)),
                                        rep - stage_compute[slow] * 2 / 3)
    else:
        sync = collective_time_s("allreduce", grad_bytes, dp_group, dp_link)
        last_bwd = (stage_compute[slow] + stage_comm[slow]) * 2 / 3
        dp_exposed = max(sync * min(1.0, DDP_BUCKET_BYTES / max(grad_bytes, 1.0)), sync - last_bwd)

    opt_numel = (dense + expert) / (layout.dp_shard * layout.cp if layout.zero_stage >= 1 else 1)
    optimizer = predict(OpSpec("optimizer", (int(opt_numel),), "fp32"), dev)

    step = m * t_max + bubble + dp_exposed + optimizer
    return finish_estimate(work, layout, m, step=step, compute_s=compute, exposed_comm_s=comm_exposed + dp_exposed,
                           bubble_s=bubble, other_s=optimizer)


def finish_estimate(work: Workload, layout: Layout, m: int, *, step: float, compute_s: float,
                    exposed_comm_s: float, bubble_s: float, other_s: float) -> Estimate:
    """The parts of an ``Estimate`` every estimator derives the same way: memory, FLOPs, rates, MFU."""
    model, dev = work.model, work.cluster.device
    mems = [stage_memory(work, layout, st, m) for st in {0, layout.pp - 1}]
    mem = max(mems, key=lambda x: x.total_bytes)
    limit = int(dev.memory_bytes * USABLE_FRACTION)
    tokens = work.global_batch * work.seq_len
    model_flops = model.model_flops_per_token(work.seq_len) * tokens
    extra = recompute_flops_per_token(model, work.seq_len, layout.recompute) * tokens
    world = layout.world_size
    return Estimate(
        step_time_s=step, compute_s=compute_s, exposed_comm_s=exposed_comm_s, bubble_s=bubble_s,
        other_s=other_s, memory=mem, model_flops=model_flops, hw_flops=model_flops + extra,
        tokens_per_s=tokens / step, tflops_per_device=model_flops / step / world / 1e12,
        hw_tflops_per_device=(model_flops + extra) / step / world / 1e12,
        mfu=model_flops / step / world / dev.peak(work.dtype), fits=mem.total_bytes <= limit,
        memory_limit_bytes=limit,
    )
