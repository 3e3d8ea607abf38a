"""The candidate space: every ``Layout`` whose degrees divide the cluster, model and batch evenly.

``--fix key=value`` pins any decision (``Pins``). Keys: dp (total data parallel), dp_replicate, dp_shard, tp, pp,
vpp, cp, ep, sp, mbs, zero, recompute, attention. Pinning all of them evaluates exactly one configuration; a
pinned combination that breaks a rule is reported by ``Layout.validate`` with the numbers.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from itertools import product
from typing import Iterator, Mapping, Optional

from meshplan.core.errors import MeshplanError
from meshplan.planner.layout import (ATTENTION, CP_KINDS, FP8_RECIPES, MOE_DISPATCHERS, RECOMPUTE, STACKS, Layout,
                                    balanced_split, parse_pp_layout)
from meshplan.planner.schedules import SCHEDULES

FIX_KEYS = ("dp", "dp_replicate", "dp_shard", "tp", "pp", "pp_layout", "first_stage_layers", "last_stage_layers",
            "vpp", "schedule", "cp", "cp_kind", "ep", "etp", "sp", "mbs", "zero", "recompute", "attention", "fp8",
            "stack", "tp_overlap", "moe_overlap", "moe_dispatcher", "moe_capacity", "moe_imbalance")
BOOL_KEYS = ("sp", "moe_overlap", "tp_overlap")
FLOAT_KEYS = ("moe_capacity", "moe_imbalance")
CHOICE_KEYS = {"attention": ATTENTION, "fp8": FP8_RECIPES, "cp_kind": CP_KINDS, "stack": STACKS,
               "schedule": SCHEDULES, "moe_dispatcher": MOE_DISPATCHERS}
MAX_VPP = 8
MAX_CP = 32
MBS_CHOICES = (1, 2, 4, 8, 16, 32)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class Pins:
    """The decisions ``--fix`` pins, by their ``--fix`` key (``None``: free). The fields are the ``Layout``'s
    (``sp`` = ``sequence_parallel``, ``mbs`` = ``micro_batch``, ``zero`` = ``zero_stage``) plus ``dp``, the total
    data-parallel degree."""

    dp: Optional[int] = None
    dp_replicate: Optional[int] = None
    dp_shard: Optional[int] = None
    tp: Optional[int] = None
    pp: Optional[int] = None
    vpp: Optional[int] = None
    cp: Optional[int] = None
    ep: Optional[int] = None
    sp: Optional[bool] = None
    mbs: Optional[int] = None
    zero: Optional[int] = None
    recompute: Optional[str] = None
    attention: Optional[str] = None
    pp_layout: Optional[tuple[int, ...]] = None
    schedule: Optional[str] = None
    first_stage_layers: Optional[int] = None
    last_stage_layers: Optional[int] = None
    etp: Optional[int] = None
    fp8: Optional[str] = None
    cp_kind: Optional[str] = None
    stack: Optional[str] = None
    moe_overlap: Optional[bool] = None
    tp_overlap: Optional[bool] = None
    moe_dispatcher: Optional[str] = None
    moe_capacity: Optional[float] = None
    moe_imbalance: Optional[float] = None

    @classmethod
    def of(cls, fix: "Pins | Mapping[str, object] | None") -> "Pins":
        """``fix`` as ``Pins`` (a mapping of ``--fix`` keys, e.g. the ``{}`` of a free search, is accepted)."""
        if isinstance(fix, Pins):
            return fix
        fix = dict(fix or {})
        unknown = sorted(set(fix) - set(FIX_KEYS))
        if unknown:
            raise MeshplanError(f"--fix key '{unknown[0]}' is unknown (known: {', '.join(FIX_KEYS)})")
        return cls(**fix)

    def __contains__(self, key: str) -> bool:
        return getattr(self, key) is not None

    def get(self, key: str, default=None):
        v = getattr(self, key)
        return default if v is None else v

    def choices(self, key: str, default: list) -> list:
        """``[pinned value]``, or ``default`` when ``key`` is free."""
        return [getattr(self, key)] if key in self else default

    def pinned(self) -> dict[str, object]:
        """``{key: value}`` of what is pinned, in ``FIX_KEYS`` order."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def with_(self, **kw) -> "Pins":
        return replace(self, **kw)


