"""Search: the fastest candidate layouts that fit, ranked by predicted step time; ``Plan`` s built from them.

The answer is the one pricing every candidate of ``planner.layout.space`` gives (``search(..., prune=False)`` does,
``tests/test_search_pruning.py`` checks the two agree), found by a best-first branch and bound that prices a few
percent of the space (``bench/plan_speed.py``, BENCHMARKS.md "Planner: search speed": DeepSeek-V3 on 16,384 H100,
931 pricings of 547,060 candidates).

The space comes as ``planner.layout.space.LayoutGroup`` s: candidates that share every decision but recomputation and
the sharding of the data-parallel states (zero stage, dp_shard). The bounds rest on facts about any step-time model,
not on how the estimator prices a decision:

1. The per-micro-batch part of a step (pipeline: m x the slowest stage, plus the bubble) does not depend on how
   the data-parallel states are sharded: sharding adds communication and shrinks the optimizer step, both outside
   it (ZeRO-3's per-micro-batch gathers add to it). It bounds every member of a recompute variant from below.
   Where the estimator prices that part alone (the GPU estimator's ``pipeline_bound_s``) no member is priced for
   it; else ZeRO-0 (and DDP's one all-reduce per step) puts nothing per micro-batch outside it, so pricing a
   group's first ZeRO-0 member at the global batch and at twice it gives that part: step(2B) - step(B) = m x the
   stage time, plus ``bubble_s``.
2. Recomputation only adds to the per-micro-batch part, so recompute=none's bound holds a whole group until it
   comes up. (Not to the step: more compute hides more of the gradient sync and ZeRO-3's gathers, so a recompute
   variant may step faster than its recompute=none twin, and none is skipped for its twin's time.)
3. More sharding never needs more memory: per zero stage, members are priced from the largest dp_shard down and
   the first that does not fit ends that stage. Not where FSDP2 runs under torch.distributed.pipelining
   (``memory.holds_whole_stage``: a stage held whole beside its shards, so an unsharded part holds less than a
   sharded one): there every member of the stage is priced.
4. No member fits whose activations and runtime overhead alone exceed the GPU (``memory_floor_bytes``: no sharding
   changes them), so such a family is never priced. When nothing fits at all, the search runs again pricing them,
   so that its error names the closest miss exhaustive search would.
5. The slowest stage holds at least the mean: a group's first bound is its micro-batch's work (every layer's
   compute and exposed comm, the embedding, the head) spread evenly over the stages, with the straggler share and
   bubble of that mean (the GPU estimator's ``work_bounds_s``). Groups of one time signature share it, so the
   search prices it once per signature, the ops of them all in one cost-model call per op class; a group's own
   pipeline part (1.) is priced only when its first bound comes up (2,119 of 47,391 groups for Qwen3-30B-A3B on
   128 H100).
6. Where the estimator bounds a whole group from its recompute=none variant (the GPU estimator's ``group_bound_s``,
   single-stage pipelines: the pipeline part plus each sharding's exposed sync at the most compute any
   recomputation could add, since more compute only hides more of it), a group whose pipeline part comes up is
   pushed back at that bound before its recompute variants are bounded one by one: a group whose gradient sync or
   ZeRO-3 gathers alone keep it out of the top K is never expanded (DeepSeek-V3 on 16,384 H100: 931 -> 226
   pricings).
7. Where it also gives what any member of a group adds to its pipeline part (the GPU estimator's ``sync_floor_s``,
   single-stage pipelines: each sharding's exposed gradient sync with compute enough to hide all it can, plus its
   optimizer step, from the sync table the group bound reads), a group's work bound comes up first with that floor
   added, and its pipeline part with it (DeepSeek-V3 on 16,384 H100: 1,702 -> 873 pipeline parts, 1,078 -> 249 group
   bounds).

8. Where it gives a bound on a group's work without pricing the group's own ops (the GPU estimator's
   ``recipe_twin_bounds_s``: a tensor-wise, block-wise or MXFP8 group's delayed-scaling twin's work, at no higher a
   price op by op), that is the group's first bound, and its own work bound is priced only when it comes up and
   checked against it (DeepSeek-V3 on 8 GB200 NVL72 racks in fp8, the recipe free: 792 of 8,906 such groups priced).

Groups are expanded in order of their bound (the first bound, then the pipeline part); once a bound rounds (as
``_rank_key`` rounds) above the K-th best step found, nothing left can enter the top K and the search stops. Within
an expanded variant, an estimator that gives step times alone (the GPU estimator's ``shard_step_times_s``: the same
floats as ``estimate``, the pipeline part shared, each sharding's collectives priced once) tells the members that
round above the K-th best before their memory is priced: they are never priced in full (``SearchResult.timed``; a
family none of whose members can rank is timed out at once). Ties rank by the canonical enumeration order, as an
exhaustive search would. Every pair the search does price is checked against the facts
(with the bounds' 1e-6 slack); a contradiction (an estimator change that breaks one) makes it price every candidate
instead, and ``SearchResult.fallback`` says why. A contradiction only among pairs it never priced goes unseen:
``tests/test_search_pruning.py`` is the check that catches those.
"""
from __future__ import annotations

import gc
import heapq
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, NamedTuple, Optional

from meshplan.core.errors import MeshplanError
from meshplan.planner.estimate.base import Estimate, Estimator, Workload, logits_held_bytes
from meshplan.planner.estimate.memory import GiB, holds_whole_stage
from meshplan.planner.estimate.select import estimator_for
from meshplan.planner.layout.decisions import DECISIONS
from meshplan.planner.layout.layout import Layout
from meshplan.planner.layout.space import (
    MAX_LAYOUTS,
    Pins,
    check_fp8_pin,
    check_space_size,
    enumerate_groups,
    explain_empty,
    fp8_attention_recipes,
    fp8_recipe_choices,
    free_dispatcher,
    offload_priced,
)
from meshplan.planner.layout.splits import format_pp_layout
from meshplan.planner.search.uneven_pp import uneven_pp_choices


class Priced(NamedTuple):
    """One priced layout, compactly: what a chart of step time against memory needs."""

    layout: Layout
    step_time_s: float
    peak_memory_bytes: int
    fits: bool


