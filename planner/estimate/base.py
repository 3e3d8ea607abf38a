"""The estimator interface: ``Estimator.estimate(workload, layout) -> Estimate``, and what every estimator shares.

Two implementations, chosen by the cluster (``planner.estimate.select.estimator_for``): the GPU estimator
(``planner.estimate.gpu``, analytic Megatron-style step priced op by op by a ``costmodel.api.Pricer``) and the
``local:N`` CPU estimator (``planner.estimate.cpu``, measured per-op prices on this host and the learned host
terms). Search, the solvers and the re-pricing of a saved plan all call them through this interface; each
estimator owns its caches (nothing process-wide).

Shared here: per-stage layers and parameters (ZeRO / pipeline arithmetic), per-stage memory
(``planner.estimate.memory``)
and the parts of an ``Estimate`` every estimator derives the same way (memory, FLOPs, rates, MFU).
Units: seconds, bytes, FLOPs.
"""
from __future__ import annotations

import functools
import operator
from dataclasses import dataclass, fields
from typing import Optional, Protocol

from meshplan.costmodel.devices import DeviceSpec
from meshplan.costmodel.ops import OpSpec
from meshplan.planner.estimate.memory import (
    USABLE_FRACTION,
    MemoryBreakdown,
    activation_bytes_per_layer,
    inflight_factor,
    layer_shape,
    lowp_weight_bytes,
    model_state_bytes,
    param_bytes,
    runtime_overhead_bytes,
    saved_input_bytes,
)
from meshplan.planner.estimate.ops_graph import kind_ops, mtp_kinds
from meshplan.planner.layout.decisions import lowp_recipe
from meshplan.planner.layout.layout import Layout
from meshplan.planner.model.flops import recompute_flops_per_token
from meshplan.planner.model.peft import adapter_params_per_layer, parse_lora


@dataclass(frozen=True)
class Workload:
    model: object  # planner.model.spec.ModelSpec
    cluster: object  # planner.cluster.spec.ClusterSpec (homogeneous)
    global_batch: int
    seq_len: int
    dtype: str = "bf16"
    lora: str = ""  # LoRA adapters over a frozen base (``planner.model.peft``); "" trains every weight


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
    pipeline_s: Optional[float] = None  # the part that scales with micro-batches (m x the slowest stage's
    # per-micro-batch time, straggler included), when the estimator separates it: the search's lower bound


class Estimator(Protocol):
    """What search, the solvers and ``verify`` price with."""

    name: str  # what priced the ops, recorded in a plan (``Prediction.costmodel``)

    def estimate(self, work: Workload, layout: Layout) -> Estimate:
        """Predict step time, throughput and peak memory of ``layout`` (validated beforehand)."""

    def op_time_s(self, op: OpSpec, device: DeviceSpec) -> float:
        """Seconds of one operator (its backward when ``op.backward``) on ``device``."""

    def op_times_s(self, ops: list[OpSpec], device: DeviceSpec) -> list[float]:
        """``op_time_s`` of many operators at once (the solvers' batch path)."""


# ---------------------------------------------------------------- per-model tables

