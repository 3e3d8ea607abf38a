"""``Degrees`` and ``Layout``: one candidate placement of a model on a cluster, its mesh arithmetic and validation.

In the spirit of torchtitan's ``parallel_dims.py``: every divisibility rule, group stride and rank group lives
here, and every error prints the numbers involved. Rank order (fastest-varying first) follows Megatron-LM: tp,
cp, dp (dp_shard inside dp_replicate), pp — so a TP group is contiguous ranks, a CP group has stride tp, a DP group
stride tp*cp and PP neighbours are tp*cp*dp apart. Expert parallelism borrows its ranks from dp_shard * cp
(torchtitan) with stride tp.

``Degrees`` is the one degrees type: ``Plan.degrees`` holds one, a ``Layout`` is one (plus the other decisions),
and ``meshplan plan --fix`` pins its fields (``planner.layout.space.Pins``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, NamedTuple

from pydantic import ConfigDict, Field

from meshplan.core.errors import MeshplanError
from meshplan.planner.layout.decisions import DECISIONS, RECOMPUTE, Decisions
from meshplan.planner.layout.schedules import check_schedule
from meshplan.planner.layout.splits import balanced_split, format_pp_layout

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


def megatron_moe_overlap_refusal(pp: int, vpp: int, recompute: str, mtp: int) -> str:
    """Why Megatron-Core's ``overlap_moe_expert_parallel_comm`` (``moe_overlap``) does not run beside these choices
    ("" where it does): ``TransformerConfig.__post_init__`` (megatron-core 0.16.1) asserts no full recomputation, an
    interleaved pipeline where there is one, at most one MTP module and with it a pipeline."""
    if recompute.split(":")[0] == "full":
        return ("no full recomputation ('disable full recomputation when enabling overlap_moe_expert_parallel_comm'), "
                f"got recompute={recompute}")
    if pp > 1 and vpp == 1:
        return (f"virtual pipeline stages with pp={pp} (vpp=1): 'virtual_pipeline_model_parallel_size must be "
                "specified when pipeline_model_parallel_size > 1'")
    if mtp > 1:
        return f"at most one MTP module, got mtp={mtp}"
    if mtp == 1 and pp == 1:
        return "pp > 1 beside its MTP module (pp=1, mtp=1)"
    return ""


def fused_moe_mlp_refusal(stack: str, fp8: str, expert_tp: int, num_experts: int,
                          recomputed: frozenset = frozenset()) -> str:
    """Why Megatron-Core's fused grouped MLP (``moe_fused_mlp``) does not run on this layout as priced ("" where it
    does): ``TEGroupedMLP._is_fused_impl_supported`` (Megatron-Core d0b3b77, NeMo 26.06's) takes no expert tensor
    parallelism; Transformer Engine's fused forward and backward (``ForwardGroupedMLP_CuTeGEMMSwiGLU_MXFP8``, TE
    4220403) run the MXFP8 recipe only; and ``TEGroupedMLP.forward`` returns from ``_fused_forward`` before the
    ``moe_act`` checkpoint, so recomputing the experts' activation does not happen there (nor save its memory).
    What the model and the part must be is ``planner.estimate.gpu.check_fused_moe_mlp``'s."""
    if not num_experts:
        return "routed experts, and the model has none"
    if stack != "megatron":
        return f"Megatron-Core's TEGroupedMLP (stack=megatron), got stack={stack}"
    if expert_tp != 1:
        return f"no expert tensor parallelism (etp 1), got etp={expert_tp}"
    if fp8 != "mxfp8":
        return f"the MXFP8 recipe (fp8=mxfp8), got fp8={fp8 or 'the dtype default'}"
    if "moe_act" in recomputed:
        return "no moe_act in recompute_modules (the fused path skips that checkpoint)"
    return ""


def replicas_hold_whole_experts(tp: int, cp: int, dp_shard: int, dp_replicate: int, ep: int, expert_tp: int,
                                stack: str = "megatron") -> bool:
    """Whether the expert mesh ep x etp folds over the ranks ``stack``'s code lets it borrow: torchtitan's and HF
    code's FSDP2 meshes lend EP only dp_shard x cp (x tp at etp 1; ``parallel_dims.py``), so a replica holds whole
    experts. Megatron-Core folds it over every data-parallel rank, but with hybrid sharding (dp_replicate > 1 replicas
    of dp_shard > 1 ranks, one distributed optimizer instance each, as the export sets them) each replica must hold
    whole experts too (parallel_state: ``expert_data_parallel_size % num_distributed_optimizer_instances == 0``)."""
    if ep == 1 or (stack == "megatron" and (dp_replicate == 1 or dp_shard == 1)):
        return True
    return (tp * cp * dp_shard) % (ep * expert_tp) == 0


