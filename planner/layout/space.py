"""The candidate space: every ``Layout`` whose degrees divide the cluster, model and batch evenly.

``--fix key=value`` pins any decision (``Pins``; keys: ``FIX_KEYS``). Pinning all of them evaluates exactly one
configuration; a pinned combination that breaks a rule is reported by ``Layout.validate`` with the numbers.

The space comes as ``LayoutGroup`` s (``enumerate_groups``): the candidates that differ only in recomputation and
in the sharding of the data-parallel states, which the search bounds together (``planner.search.exact``); built per
tp x pp x cp x dp mesh (``_meshes``), which ``space_size_bound`` counts without building a layout.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, make_dataclass, replace
from itertools import product
from typing import Iterator, Mapping, Optional

from meshplan.core.bounds import MAX_COUNT
from meshplan.core.errors import MeshplanError
from meshplan.planner.layout.decisions import (
    BY_FIX_KEY,
    FP8_ATTENTION_RECIPES,
    RECOMPUTE,
    free_defaults,
    lowp_recipe,
    stack_can,
)
from meshplan.planner.layout.layout import (
    DEGREE_NAMES,
    Layout,
    megatron_dispatch_refusal,
    megatron_moe_overlap_refusal,
    replicas_hold_whole_experts,
)
from meshplan.planner.layout.splits import balanced_split, front_split

# --fix keys beside the decisions': the degrees (and dp, their data-parallel product), and Megatron's first / last
# stage layer counts, another way to pin ``pp_layout``.
DEGREE_KEYS = ("dp", *DEGREE_NAMES)
STAGE_KEYS = ("first_stage_layers", "last_stage_layers")
FIX_KEYS = (*DEGREE_KEYS, *BY_FIX_KEY, *STAGE_KEYS)
MAX_VPP = 8
MAX_CP = 32
MBS_CHOICES = (1, 2, 4, 8, 16, 32)
FULL_N_FRACTIONS = (4, 2)  # a free search's full:N: N = a quarter and a half of a chunk's layers (Megatron
# --recompute-num-layers with --recompute-method uniform/block); more N would add candidates priced only when
# their group lies within the bound (planner.search.exact)
# The recompute_modules lists Megatron-Bridge's own performance presets run (scripts/performance/configs @ v0.5.0:
# 28 presets set one; these are its 8 distinct non-empty lists, in Megatron-Core's module order, with how many presets
# run each): mla_up_proj 11 (DeepSeek-V3, Kimi-K2), moe_act+layernorm 5 (GPT-OSS, Nemotron 3), mla_up_proj+mlp 3
# (DeepSeek-V3, Kimi-K2), core_attn+moe_act+layernorm+moe 2 (Nemotron 3), and once each moe_act, mlp (DeepSeek-V3),
# moe_act+layernorm+mla_up_proj (DeepSeek-V3), layernorm+moe (Nemotron 3). A free search's selective variants beside
# the default core_attn
PRESET_MODULE_SETS = ("mla_up_proj", "moe_act+layernorm", "mla_up_proj+mlp", "core_attn+moe_act+layernorm+moe",
                      "moe_act", "mlp", "moe_act+layernorm+mla_up_proj", "layernorm+moe")
OFFLOAD_FRACTIONS = (4, 2)  # a free search's offload_layers: a quarter and a half of the layers. Megatron-Bridge's
# Llama 3 70B GB200 / GB300 performance presets offload 20, 30 or 40 of its 80 (llama3_workload_base_configs.py,
# v0.3.1 to v0.5.0: GB300 bf16 30 and fp8-cs 20, GB200 bf16 20 and fp8-cs 40)


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` >= 1, ascending (O(sqrt n))."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


class _PinRules:
    """What every ``Pins`` value can do (its fields are made from ``FIX_KEYS`` below)."""

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


def fix_help() -> str:
    """``meshplan plan --fix``'s help: the syntax, then every key with its choices (``docs/decisions.md`` has more)."""
    def values(key: str) -> str:
        d = BY_FIX_KEY.get(key)
        if d is None or d.kind in ("int", "float"):
            return "N" if d is None or d.kind == "int" else "X"
        if d.kind in ("bool", "tristate"):
            return "true | false"
        if d.kind == "recompute":
            return " | ".join(RECOMPUTE) + " | full:N"
        if d.kind == "modules":
            return "+".join(d.choices[:2]) + "+... of " + " | ".join(d.choices)
        return "7+8*14+7" if d.kind == "stages" else " | ".join(map(str, d.choices))
    return ("Pin decisions, key=value[,key=value...] (see docs/decisions.md): "
            + "; ".join(f"{k}={values(k)}" for k in FIX_KEYS))


def _pin_type(key: str) -> type:
    d = BY_FIX_KEY.get(key)
    if d is None:
        return int
    return {"float": float, "bool": bool, "tristate": bool, "recompute": str, "modules": str, "stages": tuple}.get(
        d.kind, type(d.default) if d.kind == "choice" else int)


Pins = make_dataclass("Pins", [(k, Optional[_pin_type(k)], field(default=None)) for k in FIX_KEYS],
                      bases=(_PinRules,), frozen=True)
Pins.__doc__ = """The decisions ``--fix`` pins, by their ``--fix`` key (``None``: free): the degrees, ``dp`` (their
data-parallel product), every decision of ``planner.layout.decisions`` and the first / last stage layer counts."""
Pins.__module__ = __name__


