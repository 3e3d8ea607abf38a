"""Build the gradient-compression solver's problem (``planner.search.solve.compression``) from a model and a cluster.

Data-parallel training over the whole cluster: DDP buckets in backward order, each with its backward compute and
the candidate compressions of its all-reduce (ByteComp, Wang et al. 2023): method, one or two levels, on the GPU
or the CPU, with their time and their gradient error.
"""
from __future__ import annotations

from typing import Optional

from meshplan.core.errors import MeshplanError
from meshplan.costmodel.collectives import collective_time_s
from meshplan.costmodel.ops import OpSpec
from meshplan.planner.estimate.ops_graph import head_ops, layer_ops
from meshplan.planner.layout.layout import Layout
from meshplan.planner.search.solve.columns import base_dtype, edge_params
from meshplan.planner.search.solve.compression_types import CompressionChoice, CompressionProblem
from meshplan.planner.search.solve.pricing import OpPrices, default_estimator

PCIE_BYTES_PER_S = 25e9  # PCIe 4.0 x16: 31.5 GB/s raw, ~80% reached by pinned cudaMemcpy (NVIDIA bandwidthTest)
CPU_COMPRESS_BYTES_PER_S = 5e9  # assumption: vectorised quantisation over a few host cores (ByteComp §6 notes
# CPU compression is several times slower than GPU); override with ``cpu_bytes_per_s``
GRAD_ELEMENT_BYTES = 4  # DDP all-reduces fp32 gradients under AMP (fp32 master params)


def gaussian_compression_error(method: str, param: float) -> float:
    """Relative squared error ``||C(g) - g||^2 / ||g||^2`` for i.i.d. Gaussian gradients (a conservative default).

    top-k keeps the ``r`` largest magnitudes: kept energy ``2 (t phi(t) + Q(t))`` with ``t = Q^-1(r/2)``.
    PowerSGD rank ``R`` of an ``m x m`` Gaussian matrix keeps about ``4R/m`` of the energy (Marchenko-Pastur edge,
    largest singular value ``2 sqrt(m)``); real gradients are far more low-rank — pass measured errors
    (``planner.search.solve.sensitivity.measure_compression_error``).
    """
    from statistics import NormalDist

    from meshplan.planner.search.solve.sensitivity import relative_mse

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


def compression_choices(prices: OpPrices, nbytes: float, share: float, world: int, nodes: int, dpn: int, intra,
                        inter, device, errors: Optional[dict] = None, cpu_bytes_per_s: float = CPU_COMPRESS_BYTES_PER_S,
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
        return k * prices.time_s(OpSpec("cast", (int(N),), "fp32"), device) if k else 0.0

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
                gemm = 2 * prices.time_s(OpSpec("matmul", (int(m), powersgd_rank, int(m)), "fp32"), device)
                out.append(CompressionChoice(method, param, two, "gpu", gemm, net + gemm / 2, e))
                continue
            c, d = gpu_cost[method]
            frac = work / nbytes
            out.append(CompressionChoice(method, param, two, "gpu", passes(c) * frac, net + passes(d) * frac, e))
            if method in ("fp16", "int8"):  # CPU variant: copy out, compress on the host, copy back
                host = 2 * work / PCIE_BYTES_PER_S + 2 * work / cpu_bytes_per_s
                out.append(CompressionChoice(method, param, two, "cpu", 0.0, net + host, e))
    return out


def compression_problem(model, cluster, global_batch: int, seq_len: int, error_budget: Optional[float] = None,
                        bucket_bytes: int = 25 * 2**20, errors: Optional[dict] = None,
                        net_bytes_per_s: Optional[float] = None, estimator=None) -> CompressionProblem:
    """Data-parallel training over the whole cluster: DDP buckets in backward order with their costs.

    Buckets are filled in the order gradients become ready (LM head, last layer, ..., first layer, embedding),
    ``bucket_bytes`` each (DDP's ``bucket_cap_mb=25``); each bucket's backward compute is its share of the
    layers it spans, priced by ``estimator`` (default: the shipped cost model) on the slowest group's device.
    ``net_bytes_per_s`` overrides the per-GPU network bandwidth (``--net``).
    """
    prices = OpPrices(default_estimator(estimator))
    return prices.build(lambda: _compression_problem(prices, model, cluster, global_batch, seq_len, error_budget,
                                                     bucket_bytes, errors, net_bytes_per_s))


def _compression_problem(prices: OpPrices, model, cluster, global_batch, seq_len, error_budget, bucket_bytes,
                         errors, net_bytes_per_s) -> CompressionProblem:
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
    first, last = edge_params(model)
    segs = []  # (params, backward seconds) in backward order
    head = head_ops(model, lay, seq_len, dtype=base)
    segs.append((last, prices.ops_s(head, dev, base, base, True) - prices.ops_s(head, dev, base, base, False)))
    cache = {}
    forward_s = prices.ops_s(head, dev, base, base, False)
    for i in reversed(range(model.num_layers)):
        key = (model.layer_params(i), model.layer_kind(i))
        if key not in cache:
            ops = layer_ops(model, i, lay, seq_len, dtype=base).compute
            fwd = prices.ops_s(ops, dev, base, base, False)
            cache[key] = (prices.ops_s(ops, dev, base, base, True) - fwd, fwd)
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
            cache_c[k] = compression_choices(prices, n, n / total_bytes, world, nodes, dpn, intra, inter, dev, errors,
                                             flat_link=flat)
        choices.append(cache_c[k])
    return CompressionProblem(bwd, [int(s) for s in sizes], choices, tail_s=0.0, error_budget=error_budget,
                              forward_s=forward_s)
