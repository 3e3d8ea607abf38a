"""Why a GPU plan takes the time it does: per stage, compute by op class, exposed communication by collective and
link, bubble, and the efficiency each op class was priced at (``meshplan plan --explain``; the plan's ``explain``).

A stateless analyzer over the GPU estimator's own pieces (``planner.estimate.ops_graph`` op lists priced by the
estimator's
pricer, ``GpuEstimator.layer_times`` for the exposed share of each group's collectives), so its parts add up to the
estimate's: compute by class sums to the stage's compute per step, and the step's parts to ``step_time_s``.
Units: seconds per step, FLOP/s, bytes/s.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace

from meshplan.costmodel import cudnn_dglu, deepep, gdn, hybridep, nvlink_nccl, streaming
from meshplan.costmodel.collectives import collective_time_s
from meshplan.costmodel.sustained import busy_note, sustained_share
from meshplan.planner.estimate.base import Workload, precision_parts, time_key
from meshplan.planner.estimate.gpu import group_links, pp_p2p_s
from meshplan.planner.estimate.host_band import host_speed_band
from meshplan.planner.estimate.host_wait import count_exchange_s, fc2_onward
from meshplan.planner.estimate.ops_graph import embedding_ops, head_ops, layer_ops, mtp_ops
from meshplan.planner.estimate.sustained_band import sustained_band
from meshplan.planner.layout.layout import Layout
from meshplan.planner.model.routing import contiguous_spread, uniform_ranks

# Op classes whose rate is said in bytes moved (the router's top-k too: it does no FLOPs to speak of)
MEMORY_BOUND = ("layernorm", "rmsnorm", "softmax", "elementwise", "activation", "swiglu", "embedding", "copy",
                "cast", "topk", "auxloss")


# What the step still leaves out on the host, said for MoE models, where it is measured to matter (BENCHMARKS.md,
# "The MoE layer's wait for the host, priced"): the wait after the token-count sync is priced (host_wait), the rest
# is not.
HOST_TIME_NOTE = (
    "host time is priced only where an MoE layer waits for it: after each dropless layer's token-count sync, the "
    "eager stretch up to the next sync at the host time NVIDIA's GB200 timeline of DeepSeek-V3 shows (3.45 ms for "
    "the routed experts of a rank holding 8, its grouped linears' 90 us more or less per expert; an x86 host at "
    "181.7/197.4 of Grace's time, PyTorch's op call measured on both in 2026, pytorch issue 187862; a "
    "torch.nn.Linear forward measured in 2025 gave 13.48/37.08, TransformerEngine issue 2053: `host speed` gives the "
    "step at that one), less what the GPU runs meanwhile, which starts no earlier than the host launches it (fc1's "
    "grouped GEMM 1.21 ms into the stretch, fc2's 2.68 ms at 8 experts); an uncaptured router and preprocessing "
    "add 4.0 ms of host beside the layer's other forward GPU work and an uncaptured shared expert what capturing it "
    "saved in the same guide's runs, 0.78 ms (cuda_graphs decides what is eager; the per-expert part is read at 8 "
    "experts a rank and extrapolated). Not priced: the host time of the backward, and what Transformer Engine "
    "releases after 2.9 cut. BENCHMARKS.md keeps the dev set's error by CUDA-graph scope and host")
# NeMo AutoModel's MoE layer (``Layout.moe_impl``): no timeline of it, so no wait is priced (host_wait.waits_for_host)
AUTOMODEL_HOST_NOTE = (
    "host time is not priced: NeMo AutoModel's MoE layer (moe_impl=automodel) syncs on its token counts too, but no "
    "timeline shows the host stretch after it (its experts run as one grouped_gemm call per projection, not "
    "Transformer Engine's GroupedLinear, whose host time meshplan read off Megatron-Core's layer); the step may be "
    "slower than priced by that wait")


def host_note(model, layout: Layout) -> str | None:
    """What the step leaves out of an MoE model's host time (``HOST_TIME_NOTE``, or ``AUTOMODEL_HOST_NOTE`` for NeMo
    AutoModel's MoE layer), else ``None``."""
    if not model.num_experts:
        return None
    return AUTOMODEL_HOST_NOTE if layout.moe_impl == "automodel" else HOST_TIME_NOTE


def op_class(op) -> str:
    """``matmul fp8 (delayed)``, ``grouped matmul bf16``, ``attention bf16 (cudnn)``, ``rmsnorm bf16``: what an op
    is priced as."""
    return ("grouped " if op.groups > 1 else "") + f"{op.kind} {op.dtype}" + (f" ({op.impl})" if op.impl else "")


