"""Build the solvers' plain-number problems from ``ModelSpec`` + ``ClusterSpec`` + ``costmodel.predict``.

Per layer, device group and precision: the layer's operators (``planner.ops_graph.layer_ops``) priced by the cost
model, its bytes (model states, activations or KV cache) and its quality indicator
(``planner.solve.sensitivity``). Precision semantics:

- ``train``: the base dtype (bf16, or fp16 where a device lacks bf16) or fp8 GEMMs (Transformer-Engine style,
  fp8 forward and backward GEMMs); model states stay 16 + 2 + 12 bytes/param (ZeRO paper §3.1).
- ``serve``: fp8 / int8 are W8A8 (GEMMs run in that dtype: SmoothQuant, Xiao et al. 2023); int4 is weight-only
  W4A16 (AWQ/GPTQ): weight bytes at 4 bits (+ one fp16 scale per 128 weights), math in fp16, so a GEMM costs
  ``max(cost model at int4 bytes, fp16 FLOP time)``.
- ``qsync``: fp32 reference, fp16 or int8 GEMMs on the slower group (QSync, Zhao et al. 2023).

Stage units: for training a stage is one node (tensor parallel over its devices, Megatron's TP-in-node rule);
for serving a stage is one device. Usable memory per device follows ``planner.memory``
(``USABLE_FRACTION`` x memory - ``RUNTIME_OVERHEAD_BYTES``).
"""
from __future__ import annotations

import os

from dataclasses import replace
from typing import Optional, Sequence

from meshplan.costmodel.api import ROOFLINE_EFFICIENCY, predict
from meshplan.costmodel.collectives import collective_time_s
from meshplan.costmodel.devices import DeviceSpec
from meshplan.costmodel.ops import OpSpec
from meshplan.core.errors import MeshplanError
from meshplan.planner.layout import Layout
from meshplan.planner.memory import (GRAD_BYTES, OPTIMIZER_BYTES, PARAM_BYTES, RUNTIME_OVERHEAD_BYTES, USABLE_FRACTION,
                            LayerShape, activation_bytes_per_layer)
from meshplan.planner.ops_graph import head_ops, layer_ops
from meshplan.planner.solve.partition import GroupSlot, PartitionProblem, Phase, PipelineOption
from meshplan.planner.solve.sensitivity import default_layer_indicators

MENU = {"train": ("bf16", "fp8"), "serve": ("bf16", "fp8", "int8", "int4"), "qsync": ("fp32", "fp16", "int8")}
KV_BYTES = 2  # fp16/bf16 KV cache
INT4_SCALE_BYTES_PER_WEIGHT = 2 / 128  # one fp16 scale per group of 128 weights (AWQ/GPTQ default group)


def usable_bytes(device: DeviceSpec) -> float:
    """Memory a plan may use on one device, bytes (``planner.memory`` headroom rules)."""
    return USABLE_FRACTION * device.memory_bytes - RUNTIME_OVERHEAD_BYTES


def base_dtype(devices: Sequence[DeviceSpec]) -> str:
    """bf16 where every device has it, else fp16 (T4, V100).

    Raises:
        MeshplanError: a device with neither (names it).
    """
    if all(d.supports("bf16") for d in devices):
        return "bf16"
    for d in devices:
        if not d.supports("fp16"):
            raise MeshplanError(f"device {d.name} supports neither bf16 nor fp16 (supports: "
                                f"{', '.join(sorted(d.peak_flops))}); it cannot run a 16-bit plan")
    return "fp16"


