"""Step-time estimate for CPU ranks (``--cluster local:N``: N processes on this host, gloo over loopback).

The GPU estimate (``planner/estimate.py``) assumes kernels near their roofline, comm overlapped with compute on
separate engines, and negligible launch cost. None of that holds for small eager models on CPU cores, so this
module prices a CPU step from what it really costs, measured on this host:

* **Compute**: one decoder block of the model's shape (its TP shard: heads / tp, ffn / tp), and the final
  norm + LM head + cross-entropy, are timed forward + backward at the plan's micro-batch and sequence on one
  thread (``planner.cpu_bench``, fastest of several repetitions = free-core speed), with the plan's
  activation checkpointing applied for real. That folds the per-op dispatcher/autograd overhead, the glue
  between ops (views, bias adds, ``AccumulateGrad``) and the GEMM efficiency at small shapes into the price;
  summing isolated ``OpSpec`` timings instead came out a third low. The embedding is priced per ``OpSpec``.
* **Collectives**: gloo alpha-beta from the host calibration (``planner.calibrate``), on fp32/bf16 payloads.
  Not overlapped: a rank is pinned to one core and the gloo transport (loopback TCP copies) runs on that core,
  so comm in flight delays compute (the measured breakdown of a 2-rank DDP run shows the same, see
  planner/run_breakdown.py). DDP: one all-reduce of the gradients per step (25 MiB buckets). FSDP2 (ZeRO-3):
  per micro-batch an all-gather of every unit's parameters in forward and again in backward (the root unit is
  kept after forward), and per step one gradient reduction per unit, which FSDP2 issues on gloo as an
  all-reduce (torch 2.13 trace: ``gloo:all_reduce`` per unit). TP (Megatron split): two all-reduces of the
  activations per layer in forward and two in backward. PP: one activation send/recv per micro-batch and stage
  boundary in forward and one gradient send/recv in backward.
* **Framework work per parallel wrapper**: FSDP2's per-unit pre/post hooks (copy-in/out, views) and DTensor
  dispatch for every TP-sharded linear, as counts of host ops (from torch 2.13 CPU traces of
  ``examples/train_gpt.py``) priced at the per-op overhead.
* **Learned from runs** (``planner.local_fit``, ``meshplan check --learn``; 0 before any fit): every
  collective (``sync_points``) costs the host's learned wait for peers, and every layer of a
  micro-batch its learned framework overhead beyond the timed blocks.
* **Pipeline bubble**: (pp - 1) micro-batch slots of the average stage, for GPipe and 1F1B alike
  (Narayanan et al. 2021 §2.2: bubble fraction (p - 1) / m).
* **Optimizer**: an AdamW step timed on the rank's real list of parameter shapes (per-tensor overhead).
* **Oversubscription**: with more ranks than cores the step lasts at least the ranks' total busy time
  (bubble excluded: a stage waiting in recv sleeps) divided by the cores.
"""
from __future__ import annotations

import os
from functools import lru_cache

from costmodel.collectives import collective_time_s
from costmodel.ops import DTYPE_BYTES, OpSpec
from planner.layout import Layout

FSDP_OPS_PER_UNIT_PASS = 110  # host ops per FSDP2 unit per all-gather/reduce pass ((9423-6912)/23, trace count)
DTENSOR_OPS_PER_LINEAR = 32  # extra host ops per TP-sharded nn.Linear per micro-batch, fwd+bwd (trace count)
LINEARS_PER_LAYER = 6  # q, k, v, o, fc1, fc2


def _tiny_op_s() -> float:
    """Per-op framework overhead: a 1-element add, forward + backward, seconds."""
    from planner.cpu_bench import op_times_s

    f, b = op_times_s(OpSpec("elementwise", (1,), "fp32"))
    return f + b


def _ops_s(ops, times) -> tuple[float, float]:
    fwd = bwd = 0.0
    for op in ops:
        f, b = times(op)
        fwd += f
        bwd += b
    return fwd, bwd