@dataclass
class _Tally:
    """What ``explain_gpu`` sums over a stage's layers: op class -> seconds on the critical stage, FLOPs or bytes
    done there, one of its ops; and the stage's compute and exposed comm by name."""

    seconds: dict = field(default_factory=lambda: defaultdict(float))
    work_done: dict = field(default_factory=lambda: defaultdict(float))
    first_op: dict = field(default_factory=dict)
    attention_ops: dict = field(default_factory=dict)
    """Op class -> its distinct attention ops (a sliding-window layer and a full one price from different curves)."""
    compute: dict = field(default_factory=lambda: defaultdict(float))
    comm: dict = field(default_factory=lambda: defaultdict(float))

    def new_stage(self) -> None:
        self.compute, self.comm = defaultdict(float), defaultdict(float)


def explain_gpu(estimator, work: Workload, layout: Layout) -> dict:
    """The breakdown of ``estimator.estimate(work, layout)`` (a ``GpuEstimator``), as plain data for YAML/JSON."""
    if layout.mtp and layout.mtp != work.model.num_mtp_layers:  # the MTP modules the estimate prices
        work = replace(work, model=work.model.with_mtp(layout.mtp))
    model, cluster, dev = work.model, work.cluster, work.cluster.device
    est = estimator.estimate(work, layout)
    m = layout.num_microbatches(work.global_batch)
    tb = estimator.tables(model)
    links = dict(zip(("tp", "ep", "cp"), group_links(cluster, model, layout)))
    tally, stages = _Tally(), []
    for st in range(layout.pp):
        tally.new_stage()
        for key, dtype, counts, rec in precision_parts(tb, layout, work.dtype, st):
            for moe, n in counts.items():
                if n:
                    _tally_kind(tally, estimator, work, layout, (key, dtype, moe, n, rec[moe]), links, st == 0)
        key = time_key(layout)
        edges = embedding_ops(model, key, work.seq_len, work.dtype) if st == 0 else ()
        edges += head_ops(model, key, work.seq_len, work.dtype) if st == layout.pp - 1 else ()
        # the multi-token-prediction modules run on the last stage, after its head (``ops_graph.mtp_ops``)
        extra = mtp_ops(model, key, work.seq_len, work.dtype).items() if st == layout.pp - 1 else ()
        for op, runs in [(op, 1) for op in edges] + list(extra):
            tally.compute[op_class(op)] += (estimator.op_time_s(op, dev) + estimator._bwd_s(op, dev)) * runs * m
            tally.first_op.setdefault(op_class(op), op)
        if layout.pp > 1:
            pp_link = cluster.collective_link(*layout.pp_neighbours)
            tally.comm[f"pp sendrecv on {pp_link.name}"] += m * pp_p2p_s(layout, model.hidden_size, work.seq_len,
                                                                         pp_link, sum(tally.compute.values()) / m, dev)
        stages.append({"stage": st, "layers": layout.stage_num_layers(model.num_layers, st),
                       "compute_s": _rounded(tally.compute), "exposed_comm_s": _rounded(tally.comm)})
    efficiency = _efficiency(tally.seconds, tally.work_done, dev)
    slow, step = _step_parts(est, stages)
    out = {"step_time_s": est.step_time_s, "step_s": _rounded(step), "slowest_stage": slow["stage"],
           "stages": stages,
           "efficiency_stage0": {k: {kk: (round(vv, 4) if isinstance(vv, float) else vv) for kk, vv in v.items()}
                                 for k, v in sorted(efficiency.items())}}
    out["priced_from"], notes = _bases(estimator.pricer, dev, tally.first_op, tally.attention_ops)
    for name in sorted({lk.name for lk in links.values() if lk.nodes <= 1 and lk.name in nvlink_nccl.links()}):
        out["priced_from"][f"NCCL collectives on {name}"] = nvlink_nccl.basis(name)
    if layout.moe_fused_mlp and model.num_experts:
        out["priced_from"]["fused grouped MLP backward (dGLU kernel)"] = _dglu_basis(layout, model)
    notes.update(_step_notes(est, model, layout, dev, links["ep"], out["priced_from"]))
    if notes:
        out["unmeasured"] = notes
    band = host_speed_band(estimator, work, layout, est.step_time_s)
    if band:
        out["host_speed"] = band
    band = sustained_band(estimator, work, layout, est.step_time_s)
    if band:
        out["sustained"] = band
    return out