class ModelTables:
    """Per-model prefix sums so that any contiguous stage's parameters cost O(1), and one representative layer
    (and its ``planner.estimate.memory.layer_shape``) per layer kind (``ModelSpec.layer_kind``)."""

    def __init__(self, model):
        self.model = model
        dense, expert = [0.0], [0.0]
        kinds = [model.layer_kind(i) for i in range(model.num_layers)]
        for i in range(model.num_layers):
            e = model.layer_routed_expert_params(i)
            dense.append(dense[-1] + model.layer_params(i) - e)
            expert.append(expert[-1] + e)
        self.dense, self.expert = dense, expert
        # one representative layer per kind (``ModelSpec.layer_kind``: "*-" dense, "*E" MoE, "S-"/"SE" with a
        # sliding window, a hybrid's "M", "*", "-", "E"), and per kind the prefix count of its layers
        self.rep: dict[str, int] = {}
        for i, k in enumerate(kinds):
            self.rep.setdefault(k, i)
        self.prefix: dict[str, list[int]] = {}
        for k in self.rep:
            run = [0]
            for kind in kinds:
                run.append(run[-1] + (kind == k))
            self.prefix[k] = run
        self.shape = {k: layer_shape(model, i) for k, i in self.rep.items()}
        self._stage: dict[tuple, tuple] = {}
        self._flops: dict[tuple, tuple[float, float]] = {}
        self._params: dict[tuple, tuple[float, float]] = {}
        self._act: dict[tuple, float] = {}
        self._stage_act: dict[tuple, tuple] = {}  # stage_memory's activations, keyed without the sharding

    def stage_counts(self, layout: Layout, stage: int) -> tuple[tuple[range, ...], dict[str, int], dict[str, int]]:
        """(layer ranges, ``{layer kind: layers}``, ``{layer kind: recomputed layers}``) of pipeline rank ``stage``,
        cached per split and recompute (the search prices 10^4 layouts over far fewer of them)."""
        k = (layout.pp, layout.vpp, layout.pp_layout, layout.recompute, stage)
        hit = self._stage.get(k)
        if hit is None:
            chunks = layout.stage_chunks(self.model.num_layers, stage)
            hit = self._stage[k] = (chunks, self.kind_counts(chunks), recomputed_counts(self, layout, chunks))
        return hit

    def bf16_counts(self, layout: Layout, stage: int) -> tuple[tuple[range, ...], dict[str, int], dict[str, int]]:
        """``stage_counts`` restricted to the layers that keep bf16 GEMMs under a low-precision recipe
        (``Layout.bf16_ranges``): (their ranges on pipeline rank ``stage``, ``{kind: layers}``, ``{kind: recomputed
        layers}``), cached."""
        k = ("bf16", layout.pp, layout.vpp, layout.pp_layout, layout.recompute, layout.bf16_first_layers,
             layout.bf16_last_layers, stage)
        hit = self._stage.get(k)
        if hit is None:
            chunks = self.stage_counts(layout, stage)[0]
            edges = layout.bf16_ranges(self.model.num_layers)
            held = _meet(chunks, edges)
            rec = self.kind_counts(_meet(recomputed_ranges(layout, chunks), edges))
            hit = self._stage[k] = (held, self.kind_counts(held), rec)
        return hit

    def flops_per_token(self, seq_len: int, layout: Layout) -> tuple[float, float]:
        """(model FLOPs, recompute FLOPs) per token, cached; ``full:N`` counts the share of layers it recomputes."""
        k = (seq_len, layout.recompute, layout.pp, layout.vpp, layout.pp_layout)
        if layout.recompute_modules:  # the modules' share depends on how the layer is split
            k += (layout.recompute_modules, layout.tp, layout.cp, layout.micro_batch, layout.ep, layout.etp)
        hit = self._flops.get(k)
        if hit is None:
            share = 1.0
            if layout.recompute_layers:  # the layers full:N recomputes, over every stage
                recomputed = sum(sum(self.stage_counts(layout, st)[2].values()) for st in range(layout.pp))
                share = recomputed / max(1, self.model.num_layers)
            again = (self.module_flops_per_token(seq_len, layout) if layout.recompute_modules
                     else recompute_flops_per_token(self.model, seq_len, layout.recompute, share))
            hit = self._flops[k] = (self.model.model_flops_per_token(seq_len), again)
        return hit

    def module_flops_per_token(self, seq_len: int, layout: Layout) -> float:
        """FLOPs per token that Megatron-Core's ``recompute_modules`` run again: the forward FLOPs of each listed
        module's ops (``LayerOps.modules``) over every decoder layer, scaled from one rank's share (1/tp of a layer
        for its b*s/cp tokens) to the whole layer per token."""
        tokens = layout.micro_batch * seq_len / layout.cp
        counts = self.kind_counts((range(self.model.num_layers),))
        out = 0.0
        for kind, n in counts.items():
            lo = kind_ops(self.model, kind, layout, seq_len)
            again = sum(op.flops for m, ops in lo.modules if m in layout.recomputed_modules for op in ops)
            out += n * again * layout.tp / tokens
        return out

    def activation_bytes(self, kind: str, s: int, b: int, layout: Layout, lin_bytes: float,
                         recompute: str, lora: str = "") -> float:
        """``planner.estimate.memory.activation_bytes_per_layer`` of the representative layer of ``kind``, cached on
        the fields it reads; ``lora``: the job's (``Workload.lora``), whose frozen linears save no input."""
        k = (kind, s, b, layout.tp, layout.sequence_parallel, recompute, layout.attention, layout.attention_dtype,
             lin_bytes, layout.expert_tp, layout.moe_capacity, layout.moe_imbalance, layout.stack,
             layout.recompute_modules, lora)
        hit = self._act.get(k)
        if hit is None:
            adapted = parse_lora(lora).modules if lora else None
            hit = self._act[k] = activation_bytes_per_layer(self.shape[kind], s, b, layout, lin_bytes, recompute,
                                                            adapted)
        return hit

    def kind_counts(self, chunks: tuple[range, ...]) -> dict[str, int]:
        """``{layer kind: number of such layers}`` in the layer ranges ``chunks``."""
        return {k: sum(p[r.stop] - p[r.start] for r in chunks) for k, p in self.prefix.items()}