def _parse_count(key: str, text: str) -> int:
    try:
        out = int(text)
    except ValueError:
        raise MeshplanError(f"--fix {key}={text}: expected an integer") from None
    if out < 1:
        raise MeshplanError(f"--fix {key}={text}: must be >= 1")
    if out > MAX_COUNT:
        raise MeshplanError(f"--fix {key}={text}: must be at most {MAX_COUNT}")
    return out


def parse_fix(text: str | None) -> Pins:
    """Parse ``tp=8,pp=4,recompute=full`` into ``Pins``; one clear error per bad entry, and a key given twice with
    two values is refused (neither would silently win)."""
    out: dict[str, object] = {}
    given: dict[str, str] = {}  # key -> the value as written: a key given twice must agree
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
        if len(val) > 1000:  # a pp_layout of 256 stages is ~700 characters
            raise MeshplanError(f"--fix {key}: a value of {len(val):,} characters; expected a short value")
        if given.setdefault(key, val) != val:
            raise MeshplanError(f"--fix {key} given twice ({key}={given[key]} and {key}={val}); give it once")
        out[key] = BY_FIX_KEY[key].parse(val) if key in BY_FIX_KEY else _parse_count(key, val)
    if "pp_layout" in out and ("first_stage_layers" in out or "last_stage_layers" in out):
        raise MeshplanError("--fix pp_layout and first_stage_layers/last_stage_layers: give one or the other")
    return Pins(**out)


# The bound below counts the candidates of every tp x pp x cp x dp mesh exactly but for recompute (full:N may be
# fewer) and the interleaved micro-batch rule: Llama 3.1 405B on 16,384 GPUs 56,004 vs 43,812 enumerated,
# DeepSeek-V3 656,472 vs 656,472 (the per-decision product it replaced ran 50-130x above). The pruned search
# prices 2% (DeepSeek-V3) to 20% (Llama 3.1 405B) of them, 7-14 thousand pricings a second here
# (bench/plan_speed.py); a bound past 50M candidates means a search of minutes, so the user is asked to pin
# decisions instead.
MAX_LAYOUTS = 50_000_000


def space_size_bound(model, world_size: int, devices_per_node: int, global_batch: int, fix: Pins,
                     fp8_recipes: tuple[str, ...] = ("none",), seq_len: int | None = None) -> tuple[int, str]:
    """An upper bound on the candidates ``enumerate_layouts`` yields, counted per tp x pp x cp x dp mesh
    (without building a layout), and what it is made of (``seq_len``: ``None`` = any CP degree up to
    ``MAX_CP``)."""
    total = meshes = 0
    most: dict[str, int] = {}
    n_rc = 1 if "recompute" in fix else (len(RECOMPUTE) + len(FULL_N_FRACTIONS) + len(OFFLOAD_FRACTIONS)
                                         + len(PRESET_MODULE_SETS))
    n_f8 = 1 if "fp8" in fix else len(fp8_recipes)
    seq = seq_len if seq_len is not None else 1024 * 2 * MAX_CP
    for mesh in _meshes(model, world_size, devices_per_node, global_batch, seq, fix, bound=True):
        tp, pp, cp, dp, shards, etps, vpps, splits, cp_kinds = mesh
        eps = sum(len(mo) for etp in etps for _, mo in _ep_overlaps(model, fix, tp, cp, dp, etp))
        mbs = len(fix.choices("mbs", [b for b in MBS_CHOICES if global_batch % (b * dp) == 0]))
        n = len(shards) * eps * len(vpps) * len(cp_kinds) * n_rc * n_f8 * mbs
        if n:
            meshes += 1
            total += n
            for k, v in (("zero x dp_shard", len(shards)), ("ep x etp x moe_overlap", eps), ("vpp", len(vpps)),
                         ("cp_kind", len(cp_kinds)), ("mbs", mbs)):
                most[k] = max(most.get(k, 0), v)
    factors = (f"{meshes:,} tp x pp x cp meshes, each up to " + " x ".join(f"{k} {v}" for k, v in most.items())
               + f" x recompute {n_rc} x fp8 {n_f8}")
    return total, factors