def _tally_kind(tally: _Tally, estimator, work: Workload, layout: Layout, part: tuple, links: dict,
                first_stage: bool) -> None:
    """Add ``part`` = (time key, dtype, layer kind, its layers, those recomputed) of one stage to ``tally``: each
    op's forward and backward (and recompute), and the kind's exposed tp / ep / cp collectives."""
    key, dtype, moe, n, rec = part
    model, dev, tb = work.model, work.cluster.device, estimator.tables(work.model)
    m = layout.num_microbatches(work.global_batch)
    lo = layer_ops(model, tb.rep[moe], key, work.seq_len, dtype)
    selective = tuple(op for mod, ops in lo.modules if mod in key.recomputed_modules for op in ops)
    again = {"full": lo.compute, "selective": selective, "op": lo.op_recompute}.get(layout.recompute_kind, ())
    for op, runs, with_bwd in [(op, n, True) for op in lo.compute] + [(op, rec, False) for op in again]:
        f = estimator.op_time_s(op, dev)
        b = estimator._bwd_s(op, dev) if with_bwd else 0.0
        t = (f + b) * runs * m
        tally.compute[op_class(op)] += t
        if first_stage and t:
            tally.first_op.setdefault(op_class(op), op)
            if op.kind == "attention":
                tally.attention_ops.setdefault(op_class(op), {}).setdefault(op, None)
            tally.seconds[op_class(op)] += t
            amount = op.bytes if op.kind in MEMORY_BOUND else op.flops
            tally.work_done[op_class(op)] += amount * (1 + (b / f if f else 0)) * runs * m
    dglu = estimator._dglu_extra_s(tb, dev, key, lo)  # the fused grouped MLP's dGLU kernel past its GEMM's price
    if dglu:
        cls = op_class(fc2_onward(lo.experts)[0])
        tally.compute[cls] += dglu * n * m
        if first_stage:
            tally.seconds[cls] += dglu * n * m
    times = estimator.layer_times(tb, dev, key, moe, work.seq_len, dtype, links["tp"], links["ep"], links["cp"],
                                  frozen=bool(work.lora))
    for group, pairs, size in (("tp", lo.tp_comm, layout.tp), ("ep", lo.ep_comm, layout.ep),
                               ("cp", lo.cp_comm, layout.cp)):
        if not pairs:
            continue
        raw = {kind: 0.0 for kind, _ in pairs}
        for kind, nbytes in pairs:
            raw[kind] += collective_time_s(kind, nbytes, size, links[group])
        total_raw = sum(raw.values()) or 1.0
        exposed = {"tp": times[5], "ep": times[6], "cp": times[7]}[group]
        for kind, t in raw.items():
            tally.comm[f"{group} {kind} on {links[group].name}"] += exposed * t / total_raw * n * m
    # the forward's wait for the host after the MoE token-count sync (planner.estimate.host_wait), again in a full
    # recompute's forward (exposed communication there, as the estimator books it)
    again_waits = rec if layout.recompute_kind == "full" else 0
    counts = count_exchange_s(layout, model.num_experts, links["ep"], dev) if lo.experts else 0.0
    if times[8] - counts:
        tally.comm["host wait after the MoE token-count sync"] += (times[8] - counts) * (n + again_waits) * m
    if counts:
        tally.comm[f"ep allgather of the token counts on {links['ep'].name}"] += counts * (n + again_waits) * m
    if "moe" in layout.recomputed_modules and rec:
        # a recomputed MoE block (selective) syncs, waits for the host, dispatches and combines again: part of the
        # recompute, as the estimator books it (``layer_times``' recompute)
        tally.compute["recomputed MoE block: host wait after its sync"] += times[8] * rec * m
        tally.compute["recomputed MoE block: ep dispatch and combine"] += times[9] * rec * m
    if layout.recompute_kind == "full" and rec:  # forward collectives again in the recompute
        tally.comm["recomputed forward collectives"] += (times[4] - times[8]) * rec * m