def keeps_bf16_layers(layout: Layout, dtype: str, num_layers: int) -> bool:
    """Whether some decoder layers run outside the workload's low-precision recipe (``Layout.bf16_ranges``)."""
    return bool(layout.bf16_ranges(num_layers)) and lowp_recipe(layout.fp8, dtype) != "none"


def bf16_time_key(layout: Layout) -> Layout:
    """``time_key`` of a layer kept in bf16: Megatron-Core runs it outside the fp8 / fp4 autocast, attention
    included, and its experts unfused (Transformer Engine's op fuser fuses the grouped MLP only under the MXFP8
    recipe: ``fuse_grouped_mlp_ops``)."""
    return time_key(layout).with_(fp8="none", attention_dtype="bf16", moe_fused_mlp=False)


def precision_parts(tb: ModelTables, layout: Layout, dtype: str, stage: int) -> list[tuple]:
    """[(time key, dtype, ``{kind: layers}``, ``{kind: recomputed layers}``)] of pipeline rank ``stage``: its layers
    under the workload's precision, then those kept in bf16 (``Layout.bf16_ranges``) when the recipe leaves any."""
    _, counts, rec = tb.stage_counts(layout, stage)
    if not keeps_bf16_layers(layout, dtype, tb.model.num_layers):
        return [(time_key(layout), dtype, counts, rec)]
    _, n16, rec16 = tb.bf16_counts(layout, stage)
    return [(time_key(layout), dtype, {k: n - n16[k] for k, n in counts.items()},
             {k: r - rec16[k] for k, r in rec.items()}), (bf16_time_key(layout), "bf16", n16, rec16)]


def _meet(ranges: tuple[range, ...], edges: tuple[range, ...]) -> tuple[range, ...]:
    """The non-empty intersections of each of ``ranges`` with each of ``edges``."""
    out = (range(max(r.start, e.start), min(r.stop, e.stop)) for r in ranges for e in edges)
    return tuple(r for r in out if len(r))


class TablesCache:
    """The ``ModelTables`` of the models an estimator has seen (the last one looked up first: the search hot path)."""

    def __init__(self) -> None:
        self._by_model: dict = {}
        self._last: tuple | None = None

    def __call__(self, model) -> ModelTables:
        last = self._last
        if last is not None and last[0] is model:
            return last[1]
        t = self._by_model.get(model)
        if t is None:
            t = self._by_model[model] = ModelTables(model)
        self._last = (model, t)
        return t


# ---------------------------------------------------------------- parameters and memory per rank