def precision_columns(devices: Sequence[DeviceSpec], workload: str,
                      precisions: Optional[Sequence[str]] = None) -> tuple[str, ...]:
    """Precision columns of a problem: the workload's menu, or the user's list checked strictly.

    The 16-bit reference column is named after :func:`base_dtype`. A precision the user asks for must be
    supported by every device; one that only some devices lack is left out of those devices' columns when it
    comes from the default menu.

    Raises:
        MeshplanError: a requested precision a device lacks (names the device) or an unknown precision.
    """
    if workload not in MENU:
        raise MeshplanError(f"workload '{workload}': expected one of {', '.join(MENU)}")
    base = base_dtype(devices) if workload != "qsync" else "fp32"
    if precisions is None:
        cols = [base] + [p for p in MENU[workload] if p not in ("bf16", "fp16", base)
                         and any(d.supports(p) for d in devices)]
        if workload == "qsync":
            cols = ["fp32"] + [p for p in ("fp16", "int8") if any(d.supports(p) for d in devices)]
        return tuple(cols)
    cols = []
    for p in precisions:
        p = p.lower()
        if p in ("bf16", "fp16") and workload != "qsync":
            p = base
        if p not in MENU[workload] and p != base:
            raise MeshplanError(f"precision '{p}': not available for --workload {workload} "
                                f"(choose from {', '.join(MENU[workload])})")
        for d in devices:
            if not d.supports(p):
                raise MeshplanError(f"precision {p}: device {d.name} does not support it "
                                    f"(supports: {', '.join(sorted(d.peak_flops))})")
        if p not in cols:
            cols.append(p)
    if base not in cols:
        cols.insert(0, base)
    return tuple(cols)