def megatron_dispatch_refusal(dispatcher: str, moe_capacity: float) -> str:
    """Why Megatron-Core does not run this token dispatcher beside token dropping ("" where it does): meshplan prices
    a dropping layer padded to its capacity (``--moe-pad-expert-input-to-capacity``), which the flex dispatcher's
    DeepEP backend refuses (``TransformerConfig.__post_init__``, megatron-core 0.16.1: "Flex token dispatcher with
    deepep backend does not support moe_pad_expert_input_to_capacity")."""
    if dispatcher == "deepep" and moe_capacity:
        return (f"moe_dispatcher=deepep with moe_capacity={moe_capacity:g}: Megatron-Core's DeepEP backend does not "
                "pad experts to their capacity ('Flex token dispatcher with deepep backend does not support "
                "moe_pad_expert_input_to_capacity'); take alltoall or hybridep")
    return ""


@dataclass(frozen=True)
class Layout(Decisions, Degrees):
    """Every decision of a homogeneous plan: the degrees (``Degrees``) and the rest, each declared and documented
    once in ``planner.layout.decisions.Decisions``."""

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
    def recomputed_modules(self) -> frozenset[str]:
        """What selective recomputation re-runs (``recompute_modules``, or Megatron-Core's default core_attn); empty
        under any other recompute."""
        if self.recompute_kind != "selective":
            return frozenset()
        return frozenset(self.recompute_modules.split("+")) if self.recompute_modules else frozenset({"core_attn"})

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

    def bf16_ranges(self, num_layers: int) -> tuple[range, ...]:
        """The decoder layers that keep bf16 GEMMs under a low-precision recipe (``bf16_first_layers``,
        ``bf16_last_layers``), as non-empty ranges of the model's layer numbers."""
        first = range(0, min(self.bf16_first_layers, num_layers))
        last = range(max(first.stop, num_layers - self.bf16_last_layers), num_layers)
        return tuple(r for r in (first, last) if len(r))

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
        """This layout with the fields ``kw`` changed: ``dataclasses.replace`` without the frozen per-field
        ``__init__`` (a search copies 10^5 layouts; ``Layout`` is plain fields with no ``__post_init__``, so the copy
        is the same value)."""
        unknown = kw.keys() - self.__dict__.keys()
        if unknown:
            raise TypeError(f"Layout has no field {', '.join(sorted(unknown))}")
        out = object.__new__(type(self))
        object.__setattr__(out, "__dict__", {**self.__dict__, **kw})
        return out

    def validate(self, *, world_size: int, num_layers: int, num_heads: int, num_kv_heads: int,
                 seq_len: int, global_batch: int, num_experts: int = 0) -> None:
        """Raise ``MeshplanError`` naming the first rule this layout breaks, with the numbers."""
        for name in (*DEGREE_NAMES, "micro_batch"):
            if getattr(self, name) < 1:
                raise MeshplanError(f"{name}={getattr(self, name)} must be >= 1")
        for d in DECISIONS.values():
            if d.kind in ("choice", "float"):
                d.check(getattr(self, d.name))
        if self.world_size != world_size:
            raise MeshplanError(
                f"dp_replicate({self.dp_replicate}) * dp_shard({self.dp_shard}) * cp({self.cp}) * tp({self.tp}) "
                f"* pp({self.pp}) = {self.world_size} != cluster world size {world_size}")
        self._check_heads(num_heads, num_kv_heads, seq_len)
        self._check_pipeline(num_layers, global_batch)
        self._check_experts(num_experts)
        self._check_recompute(num_layers)
        self._check_offload(num_layers)
        check_bf16_layers(self, num_layers, self.fp8)  # the recipe the layout names; the estimator also checks a
        # dtype's own default recipe (``lowp_recipe``)
        self._check_attention_dtype()
        self._check_unfused_cp()
        self._check_batch(global_batch)

    def _check_heads(self, num_heads: int, num_kv_heads: int, seq_len: int) -> None:
        """Tensor and context parallelism against the attention heads and the sequence."""
        if num_heads % self.tp:
            raise MeshplanError(f"tp={self.tp} does not divide the {num_heads} attention heads")
        if num_kv_heads % self.tp and self.tp % num_kv_heads:
            raise MeshplanError(f"tp={self.tp} and the {num_kv_heads} KV heads: neither divides the other")
        if seq_len % (2 * self.cp) and self.cp > 1:
            raise MeshplanError(f"cp={self.cp}: seq_len {seq_len} must be divisible by 2*cp={2 * self.cp} "
                                "(load-balanced causal context parallelism)")
        if self.cp_kind == "a2a" and self.cp > 1 and (num_heads // self.tp) % self.cp:
            raise MeshplanError(f"cp_kind a2a (Ulysses) splits heads: cp={self.cp} must divide the "
                                f"{num_heads // self.tp} heads per tp rank ({num_heads} heads / tp={self.tp})")
        if self.sequence_parallel and self.tp == 1:
            raise MeshplanError("sequence parallel needs tp > 1")
        if self.tp_overlap and not self.sequence_parallel:
            raise MeshplanError(f"tp_overlap overlaps sequence parallelism's all-gather/reduce-scatter: needs sp "
                                f"(tp={self.tp})")

    def _check_pipeline(self, num_layers: int, global_batch: int) -> None:
        """Stages, chunks, schedule and pipeline runs against the layers and the micro-batches."""
        if self.pp_layout:
            n = self.pp * self.vpp
            inner = self.pp_layout[1:-1]
            if (len(self.pp_layout) != n or min(self.pp_layout) < 0 or (inner and min(inner) < 1)
                    or sum(self.pp_layout) != num_layers or (n == 1 and self.pp_layout[0] < 1)):
                what = f"pp={self.pp} stages" if self.vpp == 1 else f"pp*vpp = {n} virtual stages"
                raise MeshplanError(f"pp_layout {format_pp_layout(self.pp_layout)}: needs {what} of >= 1 layer "
                                    "(the first and last may hold only the embedding / the loss, 0 layers) "
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
        if self.pp_runs > 1 and self.pp == 1:
            raise MeshplanError(f"pp_runs={self.pp_runs} needs pipeline parallelism (pp=1)")
        if self.pp_overlap and (self.pp == 1 or (self.stack == "megatron" and self.vpp == 1)):
            raise MeshplanError(f"pp_overlap overlaps the pipeline's sends with the next chunk's compute: it needs "
                                f"pp > 1, and under Megatron an interleaved pipeline (Megatron-Core reads "
                                f"overlap_p2p_comm only there; pp={self.pp}, vpp={self.vpp})")

    def _check_experts(self, num_experts: int) -> None:
        """The expert mesh against the experts and the stage's ranks."""
        if self.shared_overlap and self.moe_overlap:
            raise MeshplanError("shared_overlap and moe_overlap both hide the expert all-to-alls behind other work: "
                                "pick one (Megatron-Core asserts against the pair)")
        if self.moe_overlap and num_experts and self.stack == "megatron":
            self._check_moe_overlap()
        why = fused_moe_mlp_refusal(self.stack, self.fp8, self.expert_tp, num_experts,
                                    self.recomputed_modules) if self.moe_fused_mlp else ""
        if why:
            raise MeshplanError(f"moe_fused_mlp (Transformer Engine's fused grouped MLP) needs {why}")
        why = megatron_dispatch_refusal(self.moe_dispatcher, self.moe_capacity) if self.stack == "megatron" else ""
        if why and num_experts:
            raise MeshplanError(why)
        if self.moe_router != "learned" and not num_experts:
            raise MeshplanError(f"moe_router={self.moe_router} routes tokens to experts, but the model has none")
        if self.moe_impl != "megatron" and not num_experts:
            raise MeshplanError(f"moe_impl={self.moe_impl} names whose MoE layer runs, but the model has no experts")
        if self.moe_impl != "megatron" and self.stack != "megatron":
            raise MeshplanError(f"moe_impl={self.moe_impl} names an MoE layer under the megatron kernels; "
                                f"stack={self.stack} runs its own")
        if self.cuda_graphs == "iteration" and num_experts and not self.moe_capacity \
                and self.moe_dispatcher != "hybridep":
            raise MeshplanError(f"cuda_graphs=iteration on a dropless MoE model needs moe_dispatcher=hybridep (its "
                                f"sync-free dispatch) or token dropping (moe_capacity > 0); moe_dispatcher="
                                f"{self.moe_dispatcher} reads each layer's token counts on the host, which a graph "
                                f"cannot replay (Megatron-Core docs/user-guide/features/cuda_graph.md)")
        if self.ep > 1 or self.etp:
            if num_experts == 0:
                pinned = ", ".join(f"{k}={v}" for k, v in (("ep", self.ep), ("etp", self.etp))
                                   if v and (v > 1 or k == "etp"))
                raise MeshplanError(f"{pinned} parallelizes experts, but the model has no experts")
            if num_experts % self.ep:
                raise MeshplanError(f"ep={self.ep} does not divide the {num_experts} experts")
            dense = self.tp * self.cp * self.dp
            if self.etp < 0 or dense % (self.ep * self.expert_tp):
                raise MeshplanError(f"ep({self.ep}) * etp({self.expert_tp}) = {self.ep * self.expert_tp} must "
                                    f"divide tp*cp*dp = {self.tp}*{self.cp}*{self.dp} = {dense} (the expert mesh "
                                    "folds over a stage's ranks)")
            if not replicas_hold_whole_experts(self.tp, self.cp, self.dp_shard, self.dp_replicate, self.ep,
                                               self.expert_tp, self.stack):
                raise MeshplanError(f"ep({self.ep}) * etp({self.expert_tp}) = {self.ep * self.expert_tp} must "
                                    f"divide tp*cp*dp_shard = {self.tp}*{self.cp}*{self.dp_shard} = "
                                    f"{self.tp * self.cp * self.dp_shard} (dp_replicate={self.dp_replicate}, stack "
                                    f"{self.stack}): each replica holds whole experts")

    def _check_moe_overlap(self) -> None:
        why = megatron_moe_overlap_refusal(self.pp, self.vpp, self.recompute, self.mtp)
        if why:
            raise MeshplanError(f"moe_overlap under Megatron-Core (overlap_moe_expert_parallel_comm) needs {why}")

    def _check_recompute(self, num_layers: int) -> None:
        """Sharding and recomputation."""
        if self.zero_stage == 0 and self.dp_shard > 1:
            raise MeshplanError(f"dp_shard={self.dp_shard} shards states, which needs zero stage 1-3 (got 0)")
        if self.recompute_kind not in RECOMPUTE or (":" in self.recompute and not re.fullmatch(
                r"full:[1-9]\d*", self.recompute)):
            raise MeshplanError(f"recompute '{self.recompute}' is not one of {', '.join(RECOMPUTE)} or full:N")
        if self.recompute_modules and self.recompute != "selective":
            raise MeshplanError(f"recompute_modules={self.recompute_modules} are what selective recomputation re-runs "
                                f"(Megatron-Core recompute_granularity='selective'): needs recompute=selective, "
                                f"got {self.recompute}")
        if self.recompute_modules and self.stack != "megatron":
            raise MeshplanError(f"recompute_modules={self.recompute_modules} is Megatron-Core's module list; stack "
                                f"{self.stack} has none (recompute=op or full there)")
        if self.fp8 == "delayed" and self.recomputed_modules & {"moe_act", "layernorm"}:
            raise MeshplanError(f"recompute_modules={self.recompute_modules} under fp8=delayed: Megatron-Core refuses "
                                "moe_act and layernorm recomputation with delayed scaling ('Delayed scaling does not "
                                "support moe_act and layernorm recompute for fp8'); take tensorwise or mxfp8")
        if self.cuda_graphs != "none" and self.offload_layers:
            raise MeshplanError(f"cuda_graphs={self.cuda_graphs} with offload_layers={self.offload_layers}: "
                                f"Megatron-Core runs no CUDA graph with CPU offloading (TransformerConfig: \"CUDA "
                                f"graphs not supported with CPU offloading\")")
        if self.cuda_graphs == "layers" and "moe" in self.recomputed_modules:
            raise MeshplanError(f"cuda_graphs=layers with recompute_modules={self.recompute_modules}: Megatron-Core "
                                f"recomputes no MoE block whose router a graph captures (TransformerConfig: \"moe "
                                f"recompute is not supported with moe_router CUDA graph\")")
        if self.cuda_graphs in ("layers", "mixers") and self.recompute_kind == "full":
            raise MeshplanError(f"cuda_graphs={self.cuda_graphs} with recompute={self.recompute}: Megatron-Core "
                                f"recomputes whole layers only under the full-iteration graph (TransformerConfig: "
                                f"\"full recompute is only supported with full iteration CUDA graph\"); take "
                                f"cuda_graphs=iteration or selective recomputation")
        if self.recompute_layers:
            per_chunk = (min(k for k in self.pp_layout if k) if self.pp_layout
                         else num_layers // (self.pp * self.vpp))
            if self.recompute_layers > per_chunk:
                raise MeshplanError(f"recompute full:{self.recompute_layers}: a pipeline chunk holds only "
                                    f"{per_chunk} layers (pp={self.pp}, vpp={self.vpp})")

    def _check_offload(self, num_layers: int) -> None:
        """Activation offloading as Megatron-Core accepts it (``TransformerConfig.__post_init__``)."""
        n = self.offload_layers
        if not n:
            return
        if n < 0 or n >= num_layers:
            raise MeshplanError(f"offload_layers={n}: must be below the {num_layers} layers (Megatron-Core: "
                                "'CPU offloading can be done only for layers less than num_layers')")
        if self.pp > 1:
            raise MeshplanError(f"offload_layers={n} with pp={self.pp}: Megatron-Core has no CPU offloading under "
                                "pipeline parallelism")
        if self.recompute != "none":
            raise MeshplanError(f"offload_layers={n} with recompute {self.recompute}: Megatron-Core's CPU offloading "
                                "does not work with activation recomputation")

    def _check_unfused_cp(self) -> None:
        """Megatron-Core's unfused attention has no context parallelism (core_v0.16.0 ``DotProductAttention``:
        "Context parallelism is only supported by TEDotProductAttention!")."""
        if self.attention == "unfused" and self.cp > 1 and self.stack == "megatron":
            raise MeshplanError(f"attention=unfused with cp={self.cp}: Megatron-Core's unfused attention has no "
                                "context parallelism (only Transformer Engine's fused attention splits the sequence)")

    def _check_attention_dtype(self) -> None:
        """fp8 attention as Transformer Engine runs it: cuDNN's fused kernel under Megatron's stack (the recipe it
        needs is the workload's: ``planner.layout.space.fp8_attention_recipes``)."""
        if self.attention_dtype == "fp8" and (self.stack != "megatron" or self.attention not in ("flash", "cudnn")):
            raise MeshplanError(f"attention_dtype=fp8 is Transformer Engine's fp8 dot-product attention (cuDNN fused "
                                f"attention): it needs stack megatron and attention flash or cudnn (got stack "
                                f"{self.stack}, attention {self.attention})")

    def _check_batch(self, global_batch: int) -> None:
        """The global batch against micro-batches, data parallelism and the interleaved schedule."""
        per_step = self.micro_batch * self.dp
        if global_batch % per_step:
            raise MeshplanError(
                f"global batch {global_batch} is not divisible by micro_batch({self.micro_batch}) * dp({self.dp}) "
                f"= {per_step}")
        m = global_batch // per_step
        if self.vpp > 1 and m % self.pp:
            raise MeshplanError(f"interleaved schedule: {m} micro-batches must be a multiple of pp={self.pp}")


# The recipes under which Megatron-Core checks the bf16 layers' counts (``TransformerConfig.__post_init__`` checks
# them inside ``if self.fp8:``; NVFP4 alone is ``fp4``, not checked)
_FP8_RECIPES = ("delayed", "tensorwise", "blockwise", "mxfp8")


def bf16_layers_problem(first: int, last: int, num_layers: int, pp: int, recipe: str) -> str | None:
    """Why Megatron-Core (megatron-core 0.16.1 ``TransformerConfig``) refuses keeping the first ``first`` and last
    ``last`` decoder layers in bf16 under the low-precision ``recipe`` (``decisions.lowp_recipe``), or ``None``:
    under fp8, none with delayed scaling ("Delayed scaling does not support first / last layer in BF16") and each
    count at most the layers of one pipeline stage."""
    if recipe not in _FP8_RECIPES or not (first or last):
        return None
    if recipe == "delayed":
        return (f"bf16_first_layers={first}, bf16_last_layers={last} under delayed scaling: Megatron-Core refuses "
                "bf16 layers with it ('Delayed scaling does not support first / last layer in BF16')")
    per_stage = num_layers // pp
    for name, n in (("bf16_first_layers", first), ("bf16_last_layers", last)):
        if n > per_stage:
            return (f"{name}={n} under fp8 {recipe}: at most the {per_stage} layers of one pipeline stage "
                    f"({num_layers} layers over pp={pp}; Megatron-Core refuses more)")
    return None


def check_bf16_layers(layout: Layout, num_layers: int, recipe: str) -> None:
    """``bf16_layers_problem`` of ``layout``'s kept layers, raised as a ``MeshplanError``."""
    problem = bf16_layers_problem(layout.bf16_first_layers, layout.bf16_last_layers, num_layers, layout.pp, recipe)
    if problem:
        raise MeshplanError(problem)