@dataclass
class SearchResult:
    """Ranked feasible candidates (best first) and the search's own figures.

    ``candidates``: layouts in the space; ``evaluated``: those priced (all of them when ``pruned`` is False);
    ``feasible``: the priced ones that fit; ``bound_evals``: extra pricings of a group's first member at twice the
    global batch, for its lower bound (``planner.search.exact`` module notes). ``closest_miss``: the priced candidate
    that misses memory by the least (when nothing fits, the pruned search prices every group and skips only
    members that need at least as much memory as one it priced).
    """

    ranked: list[tuple[Layout, Estimate]]
    evaluated: int
    feasible: int
    wall_s: float
    closest_miss: Optional[tuple[Layout, Estimate]] = None
    invalid_reasons: list[str] = field(default_factory=list)
    candidates: int = 0
    pruned: bool = False
    bound_evals: int = 0
    fallback: str = ""  # why a pruned search fell back to pricing everything ("" = it did not)
    priced: list[Priced] = field(default_factory=list)  # every layout priced, in pricing order (a report's scatter)
    timed: int = 0  # members whose step time alone showed they cannot rank (never priced in full)
    unfit: int = 0  # members whose activations alone showed no sharding of them fits (never priced)
    uneven_pp: int = 0  # the uneven pipeline degree searched because no free layout split the batch (0: none)
    even_batches: tuple[int, ...] = ()  # then: the nearest global batches the layouts with even stages split



# The states of a branch-and-bound heap item (``_branch_and_bound``): its bound is final, or can be tightened.
_FINAL, _REP, _WORK, _GROUP, _FLOOR, _TWIN = 0, 1, 2, 3, 4, 5
# Twin-bounded groups (``_TWIN``) whose own work bounds are priced in one batch when the first of them comes up
_TWIN_BATCH = 64
# A free search prunes when the space holds more candidates than this; below it pricing everything is as quick.
PRUNE_ABOVE = 2000
# Every bound is taken 1e-6 below what it is computed as, and a priced pair contradicts an assumption only beyond
# that: float noise (a bound and a step summed in different orders) is far below it.
_REL = 1e-6


class _Fallback(Exception):
    """A pruning assumption failed on a pair the search priced: price everything instead."""


class _Ranker:
    """Prices members, keeps the top-K (rank key, canonical index) and the closest miss, counts."""

    def __init__(self, work: Workload, estimate, top: int, progress, step_times=None, pipeline_bound=None,
                 work_bounds=None, cannot_fit=None, group_bound=None, sync_floor=None, twin_bounds=None):
        self.work, self.estimate, self.top, self.progress = work, estimate, top, progress
        self.step_times = step_times  # the estimator's step times alone, per sharding (``None``: it has none)
        self.pipeline_bound = pipeline_bound  # its pipeline part + bubble alone (``None``: it has none)
        self.work_bounds = work_bounds  # bounds below that, for many layouts at once (``None``: it has none)
        self.cannot_fit = cannot_fit  # whether no sharding of a layout fits (``None``: it cannot tell)
        self.group_bound = group_bound  # a bound on a group's every member (``None``: it has none)
        self.sync_floor = sync_floor  # what every member adds to its pipeline part (``None``: it cannot tell)
        self.twin_bounds = twin_bounds  # bounds below work_bounds' without pricing the layouts' own ops (or ``None``)
        self.unfit = 0  # members never priced: no sharding of their layout fits
        self.timed = 0  # members whose step time alone showed they cannot rank: never priced in full
        m = work.model
        self.vkw = dict(world_size=work.cluster.world_size, num_layers=m.num_layers, num_heads=m.num_heads,
                        num_kv_heads=m.num_kv_heads, seq_len=work.seq_len, global_batch=work.global_batch,
                        num_experts=m.num_experts)
        self.kept: list = []  # max-heap by negated (rank key, index) of the K best so far
        self.evaluated = self.feasible = 0
        self.closest = None
        self.invalid: list[str] = []
        self.done: dict[tuple, Optional[Estimate]] = {}  # (group, r, s) -> estimate (None: invalid)
        self.priced: list[Priced] = []

    def price(self, gi: int, g, r: int, s: int) -> Optional[Estimate]:
        """The estimate of member (r, s) of group ``gi`` (priced and ranked once; ``None`` if invalid)."""
        key = (gi, r, s)
        if key in self.done:
            return self.done[key]
        layout = g.member(r, s)
        try:
            layout.validate(**self.vkw)
        except MeshplanError as exc:
            if len(self.invalid) < 5:
                self.invalid.append(str(exc))
            self.done[key] = None
            return None
        self.evaluated += 1
        self.tick()
        est = self.done[key] = self.estimate(self.work, layout)
        self.priced.append(Priced(layout, est.step_time_s, est.memory.total_bytes, est.fits))
        if not est.fits:
            miss = (est.memory.total_bytes - est.memory_limit_bytes, key)
            if self.closest is None or miss < self.closest[0]:
                self.closest = (miss, layout, est)
            return est
        self.feasible += 1
        k = _rank_key(layout, est)
        item = (-k[0], -k[1], -k[2], (-gi, -r, -s), layout, est)
        if len(self.kept) < self.top:
            heapq.heappush(self.kept, item)
        elif item[:4] > self.kept[0][:4]:
            heapq.heapreplace(self.kept, item)
        return est

    def tick(self) -> None:
        """Report progress every 512 layouts looked at (priced, or timed out of the ranking)."""
        if self.progress and (self.evaluated + self.timed) % 512 == 0:
            self.progress(self.evaluated + self.timed)

    def tick_many(self, n: int) -> None:
        """``n`` members timed out of the ranking at once (``tick``'s report when the count passes a multiple of
        512)."""
        before = self.evaluated + self.timed
        self.timed += n
        if self.progress and (before + n) // 512 > before // 512:
            self.progress(before + n)

    def kth_time(self) -> float:
        """The rounded step time of the K-th best so far (inf until K fit): a bound above it ranks after it."""
        return -self.kept[0][0] if len(self.kept) >= self.top else math.inf

    def ranked(self) -> list[tuple[Layout, Estimate]]:
        return [(it[4], it[5]) for it in sorted(self.kept, key=lambda it: it[:4], reverse=True)]


def pinned_work(work: Workload, fix: Pins) -> tuple[Workload, Pins]:
    """The workload with the pins that change what is trained applied to its model, and the pins with the model's
    own MTP depth when ``mtp`` is free: ``mtp`` counts that many MTP modules (``ModelSpec.with_mtp``). A module
    list naming a module the model lacks is refused as Megatron-Core refuses it (``TransformerConfig``:
    mla_up_proj needs multi-latent attention, moe_act the MoE grouped GEMM)."""
    model = work.model
    mods = str(fix.get("recompute_modules", "")).split("+")
    if "mla_up_proj" in mods and not (model.q_lora_rank or model.kv_lora_rank):
        raise MeshplanError(f"--fix recompute_modules={fix.recompute_modules}: mla_up_proj recomputes multi-latent "
                            f"attention's up-projections; model {model.name} has no MLA")
    if "moe_act" in mods and not model.num_experts:
        raise MeshplanError(f"--fix recompute_modules={fix.recompute_modules}: moe_act recomputes the routed experts' "
                            f"activation; model {model.name} has no experts")
    if "mtp" not in fix:
        return work, fix.with_(mtp=model.num_mtp_layers) if model.num_mtp_layers else fix
    if fix.mtp and not model.config_mtp_layers:
        raise MeshplanError(f"--fix mtp={fix.mtp}: model {model.name} has no multi-token-prediction module (its "
                            "config's num_nextn_predict_layers is 0)")
    if fix.mtp != model.num_mtp_layers:
        try:
            work = replace(work, model=model.with_mtp(fix.mtp))
        except MeshplanError as exc:
            raise MeshplanError(f"--fix mtp={fix.mtp}: {exc}") from None
    return work, fix


