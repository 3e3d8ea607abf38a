"""Every decision of a layout beyond its degrees, declared once.

Each field of ``Decisions`` is one decision: its type and default, then ``decision(...)`` with a one-line doc, its
``--fix`` key, its choices or range, what each training stack does when it is left free, and how a free search
treats it; the docstring under the field says what it means and cites where it comes from. Everything else
derives from these fields (``DECISIONS``): ``Layout`` (which inherits them), the plan file's fields
(``planner.plan.schema``) and their JSON Schema, ``--fix`` parsing and its errors (``planner.layout.space``), the
values a free search leaves at their default, ``meshplan plan --help`` and ``docs/decisions.md``.
Adding a decision is its field here, the pricing that reads it, and one mapping per export target.
"""
from __future__ import annotations

import re
from dataclasses import MISSING, dataclass, field, fields
from types import MappingProxyType
from typing import Annotated, Literal, Mapping, Optional

from pydantic import Field

from meshplan.core.bounds import MAX_COUNT
from meshplan.core.errors import MeshplanError
from meshplan.planner.layout.splits import parse_pp_layout

RECOMPUTE = ("none", "selective", "full", "op")  # plus "full:N" (``Layout.recompute_layers``)
RECOMPUTE_PATTERN = r"^(none|selective|full|op|full:[1-9][0-9]{0,3})$"
# Megatron-Core ``TransformerConfig.recompute_modules`` (megatron-core 0.16.1 ``transformer/transformer_config.py``),
# in its docstring's order; a value joins them with "+" in this order ("" = its default, ["core_attn"]).
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
RECOMPUTE_MODULES_PATTERN = r"^$|^({0})(\+({0}))*$".format("|".join(RECOMPUTE_MODULES))
# The schedules a plan file names: the layout's own, plus GPipe, which plans of older versions recorded.
PLAN_SCHEDULES = ("1f1b", "interleaved", "gpipe", "zbh1", "dualpipe")
# Bytes per parameter of each choice of the model-state precisions (``optim_dtype``; ``grad_dtype`` and
# ``reduce_dtype``). Adam's fp32 master + m + v is the ZeRO paper's K = 12. "remainder": fp32 m and v plus the int16
# low halves of the fp32 master weights (apex DistributedFusedAdam ``param_remainders_shard``; the bf16 weight
# supplies the high half). "bf16": bf16 m and v (apex ``exp_avg_shard``/``exp_avg_sq_shard`` in the optimizer dtype)
# and no master copy (apex ``store_params=False`` when the optimizer dtype is the model's, NeMo r2.0.0rc1).
OPTIMIZER_BYTES_BY_DTYPE = MappingProxyType({"fp32": 12, "remainder": 4 + 4 + 2, "bf16": 2 + 2})
GRAD_BYTES_BY_DTYPE = MappingProxyType({"bf16": 2, "fp32": 4})
# The workload dtypes that train the decoder GEMMs in a block-scaled or fp8 format, and the recipe each means when
# the ``fp8`` decision is left at "none": Transformer Engine's DelayedScaling for fp8, NVFP4BlockScaling for nvfp4.
LOWP_DEFAULT_RECIPE = MappingProxyType({"fp8": "delayed", "nvfp4": "nvfp4"})


# The recipes under which Transformer Engine runs fp8 dot-product attention (``attention_dtype`` fp8): its
# ``FusedAttnFunc`` quantizes Q, K and V per tensor ("delayed", "current") or in MX blocks ("mxfp8"), by default
# under the linear layers' own recipe, which has no blockwise or NVFP4 attention path (TE
# ``pytorch/attention/dot_product_attention/backends.py``, 2.20 d0067d0; NVTE_DPA_FP8_RECIPE can pick another).
FP8_ATTENTION_RECIPES = ("tensorwise", "delayed", "mxfp8")


def lowp_recipe(fp8: str, dtype: str) -> str:
    """The low-precision recipe the decoder GEMMs run in: the ``fp8`` decision, else the workload dtype's default
    (``LOWP_DEFAULT_RECIPE``), else ``none``."""
    return fp8 if fp8 != "none" else LOWP_DEFAULT_RECIPE.get(dtype, "none")


