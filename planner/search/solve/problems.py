"""Build the partition solvers' plain-number problems from ``ModelSpec`` + ``ClusterSpec`` + an estimator.

Per layer, device group and precision (``planner.search.solve.columns``): the layer's operators
(``planner.estimate.ops_graph.layer_ops``) priced through the estimator (``planner.search.solve.pricing``), its bytes
(model
states, activations after ``planner.estimate.memory``, or KV cache) and its quality indicator
(``planner.search.solve.sensitivity``).
Stage units: for training a stage is one node (tensor parallel over its devices, Megatron's TP-in-node rule);
for serving a stage is one device. Usable memory per device follows ``planner.estimate.memory``
(``USABLE_FRACTION`` x memory - ``RUNTIME_OVERHEAD_BYTES``). The gradient-compression problem is built by
``planner.search.solve.compression_problem``.
"""
from __future__ import annotations

from typing import Optional, Sequence

from meshplan.core.errors import MeshplanError
from meshplan.costmodel.collectives import collective_time_s
from meshplan.costmodel.ops import OpSpec
from meshplan.planner.estimate.memory import (
    GRAD_BYTES,
    OPTIMIZER_BYTES,
    PARAM_BYTES,
    activation_bytes_per_layer,
    layer_shape,
)
from meshplan.planner.estimate.ops_graph import head_ops, layer_ops
from meshplan.planner.layout.layout import Layout
from meshplan.planner.search.solve.columns import (
    KV_BYTES,
    check_sensitivity,
    edge_params,
    precision_columns,
    resolve_sensitivity,
    usable_bytes,
    weight_bytes,
)
from meshplan.planner.search.solve.compression_problem import compression_problem
from meshplan.planner.search.solve.partition_data import GroupSlot, PartitionProblem, Phase, PipelineOption
from meshplan.planner.search.solve.pricing import OpPrices, default_estimator

__all__ = ["compression_problem", "edge_params", "precision_columns", "serve_partition_problem",
           "train_partition_problem"]


def boundary_link(cluster, g: int, h: int, unit: str):
    """Link a stage boundary between a unit of group g and one of group h crosses."""
    if g != h:
        return cluster.inter_link
    grp = cluster.groups[g]
    if unit == "device":
        return grp.intra_link
    return grp.nic_link or cluster.inter_link


def train_partition_problem(model, cluster, global_batch: int, seq_len: int,
                            precisions: Optional[Sequence[str]] = None, quality_budget: Optional[float] = None,
                            micro_batches: Sequence[int] = (1, 2, 4),
                            sensitivity: Optional[Sequence[Sequence[float]]] = None,
                            estimator=None) -> PartitionProblem:
    """Heterogeneous pipeline training: one stage per node (TP over its devices), 1F1B, dp = 1.

    Args:
        model: ``ModelSpec``.
        cluster: ``ClusterSpec``.
        global_batch: Sequences per step.
        seq_len: Tokens per sequence.
        precisions: Precision columns (default: base dtype + fp8 where a device has it).
        quality_budget: Bound on the summed indicators (``None`` = unbounded).
        micro_batches: Candidate micro-batch sizes (those dividing ``global_batch`` are used).
        sensitivity: Measured indicators ``[layer][precision]`` replacing the defaults.
        estimator: What prices the operators (``planner.estimate.base.Estimator``; default: the shipped cost model).
    """
    prices = OpPrices(default_estimator(estimator))
    return prices.build(lambda: _train_partition(prices, model, cluster, global_batch, seq_len, precisions,
                                                 quality_budget, micro_batches, sensitivity))


def _train_partition(prices: OpPrices, model, cluster, global_batch, seq_len, precisions, quality_budget,
                     micro_batches, sensitivity) -> PartitionProblem:
    devices = [g.device for g in cluster.groups]
    cols = precision_columns(devices, "train", precisions)
    base = cols[0]
    L = model.num_layers
    first, last = edge_params(model)
    options = []
    for b in [mb for mb in micro_batches if global_batch % mb == 0]:
        m = global_batch // b
        times, static, act = [], [], []
        for i in range(L):
            trow, srow, arow = [], [], []
            for grp in cluster.groups:
                t = grp.devices_per_node
                lay = Layout(tp=t, micro_batch=b, sequence_parallel=t > 1)
                ops = layer_ops(model, i, lay, seq_len, dtype=base)
                comm = sum(2 * collective_time_s(kind, nbytes, t, grp.intra_link) for kind, nbytes in ops.tp_comm)
                extra = head_ops(model, lay, seq_len, dtype=base) if i == L - 1 else ()
                params = model.layer_params(i) + (first if i == 0 else 0) + (last if i == L - 1 else 0)
                a = activation_bytes_per_layer(layer_shape(model, i), seq_len, b, lay)
                tt, ss, aa = [], [], []
                for p in cols:
                    if not grp.device.supports(p):
                        tt.append(None), ss.append(None), aa.append(None)
                        continue
                    tt.append(prices.ops_s(ops.compute, grp.device, p, base, True)
                              + prices.ops_s(extra, grp.device, base, base, True) + comm
                              + prices.host_wait_s(model, ops, lay, grp.device, p, base))
                    ss.append(params * (PARAM_BYTES + GRAD_BYTES + OPTIMIZER_BYTES) / t)
                    aa.append(a)
                trow.append(tt), srow.append(ss), arow.append(aa)
            times.append(trow), static.append(srow), act.append(arow)
        G = len(cluster.groups)
        link = [[2 * collective_time_s("sendrecv", 2.0 * b * seq_len * model.hidden_size
                                       / cluster.groups[g].devices_per_node, 2, boundary_link(cluster, g, h, "node"))
                 for h in range(G)] for g in range(G)]
        ph = Phase("step", m, 1, times, link)
        options.append(PipelineOption(f"micro_batch={b} x {m}", (ph,), static, act, inflight_cap=m, micro_batch=b))
    if not options:
        raise MeshplanError(f"global batch {global_batch}: no candidate micro-batch size in {list(micro_batches)} "
                            f"divides it")
    groups = tuple(GroupSlot(g.device.name, g.nodes, usable_bytes(g.device)) for g in cluster.groups)
    sens = resolve_sensitivity(sensitivity, model, cols, base, operands=2)
    check_sensitivity(sens, L, cols)
    return PartitionProblem(cols, groups, tuple(options), sens, quality_budget)


