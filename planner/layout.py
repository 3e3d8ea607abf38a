"""``Degrees`` and ``Layout``: one candidate placement of a model on a cluster, its mesh arithmetic and validation.

In the spirit of torchtitan's ``parallel_dims.py``: every divisibility rule, group stride and rank group lives
here, and every error prints the numbers involved. Rank order (fastest-varying first) follows Megatron-LM: tp,
cp, dp (dp_shard inside dp_replicate), pp — so a TP group is contiguous ranks, a CP group has stride tp, a DP group
stride tp*cp and PP neighbours are tp*cp*dp apart. Expert parallelism borrows its ranks from dp_shard * cp
(torchtitan) with stride tp.

``Degrees`` is the one degrees type: ``Plan.degrees`` holds one, a ``Layout`` is one (plus the other decisions),
and ``meshplan plan --fix`` pins its fields (``planner.space.Pins``).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Annotated, NamedTuple

from pydantic import ConfigDict, Field

from meshplan.core.errors import MeshplanError
from meshplan.planner.schedules import check_schedule

RECOMPUTE = ("none", "selective", "full", "op")  # plus "full:N" (``recompute_layers``)
# "flash": the stack's fused attention (Megatron/TE: cuDNN; torchtitan and eager: SDPA's FlashAttention-2), or a
# named kernel (costmodel.attention); "unfused": materialised scores (Megatron-LM 2021)
ATTENTION = ("flash", "flash2", "flash3", "cudnn", "flex", "unfused")
FP8_RECIPES = ("none", "tensorwise", "delayed", "blockwise", "mxfp8")
CP_KINDS = ("ring", "allgather", "a2a")
STACKS = ("megatron", "torchtitan", "eager")
MOE_DISPATCHERS = ("alltoall", "deepep")
OPTIM_DTYPES = ("fp32", "remainder", "bf16")
GRAD_DTYPES = ("bf16", "fp32")
FSDP_IMPLS = ("torch", "megatron")
REDUCE_DTYPES = ("bf16", "fp32")
DEGREE_NAMES = ("dp_replicate", "dp_shard", "tp", "pp", "vpp", "cp", "ep")
_Degree = Annotated[int, Field(ge=1)]  # validated where a plan file is read (pydantic), checked by ``validate``


class MeshGroup(NamedTuple):
    """A collective's group: ``size`` ranks, ``stride`` apart (``ClusterSpec.collective_link(*group)``)."""

    size: int
    stride: int