def search(work: Workload, fix: Pins | Mapping[str, object] | None = None, top: int = 10,
           progress: Callable[[int], None] | None = None, estimator: Estimator | None = None,
           max_layouts: int = MAX_LAYOUTS, fp8_recipes: tuple[str, ...] | None = None,
           prune: bool | None = None) -> SearchResult:
    """The ``top`` fastest layouts of the space that fit in memory, exactly as pricing every candidate finds them.

    Args:
        work: Model, cluster, batch, sequence, dtype.
        fix: Pinned decisions (``planner.layout.space.Pins``, or a mapping of ``--fix`` keys).
        top: How many ranked layouts to keep.
        progress: Called with the count of layouts looked at so far (priced, or shown by their step time alone
            not to rank).
        estimator: What prices a layout (``planner.estimate.select.estimator_for``; ``None``: the cluster's, with the
            shipped cost model and neutral host terms).
        max_layouts: Refuse, before enumerating, a space that could hold more candidates
            (``planner.layout.space.check_space_size``).
        fp8_recipes: the recipes a free ``fp8`` tries (``None``: ``planner.layout.space.fp8_recipe_choices`` of the
            workload's dtype and device).
        prune: branch and bound (module notes) or price every candidate; ``None``: prune spaces of more than
            ``PRUNE_ABOVE`` candidates.

    Raises:
        MeshplanError: a pinned value breaks a rule (the rule and numbers), or nothing fits (the closest
            candidate and by how many GiB it misses).
    """
    with _gc_paused():
        try:
            return _search(work, fix, top, progress, estimator, max_layouts, fp8_recipes, prune)
        except UnsplitBatch as unsplit:
            return _search_uneven_pp(work, Pins.of(fix), unsplit, top, progress, estimator, max_layouts,
                                     fp8_recipes, prune)


def _search_uneven_pp(work: Workload, fix: Pins, unsplit: "UnsplitBatch", top: int, progress, estimator,
                      max_layouts: int, fp8_recipes, prune) -> SearchResult:
    """No free layout splits the global batch: search each uneven pipeline degree that would
    (``planner.search.uneven_pp``) as if pinned, and keep the one whose best layout is fastest; the original refusal
    where none plans (or the pipeline degree or its layout was pinned)."""
    if "pp" in fix or fix.pp_layout is not None:
        raise unsplit
    choices = uneven_pp_choices(work.model.num_layers, work.cluster.world_size, work.global_batch,
                                int(fix.get("mbs", 1)), work.cluster.nvlink_width)
    best, base = None, 0
    for pp in choices:
        counted = (lambda n, b=base: progress(b + n)) if progress else None  # one running count over the searches
        try:
            res = _search(work, fix.with_(pp=pp), top, counted, estimator, max_layouts, fp8_recipes, prune)
        except MeshplanError:
            continue
        base += res.evaluated + res.timed
        if best is None or res.ranked[0][1].step_time_s < best.ranked[0][1].step_time_s:
            best = replace(res, uneven_pp=pp, even_batches=unsplit.batches)
    if best is None:
        raise unsplit
    return best