def parse_fix(text: str | None) -> Pins:
    """Parse ``tp=8,pp=4,recompute=full`` into ``Pins``; one clear error per bad entry."""
    out: dict[str, object] = {}
    if not text:
        return Pins()
    for item in text.replace(" ", "").split(","):
        if not item:
            continue
        if "=" not in item:
            raise MeshplanError(f"--fix entry '{item}' is not key=value")
        key, val = item.split("=", 1)
        key = key.lower().replace("-", "_")
        if key not in FIX_KEYS:
            raise MeshplanError(f"--fix key '{key}' is unknown (known: {', '.join(FIX_KEYS)})")
        if key == "recompute":
            if val not in RECOMPUTE and not re.fullmatch(r"full:[1-9]\d{0,3}", val):
                raise MeshplanError(f"--fix recompute={val}: expected one of {', '.join(RECOMPUTE)} or full:N "
                                    "(N layers per stage)")
            out[key] = val
        elif key in CHOICE_KEYS:
            if val.lower() not in CHOICE_KEYS[key]:
                raise MeshplanError(f"--fix {key}={val}: expected one of {', '.join(CHOICE_KEYS[key])}")
            out[key] = val.lower()
        elif key == "pp_layout":
            out[key] = parse_pp_layout(val)
        elif key in BOOL_KEYS:
            if val.lower() not in ("true", "false", "1", "0", "on", "off"):
                raise MeshplanError(f"--fix {key}={val}: expected true or false")
            out[key] = val.lower() in ("true", "1", "on")
        elif key in FLOAT_KEYS:
            try:
                out[key] = float(val)
            except ValueError:
                raise MeshplanError(f"--fix {key}={val}: expected a number") from None
            lo, hi = (0.0, 64.0) if key == "moe_capacity" else (1.0, 64.0)
            if not lo <= out[key] <= hi:  # also refuses nan
                raise MeshplanError(f"--fix {key}={val}: must be within [{lo:g}, {hi:g}]")
        else:
            try:
                out[key] = int(val)
            except ValueError:
                raise MeshplanError(f"--fix {key}={val}: expected an integer") from None
            if out[key] < (0 if key == "zero" else 1):
                raise MeshplanError(f"--fix {key}={val}: must be >= {0 if key == 'zero' else 1}")
    if "pp_layout" in out and ("first_stage_layers" in out or "last_stage_layers" in out):
        raise MeshplanError("--fix pp_layout and first_stage_layers/last_stage_layers: give one or the other")
    return Pins(**out)


# The search prices every candidate (about 0.1 ms each here: bench/plan_speed.py, 29,940 DeepSeek-V3 candidates
# in 4.2 s). The bound below counts each decision's choices independently and runs 50-60x above what the
# enumeration yields (Llama 3.1 405B on 16,384 GPUs: bound 414,720, enumerated 7,686; DeepSeek-V3: 1,866,240 vs
# 29,940); a bound past 50M means a search of minutes, so the user is asked to pin decisions instead.
MAX_LAYOUTS = 50_000_000


def space_size_bound(model, world_size: int, devices_per_node: int, global_batch: int, fix: Pins) -> tuple[int, str]:
    """An upper bound on the candidates ``enumerate_layouts`` yields, from the count of each decision's choices
    (without enumerating), and the product written out."""
    n_div = len(divisors(world_size))
    counts = {
        "tp": 1 if "tp" in fix else sum(1 for t in divisors(world_size) if t <= devices_per_node),
        "pp": 1 if "pp" in fix else sum(1 for p in divisors(world_size) if model.num_layers % p == 0),
        "cp": 1 if "cp" in fix else sum(1 for c in divisors(world_size) if c <= MAX_CP),
        "vpp": 1 if "vpp" in fix else MAX_VPP,
        "zero x dp_shard": 1 if "dp_shard" in fix else (1 if "zero" in fix else 4) * n_div,
        "ep": 1 if "ep" in fix or not model.num_experts else len(divisors(model.num_experts)),
        "etp": 1 if "etp" in fix or not model.num_experts else 2,
        "moe_overlap": 1 if "moe_overlap" in fix or not model.num_experts else 2,
        "cp_kind": 1 if "cp_kind" in fix else len(CP_KINDS),
        "recompute": 1 if "recompute" in fix else len(RECOMPUTE),
        "mbs": 1 if "mbs" in fix else sum(1 for b in MBS_CHOICES if global_batch % b == 0),
    }
    total = 1
    for v in counts.values():
        total *= max(1, v)
    return total, " x ".join(f"{k} {v}" for k, v in counts.items())


def check_space_size(model, world_size: int, devices_per_node: int, global_batch: int, fix: Pins,
                     limit: int = MAX_LAYOUTS) -> int:
    """Refuse a search whose space could exceed ``limit`` candidates before enumerating it.

    Raises:
        MeshplanError: the bound, its factors and what to pin.
    """
    total, factors = space_size_bound(model, world_size, devices_per_node, global_batch, fix)
    if total > limit:
        raise MeshplanError(f"the layout space of {model.name} on {world_size} devices holds up to {total:,} "
                            f"candidates ({factors}), more than the {limit:,} a search prices; pin some "
                            "decisions with --fix (e.g. tp=8,pp=16)")
    return total


