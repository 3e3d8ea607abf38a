"""Step-time estimate for CPU ranks (``--cluster local:N``: N processes on this host, gloo over loopback).

The GPU estimate (``planner/estimate/base.py``) assumes kernels near their roofline, comm overlapped with compute on
separate engines, and negligible launch cost. None of that holds for small eager models on CPU cores, so this
module prices a CPU step from what it really costs, measured on this host:

* **Compute**: one decoder block of the model's shape (its TP shard: heads / tp, ffn / tp), and the final
  norm + LM head + cross-entropy, are timed forward + backward at the plan's micro-batch and sequence on one
  thread (``planner.host.cpu_bench.HostBench``, fastest of several repetitions = free-core speed), with the plan's
  activation checkpointing applied for real (every recompute mode of a shape timed in one paired session, so no
  mode prices below none under any load: ``cpu_bench.paired_layer_s``). That folds the per-op dispatcher/autograd
  overhead, the glue between ops (views, bias adds, ``AccumulateGrad``) and the GEMM efficiency at small shapes
  into the price; summing isolated ``OpSpec`` timings instead came out a third low. The embedding is
  priced per ``OpSpec``.
* **Collectives**: priced from the calibration's in-step gloo measurement (``planner.host.gloo_in_step``,
  ``measured['in_step_s']``): the mean time of an all-reduce / all-gather of that size issued right after
  compute by ranks placed as ``meshplan profile`` places them. A rank is pinned to one core and gloo's worker
  thread runs on that core, so comm in flight delays compute and nothing overlaps; a small message costs far
  more than alpha-beta says (the worker threads sleep during compute and must be woken on both ranks: a
  512 KiB all-reduce measured 0.18 ms back to back, 2-3 ms after compute); the table of the group's size is
  used (p = 4 was measured as 4 ranks share this host's cores, so it holds the wait for a descheduled peer; a
  group smaller than an oversubscribed world uses the table of such groups measured inside it, "2of4").
  Without that table: gloo alpha-beta. Counts per step (torch 2.13 traces
  of ``examples/train_gpt.py``):
  DDP: one all-reduce per gradient bucket (DDP's first bucket is capped at 1 MiB, the rest at 25 MiB); with a
  pipeline or tensor parallelism the trainer averages gradients itself, one all-reduce per parameter tensor of
  the rank (its stage, its TP shard). FSDP2
  (ZeRO-3): per micro-batch an all-gather of every unit (blocks + root) in forward and again in backward
  (2 x (layers + 1) gathers: the traced count), and per step one gradient reduction per unit, which FSDP2 issues
  on gloo as an all-reduce; with HSDP (dp_replicate > 1 too) each unit's reduced shard is then all-reduced across
  the replicas (one more all-reduce per unit). TP (``ColwiseParallel`` q, k, v, fc1; ``RowwiseParallel`` o, fc2): per
  layer and
  micro-batch the two row-wise outputs are all-reduced in forward and the four column-wise input gradients in
  backward (6, the traced count; Shoeybi et al. 2019 fuse q/k/v and count 4). PP: one activation send/recv per
  micro-batch and stage boundary in forward and one gradient send/recv in backward (alpha-beta).
* **Framework work per parallel wrapper**: FSDP2's per-unit pre/post hooks (copy-in/out, views) and DTensor
  dispatch for every TP-sharded linear, as counts of host ops (from torch 2.13 CPU traces of
  ``examples/train_gpt.py``) priced at the per-op overhead.
* **Learned from runs** (``planner.host.terms.HostTerms``, given to the estimator; fitted by ``verify.learn``,
  ``meshplan costmodel fit --runs`` / ``check --learn``; neutral before any fit): the CPU work is scaled by the
  host's learned ratio of measured to priced compute, and every collective (``sync_points``) costs the host's
  learned wait for peers. ``meshplan advise`` prices candidates in one run's own conditions
  (``verify.advise.calibrate``) and may also scale the pipeline bubble (``HostTerms.bubble_scale``).
* **Pipeline bubble**: the slowest stage waits, per step, for the other stages' per-micro-batch work (the first
  forward reaching it, the last backward draining), for GPipe and 1F1B alike; with balanced stages that is
  (p - 1) micro-batch slots (Narayanan et al. 2021 §2.2: bubble fraction (p - 1) / m).
* **Optimizer**: an AdamW step timed on the rank's real list of parameter shapes (per-tensor overhead).
* **Oversubscription**: with more ranks than cores the step's compute lasts at least the ranks' total compute
  time (bubble excluded: a stage waiting in recv sleeps) divided by the cores, and longer by the calibration's
  time-slicing efficiency (``measured['time_slicing']``: ranks sharing cores that synchronise after each chunk
  of compute leave a core idle while both its ranks wait for the other core's; measured, not assumed).
  Collectives are priced from the in-step tables and are not stretched.
"""
from __future__ import annotations