def stage_layer_ranges(model, layout: Layout, stage: int) -> tuple[range, ...]:
    """The decoder layers of pipeline rank ``stage``, one range per virtual chunk (``Layout.stage_chunks``)."""
    return layout.stage_chunks(model.num_layers, stage)


def recomputed_ranges(layout: Layout, chunks: tuple[range, ...]) -> tuple[range, ...]:
    """The layers of ``chunks`` whose recompute runs: every layer, except under ``full:N``, where Megatron's block
    method recomputes the first N layers of each virtual chunk (``--recompute-method block``); none without
    recomputation."""
    n = layout.recompute_layers
    if layout.recompute_kind == "none":
        return ()
    return tuple(range(r.start, min(r.stop, r.start + n)) for r in chunks) if n else chunks


def recomputed_counts(tb: ModelTables, layout: Layout, chunks: tuple[range, ...]) -> dict[str, int]:
    """``{layer kind: layers of ``chunks`` whose recompute runs}`` (``recomputed_ranges``)."""
    return tb.kind_counts(recomputed_ranges(layout, chunks))


def stage_params(tb: ModelTables, layout: Layout, stage: int) -> tuple[float, float]:
    """(dense, routed-expert) parameters held by one rank of pipeline stage ``stage`` (cached per split and
    tensor/expert sharding)."""
    k = (layout.pp, layout.vpp, layout.pp_layout, layout.tp, layout.ep, layout.expert_tp, stage)
    hit = tb._params.get(k)
    if hit is None:
        hit = tb._params[k] = _stage_params(tb, layout, stage)
    return hit


def decoder_params(tb: ModelTables, layout: Layout, stage: int) -> float:
    """Decoder-layer parameters (dense and routed) one rank of ``stage`` holds: ``stage_params`` without the
    embedding, the output layer and the final norm (the weights fp8 training casts)."""
    model = tb.model
    dense, expert = stage_params(tb, layout, stage)
    if stage == 0:
        dense -= model.embedding_params / layout.tp
    if stage == layout.pp - 1:
        head = model.lm_head_params or (model.vocab_size * model.hidden_size if layout.pp > 1 else 0)
        dense -= (head + model.final_norm_params) / layout.tp
    return max(0.0, dense) + expert


def bf16_layer_params(tb: ModelTables, layout: Layout, stage: int) -> float:
    """Parameters one rank of ``stage`` holds in the decoder layers that keep bf16 GEMMs (``Layout.bf16_ranges``):
    Transformer Engine makes no quantized copy of them."""
    held = tb.bf16_counts(layout, stage)[0]
    dense = sum(tb.dense[r.stop] - tb.dense[r.start] for r in held) / layout.tp
    return dense + sum(tb.expert[r.stop] - tb.expert[r.start] for r in held) / (layout.ep * layout.expert_tp)


def recast_expert_params(tb: ModelTables, layout: Layout, stage: int) -> float:
    """Routed-expert parameters one rank of ``stage`` quantizes again on every micro-batch: under the fused grouped
    MLP (``moe_fused_mlp``) Transformer Engine's fused op quantizes each expert weight, rowwise and columnwise, on
    every forward unless it is held quantized already (``ForwardGroupedMLP_CuTeGEMMSwiGLU_MXFP8.fuser_forward``, TE
    4220403: ``fp8_params``), where ``GroupedLinear`` modules cache the casts across a step's micro-batches. Layers
    kept in bf16 run unfused and cast nothing. Not priced: the casts a fully recomputed forward makes again."""
    if not layout.moe_fused_mlp or layout.fp8_params:
        return 0.0
    held = tb.bf16_counts(layout, stage)[0]
    bf16_experts = sum(tb.expert[r.stop] - tb.expert[r.start] for r in held) / (layout.ep * layout.expert_tp)
    return max(0.0, stage_params(tb, layout, stage)[1] - bf16_experts)