def stage_split(model_layers: int, pp: int, vpp: int, fix: Pins) -> tuple[int, ...]:
    """Layers per (virtual) stage for ``pp`` stages x ``vpp`` chunks, in model-depth order: the pinned
    ``pp_layout``; Megatron's first/last stage counts (``--decoder-first/last-pipeline-num-layers``: the rest spread
    evenly over the other stages, each stage's layers evenly over its chunks); or, when pp x vpp does not divide
    the layers, ``layout.balanced_split`` over the pp x vpp virtual stages (Megatron's account-for-embedding/loss
    split). ``()`` = even stages.

    Raises:
        MeshplanError: first/last stage layers that leave the other stages (or chunks) an uneven share.
    """
    if fix.pp_layout is not None:
        return fix.pp_layout
    first, last = fix.first_stage_layers, fix.last_stage_layers
    if first is None and last is None:
        n = pp * vpp
        return () if model_layers % n == 0 else balanced_split(model_layers, n)
    ends = [x for x in (first, last) if x is not None]
    middle = pp - len(ends)
    rest = model_layers - sum(ends)
    if middle < 1 or rest < middle or rest % middle:
        raise MeshplanError(f"first_stage_layers={first} last_stage_layers={last}: the other {middle} of pp={pp} "
                            f"stages would share {rest} of the {model_layers} layers unevenly")
    stages = ((first,) if first is not None else ()) + (rest // middle,) * middle + (
        (last,) if last is not None else ())
    if any(k % vpp for k in stages):
        raise MeshplanError(f"first_stage_layers={first} last_stage_layers={last}: stages of "
                            f"{'+'.join(map(str, stages))} layers do not split evenly over vpp={vpp} chunks")
    return tuple(k // vpp for _ in range(vpp) for k in stages)


def recompute_choices(fix: Pins) -> list[str]:
    """Recompute variants a free search tries: none, Megatron selective, torchtitan op-level, full."""
    return fix.choices("recompute", ["none", "selective", "op", "full"])


def enumerate_layouts(model, world_size: int, devices_per_node: int, global_batch: int, seq_len: int,
                      fix: Pins, fp8_recipes: tuple[str, ...] = ("none",)) -> Iterator[Layout]:
    """Yield every layout that divides evenly (memory is checked by the caller).

    Unpinned TP stays inside one node and is a divisor of the head counts; unpinned CP is used only when
    the local sequence stays at least 1024 tokens. Pinned values are yielded even when they break a rule,
    so that ``Layout.validate`` reports why. ``fp8_recipes``: the recipes a free ``fp8`` tries (the workload's
    dtype decides: ``planner.planning``).
    """
    L, E = model.num_layers, model.num_experts
    tps = fix.choices("tp", [t for t in divisors(world_size) if t <= devices_per_node
                             and model.num_heads % t == 0
                             and (model.num_kv_heads % t == 0 or t % model.num_kv_heads == 0)])
    fp8s = fix.choices("fp8", list(fp8_recipes))
    stacks = fix.choices("stack", ["megatron"])
    moe_kw = dict(moe_capacity=fix.get("moe_capacity", 0.0), moe_imbalance=fix.get("moe_imbalance", 1.0),
                  moe_dispatcher=fix.get("moe_dispatcher", "alltoall"), tp_overlap=fix.get("tp_overlap", False))
    for tp in tps:
        rest = world_size // tp if world_size % tp == 0 else 0
        # free: pp dividing the layers (uneven stages for every other pp would make the DeepSeek-V3 search 5x
        # longer, 4 -> 23 s: bench/plan_speed.py); a pinned pp (405B PP16 over 126 layers, DeepSeek-V3 PP16 over
        # 61) gets uneven stages, the split chosen below
        pps = fix.choices("pp", [p for p in divisors(rest) if L % p == 0]) if rest else []
        etps = fix.choices("etp", [0] + ([1] if tp > 1 else [])) if E else fix.choices("etp", [0])
        for pp in pps:
            rest2 = rest // pp if rest % pp == 0 else 0
            cps = fix.choices("cp", [c for c in divisors(rest2) if c <= MAX_CP
                                     and (c == 1 or (seq_len % (2 * c) == 0 and seq_len // c >= 1024))]) \
                if rest2 else []
            split1 = stage_split(L, pp, 1, fix)
            uneven = bool(split1) or "first_stage_layers" in fix or "last_stage_layers" in fix
            # free vpp: chunks dividing the layers; with uneven stages, chunks of >= 2 layers on the lightest stage
            chunked = [v for v in range(2, MAX_VPP + 1) if (min(split1 or (L // pp,)) >= 2 * v if uneven
                                                             else L % (pp * v) == 0)] if pp > 1 else []
            if fix.pp_layout is not None:  # a pinned layout fixes the chunk count too
                chunked = [len(fix.pp_layout) // pp] if len(fix.pp_layout) > pp else []
            sched = fix.schedule or ""
            vpps = fix.choices("vpp", chunked if sched == "interleaved" else
                               [1] if sched in ("zbh1", "dualpipe", "1f1b") else [1] + chunked)
            for cp in cps:
                dp = rest2 // cp if rest2 % cp == 0 else 0
                if "dp" in fix and fix.dp != dp:
                    continue
                if not dp:
                    continue
                cp_kinds = fix.choices("cp_kind", ["ring", "allgather"] + (
                    ["a2a"] if (model.num_heads // tp) % cp == 0 else []) if cp > 1 else ["ring"])
                for zero in fix.choices("zero", [0, 1, 2, 3]):
                    if zero == 0:
                        shards = fix.choices("dp_shard", [1])
                    else:
                        shards = fix.choices("dp_shard", [d for d in divisors(dp) if d > 1] or [1])
                    for dp_shard in shards:
                        if zero > 0 and dp_shard == 1 and cp == 1 and "zero" not in fix:
                            continue  # nothing to shard over: same as zero=0
                        dp_rep = fix.choices("dp_replicate", [dp // dp_shard if dp % dp_shard == 0 else 0])[0]
                        if dp_rep < 1:
                            continue
                        for etp in etps:
                            folded = tp * cp * dp // (etp or tp)
                            eps = fix.choices("ep", [1] + [e for e in divisors(E) if e > 1 and folded % e == 0]
                                              if E else [1])
                            for ep in eps:
                                sps = fix.choices("sp", [tp > 1])
                                overlaps = fix.choices("moe_overlap", [False, True] if ep > 1 else [False])
                                for vpp, rc, sp, att, ck, f8, st, mo in product(
                                        vpps, recompute_choices(fix), sps, fix.choices("attention", ["flash"]),
                                        cp_kinds, fp8s, stacks, overlaps):
                                    split = split1 if vpp == 1 else stage_split(L, pp, vpp, fix)
                                    for mbs in fix.choices("mbs", [b for b in MBS_CHOICES
                                                                   if global_batch % (b * dp) == 0]):
                                        yield Layout(dp_replicate=dp_rep, dp_shard=dp_shard, tp=tp, pp=pp,
                                                     vpp=vpp, cp=cp, ep=ep, micro_batch=mbs, zero_stage=zero,
                                                     recompute=rc, sequence_parallel=sp, attention=att,
                                                     pp_layout=split, pipeline_schedule=sched, etp=etp,
                                                     fp8=f8, cp_kind=ck, stack=st, moe_overlap=mo, **moe_kw)


def explain_empty(model, world_size: int, global_batch: int, seq_len: int, fix: Pins) -> str:
    """Why no layout survived: the first rule a layout built from the pinned values breaks, with its numbers."""
    pinned = [k for k in ("tp", "pp", "cp", "dp") if k in fix]
    prod = 1
    for k in pinned:
        prod *= int(fix.get(k))
        if world_size % prod:
            names = "*".join(f"{p}({fix.get(p)})" for p in pinned[:pinned.index(k) + 1])
            return f"{names} = {prod} does not divide the world size {world_size}"
    tp, pp, cp = (int(fix.get(k, 1)) for k in ("tp", "pp", "cp"))
    dp = int(fix.get("dp", world_size // (tp * pp * cp)))
    dp_shard = int(fix.get("dp_shard", 1))
    zero = int(fix.get("zero", 1 if dp_shard > 1 else 0))
    lay = Layout(dp_replicate=max(1, dp // dp_shard), dp_shard=dp_shard, tp=tp, pp=pp, cp=cp,
                 vpp=int(fix.get("vpp", 1)), ep=int(fix.get("ep", 1)), micro_batch=int(fix.get("mbs", 1)),
                 zero_stage=zero, recompute=str(fix.get("recompute", "none")),
                 sequence_parallel=bool(fix.get("sp", False)), attention=str(fix.get("attention", "flash")))
    try:
        lay.validate(world_size=world_size, num_layers=model.num_layers, num_heads=model.num_heads,
                     num_kv_heads=model.num_kv_heads, seq_len=seq_len, global_batch=global_batch,
                     num_experts=model.num_experts)
    except MeshplanError as exc:
        return str(exc)
    return (f"global batch {global_batch} cannot be split evenly: no micro-batch x data-parallel degree "
            f"of a {world_size}-device layout divides it")
