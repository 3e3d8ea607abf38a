"""GPU estimator: step time of one homogeneous ``Layout`` (Megatron-style 1F1B / interleaved pipeline).

Per micro-batch and pipeline stage: forward and backward compute priced op by op with the ``Pricer`` it is given
(the learned model, or the roofline with per-op-class efficiency), plus the TP / EP collectives that sit on the
critical path and the CP KV exchange not hidden behind attention. Then:

    pipeline = m * t_max + bubble(schedule)                  (planner.layout.schedules: 1F1B (p-1) t_avg, interleaved
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

import math
import operator
from collections import Counter
from collections.abc import Mapping
from dataclasses import fields, replace
from types import MappingProxyType
from typing import NamedTuple, Optional

import numpy as np

from meshplan.core.errors import MeshplanError
from meshplan.costmodel import blackwell_grouped, cudnn_dglu, norms
from meshplan.costmodel.api import Pricer
from meshplan.costmodel.collectives import collective_time_s
from meshplan.costmodel.deepep import deepep_nvlink_share
from meshplan.costmodel.devices import DeviceSpec
from meshplan.costmodel.fp8_recipes import recipe_time_multiple
from meshplan.costmodel.hybridep import hybridep_nvlink_share
from meshplan.costmodel.ops import OpSpec
from meshplan.planner.estimate.base import (
    Estimate,
    TablesCache,
    Workload,
    bf16_layer_params,
    bf16_time_key,
    block_scaled,
    decoder_params,
    finish_estimate,
    keeps_bf16_layers,
    memory_floor_bytes,
    offloaded_layers,
    peak_memory,
    precision_parts,
    recast_expert_params,
    stage_params,
    time_key,
    time_signature,
    trainable_params,
)
from meshplan.planner.estimate.host_wait import (
    HOST_SPEED,
    count_exchange_s,
    fc2_onward,
    moe_sync_wait_s,
    waits_for_host,
)
from meshplan.planner.estimate.memory import USABLE_FRACTION, param_bytes, reduce_bytes_per_param, saved_input_bytes
from meshplan.planner.estimate.offload import offload_exposed_s
from meshplan.planner.estimate.ops_graph import embedding_ops, head_ops, layer_ops, mtp_ops
from meshplan.planner.estimate.sync import ShardTable, SyncTerms, step_of
from meshplan.planner.layout.decisions import FP8_ATTENTION_RECIPES, lowp_recipe
from meshplan.planner.layout.layout import Layout, check_bf16_layers
from meshplan.planner.layout.schedules import bubble_s
from meshplan.planner.layout.splits import weighted_split

# kinds whose backward is priced as its own op (its FLOPs and bytes); any other kind's backward is a memory-bound
# pass over twice the forward's bytes (read the gradient and the saved input, write the gradient). The SSD's
# backward is mamba_ssm's own kernel list (costmodel.ops.ssd_flops / ssd_bytes), not a multiple of its forward; the
# router top-k's a scatter and the score function's backward (costmodel.router_topk), Gated DeltaNet's FLA's own
# backward kernels as timed (costmodel.gdn). A norm priced from its measurement (costmodel.norms: cuDNN's fused norm,
# eager code's RMSNorm formula) takes its measured backward too.
BWD_PRICED_KINDS = ("matmul", "bmm", "attention", "ssd", "topk", "auxloss", "gdn")
# A GEMM's backward is its input gradient and its weight gradient, the same FLOPs each: the input gradient's share
DGRAD_SHARE = 0.5
DDP_BUCKET_BYTES = 25 * 1024**2  # PyTorch DDP default bucket_cap_mb=25
# SMs a communication kernel occupies while it overlaps compute: DeepSeek-V3 technical report §3.2.2, "only 20 SMs
# are sufficient to fully utilize the bandwidths of IB and NVLink" (of the H800's 132) for its all-to-all kernels.
COMM_SMS = 20
# Transformer Engine's userbuffers, as their default overlap methods run them (``transformer_engine/pytorch/module/
# base.py`` ``initialize_ub`` @ fecb10bdf: ``methods``, ``get_default_config``): "ring_exchange" splits the GEMM in tp
# chunks and moves them on the copy engines (1 SM, no SM margin) for the column-parallel forward (qkv_fprop,
# fc1_fprop) and the row-parallel input gradient (proj_dgrad, fc2_dgrad); "pipeline" splits the row-parallel forward
# (proj_fprop, fc2_fprop) in ``num_splits`` = 4 chunks, and "bulk" runs the column-parallel backward (qkv / fc1 dgrad
# and wgrad) whole, both with 16 communication SMs that the GEMMs beside them leave (``set_sm_margin``); the
# row-parallel weight gradient runs whole ("external", beside its dgrad's ring exchange)
UB_PIPELINE_SPLITS = 4
UB_COMM_SMS = 16


def userbuffers_gemm_s(column: bool, bwd_s: float, ring_fwd_s: float, ring_bwd_s: float,
                       pipe_fwd_s: float) -> tuple[float, float]:
    """(seconds one GEMM next to a TP collective takes forward and backward under userbuffers, the seconds of it that
    run beside a collective holding ``UB_COMM_SMS``): ``bwd_s`` its backward whole; ``ring_*``: its tp chunks' sums;
    ``pipe_fwd_s``: its 4 pipeline chunks' sum. A column-parallel GEMM (QKV, FC1, Mamba's in_proj) runs its forward
    in ring-exchange chunks and its backward whole, in bulk; a row-parallel one (the attention projection, FC2,
    out_proj) its forward in pipeline chunks and its input gradient, half its backward's FLOPs, in ring-exchange
    chunks."""
    if column:
        return ring_fwd_s + bwd_s, bwd_s
    return pipe_fwd_s + ring_bwd_s / 2 + bwd_s / 2, pipe_fwd_s


# GPU-to-GPU speed variation of one SKU: Sinha et al., "Not All GPUs Are Created Equal" (SC'22, arXiv:2208.11035),
# measured over >90% of the GPUs of five clusters (thousands each), "8% (max 22%) average performance variation"
# between GPUs of the same SKU. Read as the range of a normal spread over ~4,000 GPUs (expected range
# 2 sigma sqrt(2 ln 4000) = 8.1 sigma), sigma = 1%. A synchronous step runs at its slowest rank: for N ranks the
# expected maximum of N draws is sigma sqrt(2 ln N) above the mean (+2.0% at 8 GPUs, +3.7% at 1,024, +4.4% at
# 16,384): an effect that grows with scale.
GPU_SPEED_SIGMA = 0.01
# The fp8 recipes ``recipe_twin_bounds_s`` bounds by their delayed-scaling twin: Transformer Engine's other
# recipes a search tries, each running delayed scaling's casts and GEMMs (tensor-wise adds an amax pass, block-wise
# and MXFP8 scale inside the cast; ``ops_graph._precisions``), at GEMM multiples the bound checks per device
TWINNED_RECIPES = ("tensorwise", "blockwise", "mxfp8")


def check_fused_moe_mlp(model, device) -> None:
    """Raise ``MeshplanError`` where the fused grouped MLP's kernels do not run for ``model`` on ``device``: cuDNN
    frontend's sm100 block-scaled kernels (compute capability 10: ``costmodel.blackwell_grouped.PARTS``, the
    data-centre Blackwell parts), for gated experts (SwiGLU, GPT-OSS's clamped GeGLU: ``ForwardGroupedMLP_CuTeGEMM
    SwiGLU_MXFP8``; meshplan's models carry no other gated activation) whose GEMM widths are multiples of 64
    (``validate_grouped_mlp_dims``, Transformer Engine 4220403): the experts' input width (a LatentMoE's latent) and
    their FFN width."""
    widths = (model.moe_latent_size or model.hidden_size, model.moe_ffn_hidden_size)
    why = ("" if device.name in blackwell_grouped.PARTS else
           f"a compute-capability-10 Blackwell part ({', '.join(blackwell_grouped.PARTS)}); got {device.name}") or \
          ("" if model.gated_mlp else f"gated experts (SwiGLU or clamped GeGLU); {model.name}'s are not gated") or \
          ("" if all(w % 64 == 0 for w in widths) else
           f"expert GEMM widths that are multiples of 64; {model.name} has {widths[0]} and {widths[1]}")
    if why:
        raise MeshplanError(f"moe_fused_mlp (Transformer Engine's fused grouped MLP) needs {why}")


def straggler_slowdown(world_size: int) -> float:
    """Expected extra time of the slowest of ``world_size`` ranks, as a fraction of the mean rank's."""
    return GPU_SPEED_SIGMA * math.sqrt(2 * math.log(world_size)) if world_size > 1 else 0.0


def group_links(cluster, model, layout: Layout) -> tuple:
    """(tp, ep, cp) links of ``layout`` on ``cluster``: rings for TP and ring/all-gather CP, the spanned all-to-all
    for EP (one copy per destination node under DeepEP and Hybrid-EP, spread as ``moe_router`` routes) and Ulysses CP
    (``ClusterSpec.alltoall_link``).
    Hybrid-EP's NVLink share is its published kernel bandwidth at the EP size and the layout's ``hybridep_sms``
    (``costmodel.hybridep``), DeepEP's on Blackwell its API's published bandwidth at the EP size
    (``costmodel.deepep``)."""
    dedup = layout.moe_dispatcher in ("deepep", "hybridep")
    return (cluster.collective_link(*layout.tp_group),
            cluster.alltoall_link(*layout.ep_group, dedup_topk=model.experts_per_token if dedup else 0,
                                  nvlink_share=_ep_nvlink_share(cluster, layout),
                                  dispatcher=layout.moe_dispatcher if dedup else "",
                                  routing_groups=(model.routing_groups, model.routing_groups_per_token),
                                  contiguous_experts=model.num_experts if layout.moe_router == "contiguous" else 0,
                                  experts=model.num_experts),
            (cluster.alltoall_link if layout.cp_kind == "a2a" else cluster.collective_link)(*layout.cp_group))