@dataclass(frozen=True)
class Decision:
    """How one decision is typed, pinned, searched and stored (see ``decision``)."""

    name: str
    default: object
    doc: str
    kind: str  # "int", "float", "bool", "tristate" (None = the stack's own), "choice", "recompute", "stages",
    # "modules" (a "+"-joined subset of ``choices``)
    fix_key: str
    choices: tuple = ()
    lo: Optional[float] = None
    hi: Optional[float] = None
    stack_own: str = ""  # what "" / None means: the stack's own value, and how each stack sets it
    stack_values: Mapping[str, tuple] = field(default_factory=lambda: MappingProxyType({}))
    """The values a free search tries under each stack (what each stack's code can run)."""
    searched: bool = False  # a free search enumerates it (else it stays at its default unless pinned)
    free: str = ""  # what a free search takes instead of the default, where a rule picks it (not searched)
    plan_field: str = ""  # its field in a plan file ("" = not a field of its own)
    plan_optional: bool = True  # left out of a plan file while at its default (plans of older versions load alike)
    by_stack: bool = False
    """A stack profile may set it (``planner.layout.stacks``): what a free search leaves at its default, and the
    kernel choices a stack makes (the kernel set, the attention kernel, the fp8 recipe)."""

    @property
    def unset(self) -> object:
        """The value that means "the stack's own" (``""`` or ``None``), or ``MISSING`` where none does."""
        if not self.stack_own:
            return MISSING
        return None if self.kind == "tristate" else ""

    def parse(self, text: str) -> object:
        """The value of ``--fix KEY=text``. Raises ``MeshplanError`` naming the key, the text and what it expects."""
        key, val = self.fix_key, text.strip()
        if self.kind == "recompute":
            if val not in RECOMPUTE and not re.fullmatch(r"full:[1-9]\d{0,3}", val):
                raise MeshplanError(f"--fix {key}={text}: expected one of {', '.join(RECOMPUTE)} or full:N "
                                    "(N layers per stage)")
            return val
        if self.kind == "modules":
            return parse_modules(key, val, self.choices)
        if self.kind == "choice" and isinstance(self.default, str):
            if val.lower() not in self.choices:
                raise MeshplanError(f"--fix {key}={text}: expected one of {', '.join(self.choices)}")
            return val.lower()
        if self.kind == "stages":
            return parse_pp_layout(val)
        if self.kind in ("bool", "tristate"):
            if val.lower() not in ("true", "false", "1", "0", "on", "off"):
                raise MeshplanError(f"--fix {key}={text}: expected true or false")
            return val.lower() in ("true", "1", "on")
        if self.kind == "float":
            try:
                out = float(val)
            except ValueError:
                raise MeshplanError(f"--fix {key}={text}: expected a number") from None
            if not self.lo <= out <= self.hi:  # also refuses nan
                raise MeshplanError(f"--fix {key}={text}: must be within [{self.lo:g}, {self.hi:g}]")
            return out
        try:
            out = int(val)
        except ValueError:
            raise MeshplanError(f"--fix {key}={text}: expected an integer") from None
        if self.choices and out not in self.choices:
            raise MeshplanError(f"--fix {key}={text}: expected one of {', '.join(map(str, self.choices))}")
        if self.lo is not None and out < self.lo:
            raise MeshplanError(f"--fix {key}={text}: must be >= {self.lo:g}")
        if out > MAX_COUNT:
            raise MeshplanError(f"--fix {key}={text}: must be at most {MAX_COUNT}")
        return out

    def check(self, value: object) -> None:
        """Raise ``MeshplanError`` when ``value`` is outside the choices or range (the stack's own always passes)."""
        if value == self.unset and self.unset is not MISSING:
            return
        if self.kind == "choice" and value not in self.choices:
            raise MeshplanError(f"{self.name} '{value}' is not one of {', '.join(map(str, self.choices))}")
        if self.kind == "float" and not self.lo <= value <= self.hi:
            raise MeshplanError(f"{self.name} {value} must be within [{self.lo:g}, {self.hi:g}]")
        if self.kind == "int" and value < self.lo:
            raise MeshplanError(f"{self.name}={value} must be >= {self.lo:g}")

    def plan_type(self) -> object:
        """The type of its plan-file field (pydantic; its JSON Schema is ``docs/schemas/plan.schema.json``'s)."""
        if self.kind == "recompute":
            return Annotated[str, Field(pattern=RECOMPUTE_PATTERN)]
        if self.kind == "modules":
            return Annotated[str, Field(pattern=RECOMPUTE_MODULES_PATTERN)]
        if self.kind == "choice" and isinstance(self.default, str):
            return Literal[tuple(([""] if self.stack_own else []) + list(self.choices))]
        if self.kind in ("int", "choice"):
            lo, hi = (min(self.choices), max(self.choices)) if self.choices else (self.lo, self.hi)
            return Annotated[int, Field(ge=lo, le=hi)]
        if self.kind == "float":
            return Annotated[float, Field(ge=self.lo, le=self.hi)]
        return Optional[bool] if self.kind == "tristate" else bool


def parse_modules(key: str, text: str, choices: tuple) -> str:
    """``a+b`` as a set of ``choices`` joined with "+" in their declared order (``--fix key=text``; "" = none named).
    Raises ``MeshplanError`` naming the key and the unknown module."""
    names = [n for n in text.lower().split("+") if n]
    for n in names:
        if n not in choices:
            raise MeshplanError(f"--fix {key}={text}: '{n}' is not one of {', '.join(choices)} (join several with +)")
    return "+".join(c for c in choices if c in names)


def decision(default: object, doc: str, *, kind: str = "", fix: str = "", choices: tuple = (),
             lo: float | None = None, hi: float | None = None, stack_own: str = "",
             stack_values: Mapping[str, tuple] | None = None, searched: bool = False, plan: str | None = None,
             plan_optional: bool = True, by_stack: bool | None = None, free: str = ""):
    """A ``Decisions`` field: ``default`` and how the decision is pinned, searched and stored (``Decision``)."""
    if not kind:
        kind = ("choice" if choices else "bool" if isinstance(default, bool)
                else "float" if isinstance(default, float) else "int")
    info = dict(default=default, doc=doc, kind=kind, fix_key=fix, choices=tuple(choices), lo=lo, hi=hi,
                stack_own=stack_own, stack_values=MappingProxyType(dict(stack_values or {})), searched=searched,
                plan_field=plan, plan_optional=plan_optional, by_stack=not searched if by_stack is None else by_stack,
                free=free)
    return field(default=default, metadata={"decision": info})