import os

from meshplan.core.errors import MeshplanError
from meshplan.costmodel.api import Pricer
from meshplan.costmodel.collectives import collective_time_s
from meshplan.costmodel.devices import DeviceSpec
from meshplan.costmodel.ops import DTYPE_BYTES, OpSpec
from meshplan.planner.estimate.base import Estimate, TablesCache, Workload, finish_estimate, stage_params, time_key
from meshplan.planner.estimate.ops_graph import embedding_ops
from meshplan.planner.host.calibrate import Calibration, host_bench
from meshplan.planner.host.gloo_in_step import in_step_collective_s
from meshplan.planner.host.terms import NEUTRAL_TERMS, HostTerms
from meshplan.planner.layout.layout import Layout

FSDP_OPS_PER_UNIT_PASS = 110  # host ops per FSDP2 unit per all-gather/reduce pass ((9423-6912)/23, trace count)
TP_ALLREDUCES_PER_LAYER = 6  # 2 forward (o, fc2 outputs) + 4 backward (q, k, v, fc1 input grads): trace count
DDP_FIRST_BUCKET_BYTES = 1 * 2**20  # torch DDP first_bucket_bytes_cap default
DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP bucket_cap_mb default
DTENSOR_OPS_PER_LINEAR = 32  # extra host ops per TP-sharded nn.Linear per micro-batch, fwd+bwd (trace count)
LINEARS_PER_LAYER = 6  # q, k, v, o, fc1, fc2


def coll_s(measured: dict, kind: str, nbytes: float, group: int, link, world: int, cores: int) -> float:
    """One collective of ``nbytes`` (the full tensor, as ``collective_time_s``) over ``group`` ranks, seconds.

    Priced from the calibration's in-step tables (``measured``, see the module docstring); ``world`` ranks share
    ``cores`` cores. Without a table: gloo alpha-beta on ``link``.
    """
    if group <= 1:
        return 0.0
    per_rank = nbytes / group if kind == "allgather" else nbytes  # the table keys an all-gather by its shard
    # a group inside a run with more ranks than cores: its table measured under that oversubscription
    t = in_step_collective_s(measured, kind, per_rank, group, world if world > cores else 0)
    if t is None and kind == "allreduce_burst":  # a calibration without bursts: priced as separate calls
        t = in_step_collective_s(measured, "allreduce", per_rank, group, world if world > cores else 0)
    return t if t is not None else collective_time_s(kind.removesuffix("_burst"), nbytes, group, link)


def _param_shapes(model, layout: Layout, stage: int, n_layers: int) -> list[tuple[int, ...]]:
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
    shapes = per_layer * n_layers
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