def serve_partition_problem(model, cluster, batch: int, prompt_len: int, gen_len: int,
                            precisions: Optional[Sequence[str]] = None, quality_budget: Optional[float] = None,
                            micro_batches: Sequence[int] = (1, 2, 4),
                            sensitivity: Optional[Sequence[Sequence[float]]] = None,
                            estimator=None) -> PartitionProblem:
    """LLM-PQ serving: one stage per device; prefill and decode micro-batch counts per option.

    Each option pairs a prefill micro-batch count with a decode micro-batch count (both dividing ``batch``).
    Memory per layer: weights at the layer's precision + the KV cache of the whole batch at the final length.
    Decode is priced at the mean context ``prompt_len + gen_len / 2``.
    """
    prices = OpPrices(default_estimator(estimator))
    return prices.build(lambda: _serve_partition(prices, model, cluster, batch, prompt_len, gen_len, precisions,
                                                 quality_budget, micro_batches, sensitivity))


def _serve_partition(prices: OpPrices, model, cluster, batch, prompt_len, gen_len, precisions, quality_budget,
                     micro_batches, sensitivity) -> PartitionProblem:
    devices = [g.device for g in cluster.groups]
    cols = precision_columns(devices, "serve", precisions)
    base = cols[0]
    L = model.num_layers
    first, last = edge_params(model)
    ctx = prompt_len + gen_len // 2
    counts = [c for c in micro_batches if batch % c == 0]
    if not counts:
        raise MeshplanError(f"serving batch {batch}: no micro-batch count in {list(micro_batches)} divides it")
    G = len(cluster.groups)

    def table(mb: int, decode: bool):
        out = []
        for i in range(L):
            row = []
            for grp in cluster.groups:
                lay = Layout(micro_batch=mb)
                if decode:
                    ops = [op if op.kind != "attention" else
                           OpSpec("attention", (mb, model.num_heads, 1, ctx, model.head_dim), base, causal=False)
                           for op in layer_ops(model, i, lay, 1, dtype=base).compute]
                    extra = head_ops(model, lay, 1, dtype=base) if i == L - 1 else ()
                else:
                    ops = layer_ops(model, i, lay, prompt_len, dtype=base).compute
                    extra = head_ops(model, Layout(micro_batch=mb), 1, dtype=base) if i == L - 1 else ()
                row.append([prices.ops_s(ops, grp.device, p, base, False)
                            + prices.ops_s(extra, grp.device, base, base, False)
                            if grp.device.supports(p) else None for p in cols])
            out.append(row)
        return out

    def links(mb: int, tokens: int):
        return [[collective_time_s("sendrecv", 2.0 * mb * tokens * model.hidden_size, 2,
                                   boundary_link(cluster, g, h, "device"))
                 for h in range(G)] for g in range(G)]

    prefill = {c: (table(batch // c, False), links(batch // c, prompt_len)) for c in counts}
    decode = {c: (table(batch // c, True), links(batch // c, 1)) for c in counts}
    kv = [2.0 * model.kv_dim * (prompt_len + gen_len) * batch * KV_BYTES for _ in range(L)]
    static = []
    for i in range(L):
        params = model.layer_params(i) + (first if i == 0 else 0) + (last if i == L - 1 else 0)
        edge = (first if i == 0 else 0) + (last if i == L - 1 else 0)  # embedding / LM head stay 16-bit
        body = params - edge
        row = []
        for grp in cluster.groups:
            row.append([None if not grp.device.supports(p) else
                        edge * 2 + body * (weight_bytes(p)) + kv[i] for p in cols])
        static.append(row)
    zero = [[[0.0 if x is not None else None for x in r] for r in row] for row in static]
    options = []
    for cp in counts:
        for cd in counts:
            phases = (Phase("prefill", cp, 1, *prefill[cp]), Phase("decode", cd, max(1, gen_len - 1), *decode[cd]))
            options.append(PipelineOption(f"prefill {cp} x {batch // cp}, decode {cd} x {batch // cd}", phases,
                                          static, zero, inflight_cap=1, micro_batch=batch // cd))
    groups = tuple(GroupSlot(g.device.name, g.world_size, usable_bytes(g.device)) for g in cluster.groups)
    sens = resolve_sensitivity(sensitivity, model, cols, base, operands=1)
    check_sensitivity(sens, L, cols)
    return PartitionProblem(cols, groups, tuple(options), sens, quality_budget)