@contextmanager
def _gc_paused():
    """Python's cyclic garbage collector off for the duration (and back as it was): a search allocates 10^6 small
    objects that form no cycles, and each collection it triggers walks the estimator's caches (15-27% of a search's
    time measured on the benchmark corpus, BENCHMARKS.md "Planner: search speed")."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _search(work: Workload, fix, top: int, progress, estimator, max_layouts: int, fp8_recipes, prune) -> SearchResult:
    """``search``, the collector paused."""
    t0 = time.perf_counter()
    work, fix = pinned_work(work, Pins.of(fix))
    model, cluster = work.model, work.cluster
    if top < 1:
        raise MeshplanError(f"top={top}: a search keeps at least one layout")
    if cluster.is_heterogeneous:
        raise MeshplanError(f"cluster {cluster.spec} is heterogeneous; use the partition solver "
                            "(meshplan plan picks it automatically for mixed clusters)")
    check_fp8_pin(fix, work.dtype)
    if fp8_recipes is None:
        fp8_recipes = fp8_recipe_choices(work.dtype, cluster.device)
    fp8_recipes = fp8_attention_recipes(fix, tuple(fp8_recipes), work.dtype)
    check_space_size(model, cluster.world_size, cluster.nvlink_width, work.global_batch, fix, max_layouts,
                     fp8_recipes, work.seq_len)
    if estimator is None:
        estimator = estimator_for(cluster)
    if fix.get("recompute_modules") and getattr(estimator, "recompute_kinds", None) is not None:
        raise MeshplanError(f"--fix recompute_modules={fix.recompute_modules}: {cluster.spec} is priced from this "
                            "host's timed blocks, which run Megatron's default selective recomputation only")
    groups = list(enumerate_groups(model, cluster.world_size, cluster.nvlink_width, work.global_batch,
                                   work.seq_len, fix, fp8_recipes, getattr(estimator, "recompute_kinds", None),
                                   graphs=cluster.device.vendor == "nvidia",
                                   dispatcher=free_dispatcher(cluster.device, float(fix.get("moe_capacity", 0.0))),
                                   offload=offload_priced(cluster.device)))
    n = sum(len(g) for g in groups)
    if prune is None:
        prune = n > PRUNE_ABOVE
    fallback = ""
    bound_evals = 0
    if prune:
        for unfit in (getattr(estimator, "cannot_fit", None), None):
            rk = _Ranker(work, estimator.estimate, top, progress, getattr(estimator, "shard_step_times_s", None),
                         getattr(estimator, "pipeline_bound_s", None), getattr(estimator, "work_bounds_s", None),
                         unfit, getattr(estimator, "group_bound_s", None), getattr(estimator, "sync_floor_s", None),
                         getattr(estimator, "recipe_twin_bounds_s", None))
            try:
                bound_evals = _branch_and_bound(rk, groups, estimator.estimate)
            except _Fallback as exc:
                fallback = str(exc)
                prune = False
                break
            if rk.kept or not rk.unfit:
                break  # else nothing fits: search again for the closest miss
            memory_of = getattr(estimator, "peak_memory_bytes", None)
            if memory_of is not None:  # its memory alone finds it, the closest priced in full for the message
                rk = _closest_by_memory(work, groups, rk, memory_of, getattr(estimator, "memory_floor_bytes", None),
                                        top, progress)
                break
    if not prune:
        rk = _Ranker(work, estimator.estimate, top, progress)
        for gi, g in enumerate(groups):
            for r in range(len(g.recomputes)):
                for s in range(len(g.shards)):
                    rk.price(gi, g, r, s)
    if progress:
        progress(rk.evaluated + rk.timed)
    wall = time.perf_counter() - t0
    _refuse_empty(rk, work, fix, lambda: _batch_units(work, fix, fp8_recipes))
    closest = rk.closest[1:] if rk.closest else None
    ranked = _time_balanced(work, estimator, fix, rk.ranked())
    seen = {p.layout for p in rk.priced}  # a time-balanced re-split is priced outside the ranker
    extra = [Priced(lay, est.step_time_s, est.memory.total_bytes, est.fits) for lay, est in ranked if lay not in seen]
    return SearchResult(ranked, rk.evaluated, rk.feasible, wall, closest, rk.invalid, candidates=n,
                        pruned=prune, bound_evals=bound_evals, fallback=fallback, priced=rk.priced + extra,
                        timed=rk.timed, unfit=rk.unfit)


def _closest_by_memory(work: Workload, groups: list, first: _Ranker, memory_of, floor_of, top: int,
                       progress) -> _Ranker:
    """A ranker holding the closest miss where nothing fits (``first``: a pass that priced some members and found
    none fitting): the member of least peak memory (``memory_of``, the bytes ``estimate`` would predict), looked for
    by memory alone and then priced in full for the message. A recomputation whose floor (``floor_of``, below every
    sharding's memory) exceeds the least found is skipped, and within one ZeRO stage only the most sharded valid
    member is asked (less sharding holds at least as much, except under ``holds_whole_stage``, where all are)."""
    rk = _Ranker(work, first.estimate, top, progress)
    rk.invalid, rk.evaluated = list(first.invalid), first.evaluated
    best = None  # ((peak bytes, canonical index), group)
    for (gi, r, s), est in first.done.items():
        if est is not None and (best is None or (est.memory.total_bytes, (gi, r, s)) < best[0]):
            best = ((est.memory.total_bytes, (gi, r, s)), groups[gi])
    for gi, g in enumerate(groups):
        for r in range(len(g.recomputes)):
            if floor_of is not None and best is not None and _floor(floor_of, work, g.member(r, 0)) > best[0][0]:
                continue
            for z, ss in _by_zero(g).items():
                monotone = not holds_whole_stage(g.base, z)
                for s in sorted(ss, key=lambda s: -g.shards[s][1]):
                    key = (gi, r, s)
                    peak = _peak_of(rk, first, memory_of, g, key)
                    if peak is None:
                        continue
                    if best is None or (peak, key) < best[0]:
                        best = ((peak, key), g)
                    if monotone:
                        break
    if best is not None:
        (_, (gi, r, s)), g = best
        est = first.done.get((gi, r, s))
        if est is None:
            rk.evaluated -= 1  # counted again as it is priced
            est = rk.price(gi, g, r, s)
        rk.closest = (est.memory.total_bytes - est.memory_limit_bytes, g.member(r, s), est)
    return rk


def _floor(floor_of, work: Workload, layout: Layout) -> float:
    """``floor_of`` the layout, or 0 where it cannot be priced (pricing it validates it and says why)."""
    try:
        return floor_of(work, layout)
    except (MeshplanError, ArithmeticError):
        return 0.0


def _by_zero(g) -> dict[int, list[int]]:
    """The shard indices of group ``g`` by their ZeRO stage."""
    out: dict[int, list[int]] = {}
    for s, (z, _, _) in enumerate(g.shards):
        out.setdefault(z, []).append(s)
    return out


def _peak_of(rk: _Ranker, first: _Ranker, memory_of, g, key: tuple) -> Optional[int]:
    """The peak memory of member ``key``: its first-pass estimate's, else its own (validated and counted by
    ``rk``); ``None`` where it is invalid."""
    if key in first.done:
        est = first.done[key]
        return None if est is None else est.memory.total_bytes
    layout = g.member(key[1], key[2])
    try:
        layout.validate(**rk.vkw)
    except MeshplanError as exc:
        if len(rk.invalid) < 5:
            rk.invalid.append(str(exc))
        return None
    rk.evaluated += 1
    rk.tick()
    return memory_of(rk.work, layout)


def _batch_units(work: Workload, fix: Pins, fp8_recipes) -> dict[int, Layout]:
    """{sequences a global batch must be a multiple of: a layout of the space that splits such a batch}: its
    micro-batch (the pinned one, else 1) x dp, x pp under the interleaved schedule (``Layout._check_batch``), from the
    space at a batch every one of them splits (world size^2 x micro-batch: pp divides the world size)."""
    world, mbs = work.cluster.world_size, int(fix.get("mbs", 1))
    units: dict[int, Layout] = {}
    for g in enumerate_groups(work.model, world, work.cluster.nvlink_width, world * world * mbs, work.seq_len, fix,
                              fp8_recipes):
        lay = g.base
        units.setdefault(mbs * lay.dp * (lay.pp if lay.vpp > 1 else 1), lay)
    return units


def _batch_hint(global_batch: int, units: dict[int, Layout]) -> str:
    """What a global batch no layout of the space splits (``_batch_units``) could be instead: the nearest multiples
    of one unit, and of all of them (their least common multiple), below and above it."""
    def which(batch: int) -> str:
        lay = next(lay for u, lay in sorted(units.items()) if batch % u == 0)
        return f"dp={lay.dp}" + (f", pp={lay.pp} interleaved" if lay.vpp > 1 else "")
    below = max(global_batch // u * u for u in units)
    above = min(-(-global_batch // u) * u for u in units)
    near = " or ".join(f"{b} ({which(b)})" for b in (below, above) if b > 0)
    around = " or ".join(map(str, batches_splitting(global_batch, units)))
    shown = ", ".join(map(str, sorted(units)[:8])) + (", ..." if len(units) > 8 else "")
    return (f"; no layout here splits it (global batches must be multiples of {shown}). The nearest that one "
            f"splits: {near}; that all do: {around}")


class UnsplitBatch(MeshplanError):
    """No layout of the space splits the global batch (``search`` then tries uneven pipeline degrees);
    ``batches``: the nearest global batches below and above it that every layout of the space splits."""

    def __init__(self, message: str, batches: tuple[int, ...]):
        super().__init__(message)
        self.batches = batches


def batches_splitting(global_batch: int, units: dict[int, Layout]) -> tuple[int, ...]:
    """The nearest global batches below and above ``global_batch`` that every layout of ``units`` splits."""
    every = math.lcm(*units)
    return tuple(b for b in (global_batch // every * every, -(-global_batch // every) * every) if b > 0)


def _refuse_empty(rk: _Ranker, work: Workload, fix: Pins, batch_units: Callable[[], dict]) -> None:
    """Raise ``MeshplanError`` when no layout was valid (the first rule broken; where no layout of the space splits
    the global batch, ``batch_units()``, the nearest batches that do) or none fits (the closest miss)."""
    model, cluster = work.model, work.cluster
    if rk.evaluated == 0:
        why = rk.invalid[0] if rk.invalid else explain_empty(model, cluster.world_size, work.global_batch,
                                                             work.seq_len, fix)
        units = batch_units() if "global batch" in why or "micro-batches must be" in why else {}
        if units and all(work.global_batch % u for u in units):  # no layout splits it: say which batches would
            raise UnsplitBatch(f"no valid layout for {model.name} on {cluster.spec}: "
                               f"{why}{_batch_hint(work.global_batch, units)}",
                               batches_splitting(work.global_batch, units))
        raise MeshplanError(f"no valid layout for {model.name} on {cluster.spec}: {why}")
    if not rk.kept:
        _, lay, est = rk.closest
        miss = est.memory.total_bytes - est.memory_limit_bytes
        raise MeshplanError(
            f"{model.name} fits nowhere on {cluster.spec} ({rk.evaluated} layouts tried): closest is "
            f"{describe(lay)} needing {est.memory.total_bytes / GiB:.1f} GiB of "
            f"{est.memory_limit_bytes / GiB:.1f} GiB usable — misses by {miss / GiB:.1f} GiB"
            + _logits_hint(work, lay, miss))


def _logits_hint(work: Workload, layout: Layout, miss_bytes: int) -> str:
    """Where the logits alone outweigh the miss: that a fused linear cross-entropy, which stores none, would fit."""
    held = logits_held_bytes(work.model, layout, work.seq_len // layout.cp)
    if layout.pp > 1 or held < miss_bytes:  # the last stage may not be the peak with a pipeline: say nothing
        return ""
    return (f"; its logits hold {held / GiB:.1f} GiB, which a fused linear cross-entropy stores none of (--fix "
            "linear_ce=true: Cut Cross-Entropy, as NeMo AutoModel's FusedLinearCrossEntropy runs it)")


def _time_balanced(work: Workload, estimator, fix: Pins, ranked: list) -> list:
    """Each ranked layout whose uneven split the user left free, re-split by predicted stage time
    (``GpuEstimator.time_balanced_split``; the space splits by layer count, embedding and loss a layer each) and
    kept when that is faster and fits; re-ranked."""
    split_of = getattr(estimator, "time_balanced_split", None)
    if (split_of is None or fix.pp_layout is not None or fix.first_stage_layers or fix.last_stage_layers
            or fix.pp_split is not None):  # a pinned rule is the stack's own split
        return ranked
    model = work.model
    out = []
    for lay, est in ranked:
        if lay.pp_layout:
            try:
                # the time-weighted split may not exist where the count split needs the embedding and the loss to
                # fill virtual stages of their own (126 layers over 128)
                alt = lay.with_(pp_layout=split_of(work, lay))
                alt.validate(world_size=lay.world_size, num_layers=model.num_layers, num_heads=model.num_heads,
                             num_kv_heads=model.num_kv_heads, seq_len=work.seq_len, global_batch=work.global_batch,
                             num_experts=model.num_experts)
            except MeshplanError:
                alt = lay  # e.g. a chunk now shorter than recompute full:N asks: keep the count split
            if alt.pp_layout != lay.pp_layout:
                alt_est = estimator.estimate(work, alt)
                if alt_est.fits and alt_est.step_time_s < est.step_time_s:
                    lay, est = alt, alt_est
        out.append((lay, est))
    return sorted(out, key=lambda le: _rank_key(le[0], le[1]))


class _Bounds:
    """The lower bounds the branch and bound orders groups by (module notes), with the extra pricings they took."""

    def __init__(self, rk: _Ranker, estimate) -> None:
        self.rk, self.estimate, self.extra = rk, estimate, 0
        self.work2 = replace(rk.work, global_batch=2 * rk.work.global_batch)

    def first_zero0(self, gi: int, g, r: int) -> Optional[tuple[int, Estimate]]:
        """The first valid ZeRO-0 member of recompute ``r`` of group ``gi``, priced (``None``: there is none)."""
        for s, (z, _, _) in enumerate(g.shards):
            if not z:
                est = self.rk.price(gi, g, r, s)
                if est is not None:
                    return s, est
        return None

    def pipeline_bound(self, g, r: int) -> Optional[float]:
        """The bound of recompute ``r`` of group ``g`` from the pipeline part alone (the estimator's
        ``pipeline_bound_s``, the same floats as a priced member's ``pipeline_s + bubble_s``), no member priced in
        full; ``None``: the estimator has none, or the member is invalid (``first_zero0`` then finds one)."""
        if self.rk.pipeline_bound is None:
            return None
        try:
            # not validated first: the members share every field the pipeline part reads, so an invalid one
            # bounds only members that are invalid too (pricing them says why)
            return self.rk.pipeline_bound(self.rk.work, g.member(r, 0)) * (1 - _REL)
        except Exception:  # a pipeline that cannot be priced: first_zero0 prices (and validates) a member instead
            return None

    def sync_floor(self, g, r: int) -> Optional[float]:
        """The estimator's floor on what every member of group ``g`` adds to its pipeline part (``sync_floor_s``,
        from its recompute=none variant ``r``), ``None`` where it gives none."""
        if self.rk.sync_floor is None or self.rk.pipeline_bound is None:
            return None
        try:
            b = self.rk.sync_floor(self.rk.work, g.member(r, 0), g.shards)
        except (MeshplanError, ArithmeticError):  # an invalid member: pricing it validates it and says why
            return None
        return None if b is None else b * (1 - _REL)

    def group_bound(self, g, r: int) -> Optional[float]:
        """The estimator's bound on every member of group ``g`` (``group_bound_s``, from its recompute=none variant
        ``r``), ``None`` where it gives none."""
        try:
            b = self.rk.group_bound(self.rk.work, g.member(r, 0), g.shards)
        except (MeshplanError, ArithmeticError):  # an invalid member: pricing it validates it and says why
            return None
        return None if b is None else b * (1 - _REL)

    def bound(self, g, r: int, rep: Optional[tuple[int, Estimate]]) -> Optional[float]:
        """Lower bound on every member of recompute ``r`` of group ``g``: the per-micro-batch part (pipeline and
        bubble) of its first ZeRO-0 member ``rep``, from that member priced at the global batch and at twice it
        (``None``: no such member)."""
        if rep is None:
            return None
        s, est = rep
        if est.pipeline_s is not None:  # the estimator separates it (the GPU estimator): no second pricing
            return (est.pipeline_s + est.bubble_s) * (1 - _REL)
        self.extra += 1
        est2 = self.estimate(self.work2, g.member(r, s))
        return (est2.step_time_s - est.step_time_s + est.bubble_s) * (1 - _REL)


def _branch_and_bound(rk: _Ranker, groups: list, estimate) -> int:
    """Best-first branch and bound over ``groups`` (module notes); returns the extra pricings its bounds took.

    Raises:
        _Fallback: a pricing contradicted an assumption the bounds rest on.
    """
    bo = _Bounds(rk, estimate)
    first_zero0, pipeline_bound = bo.first_zero0, bo.pipeline_bound

    # heap items: (bound, group, recompute index or -1 for the whole group, state). A group's first bound is its
    # work spread over the stages (``_WORK``: shared by the groups of one time signature; ``_TWIN``: its recipe
    # twin's until it comes up, then its own), refined to its pipeline
    # part when it comes up (first, when the estimator gives one, raised by its sync floor: ``_FLOOR``), then to the
    # estimator's group bound (``_GROUP``); without those, the member's compute + bubble (free once it is priced,
    # ``_REP``), refined by a pricing at twice the batch when it comes up. ``_FINAL``: nothing tighter to take.
    reps: dict[tuple[int, int], Optional[tuple[int, Estimate]]] = {}
    pipe_lbs: dict[int, float] = {}  # a group's recompute=none pipeline part, its variants' floor
    work_lbs: dict[int, float] = {}  # a group raised by its sync floor (``_FLOOR``): its work bound alone
    floors: dict[int, float] = {}  # and that floor

    def first_bound(gi: int, g, r: int, floor: float) -> tuple[float, int]:
        """(bound, state) of recompute ``r`` of group ``gi`` before it comes up (at least ``floor``)."""
        b = pipeline_bound(g, r)
        if b is not None:
            if b < floor * (1 - _REL):
                raise _Fallback(f"{describe(g.member(r, 0))}: pipeline part {b:.6g} s below its first bound "
                                f"{floor:.6g} s (its work over the stages, or recompute=none's bound)")
            return b, _FINAL
        rep = reps[gi, r] = first_zero0(gi, g, r)
        cheap = (rep[1].compute_s + rep[1].bubble_s) * (1 - _REL) if rep else 0.0
        return max(floor, cheap), (_REP if rep else _FINAL)

    heap, twinned = _first_items(rk, groups, first_bound)
    heapq.heapify(heap)
    own_work = _OwnWork(rk, twinned)
    while heap:
        lb, gi, r, state = heapq.heappop(heap)
        if _rank_round(lb) > rk.kth_time():
            break  # every bound left is at least this one
        g = groups[gi]
        r0 = g.recomputes.index("none") if r < 0 else r
        if state == _TWIN:  # its own work bound now that it comes up
            heapq.heappush(heap, own_work.item(gi, r, lb, groups, first_bound))
            continue
        if state == _WORK:
            fl = bo.sync_floor(g, r0) if r < 0 else None
            if fl is not None and fl > 0.0:  # the work bound plus what every member adds to it (fact 7)
                work_lbs[gi], floors[gi] = lb, fl
                heapq.heappush(heap, (lb + fl, gi, r, _FLOOR))
                continue
            b, st = first_bound(gi, g, r0, lb)
            heapq.heappush(heap, (b, gi, r, st))
            continue
        if state == _FLOOR:
            b, st = first_bound(gi, g, r0, work_lbs.pop(gi))
            pipe_lbs[gi] = b  # the pipeline part alone: what each recompute variant's is checked against
            heapq.heappush(heap, (max(b + floors[gi], lb), gi, r, st))
            continue
        if state == _REP:
            b = bo.bound(g, r0, reps[gi, r0])
            if b < lb * (1 - _REL):
                raise _Fallback(f"{describe(g.member(r0, 0))}: per-micro-batch part {b:.6g} s below its first "
                                f"bound {lb:.6g} s (its compute + bubble, or recompute=none's bound)")
            heapq.heappush(heap, (b, gi, r, _FINAL))
            continue
        if r < 0:  # a group bounded by its recompute=none members: bound each recompute variant on its own
            if state == _FINAL and rk.group_bound is not None:
                gb = bo.group_bound(g, r0)
                if gb is not None and gb > lb:
                    pipe_lbs.setdefault(gi, lb)
                    heapq.heappush(heap, (gb, gi, r, _GROUP))
                    continue
            pipe_lb = pipe_lbs.pop(gi, lb)  # recompute=none's pipeline part, below every variant's
            for item in _variants(bo, reps, gi, g, r0, lb, pipe_lb, floors.pop(gi, 0.0)):
                heapq.heappush(heap, item)
            continue
        _price_family(rk, gi, g, r, lb)
    return bo.extra


def _first_items(rk: _Ranker, groups: list, first_bound) -> tuple[list[tuple], dict]:
    """The heap items the search starts from: per group, its recompute=none variant for the whole group (or each
    variant where it has none), at its twin bound (``_TWIN``), else its work bound (``_WORK``), else
    ``first_bound``'s; and ``{(group, which): (its twin bound, recompute, its first member)}`` of the twin-bounded
    ones, whose work bound is priced when they come up (``_OwnWork``)."""
    firsts = []  # (group, recompute, which, its first member: the group's base when that is recompute r)
    for gi, g in enumerate(groups):
        rs = [g.recomputes.index("none")] if "none" in g.recomputes else range(len(g.recomputes))
        for r in rs:
            firsts.append((gi, r, -1 if len(rs) == 1 and g.recomputes[r] == "none" else r,
                           g.base if r == 0 else g.member(r, 0)))
    lays = [f[3] for f in firsts]
    twins = rk.twin_bounds(rk.work, lays) if rk.twin_bounds and rk.work_bounds else [None] * len(firsts)
    rest = [i for i, t in enumerate(twins) if t is None]
    works = dict(zip(rest, rk.work_bounds(rk.work, [lays[i] for i in rest]) if rk.work_bounds
                     else [None] * len(rest)))
    heap, twinned = [], {}
    for i, (gi, r, which, lay) in enumerate(firsts):
        if twins[i] is not None:
            heap.append((twins[i] * (1 - _REL), gi, which, _TWIN))
            twinned[gi, which] = (twins[i] * (1 - _REL), r, lay)
        elif works[i] is not None:
            heap.append((works[i] * (1 - _REL), gi, which, _WORK))
        else:
            b, st = first_bound(gi, groups[gi], r, 0.0)
            heap.append((b, gi, which, st))
    return heap, twinned


class _OwnWork:
    """The own work bounds of the twin-bounded groups (``_first_items``' ``twinned``), priced when each comes up, in
    batches of the next ``_TWIN_BATCH`` by twin bound (one cost-model call per op class a batch, not per group): the
    groups that come up are those whose twin bounds lie below the search's end, a prefix of that order."""

    def __init__(self, rk: _Ranker, twinned: dict):
        self.rk, self.twinned, self.known = rk, twinned, {}
        self.order = sorted(twinned, key=lambda k: twinned[k][0])
        self.next = 0  # the first of ``order`` not yet priced

    def item(self, gi: int, which: int, lb: float, groups: list, first_bound) -> tuple:
        """The heap item of twin-bounded ``(gi, which)`` coming up at bound ``lb``: at its own work bound, else
        (none) at ``first_bound``'s.

        Raises:
            _Fallback: a work bound priced lies below its twin's.
        """
        if (gi, which) not in self.known:
            self._price_from((gi, which))
        w = self.known.pop((gi, which))
        _, r, _ = self.twinned.pop((gi, which))
        if w is None:
            b, state = first_bound(gi, groups[gi], r, lb)
            return b, gi, which, state
        return w * (1 - _REL), gi, which, _WORK

    def _price_from(self, key: tuple) -> None:
        """Price ``key``'s own work bound with the next unpriced ones by twin bound that can still rank, each checked
        against its twin's."""
        batch, kth = [key], self.rk.kth_time()
        while self.next < len(self.order) and len(batch) < _TWIN_BATCH:
            k = self.order[self.next]
            if _rank_round(self.twinned[k][0]) > kth:
                break
            self.next += 1
            if k != key and k in self.twinned and k not in self.known:
                batch.append(k)
        bounds = self.rk.work_bounds(self.rk.work, [self.twinned[k][2] for k in batch])
        for k, w in zip(batch, bounds):
            twin_s, _, first = self.twinned[k]
            if w is not None and w < twin_s:
                raise _Fallback(f"{describe(first)}: work bound {w:.6g} s below its recipe twin's {twin_s:.6g} s")
            self.known[k] = w


def _variants(bo: _Bounds, reps: dict, gi: int, g, r0: int, lb: float, pipe_lb: float,
              floor: float = 0.0) -> list[tuple]:
    """Heap items of each recompute variant of group ``gi`` (``r0``: its recompute=none), at least ``lb`` (the
    group's bound), each bounded on its own: its pipeline part (checked against recompute=none's, ``pipe_lb``) plus
    ``floor``, what any member of the group adds to its pipeline part (the estimator's ``sync_floor_s``, fact 7; 0
    where it gives none), else its first ZeRO-0 member's compute + bubble."""
    items = []
    for rr in range(len(g.recomputes)):
        if rr == r0:
            items.append((lb, gi, rr, _FINAL))
            continue
        b = bo.pipeline_bound(g, rr)
        if b is not None:
            if b < pipe_lb * (1 - _REL):
                raise _Fallback(f"{describe(g.member(rr, 0))}: pipeline part {b:.6g} s below "
                                f"recompute=none's {pipe_lb:.6g} s")
            items.append((max(b + floor, lb), gi, rr, _FINAL))
            continue
        rep = reps[gi, rr] = bo.first_zero0(gi, g, rr)
        cheap = (rep[1].compute_s + rep[1].bubble_s) * (1 - _REL) if rep else lb
        # recomputation only adds to the recompute=none bound
        items.append((max(lb, cheap), gi, rr, _FINAL if rep is None else _REP))
    return items


def _price_family(rk: _Ranker, gi: int, g, r: int, lb: float) -> None:
    """Price the members of recompute ``r`` of group ``gi``: per ZeRO stage from the most sharded down, stopping
    at the first that does not fit (less sharding holds at least as much; not under ``holds_whole_stage``, where all
    are priced)."""
    if rk.cannot_fit is not None:
        try:
            unfit = rk.cannot_fit(rk.work, g.member(r, 0))
        except (MeshplanError, ArithmeticError):  # an invalid member: pricing it validates it and says why
            unfit = False
        if unfit:
            rk.unfit += len(g.shards)
            return
    steps = None  # each member's step time alone, a fraction of a full pricing, once K layouts fit
    if rk.step_times is not None and math.isfinite(rk.kth_time()):
        try:
            steps = rk.step_times(rk.work, g.member(r, 0), g.shards)
        except (MeshplanError, ArithmeticError):  # an invalid member: pricing it validates it and says why
            steps = None
    if steps is not None:
        low = min(steps)
        if low >= lb and _rank_round(low) > rk.kth_time() and not any((gi, r, s) in rk.done for s in range(len(steps))):
            rk.tick_many(len(steps))  # every member's step time alone shows it cannot rank (as below, at once)
            return
    for z, ss in _by_zero(g).items():
        prev = None
        # less sharding holds at least as much, except where a pipelined FSDP2 stage is held whole beside its shards
        # (``holds_whole_stage``): an unsharded part then holds less than a sharded one, so every member is priced
        monotone = not holds_whole_stage(g.base, z)
        for s in sorted(ss, key=lambda s: -g.shards[s][1]):
            step = steps[s] if steps is not None and (gi, r, s) not in rk.done else None
            if step is not None:
                if step < lb:
                    raise _Fallback(f"{describe(g.member(r, s))} priced {step:.6g} s, below its group's bound "
                                    f"{lb:.6g} s")
                if _rank_round(step) > rk.kth_time():
                    rk.timed += 1  # its step time alone shows it cannot rank: never priced in full
                    rk.tick()
                    continue
            est = rk.price(gi, g, r, s)
            if est is None:
                continue
            if est.step_time_s < lb:
                raise _Fallback(f"{describe(g.member(r, s))} priced {est.step_time_s:.6g} s, below its group's "
                                f"bound {lb:.6g} s")
            if monotone and prev is not None and est.memory.total_bytes < prev * (1 - _REL):
                raise _Fallback(f"{describe(g.member(r, s))}: less sharding, less memory")
            prev = est.memory.total_bytes
            if monotone and not est.fits:
                break


def _rank_round(x: float) -> float:
    """The rounding of ``_rank_key``'s first element, to four figures: two step times it makes equal differ by under
    0.1% (monotone, so a bound rounds below what it bounds)."""
    return float(f"{x:.4g}") if math.isfinite(x) else x


def _rank_key(layout: Layout, est: Estimate) -> tuple:
    """Fastest first; within 0.1% of step time, the simpler layout (fewer parallel dimensions, activation
    offloading counted as one more: it only pays where it is faster), then less memory."""
    dims = sum(d > 1 for d in (layout.dp_shard, layout.tp, layout.pp, layout.vpp, layout.cp, layout.ep))
    dims += layout.offload_layers > 0
    return (_rank_round(est.step_time_s), dims, est.memory.total_bytes)


def describe(layout: Layout) -> str:
    """Short human form: ``dp=4(2x2) tp=8 pp=4 vpp=2 cp=1 ep=1 mbs=1 zero=1 recompute=full sp``; decisions at
    their default (ring CP, no etp, flash attention, no fp8, Megatron stack, dropless balanced routing, Hybrid-EP
    on Megatron-Core's SMs) are left out."""
    parts = [f"dp={layout.dp}" + (f"({layout.dp_replicate}x{layout.dp_shard})" if layout.dp_shard > 1 else ""),
             f"tp={layout.tp}", f"pp={layout.pp}" + (f"({format_pp_layout(layout.pp_layout)})"
                                                       if layout.pp_layout else "")]
    if layout.vpp > 1:
        parts.append(f"vpp={layout.vpp}")
    if layout.pipeline_schedule in ("zbh1", "dualpipe"):
        parts.append(layout.pipeline_schedule)
    if layout.cp > 1:
        parts.append(f"cp={layout.cp}" + (f"({layout.cp_kind})" if layout.cp_kind != "ring" else ""))
    if layout.ep > 1:
        parts.append(f"ep={layout.ep}")
    if layout.etp:
        parts.append(f"etp={layout.etp}")
    parts += [f"mbs={layout.micro_batch}", f"zero={layout.zero_stage}", f"recompute={layout.recompute}"
              + (f"({layout.recompute_modules})" if layout.recompute_modules else "")]
    if layout.offload_layers:
        parts.append(f"offload={layout.offload_layers}")
    if layout.sequence_parallel:
        parts.append("sp")
    if layout.tp_overlap:
        parts.append("tp_overlap")
    if layout.attention != "flash":
        parts.append(f"attention={layout.attention}")
    if layout.attention_dtype != "bf16":
        parts.append(f"attention_dtype={layout.attention_dtype}")
    if layout.fp8 != "none":
        parts.append(f"fp8={layout.fp8}")
    if layout.bf16_first_layers or layout.bf16_last_layers:  # layers kept out of the low-precision recipe
        parts.append(f"bf16_layers={layout.bf16_first_layers}+{layout.bf16_last_layers}")
    if layout.moe_overlap:
        parts.append("moe_overlap")
    if layout.moe_dispatcher != "alltoall":
        own_sms = layout.moe_dispatcher != "hybridep" or layout.hybridep_sms == DECISIONS["hybridep_sms"].default
        parts.append(f"moe_dispatcher={layout.moe_dispatcher}" + ("" if own_sms else f"(sms={layout.hybridep_sms})"))
    if layout.optim_dtype != "fp32":
        parts.append(f"optim={layout.optim_dtype}")
    if layout.grad_dtype:
        parts.append(f"grads={layout.grad_dtype}")
    if layout.reduce_dtype:
        parts.append(f"reduce={layout.reduce_dtype}")
    if layout.moe_capacity:
        parts.append(f"capacity={layout.moe_capacity:g}")
    if layout.moe_imbalance != 1.0:
        parts.append(f"imbalance={layout.moe_imbalance:g}")
    if layout.moe_router != "learned":
        parts.append(f"router={layout.moe_router}")
    if layout.stack != "megatron":
        parts.append(f"stack={layout.stack}")
    if layout.pp_runs != 1:
        parts.append(f"pp_runs={layout.pp_runs}")
    if layout.pp_overlap is not None:
        parts.append(f"pp_overlap={str(layout.pp_overlap).lower()}")
    if layout.shared_overlap:
        parts.append("shared_overlap")
    if layout.moe_fused_mlp:
        parts.append("moe_fused_mlp")
    if layout.cuda_graphs != "none":
        parts.append(f"cuda_graphs={layout.cuda_graphs}")
    if layout.fsdp:
        parts.append(f"fsdp={layout.fsdp}")
    return " ".join(parts)


def layout_row(layout: Layout, est: Estimate) -> dict:
    """JSON row for ``meshplan plan --json``: every degree plus the headline predictions."""
    return {
        "layout": describe(layout),
        "dp_replicate": layout.dp_replicate, "dp_shard": layout.dp_shard, "dp": layout.dp, "tp": layout.tp,
        "pp": layout.pp, "vpp": layout.vpp, "cp": layout.cp, "ep": layout.ep, "sp": layout.sequence_parallel,
        "mbs": layout.micro_batch, "zero": layout.zero_stage, "recompute": layout.recompute,
        "recompute_modules": layout.recompute_modules,
        "attention": layout.attention, "attention_dtype": layout.attention_dtype, "etp": layout.expert_tp,
        "fp8": layout.fp8, "cp_kind": layout.cp_kind,
        "stack": layout.stack, "moe_overlap": layout.moe_overlap, "moe_capacity": layout.moe_capacity,
        "moe_imbalance": layout.moe_imbalance, "moe_router": layout.moe_router, "schedule": layout.schedule,
        "optim_dtype": layout.optim_dtype,
        "grad_dtype": layout.grad_dtype, "pp_runs": layout.pp_runs, "p2p_overlapped": layout.p2p_overlapped,
        "shared_overlap": layout.shared_overlap, "moe_fused_mlp": layout.moe_fused_mlp,
        "moe_dispatcher": layout.moe_dispatcher,
        "hybridep_sms": layout.hybridep_sms if layout.moe_dispatcher == "hybridep" else None,
        "cuda_graphs": layout.cuda_graphs, "offload_layers": layout.offload_layers,
        "fsdp": layout.fsdp_impl if layout.zero_stage == 3 else None,
        "reduce_dtype": layout.reduce_dtype_priced or None,
        "pp_layout": format_pp_layout(layout.pp_layout) if layout.pp_layout else None,
        "sequence_first": layout.sequence_first, "moe_router_fusion": layout.moe_router_fusion,
        "moe_aux_loss": layout.moe_aux_loss, "moe_impl": layout.moe_impl,
        "step_time_s": est.step_time_s, "tokens_per_s": est.tokens_per_s,
        "tflops_per_device": est.tflops_per_device, "hw_tflops_per_device": est.hw_tflops_per_device,
        "mfu": est.mfu, "peak_memory_bytes": est.memory.total_bytes,
        "compute_s": est.compute_s, "exposed_comm_s": est.exposed_comm_s, "bubble_s": est.bubble_s,
    }