@dataclass(frozen=True)
class Decisions:
    """The decisions of a layout beyond its degrees (``Layout`` inherits them)."""

    micro_batch: int = decision(1, "sequences per micro-batch per data-parallel rank", fix="mbs", lo=1,
                                searched=True, plan_optional=False)
    zero_stage: int = decision(0, "ZeRO stage over the dp_shard group (3 = FSDP full shard; 0 needs dp_shard 1)",
                               fix="zero", choices=(0, 1, 2, 3), searched=True, plan_optional=False)
    recompute: str = decision(
        "none", "activation recomputation: none, selective, op, full or full:N (N layers per stage)",
        kind="recompute", searched=True, plan_optional=False,
        stack_values={"megatron": ("none", "selective", "full"), "torchtitan": ("none", "op", "full"),
                      "eager": ("none", "full")})
    """"selective" is Megatron's core-attention recomputation (Korthikanti et al. 2022); "op" torchtitan's op-level
    selective checkpointing; "full:N" Megatron's ``--recompute-method block --recompute-num-layers N``. What each
    stack can run: Megatron-Core has no op-level checkpointing, torchtitan's selective AC is op-level or
    every-k-layers, HF code checkpoints whole layers (``gradient_checkpointing``)."""
    recompute_modules: str = decision(
        "", "the modules recompute=selective re-runs in backward, joined with + (mla_up_proj+moe_act)",
        kind="modules", choices=RECOMPUTE_MODULES, stack_own="core_attn (Megatron-Core's default)", searched=True,
        by_stack=True, free="the default, and on an MoE model each module list Megatron-Bridge's performance presets "
                            "run whose modules the model has, beside recompute=selective (``space.module_choices``)")
    """Megatron-Core ``recompute_granularity="selective"`` with ``recompute_modules`` (megatron-core 0.16.1):
    "core_attn" the core attention (what "selective" alone means); "moe_act" the routed experts' activation, its
    output discarded (``TEGroupedMLP``'s ``CheckpointWithoutOutput``); "layernorm" the input and pre-MLP norms that
    are not fused into the next linear (MLA's input norm, an MoE layer's pre-MLP norm), their outputs discarded;
    "mla_up_proj" MLA's Q and KV up-projections and RoPE, their outputs (the attention's Q, K, V) discarded; "mlp" a
    dense layer's whole MLP; "moe" a whole MoE layer, its token dispatch and combine included; "shared_experts" the
    MoE's shared experts. What each frees and re-runs: ``planner.estimate.memory.module_freed_bytes`` and
    ``planner.estimate.ops_graph`` (``LayerOps.modules``). Needs ``recompute=selective`` (pinning the modules pins
    it) and Megatron-Core: torchtitan and HF code have no module list. On an MoE model a free search tries, beside
    the default, each list NVIDIA's own Megatron-Bridge performance presets run (``space.PRESET_MODULE_SETS``, all
    from MoE models': mla_up_proj on DeepSeek-V3, layernorm+moe_act on GPT-OSS, ...) whose modules the model has,
    as more members of the layout's recompute group; a dense model keeps the default. A pinned recompute=selective
    is the default list, as Megatron-Core's command line reads it."""
    sequence_parallel: bool = decision(False, "Megatron sequence parallelism (norms and dropout sharded over TP)",
                                       fix="sp", searched=True, plan_optional=False)
    """Needs tp > 1; a free search runs it wherever tp > 1."""
    attention: str = decision("flash", "the fused attention kernel", searched=True, plan_optional=False, by_stack=True,
                              choices=("flash", "flash2", "flash3", "cudnn", "flex", "unfused"))
    """"flash" is the stack's fused attention (cuDNN through Transformer Engine for megatron; for torchtitan and
    eager, PyTorch SDPA's own order: cuDNN first on Hopper and Blackwell in a current torch, FlashAttention-2
    elsewhere; a stack profile may name the kernel), or a named fused kernel; "unfused" materialises the s x s scores
    (Megatron-LM 2021: fused scale-mask-softmax, separate dropout). Priced from the kernels' published curves
    (``costmodel.attention``)."""
    attention_dtype: str = decision("bf16", "the dtype fused attention runs in: bf16, or fp8 (Transformer Engine's "
                                    "fp8 dot-product attention)", choices=("bf16", "fp8"))
    """Megatron-Core ``TransformerConfig.fp8_dot_product_attention`` (Megatron-Bridge
    ``mixed_precision.fp8_dot_product_attention``; Megatron-LM's command line generates no flag for it):
    Transformer Engine quantizes Q, K and V (per tensor under tensor-wise and delayed scaling, in 1x32 blocks under
    MXFP8: TE ``dot_product_attention/backends.py`` qkv_type) and runs cuDNN's fp8 fused attention forward and
    backward, keeping the fp8 Q, K and V for backward (row- and column-wise under MXFP8). Needs Megatron's stack, its
    fused attention and a tensor-wise, delayed or MXFP8 recipe. Priced from cuDNN's own fp8 and MXFP8 benchmark on
    GB200 / GB300 (``costmodel.attention``); other parts have no published fp8 forward-and-backward measurement and
    take their bf16 rate (``--explain`` says so). It trades numerics for speed, so a free search keeps bf16."""
    pp_layout: tuple[int, ...] = decision((), "decoder layers per pipeline stage, first to last (7+8*14+7)",
                                          kind="stages", searched=True, plan="")
    """() = pp divides the layers evenly. The first and last (virtual) stage may hold 0 decoder layers, only the
    embedding or only the loss, where the layers are fewer than the stages (``0+1*126+0``: Llama 3.1 405B over
    PP16 x VP8, Megatron's account-for-embedding/loss split). Megatron-LM
    ``--decoder-first/last-pipeline-num-layers`` or
    ``--pipeline-model-parallel-layout``: Llama 3.1 405B ran 126 layers on 16 stages (Llama 3 paper, Table 4). With
    vpp > 1: pp * vpp virtual stages in model-depth order (``Layout.stage_chunks``). A plan file keeps it as
    ``stages``."""
    pp_split: str = decision("", "how an uneven split is made when pp_layout is left free: megatron or front",
                             choices=("megatron", "front"), plan="",
                             stack_own="Megatron-LM's account-for-embedding/loss split, which a free search may "
                                       "re-balance by priced stage time (``search.exact``)")
    """The rule that splits the decoder layers over pp x vpp (virtual) stages that do not divide them, where
    ``pp_layout`` is not pinned. "megatron": Megatron-LM's ``--account-for-embedding-in-pipeline-split
    --account-for-loss-in-pipeline-split`` (``splits.balanced_split``); "front": NeMo AutoModel's pipelining, the
    first ``layers % stages`` stages one layer more, the embedding and the loss counted as none
    (``splits.front_split``). Pinned (by ``--fix`` or a stack profile), the split is the stack's and a search does
    not re-balance it; the plan keeps the split it made as ``stages``."""
    pipeline_schedule: str = decision(
        "", "the pipeline schedule: 1f1b, interleaved (vpp > 1), zbh1 or dualpipe", fix="schedule",
        choices=("1f1b", "interleaved", "zbh1", "dualpipe"), searched=True, plan="schedule", plan_optional=False,
        stack_own="1F1B, interleaved when vpp > 1 (``planner.layout.schedules``)")
    etp: int = decision(0, "expert tensor parallelism (0 = the dense tp)", lo=0, searched=True)
    """Megatron-Core ``--expert-tensor-parallel-size``. With MoE parallel folding (Liu et al. 2025) the expert mesh
    etp x ep x edp is laid over the same tp x cp x dp ranks of a stage independently of the dense mesh: ep x etp
    need only divide tp x cp x dp (Qwen3-235B ran EP32 over 16 data-parallel ranks x TP2)."""
    fp8: str = decision("none", "the low-precision recipe of the decoder's linear GEMMs (none = the workload's "
                        "dtype)",
                        choices=("none", "tensorwise", "delayed", "blockwise", "mxfp8", "nvfp4"), searched=True,
                        by_stack=True,
                        stack_values={"megatron": ("none", "tensorwise", "delayed", "blockwise", "mxfp8", "nvfp4"),
                                      "torchtitan": ("none", "tensorwise", "mxfp8"), "eager": ("none",)})
    """"tensorwise" is Transformer Engine's current scaling, "delayed" TE DelayedScaling (amax history),
    "blockwise" DeepSeek-V3 §3.3.2 (1x128 activation tiles, 128x128 weight blocks; on Blackwell TE emulates it with
    MXFP8), "mxfp8" OCP MX (E4M3 with an E8M0 scale per 32 elements, rowwise and columnwise copies quantized apart;
    Blackwell tensor cores only), "nvfp4" TE's NVFP4BlockScaling (E2M1 with an E4M3 scale per 16 elements and an
    FP32 tensor scale; 16x16 weight blocks, random Hadamard transforms on the wgrad operands, stochastic rounding of
    gradients; fprop, dgrad and wgrad all in NVFP4; Blackwell only). torchtitan's float8 converters scale
    tensor-wise or MX-block-wise; HF code trains without fp8. A free search tries them only for a low-precision
    workload (``space.fp8_recipe_choices``): ``--dtype fp8`` the fp8 recipes, ``--dtype nvfp4`` NVFP4; a pin of
    another dtype's recipe is refused by name (``space.check_fp8_pin``)."""
    cp_kind: str = decision("ring", "context-parallel attention: ring, allgather or a2a (Ulysses)",
                            choices=("ring", "allgather", "a2a"), searched=True,
                            stack_values={"megatron": ("ring", "allgather", "a2a"),
                                          "torchtitan": ("ring", "allgather"), "eager": ("ring", "allgather")})
    """"ring": p2p KV exchange overlapped with the attention blocks (Megatron-Core/TE ``p2p``); "allgather": KV
    all-gathered before attention (Llama 3 paper §3.3.2; torch ``context_parallel``'s allgather rotation); "a2a":
    DeepSpeed-Ulysses all-to-all over heads. torchtitan and HF code have no Ulysses. Under Megatron-Core a model with
    sliding-window layers (Gemma) takes allgather or a2a, one with attention sinks (GPT-OSS) a2a: what Transformer
    Engine's context parallelism runs them under (``space.check_cp_kind``)."""
    stack: str = decision("megatron", "the training code, whose kernels run: megatron, torchtitan or eager",
                          choices=("megatron", "torchtitan", "eager"), searched=True, by_stack=True)
    """"megatron": Transformer Engine's fused kernels (norms, SwiGLU, cuDNN attention, vocab-parallel
    cross-entropy; Megatron-Core, NeMo, AutoModel's TE backend); "torchtitan": torch.compile per block, SDPA
    attention, PyTorch cross-entropy; "eager": HF / plain PyTorch code, one kernel per op. It is the user's code,
    which the export target names, so a free search keeps Megatron-Core's."""
    moe_overlap: bool = decision(False, "expert all-to-alls overlapped with computation", searched=True, by_stack=True,
                                 stack_values={"megatron": (False, True), "torchtitan": (False,), "eager": (False,)})
    """MegaScale-MoE §4, Comet; DeepSeek-V3 DualPipe's forward/backward chunk pairing. Tried where ep > 1. Under
    Megatron-Core (``overlap_moe_expert_parallel_comm``) only as its ``TransformerConfig`` accepts it: no full
    recomputation, an interleaved pipeline where pp > 1, at most one MTP module and then pp > 1
    (``layout.megatron_moe_overlap_refusal``); a free search tries it only there. torchtitan and HF code have no
    such overlap (their exports say so): a free search leaves it off under them."""
    moe_capacity: float = decision(0.0, "token-dropping capacity factor (0 = dropless routing)", lo=0.0, hi=64.0)
    """Each expert takes at most capacity x its balanced share, padded to it."""
    moe_imbalance: float = decision(1.0, "dropless routing: the busiest expert group's tokens over the balanced share",
                                    lo=1.0, hi=64.0)
    """1.0 = perfectly balanced, as the dev set's "fake balanced gate" runs."""
    moe_router: str = decision("learned", "which experts a token's copies go to: learned or contiguous",
                               choices=("learned", "contiguous"))
    """"learned": a trained router's choices, spread over the experts as uniform random picks are (group-limited
    where the model routes by groups; Megatron-Core's ``moe_router_force_load_balancing`` draws random logits, the
    same spread). "contiguous": NeMo AutoModel's ``FakeBalancedGate`` (``components/moe/layers.py`` @ 89e3a9fdd),
    which sends token ``t`` to experts ``t*topk .. t*topk + topk - 1`` (mod the experts; its noise 0): its copies
    sit on adjacent experts, so on ``ceil(topk / experts a rank)`` ranks or one more, and a dispatcher that sends a
    token once per destination rank or node (deepep, hybridep) moves far fewer bytes
    (``planner.model.routing.contiguous_spread``)."""
    moe_router_fusion: bool = decision(False, "the router's score function and top-k run as one fused kernel",
                                       by_stack=True)
    """Megatron-Core ``moe_router_fusion`` (its ``TransformerConfig`` default False, core_r0.16.0 to core_v0.19.0;
    ``--moe-router-fusion``): Transformer Engine's ``fused_topk_with_score_function`` over the ``[tokens, experts]``
    logits, priced as one memory pass over them (no measurement times it). Off, ``topk_routing_with_score_function``
    runs ``torch.softmax`` or ``torch.sigmoid`` and ``torch.topk``, priced at their time measured on an H100 and an
    H200 (``costmodel.router_topk``: about 7 ns a token at 128 experts, 14 at 256), as torchtitan's and eager
    routers run them too. Megatron-Bridge's performance scripts turn it on for DeepSeek-V3, GPT-OSS, Kimi-K2 and
    Qwen3 (from v0.2.0), not for the Nemotron models; a contiguous router (``moe_router``) scores nothing."""
    moe_aux_loss: str = decision("none", "the router's load-balancing loss: none, aux_loss, seq_aux_loss or "
                                 "global_aux_loss", choices=("none", "aux_loss", "seq_aux_loss", "global_aux_loss"),
                                 by_stack=True)
    """Megatron-Core's ``moe_router_load_balancing_type`` with a ``moe_aux_loss_coeff`` above 0 (``TransformerConfig``
    defaults "aux_loss" and 0.0: none is computed, core_r0.14.0 to core_v0.19.0). In training ``TopKRouter.routing``
    then scores the logits a second time, with the score function and top-k again (fused under
    ``moe_router_fusion``), and reduces them over the tokens: priced per MoE layer by ``costmodel.aux_loss``,
    ``moe_router_force_load_balancing`` or not. The three types cost the same passes (the sequence-level one over
    the same scores reshaped); the coefficient is the model's, not priced. Megatron-Bridge's model bridges set it
    (Qwen3-MoE aux_loss 1e-3; DeepSeek-V3, Kimi-K2 and Nemotron seq_aux_loss; GPT-OSS none), which its profiles
    carry per model; a contiguous router (``moe_router``) computes none."""
    moe_dispatcher: str = decision("alltoall", "how routed tokens travel: alltoall (NCCL), deepep or hybridep",
                                   choices=("alltoall", "deepep", "hybridep"),
                                   free="hybridep on Blackwell and deepep on other NVIDIA GPUs where ep > 1 under "
                                        "Megatron-Core (not deepep with token dropping), else alltoall "
                                        "(``space.free_dispatcher``)")
    """"alltoall": one copy per routed expert (Megatron's alltoall dispatcher); "deepep": one copy per destination
    node over the NICs, forwarded to its experts over NVLink (Megatron ``--moe-token-dispatcher-type flex
    --moe-enable-deepep``); "hybridep": NVIDIA's Hybrid-EP (DeepEP ``hybrid-ep`` branch), the same copies as deepep
    (once per destination node or NVLink domain, once per destination rank inside it, no second permute) over TMA
    NVLink kernels, priced at their published bandwidth (``costmodel.hybridep``; Megatron-Core
    ``--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep``). Megatron-Core's DeepEP backend does
    not pad experts to capacity, so it takes no token dropping (``layout.megatron_dispatch_refusal``)."""
    hybridep_sms: int = decision(16, "SMs Hybrid-EP's dispatch and combine kernels run on (moe_dispatcher=hybridep)",
                                 lo=1, by_stack=True)
    """Megatron-Core ``moe_hybridep_num_sms``: 16 in ``TransformerConfig`` of core_r0.16.0 and core_v0.17.0.
    Megatron-Bridge's performance scripts set 32 where a model's backend is Hybrid-EP before their common overrides
    run (v0.2.0 ``utils/helpers.py``, v0.3.0 on ``utils/overrides.py`` ``_set_common_perf_overrides``): every
    published Hybrid-EP run but Nemotron 3 Nano's (the ``megatron-bridge-perf`` profiles). More SMs move tokens
    faster, at the published bandwidth of that SM count (``costmodel.hybridep``), and leave fewer to the compute an
    overlapped all-to-all runs beside (``planner.estimate.gpu.ep_sm_share``). No effect under another dispatcher."""
    tp_overlap: bool = decision(False, "tensor-parallel collectives overlapped with their GEMMs (needs sp)")
    """Megatron-Core ``--tp-comm-overlap`` (Transformer Engine userbuffers), torchtitan's async TP: the all-gather
    before a column-parallel GEMM and the reduce-scatter after a row-parallel one run in chunks under it; backward,
    as TE's default methods run them, the row-parallel input gradient in chunks and the column-parallel gradients
    whole beside their collectives (``planner.estimate.gpu.userbuffers_gemm_s``)."""
    optim_dtype: str = decision("fp32", "Adam's states beside the 16-bit weights: fp32, remainder or bf16",
                                choices=("fp32", "remainder", "bf16"))
    """"fp32": fp32 master weights and moments, 12 B (ZeRO paper's K = 12; Megatron's distributed optimizer,
    DeepSpeed, FSDP); "remainder": fp32 moments and the 16 low bits of each fp32 master weight, 10 B (apex
    ``DistributedFusedAdam(store_param_remainders=True)``, NeMo's choice for bf16 O2 models; Megatron-Core's
    precision-aware optimizer on Transformer Engine >= 2.1); "bf16": bf16 moments, the bf16 weights their own
    master, 4 B (NeMo's ``optim.dtype: bf16``). It trades numerics, not speed: a free search keeps fp32."""
    grad_dtype: str = decision(
        "", "the gradients' buffer: bf16 or fp32", choices=("bf16", "fp32"),
        stack_own="Megatron-Core keeps fp32 main-grad buffers for bf16/fp8 runs outside FSDP; else 2 B "
                  "(``planner.estimate.memory.grad_bytes_per_param``)")
    """Also the dtype they are reduced in unless ``reduce_dtype`` or the stack sets another. Megatron-LM
    ``arguments.py``: "bfloat16 requires gradient accumulation and all-reduce to be done in fp32" unless
    ``--grad-reduce-in-bf16``; PyTorch DDP/FSDP2 keep fp32 weights and gradients and fp32 moments (16 B in all)."""
    pp_runs: int = decision(1, "pipeline schedule runs per optimizer step", lo=1)
    """1 = Megatron-Core and torchtitan: one schedule over all of a step's micro-batches. AutoModel accumulates
    gradients over ``global / (local_batch_size * dp)`` runs of its schedule (``recipes/llm/benchmark.py``), each
    filling and draining the pipeline again."""
    pp_overlap: Optional[bool] = decision(
        None, "pipeline sends and receives overlapped with the next chunk's compute", kind="tristate",
        stack_own="Megatron-LM overlaps them in the interleaved schedule; other stacks wait in line "
                  "(``layout.p2p_overlapped``)")
    """Megatron-Core ``overlap_p2p_comm``: isend/irecv posted before a chunk's compute and waited for after it
    (``pipeline_parallel/schedules.py``); ``--no-overlap-p2p-communication`` is the opt-out. NeMo's confs set it per
    model (default False). ``local:N`` plans keep the sends in line: gloo's transfers run on the compute's cores."""
    shared_overlap: bool = decision(False, "MoE shared experts run on a side stream during the token dispatch")
    """Megatron-Core ``--moe-shared-expert-overlap`` (default off, alltoall dispatcher only); NeMo AutoModel always
    (``components/moe/layers.py``: "Execute shared experts in a separate stream to overlap compute with the
    communication for grouped experts"). Priced in the forward and its recompute; the backward stays in line."""
    moe_fused_mlp: bool = decision(False, "routed experts' activation and quantize fused into their grouped GEMMs "
                                          "(MXFP8 on Blackwell)")
    """Megatron-Core's fused grouped MLP (``use_transformer_engine_op_fuser`` with ``moe_mlp_glu_interleave_size``
    32 and ``NVTE_CUTEDSL_FUSED_GROUPED_MLP=1``; Megatron-Bridge's performance presets ``cutedsl_fused_grouped_mlp``):
    Transformer Engine's op fuser runs cuDNN frontend's CuTe DSL grouped GEMM, which takes fc1's gated activation,
    the router-probability scale and fc2's MXFP8 input quantize into its epilogue, and in the backward fc2's dgrad
    with the activation's gradient and its quantize; fc2's bias goes into its GEMM. Priced as the grouped GEMMs
    alone (``costmodel.blackwell_grouped``: the fused kernel measured at the GEMM's price); the op quantizes weights
    not held in MXFP8 (``fp8_params``) again on every micro-batch, which is priced too. Only where its kernels run
    as priced: Megatron-Core, the MXFP8 recipe, data-centre Blackwell, gated experts without expert tensor
    parallelism, no ``moe_act`` recomputation (``layout.fused_moe_mlp_refusal``,
    ``planner.estimate.gpu.check_fused_moe_mlp``). Not priced: the op fuser's 256-row padding per expert (32
    unfused) and its host time."""
    cudnn_frontend: str = decision("1.23", "the cuDNN frontend release line whose kernels the fused grouped MLP "
                                   "runs: 1.23, 1.24 or 1.25", choices=("1.23", "1.24", "1.25"), by_stack=True)
    """What a stack installs (Megatron-Bridge pins ``nvidia-cudnn-frontend`` in its ``pyproject.toml``). It prices
    the backward of ``moe_fused_mlp``: fc2's input gradient runs as cuDNN frontend's grouped GEMM + dGLU kernel,
    which for experts with biases (GPT-OSS) reduces fc1's bias gradient too, and releases 1.24.0 to 1.25.x compile
    that reduction into a path that spills to local memory (issue #256; PR #322 timed the kernel at 8.8x its fixed
    time: ``costmodel.cudnn_dglu``). "1.23" is the release cuDNN frontend's MoE benchmark that prices the fused
    kernels ran (``costmodel.blackwell_grouped``), and stands for the releases after the fix too. No effect without
    ``moe_fused_mlp``."""
    cuda_graphs: str = decision(
        "none", "what CUDA graphs capture: none, mixers (attention and Mamba alone), layers (attention, router, "
        "dispatch preprocessing) or iteration",
        choices=("none", "mixers", "layers", "iteration"),
        stack_values={"megatron": ("none",), "torchtitan": ("none",), "eager": ("none",)},
        free="layers on an MoE model under Megatron-Core on NVIDIA GPUs where Megatron-Core allows them, else none "
             "(``space.free_cuda_graphs``)")
    """"none": every op launched from Python. "layers": Transformer Engine's per-layer graphs of the attention and,
    in an MoE layer, the router and the dispatch preprocessing (Megatron-Core ``--cuda-graph-impl
    transformer_engine --cuda-graph-scope attn moe_router moe_preprocess``; ``attn mlp`` in a dense layer): the
    routed experts, the dispatch and the combine stay eager, because their token counts change every step.
    "mixers": per-layer graphs of the sequence mixers alone, the attention and the Mamba mixer (``--cuda-graph-scope
    attn mamba``, Megatron-Bridge's H100 presets of Nemotron 3 Nano and Nemotron-H): every MLP and MoE block eager, an
    MoE layer's router and preprocessing too, so its host wait is priced as under "none" (the guide's router-to-dispatch
    stretch beside the layer's other GPU work, an upper estimate where the attention's output projection is graphed),
    and Megatron-Core lets it recompute its MoE block (TransformerConfig refuses "moe" recomputation only with the
    router in a graph). "iteration": the whole forward and backward replayed as one graph (``--cuda-graph-impl local
    --cuda-graph-scope full_iteration``), which a dropless MoE layer can only take with Hybrid-EP's sync-free
    dispatch (Megatron-Core ``docs/user-guide/features/cuda_graph.md``): from core_v0.18.0 under
    ``moe_expert_rank_capacity_factor``, a static budget for the tokens a rank receives (Megatron-Bridge v0.5.0's
    performance recipes set 1.5 beside the graph), which the plan does not price. An MoE layer waits for its token
    counts on the host once per forward, before the dispatch, unless it drops and pads to capacity; after that wait the
    GPU runs only as fast as the host launches the eager ops, which ``planner.estimate.host_wait`` prices. Left
    free, an MoE plan on NVIDIA GPUs under Megatron-Core takes per-layer graphs (none under full recomputation:
    ``planner.layout.space.free_cuda_graphs``), any other plan none; the graphs' memory and capture time are not
    priced."""
    fsdp: str = decision("", "the ZeRO-3 implementation: torch (FSDP2) or megatron (Megatron-FSDP)",
                         choices=("torch", "megatron"),
                         stack_own="Megatron-FSDP under Megatron-Core, FSDP2 otherwise (``layout.fsdp_impl``)")
    """"torch": FSDP2 ``fully_shard`` copies every gathered parameter out of the all-gather buffer and every
    gradient into the reduce-scatter buffer on the compute stream (torch ``_fully_shard/_fsdp_collectives.py``:
    ``split_with_sizes_copy``, ``chunk_cat``); "megatron": persistent buffers the parameters and gradients are
    views of, so no copy runs."""
    reduce_dtype: str = decision(
        "", "the dtype gradients are reduced in on the data-parallel wire: bf16 or fp32", choices=("bf16", "fp32"),
        stack_own="fp32 under torchtitan (its only option), else the gradient buffer's (``layout.reduce_dtype_of``)")
    """FSDP2's ``MixedPrecisionPolicy(reduce_dtype=...)`` casts each bf16 gradient up into an fp32 reduce-scatter
    buffer and keeps the reduced shard in the parameter's dtype (``foreach_reduce``); DeepSpeed's
    ``communication_data_type``. Doubles the reduction's bytes; memory does not move."""
    fp8_params: bool = decision(False, "the decoder's linear weights held only in the low-precision recipe's "
                                "format, without a 16-bit copy", by_stack=True)
    """Megatron-Core ``DistributedDataParallelConfig.fp8_param_gather`` ("keep the compute param in fp8 (do not use
    any other intermediate dtype) and perform the param all-gather in fp8"; Transformer Engine's
    ``quantized_model_init``): the fp32 master weights stay in the optimizer and the model holds only the quantized
    copies the GEMMs read. Megatron-Bridge's fp8 configs set it (``bf16_with_fp8_current_scaling_mixed`` and
    ``bf16_with_mxfp8_mixed`` in ``training/mixed_precision.py``, r0.1.0 to v0.5.1). Priced in memory outside
    ZeRO-3: the 16-bit decoder weights are dropped beside their quantized copies (``memory.lowp_weight_bytes``);
    the ZeRO-3 shard and the parameter all-gather's bytes are priced as without it. No effect without a
    low-precision recipe."""
    bf16_first_layers: int = decision(0, "decoder layers at the model's start whose GEMMs stay in bf16 under the "
                                      "low-precision recipe", lo=0, by_stack=True)
    """Megatron-Core ``first_last_layers_bf16`` with ``num_layers_at_start_in_bf16`` (``fp8_utils.get_fp8_context``
    and ``fp4_utils.get_fp4_context``: a layer numbered below it runs outside the fp8 / fp4 autocast). Each such
    layer is priced as a bf16 layer: its GEMMs, attention, saved activations and weights, with no quantized copy
    (``planner.estimate.base.precision_parts``). Under fp8, at most the layers of one pipeline stage and none with
    delayed scaling, as Megatron-Core's ``TransformerConfig.__post_init__`` refuses them
    (``layout.check_bf16_layers``; NVFP4 alone is not checked there). No effect without a low-precision recipe.
    Megatron-Bridge's library preset for tensor-wise fp8 keeps 1 and 1 (``bf16_with_fp8_current_scaling_mixed``),
    its performance scripts none (``utils/precision.py``: "Disable BF16 Transformer layers in the performance
    config")."""
    bf16_last_layers: int = decision(0, "decoder layers at the model's end whose GEMMs stay in bf16 under the "
                                     "low-precision recipe", lo=0, by_stack=True)
    """Megatron-Core ``num_layers_at_end_in_bf16`` (with ``first_last_layers_bf16``): the last layers of the model, on
    the last pipeline stage. Megatron-Bridge's Nemotron 3 Super NVFP4 recipe keeps 14
    (``nemotron_3_super_bf16_with_nvfp4_mixed``, v0.4.0 to v0.5.1). As ``bf16_first_layers`` otherwise."""
    mtp: int = decision(0, "multi-token-prediction modules trained on the last stage (0 = none)", lo=0)
    """DeepSeek-V3 §2.2's MTP modules (HF ``num_nextn_predict_layers``, Megatron-Core ``mtp_num_layers``): each one
    more transformer block, its eh_proj and the shared output head and loss once more, held and run on the last
    pipeline stage (``planner.estimate.ops_graph.mtp_ops``). At most the model's config count (a hybrid's repeated
    module up to ``ModelSpec.MTP_REPEAT_MAX``); 0 on a model without MTP. A plan of the main model alone keeps 0:
    the modules are trained work, not a speed knob, so a free search never adds them."""
    linear_ce: bool = decision(False, "the output layer fused with its cross-entropy, block by block: the logits "
                               "never reach memory")
    """Cut Cross-Entropy (Wijmans et al., "Cut Your Losses in Large-Vocabulary Language Models", ICLR 2025,
    arXiv:2411.09009; NeMo AutoModel's ``FusedLinearCrossEntropy``, ``components/loss/linear_ce.py``, over the
    ``cut_cross_entropy`` package): the output layer's GEMM and the log-sum-exp over the vocabulary run in one kernel
    on vocabulary blocks in on-chip memory, so neither the logits nor their gradient are stored ("global memory
    consumption for the cross-entropy computation negligible": Gemma 2 2B's loss from 24 GB to 1 MB). Priced in
    memory: no logits held on the last stage, for the main head or an MTP module's. Its time is priced as the
    unfused head's, which the paper reports it keeps ("without sacrificing training speed"). Megatron-Core and
    torchtitan have no such loss (their exports say so); fixed only: a free search leaves it off."""
    offload_layers: int = decision(0, "decoder layers whose saved activations are copied to host memory in "
                                   "forward and back in backward (Megatron-Core cpu_offloading_num_layers)",
                                   fix="offload_layers", lo=0, searched=True, by_stack=True,
                                   free="0, or a quarter or half of the layers beside recompute=none where "
                                        "Megatron-Core offloads (pp 1) on a Grace host (``space.offload_choices``, "
                                        "``space.offload_priced``)")
    """Megatron-Core ``TransformerConfig.cpu_offloading`` with ``cpu_offloading_num_layers`` N, run by Transformer
    Engine's ``cpu_offload.get_cpu_offload_context``: the tensors layers 0..N-1 save for backward go to host memory
    on a side stream; layer i's copy must be done before layer L-N+i's forward, and its reload starts at layer
    L-1-N+i's backward (``OffloadSynchronizer._default_offload_sync_init``), so a stage holds L-N layers'
    activations at any moment. The copies run on the GPU's host link (``DeviceSpec.host_bw_bytes_per_s``); what
    they do not fit under the layers' compute is exposed. Megatron-Core refuses it with pipeline parallelism and
    with recomputation (``TransformerConfig.__post_init__``). A free search tries a quarter and a half of the
    layers beside recompute=none on a Grace host, whose NVLink-C2C and memory serve the superchip's GPUs alone:
    Megatron-Bridge's own Llama 3 70B presets offload 20 to 40 of its 80 layers on GB200 and GB300
    (``llama3_workload_base_configs.py``, v0.3.1 to v0.5.0). Behind PCIe the node's GPUs share the host's DRAM
    and switches, which the copies' price leaves out, so there it is pinned only (``space.offload_priced``). Host
    memory is not checked: the offloaded layers' activations must fit beside what the host already holds."""

    sequence_first: bool = decision(True, "the model code holds activations sequence-first, [s, b, h] (Megatron-Core), "
                                    "not batch-first", by_stack=True)
    """Megatron-Core's transformer and Mamba blocks run on ``[s, b, h]`` tensors (``TransformerBlock`` and
    ``MambaMixer`` in every core release to 0.19); NeMo AutoModel's, HF's and torchtitan's models run batch-first.
    It matters where a kernel wants the other order: Megatron-Core's Mamba mixer turns its in_proj output batch-first
    for ``mamba_split_conv1d_scan_combined`` and its output back, a copy each at a micro-batch above 1
    (``planner.estimate.ops_graph``, ``_mamba_block``). Meaningful under the megatron stack only (torchtitan's and
    eager code are batch-first); NeMo AutoModel's profile sets false (its NemotronV3 mixer calls the same kernel on
    its batch-first projections)."""
    moe_impl: str = decision("megatron", "whose MoE layer code runs under the megatron kernels: megatron "
                             "(Megatron-Core's MoELayer) or automodel (NeMo AutoModel's)",
                             choices=("megatron", "automodel"), by_stack=True)
    """"megatron": Megatron-Core's ``MoELayer`` (its token dispatchers, Transformer Engine's ``GroupedLinear`` experts:
    Megatron-Core, NeMo, Megatron-Bridge); "automodel": NeMo AutoModel's ``MoE`` with ``GroupedExpertsDeepEP``, which
    runs its routed experts as one ``grouped_gemm`` ``ops.gmm`` call per projection (``components/moe/layers.py`` @
    89e3a9fdd; its benchmark configs' ``experts: gmm``). What it changes: the host time an MoE layer waits for after
    its token-count sync was read off Megatron-Core's layer (``planner.estimate.host_wait``); AutoModel's is other
    Python, timed nowhere, and is not priced. NeMo AutoModel's profile sets automodel; meaningful under the megatron
    stack only."""


