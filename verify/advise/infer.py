"""The layout a job ran, inferred from its traces, each part with how sure the inference is.

Confidence: ``high`` when the trace names it (a process group's size, a kernel's dtype, two sources agree),
``medium`` when one indirect source gives it (the weights' tensor-parallel slice, the one process group of the job),
``low`` when it is what the world size leaves once the rest is known, or a default nothing in the trace contradicts.

* degrees: a collective's group (``distributedInfo.pg_config``, the ranks a kernel names) and the phase it runs in:
  all-reduces (or reduce-scatters beside all-gathers) between the forward GEMMs are tensor parallelism (Megatron
  f/g operators); an all-gather of parameters in forward with a reduce-scatter in backward is ZeRO-3 / FSDP; a
  gradient all-reduce in backward is DDP, a reduce-scatter ZeRO-2; all-to-alls or DeepEP dispatch/combine kernels
  are expert parallelism; sends and receives are pipeline parallelism;
* micro-batches: pipeline sends per step per neighbour (one activation forward, one gradient back per micro-batch),
  else the backward passes a step starts (autograd ``GraphRoot`` nodes);
* recompute: forward GEMMs that run again inside backward nodes (``evidence``);
* CUDA graphs: ``cudaGraphLaunch`` calls per step (``_cuda_graphs``);
* precision: the dtype the GEMM kernels name;
* the model's shape: ``shape.guess_shape``.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

from meshplan.verify.advise.evidence import RankEvidence
from meshplan.verify.advise.shape import ShapeGuess, guess_shape, tp_from_shape

HIGH, MEDIUM, LOW = "high", "medium", "low"
MIN_PER_STEP = 2  # collectives of a kind per step before they say something about the layout (not a one-off)


@dataclass(frozen=True)
class Part:
    """One inferred part: its value, how sure (``high | medium | low``) and what it rests on."""

    value: object
    confidence: str
    evidence: str

    def as_dict(self) -> dict:
        return {"value": self.value, "confidence": self.confidence, "evidence": self.evidence}


@dataclass
class InferredLayout:
    """Every inferred part by name (``world_size``, ``tp``, ``pp``, ``dp_replicate``, ``dp_shard``, ``zero``,
    ``ep``, ``micro_batch``, ``micro_batches``, ``recompute``, ``dtype``, ``fp8``, ``cuda_graphs``, ``seq_len``,
    ``global_batch``),
    the shape guess, and whether the trace holds a backward pass."""

    parts: dict[str, Part] = field(default_factory=dict)
    shape: ShapeGuess | None = None
    backward: bool = False
    dtensor: bool = False  # the linears ran on DTensors: their recorded shapes are the whole weights

    def value(self, key: str, default=None):
        p = self.parts.get(key)
        return default if p is None else p.value

    def as_dict(self) -> dict:
        return {k: p.as_dict() for k, p in self.parts.items()}


def _kinds(ev: RankEvidence) -> dict[tuple[str, str], list]:
    out: dict[tuple[str, str], list] = {}
    for c in ev.collectives:
        out.setdefault((c.coll, c.phase), []).append(c)
    return out


def _size(cs: list) -> int | None:
    sizes = Counter(c.group_size for c in cs if c.group_size)
    return sizes.most_common(1)[0][0] if sizes else None


def _frequent(kinds, key, steps) -> list:
    cs = kinds.get(key, [])
    return cs if len(cs) / steps >= MIN_PER_STEP else []


def _tp(ev: RankEvidence, kinds, shape: ShapeGuess | None, world: int) -> Part:
    fwd = _frequent(kinds, ("allreduce", "forward"), ev.steps) or _frequent(kinds, ("reducescatter", "forward"),
                                                                          ev.steps)
    by_shape = tp_from_shape(shape) if shape else None
    if not fwd:
        if by_shape and by_shape > 1:
            return Part(by_shape, MEDIUM, f"no collective between forward GEMMs, but the attention out-projection "
                                          f"reads {shape.attn_in} of {shape.hidden} columns")
        return Part(1, HIGH if ev.backward_nodes else MEDIUM, "no all-reduce or reduce-scatter between the forward "
                                                             "GEMMs")
    size = _size(fwd)
    what = f"{len(fwd) / ev.steps:.0f} forward {fwd[0].coll}s per step"
    if size:
        agree = by_shape in (None, size)
        return Part(size, HIGH if agree else MEDIUM, f"{what} over groups of {size}"
                    + ("" if agree else f" (the weights' slices say {by_shape})"))
    if by_shape:
        return Part(by_shape, HIGH if world % by_shape == 0 else LOW,
                    f"{what}, group not named; the attention out-projection reads {shape.attn_in} of {shape.hidden} "
                    f"columns")
    return Part(world, LOW, f"{what}, group not named: taken as the whole world")


def _pp(evs: list[RankEvidence], world: int) -> Part:
    senders = [e for e in evs if e.sends or e.recvs]
    if not senders:
        return Part(1, HIGH if any(e.backward_nodes for e in evs) else MEDIUM, "no pipeline send or receive")
    peers = set().union(*(e.peers for e in senders)) | {e.rank for e in senders}
    if len(evs) == world and all(e.peers for e in senders):
        # every rank present: a stage's peers are the neighbouring stages; ranks per chain = stages
        ends = [e for e in senders if len(e.peers) == 1]
        chains = max(1, len(ends) // 2)
        return Part(len(senders) // chains, HIGH, f"sends and receives chain {len(senders)} ranks into {chains} "
                                                  f"pipeline(s)")
    return Part(max(2, len(peers)), LOW, f"sends and receives between ranks {sorted(peers)}; the other stages "
                                         "are not in the traces")


def _dp(ev: RankEvidence, kinds, world: int, rest: int) -> tuple[Part, Part, Part]:
    """(dp_replicate, dp_shard, zero) from the backward gradient reductions and forward parameter gathers."""
    steps = ev.steps
    gather = _frequent(kinds, ("allgather", "forward"), steps)
    scatter = kinds.get(("reducescatter", "backward"), [])
    reduce = kinds.get(("allreduce", "backward"), [])
    left = max(1, world // rest)
    if not ev.backward_nodes:
        return (Part(left, LOW, "forward-only trace: no gradient reduction to see; what the world leaves"),
                Part(1, LOW, "forward-only trace"), Part(0, LOW, "forward-only trace"))
    if scatter:
        size = _size(scatter) or left
        zero = 3 if gather else 2
        conf = HIGH if _size(scatter) else MEDIUM
        why = (f"{len(scatter) / steps:.0f} gradient reduce-scatters per step"
               + (f" and {len(gather) / steps:.0f} parameter all-gathers in forward" if gather else ""))
        repl = max(1, left // size)
        return (Part(repl, conf, f"what the world leaves beside dp_shard {size}"),
                Part(size, conf, why + f" over groups of {size}"), Part(zero, conf, why))
    if reduce:
        size = _size(reduce)
        conf = HIGH if size else MEDIUM
        return (Part(size or left, conf, f"{len(reduce) / steps:.0f} gradient all-reduces per step in backward"
                     + (f" over groups of {size}" if size else ", group not named: what the world leaves")),
                Part(1, conf, "gradients all-reduced, not sharded"), Part(0, conf, "no reduce-scatter"))
    return (Part(left, LOW, "no gradient reduction seen: what the world leaves"), Part(1, LOW, "no reduce-scatter"),
            Part(0, LOW, "no reduce-scatter"))


def _ep(ev: RankEvidence, kinds, world: int, tp: int, pp: int) -> Part:
    a2a = _frequent(kinds, ("alltoall", "forward"), ev.steps) + kinds.get(("alltoall", "backward"), [])
    if ev.deepep_kernels or a2a:
        size = _size(a2a)
        what = (f"{ev.deepep_kernels} DeepEP dispatch/combine kernels" if ev.deepep_kernels
                else f"{len(a2a) / ev.steps:.0f} all-to-alls per step")
        if size:
            return Part(size, HIGH, f"{what} over groups of {size}")
        left = max(1, world // (tp * pp))
        return Part(left, MEDIUM, f"{what}, group not named: the world over tp {tp} x pp {pp}")
    return Part(1, HIGH if ev.backward_nodes else MEDIUM, "no all-to-all and no DeepEP kernel")


def _micro_batches(ev: RankEvidence, pp: int) -> Part:
    if pp > 1 and ev.sends:
        neighbours = max(1, min(2, len(ev.peers))) if ev.peers else 1
        m = max(ev.sends, ev.recvs) / neighbours
        return Part(max(1, round(m)), HIGH if ev.peers else MEDIUM,
                    f"{ev.sends:.0f} sends and {ev.recvs:.0f} receives per step to {neighbours} neighbour stage(s)")
    if ev.graph_roots >= 1:
        return Part(round(ev.graph_roots), HIGH, f"{ev.graph_roots:.0f} backward passes started per step")
    return Part(1, LOW, "no backward pass started in the trace")


def _recompute(ev: RankEvidence) -> Part:
    if not ev.forward_ops:
        return Part("none", LOW, "no forward GEMM recorded")
    ratio = ev.recomputed_ops / ev.forward_ops
    what = f"{ev.recomputed_ops:.0f} of {ev.forward_ops:.0f} forward GEMMs per step run again inside backward"
    if ratio >= 0.9:
        return Part("full", HIGH, what)
    # whole blocks re-run: every GEMM of a recomputed shape runs again, while the ones outside the blocks (LM head)
    # never do; an op-level policy (torchtitan's selective op AC saves every other matmul) re-runs part of a shape
    if ev.recomputed_kinds_ops and ev.recomputed_ops / ev.recomputed_kinds_ops >= 0.9:
        return Part("full", MEDIUM, f"{what}; so do all {ev.recomputed_kinds_ops:.0f} forward calls of their shapes: "
                    "whole blocks re-run, the rest lie outside them")
    if ratio > 0:
        return Part("selective", MEDIUM, what)
    if ev.recomputed_attention:  # selective recompute (Korthikanti et al. 2022): only the attention core again
        return Part("selective", HIGH, f"{what}; {ev.recomputed_attention:.0f} of {ev.attention_ops:.0f} attention "
                    "calls per step run again inside backward")
    return Part("none", HIGH if ev.backward_nodes else LOW, what)


def _cuda_graphs(ev: RankEvidence) -> Part:
    """What ran as CUDA graphs, from the graph launches a step makes: none, one replay for the whole step, or more
    (parts of it captured, priced as per-layer graphs). ``job.ran_layout`` applies Megatron-Core's capture rules."""
    n = ev.graph_launches
    if not n:
        return Part("none", HIGH if ev.has_gpu else LOW, "no cudaGraphLaunch call")
    what = f"{n:.1f} cudaGraphLaunch calls per step"
    if n <= 1:
        return Part("iteration", MEDIUM, f"{what}: one graph replays the whole step")
    return Part("layers", MEDIUM, f"{what}: parts of the step captured, priced as per-layer graphs")