def _stage_params(tb: ModelTables, layout: Layout, stage: int) -> tuple[float, float]:
    model = tb.model
    chunks = tb.stage_counts(layout, stage)[0]
    dense = sum(tb.dense[r.stop] - tb.dense[r.start] for r in chunks) / layout.tp
    expert = sum(tb.expert[r.stop] - tb.expert[r.start] for r in chunks) / (layout.ep * layout.expert_tp)
    if stage == 0:
        dense += model.embedding_params / layout.tp
    if stage == layout.pp - 1:
        head = model.lm_head_params or (model.vocab_size * model.hidden_size if layout.pp > 1 else 0)
        dense += (head + model.final_norm_params) / layout.tp
        # the MTP modules sit on the last stage (megatron-core builds them with the output layer)
        routed = model.mtp_routed_expert_params
        dense += (model.mtp_params - routed) / layout.tp
        expert += routed / (layout.ep * layout.expert_tp)
    return dense, expert


def trainable_params(work: Workload, tb: ModelTables, layout: Layout, stage: int) -> tuple[float, float]:
    """(dense, routed-expert) parameters one rank of ``stage`` trains: ``stage_params``, or under LoRA
    (``Workload.lora``) its adapters alone, the base frozen."""
    lora = parse_lora(work.lora)
    if lora is None:
        return stage_params(tb, layout, stage)
    layers = [i for r in layout.stage_chunks(work.model.num_layers, stage) for i in r]
    return sum(adapter_params_per_layer(work.model, lora, i, layout.tp) for i in layers), 0.0


def stage_memory(work: Workload, tb: ModelTables, layout: Layout, stage: int, m: int) -> MemoryBreakdown:
    """Peak bytes on one rank of pipeline stage ``stage`` with ``m`` micro-batches per step."""
    dense, expert = stage_params(tb, layout, stage)
    w, g, o = model_state_bytes(dense, expert, layout, work.dtype)
    if work.lora:  # a frozen base has weights only; its adapters have weights, gradients and optimizer states
        aw, g, o = model_state_bytes(*trainable_params(work, tb, layout, stage), layout, work.dtype)
        w += aw
    # the activations do not depend on how the data-parallel states are sharded: the members of a search's group
    # share them
    akey = (stage, m, work.seq_len, work.dtype, work.lora, _unsharded_fields(layout))
    hit = tb._stage_act.get(akey)
    if hit is None:
        hit = tb._stage_act[akey] = _stage_activations(work, tb, layout, stage, m)
    act, remat, ends, n_layers = hit
    recipe = lowp_recipe(layout.fp8, work.dtype)
    if recipe != "none":
        # Transformer Engine keeps the quantized copies of each linear weight the GEMMs read
        # (``memory.lowp_weight_bytes``: on Hopper an fp8 copy and its transpose, 2 B per parameter), cast once per
        # step; under FSDP only for the layers gathered at the moment
        # the embedding, the output layer and the layers kept in bf16 (``Layout.bf16_ranges``) have no copy
        linear = decoder_params(tb, layout, stage) - bf16_layer_params(tb, layout, stage)
        held = linear if layout.zero_stage < 3 else 2 * linear / max(1, n_layers)
        w += lowp_weight_bytes(recipe, block_scaled(work)) * held
        if layout.fp8_params and layout.zero_stage < 3:  # the quantized copies are the weights (Layout.fp8_params)
            w -= param_bytes(work.dtype) * linear
    if layout.zero_stage == 3:  # FSDP: the current and the prefetched layer are held unsharded
        act += 2 * (dense + expert) / max(1, n_layers) * param_bytes(work.dtype)
    act += remat
    for extra in ends:
        act += extra
    if grads_born_in_backward(layout, m):  # two peaks: backward's first op (no gradient yet), the optimizer step
        g, act = (0.0, act) if act >= g else (g, 0.0)
    return MemoryBreakdown(int(w), int(g), int(o), int(act), runtime_overhead_bytes(layout, act))