@dataclass(frozen=True)
class Degrees:
    """Parallel degrees (torchtitan's ``ParallelDims`` naming). ``vpp`` = virtual pipeline chunks per rank.

    world = dp_replicate * dp_shard * cp * tp * pp; ep borrows from dp_shard * cp (expert layers only).
    """

    __pydantic_config__ = ConfigDict(extra="forbid")  # a plan file's unknown degree is an error

    dp_replicate: _Degree = 1
    dp_shard: _Degree = 1
    tp: _Degree = 1
    pp: _Degree = 1
    vpp: _Degree = 1
    cp: _Degree = 1
    ep: _Degree = 1

    @property
    def dp(self) -> int:
        """Total data-parallel degree (replicate x shard)."""
        return self.dp_replicate * self.dp_shard

    @property
    def world_size(self) -> int:
        return self.dp_replicate * self.dp_shard * self.cp * self.tp * self.pp

    @property
    def degrees(self) -> "Degrees":
        """The degrees alone (a ``Layout`` without its other decisions), e.g. for ``Plan.degrees``."""
        return Degrees(**{n: getattr(self, n) for n in DEGREE_NAMES})

    # ---- rank strides (Megatron order tp -> cp -> dp_shard -> dp_replicate -> pp) ----
    @property
    def cp_stride(self) -> int:
        return self.tp

    @property
    def dp_stride(self) -> int:
        return self.tp * self.cp

    @property
    def pp_stride(self) -> int:
        return self.tp * self.cp * self.dp

    # ---- the groups collectives run over ----
    @property
    def tp_group(self) -> MeshGroup:
        """Tensor parallelism: contiguous ranks."""
        return MeshGroup(self.tp, 1)

    @property
    def cp_group(self) -> MeshGroup:
        """Context parallelism: the KV ring."""
        return MeshGroup(self.cp, self.cp_stride)

    @property
    def ep_group(self) -> MeshGroup:
        """Expert parallelism: ranks borrowed from dp_shard * cp, next to each other after tp."""
        return MeshGroup(self.ep, self.tp)

    @property
    def grad_group(self) -> MeshGroup:
        """Gradient synchronisation without sharding: every data-parallel and context-parallel replica."""
        return MeshGroup(self.dp * self.cp, self.tp)

    @property
    def shard_group(self) -> MeshGroup:
        """ZeRO / FSDP sharding: dp_shard x cp (torchtitan shards over both)."""
        return MeshGroup(self.dp_shard * self.cp, self.tp)

    @property
    def replicate_group(self) -> MeshGroup:
        """HSDP / plain DP replicas of one shard."""
        return MeshGroup(self.dp_replicate, self.tp * self.cp * self.dp_shard)

    @property
    def dp_group(self) -> MeshGroup:
        """Data parallelism (replicate x shard), the same model shard everywhere."""
        return MeshGroup(self.dp, self.dp_stride)

    @property
    def pp_group(self) -> MeshGroup:
        """The pipeline's stages of one model replica."""
        return MeshGroup(self.pp, self.pp_stride)

    @property
    def pp_neighbours(self) -> MeshGroup:
        """Two adjacent pipeline stages (a point-to-point send/recv)."""
        return MeshGroup(2, self.pp_stride)

    def rank_groups(self, group: MeshGroup) -> list[tuple[int, ...]]:
        """Every group of ranks a collective over ``group`` (one of the properties above) runs in, rank-sorted.

        Rank ``r`` belongs to the group starting at the lowest rank that differs from ``r`` only in the group's own
        coordinate: ``r - ((r // stride) % size) * stride``.
        """
        size, stride = group
        out: dict[int, list[int]] = {}
        for r in range(self.world_size):
            first = r - ((r // stride) % size) * stride
            out.setdefault(first, []).append(r)
        return [tuple(v) for _, v in sorted(out.items())]


def fsdp_impl(fsdp: str, stack: str) -> str:
    """The ZeRO-3 implementation a layout or plan runs: ``fsdp`` where pinned, else the stack's own (Megatron-FSDP
    under Megatron-Core, torch FSDP2 ``fully_shard`` under torchtitan and plain PyTorch)."""
    return fsdp or ("megatron" if stack == "megatron" else "torch")


def reduce_dtype_of(reduce_dtype: str, stack: str) -> str:
    """The dtype a layout or plan reduces its gradients in over the data-parallel wire: ``reduce_dtype`` where
    pinned, "fp32" under torchtitan (its only choice: ``training.mixed_precision_reduce: Literal["float32"]``,
    ``torchtitan/config/job_config.py`` @ 0.2.2, which FSDP2's ``MixedPrecisionPolicy.reduce_dtype`` and its DDP
    path both follow), else "" = the gradient buffer's own dtype (``memory.grad_bytes_per_param``)."""
    return reduce_dtype or ("fp32" if stack == "torchtitan" else "")


def p2p_overlapped(pp_overlap: bool | None, stack: str, pp: int, schedule: str) -> bool:
    """Whether a pipeline's sends/receives overlap compute: ``pp_overlap`` where pinned, else the stack's own
    (Megatron-LM overlaps them in the interleaved schedule, ``overlap_p2p_comm`` on by default; other stacks wait
    for them in line). The one rule ``Layout`` and the exporters read."""
    if pp == 1:
        return False
    if pp_overlap is not None:
        return pp_overlap
    return stack == "megatron" and schedule == "interleaved"


@dataclass(frozen=True)
class Layout(Degrees):
    """Every decision of a homogeneous plan: the degrees and the rest.

    Attributes:
        dp_replicate, dp_shard, tp, pp, vpp, cp, ep: parallel degrees (``Degrees``).
        micro_batch: sequences per micro-batch per data-parallel rank.
        zero_stage: 0-3 over the dp_shard group (3 = FSDP full shard). 0 requires dp_shard == 1.
        recompute: "none", "selective" (core attention, Korthikanti et al. 2022) or "full".
        sequence_parallel: Megatron SP (norms/dropout sharded over TP); needs tp > 1.
        attention: "flash" (the stack's fused attention kernel, no s x s scores stored: cuDNN through Transformer
            Engine for megatron, PyTorch SDPA's FlashAttention-2 for torchtitan and eager), a named fused kernel
            ("flash2", "flash3", "cudnn", "flex"), or "unfused" (materialised scores, as in Megatron-LM 2021: fused
            scale-mask-softmax, separate dropout).
        pp_layout: decoder layers per pipeline stage, first to last (() = pp divides the layers evenly).
            Megatron-LM ``--decoder-first/last-pipeline-num-layers`` or ``--pipeline-model-parallel-layout``:
            Llama 3.1 405B ran 126 layers on 16 stages (Llama 3 paper, Table 4), so stages cannot all be equal.
            With vpp > 1: pp * vpp virtual stages in model-depth order (``stage_chunks``), as Megatron-LM's layout.
        pipeline_schedule: "" = 1F1B (interleaved when vpp > 1), or "zbh1", "dualpipe" (``planner.schedules``).
        etp: expert tensor parallelism (Megatron-Core ``--expert-tensor-parallel-size``); 0 = the dense tp. With
            MoE parallel folding (Liu et al. 2025, "MoE Parallel Folding", Megatron-Core) the expert mesh
            etp x ep x edp is laid over the same tp x cp x dp ranks of a stage independently of the dense mesh:
            ep x etp need only divide tp x cp x dp (Qwen3-235B ran EP32 over 16 data-parallel ranks x TP2).
        fp8: the fp8 recipe of the decoder's linear GEMMs ("none" = all math in the workload's dtype):
            "tensorwise" (Transformer Engine current scaling), "delayed" (TE DelayedScaling, amax history),
            "blockwise" (DeepSeek-V3 §3.3.2: 1x128 activation tiles, 128x128 weight blocks), "mxfp8" (OCP MX,
            32-element blocks, Blackwell tensor cores only).
        cp_kind: context-parallel attention: "ring" (p2p KV exchange overlapped with the attention blocks,
            Megatron-Core/TE ``p2p``), "allgather" (KV all-gathered before attention, Llama 3 paper §3.3.2;
            torch ``context_parallel`` allgather rotation), "a2a" (DeepSpeed-Ulysses all-to-all over heads).
        stack: the kernel set that runs (the parallelism is the other decisions'): "megatron" (Transformer
            Engine's fused kernels: norms, SwiGLU, cuDNN attention, vocab-parallel cross-entropy; Megatron-Core,
            NeMo, AutoModel's TE backend), "torchtitan" (torch.compile per block, SDPA attention, PyTorch
            cross-entropy), "eager" (HF / plain PyTorch code: unfused norms, activations and residuals, one kernel
            per op).
        moe_overlap: the expert all-to-alls overlapped with computation (MegaScale-MoE §4, Comet; DeepSeek-V3
            DualPipe's forward/backward chunk pairing), instead of sitting on the critical path.
        tp_overlap: tensor-parallel collectives overlapped with the GEMMs that produce or consume them (Megatron-Core
            ``--tp-comm-overlap``, Transformer Engine userbuffers; torchtitan's async tensor parallelism): the
            all-gather before a column-parallel GEMM and the reduce-scatter after a row-parallel one run in chunks
            under it. Needs sequence parallelism.
        moe_dispatcher: how routed tokens travel: "alltoall" (NCCL all-to-all, one copy per routed expert; Megatron's
            alltoall dispatcher) or "deepep" (DeepEP: one copy per destination node over the NICs, forwarded to its
            experts over NVLink; Megatron ``--moe-token-dispatcher-type flex --moe-enable-deepep``).
        moe_capacity: token-dropping capacity factor (each expert takes at most capacity x its balanced share,
            padded to it); 0 = dropless routing.
        moe_imbalance: dropless routing: tokens of the busiest local expert group over the balanced share
            (1.0 = perfectly balanced, as the dev set's "fake balanced gate" runs).
        optim_dtype: what Adam keeps per parameter beside the 16-bit weights: "fp32" (fp32 master weights and
            moments, 12 B: the ZeRO paper's K = 12; Megatron's distributed optimizer, DeepSpeed, FSDP), "remainder"
            (fp32 moments and only the 16 low bits of each fp32 master weight, whose high 16 bits are the bf16
            weight itself, 10 B: apex ``DistributedFusedAdam(store_param_remainders=True)``, which NeMo picks for
            bf16 O2 models (``megatron_base_model.py`` @ r2.0.0rc1); Megatron-Core's precision-aware optimizer on
            Transformer Engine >= 2.1) or "bf16" (bf16 moments and the bf16 weights as their own master, 4 B: apex
            with ``dtype=bf16``, as NeMo's ``optim.dtype: bf16`` confs run it).
        grad_dtype: the gradients' buffer, and the dtype they are reduced in unless ``reduce_dtype`` or the stack sets
            another (torchtitan: fp32): "bf16" (2 B per parameter) or "fp32"
            (4 B and twice the data-parallel traffic; apex's ``grad_sync_dtype`` fp32); "" = the stack's own
            (``memory.grad_bytes_per_param``): Megatron-Core keeps fp32 main-grad buffers and reduces in fp32 for
            bf16 and fp8 runs outside FSDP (Megatron-LM ``arguments.py``: "bfloat16 requires gradient accumulation
            and all-reduce to be done in fp32", unless ``--grad-reduce-in-bf16``); otherwise the ZeRO paper's 2 B
            (PyTorch DDP/FSDP2 keep fp32 weights and gradients and fp32 moments only: the same 16 B in total).
        pp_runs: pipeline schedule runs per optimizer step, the step's micro-batches split evenly over them. 1 =
            Megatron-Core and torchtitan: one schedule over all of a step's micro-batches; AutoModel accumulates
            gradients over ``global / (local_batch_size * dp)`` runs of its schedule (``recipes/llm/benchmark.py``
            GA loop, each calling ``schedule.step``), each run filling and draining the pipeline again.
        pp_overlap: the pipeline's activation and gradient sends/receives overlapped with the next chunk's compute
            (Megatron-Core ``overlap_p2p_comm``: isend/irecv posted before a chunk's compute and waited for after
            it, ``pipeline_parallel/schedules.py`` interleaved schedule) instead of waited for in line. ``None`` = the
            stack's own (``p2p_overlapped``): Megatron-LM's training CLI overlaps them wherever the schedule is
            interleaved (``--no-overlap-p2p-communication`` is the opt-out, ``arguments.py``; it forces the flag off
            for the non-interleaved 1F1B, whose schedule never reads it); NeMo's confs set
            ``overlap_p2p_comm`` per model (default False); other stacks wait for each receive in line. Priced by the
            GPU estimator; ``local:N`` (CPU, gloo) plans keep the sends in line, as gloo's transfers run on the
            cores the compute needs.
        shared_overlap: an MoE layer's shared experts run on a side stream during the routed tokens' dispatch and
            combine (Megatron-Core ``--moe-shared-expert-overlap``, default off, alltoall dispatcher only; NeMo
            AutoModel always: ``components/moe/layers.py`` @ 89e3a9fdd, "Execute shared experts in a separate stream
            to overlap compute with the communication for grouped experts"). Priced in the forward (and its
            recompute), where both implementations issue the shared experts before the dispatch; their backward
            is left in line. GPU estimator only (no side streams on ``local:N``).
        fsdp: the ZeRO-3 implementation, "" = the stack's own (``fsdp_impl``): "torch" (FSDP2 ``fully_shard``, what
            torchtitan, AutoModel and plain PyTorch run) copies every gathered parameter out of the all-gather
            buffer into the unsharded parameters and every gradient into the reduce-scatter buffer on the compute
            stream (torch ``_fully_shard/_fsdp_collectives.py``: ``foreach_all_gather_copy_out`` runs
            ``split_with_sizes_copy``, ``foreach_reduce`` runs ``chunk_cat``); "megatron" (Megatron-FSDP, what the
            Megatron export launches for zero 3) gathers into and reduces from persistent buffers the parameters
            and gradients are views of, so no copy runs.
        reduce_dtype: the dtype the data-parallel gradient reduction runs in on the wire, apart from the buffer the
            gradients are kept in (``grad_dtype``): FSDP2's ``MixedPrecisionPolicy(reduce_dtype=...)`` casts each
            bf16 gradient up into an fp32 reduce-scatter buffer and keeps the reduced shard in the parameter's own
            dtype (torch ``_fully_shard/_fsdp_collectives.py`` ``foreach_reduce``); DeepSpeed's
            ``communication_data_type``. "" = the stack's own (``reduce_dtype_of``): fp32 under torchtitan (its
            only option), else the gradient buffer's dtype (Megatron-Core reduces its main-grad buffer as is).
            Doubles the reduce-scatter / all-reduce bytes and FSDP2's gradient copy-in writes at fp32.
    """

    micro_batch: int = 1
    zero_stage: int = 0
    recompute: str = "none"
    sequence_parallel: bool = False
    attention: str = "flash"
    pp_layout: tuple[int, ...] = ()
    pipeline_schedule: str = ""
    etp: int = 0
    fp8: str = "none"
    cp_kind: str = "ring"
    stack: str = "megatron"
    moe_overlap: bool = False
    moe_capacity: float = 0.0
    moe_imbalance: float = 1.0
    moe_dispatcher: str = "alltoall"
    tp_overlap: bool = False
    optim_dtype: str = "fp32"
    grad_dtype: str = ""
    pp_runs: int = 1
    pp_overlap: bool | None = None
    shared_overlap: bool = False
    fsdp: str = ""
    reduce_dtype: str = ""

    @classmethod
    def of(cls, degrees: Degrees, **decisions) -> "Layout":
        """The layout with ``degrees`` and the other decisions given by name."""
        return cls(**{n: getattr(degrees, n) for n in DEGREE_NAMES}, **decisions)

    @property
    def fsdp_impl(self) -> str:
        """The ZeRO-3 implementation that runs (``fsdp``, or the stack's own: ``fsdp_impl``)."""
        return fsdp_impl(self.fsdp, self.stack)

    @property
    def reduce_dtype_priced(self) -> str:
        """The gradient reduction's wire dtype (``reduce_dtype``, or the stack's own; "" = the buffer's)."""
        return reduce_dtype_of(self.reduce_dtype, self.stack)

    @property
    def p2p_overlapped(self) -> bool:
        """Whether the pipeline sends/receives overlap compute (``pp_overlap``, or the stack's own default)."""
        return p2p_overlapped(self.pp_overlap, self.stack, self.pp, self.schedule)

    @property
    def expert_tp(self) -> int:
        """Expert tensor parallelism in effect (``etp``, or the dense tp when 0)."""
        return self.etp or self.tp

    @property
    def ep_group(self) -> MeshGroup:
        """Expert parallelism: Megatron-Core's expert rank order is etp fastest, then ep, then expert-dp, over
        the tp x cp x dp ranks of a stage, so the EP group has stride etp (= tp without folding)."""
        return MeshGroup(self.ep, self.expert_tp)

    @property
    def expert_dp(self) -> int:
        """Expert data parallelism: the stage's tp x cp x dp ranks over etp x ep."""
        return max(1, self.tp * self.cp * self.dp // (self.ep * self.expert_tp))

    @property
    def expert_shard_group(self) -> MeshGroup:
        """ZeRO / FSDP sharding of expert states: the part of expert-dp inside dp_shard x cp x tp."""
        return MeshGroup(max(1, self.dp_shard * self.cp * self.tp // (self.ep * self.expert_tp)),
                         self.ep * self.expert_tp)

    @property
    def recompute_kind(self) -> str:
        """``none``, ``selective``, ``full`` (all layers or ``full:N``) or ``op``."""
        return self.recompute.split(":", 1)[0]

    @property
    def recompute_layers(self) -> int:
        """``full:N``: layers fully recomputed per stage (per chunk when interleaved); 0 = every layer."""
        head, _, n = self.recompute.partition(":")
        return int(n) if head == "full" and n else 0

    def stage_chunks(self, num_layers: int, stage: int) -> tuple[range, ...]:
        """The decoder layers pipeline rank ``stage`` holds, one range per virtual chunk.

        Virtual stage ``v * pp + stage`` is chunk ``v`` of rank ``stage`` (Megatron-LM's interleaved order, model
        depth = virtual stage order); ``pp_layout`` holds pp * vpp entries in that order when vpp > 1.
        """
        n = self.pp * self.vpp
        sizes = self.pp_layout or (num_layers // n,) * n
        starts = [0]
        for k in sizes[:-1]:
            starts.append(starts[-1] + k)
        return tuple(range(starts[v * self.pp + stage], starts[v * self.pp + stage] + sizes[v * self.pp + stage])
                     for v in range(self.vpp))

    def stage_num_layers(self, num_layers: int, stage: int) -> int:
        return sum(len(r) for r in self.stage_chunks(num_layers, stage))

    @property
    def schedule(self) -> str:
        if self.pipeline_schedule:
            return self.pipeline_schedule
        return "interleaved" if self.vpp > 1 else "1f1b"

    def num_microbatches(self, global_batch: int) -> int:
        return global_batch // (self.micro_batch * self.dp)

    def with_(self, **kw) -> "Layout":
        return replace(self, **kw)

    def validate(self, *, world_size: int, num_layers: int, num_heads: int, num_kv_heads: int,
                 seq_len: int, global_batch: int, num_experts: int = 0) -> None:
        """Raise ``MeshplanError`` naming the first rule this layout breaks, with the numbers."""
        for name in (*DEGREE_NAMES, "micro_batch"):
            if getattr(self, name) < 1:
                raise MeshplanError(f"{name}={getattr(self, name)} must be >= 1")
        if self.world_size != world_size:
            raise MeshplanError(
                f"dp_replicate({self.dp_replicate}) * dp_shard({self.dp_shard}) * cp({self.cp}) * tp({self.tp}) "
                f"* pp({self.pp}) = {self.world_size} != cluster world size {world_size}")
        if num_heads % self.tp:
            raise MeshplanError(f"tp={self.tp} does not divide the {num_heads} attention heads")
        if num_kv_heads % self.tp and self.tp % num_kv_heads:
            raise MeshplanError(f"tp={self.tp} and the {num_kv_heads} KV heads: neither divides the other")
        if self.pp_layout:
            n = self.pp * self.vpp
            if len(self.pp_layout) != n or min(self.pp_layout) < 1 or sum(self.pp_layout) != num_layers:
                what = f"pp={self.pp} stages" if self.vpp == 1 else f"pp*vpp = {n} virtual stages"
                raise MeshplanError(f"pp_layout {format_pp_layout(self.pp_layout)}: needs {what} of >= 1 layer "
                                    f"adding up to the {num_layers} layers (sum {sum(self.pp_layout)}, "
                                    f"{len(self.pp_layout)} stages)")
        elif num_layers % self.pp:
            raise MeshplanError(f"pp={self.pp} does not divide the {num_layers} layers (give the layers per stage: "
                                f"--fix pp_layout=..., e.g. {format_pp_layout(balanced_split(num_layers, self.pp))})")
        if self.vpp > 1:
            if self.pp == 1:
                raise MeshplanError(f"vpp={self.vpp} needs pipeline parallelism (pp=1)")
            if not self.pp_layout and num_layers % (self.pp * self.vpp):
                raise MeshplanError(
                    f"pp({self.pp}) * vpp({self.vpp}) = {self.pp * self.vpp} does not divide the {num_layers} layers")
        if self.pp > 1 or self.pipeline_schedule:
            check_schedule(self.schedule, self.pp, self.vpp)
        m = self.num_microbatches(global_batch)
        if self.pp_runs < 1 or m % self.pp_runs:
            raise MeshplanError(f"pp_runs={self.pp_runs} must divide the {m} micro-batches of a step "
                                f"(global batch {global_batch} / (mbs {self.micro_batch} * dp {self.dp}))")
        if self.pp_overlap and (self.pp == 1 or (self.stack == "megatron" and self.vpp == 1)):
            raise MeshplanError(f"pp_overlap overlaps the pipeline's sends with the next chunk's compute: it needs "
                                f"pp > 1, and under Megatron an interleaved pipeline (Megatron-Core reads "
                                f"overlap_p2p_comm only there; pp={self.pp}, vpp={self.vpp})")
        if self.fsdp and self.fsdp not in FSDP_IMPLS:
            raise MeshplanError(f"fsdp '{self.fsdp}' is not one of {', '.join(FSDP_IMPLS)}")
        if self.reduce_dtype and self.reduce_dtype not in REDUCE_DTYPES:
            raise MeshplanError(f"reduce_dtype '{self.reduce_dtype}' is not one of {', '.join(REDUCE_DTYPES)}")
        if self.shared_overlap and self.moe_overlap:
            raise MeshplanError("shared_overlap and moe_overlap both hide the expert all-to-alls behind other work: "
                                "pick one (Megatron-Core asserts against the pair)")
        if self.pp_runs > 1 and self.pp == 1:
            raise MeshplanError(f"pp_runs={self.pp_runs} needs pipeline parallelism (pp=1)")
        if seq_len % (2 * self.cp) and self.cp > 1:
            raise MeshplanError(f"cp={self.cp}: seq_len {seq_len} must be divisible by 2*cp={2 * self.cp} "
                                "(load-balanced causal context parallelism)")
        if self.ep > 1 or self.etp:
            if num_experts == 0:
                raise MeshplanError(f"ep={self.ep}, etp={self.etp} but the model has no experts")
            if num_experts % self.ep:
                raise MeshplanError(f"ep={self.ep} does not divide the {num_experts} experts")
            dense = self.tp * self.cp * self.dp
            if self.etp < 0 or dense % (self.ep * self.expert_tp):
                raise MeshplanError(f"ep({self.ep}) * etp({self.expert_tp}) = {self.ep * self.expert_tp} must "
                                    f"divide tp*cp*dp = {self.tp}*{self.cp}*{self.dp} = {dense} (the expert mesh "
                                    "folds over a stage's ranks)")
        if self.fp8 not in FP8_RECIPES:
            raise MeshplanError(f"fp8 '{self.fp8}' is not one of {', '.join(FP8_RECIPES)}")
        if self.cp_kind not in CP_KINDS:
            raise MeshplanError(f"cp_kind '{self.cp_kind}' is not one of {', '.join(CP_KINDS)}")
        if self.cp_kind == "a2a" and self.cp > 1 and (num_heads // self.tp) % self.cp:
            raise MeshplanError(f"cp_kind a2a (Ulysses) splits heads: cp={self.cp} must divide the "
                                f"{num_heads // self.tp} heads per tp rank ({num_heads} heads / tp={self.tp})")
        if self.stack not in STACKS:
            raise MeshplanError(f"stack '{self.stack}' is not one of {', '.join(STACKS)}")
        if self.optim_dtype not in OPTIM_DTYPES:
            raise MeshplanError(f"optim_dtype '{self.optim_dtype}' is not one of {', '.join(OPTIM_DTYPES)}")
        if self.grad_dtype and self.grad_dtype not in GRAD_DTYPES:
            raise MeshplanError(f"grad_dtype '{self.grad_dtype}' is not one of {', '.join(GRAD_DTYPES)}")
        if self.moe_dispatcher not in MOE_DISPATCHERS:
            raise MeshplanError(f"moe_dispatcher '{self.moe_dispatcher}' is not one of {', '.join(MOE_DISPATCHERS)}")
        if self.moe_capacity < 0 or not 1.0 <= self.moe_imbalance <= 64.0:
            raise MeshplanError(f"moe_capacity {self.moe_capacity} must be >= 0 (0 = dropless) and "
                                f"moe_imbalance {self.moe_imbalance} within [1, 64]")
        if self.zero_stage not in (0, 1, 2, 3):
            raise MeshplanError(f"zero stage {self.zero_stage} is not one of 0, 1, 2, 3")
        if self.zero_stage == 0 and self.dp_shard > 1:
            raise MeshplanError(f"dp_shard={self.dp_shard} shards states, which needs zero stage 1-3 (got 0)")
        if self.recompute_kind not in RECOMPUTE or (":" in self.recompute and not re.fullmatch(
                r"full:[1-9]\d*", self.recompute)):
            raise MeshplanError(f"recompute '{self.recompute}' is not one of {', '.join(RECOMPUTE)} or full:N")
        if self.recompute_layers:
            per_chunk = min(self.pp_layout) if self.pp_layout else num_layers // (self.pp * self.vpp)
            if self.recompute_layers > per_chunk:
                raise MeshplanError(f"recompute full:{self.recompute_layers}: a pipeline chunk holds only "
                                    f"{per_chunk} layers (pp={self.pp}, vpp={self.vpp})")
        if self.attention not in ATTENTION:
            raise MeshplanError(f"attention '{self.attention}' is not one of {', '.join(ATTENTION)}")
        if self.sequence_parallel and self.tp == 1:
            raise MeshplanError("sequence parallel needs tp > 1")
        if self.tp_overlap and not self.sequence_parallel:
            raise MeshplanError(f"tp_overlap overlaps sequence parallelism's all-gather/reduce-scatter: needs sp "
                                f"(tp={self.tp})")
        per_step = self.micro_batch * self.dp
        if global_batch % per_step:
            raise MeshplanError(
                f"global batch {global_batch} is not divisible by micro_batch({self.micro_batch}) * dp({self.dp}) "
                f"= {per_step}")
        m = global_batch // per_step
        if self.vpp > 1 and m % self.pp:
            raise MeshplanError(f"interleaved schedule: {m} micro-batches must be a multiple of pp={self.pp}")



def balanced_split(num_layers: int, pp: int, first_extra: float = 1.0, last_extra: float = 1.0) -> tuple[int, ...]:
    """Decoder layers per stage so the heaviest stage is as light as it can be, when the first stage also carries
    ``first_extra`` and the last ``last_extra`` layer-equivalents of work (embedding; output layer and loss).

    The default (one layer-equivalent each) is Megatron-LM's ``--account-for-embedding-in-pipeline-split
    --account-for-loss-in-pipeline-split`` ("the input embedding layer will be treated as a standard transformer
    layer in the context of partition and placement"): Llama 3.1 405B's 126 layers on 16 stages become
    E+7 | 8 x 14 | 7+L. Ties go to lighter first and last stages.
    """
    if pp < 1 or num_layers < pp:
        raise MeshplanError(f"pp={pp}: needs at least one of the {num_layers} layers per stage")
    extra = [0.0] * pp
    extra[0] += first_extra
    extra[-1] += last_extra

    def capacity(load: float) -> list[int]:
        return [max(1, int(math.floor(load - e + 1e-9))) for e in extra]

    lo, hi = num_layers / pp, num_layers / pp + max(extra) + 1
    for _ in range(60):  # bisect the heaviest load until the capacities just hold every layer
        mid = (lo + hi) / 2
        if sum(capacity(mid)) >= num_layers:
            hi = mid
        else:
            lo = mid
    cap = capacity(hi)
    over = sum(cap) - num_layers
    # give back the surplus from the stages with the most room, middle stages first (they carry no extra)
    order = sorted(range(pp), key=lambda i: (-(cap[i] + extra[i]), extra[i] > 0, i))
    k = 0
    while over > 0:
        i = order[k % pp]
        if cap[i] > 1:
            cap[i] -= 1
            over -= 1
        k += 1
    return tuple(cap)


def weighted_split(weights: list[float], stages: int, first_extra: float = 0.0,
                   last_extra: float = 0.0) -> tuple[int, ...]:
    """Layers per stage (contiguous, >= 1 each) minimising the heaviest stage, when layer ``i`` costs
    ``weights[i]`` and the first and last stages also carry ``first_extra`` / ``last_extra`` (embedding; output
    layer and loss), all in the same unit (seconds per micro-batch: the split balanced by predicted stage time).

    Bisects the bottleneck and fills stages greedily left to right, leaving at least one layer for each stage to
    come: for contiguous min-max partitions the greedy fill is feasible whenever any split is (checked against
    brute force in tests/test_uneven_pipeline.py).
    """
    n = len(weights)
    if stages < 1 or n < stages:
        raise MeshplanError(f"pp={stages}: needs at least one of the {n} layers per stage")

    def fill(limit: float) -> list[int] | None:
        out, i = [], 0
        for st in range(stages):
            extra = (first_extra if st == 0 else 0.0) + (last_extra if st == stages - 1 else 0.0)
            room_left = n - i - (stages - st - 1)  # layers this stage may take
            if st == stages - 1:
                take = n - i
                if extra + sum(weights[i:]) > limit + 1e-12:
                    return None
            else:
                load, take = extra, 0
                while take < room_left and load + weights[i + take] <= limit + 1e-12:
                    load += weights[i + take]
                    take += 1
                if take == 0:
                    return None
            out.append(take)
            i += take
        return out

    lo = max(max(weights), first_extra + weights[0], last_extra + weights[-1])
    hi = sum(weights) + first_extra + last_extra
    best = fill(hi)
    for _ in range(60):
        mid = (lo + hi) / 2
        got = fill(mid)
        if got is None:
            lo = mid
        else:
            hi, best = mid, got
    return tuple(best)


def format_pp_layout(layers: tuple[int, ...]) -> str:
    """``7+8*14+7``: runs of equal stages written ``n*k`` (the ``--fix pp_layout`` syntax)."""
    out, i = [], 0
    while i < len(layers):
        j = i
        while j < len(layers) and layers[j] == layers[i]:
            j += 1
        out.append(str(layers[i]) if j - i == 1 else f"{layers[i]}*{j - i}")
        i = j
    return "+".join(out)


def parse_pp_layout(text: str) -> tuple[int, ...]:
    """``3+4*14+3`` -> (3, 4, ..., 4, 3): layers per stage, ``n*k`` = k stages of n layers.

    Raises:
        MeshplanError: not of that form, or a stage of fewer than 1 layer.
    """
    out: list[int] = []
    for part in str(text).split("+"):
        m = re.fullmatch(r"(\d+)(?:\*(\d+))?", part.strip())
        if not m:
            raise MeshplanError(f"--fix pp_layout={text}: expected layers per stage such as 7+8*14+7")
        n, k = int(m.group(1)), int(m.group(2) or 1)
        if n < 1 or k < 1 or k > 4096:
            raise MeshplanError(f"--fix pp_layout={text}: each stage needs >= 1 layer (and at most 4096 repeats)")
        out += [n] * k
    return tuple(out)