def _precision(evs: list[RankEvidence]) -> tuple[Part, Part]:
    counts = sum((e.gemm_dtypes for e in evs), Counter())
    if not counts:
        if not any(e.has_gpu for e in evs):
            return (Part("fp32", MEDIUM, "CPU trace: PyTorch trains in fp32 on CPU (no kernel names a dtype)"),
                    Part("none", HIGH, "CPU trace"))
        return Part("bf16", LOW, "no GEMM kernel names its dtype"), Part("none", LOW, "no GEMM kernel named")
    dtype, n = counts.most_common(1)[0]
    what = ", ".join(f"{k} {v}" for k, v in counts.most_common())
    if dtype == "fp8":
        half = next((k for k, _ in counts.most_common() if k in ("bf16", "fp16")), "bf16")
        recipe = Counter(r for e in evs for r in e.fp8_recipes).most_common(1)
        recipe_part = (Part(recipe[0][0], MEDIUM, f"fp8 cast kernels scale per {recipe[0][0]} tiles") if recipe
                       else Part("tensorwise", LOW, "fp8 GEMMs; no cast kernel names its scaling"))
        return Part(half, MEDIUM, f"GEMM kernels by dtype: {what}; the rest of the math in {half}"), recipe_part
    return Part(dtype, HIGH, f"GEMM kernels by dtype: {what}"), Part("none", HIGH, f"GEMM kernels by dtype: {what}")