def _ep_nvlink_share(cluster, layout: Layout) -> float:
    """The share of NVLink the layout's dispatcher reaches by its published measurements (0: NCCL's efficiency)."""
    if layout.moe_dispatcher == "hybridep":
        return hybridep_nvlink_share(layout.ep, layout.hybridep_sms)
    if layout.moe_dispatcher == "deepep":
        return deepep_nvlink_share(layout.ep, cluster.groups[0].device.name)
    return 0.0


def ub_margin(device) -> float:
    """What a GEMM beside a userbuffers collective holding ``UB_COMM_SMS`` pays over its own time: it runs on the
    SMs left (0 on devices without SMs)."""
    sms = device.sm_count
    return UB_COMM_SMS / (sms - UB_COMM_SMS) if sms and sms > UB_COMM_SMS else 0.0


def comm_sm_share(device, sms: int = COMM_SMS) -> float:
    """Share of the device's SMs that overlapped communication on ``sms`` of them takes from compute (0 on devices
    without SMs)."""
    return min(1.0, sms / device.sm_count) if device.sm_count else 0.0


def ep_sm_share(device, layout: Layout) -> float:
    """``comm_sm_share`` of the expert all-to-all: Hybrid-EP on the layout's ``hybridep_sms``, another dispatcher on
    ``COMM_SMS``."""
    return comm_sm_share(device, layout.hybridep_sms if layout.moe_dispatcher == "hybridep" else COMM_SMS)


def te_sp_backward_tp_s(tp_comm, grad_gathers, tp: int, link, column_bwd_s: float, device) -> float:
    """Exposed seconds of one layer's backward TP collectives under sequence parallelism, as Transformer Engine runs
    them without userbuffers (TE v1.8 ``module/layernorm_linear.py`` and ``module/linear.py`` backward, the version
    NeMo 24.07 ships): a column-parallel layer (QKV, FC1) re-gathers its saved input shard asynchronously, "Overlap
    input AG with dgrad", and reduce-scatters its dgrad asynchronously, "Overlap dgrad-RS/AR with wgrad"; a
    row-parallel layer (attention out, FC2) gathers its grad output synchronously before its GEMMs
    (``grad_gathers``: their bytes, ``ops_graph._tp_grad_gathers``). So those gathers stay exposed, while the
    reduce-scatters and the re-gathers (the forward gathers' bytes) hide behind the column-parallel GEMMs' backward,
    on the SMs the communication kernels leave (``comm_sm_share``).
    """
    regathers = sum(collective_time_s(k, b, tp, link) for k, b in tp_comm if k == "allgather")
    scatters = sum(collective_time_s(k, b, tp, link) for k, b in tp_comm if k == "reducescatter")
    gathers = sum(collective_time_s("allgather", b, tp, link) for b in grad_gathers)
    hidden = scatters + regathers
    return gathers + max(0.0, hidden - column_bwd_s) + min(hidden, column_bwd_s) * comm_sm_share(device)


def ring_cp_exposed_s(kv_s: float, attn_fwd_s: float, attn_bwd_s: float, device) -> tuple[float, float]:
    """Exposed seconds (forward, backward) of one layer's ring context-parallel exchange whose forward KV blocks
    take ``kv_s`` on the link. Each step's transfer runs under the previous block's attention (Transformer
    Engine ``AttnFuncWithCPAndKVP2P``, Megatron-Core's ``cp_comm_type=p2p``); the backward passes the KV blocks
    around the ring again and the dKV blocks with them (twice the bytes) under the backward attention. What the
    attention cannot cover stays exposed, and the part it covers runs on the SMs the send/recv kernels leave
    (``comm_sm_share``, as for every hidden collective)."""
    share = comm_sm_share(device)
    fwd = max(0.0, kv_s - attn_fwd_s) + min(kv_s, attn_fwd_s) * share
    bwd = max(0.0, 2 * kv_s - attn_bwd_s) + min(2 * kv_s, attn_bwd_s) * share
    return fwd, bwd


def offload_s(work, layout: Layout, tb, times: dict, stage: int, bf16_times: Optional[dict] = None) -> float:
    """Seconds per micro-batch stage ``stage`` waits for its activation offload copies (``estimate.offload``):
    each layer's saved tensors, as the memory model counts them, over the device's host link; a layer kept in bf16
    (``bf16_times``: ``GpuEstimator._bf16_times``) copies its bf16 bytes under its bf16 compute."""
    dev = work.cluster.device
    if not dev.host_bw_bytes_per_s:
        raise MeshplanError(f"offload_layers={layout.offload_layers}: the host link of {dev.name} is not in the "
                            "device catalogue (host_bw_bytes_per_s), so its copies cannot be priced")
    chunks, _, _ = tb.stage_counts(layout, stage)
    layers = [i for r in chunks for i in r]
    kept = {i for r in layout.bf16_ranges(work.model.num_layers) for i in r} if bf16_times is not None else set()
    s, b = work.seq_len // layout.cp, layout.micro_batch
    lin = saved_input_bytes(lowp_recipe(layout.fp8, work.dtype), block_scaled(work))
    scale = 2.0 if work.dtype == "fp32" else 1.0  # as ``base.stage_memory``: 16-bit accounting, fp32 keeps 4 B
    host_bw = dev.host_bw_bytes_per_s
    fwd_s, bwd_s, copy_s = [], [], []
    for i in layers:
        k, bf16 = work.model.layer_kind(i), i in kept
        t = bf16_times[k] if bf16 else times[k]
        fwd_s.append(t[0])
        bwd_s.append(t[1])
        saved = tb.activation_bytes(k, s, b, layout, saved_input_bytes("none") if bf16 else lin, "none", work.lora)
        copy_s.append(scale * saved / host_bw)
    fwd, bwd = offload_exposed_s(fwd_s, bwd_s, copy_s, offloaded_layers(layout, len(layers)))
    return fwd + bwd


def pp_p2p_s(layout: Layout, hidden_size: int, seq_len: int, pp_link, stage_compute_s: float, device) -> float:
    """Exposed seconds of one micro-batch's pipeline sends and receives on a stage whose compute for that
    micro-batch is ``stage_compute_s``: an activation forward and a gradient backward at each of the vpp chunk
    boundaries (Megatron scatter/gather: 1/tp of the tensor crosses nodes). In line, all of it; overlapped
    (``Layout.p2p_overlapped``, Megatron-Core ``overlap_p2p_comm``: posted before a chunk's compute, waited for
    after it), only what the compute cannot cover, plus the SMs the transfer kernels hold while it runs
    (``comm_sm_share``, as for every hidden collective)."""
    if layout.pp == 1:
        return 0.0
    act_bytes = 2.0 * layout.micro_batch * seq_len / layout.cp * hidden_size / layout.tp
    raw = collective_time_s("sendrecv", act_bytes, 2, pp_link) * layout.vpp * 2
    if not layout.p2p_overlapped:
        return raw
    return max(0.0, raw - stage_compute_s) + min(raw, stage_compute_s) * comm_sm_share(device)