def memory_floor_bytes(work: Workload, tb: ModelTables, layout: Layout, m: int) -> int:
    """A lower bound on ``finish_estimate``'s peak memory of ``layout`` and of every layout that shards its
    data-parallel states otherwise: the first stage's activations (``stage_memory``; FSDP's gathered layers only
    add to them) and the runtime overhead of no activations, no weights, gradients or optimizer states (when a
    gradient-free backward start is the peak, the gradients it trades for the activations are larger)."""
    hit = tb._stage_act.get((0, m, work.seq_len, work.dtype, work.lora, _unsharded_fields(layout)))
    act, remat, ends, _ = hit if hit is not None else _stage_activations(work, tb, layout, 0, m)
    act += remat
    for extra in ends:
        act += extra
    return int(act) + runtime_overhead_bytes(layout, 0.0)


# The fields that shard the data-parallel states: the rest of a layout sets its activations.
_SHARDING = frozenset({"zero_stage", "dp_shard", "dp_replicate"})
_unsharded_fields = operator.attrgetter(*(f.name for f in fields(Layout) if f.name not in _SHARDING))


def offloaded_layers(layout: Layout, stage_layers: int) -> int:
    """Layers of a stage of ``stage_layers`` whose activations go to host memory: ``offload_layers``, fewer than the
    stage holds as Transformer Engine requires (Megatron-Core validates it for pp=1, the only degree it offloads
    under; a search's bounds may still price a pipelined layout that validation then refuses)."""
    return max(0, min(layout.offload_layers, stage_layers - 1))


def first_layers(chunks: tuple[range, ...], n: int) -> tuple[range, ...]:
    """The first ``n`` layers of a stage whose layers are ``chunks``, in the order it runs them (its chunks one after
    another under interleaving): those ``gpu.offload_s`` copies to host memory."""
    out = []
    for r in chunks:
        take = min(n, len(r))
        out.append(range(r.start, r.start + take))
        n -= take
    return tuple(out)


def _stage_activations(work: Workload, tb: ModelTables, layout: Layout, stage: int,
                       m: int) -> tuple[float, float, tuple[float, ...], int]:
    """(activations held at the peak, the one layer re-materialised in backward, what the last stage adds: the
    logits and the MTP modules' activations, the stage's layers) of ``stage_memory``, bytes."""
    model = work.model
    s = work.seq_len // layout.cp
    b = layout.micro_batch
    chunks, counts, rec = tb.stage_counts(layout, stage)
    n_layers = sum(len(r) for r in chunks)
    lin = saved_input_bytes(lowp_recipe(layout.fp8, work.dtype), block_scaled(work))
    kept = {k: tb.activation_bytes(k, s, b, layout, lin, "none", work.lora) for k, n in counts.items() if n}
    per_mb = 0.0
    for k, n in counts.items():
        if n:
            if rec[k]:
                per_mb += rec[k] * tb.activation_bytes(k, s, b, layout, lin, layout.recompute_kind, work.lora)
            per_mb += (n - rec[k]) * kept[k]
    # the layers kept in bf16 (``Layout.bf16_ranges``) save their linears' inputs in bf16: what each adds
    bf16_lin = saved_input_bytes("none")
    kept16: dict[str, float] = {}
    if lin != bf16_lin:
        _, n16, rec16 = tb.bf16_counts(layout, stage)
        kept16 = {k: tb.activation_bytes(k, s, b, layout, bf16_lin, "none", work.lora) for k, n in n16.items() if n}
        for k in kept16:
            again_bytes = (tb.activation_bytes(k, s, b, layout, bf16_lin, layout.recompute_kind, work.lora)
                           - tb.activation_bytes(k, s, b, layout, lin, layout.recompute_kind, work.lora))
            per_mb += (n16[k] - rec16[k]) * (kept16[k] - kept[k]) + rec16[k] * again_bytes
    if layout.offload_layers:  # the first N layers' saved tensors wait in host memory (``estimate.offload``)
        first = first_layers(chunks, offloaded_layers(layout, n_layers))
        gone = tb.kind_counts(first)
        per_mb -= sum(n * kept[k] for k, n in gone.items() if n)
        if kept16:  # those of them kept in bf16 held their bf16 bytes
            gone16 = tb.kind_counts(_meet(first, layout.bf16_ranges(model.num_layers)))
            per_mb -= sum(n * (kept16[k] - kept[k]) for k, n in gone16.items() if n)
    act = per_mb * inflight_factor(layout, m, stage)
    # one layer re-materialised during its backward (a kept layer's, in bf16, may be the largest)
    remat = max([*kept.values(), *kept16.values()]) if layout.recompute_kind in ("full", "op") else 0.0
    if layout.recompute_modules:  # a re-run module re-creates what it freed, one layer at a time
        remat = max(kept[k] - tb.activation_bytes(k, s, b, layout, lin, "selective") for k in kept)
    if work.dtype == "fp32":  # the per-tensor accounting is in 16-bit elements (Korthikanti et al.); fp32 keeps 4 B
        act, remat = 2 * act, 2 * remat
    ends: tuple[float, ...] = ()
    if stage == layout.pp - 1:
        logits = logits_held_bytes(model, layout, s)
        # each MTP application keeps its block's activations (and its eh_proj input, 2h) for every micro-batch
        # in flight on the last stage
        mtp = sum(tb.activation_bytes(k, s, b, layout, lin, "none", work.lora)
                  for k in mtp_kinds(model) if k in tb.shape)
        ends = (logits,
                model.num_mtp_layers * (mtp + 2.0 * 2 * s * b * model.hidden_size) * inflight_factor(layout, m, stage))
    return act, remat, ends, n_layers