def _step_notes(est, model, layout: Layout, dev, ep_link, priced_from: dict) -> dict[str, str]:
    """What the step's price leaves out beyond its op classes: a waiting GPU's boost, host time (MoE), Hybrid-EP
    and DeepEP on Blackwell outside their measured sizes (whose basis they add to ``priced_from``); the routing a
    contiguous router prices."""
    notes = {}
    waits = busy_note(est.compute_s / est.step_time_s, dev) if est.step_time_s > 0 else None
    if waits:
        notes["sustained load"] = waits
    host = host_note(model, layout)
    if host:
        notes["host time"] = host
    if layout.moe_dispatcher == "hybridep" and layout.ep > 1 and model.num_experts:
        basis, gap = hybridep.explain(layout.ep, ep_link.name.endswith("-a2a"), layout.hybridep_sms)
        priced_from["ep dispatch (hybridep)"] = basis
        if gap:
            notes["ep dispatch (hybridep)"] = gap
    if layout.moe_dispatcher == "deepep" and layout.ep > 1 and model.num_experts and ep_link.name.endswith("-deepep"):
        basis, gap = deepep.explain(layout.ep, dev.name)  # inside one NVLink domain on Blackwell
        if basis:
            priced_from["ep dispatch (deepep)"] = basis
        if gap:
            notes["ep dispatch (deepep)"] = gap
    if layout.moe_fused_mlp:
        priced_from["experts' fused grouped MLP"] = (
            "the grouped GEMMs alone: cuDNN frontend's fused grouped GEMM + activation kernels, timed on GB200 and "
            "GB300 (benchmark/cutedsl_fusion_kernels), run at 0.90-1.09x meshplan's price of the grouped GEMM, so "
            "the activation, the probability scale and fc2's input quantize add nothing (tests/test_fused_moe_mlp.py); "
            "the fused op's host time (Transformer Engine issue 2897) is not priced apart")
    if layout.moe_router == "contiguous" and layout.ep > 1 and layout.moe_dispatcher in ("deepep", "hybridep"):
        k, ep = model.experts_per_token, layout.ep
        ranks = contiguous_spread(model.num_experts, k, ep, 0)[0]
        priced_from["ep routing (contiguous)"] = (
            f"a token's {k} experts on {ranks:.3g} of the {ep} EP ranks, as NeMo AutoModel's fake balanced gate "
            f"routes (experts t*{k} .. t*{k}+{k - 1} for token t; planner.model.routing.contiguous_spread), where a "
            f"trained router's would sit on {uniform_ranks(ep, k, model.num_experts):.3g}: the dispatch sends one copy "
            "per rank, and across nodes one per node, counted the same way")
    return notes


def _efficiency(seconds: dict, work_done: dict, dev) -> dict:
    """Per op class: the rate it was priced at (FLOP/s compute-bound, B/s memory-bound) and its share of peak."""
    efficiency = {}
    for cls, t in seconds.items():
        kind, dtype = cls.split()[:2]
        if not t:
            continue
        if kind in MEMORY_BOUND:
            rate = work_done[cls] / t
            efficiency[cls] = {"achieved": rate, "unit": "B/s", "of_peak": rate / dev.mem_bw_bytes_per_s}
        elif dev.supports(dtype):
            rate = work_done[cls] / t
            efficiency[cls] = {"achieved": rate, "unit": "FLOP/s", "of_peak": rate / dev.peak(dtype)}
    return efficiency


def _step_parts(est, stages: list[dict]) -> tuple[dict, dict]:
    """(the slowest stage, the step split into its parts: that stage's compute and exposed communication, the
    straggler, the gradient sync, the bubble and the optimizer's share)."""
    slow = max(stages, key=lambda x: sum(x["compute_s"].values()) + sum(x["exposed_comm_s"].values()))
    slow_compute, slow_comm = sum(slow["compute_s"].values()), sum(slow["exposed_comm_s"].values())
    step = {"slowest stage compute": slow_compute, "slowest stage exposed comm": slow_comm,
            "slowest of the ranks (straggler)": est.compute_s - slow_compute,
            "gradient sync and overlap cost": est.exposed_comm_s - slow_comm,
            "pipeline bubble": est.bubble_s, "optimizer, fp8 weight casts, FSDP2 copies": est.other_s}
    return slow, step


def _dglu_basis(layout, model) -> str:
    """What the fused grouped MLP's dGLU backward kernel is priced at, under the layout's cuDNN frontend release."""
    multiple = cudnn_dglu.dgrad_multiple(layout.cudnn_frontend, model.expert_bias)
    bias = "with fc1's bias gradient" if model.expert_bias else "without a bias gradient"
    return (f"fc2's input-gradient grouped GEMM x {multiple:.3f}, cuDNN frontend {layout.cudnn_frontend} {bias}: "
            f"{cudnn_dglu.SOURCE}")


# FlashAttention-4 (Dao et al. 2026; together.ai/blog/flashattention-4): up to 1,613 TFLOP/s forward in BF16 on a B200
# (71% of peak), 1.3x cuDNN 9.13: one peak, no curve over sequence length, so it does not price anything here.
FA4_NOTE = "FlashAttention-4 reports only a peak (1,613 TFLOP/s forward, B200 BF16, 1.3x cuDNN 9.13), no curve"