@lru_cache(maxsize=4096)
def _mb_times(model, layout_key: Layout, seq_len: int, dtype: str) -> tuple[float, float, float]:
    """(one layer fwd+bwd(+recompute), embedding fwd+bwd, head fwd+bwd) for one micro-batch, seconds."""
    from planner.cpu_bench import flush, head_times_s, layer_times_s, op_times_s
    from planner.ops_graph import embedding_ops

    s = seq_len // layout_key.cp
    layer = layer_times_s(model, layout_key.tp, layout_key.micro_batch, s, layout_key.recompute, dtype)
    emb = sum(_ops_s(embedding_ops(model, layout_key, seq_len, dtype), op_times_s))
    head = head_times_s(model.vocab_size // layout_key.tp, model.hidden_size, layout_key.micro_batch * s, dtype)
    flush()
    return layer, emb, head


def _param_shapes(model, layout: Layout, stage: int, layers: range) -> list[tuple[int, ...]]:
    """Parameter tensor shapes one rank holds (TP splits rows/columns, FSDP2 shards dim 0)."""
    t, h = layout.tp, model.hidden_size
    norm = [(h,), (h,)] if model.norm == "layernorm" else [(h,)]
    f = model.ffn_hidden_size
    per_layer: list[tuple[int, ...]] = []
    per_layer += norm * 2
    per_layer += [(model.q_dim // t, h), (model.kv_dim // t, h), (model.kv_dim // t, h), (h, model.q_dim // t)]
    if model.qkv_bias:
        per_layer += [(model.q_dim // t,), (model.kv_dim // t,), (model.kv_dim // t,)]
    if model.o_bias:
        per_layer += [(h,)]
    per_layer += [(f // t, h)] * (model.mlp_matrices - 1) + [(h, f // t)]
    if model.mlp_bias:
        per_layer += [(f // t,)] * (model.mlp_matrices - 1) + [(h,)]
    shapes = per_layer * len(layers)
    if stage == 0:
        shapes += [(model.vocab_size // t, h)]
        rest = model.embedding_params // h - model.vocab_size
        if rest > 0:
            shapes += [(rest, h)]  # learned positions (GPT-2)
    if stage == layout.pp - 1:
        shapes += norm
        if model.lm_head_params or layout.pp > 1:
            shapes += [(model.vocab_size // t, h)]
    if layout.dp_shard > 1:
        shapes = [(max(1, s[0] // layout.dp_shard), *s[1:]) for s in shapes]
    return shapes


def sync_points(model, layout: Layout, m: int, n_layers: int) -> int:
    """Collectives a rank of the slowest stage waits on per step (as counted above; send/recv excluded)."""
    n = 0
    if layout.tp > 1:
        n += 4 * n_layers * m
    if layout.dp_shard > 1:
        n += m * (2 * n_layers + 1) + n_layers + 1
    if layout.dp_replicate > 1:
        n += 1
    return n


def world_cores(device) -> int:
    """Cores the ranks of a local run may use: this process's affinity set (torchrun children inherit it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return getattr(device, "sm_count", None) or 1


def estimate_cpu(work, layout: Layout):
    """``Estimate`` of ``layout`` on a CPU cluster (see the module docstring for the model)."""
    from planner.estimate import _time_key, finish_estimate, stage_layers, stage_params, tables
    from planner.cpu_bench import flush, measure_optimizer_s

    model, cluster = work.model, work.cluster
    dev = cluster.device
    m = layout.num_microbatches(work.global_batch)
    pp = layout.pp
    tables(model)
    layer_s, emb_s, head_s = _mb_times(model, _time_key(layout), work.seq_len, work.dtype)
    tiny = _tiny_op_s()
    e = DTYPE_BYTES.get(work.dtype, 4)
    tokens_mb = layout.micro_batch * work.seq_len // layout.cp

    # TP: 2 all-reduces of the activations forward, 2 backward, per layer (Shoeybi et al. 2019, Fig. 3)
    tp_comm = tp_host = 0.0
    if layout.tp > 1:
        link = cluster.collective_link(layout.tp, 1)
        tp_comm = 4 * collective_time_s("allreduce", e * tokens_mb * model.hidden_size, layout.tp, link)
        tp_host = DTENSOR_OPS_PER_LINEAR * LINEARS_PER_LAYER * tiny
    # PP: activation forward + gradient backward per boundary and micro-batch
    p2p = 0.0
    if pp > 1:
        link = cluster.collective_link(2, layout.pp_stride)
        p2p = 2 * collective_time_s("sendrecv", e * tokens_mb * model.hidden_size / layout.tp, 2, link)

    stage_mb, stage_comm_mb = [], []
    for st in range(pp):
        n = len(stage_layers(model, layout, st))
        c = n * (layer_s + tp_host) + (emb_s if st == 0 else 0.0) + (head_s if st == pp - 1 else 0.0)
        stage_mb.append(c)
        stage_comm_mb.append(n * tp_comm + p2p)
    per_mb = [c + q for c, q in zip(stage_mb, stage_comm_mb)]
    slow = max(range(pp), key=lambda i: per_mb[i])
    compute = m * stage_mb[slow]
    comm = m * stage_comm_mb[slow]
    bubble = (pp - 1) * sum(per_mb) / pp

    # data-parallel gradient sync of the slowest stage's parameters (fp32 gradients, as the trainer keeps them)
    dense, expert = stage_params(model, layout, slow)
    grad_bytes = (dense + expert) * 4.0
    n_layers = len(stage_layers(model, layout, slow))
    if layout.dp_shard > 1:
        shard_link = cluster.collective_link(layout.dp_shard, layout.tp)
        units = n_layers + 1  # one fully_shard per block + the root
        unit_bytes = grad_bytes / units
        ag = collective_time_s("allgather", unit_bytes, layout.dp_shard, shard_link)
        comm += m * (2 * n_layers + 1) * ag
        comm += units * collective_time_s("allreduce", unit_bytes, layout.dp_shard, shard_link)
        compute += (m * (2 * n_layers + 1) + units) * FSDP_OPS_PER_UNIT_PASS * tiny
        grad_bytes /= layout.dp_shard
    if layout.dp_replicate > 1:
        rep_link = cluster.collective_link(layout.dp_replicate, layout.tp * layout.dp_shard)
        comm += collective_time_s("allreduce", grad_bytes, layout.dp_replicate, rep_link)

    # learned wait per synchronisation point and overhead per micro-batch (planner.local_fit; 0 before a fit)
    from planner.local_fit import learned

    fit = learned()
    compute += m * n_layers * fit["layer_overhead_s"]
    # collectives only: a pipeline stage's wait for its neighbour is the bubble, priced above
    comm += sync_points(model, layout, m, n_layers) * fit["sync_wait_s"]

    optimizer = measure_optimizer_s(_param_shapes(model, layout, slow, stage_layers(model, layout, slow)))
    flush()
    step = compute + comm + bubble + optimizer
    # More ranks than cores: the ranks' busy time (everything but the bubble, when a stage sleeps in recv)
    # shares the cores, so the step lasts at least sum(busy) / cores (work conservation); stretched evenly.
    cores = world_cores(dev)
    if layout.world_size > cores:
        per_rank_busy = [m * (stage_mb[st] + stage_comm_mb[st]) + (comm - m * stage_comm_mb[slow]) + optimizer
                         for st in range(pp)]
        total_busy = sum(per_rank_busy) * (layout.world_size // pp)
        stretch = max(1.0, total_busy / cores / step)
        compute, comm, bubble, optimizer = (x * stretch for x in (compute, comm, bubble, optimizer))
        step *= stretch

    return finish_estimate(work, layout, m, step=step, compute_s=compute, exposed_comm_s=comm, bubble_s=bubble,
                           other_s=optimizer)