def _matrices(model, i: int) -> list[tuple[str, int, int]]:
    """(type, fan_in, params) of layer i's weight matrices, for the default indicators."""
    h = model.hidden_size
    mlp = model.layer_mlp_params(i)
    ffn = model.moe_ffn_hidden_size if model.is_moe_layer(i) else model.ffn_hidden_size
    gate = 2 if model.gated_mlp else 1
    return [("attention", h, model.layer_attention_params(i)),
            ("mlp", h, mlp * gate // (gate + 1)), ("mlp", max(1, ffn), mlp // (gate + 1))]


def layer_sensitivity(model, precisions: Sequence[str], reference: str, operands: int) -> list[list[float]]:
    """Default indicators ``[layer][precision]`` (see ``planner.solve.sensitivity``)."""
    return [default_layer_indicators(_matrices(model, i), precisions, reference, operands)
            for i in range(model.num_layers)]


_OP_MEMO: dict = {}  # (op, device name, cost-model id) -> seconds
_COLLECT: Optional[list] = None  # while a builder's first pass runs: ops waiting to be priced in one batch


def _op_time(op: OpSpec, device: DeviceSpec) -> float:
    from meshplan.costmodel.api import active_model

    key = (op, device.name, id(active_model()))
    hit = _OP_MEMO.get(key)
    if hit is not None:
        return hit
    if _COLLECT is not None:
        _COLLECT.append((op, device))
        return 0.0
    if len(_OP_MEMO) > 200_000:
        _OP_MEMO.clear()
    _OP_MEMO[key] = t = predict(op, device)
    return t


def _batched_pricing(fn):
    """Run a problem builder twice: the first pass only collects the operators it will price, which are then
    priced with one ``costmodel.api.predict_batch`` call per device (a learned model prices a batch in about
    the time of one op); the second pass builds the problem from the memo."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        global _COLLECT
        if _COLLECT is not None:
            return fn(*args, **kwargs)
        from meshplan.costmodel.api import active_model, predict_batch

        _COLLECT = []
        try:
            fn(*args, **kwargs)
        finally:
            pending, _COLLECT = _COLLECT, None
        by_dev: dict = {}
        for op, dev in pending:
            by_dev.setdefault(dev.name, (dev, {}))[1][op] = None
        mid = id(active_model())
        for dev, ops in by_dev.values():
            ops = list(ops)
            for op, t in zip(ops, predict_batch(ops, dev)):
                _OP_MEMO[(op, dev.name, mid)] = float(t)
        return fn(*args, **kwargs)

    return wrapper


def _price(ops: Sequence[OpSpec], device: DeviceSpec, precision: str, base: str, backward: bool) -> float:
    """Seconds of ``ops`` with GEMMs at ``precision`` (int4 = weight-only W4A16), other ops at ``base``."""
    total = 0.0
    for op in ops:
        op = replace(op, dtype=base) if op.dtype not in ("fp32",) else op
        passes = (op, replace(op, backward=True)) if backward else (op,)
        for o in passes:
            if o.kind != "matmul" or precision == base:
                total += _op_time(o, device)
            elif precision == "int4":  # W4A16: weight bytes at 4 bits, math in 16-bit
                flop_s = o.flops / (device.peak(base) * ROOFLINE_EFFICIENCY["matmul"][0])
                total += max(_op_time(replace(o, dtype="int4"), device), flop_s)
            else:
                total += _op_time(replace(o, dtype=precision), device)
    return total


def _layer_shape(model, i: int) -> LayerShape:
    moe = model.is_moe_layer(i)
    return LayerShape(hidden=model.hidden_size, heads=model.num_heads, q_dim=model.q_dim, kv_dim=model.kv_dim,
                      v_dim=model.num_heads * model.v_head_dim,
                      ffn=model.moe_ffn_hidden_size if moe else model.ffn_hidden_size, gated=model.gated_mlp,
                      dropout=model.model_type == "gpt2", experts_per_token=model.experts_per_token if moe else 0,
                      shared_ffn=model.shared_expert_ffn_hidden_size if moe else 0)


def _edge_params(model) -> tuple[int, int]:
    """(parameters added to the first stage: embedding, to the last: final norm + LM head)."""
    return model.embedding_params, model.final_norm_params + model.lm_head_params


def _link(cluster, g: int, h: int, unit: str):
    """Link a stage boundary between a unit of group g and one of group h crosses."""
    if g != h:
        return cluster.inter_link
    grp = cluster.groups[g]
    if unit == "device":
        return grp.intra_link
    return grp.nic_link or cluster.inter_link


@_batched_pricing
def train_partition_problem(model, cluster, global_batch: int, seq_len: int,
                            precisions: Optional[Sequence[str]] = None, quality_budget: Optional[float] = None,
                            micro_batches: Sequence[int] = (1, 2, 4),
                            sensitivity: Optional[Sequence[Sequence[float]]] = None) -> PartitionProblem:
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
    """
    devices = [g.device for g in cluster.groups]
    cols = precision_columns(devices, "train", precisions)
    base = cols[0]
    L = model.num_layers
    first, last = _edge_params(model)
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
                a = activation_bytes_per_layer(_layer_shape(model, i), seq_len, b, lay)
                tt, ss, aa = [], [], []
                for p in cols:
                    if not grp.device.supports(p):
                        tt.append(None), ss.append(None), aa.append(None)
                        continue
                    tt.append(_price(ops.compute, grp.device, p, base, True) + _price(extra, grp.device, base, base, True)
                              + comm)
                    ss.append(params * (PARAM_BYTES + GRAD_BYTES + OPTIMIZER_BYTES) / t)
                    aa.append(a)
                trow.append(tt), srow.append(ss), arow.append(aa)
            times.append(trow), static.append(srow), act.append(arow)
        G = len(cluster.groups)
        link = [[2 * collective_time_s("sendrecv", 2.0 * b * seq_len * model.hidden_size
                                       / cluster.groups[g].devices_per_node, 2, _link(cluster, g, h, "node"))
                 for h in range(G)] for g in range(G)]
        ph = Phase("step", m, 1, times, link)
        options.append(PipelineOption(f"micro_batch={b} x {m}", (ph,), static, act, inflight_cap=m, micro_batch=b))
    if not options:
        raise MeshplanError(f"global batch {global_batch}: no candidate micro-batch size in {list(micro_batches)} "
                            f"divides it")
    groups = tuple(GroupSlot(g.device.name, g.nodes, usable_bytes(g.device)) for g in cluster.groups)
    sens = _resolve_sensitivity(sensitivity, model, cols, base, operands=2)
    _check_sens(sens, L, cols)
    return PartitionProblem(cols, groups, tuple(options), sens, quality_budget)


@_batched_pricing
def serve_partition_problem(model, cluster, batch: int, prompt_len: int, gen_len: int,
                            precisions: Optional[Sequence[str]] = None, quality_budget: Optional[float] = None,
                            micro_batches: Sequence[int] = (1, 2, 4),
                            sensitivity: Optional[Sequence[Sequence[float]]] = None) -> PartitionProblem:
    """LLM-PQ serving: one stage per device; prefill and decode micro-batch counts per option.

    Each option pairs a prefill micro-batch count with a decode micro-batch count (both dividing ``batch``).
    Memory per layer: weights at the layer's precision + the KV cache of the whole batch at the final length.
    Decode is priced at the mean context ``prompt_len + gen_len / 2``.
    """
    devices = [g.device for g in cluster.groups]
    cols = precision_columns(devices, "serve", precisions)
    base = cols[0]
    L = model.num_layers
    first, last = _edge_params(model)
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
                row.append([_price(ops, grp.device, p, base, False) + _price(extra, grp.device, base, base, False)
                            if grp.device.supports(p) else None for p in cols])
            out.append(row)
        return out

    def links(mb: int, tokens: int):
        return [[collective_time_s("sendrecv", 2.0 * mb * tokens * model.hidden_size, 2, _link(cluster, g, h, "device"))
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
                        edge * 2 + body * (_weight_bytes(p)) + kv[i] for p in cols])
        static.append(row)
    zero = [[[0.0 if x is not None else None for x in r] for r in row] for row in static]
    options = []
    for cp in counts:
        for cd in counts:
            phases = (Phase("prefill", cp, 1, *prefill[cp]), Phase("decode", cd, max(1, gen_len - 1), *decode[cd]))
            options.append(PipelineOption(f"prefill {cp} x {batch // cp}, decode {cd} x {batch // cd}", phases,
                                          static, zero, inflight_cap=1, micro_batch=batch // cd))
    groups = tuple(GroupSlot(g.device.name, g.world_size, usable_bytes(g.device)) for g in cluster.groups)
    sens = _resolve_sensitivity(sensitivity, model, cols, base, operands=1)
    _check_sens(sens, L, cols)
    return PartitionProblem(cols, groups, tuple(options), sens, quality_budget)


def _weight_bytes(p: str) -> float:
    return {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0,
            "int4": 0.5 + INT4_SCALE_BYTES_PER_WEIGHT}[p]


def _resolve_sensitivity(sensitivity, model, cols, base: str, operands: int):
    """Measured indicators: a table ``[layer][precision]``, a file from ``meshplan profile --sensitivity``
    (resampled to the model's depth, columns picked by name), or ``None`` for the documented defaults."""
    if sensitivity is None:
        return layer_sensitivity(model, cols, base, operands=operands)
    if isinstance(sensitivity, (str, os.PathLike)):
        from meshplan.planner.solve.sensitivity import read_sensitivity

        return read_sensitivity(sensitivity, cols, model.num_layers)
    return sensitivity


def _check_sens(sens, L: int, cols) -> None:
    if len(sens) != L or any(len(r) != len(cols) for r in sens):
        raise MeshplanError(f"sensitivity table: expected {L} layers x {len(cols)} precisions ({', '.join(cols)}), "
                            f"got {len(sens)} rows")


# ------------------------------------------------------------------------------------- gradient compression

PCIE_BYTES_PER_S = 25e9  # PCIe 4.0 x16: 31.5 GB/s raw, ~80% reached by pinned cudaMemcpy (NVIDIA bandwidthTest)
CPU_COMPRESS_BYTES_PER_S = 5e9  # assumption: vectorised quantisation over a few host cores (ByteComp §6 notes
# CPU compression is several times slower than GPU); override with ``cpu_bytes_per_s``
GRAD_ELEMENT_BYTES = 4  # DDP all-reduces fp32 gradients under AMP (fp32 master params)


def gaussian_compression_error(method: str, param: float) -> float:
    """Relative squared error ``||C(g) - g||^2 / ||g||^2`` for i.i.d. Gaussian gradients (a conservative default).

    top-k keeps the ``r`` largest magnitudes: kept energy ``2 (t phi(t) + Q(t))`` with ``t = Q^-1(r/2)``.
    PowerSGD rank ``R`` of an ``m x m`` Gaussian matrix keeps about ``4R/m`` of the energy (Marchenko-Pastur edge,
    largest singular value ``2 sqrt(m)``); real gradients are far more low-rank — pass measured errors
    (``planner.solve.sensitivity.measure_compression_error``).
    """
    from statistics import NormalDist

    from meshplan.planner.solve.sensitivity import relative_mse

    if method == "none":
        return 0.0
    if method in ("fp16", "bf16"):
        return relative_mse(method)
    if method == "int8":
        return 2 * relative_mse("int8", fan_in=4096)  # quantised twice: before all-to-all and before all-gather
    if method == "topk":
        nd = NormalDist()
        t = nd.inv_cdf(1 - param / 2)
        kept = 2 * (t * nd.pdf(t) + (1 - nd.cdf(t)))
        return max(0.0, 1.0 - kept)
    if method == "powersgd":
        return None  # depends on the bucket's matrix size; see compression_choices
    raise MeshplanError(f"compression method '{method}': unknown")


def compression_choices(nbytes: float, share: float, world: int, nodes: int, dpn: int, intra, inter, device,
                        errors: Optional[dict] = None, cpu_bytes_per_s: float = CPU_COMPRESS_BYTES_PER_S,
                        topk_ratio: float = 0.01, powersgd_rank: int = 4, flat_link=None):
    """Candidate :class:`CompressionChoice` values for one gradient bucket of ``nbytes`` (fp32 gradients).

    Collectives (alpha-beta, ``costmodel.collectives``): none/fp16/bf16 all-reduce (fp16 halves the bytes);
    int8 all-to-all + all-gather of 1-byte elements (reduce-scatter by exchange, then gather, ByteComp's
    two-shot scheme); top-k all-gathers ``r N`` (value fp32, index int32) from every rank; PowerSGD all-reduces
    P and Q (``m x R`` each, ``m = sqrt(N)``). Two-level: reduce-scatter and all-gather uncompressed over the
    node's link, the compressed step across nodes on ``1/dpn`` of the bucket. GPU compression costs memory
    passes priced by the cost model on the compute stream; CPU compression adds PCIe copies both ways and
    host work at ``cpu_bytes_per_s`` on the communication stream.
    """
    from math import sqrt

    from meshplan.planner.solve.compression import CompressionChoice

    N = nbytes / GRAD_ELEMENT_BYTES
    errs = errors or {}

    def err(method, param):
        if (method, param) in errs:
            return errs[(method, param)] * share
        if method == "powersgd":
            m = max(1.0, sqrt(N))
            return share * max(0.0, 1.0 - 4.0 * param / m)
        return share * gaussian_compression_error(method, param)

    def coll(kind, size, p, link):
        return collective_time_s(kind, size, p, link) if p > 1 else 0.0

    def wire(method, size, p, link):
        if method == "none":
            return coll("allreduce", size, p, link)
        if method in ("fp16", "bf16"):
            return coll("allreduce", size / 2, p, link)
        if method == "int8":
            return coll("alltoall", size / 4, p, link) + coll("allgather", size / 4, p, link)
        if method == "topk":
            return coll("allgather", p * topk_ratio * (size / GRAD_ELEMENT_BYTES) * 8, p, link)
        m = sqrt(size / GRAD_ELEMENT_BYTES)
        return 2 * coll("allreduce", GRAD_ELEMENT_BYTES * powersgd_rank * m, p, link)

    def passes(k):  # k memory passes over the bucket on the GPU
        return k * _op_time(OpSpec("cast", (int(N),), "fp32"), device) if k else 0.0

    gpu_cost = {"none": (0, 0), "fp16": (1, 1), "bf16": (1, 1), "int8": (2, 2), "topk": (3, 1)}
    out = []
    flat_link = flat_link or (inter if nodes > 1 else intra)
    for method, param in (("none", 0.0), ("fp16", 0.0), ("int8", 0.0), ("topk", topk_ratio),
                          ("powersgd", float(powersgd_rank))):
        e = err(method, param)
        levels = (False, True) if nodes > 1 and dpn > 1 else (False,)
        for two in levels:
            if two:
                shard = nbytes / dpn
                net = (coll("reducescatter", nbytes, dpn, intra) + wire(method, shard, nodes, inter)
                       + coll("allgather", nbytes, dpn, intra))
                work = shard
            else:
                net = wire(method, nbytes, world, flat_link)
                work = nbytes
            if method == "powersgd":
                m = sqrt(work / GRAD_ELEMENT_BYTES)
                gemm = 2 * _op_time(OpSpec("matmul", (int(m), powersgd_rank, int(m)), "fp32"), device)
                out.append(CompressionChoice(method, param, two, "gpu", gemm, net + gemm / 2, e))
                continue
            c, d = gpu_cost[method]
            frac = work / nbytes
            out.append(CompressionChoice(method, param, two, "gpu", passes(c) * frac, net + passes(d) * frac, e))
            if method in ("fp16", "int8"):  # CPU variant: copy out, compress on the host, copy back
                host = 2 * work / PCIE_BYTES_PER_S + 2 * work / cpu_bytes_per_s
                out.append(CompressionChoice(method, param, two, "cpu", 0.0, net + host, e))
    return out


@_batched_pricing
def compression_problem(model, cluster, global_batch: int, seq_len: int, error_budget: Optional[float] = None,
                        bucket_bytes: int = 25 * 2**20, errors: Optional[dict] = None,
                        net_bytes_per_s: Optional[float] = None):
    """Data-parallel training over the whole cluster: DDP buckets in backward order with their costs.

    Buckets are filled in the order gradients become ready (LM head, last layer, ..., first layer, embedding),
    ``bucket_bytes`` each (DDP's ``bucket_cap_mb=25``); each bucket's backward compute is its share of the
    layers it spans, priced by the cost model on the slowest group's device. ``net_bytes_per_s`` overrides the
    per-GPU network bandwidth (``--net``).
    """
    from meshplan.planner.solve.compression import CompressionProblem

    if net_bytes_per_s is not None:
        cluster = cluster.with_inter_bandwidth(net_bytes_per_s)
    world = cluster.world_size
    if global_batch % world:
        raise MeshplanError(f"global batch {global_batch}: not divisible by the {world} devices of {cluster.spec}")
    b = global_batch // world
    grp = max(cluster.groups, key=lambda g: 1.0 / g.device.peak(base_dtype([g.device])))
    dev = grp.device
    base = base_dtype([g.device for g in cluster.groups])
    lay = Layout(micro_batch=b)
    first, last = _edge_params(model)
    segs = []  # (params, backward seconds) in backward order
    head = head_ops(model, lay, seq_len, dtype=base)
    segs.append((last, _price(head, dev, base, base, True) - _price(head, dev, base, base, False)))
    cache = {}
    forward_s = _price(head, dev, base, base, False)
    for i in reversed(range(model.num_layers)):
        key = (model.layer_params(i), model.is_moe_layer(i))
        if key not in cache:
            ops = layer_ops(model, i, lay, seq_len, dtype=base).compute
            fwd = _price(ops, dev, base, base, False)
            cache[key] = (_price(ops, dev, base, base, True) - fwd, fwd)
        segs.append((model.layer_params(i), cache[key][0]))
        forward_s += cache[key][1]
    segs.append((first, 0.0))
    total_bytes = sum(p for p, _ in segs) * GRAD_ELEMENT_BYTES
    sizes, bwd = [], []
    fill = fill_t = 0.0
    for params, t in segs:
        left, rate = params * GRAD_ELEMENT_BYTES, (t / (params * GRAD_ELEMENT_BYTES) if params else 0.0)
        while left > 0:
            take = min(left, bucket_bytes - fill)
            fill, fill_t, left = fill + take, fill_t + take * rate, left - take
            if fill >= bucket_bytes:
                sizes.append(fill), bwd.append(fill_t)
                fill = fill_t = 0.0
    if fill > 0:
        sizes.append(fill), bwd.append(fill_t)
    nodes = cluster.num_nodes
    dpn = max(g.devices_per_node for g in cluster.groups)
    intra = min((g.intra_link for g in cluster.groups), key=lambda lk: lk.bandwidth_bytes_per_s)
    # flat ring over every rank: NCCL runs one ring channel per NIC, so the node boundary carries per-node
    # aggregated bandwidth (ClusterSpec.collective_link); the two-level inter-node step has one rank per node
    flat = min((cluster.collective_link(world, 1, gi) for gi in range(len(cluster.groups))),
               key=lambda lk: lk.bandwidth_bytes_per_s) if nodes > 1 else intra
    inter = min((cluster.collective_link(nodes, dpn, gi) for gi in range(len(cluster.groups))),
                key=lambda lk: lk.bandwidth_bytes_per_s) if nodes > 1 else intra
    cache_c = {}
    choices = []
    for n in sizes:
        k = round(n)
        if k not in cache_c:
            cache_c[k] = compression_choices(n, n / total_bytes, world, nodes, dpn, intra, inter, dev, errors,
                                             flat_link=flat)
        choices.append(cache_c[k])
    return CompressionProblem(bwd, [int(s) for s in sizes], choices, tail_s=0.0, error_budget=error_budget,
                              forward_s=forward_s)