def grads_born_in_backward(layout: Layout, m: int) -> bool:
    """Whether no gradient exists when a step's backward starts, where its activations peak.

    PyTorch training code frees the gradients between steps (``optimizer.zero_grad()`` sets them to None, the
    default since PyTorch 2.0; torchtitan's train loop calls it) and autograd's AccumulateGrad allocates each one
    when its backward runs, so with one micro-batch per step and no pipeline nothing is held yet at the backward's
    first op (measured on this host: ``bench/cpu_memory.py``). Not so for Megatron-Core (persistent main-grad
    buffers), for DDP (its reducer's buckets live for the run), or with accumulation (the first micro-batch's
    gradients are held through the others).
    """
    ddp = layout.zero_stage == 0 and layout.dp > 1
    return layout.stack != "megatron" and m == 1 and layout.pp == 1 and not ddp


def logits_held_bytes(model, layout: Layout, local_seq: int) -> float:
    """Bytes of one micro-batch's logits a last-stage rank holds at the backward's start, the main head's and each MTP
    module's (``logits_bytes_per_element``; vocabulary-parallel over tp); none under a fused linear cross-entropy
    (``Layout.linear_ce``)."""
    if layout.linear_ce:
        return 0.0
    # a final soft-cap (Gemma 2) keeps its tanh's bf16 output for backward beside the capped logits
    per = logits_bytes_per_element(layout) + (2.0 if model.logit_softcap else 0.0)
    return per * local_seq * layout.micro_batch * model.vocab_size / layout.tp * (1 + model.num_mtp_layers)


def logits_bytes_per_element(layout: Layout) -> float:
    """Peak bytes per logit at the start of backward, when every activation is still held.

    Megatron's vocab-parallel cross-entropy keeps the bf16 logits and computes the fp32 softmax in place (2 + 4).
    PyTorch code (torchtitan, HF) computes ``F.cross_entropy(logits.float(), labels)`` outside the compiled blocks
    (torchtitan compiles each TransformerBlock, not the loss: ``apply_compile`` in ``parallelize_llama.py``):
    log-softmax keeps its fp32 output (4), and its backward holds the incoming fp32 gradient (4) while writing the
    fp32 gradient of the logits (4): 12 bytes per logit at the peak.
    """
    return 6.0 if layout.stack == "megatron" else 12.0