def check_space_size(model, world_size: int, devices_per_node: int, global_batch: int, fix: Pins,
                     limit: int = MAX_LAYOUTS, fp8_recipes: tuple[str, ...] = ("none",),
                     seq_len: int | None = None) -> int:
    """Refuse a search whose space could exceed ``limit`` candidates before enumerating it.

    Raises:
        MeshplanError: the bound, its factors and what to pin.
    """
    total, factors = space_size_bound(model, world_size, devices_per_node, global_batch, fix, fp8_recipes, seq_len)
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
    split), or AutoModel's ``front_split`` where ``pp_split`` says so. ``()`` = even stages.

    Raises:
        MeshplanError: first/last stage layers that leave the other stages (or chunks) an uneven share.
    """
    if fix.pp_layout is not None:
        return fix.pp_layout
    first, last = fix.first_stage_layers, fix.last_stage_layers
    if first is None and last is None:
        n = pp * vpp
        if model_layers % n == 0:
            return ()
        if fix.pp_split == "front":
            return front_split(model_layers, n)
        if model_layers + 2 < n:  # the embedding and the loss may each fill a virtual stage of their own
            raise MeshplanError(f"pp({pp}) * vpp({vpp}) = {n} virtual stages: more than the {model_layers} layers "
                                "plus the embedding and the loss")
        return balanced_split(model_layers, n)
    ends = [x for x in (first, last) if x is not None]
    middle = pp - len(ends)
    rest = model_layers - sum(ends)
    what = f"first_stage_layers={first} last_stage_layers={last}"
    if middle < 0 or (middle == 0 and rest):
        raise MeshplanError(f"{what}: pp={pp} has {pp} stage(s), which must hold the model's {model_layers} layers "
                            f"(these give {sum(ends)})")
    if rest < middle:
        raise MeshplanError(f"{what}: {sum(ends)} layers on the end stages, of the model's {model_layers}, leave "
                            f"{max(rest, 0)} for the other {middle} of pp={pp} stages")
    if middle and rest % middle:
        raise MeshplanError(f"{what}: the other {middle} of pp={pp} stages would share {rest} of the "
                            f"{model_layers} layers unevenly")
    stages = ((first,) if first is not None else ()) + ((rest // middle,) * middle if middle else ()) + (
        (last,) if last is not None else ())
    if any(k % vpp for k in stages):
        raise MeshplanError(f"first_stage_layers={first} last_stage_layers={last}: stages of "
                            f"{'+'.join(map(str, stages))} layers do not split evenly over vpp={vpp} chunks")
    return tuple(k // vpp for _ in range(vpp) for k in stages)


def recompute_choices(fix: Pins, chunk_layers: int = 0) -> list[str]:
    """Recompute variants a free search tries: none, Megatron selective, torchtitan op-level, full, and full:N for
    N = a quarter and a half of the ``chunk_layers`` of the lightest pipeline chunk (when those are >= 1 and short
    of the whole chunk; ``planner.layout.layout.Layout.recompute_layers``)."""
    if "recompute" in fix:
        return [fix.recompute]
    if fix.get("recompute_modules"):  # a module list is Megatron's selective recomputation
        return ["selective"]
    ns = sorted({chunk_layers // f for f in FULL_N_FRACTIONS if 1 <= chunk_layers // f < chunk_layers})
    return ["none", "selective", "op", "full"] + [f"full:{n}" for n in ns]


def model_modules(model) -> frozenset[str]:
    """The ``recompute_modules`` that re-run something in ``model`` (``memory.module_freed_bytes``): core_attn and
    mla_up_proj where it has attention (MLA for the latter), mlp where it has dense MLP layers, moe and moe_act where
    it has routed experts, layernorm where a norm is not fused into the next linear (MLA's input norm, an MoE
    layer's pre-MLP norm), shared_experts where it has them."""
    kinds = "".join(model.layer_kind(i) for i in range(model.num_layers))
    attention, mla, moe = "*" in kinds or "S" in kinds, bool(model.q_lora_rank or model.kv_lora_rank), "E" in kinds
    names = {"core_attn"} if attention else set()
    names |= {"mla_up_proj"} if attention and mla else set()
    names |= {"mlp"} if "-" in kinds else set()
    names |= {"moe", "moe_act"} if moe else set()
    names |= {"layernorm"} if (attention and mla) or moe else set()
    names |= {"shared_experts"} if moe and model.num_shared_experts else set()
    return frozenset(names)


def module_choices(fix: Pins, model, stack: str, fp8: str = "none") -> tuple[str, ...]:
    """The ``recompute_modules`` lists a free search tries beside Megatron-Core's default selective recomputation
    on an MoE model (the presets that run them are all MoE models'): each of ``PRESET_MODULE_SETS`` whose every
    module re-runs something in ``model`` (``model_modules``), where the
    user pinned neither the list nor the recompute kind (a pinned recompute=selective is Megatron-Core's default
    list, as ``--recompute-granularity selective`` without ``--recompute-modules`` is), under Megatron-Core (its
    module list), and as it runs them beside the fp8 recipe ``fp8`` (delayed scaling: no moe_act or layernorm)."""
    if "recompute_modules" in fix or "recompute" in fix or stack != "megatron" or fix.get("offload_layers") \
            or not model.num_experts:  # the lists come from MoE models' presets; a dense one keeps the default
        return ()
    has = model_modules(model)
    if fix.get("moe_fused_mlp"):  # the fused experts skip the moe_act checkpoint (``layout.fused_moe_mlp_refusal``)
        has -= {"moe_act"}
    if fp8 == "delayed":  # ``Layout.validate``: Megatron-Core refuses them under delayed scaling
        has -= {"moe_act", "layernorm"}
    return tuple(m for m in PRESET_MODULE_SETS if set(m.split("+")) <= has)


def offload_priced(device) -> bool:
    """Whether a free search on ``device`` tries activation offloading: on a Grace host, whose NVLink-C2C and
    LPDDR5X serve the superchip's GPUs alone (the catalogue's host link already shares them between its two GPUs).
    Behind PCIe the eight GPUs of a node share the host's DRAM (a DGX H100's two Xeon 8480C: 16 DDR5-4800 channels,
    614 GB/s, against 8 x 64 GB/s each way) and their switches with the NICs, which the copies' price leaves out;
    NVIDIA's own presets offload on GB200 and GB300 and at most 5 layers elsewhere (Megatron-Bridge v0.5.0
    ``llama3_workload_base_configs.py``: B200 fp8-cs 5 of 80). A pinned count is priced on any catalogued link."""
    return device.host_cpu == "grace" and device.host_bw_bytes_per_s > 0


def offload_choices(fix: Pins, num_layers: int, pp: int, stack: str) -> tuple[int, ...]:
    """The ``offload_layers`` a free search tries beside recompute=none, past 0: a quarter and a half of the
    layers (``OFFLOAD_FRACTIONS``), where Megatron-Core offloads (its stack, no pipeline parallelism:
    ``Layout._check_offload``) and the user pinned neither the count nor a recomputation."""
    if "offload_layers" in fix or fix.get("recompute", "none") != "none" or fix.get("recompute_modules") \
            or pp > 1 or stack != "megatron":
        return ()
    return tuple(sorted({num_layers // f for f in OFFLOAD_FRACTIONS if 1 <= num_layers // f < num_layers}))


# What each stack's code runs when a decision is left free (``Decision.stack_values``).
STACK_CAN = stack_can()

# The attention kernels that soft-cap the scores (``ModelSpec.attn_softcap``, Gemma 2), per stack: under Megatron-Core
# Megatron-Bridge's ``Gemma2DotProductAttention``, unfused (models/gemma/gemma2_provider.py @ v0.3.1: "use unfused
# SDPA for attn logit softcapping"; Transformer Engine's attention has no cap); in HF code its eager attention,
# FlashAttention-2 (``softcap``) or FlexAttention (a ``score_mod``); PyTorch SDPA and cuDNN have none.
SOFTCAP_ATTENTION = {"megatron": ("unfused",), "torchtitan": ("unfused", "flash2", "flex"),
                     "eager": ("unfused", "flash2", "flex")}


def check_cp_kind(fix: Pins, model, stacks: list[str]) -> tuple[str, ...]:
    """The context-parallel exchanges Transformer Engine runs the model's attention under (``cp_kind``; a free search
    under Megatron-Core leaves the others out), a pinned other one refused in one line. ``attn_forward_func_with_cp``
    (context_parallel.py @ d0067d0) asserts a sliding window only under all-gather or all-to-all ("Context parallelism
    does not support sliding window attention with cp_comm_type='p2p'") and attention sinks only under all-to-all
    ("Context parallelism only supports softmax_type=... with cp_comm_type = 'a2a'"; Megatron-Bridge's GPT-OSS recipe:
    "only a2a cp is supported for sink attention")."""
    kinds: tuple[str, ...] = ("ring", "allgather", "a2a")
    if model.sliding_window and model.window_layers:
        kinds, what = ("allgather", "a2a"), "sliding-window layers"
    if model.attention_sinks:
        kinds, what = ("a2a",), "attention sinks"
    cp, kind = int(fix.get("cp", 1)), fix.get("cp_kind", "")
    if cp > 1 and kind and kind not in kinds and stacks == ["megatron"]:
        raise MeshplanError(f"cp_kind={kind} (pinned) with cp={cp}: model {model.name} has {what}, which Transformer "
                            f"Engine's context parallelism runs only with cp_kind {' or '.join(kinds)}")
    return kinds


def attention_choices(fix: Pins, model, stacks: list[str]) -> list[str]:
    """What ``attention`` takes: the pinned kernels, else the stack's fused one ("flash"); for a model that caps its
    attention scores, the kernels that can (``SOFTCAP_ATTENTION``; free: unfused, which every stack's code runs), a
    pinned one that no pinned stack can run with the cap refused in one line."""
    if not model.attn_softcap:
        return fix.choices("attention", ["flash"])
    pinned = fix.choices("attention", ["unfused"])
    able = {a for st in stacks for a in SOFTCAP_ATTENTION[st]}
    bad = [a for a in pinned if a not in able]
    if bad:
        raise MeshplanError(
            f"attention={bad[0]} (pinned): model {model.name} soft-caps its attention scores (attn_logit_softcapping "
            f"{model.attn_softcap:g}), which cuDNN's fused attention and PyTorch SDPA cannot; under stack "
            f"{'/'.join(stacks)} use attention={' or '.join(sorted(able))}")
    return pinned


def stack_runs(stack: str, fix: Pins, **decisions: str) -> bool:
    """Whether ``stack`` runs each free decision's value (a pinned one is the user's: always tried, and the export
    target says what it cannot carry). ``full:N`` is full recomputation of N layers per chunk."""
    can = STACK_CAN.get(stack)
    if can is None:
        return True
    for key, value in decisions.items():
        if key in fix:
            continue
        kind = value.split(":", 1)[0] if key == "recompute" else value
        if kind not in can[key] or (key == "recompute" and ":" in value and stack == "eager"):
            return False
    return True


def fp8_recipe_choices(dtype: str, device) -> tuple[str, ...]:
    """The low-precision recipes a free search tries for a workload of ``dtype`` on ``device``: Transformer
    Engine's tensorwise (current scaling), delayed and blockwise (DeepSeek-V3) recipes when the workload trains in
    fp8; on devices whose tensor cores scale 32-element blocks (the catalogue's ``mxfp8`` dtype: B200, B300, GB200,
    GB300) MXFP8 in place of blockwise, which Transformer Engine runs there as MXFP8 ("FP8 Block is emulated via
    MXFP8", ``docs/examples/gemm_profiling``; ``costmodel.fp8_recipes``), so the two are one candidate (a pinned
    ``fp8=blockwise`` still prices); NVFP4BlockScaling for an nvfp4 workload; ``("none",)`` otherwise."""
    if dtype == "nvfp4":
        return ("nvfp4",)
    if dtype != "fp8":
        return ("none",)
    return ("tensorwise", "delayed") + (("mxfp8",) if device.supports("mxfp8") else ("blockwise",))


def check_fp8_pin(fix: Pins, dtype: str) -> None:
    """Refuse a pinned ``fp8`` recipe the workload's ``dtype`` does not train in, naming both: the fp8 recipes
    belong to ``--dtype fp8``, NVFP4 to ``--dtype nvfp4``, and a bf16 (fp16, fp32) workload runs none (its MFU is
    taken against that dtype's peak, so a quietly low-precision plan would report it against the wrong one)."""
    pinned = fix.get("fp8", "none")
    if pinned == "none":
        return
    wants = "nvfp4" if pinned == "nvfp4" else "fp8"
    if dtype != wants:
        raise MeshplanError(f"--fix fp8={pinned}: a --dtype {wants} recipe, but this workload trains in --dtype "
                            f"{dtype} (use --dtype {wants}" + (f" --fix fp8={pinned}" if wants == "fp8" else "") + ")")


def fp8_attention_recipes(fix: Pins, recipes: tuple[str, ...], dtype: str) -> tuple[str, ...]:
    """``recipes`` (what a free ``fp8`` tries) kept to those fp8 attention runs under when ``--fix
    attention_dtype=fp8`` (``FP8_ATTENTION_RECIPES``, each recipe as the workload's dtype resolves it); all of them
    otherwise. Raises ``MeshplanError`` when none is left, naming the recipes and the dtype."""
    if fix.get("attention_dtype", "bf16") != "fp8":
        return recipes
    tried = fix.choices("fp8", list(recipes))
    kept = tuple(r for r in tried if lowp_recipe(r, dtype) in FP8_ATTENTION_RECIPES)
    if not kept:
        runs = ", ".join(sorted({lowp_recipe(r, dtype) for r in tried}))
        raise MeshplanError(f"--fix attention_dtype=fp8: Transformer Engine runs fp8 attention under tensor-wise, "
                            f"delayed or MXFP8 scaling; this workload (--dtype {dtype}) runs {runs} (use --dtype fp8 "
                            "with fp8=tensorwise, delayed or mxfp8)")
    return kept


@dataclass(slots=True)  # not frozen: a search builds 10^4-10^5 groups, and a frozen __init__ costs 3x
class LayoutGroup:
    """Candidates that share every decision but activation recomputation and the sharding of the data-parallel
    states: members ``recomputes x shards``, in that order (recompute outer). ``base`` is the first member.

    The search prices a group's members lazily (``planner.search.exact``): per-micro-batch work does not depend on how
    the data-parallel states are sharded and recomputation only adds to it, which bounds a whole group from one
    member.
    """

    base: Layout
    recomputes: tuple[str, ...]
    shards: tuple[tuple[int, int, int], ...]  # (zero_stage, dp_shard, dp_replicate)
    graphs: tuple[str, ...] = ()  # a free search's cuda_graphs per recompute (``free_cuda_graphs``); () = pinned
    offloads: tuple[int, ...] = ()  # a free search's offload_layers per recompute (``offload_choices``); () = base's
    modules: tuple[str, ...] = ()  # a free search's recompute_modules per recompute (``module_choices``); () = base's

    def __len__(self) -> int:
        return len(self.recomputes) * len(self.shards)

    def member(self, r: int, s: int) -> Layout:
        """The layout of recompute ``self.recomputes[r]`` and shard choice ``self.shards[s]``."""
        z, d, rep = self.shards[s]
        extra = {"cuda_graphs": self.graphs[r]} if self.graphs else {}
        if self.offloads:
            extra["offload_layers"] = self.offloads[r]
        if self.modules:
            extra["recompute_modules"] = self.modules[r]
        return self.base.with_(recompute=self.recomputes[r], zero_stage=z, dp_shard=d, dp_replicate=rep, **extra)

    def layouts(self) -> Iterator[Layout]:
        for r in range(len(self.recomputes)):
            for s in range(len(self.shards)):
                yield self.member(r, s)


def free_cuda_graphs(layout: Layout) -> str:
    """What a free search captures in CUDA graphs on an MoE model under Megatron-Core: Transformer Engine's per-layer
    graphs (attention, router, preprocessing, shared experts), the scope NVIDIA recommends for dropless MoE
    (Megatron-Bridge ``docs/training/cuda-graphs.md``: "dropless MoE: attn moe_router moe_preprocess"). They only
    take host time away (their memory is not priced). None where Megatron-Core refuses them (``Layout`` says why):
    full recomputation, activation offloading, a recomputed MoE block; the whole-iteration graph needs a sync-free
    dispatcher, so it is never chosen here. None for NeMo AutoModel's MoE layer (``moe_impl``): AutoModel captures
    no CUDA graphs (nothing in ``nemo_automodel`` @ 89e3a9fdd, where its MoE performance rows entered)."""
    if (layout.recompute_kind == "full" or layout.offload_layers
            or "moe" in layout.recomputed_modules or layout.moe_impl == "automodel"):
        return "none"
    return "layers"


def free_dispatcher(device, moe_capacity: float = 0.0) -> str:
    """The token dispatcher a free search takes where ep > 1 under Megatron-Core: Hybrid-EP on Blackwell, the parts
    its kernel bandwidths are published for (``costmodel.hybridep``: B200, GB200), DeepEP on other NVIDIA GPUs,
    NCCL's all-to-all elsewhere. Megatron-Bridge's performance recipes choose alike (``moe_flex_dispatcher_backend``
    hybridep on its DGX-B200 / GB200 / B300 / GB300 MoE recipes, DeepEP on H100), and as priced the flex
    dispatchers never lose to the all-to-all: one copy per destination node and rank instead of one per routed
    expert, DeepEP's NIC at line rate, no second token sort (``tests/test_search_dispatcher.py``). With token
    dropping (``moe_capacity``) not DeepEP, which Megatron-Core does not pad to capacity
    (``layout.megatron_dispatch_refusal``): the all-to-all there."""
    if device.vendor != "nvidia":
        return "alltoall"
    flex = "hybridep" if device.supports("mxfp8") else "deepep"
    return "alltoall" if megatron_dispatch_refusal(flex, moe_capacity) else flex


def _ep_overlaps(model, fix: Pins, tp: int, cp: int, dp: int, etp: int,
                 dispatcher: str = "alltoall") -> list[tuple[int, list[tuple[bool, str]]]]:
    """The mesh's expert-parallel degrees (in order), each with its (moe_overlap, moe_dispatcher) choices: ep x etp
    folds over the tp x cp x dp ranks of a stage; ``dispatcher``: what a free search takes where ep > 1
    (``free_dispatcher``; the pinned one where pinned; at ep 1 the pinned one or the default, which moves nothing)."""
    E = model.num_experts
    folded = tp * cp * dp // (etp or tp)
    eps = fix.choices("ep", [1] + [e for e in divisors(E) if e > 1 and folded % e == 0] if E else [1])
    return [(ep, [(mo, d) for mo in fix.choices("moe_overlap", [False, True] if ep > 1 else [False])
                  for d in fix.choices("moe_dispatcher", [dispatcher if ep > 1 else "alltoall"])]) for ep in eps]


def _meshes(model, world_size: int, devices_per_node: int, global_batch: int, seq_len: int, fix: Pins,
            bound: bool = False) -> Iterator[tuple]:
    """Each tp x pp x cp x dp mesh of the space, in canonical order, with the choices that depend on it:
    (tp, pp, cp, dp, shards, etps, vpps, splits, cp_kinds). ``bound``: for ``space_size_bound`` (no stage splits
    of interleaved chunks)."""
    L, E = model.num_layers, model.num_experts
    # tp stays inside one NVLink domain: ``devices_per_node`` is the NVLink width (a node, or an NVL72 rack)
    tps = fix.choices("tp", [t for t in divisors(world_size) if t <= devices_per_node
                             and model.num_heads % t == 0
                             and (model.num_kv_heads % t == 0 or t % model.num_kv_heads == 0)
                             and not getattr(model, "split_problem", lambda *_: "")(t, 1)])
    for tp in tps:
        rest = world_size // tp if world_size % tp == 0 else 0
        # free: pp dividing the layers (uneven stages for every pp up to L/2 would make the pruned DeepSeek-V3
        # search 8x longer, 11.1M candidates in 17.8 s, Llama 3.1 405B 3.6 s: bench/plan_speed.py, 2026-11-25); a
        # pinned pp (405B PP16 over 126 layers, DeepSeek-V3 PP16 over 61) gets uneven stages, the split chosen below
        if fix.pp_layout is not None and "pp" not in fix:  # the pinned layout names the stages (x vpp chunks)
            pps = [len(fix.pp_layout) // fix.get("vpp", 1)] if rest else []
        else:
            pps = fix.choices("pp", [p for p in divisors(rest) if L % p == 0]) if rest else []
        etps = fix.choices("etp", [0] + ([1] if tp > 1 else [])) if E else fix.choices("etp", [0])
        for pp in pps:
            rest2 = rest // pp if rest % pp == 0 else 0
            cps = fix.choices("cp", [c for c in divisors(rest2) if c <= MAX_CP
                                     and (c == 1 or (seq_len % (2 * c) == 0 and seq_len // c >= 1024))
                                     and not getattr(model, "split_problem", lambda *_: "")(tp, c)]) \
                if rest2 else []
            try:
                split1 = stage_split(L, pp, 1, fix)
            except MeshplanError:
                if "pp" in fix and "vpp" not in fix:
                    raise
                split1 = None  # this pp cannot take the pinned split (interleaved below, or another pp)
            uneven = bool(split1) or "first_stage_layers" in fix or "last_stage_layers" in fix
            # free vpp: chunks dividing the layers; with uneven stages, chunks of >= 2 layers on the lightest stage
            chunked = [v for v in range(2, MAX_VPP + 1) if (min(split1 or (L // pp,)) >= 2 * v if uneven
                                                             else L % (pp * v) == 0)] if pp > 1 else []
            if split1 is None:  # only interleaved chunks can take it, when pinned
                chunked = list(fix.choices("vpp", []))
            if fix.pp_layout is not None:  # a pinned layout fixes the chunk count too
                chunked = [len(fix.pp_layout) // pp] if len(fix.pp_layout) > pp else []
            sched = fix.schedule or ""
            vpps = fix.choices("vpp", chunked if sched == "interleaved" else
                               [1] if sched in ("zbh1", "dualpipe", "1f1b") else [1] + chunked)
            splits = {}
            if not bound:
                for v in list(vpps):
                    try:
                        splits[v] = split1 if v == 1 and split1 is not None else stage_split(L, pp, v, fix)
                    except MeshplanError:
                        if "pp" in fix and "vpp" in fix:
                            raise  # both pinned: the split's own message is the answer
                        vpps = [x for x in vpps if x != v]  # a free pp or vpp that cannot take the split
                if not vpps:
                    continue
            for cp in cps:
                dp = rest2 // cp if rest2 % cp == 0 else 0
                if "dp" in fix and fix.dp != dp:
                    continue
                if not dp:
                    continue
                cp_kinds = fix.choices("cp_kind", ["ring", "allgather"] + (
                    ["a2a"] if (model.num_heads // tp) % cp == 0 else []) if cp > 1 else ["ring"])
                shards = []
                for zero in fix.choices("zero", [0, 1, 2, 3]):
                    for dp_shard in (fix.choices("dp_shard", [1]) if zero == 0 else
                                     fix.choices("dp_shard", [d for d in divisors(dp) if d > 1] or [1])):
                        if zero > 0 and dp_shard == 1 and cp == 1 and "zero" not in fix:
                            continue  # nothing to shard over: same as zero=0
                        dp_rep = fix.choices("dp_replicate", [dp // dp_shard if dp % dp_shard == 0 else 0])[0]
                        if dp_rep >= 1:
                            shards.append((zero, dp_shard, dp_rep))
                if shards:
                    yield tp, pp, cp, dp, tuple(shards), etps, vpps, splits, cp_kinds


def enumerate_groups(model, world_size: int, devices_per_node: int, global_batch: int, seq_len: int,
                     fix: Pins, fp8_recipes: tuple[str, ...] = ("none",),
                     recompute_kinds: tuple[str, ...] | None = None, graphs: bool = False,
                     dispatcher: str = "alltoall", offload: bool = False) -> Iterator[LayoutGroup]:
    """Yield the candidate space as ``LayoutGroup`` s, in the one canonical order (``enumerate_layouts`` is the
    same order, flat; the search breaks exact ties by it).

    Unpinned TP stays inside one node and is a divisor of the head counts; unpinned CP is used only when
    the local sequence stays at least 1024 tokens. Pinned values are yielded even when they break a rule,
    so that ``Layout.validate`` reports why. ``fp8_recipes``: the recipes a free ``fp8`` tries (the workload's
    dtype decides: ``fp8_recipe_choices``). ``recompute_kinds``: the recompute kinds the estimator prices (``local:N``
    plans: what the host measures and the example trainer runs); ``None``: all. A free ``stack`` is Megatron-Core's
    only: the stack is the user's
    training code, which the export target names (a torchtitan plan is ``--fix stack=torchtitan``), not a knob
    a layout tunes, and eager code is never the faster one. ``graphs``: the devices run CUDA graphs (NVIDIA GPUs),
    where a free ``cuda_graphs`` on an MoE model under Megatron-Core takes ``free_cuda_graphs``. ``dispatcher``: what a
    free ``moe_dispatcher`` takes where ep > 1 under Megatron-Core (``free_dispatcher`` of the cluster's device).
    ``offload``: a free search also tries activation offloading beside recompute=none (``offload_choices``; where
    ``offload_priced``), members of the group like its recompute variants.
    """
    L = model.num_layers
    fp8s = fix.choices("fp8", list(fp8_recipes))
    stacks = fix.choices("stack", ["megatron"])
    moe_kw = free_defaults(fix)  # the decisions a free search leaves at their default
    graphs_free = graphs and bool(model.num_experts) and "cuda_graphs" not in fix
    sched = fix.schedule or ""
    mtp_pin = int(fix.get("mtp", 0))
    # every group's layout is this one's fields with the enumerated ones set, layer by layer of the loops below
    # (a dict display per group instead of the frozen dataclass's per-field ``__init__``: a search builds 10^5;
    # ``Layout`` has no ``__post_init__``, and updating existing keys keeps the fields' order)
    base = Layout(pipeline_schedule=sched, **moe_kw).__dict__
    runs: dict[tuple, bool] = {}
    rc_memo: dict[tuple, tuple[str, ...]] = {}
    graphs_memo: dict[tuple[str, ...], tuple[str, ...]] = {}  # free cuda_graphs per recompute list (moe_kw is fixed)
    base["offload_layers"] = int(fix.get("offload_layers", 0))
    base["recompute_modules"] = str(fix.get("recompute_modules", ""))
    mods_of = {(st, f8): module_choices(fix, model, st, f8) for st in stacks for f8 in fp8s}
    attentions = attention_choices(fix, model, stacks)
    te_cp_kinds = check_cp_kind(fix, model, stacks)

    mod_graphs: dict[tuple[str, ...], tuple[str, ...]] = {}  # free cuda_graphs per module-list tuple

    def graph_of_modules(mods: tuple[str, ...]) -> tuple[str, ...]:
        if mods not in mod_graphs:
            probe = Layout(**moe_kw).with_(recompute="selective", offload_layers=base["offload_layers"])
            mod_graphs[mods] = tuple(free_cuda_graphs(probe.with_(recompute_modules=m)) for m in mods)
        return mod_graphs[mods]

    offload = offload and recompute_kinds is None and fix.get("cuda_graphs", "none") == "none"
    for tp, pp, cp, dp, shards, etps, vpps, splits, cp_kinds in _meshes(model, world_size, devices_per_node,
                                                                         global_batch, seq_len, fix):
        z0, d0, r0 = shards[0]
        mesh = {**base, "dp_replicate": r0, "dp_shard": d0, "tp": tp, "pp": pp, "cp": cp, "zero_stage": z0}
        sps = fix.choices("sp", [tp > 1])
        for etp in etps:
            for ep, overlaps in _ep_overlaps(model, fix, tp, cp, dp, etp, dispatcher):
                # per stack, the shardings whose replicas hold whole experts (``replicas_hold_whole_experts``)
                by_stack = {st: tuple(sh for sh in shards
                                      if replicas_hold_whole_experts(tp, cp, sh[1], sh[2], ep, etp or tp, st))
                            for st in stacks}
                for vpp, sp, att, ck, f8, st, (mo, disp) in product(
                        vpps, sps, attentions, cp_kinds, fp8s, stacks, overlaps):
                    ep_shards = by_stack[st]
                    if not ep_shards or (model.attn_softcap and att not in SOFTCAP_ATTENTION[st]):
                        continue
                    if cp > 1 and st == "megatron" and ck not in te_cp_kinds:
                        continue  # Transformer Engine's CP runs windows and sinks on some exchanges (check_cp_kind)
                    if st != "megatron" and "moe_dispatcher" not in fix:
                        disp = "alltoall"  # DeepEP and Hybrid-EP ship with Megatron-Core's flex dispatcher
                    ok = runs.get((st, ck, f8, mo))
                    if ok is None:
                        ok = runs[st, ck, f8, mo] = stack_runs(st, fix, cp_kind=ck, fp8=f8, moe_overlap=mo)
                    if not ok:
                        continue
                    split = splits[vpp]
                    chunk = min(split) if split else L // (pp * vpp)
                    rcs = rc_memo.get((chunk, st))
                    if rcs is None:
                        rcs = rc_memo[chunk, st] = tuple(
                            r for r in recompute_choices(fix, chunk)
                            if (recompute_kinds is None or "recompute" in fix or r.split(":")[0] in recompute_kinds
                                and (":" not in r or "full:N" in recompute_kinds))
                            and stack_runs(st, fix, recompute=r))
                    if mo and st == "megatron" and "moe_overlap" not in fix:
                        # a free moe_overlap only beside what Megatron-Core runs it with (a pinned one is the
                        # user's: validation says why not)
                        rcs = tuple(r for r in rcs if not megatron_moe_overlap_refusal(pp, vpp, r, mtp_pin))
                        if not rcs:
                            continue
                    # free vpp > 1 also needs a multiple of pp micro-batches (the interleaved schedule)
                    mbss = fix.choices("mbs", [b for b in MBS_CHOICES if global_batch % (b * dp) == 0
                                               and (vpp == 1 or "vpp" in fix or global_batch // (b * dp) % pp == 0)])
                    if not mbss:
                        continue
                    offs = offload_choices(fix, L, pp, st) if offload and "none" in rcs else ()
                    mods = mods_of[st, f8] if "selective" in rcs else ()
                    z0, d0, r0 = ep_shards[0]
                    outer = {**mesh, "dp_replicate": r0, "dp_shard": d0, "zero_stage": z0, "vpp": vpp, "ep": ep,
                             "recompute": rcs[0], "sequence_parallel": sp,
                             "attention": att, "pp_layout": split, "etp": etp, "fp8": f8, "cp_kind": ck,
                             "stack": st, "moe_overlap": mo, "moe_dispatcher": disp}
                    graphs_of = ()
                    if graphs_free and st == "megatron":
                        graphs_of = graphs_memo.get(rcs)
                        if graphs_of is None:
                            probe = Layout(**moe_kw).with_(offload_layers=base["offload_layers"],
                                                           recompute_modules=base["recompute_modules"])
                            graphs_of = graphs_memo[rcs] = tuple(free_cuda_graphs(probe.with_(recompute=rc))
                                                                 for rc in rcs)
                        outer["cuda_graphs"] = graphs_of[0]
                    members, offloads, modules = rcs, (), ()
                    if mods:  # selective again, with each preset module list
                        members = rcs + ("selective",) * len(mods)
                        modules = (outer.get("recompute_modules", ""),) * len(rcs) + mods
                        if graphs_of:
                            graphs_of = graphs_of + graph_of_modules(mods)
                    if offs:  # recompute=none again, with each count offloaded (no graph: Layout refuses the pair)
                        n = len(members)
                        members, offloads = members + ("none",) * len(offs), (0,) * n + offs
                        modules = modules + ("",) * len(offs) if modules else ()
                        graphs_of = graphs_of + ("none",) * len(offs) if graphs_of else ()
                    for mbs in mbss:
                        lay = object.__new__(Layout)
                        object.__setattr__(lay, "__dict__", {**outer, "micro_batch": mbs})
                        yield LayoutGroup(lay, members, ep_shards, graphs_of, offloads, modules)


def enumerate_layouts(model, world_size: int, devices_per_node: int, global_batch: int, seq_len: int,
                      fix: Pins, fp8_recipes: tuple[str, ...] = ("none",), graphs: bool = False,
                      dispatcher: str = "alltoall") -> Iterator[Layout]:
    """Yield every candidate layout (memory is checked by the caller), in the canonical order of
    ``enumerate_groups`` (each group's members in turn)."""
    for g in enumerate_groups(model, world_size, devices_per_node, global_batch, seq_len, fix, fp8_recipes,
                              graphs=graphs, dispatcher=dispatcher):
        yield from g.layouts()


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
