"""The candidate space: every ``Layout`` whose degrees divide the cluster, model and batch evenly.

``--fix key=value`` pins any decision. Keys: dp (total data parallel), dp_replicate, dp_shard, tp, pp, vpp, cp,
ep, sp, mbs, zero, recompute, attention. Pinning all of them evaluates exactly one configuration; a pinned
combination that breaks a rule is reported by ``Layout.validate`` with the numbers.
"""
from __future__ import annotations

from typing import Iterator

from meshplan.core.errors import MeshplanError
from meshplan.planner.layout import ATTENTION, RECOMPUTE, Layout

FIX_KEYS = ("dp", "dp_replicate", "dp_shard", "tp", "pp", "vpp", "cp", "ep", "sp", "mbs", "zero", "recompute",
            "attention")
MAX_VPP = 8
MAX_CP = 32
MBS_CHOICES = (1, 2, 4, 8, 16, 32)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def parse_fix(text: str | None) -> dict[str, object]:
    """Parse ``tp=8,pp=4,recompute=full`` into a dict; one clear error per bad entry."""
    out: dict[str, object] = {}
    if not text:
        return out
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
    return out


def _choices(fix: dict, key: str, default: list) -> list:
    return [fix[key]] if key in fix else default


def enumerate_layouts(model, world_size: int, devices_per_node: int, global_batch: int, seq_len: int,
                      fix: dict[str, object]) -> Iterator[Layout]:
    """Yield every layout that divides evenly (memory is checked by the caller).

    Unpinned TP stays inside one node and is a divisor of the head counts; unpinned CP is used only when
    the local sequence stays at least 1024 tokens. Pinned values are yielded even when they break a rule,
    so that ``Layout.validate`` reports why.
    """
    L, E = model.num_layers, model.num_experts
    tps = _choices(fix, "tp", [t for t in divisors(world_size) if t <= devices_per_node
                               and model.num_heads % t == 0
                               and (model.num_kv_heads % t == 0 or t % model.num_kv_heads == 0)])
    for tp in tps:
        rest = world_size // tp if world_size % tp == 0 else 0
        pps = _choices(fix, "pp", [p for p in divisors(rest) if L % p == 0]) if rest else []
        for pp in pps:
            rest2 = rest // pp if rest % pp == 0 else 0
            cps = _choices(fix, "cp", [c for c in divisors(rest2) if c <= MAX_CP
                                       and (c == 1 or (seq_len % (2 * c) == 0 and seq_len // c >= 1024))]) \
                if rest2 else []
            for cp in cps:
                dp = rest2 // cp if rest2 % cp == 0 else 0
                if "dp" in fix and fix["dp"] != dp:
                    continue
                if not dp:
                    continue
                vpps = _choices(fix, "vpp", [1] + ([v for v in range(2, MAX_VPP + 1) if L % (pp * v) == 0]
                                                   if pp > 1 else []))
                for zero in _choices(fix, "zero", [0, 1, 2, 3]):
                    if zero == 0:
                        shards = _choices(fix, "dp_shard", [1])
                    else:
                        shards = _choices(fix, "dp_shard", [d for d in divisors(dp) if d > 1] or [1])
                    for dp_shard in shards:
                        if zero > 0 and dp_shard == 1 and cp == 1 and "zero" not in fix:
                            continue  # nothing to shard over: same as zero=0
                        dp_rep = _choices(fix, "dp_replicate", [dp // dp_shard if dp % dp_shard == 0 else 0])[0]
                        if dp_rep < 1:
                            continue
                        eps = _choices(fix, "ep", [1] + [e for e in divisors(E) if e > 1
                                                         and (dp_shard * cp) % e == 0] if E else [1])
                        for ep in eps:
                            sps = _choices(fix, "sp", [tp > 1])
                            for vpp in vpps:
                                for rc in _choices(fix, "recompute", list(RECOMPUTE)):
                                    for sp in sps:
                                        for att in _choices(fix, "attention", ["flash"]):
                                            for mbs in _choices(fix, "mbs", [b for b in MBS_CHOICES
                                                                                  if global_batch % (b * dp) == 0]):
                                                yield Layout(dp_replicate=dp_rep, dp_shard=dp_shard, tp=tp,
                                                             pp=pp, vpp=vpp, cp=cp, ep=ep, micro_batch=mbs,
                                                             zero_stage=zero, recompute=rc,
                                                             sequence_parallel=sp, attention=att)


def explain_empty(model, world_size: int, global_batch: int, seq_len: int, fix: dict[str, object]) -> str:
    """Why no layout survived: the first rule a layout built from the pinned values breaks, with its numbers."""
    pinned = [k for k in ("tp", "pp", "cp", "dp") if k in fix]
    prod = 1
    for k in pinned:
        prod *= int(fix[k])
        if world_size % prod:
            names = "*".join(f"{p}({fix[p]})" for p in pinned[:pinned.index(k) + 1])
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