class GpuEstimator:
    """Analytic step-time estimate on accelerators, every op priced by ``pricer`` (memoised per instance)."""

    def __init__(self, pricer: Pricer, host_speed: Mapping[str, float] = HOST_SPEED):
        # a training step holds the GPU at its power limit: compute at the sustained share of one-shot kernel rates
        self.pricer = pricer.under_load()
        # each host's time over Grace's for the MoE layer's wait (``host_wait.HOST_SPEED``; ``explain`` prices the
        # published alternative, ``HOST_SPEED_LINEAR``, with a second estimator)
        self.host_speed = MappingProxyType(dict(host_speed))
        self.name = pricer.name
        self.tables = TablesCache()
        self._layer: dict[tuple, tuple[float, ...]] = {}
        self._base: dict[tuple, tuple] = {}  # ``_layer_base``
        self._comm: dict[tuple, tuple] = {}  # ``_layer_comm``
        self._block_memo: dict = {}  # {model tables: ``ops_graph.kind_ops``' block memo}
        self._blocks: dict[tuple, tuple] = {}  # ``_block_ops``
        self._block_price: dict[tuple, tuple] = {}  # ``_block_prices``
        self._ops: dict[tuple, tuple] = {}
        self._lists: dict[tuple, tuple] = {}  # op lists built to be primed in a batch, not yet priced
        self._primed: dict = {}  # {device: ops whose prices (and backward's) the pricer holds}
        self._edge_primed: set = set()  # the embedding and head op keys ``prime_layouts`` has priced
        self._primed_blocks: set = set()  # (block id, tp chunks, device) whose ops are priced or queued to be
        self._bwd: dict[tuple, float] = {}
        self._link_cluster, self._link_memo = None, {}
        self._edge: dict[tuple, tuple[float, float]] = {}
        # (cluster, tables, seq, dtype, lora, its _Scope)
        self._scope: tuple = (None, None, None, None, "", None)
        self._scopes: dict[tuple, _Scope] = {}
        self._mtp_models: dict[tuple, tuple] = {}

    # ---- operators
    def op_time_s(self, op: OpSpec, device: DeviceSpec) -> float:
        return self.pricer.predict(op, device)

    def op_times_s(self, ops: list[OpSpec], device: DeviceSpec) -> list[float]:
        return [float(t) for t in self.pricer.predict_batch(ops, device)]

    def _bwd_s(self, op: OpSpec, device) -> float:
        if op.kind in BWD_PRICED_KINDS or op.kind in norms.NORM_KINDS:
            hit = self._bwd.get((op, device))
            if hit is None:  # a norm priced from its measurement (costmodel.norms) takes its measured backward
                own = op.kind in BWD_PRICED_KINDS or norms.measured_backward(op, device)
                hit = self._bwd[(op, device)] = (self.pricer.predict(replace(op, backward=True), device) if own
                                                 else 2.0 * self.pricer.predict(op, device))
            return hit
        if op.kind in ("cast", "copy") and len(op.shape) == 2:  # a quantize whose backward quantizes another
            # tensor: an fp8 GEMM's output gradient, fp8 attention's dO (``ops_graph._precisions``, ``_qkv_cast``)
            return self.pricer.predict(replace(op, shape=op.shape[1:]), device)
        return 2.0 * self.pricer.predict(op, device)  # memory-bound ops: read grad + saved input, write grad

    # ---- one micro-batch
    def layer_times(self, tb, device, key: Layout, moe: bool, seq_len: int, dtype: str,
                    tp_link, ep_link, cp_link, frozen: bool = False) -> tuple[float, ...]:
        """One layer for one micro-batch, seconds: (fwd compute, bwd compute, recompute when this layer is
        recomputed, exposed comm fwd+bwd, exposed comm a full recompute adds, the exposed comm fwd+bwd of the
        tp, ep and cp groups, and the forward's wait at an MoE layer's token-count sync: the counts' exchange and
        the host after it (``host_wait``), which four add up to the fourth; last, what of the recompute is the
        dispatch and combine of a recomputed MoE block (``recompute_modules`` with ``moe``)). ``frozen``: the
        weights take no gradient (LoRA's base, ``Workload.lora``), so each weight GEMM's backward is its input
        gradient alone."""
        k = (tb, device, time_signature(key), moe, seq_len, dtype, tp_link, ep_link, cp_link, frozen)
        hit = self._layer.get(k)
        if hit is not None:
            return hit
        lo, p, fwd, bwd, comm, tp, cp, ep, ep_re, groups, host = self._layer_base(
            tb, device, key, moe, seq_len, dtype, tp_link, ep_link, cp_link, frozen)
        re = fwd if key.recompute_kind == "full" else 0.0
        if key.recompute_kind == "op":  # priced when an op-level layout first asks (a search bounds without it)
            if "op" not in p:
                p["op"] = sum(n * self.pricer.predict(op, device) for op, n in Counter(lo.op_recompute).items())
            re = p["op"]
        if key.recompute_kind == "selective":  # the modules Megatron-Core re-runs (``Layout.recomputed_modules``)
            modules = p.get("modules")
            if modules is None:  # priced when a selective layout first asks (a search bounds without them)
                predict = self.pricer.predict
                modules = p["modules"] = {m: sum(predict(op, device) for op in ops) for m, ops in lo.modules}
            re = sum(t for m, t in modules.items() if m in key.recomputed_modules)
        comm_re = tp + cp + ep_re + host  # the forward's collectives and host wait again in a full recompute
        ep_again = 0.0
        if "moe" in key.recomputed_modules:  # a recomputed MoE layer syncs, dispatches and combines again
            ep_again = ep_re if ep else 0.0
            re += ep_again + host
        out = self._layer[k] = (fwd, bwd, re, comm) + (comm_re,) + groups + (host, ep_again)
        return out

    def _layer_base(self, tb, device, key: Layout, moe: str, seq_len: int, dtype: str, tp_link, ep_link, cp_link,
                    frozen: bool) -> tuple:
        """What of ``layer_times`` does not depend on recomputation, cached without it (a search prices each
        layout's recompute variants): (layer ops, their prices, fwd, bwd, exposed comm fwd+bwd, the forward's tp
        and cp comm, its ep comm, what a recomputed forward's ep exposes, (tp, ep, cp exposed fwd+bwd))."""
        op_key = self._op_key(tb, device, key, moe, seq_len, dtype)
        k = (op_key, key.cp_kind, key.moe_overlap, key.shared_overlap, key.cuda_graphs, tp_link, ep_link, cp_link,
             frozen, ep_sm_share(device, key))
        hit = self._base.get(k)
        if hit is not None:
            return hit
        lo, p, tp, tp_bwd, ep, cp = self._layer_comm(tb, device, key, moe, seq_len, dtype, op_key, tp_link, ep_link,
                                                     cp_link)
        fwd, bwd = p["fwd"], p["bwd_frozen" if frozen else "bwd"]
        if tp and key.tp_overlap:
            # userbuffers run the collectives beside the GEMMs next to them, on the SMs the communication kernels
            # leave: the collective hides behind the GEMMs, which pay the SMs and, where TE's default method splits
            # a GEMM (``userbuffers_gemm_s``), its chunking
            whole, chunked = p["gemm"], p["gemm_chunked"]
            tp = (max(0.0, 2 * tp - whole) + (chunked - whole) + p["gemm_margin"] * ub_margin(device)) / 2
            tp_bwd = tp
        cp_bwd = cp  # all-gather CP: the KV gathered forward, its gradient reduce-scattered backward, exposed
        if cp and key.cp_kind == "ring":
            cp, cp_bwd = ring_cp_exposed_s(cp, p["attn"], p["attn_bwd"], device)
        if ep and key.moe_overlap:
            # the dispatch/combine all-to-alls overlap the layer's other work (MegaScale-MoE §4; DeepSeek-V3
            # §3.2.2 pairs one micro-batch's all-to-all with another's compute); what the compute cannot cover stays
            # exposed, and the compute it overlaps runs on the SMs the communication kernels leave
            hide, sm_share = fwd + bwd, ep_sm_share(device, key)
            exposed = max(0.0, 2 * ep - hide)
            ep_cost = exposed + min(2 * ep, hide) * sm_share
            ep_re = max(0.0, ep - fwd) + min(ep, fwd) * sm_share
        else:
            ep_cost, ep_re = 2 * ep, ep
            if ep and key.shared_overlap:
                # the shared experts' forward runs on a side stream while the dispatch and combine move the routed
                # tokens (AutoModel MoE.forward; Megatron-Core moe_shared_expert_overlap): what it covers leaves the
                # critical path, on the SMs the communication kernels leave it (``ep_sm_share``); the forward and
                # its full recompute overlap, the backward stays in line
                hidden = min(ep, p["shared_fwd"]) * (1.0 - ep_sm_share(device, key))
                ep_cost, ep_re = ep_cost - hidden, ep_re - hidden
        host = 0.0
        if lo.experts and waits_for_host(key, device):
            host = moe_sync_wait_s(key.cuda_graphs, device.host_cpu, p["experts_fwd"], p["shared_fwd"],
                                   key.shared_overlap, max(1, tb.model.num_experts // key.ep),
                                   p["fwd"] - p["experts_fwd"] - p["shared_fwd"], self.host_speed,
                                   p["experts_fc2_fwd"])
        if lo.experts:  # the token counts exchanged before that sync, on the compute stream
            host += count_exchange_s(key, tb.model.num_experts, ep_link, device)
        comm = tp + tp_bwd + cp + cp_bwd + ep_cost + host  # forward and backward
        out = self._base[k] = (lo, p, fwd, bwd, comm, tp, cp, ep, ep_re, (tp + tp_bwd, ep_cost, cp + cp_bwd), host)
        return out

    def _layer_comm(self, tb, device, key: Layout, moe: str, seq_len: int, dtype: str, op_key: tuple, tp_link,
                    ep_link, cp_link) -> tuple:
        """(layer ops, their prices, the forward's TP comm, the backward's without userbuffers, its EP comm, its CP
        comm) of op key ``op_key`` on these links, seconds: what ``_layer_base`` reads of the links, cached apart from
        the overlap and graph flags it varies (a search asks for each op key under several of them)."""
        k = (op_key, tp_link, ep_link, cp_link)
        hit = self._comm.get(k)
        if hit is not None:
            return hit
        lo, p = self._priced_ops(tb, device, key, moe, seq_len, dtype, op_key)
        tp = sum(collective_time_s(kind_, nbytes, key.tp, tp_link) for kind_, nbytes in lo.tp_comm)
        tp_bwd = tp  # the backward mirrors the forward's collectives
        if tp and key.stack == "megatron" and key.sequence_parallel and not key.tp_overlap:
            tp_bwd = te_sp_backward_tp_s(lo.tp_comm, lo.tp_grad_gathers, key.tp, tp_link, p["column_bwd"], device)
        ep = sum(collective_time_s(kind_, nbytes, key.ep, ep_link) for kind_, nbytes in lo.ep_comm)
        cp = sum(collective_time_s(kind_, nbytes, key.cp, cp_link) for kind_, nbytes in lo.cp_comm)
        out = self._comm[k] = (lo, p, tp, tp_bwd, ep, cp)
        return out

    @staticmethod
    def _stage_times(tb, layout: Layout, dtype: str, times: tuple, emb: float, head: float) -> tuple[list, list, list]:
        """Per pipeline rank, one micro-batch: (compute, exposed layer comm, backward incl. recompute), seconds.
        ``times``: ``{kind: layer_times}`` under the workload's precision, then (``_bf16_times``) for the layers kept
        in bf16, in the order of ``precision_parts``."""
        stage_compute, stage_q, stage_bwd = [], [], []
        full = layout.recompute_kind == "full"
        for st in range(layout.pp):
            c = q = bwd = 0.0
            tables = [t for t in times if t is not None]  # one per precision part, in its order
            for t, (_, _, cnt, rc) in zip(tables, precision_parts(tb, layout, dtype, st), strict=True):
                c += sum((t[k][0] + t[k][1]) * n + t[k][2] * rc[k] for k, n in cnt.items() if n)
                q += sum(t[k][3] * n + (t[k][4] * rc[k] if full else 0.0) for k, n in cnt.items() if n)
                bwd += sum(t[k][1] * n + t[k][2] * rc[k] for k, n in cnt.items() if n)
            stage_bwd.append(bwd)
            if st == 0:
                c += emb
            if st == layout.pp - 1:
                c += head
            stage_compute.append(c)
            stage_q.append(q)
        return stage_compute, stage_q, stage_bwd

    def _links_of(self, cluster):
        """``cluster.collective_link``, memoised per (size, stride) for the cluster last asked about."""
        if self._link_cluster is not cluster:
            self._link_cluster, self._link_memo = cluster, {}
        memo = self._link_memo

        def link(size: int, stride: int):
            hit = memo.get((size, stride))
            if hit is None:
                hit = memo[(size, stride)] = cluster.collective_link(size, stride)
            return hit
        return link

    @staticmethod
    def _op_key(tb, device, key: Layout, moe: str, seq_len: int, dtype: str) -> tuple:
        """The fields a layer's op lists depend on (not recompute or moe_overlap; ring and all-gather CP run the same
        ops; the dispatcher decides the token sorts around the experts; a layer without routed experts reads none
        of the expert fields, one without a Mamba mixer not the activation order)."""
        order = key.sequence_first or "M" not in moe
        if "E" in moe:
            return (tb, device, moe, seq_len, dtype, key.tp, key.cp, key.ep, key.micro_batch, key.sequence_parallel,
                    key.attention, key.attention_dtype, key.etp, key.fp8, key.cp_kind == "a2a", key.stack,
                    key.moe_capacity, key.moe_imbalance, key.tp_overlap, key.moe_dispatcher, key.moe_fused_mlp, order,
                    key.moe_router, key.moe_router_fusion, key.moe_aux_loss, key.cudnn_frontend)
        return (tb, device, moe, seq_len, dtype, key.tp, key.cp, key.micro_batch, key.sequence_parallel,
                key.attention, key.attention_dtype, key.fp8, key.cp_kind == "a2a", key.stack, key.tp_overlap, order)

    def _op_lists(self, k: tuple, tb, key: Layout, moe: str, seq_len: int, dtype: str) -> tuple:
        """(layer ops, the ops of its blocks not yet priced on the layout's device) of op key ``k``, cached until
        priced; the layer's blocks come from a memo per model (``ops_graph.kind_ops``), so that each block is
        counted, primed and priced once (``_block_ops``)."""
        hit = self._lists.get(k)
        if hit is None:
            lo = layer_ops(tb.model, tb.rep[moe], key, seq_len, dtype, memo=self._block_memo.setdefault(tb, {}))
            chunk_tp, device = _chunk_tp(key), k[1]  # (``_op_key`` leads with the tables and the device)
            every = []
            for blk in lo.blocks:
                bkey = (id(blk), chunk_tp, device)  # blocks live in the memo: their ids are theirs
                if bkey not in self._primed_blocks:
                    self._primed_blocks.add(bkey)
                    every += self._block_ops(blk, chunk_tp, tb, lo)[3]
            hit = self._lists[k] = (lo, every)
        return hit

    def _block_ops(self, blk: tuple, chunk_tp: int, tb, lo) -> tuple:
        """(the block, {op: times it runs}, {GEMM: its chunks}, every distinct op to price, the ids of its routed
        experts' ops) of block ``blk`` of
        layer ops ``lo``, cached per block. tp_overlap (``chunk_tp`` > 1): the attention and dense-MLP GEMMs next
        to the TP collectives (not the routed experts, not the router), each also priced in the chunks along the
        tokens userbuffers split it into: (tp chunks, ``UB_PIPELINE_SPLITS`` chunks)."""
        k = (id(blk), chunk_tp)
        hit = self._blocks.get(k)
        if hit is not None and hit[0] is blk:
            return hit
        counts: dict = {}
        for op in blk:  # equal ops summed; an eager stack's local experts are one set of ops listed per expert
            counts[op] = counts.get(op, 0) + 1
        routed = {id(op) for op in lo.experts}
        chunked = {}
        if chunk_tp > 1:
            splits = (chunk_tp, UB_PIPELINE_SPLITS)
            chunked = {op: tuple(replace(op, shape=(op.shape[0] // n,) + op.shape[1:]) for n in splits)
                       for op in counts if op.kind == "matmul" and op.shape[0] >= max(chunk_tp, UB_PIPELINE_SPLITS)
                       and id(op) not in routed and op.shape[1] != tb.model.num_experts}
        every = list(dict.fromkeys([*counts, *(c for pair in chunked.values() for c in pair)]))
        hit = self._blocks[k] = (blk, counts, chunked, every, routed)
        return hit

    def _block_prices(self, blk: tuple, chunk_tp: int, tb, lo, device) -> dict:
        """Block ``blk``'s share of ``_priced_ops``' sums (its ops primed), cached per block."""
        k = (id(blk), chunk_tp, device)
        hit = self._block_price.get(k)
        if hit is not None and hit[0] is blk:
            return hit[1]
        _, counts, chunked, _, routed = self._block_ops(blk, chunk_tp, tb, lo)
        predict, h, experts = self.pricer.predict, tb.model.hidden_size, tb.model.num_experts
        f = {op: predict(op, device) for op in counts}
        b = {op: self._bwd_s(op, device) for op in counts}
        prices = {"fwd": sum(n * f[op] for op, n in counts.items()),
                  "bwd": sum(n * b[op] for op, n in counts.items()),
                  # a frozen weight GEMM's backward is the input gradient alone: one GEMM of the forward's FLOPs
                  # (dY W against X W^T), priced as the forward; LoRA's rank-r adapter GEMMs (r / hidden of it) left out
                  "bwd_frozen": sum(n * (f[op] if op.kind == "matmul" else b[op]) for op, n in counts.items()),
                  # backward of the column-parallel GEMMs (QKV / FC1: k = hidden), what TE's SP backward hides
                  # its collectives behind (te_sp_backward_tp_s)
                  "column_bwd": sum(n * b[op] for op, n in counts.items() if op.kind == "matmul"
                                    and op.shape[2] == h and id(op) not in routed and op.shape[1] != experts),
                  "gemm": 0.0, "gemm_chunked": 0.0, "gemm_margin": 0.0}
        for op, (ring, pipe) in chunked.items():
            prices["gemm"] += counts[op] * (f[op] + b[op])
            split_s, margin_s = userbuffers_gemm_s(
                op.shape[2] == h, b[op], chunk_tp * predict(ring, device), chunk_tp * self._bwd_s(ring, device),
                UB_PIPELINE_SPLITS * predict(pipe, device))
            prices["gemm_chunked"] += counts[op] * split_s
            prices["gemm_margin"] += counts[op] * margin_s
        self._block_price[k] = (blk, prices)
        return prices

    def prime_layouts(self, work: Workload, layouts) -> None:
        """Price every op the layer and edge times of ``layouts`` need in one call of the cost model per op class
        (its per-call cost dominates pricing op lists one by one); layouts whose ops cannot be built are left to
        the pricing that says why."""
        tb, dev, seq, dtype = self.tables(work.model), work.cluster.device, work.seq_len, work.dtype
        todo: dict = {}
        for lay in layouts:
            key = time_key(lay)
            try:
                for moe in tb.rep:
                    k = self._op_key(tb, dev, key, moe, seq, dtype)
                    if k not in self._ops and k not in self._lists:  # a listed key's ops are primed or in todo
                        todo.update(dict.fromkeys(self._op_lists(k, tb, key, moe, seq, dtype)[1]))
                edge = (tb, dev, seq, dtype, key.micro_batch, key.tp, key.cp, key.stack)  # what the two read
                if edge not in self._edge_primed:
                    todo.update(dict.fromkeys((*embedding_ops(tb.model, key, seq, dtype),
                                               *head_ops(tb.model, key, seq, dtype))))
                    self._edge_primed.add(edge)
            except MeshplanError:
                continue
        self._prime_with_backward(list(todo), dev)

    def _prime_with_backward(self, every: list, device) -> None:
        """Price ``every`` op and the backward of its GEMMs and attention in one batch, keeping the backward's."""
        primed = self._primed.setdefault(device, set())
        every = [op for op in every if op not in primed]
        if not every:
            return
        primed.update(every)
        need = [op for op in every if op.kind in BWD_PRICED_KINDS and (op, device) not in self._bwd]
        backward = [replace(op, backward=True) for op in need]
        self.pricer.prime(every + backward, device)
        for op, bop in zip(need, backward):
            self._bwd[(op, device)] = self.pricer.predict(bop, device)

    def _priced_ops(self, tb, device, key: Layout, moe: str, seq_len: int, dtype: str,
                    k: Optional[tuple] = None) -> tuple:
        """The layer's op lists and their prices, which do not depend on recomputation (cached without it): forward,
        backward, core attention, what op-level checkpointing recomputes, and the GEMMs whole and in tp chunks, each
        the sum of its blocks' (``_block_prices``). Repeated ops (a grouped GEMM's local experts) are priced once
        and counted. ``k``: the op key (``_op_key``), when the caller has it."""
        if k is None:
            k = self._op_key(tb, device, key, moe, seq_len, dtype)
        hit = self._ops.get(k)
        if hit is not None:
            return hit
        predict = self.pricer.predict
        lo, every = self._op_lists(k, tb, key, moe, seq_len, dtype)
        self._lists.pop(k)
        self._prime_with_backward(every, device)
        chunk_tp = _chunk_tp(key)
        parts = [self._block_prices(blk, chunk_tp, tb, lo, device) for blk in lo.blocks]
        prices = {name: sum(part[name] for part in parts) for name in _BLOCK_SUMS}
        prices.update(attn=sum(predict(op, device) for op in lo.core_attention),
                      attn_bwd=sum(self._bwd_s(op, device) for op in lo.core_attention),
                      shared_fwd=sum(predict(op, device) for op in lo.shared),
                      experts_fwd=lo.expert_copies * sum(predict(op, device) for op in lo.experts),
                      experts_fc2_fwd=lo.expert_copies * sum(predict(op, device) for op in fc2_onward(lo.experts)))
        dglu = self._dglu_extra_s(tb, device, key, lo)
        prices["bwd"] += dglu
        prices["bwd_frozen"] += dglu  # frozen experts still take their input gradient
        out = self._ops[k] = (lo, prices)
        return out

    def _dglu_extra_s(self, tb, device, key: Layout, lo) -> float:
        """Seconds the fused grouped MLP's dGLU kernel adds to a layer's backward over the grouped GEMM it is priced
        as: fc2's input gradient (``DGRAD_SHARE`` of its grouped GEMM's backward) times the kernel's multiple under
        the layout's cuDNN frontend release, with fc1's bias gradient where the experts have biases
        (``costmodel.cudnn_dglu``); 0 without ``moe_fused_mlp``."""
        if not (key.moe_fused_mlp and lo.experts):
            return 0.0
        multiple = cudnn_dglu.dgrad_multiple(key.cudnn_frontend, tb.model.expert_bias)
        fc2 = fc2_onward(lo.experts)[0]
        return lo.expert_copies * (multiple - 1.0) * DGRAD_SHARE * self._bwd_s(fc2, device)

    def _edge_times(self, tb, device, key: Layout, seq_len: int, dtype: str,
                    frozen: bool = False) -> tuple[float, float]:
        """(embedding fwd+bwd, LM head + loss (+ MTP modules) fwd+bwd) for one micro-batch, seconds; ``frozen``:
        a frozen embedding has no backward and the output layer's backward is its input gradient alone."""
        # the embedding and the head read the micro-batch, tp, cp and the stack only; the MTP modules every field
        k = ((tb, device, key, seq_len, dtype, frozen) if tb.model.num_mtp_layers else
             (tb, device, key.micro_batch, key.tp, key.cp, key.stack, seq_len, dtype, frozen))
        hit = self._edge.get(k)
        if hit is None:
            emb = embedding_ops(tb.model, key, seq_len, dtype)
            head = head_ops(tb.model, key, seq_len, dtype)
            predict = self.pricer.predict
            # the MTP modules run on the last stage, after the main model's head (ops_graph.mtp_ops)
            mtp = sum(n * (predict(o, device) + self._bwd_s(o, device))
                      for o, n in mtp_ops(tb.model, key, seq_len, dtype).items())
            if frozen:
                hit = self._edge[k] = (sum(predict(o, device) for o in emb),
                                       sum(predict(o, device) * (2.0 if o.kind == "matmul" else 1.0)
                                           + (0.0 if o.kind == "matmul" else self._bwd_s(o, device))
                                           for o in head) + mtp)
            else:
                hit = self._edge[k] = (sum(predict(o, device) + self._bwd_s(o, device) for o in emb),
                                       sum(predict(o, device) + self._bwd_s(o, device) for o in head) + mtp)
        return hit

    def time_balanced_split(self, work: Workload, layout: Layout) -> tuple[int, ...]:
        """Layers per (virtual) stage balanced by predicted time rather than layer count:
        dense and MoE layers, and the embedding and the output layer + loss on the first and last stages, weigh
        what one micro-batch of each costs on this layout (``planner.layout.splits.weighted_split``)."""
        model, dev = work.model, work.cluster.device
        cluster = work.cluster
        tb = self.tables(model)
        key = time_key(layout)
        links = group_links(cluster, model, layout)
        def per_kind(key, dtype) -> dict:
            out = {}
            for moe in tb.rep:
                t = self.layer_times(tb, dev, key, moe, work.seq_len, dtype, *links, frozen=bool(work.lora))
                out[moe] = t[0] + t[1] + t[3] + (t[2] if layout.recompute_kind != "none" else 0.0)
            return out

        own = per_kind(key, work.dtype)
        weights = [own[model.layer_kind(i)] for i in range(model.num_layers)]
        if keeps_bf16_layers(layout, work.dtype, model.num_layers):  # the kept layers weigh their bf16 time
            kept = per_kind(bf16_time_key(layout), "bf16")
            for r in layout.bf16_ranges(model.num_layers):
                for i in r:
                    weights[i] = kept[model.layer_kind(i)]
        emb, head = self._edge_times(tb, dev, key, work.seq_len, work.dtype, frozen=bool(work.lora))
        return weighted_split(weights, layout.pp * layout.vpp, emb, head)

    # ---- the estimate
    def estimate(self, work: Workload, layout: Layout) -> Estimate:
        """Predict step time, throughput and peak memory of ``layout`` (validated beforehand)."""
        if layout.mtp and layout.mtp != work.model.num_mtp_layers:  # a plan's layout read back prices its MTP
            # modules (a layout at the default 0 prices what the model counts: ``load_model(mtp=True)``)
            work = replace(work, model=self._mtp_model(work.model, layout.mtp))
        step, compute, pipeline, exposed, bubble, optimizer, m = self._step_parts(work, layout)
        return finish_estimate(work, self.tables(work.model), layout, m, step=step, compute_s=compute,
                               pipeline_s=pipeline, exposed_comm_s=exposed, bubble_s=bubble, other_s=optimizer)

    def peak_memory_bytes(self, work: Workload, layout: Layout) -> int:
        """The peak memory ``estimate`` predicts for ``layout``, the same bytes, without pricing its time: what a
        search needs to find the closest miss when nothing fits."""
        if layout.mtp and layout.mtp != work.model.num_mtp_layers:
            work = replace(work, model=self._mtp_model(work.model, layout.mtp))
        return peak_memory(work, self.tables(work.model), layout,
                           layout.num_microbatches(work.global_batch)).total_bytes

    def memory_floor_bytes(self, work: Workload, layout: Layout) -> int:
        """A lower bound on ``peak_memory_bytes`` of ``layout`` and of every sharding of it (``cannot_fit``'s)."""
        return memory_floor_bytes(work, self.tables(work.model), layout, layout.num_microbatches(work.global_batch))

    def _mtp_model(self, model, mtp: int):
        """``model`` with ``mtp`` MTP modules, one object per pair (the tables are cached per model object)."""
        key = (id(model), mtp)
        hit = self._mtp_models.get(key)
        if hit is None or hit[0] is not model:
            hit = self._mtp_models[key] = (model, model.with_mtp(mtp))
        return hit[1]

    def step_time_s(self, work: Workload, layout: Layout) -> float:
        """The step time ``estimate`` predicts, the same float, without the memory and the rates: what a search
        needs to tell a layout that cannot rank before it prices the rest."""
        return self._step_parts(work, layout)[0]

    def shard_step_times_s(self, work: Workload, layout: Layout, shards: tuple) -> list[float]:
        """The step times ``estimate`` predicts (the same floats) for ``layout`` with each ``(zero_stage, dp_shard,
        dp_replicate)`` of ``shards`` (one data-parallel degree), without memory and rates: the pipeline part is
        priced once for all of them, each sharding's collectives once per estimator (``_sync_terms``), and their
        exposure for all the shardings at once (``ShardTable``, kept for every layout of the same sync fields)."""
        tb, m, pipe = self._pipeline_of(work, layout)
        slow, stage_c, stage_q, t_max, bubble, straggle = pipe
        table = self._shard_table(work, layout, tb, slow, shards)
        return table.step_times_s(m * t_max + straggle + bubble, stage_c + stage_q, stage_c, m)

    def _shard_table(self, work: Workload, layout: Layout, tb, slow: int, shards: tuple) -> ShardTable:
        """The ``ShardTable`` of stage ``slow`` of ``layout`` under each of ``shards``, cached."""
        syncs = self._scoped(work, tb).syncs
        vals = list(_sync_fields_of(layout))
        z_at, d_at, rep_at = _SHARD_AT
        vals[z_at] = vals[d_at] = vals[rep_at] = None
        tkey = (slow, tuple(vals), shards)
        table = syncs.get(tkey)
        if table is None:
            keys = []
            for shard in shards:
                vals[z_at], vals[d_at], vals[rep_at] = shard
                keys.append((slow, tuple(vals)))
            todo = {key: layout.with_(zero_stage=z, dp_shard=d, dp_replicate=rep)
                    for key, (z, d, rep) in zip(keys, shards) if key not in syncs}
            # the new shardings' optimizer steps priced in one call of the cost model (its per-call cost dominates)
            self.pricer.prime([_optimizer_op(lay, trainable_params(work, tb, lay, slow)) for lay in todo.values()],
                              work.cluster.device)
            for key, member in todo.items():
                syncs[key] = self._price_sync_terms(work, member, tb, slow)
            table = syncs[tkey] = ShardTable.of([syncs[key] for key in keys])
        return table

    def group_bound_s(self, work: Workload, layout: Layout, shards: tuple) -> Optional[float]:
        """A lower bound on the step time of ``layout`` (a recompute=none member of a search's group) with each
        ``(zero_stage, dp_shard, dp_replicate)`` of ``shards`` and any recomputation (``None``: none is given, for
        a pipeline of several stages or with activation offload, whose slowest stage and copies recomputation may
        move). The recompute=none pipeline part bounds every variant's (recomputation only adds to it); what a
        variant adds per micro-batch is at most one forward of every layer with its forward collectives
        (``layer_times``' fwd and comm_re), and the exposed gradient sync only falls as the stage's time and
        compute grow (``SyncTerms.exposed_s``): so each sharding's step is at least the pipeline part plus its
        exposed sync at the stage time and compute raised by that much, plus its optimizer step."""
        if not _bounds_whole_group(layout):
            return None
        tb, m, pipe = self._pipeline_of(work, layout)
        slow, stage_c, stage_q, t_max, bubble, straggle = pipe
        sig = time_signature(layout)
        times, _ = self._per_mb_times(work, layout, tb, sig)
        counts = tb.kind_counts((range(work.model.num_layers),))
        more_c = sum((times[k][0] + times[k][4]) * n for k, n in counts.items() if n)  # fwd, and a moe module's a2a
        more_q = sum(times[k][4] * n for k, n in counts.items() if n)
        bf16 = self._bf16_times(work, layout, tb, sig)
        if bf16 is not None:  # a kept layer's forward may cost more: the most a variant adds must cover it
            held = tb.kind_counts(layout.bf16_ranges(work.model.num_layers))
            more_c += sum(max(0.0, bf16[k][0] + bf16[k][4] - times[k][0] - times[k][4]) * n for k, n in held.items())
            more_q += sum(max(0.0, bf16[k][4] - times[k][4]) * n for k, n in held.items())
        table = self._shard_table(work, layout, tb, slow, shards)
        stage_s, compute_s = stage_c + stage_q + more_c + more_q, stage_c + more_c
        return min(table.step_times_s(m * t_max + straggle + bubble, stage_s, compute_s, m))

    def sync_floor_s(self, work: Workload, layout: Layout, shards: tuple) -> Optional[float]:
        """A lower bound on what the step of ``layout`` (a search's group: ``shards`` its shardings) adds to its
        pipeline part, under any sharding and recomputation (``None`` where ``group_bound_s`` gives none): the least
        over the shardings of the exposed gradient sync with compute enough to hide all it can
        (``SyncTerms.exposed_s`` only falls as compute grows) plus the optimizer step. It reads the ``ShardTable`` that
        ``group_bound_s`` reads, and no pipeline part."""
        if not _bounds_whole_group(layout):
            return None
        m = layout.num_microbatches(work.global_batch)
        table = self._shard_table(work, layout, self.tables(work.model), 0, shards)
        return min(table.step_times_s(0.0, _HIDE_ALL_S, _HIDE_ALL_S, m))

    def pipeline_bound_s(self, work: Workload, layout: Layout) -> float:
        """``Estimate.pipeline_s + bubble_s`` of ``layout`` (the same floats), from the pipeline part alone: the part
        of the step no sharding of the data-parallel states changes, a search's lower bound for all of them."""
        _, m, pipe = self._pipeline_of(work, layout)
        _, _, _, t_max, bubble, straggle = pipe
        return m * t_max + straggle + bubble

    def cannot_fit(self, work: Workload, layout: Layout) -> bool:
        """Whether no sharding of ``layout``'s data-parallel states fits: its activations and runtime overhead alone
        (``memory_floor_bytes``) exceed the memory ``estimate`` allows."""
        limit = int(work.cluster.device.memory_bytes * USABLE_FRACTION)
        m = layout.num_microbatches(work.global_batch)
        return memory_floor_bytes(work, self.tables(work.model), layout, m) > limit

    def work_bounds_s(self, work: Workload, layouts: list) -> list[Optional[float]]:
        """A lower bound on ``pipeline_bound_s`` of each of ``layouts`` and of every layout that differs from it
        only in pipeline depth, chunks, split or recomputation (``None``: its ops cannot be priced; pricing it says
        why). One micro-batch's work (every layer's compute and exposed comm, the embedding, the head) spread evenly
        over the stages, since the slowest stage holds at least the mean and recomputation and the pipeline sends
        only add to it; with its straggler share and the bubble (1F1B and interleaved: rising with the stage time)
        of that mean. The work is priced once per ``time_signature`` (a search bounds 10^4-10^5 layouts over a
        tenth as many), its ops in one batch per op class (``prime_layouts``)."""
        tb = self.tables(work.model)
        sigs = [time_signature(lay) for lay in layouts]
        works = self._works(work, tb, dict(zip(sigs, layouts)))
        return self._spread_s(work, layouts, [self._bf16_work(work, lay, tb, sig, None if works[sig] is None
                                                               else works[sig][0]) for sig, lay in zip(sigs, layouts)])

    def recipe_twin_bounds_s(self, work: Workload, layouts: list) -> list[Optional[float]]:
        """A lower bound on ``work_bounds_s`` of each of ``layouts`` whose fp8 recipe is tensor-wise, block-wise or
        MXFP8, priced without their own ops: their delayed-scaling twin's work, where that twin is one of
        ``layouts`` (``None``: another recipe, a twin not asked about, or one that cannot be priced). Each of those
        recipes runs the delayed one's ops and more at no lower a price: the same casts (tensor-wise adds an amax
        pass) and GEMMs at ``recipe_time_multiple`` of at least delayed's, which the check below holds to; and a
        layer's time does not fall as an op slows, once the expert all-to-all an overlap hides is taken at the least
        it exposes (``_monotone_comm``; the other overlaps hide at most the compute an op adds, and the search checks
        each group's own bound against this one when it prices it). A search prices a group's own ops only when
        this bound comes up (DeepSeek-V3 on 8 GB200 NVL72 racks in fp8: 792 of 8,906 groups)."""
        tb, dev = self.tables(work.model), work.cluster.device
        delayed_multiple = recipe_time_multiple("delayed", dev)
        asked = {time_signature(lay) for lay in layouts if lay.fp8 == "delayed"}  # a twin asked for is priced anyway
        twins, sigs = {}, {}
        for i, lay in enumerate(layouts):
            if (asked and lay.fp8 in TWINNED_RECIPES and lowp_recipe(lay.fp8, work.dtype) == lay.fp8
                    and recipe_time_multiple(lay.fp8, dev) >= delayed_multiple):
                twin = lay.with_(fp8="delayed")
                sig = time_signature(twin)
                if sig in asked:
                    twins[i], sigs[i] = twin, sig
        works = self._works(work, tb, {sig: twins[i] for i, sig in sigs.items()})
        out: list[Optional[float]] = [None] * len(layouts)
        keep = [i for i in sigs if works[sigs[i]] is not None]
        bounds = self._spread_s(work, [layouts[i] for i in keep],
                                [self._bf16_work(work, twins[i], tb, sigs[i], works[sigs[i]][1]) for i in keep])
        for i, b in zip(keep, bounds):
            out[i] = b
        return out

    def _works(self, work: Workload, tb, by_sig: dict) -> dict:
        """``{signature: (its micro-batch's work, that work's floor by ``_monotone_comm``)}`` for the layouts
        ``by_sig`` (``None``: its ops cannot be priced), cached per signature; new ones primed in one batch."""
        scope = self._scoped(work, tb)
        works = scope.works
        fresh = {sig: lay for sig, lay in by_sig.items() if sig not in works}
        self.prime_layouts(work, list(fresh.values()))
        counts = tb.kind_counts((range(work.model.num_layers),))
        dev, seq, dtype, frozen = work.cluster.device, work.seq_len, work.dtype, bool(work.lora)
        for sig, lay in fresh.items():
            try:
                key, links = time_key(lay), self._group_links(work, lay, scope)
                parts = {k: self._layer_base(tb, dev, key, k, seq, dtype, *links, frozen) for k in tb.rep}
                emb, head = self._edge_times(tb, dev, key, seq, dtype, frozen=frozen)
            except (MeshplanError, ArithmeticError):
                works[sig] = None
                continue
            # a layer's fwd, bwd and exposed comm (``layer_times``' first, second and fourth: no recomputation)
            layers_s = sum((parts[k][2] + parts[k][3] + parts[k][4]) * n for k, n in counts.items() if n)
            floor_s = layers_s if not key.moe_overlap else sum(
                (parts[k][2] + parts[k][3] + _monotone_comm(parts[k], key, dev)) * n for k, n in counts.items() if n)
            works[sig] = (layers_s + emb + head, floor_s + emb + head)
        return works

    def _bf16_work(self, work: Workload, layout: Layout, tb, sig: tuple, recipe_s: Optional[float]) -> Optional[float]:
        """``work_bounds_s``' micro-batch work ``recipe_s`` (every layer under the workload's precision) with the
        layers ``layout`` keeps in bf16 at their own price: the same sum the step prices, so the bound stays below
        it whichever precision is the faster (a small GEMM's fp8 cast can outweigh its saving)."""
        if recipe_s is None or not keeps_bf16_layers(layout, work.dtype, work.model.num_layers):
            return recipe_s
        recipe, bf16 = self._per_mb_times(work, layout, tb, sig)[0], self._bf16_times(work, layout, tb, sig)
        held = tb.kind_counts(layout.bf16_ranges(work.model.num_layers))
        return recipe_s + sum((bf16[k][0] + bf16[k][1] + bf16[k][3] - recipe[k][0] - recipe[k][1] - recipe[k][3]) * n
                              for k, n in held.items() if n)

    @staticmethod
    def _spread_s(work: Workload, layouts: list, works: list) -> list[Optional[float]]:
        """``work_bounds_s``' bound of each layout from its micro-batch's work ``works`` (``None`` stays), as arrays
        over the layouts (a search bounds 10^4-10^5): m x the mean stage time x the straggler factor, plus the bubble
        1F1B and interleaved add (``bubble_s``, the same arithmetic in the same order)."""
        out: list[Optional[float]] = [None] * len(works)
        keep = [i for i, w in enumerate(works) if w is not None]
        if not keep:
            return out
        pp, vpp, runs, mbs, rep, shard, cp, tp = np.array([_spread_fields(layouts[i]) for i in keep], dtype=np.int64).T
        dp = rep * shard
        worlds, at = np.unique(dp * cp * tp * pp, return_inverse=True)
        slowdown = np.array([1.0 + straggler_slowdown(int(world)) for world in worlds])[at]
        mean_s = np.array([works[i] for i in keep]) / pp
        # 1F1B's and interleaved's bubble is linear in the stage time: ``bubble_s`` of a 1 s stage, times the mean
        shapes = [(layouts[i].schedule, layouts[i].pp, layouts[i].vpp) for i in keep]
        per_s = {sh: bubble_s(*sh, 1.0, 0.0) if sh[0] in ("1f1b", "interleaved") else 0.0 for sh in set(shapes)}
        bubble = runs * (np.array([per_s[sh] for sh in shapes]) * mean_s)
        for i, bound in zip(keep, (work.global_batch // (mbs * dp) * mean_s * slowdown + bubble).tolist()):
            out[i] = bound
        return out

    def _step_parts(self, work: Workload, layout: Layout) -> tuple:
        """(step, compute, pipeline, exposed comm, bubble, other, micro-batches) of ``layout``, seconds."""
        tb, m, pipe = self._pipeline_of(work, layout)
        return step_of(pipe, self._sync_terms(work, layout, tb, pipe[0]), m)

    def _scoped(self, work: Workload, tb) -> "_Scope":
        """The caches of ``work``'s cluster, model, sequence, dtype and LoRA: keys without them hash in a fraction of
        the time (a search asks about one workload 10^5 times)."""
        sc = self._scope
        if (sc[0] is work.cluster and sc[1] is tb and sc[2] == work.seq_len and sc[3] == work.dtype
                and sc[4] == work.lora):
            return sc[5]
        caches = self._scopes.get((work.cluster, tb, work.seq_len, work.dtype, work.lora))
        if caches is None:
            caches = self._scopes[work.cluster, tb, work.seq_len, work.dtype, work.lora] = _Scope({}, {}, {}, {},
                                                                                                 {}, {})
        self._scope = (work.cluster, tb, work.seq_len, work.dtype, work.lora, caches)
        return caches

    def _pipeline_of(self, work: Workload, layout: Layout) -> tuple:
        """(model tables, micro-batches, ``_pipeline_part``) of ``layout``, cached."""
        cluster = work.cluster
        dev = cluster.device
        m = layout.num_microbatches(work.global_batch)
        if layout.fp8 in ("mxfp8", "nvfp4") and not dev.supports(layout.fp8):
            raise MeshplanError(f"fp8={layout.fp8} needs block-scaled {layout.fp8} tensor cores (Blackwell); "
                                f"{dev.name} has none (use tensorwise, delayed or blockwise)")
        if layout.moe_fused_mlp:
            check_fused_moe_mlp(work.model, dev)
        if layout.attention_dtype == "fp8" and lowp_recipe(layout.fp8, work.dtype) not in FP8_ATTENTION_RECIPES:
            raise MeshplanError(f"attention_dtype=fp8: Transformer Engine runs fp8 attention under tensor-wise, "
                                f"delayed or MXFP8 scaling, not {lowp_recipe(layout.fp8, work.dtype)} (dtype "
                                f"{work.dtype}, fp8={layout.fp8})")
        check_bf16_layers(layout, work.model.num_layers, lowp_recipe(layout.fp8, work.dtype))
        tb = self.tables(work.model)
        # one micro-batch's layer and edge times depend on these fields only (the search prices ~10^4 layouts
        # sharing far fewer of them): a plain tuple is a cheaper key than the Layout time_key builds
        sig = time_signature(layout)
        # the pipeline part does not depend on how the data-parallel states are sharded (dp_shard x dp_replicate
        # = dp is in the key): the members of a search's group share it
        pkey = (sig, layout.pp, layout.vpp, layout.pp_layout, layout.recompute, layout.pp_runs,
                layout.pipeline_schedule, layout.pp_overlap, layout.dp, m, layout.offload_layers,
                layout.bf16_first_layers, layout.bf16_last_layers)
        pipes = self._scoped(work, tb).pipes
        pipe = pipes.get(pkey)
        if pipe is None:
            pipe = pipes[pkey] = self._pipeline_part(work, layout, tb, sig, m)
        return tb, m, pipe

    def _pipeline_part(self, work: Workload, layout: Layout, tb, sig: tuple, m: int) -> tuple:
        """(slowest stage, its compute and exposed comm per micro-batch, the slowest per-micro-batch time, the
        bubble, the straggler's share of the pipeline), seconds."""
        model, cluster = work.model, work.cluster
        dev = cluster.device
        pp, vpp = layout.pp, layout.vpp
        pp_link = self._links_of(cluster)(*layout.pp_neighbours)
        times, (emb, head) = self._per_mb_times(work, layout, tb, sig)
        skey = (sig, pp, vpp, layout.pp_layout, layout.recompute, layout.bf16_first_layers, layout.bf16_last_layers)
        cached = self._scoped(work, tb).stages
        stages = cached.get(skey)
        if stages is None:
            stages = cached[skey] = self._stage_times(tb, layout, work.dtype,
                                                      (times, self._bf16_times(work, layout, tb, sig)), emb, head)
        stage_compute, stage_q, stage_bwd = stages
        stage_comm = [q + pp_p2p_s(layout, model.hidden_size, work.seq_len, pp_link, c, dev)
                      for q, c in zip(stage_q, stage_compute)]
        if layout.offload_layers:
            bf16 = self._bf16_times(work, layout, tb, sig)
            stage_comm = [q + offload_s(work, layout, tb, times, st, bf16) for st, q in enumerate(stage_comm)]
        per_mb = [c + q for c, q in zip(stage_compute, stage_comm)]
        slow = max(range(pp), key=lambda i: per_mb[i])
        t_max = per_mb[slow]
        # each schedule run fills and drains the pipeline (layout.pp_runs: AutoModel's gradient accumulation)
        bubble = layout.pp_runs * bubble_s(layout.schedule, pp, vpp, sum(per_mb) / pp, sum(stage_bwd) / pp)
        straggle = m * t_max * straggler_slowdown(layout.world_size)
        return slow, stage_compute[slow], stage_comm[slow], t_max, bubble, straggle

    def _per_mb_times(self, work: Workload, layout: Layout, tb, sig: tuple) -> tuple:
        """({layer kind: ``layer_times``}, (embedding, head) ``_edge_times``) of one micro-batch of ``layout``, whose
        ``time_signature`` is ``sig``, cached on it."""
        cluster, scope = work.cluster, self._scoped(work, tb)
        per_mb = scope.per_mb.get(sig)
        if per_mb is None:
            dev, key, links = cluster.device, time_key(layout), self._group_links(work, layout, scope)
            frozen = bool(work.lora)  # LoRA: the base's weight GEMMs run no weight gradient
            per_mb = scope.per_mb[sig] = (
                {k: self.layer_times(tb, dev, key, k, work.seq_len, work.dtype, *links, frozen=frozen)
                 for k in tb.rep},
                self._edge_times(tb, dev, key, work.seq_len, work.dtype, frozen=frozen))
        return per_mb

    def _bf16_times(self, work: Workload, layout: Layout, tb, sig: tuple) -> Optional[dict]:
        """``{layer kind: layer_times}`` of a layer that keeps bf16 GEMMs under the low-precision recipe
        (``Layout.bf16_ranges``, ``bf16_time_key``), cached on ``sig``; ``None`` when every layer runs the workload's
        own precision."""
        if not keeps_bf16_layers(layout, work.dtype, work.model.num_layers):
            return None
        scope = self._scoped(work, tb)
        hit = scope.per_mb.get(("bf16", sig))
        if hit is None:
            dev, links = work.cluster.device, self._group_links(work, layout, scope)
            key = bf16_time_key(layout)
            hit = scope.per_mb["bf16", sig] = {
                k: self.layer_times(tb, dev, key, k, work.seq_len, "bf16", *links, frozen=bool(work.lora))
                for k in tb.rep}
        return hit

    @staticmethod
    def _group_links(work: Workload, layout: Layout, scope: "_Scope") -> tuple:
        """``group_links``, kept per what it reads: one pricing per mesh shape, not per signature."""
        lkey = (layout.tp, layout.ep, layout.expert_tp, layout.cp, layout.cp_kind == "a2a", layout.moe_dispatcher,
                layout.moe_router, layout.hybridep_sms)
        links = scope.links.get(lkey)
        if links is None:
            links = scope.links[lkey] = group_links(work.cluster, work.model, layout)
        return links

    def _sync_terms(self, work: Workload, layout: Layout, tb, slow: int) -> SyncTerms:
        """What the gradient sync and the optimizer step of pipeline stage ``slow`` cost before the compute they
        overlap is known: every collective priced once, cached on the fields they read (``_SYNC_FREE`` are not)."""
        syncs = self._scoped(work, tb).syncs
        key = (slow, _sync_fields_of(layout))
        hit = syncs.get(key)
        if hit is None:
            hit = syncs[key] = self._price_sync_terms(work, layout, tb, slow)
        return hit

    def _price_sync_terms(self, work: Workload, layout: Layout, tb, slow: int) -> SyncTerms:
        """``_sync_terms`` uncached. Dense parameters sync over the data-parallel (x context-parallel) group, routed
        experts over the expert-data-parallel group of the folded expert mesh (Megatron-Core MoE parallel
        folding)."""
        dev, link = work.cluster.device, self._links_of(work.cluster)
        dense, expert = stage_params(tb, layout, slow)
        trained = trainable_params(work, tb, layout, slow)  # LoRA: the adapters alone take gradients and steps
        groups = [(dense, layout.grad_group, layout.shard_group, layout.dp_replicate)]
        if expert:
            eshard = layout.expert_shard_group
            groups.append((expert, (layout.expert_dp, eshard.stride), eshard,
                           max(1, layout.expert_dp // eshard.size)))
        grad_b = reduce_bytes_per_param(layout, work.dtype)  # reduced in fp32, gradients move twice the bytes
        trained_share = sum(trained) / max(dense + expert, 1.0)  # 1 unless LoRA freezes the base
        grad_total = (dense + expert) * grad_b * trained_share
        zero3 = layout.zero_stage == 3
        out = []
        for params, grad_group, shard_group, replicas in groups:
            grad_bytes = params * grad_b * trained_share
            bucket = min(1.0, DDP_BUCKET_BYTES / max(grad_total, 1.0))
            share = params / (dense + expert)
            if zero3:
                shard = shard_group[0]
                shard_link = link(*shard_group)
                gather = collective_time_s("allgather", params * param_bytes(work.dtype), shard, shard_link)
                scatter = collective_time_s("reducescatter", grad_bytes, shard, shard_link)
                rep_link = link(replicas, shard_group[1] * shard)
                rep = collective_time_s("allreduce", grad_bytes / shard, replicas, rep_link)
                copy_s = copy_in_s = 0.0
                if layout.fsdp_impl == "torch" and shard > 1:
                    # FSDP2 copies each gather out of its buffer into the unsharded parameters and each gradient
                    # into the reduce-scatter buffer, on the compute stream (Layout.fsdp): memory-bound passes (a
                    # bf16 gradient copied into an fp32 reduce buffer is the 2 -> 4 B conversion the "cast" op
                    # measures, collect.py's fp32 <-> bf16 kernel)
                    param_dtype = "fp32" if work.dtype == "fp32" else "bf16"
                    grad_dtype = "fp32" if grad_b == 4 else "bf16"
                    copy_in = "cast" if grad_dtype != param_dtype else "copy"
                    copy_s = self.op_time_s(OpSpec("copy", (int(params),), param_dtype), dev)
                    copy_in_s = self.op_time_s(OpSpec(copy_in, (int(max(1.0, params * trained_share)),), grad_dtype),
                                               dev)
                out.append((params, share, bucket, rep, gather, scatter, copy_s, copy_in_s, float(shard > 1)))
            else:
                sync = collective_time_s("allreduce", grad_bytes, grad_group[0], link(*grad_group))
                out.append((params, share, bucket, sync, 0.0, 0.0, 0.0, 0.0, 0.0))
        optimizer_s = self.pricer.predict(_optimizer_op(layout, trained), dev)
        cast_s = None
        if lowp_recipe(layout.fp8, work.dtype) != "none":
            # the fp8 / NVFP4 copies of the stage's linear weights (and their transposes), cast once per step: TE caches
            # them across the micro-batches of a step (``is_first_microbatch``)
            linear = decoder_params(tb, layout, slow) - bf16_layer_params(tb, layout, slow)
            if linear >= 1.0:  # none when every layer of the stage is kept in bf16 (``Layout.bf16_ranges``)
                cast_s = self.pricer.predict(OpSpec("cast", (int(linear),), "bf16"), dev)
        recast = recast_expert_params(tb, layout, slow)
        recast_s = self.pricer.predict(OpSpec("cast", (int(recast),), "bf16"), dev) if recast >= 1.0 else None
        return SyncTerms(np.array(out).T, dense + expert, zero3, layout.pp, layout.pp_runs,
                          layout.fsdp_impl == "torch", comm_sm_share(dev), optimizer_s, cast_s, recast_s)


class _Scope(NamedTuple):
    """An estimator's caches for one workload's cluster, model, sequence, dtype and LoRA (``GpuEstimator._scoped``)."""

    pipes: dict  # ``_pipeline_part`` per pipeline key
    syncs: dict  # ``_sync_terms`` and ``ShardTable`` s
    works: dict  # ``work_bounds_s``' work and its ``_monotone_comm`` floor per time signature (``_works``)
    per_mb: dict  # ``_per_mb_times`` per time signature
    links: dict  # ``group_links`` per mesh shape (tp, ep, etp, cp, Ulysses CP, dispatcher) and router
    stages: dict  # ``_stage_times`` per (signature, pipeline shape, recompute)


def _optimizer_op(layout: Layout, trained: tuple[float, float]) -> OpSpec:
    """The optimizer step of a stage training ``trained`` (dense, expert) parameters: ZeRO shards dense states over
    dp_shard x cp, expert states over expert-dp."""
    z1 = layout.zero_stage >= 1
    numel = trained[0] / (layout.shard_group.size if z1 else 1) + trained[1] / (layout.expert_shard_group.size if z1
                                                                                 else 1)
    return OpSpec("optimizer", (int(numel),), "fp32")


def _monotone_comm(base: tuple, key: Layout, device) -> float:
    """A layer's exposed comm (``_layer_base``'s fwd+bwd comm) with the expert all-to-all an overlap hides taken at
    the least it can expose, ``ep_sm_share`` of it: what ``recipe_twin_bounds_s`` adds up. Overlapped, a slower op
    hides more of the all-to-all behind it and waits less for the host, so the layer's time may fall as the op
    slows; without the all-to-all's term it cannot (the host wait only fills what the experts leave of it)."""
    comm, ep, ep_cost = base[4], base[7], base[9][1]
    if not (ep and key.moe_overlap):
        return comm
    return comm - ep_cost + 2 * ep * ep_sm_share(device, key)


def _bounds_whole_group(layout: Layout) -> bool:
    """Whether ``group_bound_s`` and ``sync_floor_s`` bound ``layout``'s group: a single-stage pipeline without
    activation offload (with several stages the slowest one, whose sync is exposed, may move with recomputation)."""
    return layout.pp == 1 and not layout.offload_layers


# A stage time and compute long enough to hide every collective that compute can hide (``sync_floor_s``): finite, so
# that a parameter group with no share of the compute multiplies it by 0, not inf
_HIDE_ALL_S = 1e30


# What ``GpuEstimator._spread_s`` reads of a layout, in one call
_spread_fields = operator.attrgetter("pp", "vpp", "pp_runs", "micro_batch", "dp_replicate", "dp_shard", "cp", "tp")


# ``_priced_ops``' sums that add up block by block (``_block_prices``)
_BLOCK_SUMS = ("fwd", "bwd", "bwd_frozen", "column_bwd", "gemm", "gemm_chunked", "gemm_margin")


def _chunk_tp(key: Layout) -> int:
    """The tp chunks tp_overlap splits the GEMMs next to the TP collectives into (1: none)."""
    return key.tp if key.tp > 1 and key.tp_overlap else 1


# Layout fields the gradient sync and the optimizer step never read (``GpuEstimator._sync_terms``' cache key is
# every other field): what one micro-batch runs and how the pipeline schedules it.
_SYNC_FREE = frozenset({"recompute", "recompute_modules", "micro_batch", "sequence_parallel", "attention",
                        "attention_dtype", "pipeline_schedule", "cp_kind", "moe_overlap", "moe_capacity",
                        "moe_imbalance", "moe_dispatcher", "tp_overlap", "pp_overlap", "shared_overlap",
                        "cuda_graphs", "moe_router"})
_SYNC_FIELDS = tuple(f.name for f in fields(Layout) if f.name not in _SYNC_FREE)
_sync_getter = operator.attrgetter(*_SYNC_FIELDS)
_FP8_AT = _SYNC_FIELDS.index("fp8")
_SHARD_AT = tuple(_SYNC_FIELDS.index(f) for f in ("zero_stage", "dp_shard", "dp_replicate"))


def _sync_fields_of(layout: Layout) -> tuple:
    """The sync cache key of ``layout``: its ``_SYNC_FIELDS``, the fp8 recipe reduced to whether one is set. The sync
    reads the recipe only as whether the stage's weights are cast once a step (``lowp_recipe`` against "none", the
    workload dtype fixed per cache scope), so the recipes a search tries share one pricing."""
    vals = _sync_getter(layout)
    return vals[:_FP8_AT] + (vals[_FP8_AT] != "none",) + vals[_FP8_AT + 1:]