def _mesh(sizes: dict, world: int, tp: Part, tp_seen: bool) -> dict[str, Part]:
    """Parts the job's DeviceMesh names (``pg_config`` groups ``mesh_<dim>``, as torch's ``init_device_mesh`` and
    torchtitan describe them). A dimension spanning the whole world reuses the default group and is not listed:
    tensor parallelism, when forward collectives show one, is what the listed dimensions leave."""
    known = {k: v for k, v in sizes.items() if k in ("tp", "pp", "dp_replicate", "dp_shard", "cp", "ep")}
    out = {k: Part(v, HIGH, f"process group mesh_{k} of {v} rank(s) (pg_config)") for k, v in known.items()}
    if known and "tp" not in known and (tp.value > 1 or tp_seen):
        rest = 1
        for k in ("pp", "dp_replicate", "dp_shard", "cp"):
            rest *= known.get(k, 1)
        if world % rest == 0:
            listed = ", ".join(f"mesh_{k} {v}" for k, v in known.items())
            out["tp"] = Part(world // rest, HIGH, f"{tp.evidence}; the mesh's other groups ({listed}) leave "
                                                  f"{world // rest} of {world} ranks")
    return out


def infer_layout(evs: list[RankEvidence], world: int) -> InferredLayout:
    """The layout ``evs`` (one per rank present, rank 0 first) show for a job of ``world`` ranks."""
    ev = evs[0]
    kinds = _kinds(ev)
    out = InferredLayout(backward=ev.backward_nodes > 0, dtensor=ev.dtensor)
    pp = _pp(evs, world)
    m0 = _micro_batches(ev, pp.value)
    out.shape = guess_shape(ev.linear_shapes, ev.attention_shapes, ev.bmm_shapes, m0.value * ev.steps)
    if out.shape is not None and out.shape.head_out is None:  # a pipeline's LM head is on its last stage
        for other in evs[1:]:
            g = guess_shape(other.linear_shapes, other.attention_shapes, other.bmm_shapes, m0.value * other.steps)
            if g is not None and g.head_out:
                out.shape = replace(out.shape, head_out=g.head_out)
                break
    tp = _tp(ev, kinds, None if ev.dtensor else out.shape, world)
    mesh = _mesh(ev.mesh, world, tp, bool(_frequent(kinds, ("allreduce", "forward"), ev.steps)))
    tp, pp = mesh.get("tp", tp), mesh.get("pp", pp)
    ep = mesh.get("ep") or _ep(ev, kinds, world, tp.value, pp.value)
    repl, shard, zero = _dp(ev, kinds, world, tp.value * pp.value)
    repl, shard = mesh.get("dp_replicate", repl), mesh.get("dp_shard", shard)
    dtype, fp8 = _precision(evs)
    rs = _frequent(kinds, ("reducescatter", "forward"), ev.steps)
    sp = Part(bool(rs) and tp.value > 1, tp.confidence,
              "activations reduce-scattered in forward (sequence parallel)" if rs else "no forward reduce-scatter")
    out.parts = {"world_size": Part(world, HIGH, "distributedInfo.world_size"), "tp": tp, "sp": sp, "pp": pp,
                 "dp_replicate": repl, "dp_shard": shard, "zero": zero, "ep": ep, "micro_batches": m0,
                 "recompute": _recompute(ev), "dtype": dtype, "fp8": fp8, "cuda_graphs": _cuda_graphs(ev)}
    g = out.shape
    if g is not None and g.micro_batch:
        out.parts["micro_batch"] = Part(g.micro_batch, HIGH if g.seq_len else MEDIUM,
                                        "the batch dimension of the attention / linear inputs")
        if g.seq_len:
            out.parts["seq_len"] = Part(g.seq_len, HIGH, "the sequence dimension of the attention inputs")
        dp = repl.value * shard.value
        conf = min((repl.confidence, m0.confidence), key=(LOW, MEDIUM, HIGH).index)
        out.parts["global_batch"] = Part(g.micro_batch * m0.value * dp, conf,
                                         f"micro-batch {g.micro_batch} x {m0.value} micro-batches x dp {dp}")
    return out