def peak_memory(work: Workload, tb: ModelTables, layout: Layout, m: int):
    """The busiest rank's memory (``stage_memory``) of ``layout`` at ``m`` micro-batches: the first and the last
    stage, and under an uneven split the stage holding the most layers."""
    stages = {0, layout.pp - 1}
    if layout.pp_layout:  # an uneven split: the stage holding the most layers may be the peak
        stages.add(max(range(layout.pp), key=lambda i: layout.stage_num_layers(work.model.num_layers, i)))
    mems = [stage_memory(work, tb, layout, st, m) for st in sorted(stages)]
    return max(mems, key=lambda x: x.total_bytes)


def finish_estimate(work: Workload, tb: ModelTables, layout: Layout, m: int, *, step: float, compute_s: float,
                    exposed_comm_s: float, bubble_s: float, other_s: float,
                    pipeline_s: Optional[float] = None) -> Estimate:
    """The parts of an ``Estimate`` every estimator derives the same way: memory, FLOPs, rates, MFU."""
    dev = work.cluster.device
    mem = peak_memory(work, tb, layout, m)
    limit = int(dev.memory_bytes * USABLE_FRACTION)
    tokens = work.global_batch * work.seq_len
    per_token, extra_per_token = tb.flops_per_token(work.seq_len, layout)
    model_flops = per_token * tokens
    extra = extra_per_token * tokens
    world = layout.world_size
    return Estimate(
        step_time_s=step, compute_s=compute_s, exposed_comm_s=exposed_comm_s, bubble_s=bubble_s,
        other_s=other_s, memory=mem, model_flops=model_flops, hw_flops=model_flops + extra,
        tokens_per_s=tokens / step, tflops_per_device=model_flops / step / world / 1e12,
        hw_tflops_per_device=(model_flops + extra) / step / world / 1e12,
        mfu=model_flops / step / world / dev.peak(work.dtype), fits=mem.total_bytes <= limit,
        memory_limit_bytes=limit, pipeline_s=pipeline_s,
    )


# The fields that change one micro-batch's per-layer time: the estimators' cache keys read them from here only.
TIME_FIELDS = ("tp", "cp", "ep", "micro_batch", "recompute_kind", "sequence_parallel", "attention", "attention_dtype",
               "expert_tp", "fp8", "cp_kind", "stack", "moe_overlap", "moe_capacity", "moe_imbalance",
               "moe_dispatcher", "tp_overlap", "shared_overlap", "recompute_modules", "cuda_graphs", "moe_router",
               "moe_fused_mlp", "hybridep_sms", "sequence_first", "moe_router_fusion", "moe_aux_loss", "moe_impl",
               "cudnn_frontend")


_time_fields_of = operator.attrgetter(*TIME_FIELDS)  # one C call for the 28 (a search asks 10^5 times)


def block_scaled(work: Workload) -> bool:
    """Whether every device of the workload's cluster has block-scaled (MXFP8) tensor cores: Blackwell, where
    Transformer Engine lays fp8 weights out once and runs blockwise fp8 as MXFP8 (``memory``)."""
    return all(g.device.supports("mxfp8") for g in work.cluster.groups)


def time_signature(layout: Layout) -> tuple:
    """``TIME_FIELDS`` of ``layout`` as a plain tuple (a cheaper dictionary key than a ``Layout``)."""
    return _time_fields_of(layout)


def time_key(layout: Layout) -> Layout:
    """The layout reduced to ``TIME_FIELDS`` (what ``planner.estimate.ops_graph`` builds one micro-batch's op lists
    from)."""
    return _time_key_of(time_signature(layout))


@functools.lru_cache(maxsize=1 << 16)
def _time_key_of(sig: tuple) -> Layout:
    """``time_key`` of a layout whose ``time_signature`` is ``sig`` (one ``Layout`` per signature: a search asks
    10^4-10^5 times about a tenth as many)."""
    v = dict(zip(TIME_FIELDS, sig))
    v["recompute"] = v.pop("recompute_kind")
    etp = v.pop("expert_tp")
    v["etp"] = etp if etp != v["tp"] else 0
    return _DEFAULT_LAYOUT.with_(**v)  # ``Layout(**v)`` without the frozen per-field ``__init__``


_DEFAULT_LAYOUT = Layout()