def sync_points(layout: Layout, m: int, n_layers: int) -> int:
    """Collectives a rank of the slowest stage waits on per step (as counted above; send/recv excluded)."""
    n = 0
    if layout.tp > 1:
        n += TP_ALLREDUCES_PER_LAYER * n_layers * m
    if layout.dp_shard > 1:
        n += m * 2 * (n_layers + 1) + n_layers + 1
    if layout.dp_replicate > 1:
        n += n_layers + 1 if layout.dp_shard > 1 else 1  # HSDP: one replica all-reduce per FSDP unit
    return n  # (the per-tensor averaging of DP with TP or PP runs back to back after backward: one wait, counted 1)


def world_cores(device=None) -> int:
    """Cores the ranks of a local run may use: this process's affinity set (torchrun children inherit it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return getattr(device, "sm_count", None) or 1


class CpuEstimator:
    """``Estimate`` of a layout on ``local:N`` CPU ranks (see the module docstring for the model).

    Args:
        calibration: This host's calibration (``planner.host.calibrate``): in-step collective tables, time-slicing.
        terms: What this host's runs taught (``NEUTRAL_TERMS``: unfitted).
        pricer: The cost model that prices single operators for the solvers (``op_time_s``) and names what
            priced the plan (``Prediction.costmodel``); the step itself is priced from this host's measurements.
    """

    # what this host's block timings measure (planner.host.cpu_bench) and examples/train_gpt.py runs: no full:N, no op
    recompute_kinds = ("none", "selective", "full")

    def __init__(self, calibration: Calibration, terms: HostTerms = NEUTRAL_TERMS, pricer: Pricer | None = None):
        self.calibration = calibration
        self.terms = terms
        self.pricer = pricer if pricer is not None else Pricer.roofline()
        self.name = self.pricer.name
        self.bench = host_bench(calibration)
        self.tables = TablesCache()
        self._mb: dict[tuple, tuple[float, float, float]] = {}

    @property
    def measured(self) -> dict:
        return self.calibration.measured

    # ---- single operators for the solvers: the cost model's price, as on any cluster
    def op_time_s(self, op: OpSpec, device: DeviceSpec) -> float:
        return self.pricer.predict(op, device)

    def op_times_s(self, ops: list[OpSpec], device: DeviceSpec) -> list[float]:
        return [float(t) for t in self.pricer.predict_batch(ops, device)]

    def _tiny_op_s(self) -> float:
        """Per-op framework overhead: a 1-element add, forward + backward, seconds."""
        f, b = self.bench.op_times_s(OpSpec("elementwise", (1,), "fp32"))
        return f + b

    def _mb_times(self, model, key: Layout, seq_len: int, dtype: str) -> tuple[float, float, float]:
        """(one layer fwd+bwd(+recompute), embedding fwd+bwd, head fwd+bwd) for one micro-batch, seconds."""
        k = (model, key, seq_len, dtype)
        hit = self._mb.get(k)
        if hit is None:
            s = seq_len // key.cp
            bench = self.bench
            layer = bench.layer_times_s(model, key.tp, key.micro_batch, s, key.recompute, dtype)
            emb = sum(sum(bench.op_times_s(op)) for op in embedding_ops(model, key, seq_len, dtype))
            head = bench.head_times_s(model.vocab_size // key.tp, model.hidden_size, key.micro_batch * s, dtype)
            bench.flush()
            hit = self._mb[k] = (layer, emb, head)
        return hit

    def estimate(self, work: Workload, layout: Layout) -> Estimate:
        """Predict step time, throughput and peak memory of ``layout`` (validated beforehand)."""
        model, cluster = work.model, work.cluster
        if model.is_hybrid or model.sliding_window:
            # this host times one transformer block of the model's shape (planner.host.cpu_bench): it has no Mamba-2
            # mixer and no sliding window to time
            raise MeshplanError(f"model {model.name}: local:N times one full-attention transformer block on this "
                                "host; hybrid Mamba and sliding-window models are priced on GPU clusters only")
        if work.lora:  # this host times whole-layer backwards; a frozen base's backward is not measured
            raise MeshplanError(f"--lora {work.lora}: local:N prices full training only (its blocks are timed "
                                "with every weight's gradient)")
        if layout.offload_layers:  # activations already live in host memory on local:N
            raise MeshplanError(f"offload_layers={layout.offload_layers}: local:N runs on this host's CPU, whose "
                                "activations are in host memory already; activation offloading is a GPU decision")
        dev = cluster.device
        m = layout.num_microbatches(work.global_batch)
        pp = layout.pp
        tb = self.tables(model)
        layer_s, emb_s, head_s = self._mb_times(model, time_key(layout), work.seq_len, work.dtype)
        tiny = self._tiny_op_s()
        e = DTYPE_BYTES.get(work.dtype, 4)
        tokens_mb = layout.micro_batch * work.seq_len // layout.cp
        cores = world_cores(dev)
        world = layout.world_size

        def coll(kind: str, nbytes: float, group: int, link) -> float:
            return coll_s(self.measured, kind, nbytes, group, link, world, cores)

        # TP: per layer 2 all-reduces of the activations forward, 4 backward (see TP_ALLREDUCES_PER_LAYER)
        tp_comm = tp_host = 0.0
        if layout.tp > 1:
            link = cluster.collective_link(*layout.tp_group)
            tp_comm = TP_ALLREDUCES_PER_LAYER * coll("allreduce", e * tokens_mb * model.hidden_size, layout.tp, link)
            tp_host = DTENSOR_OPS_PER_LINEAR * LINEARS_PER_LAYER * tiny
        # PP: activation forward + gradient backward per boundary and micro-batch
        p2p = 0.0
        if pp > 1:
            link = cluster.collective_link(*layout.pp_neighbours)
            p2p = 2 * collective_time_s("sendrecv", e * tokens_mb * model.hidden_size / layout.tp, 2, link)

        stage_mb, stage_comm_mb = [], []
        for st in range(pp):
            n = layout.stage_num_layers(model.num_layers, st)
            c = n * (layer_s + tp_host) + (emb_s if st == 0 else 0.0) + (head_s if st == pp - 1 else 0.0)
            stage_mb.append(c)
            stage_comm_mb.append(n * tp_comm + p2p)
        per_mb = [c + q for c, q in zip(stage_mb, stage_comm_mb)]
        slow = max(range(pp), key=lambda i: per_mb[i])
        compute = m * stage_mb[slow]
        comm = m * stage_comm_mb[slow]
        # the slowest stage idles while the micro-batch's forward reaches it and its backward drains past the other
        # stages: per step, the other stages' per-micro-batch work (balanced stages: (pp - 1) slots, Narayanan et
        # al. 2021 §2.2). The average stage overstated it: tiny GPT PP=2 measured 42 ms idle where the mean gave
        # 64 ms, the other stage's own time 42 ms (its last stage holds the LM head and loss).
        bubble = sum(per_mb) - per_mb[slow]

        n_layers = layout.stage_num_layers(model.num_layers, slow)
        comm, compute = self._dp_sync(work, layout, tb, slow, m, coll, tiny, comm, compute)
        optimizer = self.bench.measure_optimizer_s(_param_shapes(model, layout, slow, n_layers))
        self.bench.flush()

        # learned from this host's runs (1 and 0 before a fit): the ratio of the runs' compute to this free-core
        # pricing, on all CPU work (the bubble is the other stages' compute), and the wait per collective (a
        # pipeline stage's wait for its neighbour is the bubble, priced above)
        scale = self.terms.compute_scale
        compute, bubble, optimizer = (x * scale for x in (compute, bubble, optimizer))
        bubble *= self.terms.bubble_scale
        stage_mb = [x * scale for x in stage_mb]
        comm += sync_points(layout, m, n_layers) * self.terms.sync_wait_s
        step = compute + comm + bubble + optimizer
        if world > cores:
            compute, bubble, optimizer = self._shared_cores(layout, m, stage_mb, slow, compute, bubble, optimizer,
                                                            world, cores)
            step = compute + comm + bubble + optimizer

        return finish_estimate(work, tb, layout, m, step=step, compute_s=compute, exposed_comm_s=comm,
                               bubble_s=bubble, other_s=optimizer)

    def _shared_cores(self, layout: Layout, m: int, stage_mb: list[float], slow: int, compute: float, bubble: float,
                      optimizer: float, world: int, cores: int) -> tuple[float, float, float]:
        """More ranks than cores: the ranks' busy time (everything but the bubble, when a stage sleeps in recv)
        shares the cores, so the step lasts at least sum(busy) / cores (work conservation); stretched evenly.
        CPU work only: the collectives' wall time was measured under the same oversubscription."""
        pp = layout.pp
        fsdp_host = compute - m * stage_mb[slow]
        per_rank_busy = [m * stage_mb[st] + fsdp_host + optimizer for st in range(pp)]
        total_busy = sum(per_rank_busy) * (world // pp)
        busy_slow = compute + optimizer
        sl = self.measured.get("time_slicing") or {}
        eff = float(sl["efficiency"]) if sl.get("world") == world and sl.get("cores") == cores else 1.0
        stretch = max(1.0, total_busy / cores / busy_slow / max(eff, 0.1))
        return tuple(x * stretch for x in (compute, bubble, optimizer))

    def _dp_sync(self, work: Workload, layout: Layout, tb, slow: int, m: int, coll, tiny: float, comm: float,
                 compute: float) -> tuple[float, float]:
        """``comm`` and ``compute`` with the data-parallel gradient sync of pipeline stage ``slow``'s parameters
        added (fp32 gradients, as the trainer keeps them): FSDP2 per unit, HSDP, the trainer's own averaging or
        DDP's buckets."""
        model, cluster, pp = work.model, work.cluster, layout.pp
        n_layers = layout.stage_num_layers(model.num_layers, slow)
        dense, expert = stage_params(tb, layout, slow)
        grad_bytes = (dense + expert) * 4.0
        if layout.dp_shard > 1:
            shard_link = cluster.collective_link(*layout.shard_group)
            units = n_layers + 1  # one fully_shard per block + the root
            unit_bytes = grad_bytes / units
            ag = coll("allgather", unit_bytes, layout.dp_shard, shard_link)
            comm += m * 2 * units * ag
            comm += units * coll("allreduce", unit_bytes, layout.dp_shard, shard_link)
            compute += (m * 2 * units + units) * FSDP_OPS_PER_UNIT_PASS * tiny
            grad_bytes /= layout.dp_shard
        if layout.dp_replicate > 1:
            rep_link = cluster.collective_link(*layout.replicate_group)
            if layout.dp_shard > 1:  # HSDP (FSDP2 on a 2-D mesh): per unit, its reduced shard across the replicas
                comm += units * coll("allreduce", grad_bytes / units, layout.dp_replicate, rep_link)
            elif pp > 1 or layout.tp > 1:  # the trainer's own averaging (no DDP on stages / DTensors): per tensor,
                # back to back after backward: the first call pays the wake-up, the rest the calibrated burst rate
                for i, shape in enumerate(_param_shapes(model, layout, slow, n_layers)):
                    numel = 1
                    for d in shape:
                        numel *= d
                    comm += coll("allreduce" if i == 0 else "allreduce_burst", 4.0 * numel, layout.dp_replicate,
                                 rep_link)
            else:  # DDP buckets: the first capped at 1 MiB, then full 25 MiB ones and a remainder
                first = min(grad_bytes, DDP_FIRST_BUCKET_BYTES)
                full, last = divmod(grad_bytes - first, DDP_BUCKET_BYTES)
                comm += coll("allreduce", first, layout.dp_replicate, rep_link)
                comm += full * coll("allreduce", DDP_BUCKET_BYTES, layout.dp_replicate, rep_link)
                if last > 0:
                    comm += coll("allreduce", last, layout.dp_replicate, rep_link)

        return comm, compute
