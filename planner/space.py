"""The candidate space: every ``Layout`` whose degrees divide the cluster, model and batch evenly.

``--fix key=value`` pins any decision (``Pins``). Keys: dp (total data parallel), dp_replicate, dp_shard, tp, pp,
vpp, cp, ep, sp, mbs, zero, recompute, attention. Pinning all of them evaluates exactly one configuration; a
pinned combination that breaks a rule is reported by ``Layout.validate`` with the numbers.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Iterator, Mapping, Optional

from meshplan.core.errors import MeshplanError
from meshplan.planner.layout import ATTENTION, RECOMPUTE, Layout, balanced_split, parse_pp_layout
from meshplan.planner.schedules import SCHEDULES

FIX_KEYS = ("dp", "dp_replicate", "dp_shard", "tp", "pp", "pp_layout", "vpp", "schedule", "cp", "ep", "sp", "mbs",
            "zero", "recompute",
            "attention")
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
            if val not in RECOMPUTE:
                raise MeshplanError(f"--fix recompute={val}: expected one of {', '.join(RECOMPUTE)}")
            out[key] = val
        elif key == "attention":
            if val not in ATTENTION:
                raise MeshplanError(f"--fix attention={val}: expected one of {', '.join(ATTENTION)}")
            out[key] = val
        elif key == "schedule":
            if val.lower() not in SCHEDULES:
                raise MeshplanError(f"--fix schedule={val}: expected one of {', '.join(SCHEDULES)}")
            out[key] = val.lower()
        elif key == "pp_layout":
            out[key] = parse_pp_layout(val)
        elif key == "sp":
            if val.lower() not in ("true", "false", "1", "0", "on", "off"):
                raise MeshplanError(f"--fix sp={val}: expected true or false")
            out[key] = val.lower() in ("true", "1", "on")
        else:
            try:
                out[key] = int(val)
            except ValueError:
                raise MeshplanError(f"--fix {key}={val}: expected an integer") from None
            if out[key] < (0 if key == "zero" else 1):
                raise MeshplanError(f"--fix {key}={val}: must be >= {0 if key == 'zero' else 1}")
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


def enumerate_layouts(model, world_size: int, devices_per_node: int, global_batch: int, seq_len: int,
                      fix: Pins) -> Iterator[Layout]:
    """Yield every layout that divides evenly (memory is checked by the caller).

    Unpinned TP stays inside one node and is a divisor of the head counts; unpinned CP is used only when
    the local sequence stays at least 1024 tokens. Pinned values are yielded even when they break a rule,
    so that ``Layout.validate`` reports why.
    """
    L, E = model.num_layers, model.num_experts
    tps = fix.choices("tp", [t for t in divisors(world_size) if t <= devices_per_node
                             and model.num_heads % t == 0
                             and (model.num_kv_heads % t == 0 or t % model.num_kv_heads == 0)])
    for tp in tps:
        rest = world_size // tp if world_size % tp == 0 else 0
        # free: pp dividing the layers (uneven stages for every other pp would make the DeepSeek-V3 search 5x
        # longer, 4 -> 23 s: bench/plan_speed.py); a pinned pp (405B PP16 over 126 layers, DeepSeek-V3 PP16 over
        # 61) gets uneven stages, the split chosen below
        pps = fix.choices("pp", [p for p in divisors(rest) if L % p == 0]) if rest else []
        for pp in pps:
            rest2 = rest // pp if rest % pp == 0 else 0
            cps = fix.choices("cp", [c for c in divisors(rest2) if c <= MAX_CP
                                     and (c == 1 or (seq_len % (2 * c) == 0 and seq_len // c >= 1024))]) \
                if rest2 else []
            for cp in cps:
                dp = rest2 // cp if rest2 % cp == 0 else 0
                if "dp" in fix and fix.dp != dp:
                    continue
                if not dp:
                    continue
                # uneven stages (pp does not divide the layers, or pinned): first and last stages lighter by the
                # embedding and output layer they carry (layout.balanced_split); no interleaving over them
                split = fix.pp_layout if "pp_layout" in fix else (() if L % pp == 0 else balanced_split(L, pp))
                chunked = [v for v in range(2, MAX_VPP + 1) if L % (pp * v) == 0] if pp > 1 and not split else []
                sched = fix.schedule or ""
                vpps = fix.choices("vpp", chunked if sched == "interleaved" else
                                   [1] if sched in ("zbh1", "dualpipe", "1f1b") else [1] + chunked)
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
                        eps = fix.choices("ep", [1] + [e for e in divisors(E) if e > 1
                                                       and (dp_shard * cp) % e == 0] if E else [1])
                        for ep in eps:
                            sps = fix.choices("sp", [tp > 1])
                            for vpp in vpps:
                                for rc in fix.choices("recompute", list(RECOMPUTE)):
                                    for sp in sps:
                                        for att in fix.choices("attention", ["flash"]):
                                            for mbs in fix.choices("mbs", [b for b in MBS_CHOICES
                                                                           if global_batch % (b * dp) == 0]):
                                                yield Layout(dp_replicate=dp_rep, dp_shard=dp_shard, tp=tp,
                                                             pp=pp, vpp=vpp, cp=cp, ep=ep, micro_batch=mbs,
                                                             zero_stage=zero, recompute=rc,
                                                             sequence_parallel=sp, attention=att,
                                                             pp_layout=split, pipeline_schedule=sched)


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