def _bases(pricer, dev, first_op: dict, attention_ops: dict) -> tuple[dict[str, str], dict[str, str]]:
    """(op class -> what its price rests on, op class -> why no measurement backs it on ``dev``); the sustained-load
    share, which scales every tensor-core op, is a row of its own."""
    priced_from = {cls: pricer.basis(op, dev) for cls, op in sorted(first_op.items())}
    share, share_source = sustained_share(dev)
    priced_from["tensor-core ops, sustained load"] = share_source
    notes = unmeasured(pricer, dev, first_op, attention_ops)
    if share == 1.0:
        notes["sustained load"] = share_source
    notes.update({cls: f"{pricer.predict_with_source(op, dev)[1]}" for cls, op in first_op.items()
                  if op.kind == "ssd" and cls not in notes})
    notes.update({cls: gdn.unmeasured(dev) for cls, op in first_op.items() if op.kind == "gdn" and cls not in notes})
    return priced_from, notes


def unmeasured(pricer, dev, first_op: dict, attention_ops: dict | None = None) -> dict[str, str]:
    """Op class -> how it was priced, for the classes no published measurement on ``dev`` backs (the caller adds the
    Mamba-2 SSD scan and Gated DeltaNet's on every device: ``costmodel.api.SSD_SOURCE``, ``costmodel.gdn``): every
    class on the block-scaled (Blackwell) parts, whose kernels reach the cost model through no measured row: fused
    attention (FlashAttention; cuDNN where its published GB200 / GB300 curve stands in for another part or head dim),
    the GEMMs (bf16, and MXFP8 / NVFP4, the routed experts' grouped GEMMs among them; their level set by OpenXLA's
    measured B200 / H100 ratio, ``costmodel.xla_gemm``, their shape dependence the model's) and the memory-bound
    kernels. ``attention_ops``: each attention class's distinct ops, the first unmeasured one noted (GPT-OSS's window
    layers have a measured curve, its full layers at head dim 64 do not). Empty for every other device."""
    if not dev.supports("mxfp8"):
        return {}
    out = {}
    for cls, op in sorted(first_op.items()):
        if op.kind == "gdn":  # Gated DeltaNet's own note, on every part (``costmodel.gdn.unmeasured``)
            continue
        if op.kind == "attention":
            op = next((o for o in (attention_ops or {}).get(cls, ()) if _attention_unmeasured(pricer, dev, o)), op)
        source = pricer.predict_with_source(op, dev)[1]
        if streaming.FLOOR_WORDS in source:  # priced at the streaming rate measured on this part
            continue
        if source.startswith("learned") and "unseen" not in source:
            source = source.replace("learned", "learned model trained on other GPUs, extrapolated by device "
                                    "features", 1)
        what = f"no published measurement on {dev.name}: {source}"
        if op.kind == "attention" and source.startswith("published"):
            if not _attention_unmeasured(pricer, dev, op):
                continue
            what = f"measured for another part or head dim: {source}"
        elif op.kind == "attention":
            what += f"; {FA4_NOTE}"
        elif op.kind == "matmul" and "OpenXLA measured" in source:
            # costmodel.xla_gemm: a measured ratio to the H100 sets the level, the model the shape dependence
            what = f"extrapolated by the model from other GPUs, set to a measured B200 / H100 ratio: {source}"
            if op.dtype in ("fp8", "nvfp4"):
                what += f" ({op.impl or op.dtype} GEMMs, grouped expert GEMMs included, priced from their bf16 twin)"
        elif op.dtype in ("fp8", "nvfp4") and op.kind in ("matmul", "bmm"):
            what += f" ({op.impl or op.dtype} GEMMs, grouped expert GEMMs included, priced from their bf16 twin)"
        out[cls] = what
    return out


def _attention_unmeasured(pricer, dev, op) -> bool:
    """Whether no measurement on ``dev`` backs fused-attention ``op``: cuDNN's own GB200 / GB300 times
    (``costmodel.attention``) and FlashAttention-2's on B200, GB200 and GB300 (``costmodel.flash2_blackwell``) back it
    unless the curve stands in for another part (scaled), head dim or mask; any other source is unmeasured."""
    source = pricer.predict_with_source(op, dev)[1]
    if not source.startswith("published"):
        return True
    return any(words in source for words in ("scaled by", "no head-dim", "no unmasked", "priced at the measured"))


def _rounded(d: dict) -> dict:
    return {k: round(v, 6) for k, v in sorted(d.items(), key=lambda kv: -kv[1]) if v > 0}