def _registry() -> Mapping[str, Decision]:
    out = {}
    for f in fields(Decisions):
        info = dict(f.metadata["decision"])
        info["fix_key"] = info["fix_key"] or f.name
        if info["plan_field"] is None:
            info["plan_field"] = f.name
        out[f.name] = Decision(name=f.name, **info)
    return MappingProxyType(out)


DECISIONS: Mapping[str, Decision] = _registry()
"""Every decision by its ``Layout`` field name, in declaration order."""
BY_FIX_KEY: Mapping[str, Decision] = MappingProxyType({d.fix_key: d for d in DECISIONS.values()})
"""The same, by ``--fix`` key."""


def choices_of(name: str) -> tuple:
    """The choices of decision ``name`` (e.g. ``choices_of("fp8")``)."""
    return DECISIONS[name].choices


def stack_can() -> dict[str, dict[str, tuple]]:
    """``{stack: {decision: values a free search tries}}`` for the decisions whose values depend on the stack."""
    out: dict[str, dict[str, tuple]] = {}
    for d in DECISIONS.values():
        for stack, values in d.stack_values.items():
            out.setdefault(stack, {})[d.name] = values
    return out


def free_defaults(pins) -> dict[str, object]:
    """The decisions a free search does not enumerate, at their pinned value or their default (``pins``: a
    ``space.Pins``)."""
    return {d.name: pins.get(d.fix_key, d.default) for d in DECISIONS.values() if not d.searched}
