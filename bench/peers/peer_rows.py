"""Dev-set rows as the peer adapters read them: every field a row leaves null resolved once, with its source.

Imports nothing outside the standard library, so the row -> peer-input mappings are testable without meshplan's
dependencies and without the peers installed (tests/test_peers_mapping.py).

What a row of ``dev_runs.jsonl`` leaves unsaid, and what is assumed here (bench/peers/README.md lists it all):
* ``n_gpus`` (torchtitan rows): ``tp*pp*dp*cp``, the published layout's world size.
* ``dtype`` (torchtitan rows): bf16. The rows come from tables whose Float8 variants were not taken into the dev set
  (torchtitan docs/performance.md @ 4d88a8a; benchmarks/llama3_h100_202412_torchtitan.md Tables 1 and 3: "FSDP",
  "FSDP + torch.compile" are bf16, "+ Float8" rows are separate and absent).
* NeMo 24.07 rows (``S1``/``S1f``): NVIDIA/NeMo-Framework-Launcher @ tag 24.07,
  launcher_scripts/conf/training/<model>.yaml: ``sequence_parallel: true`` exactly where TP > 1, optimizer
  ``distributed_fused_adam`` (ZeRO-1 distributed optimizer) with ``overlap_grad_sync``/``overlap_param_sync``,
  ``activations_checkpoint_granularity: null`` except nemotron_340b (``selective``), ``ub_tp_comm_overlap`` as in
  ``NEMO_LAUNCHER`` below. The SFT rows borrow their model's pre-training conf, and their VP from the same tag's SFT
  launch scripts (``NEMO_SFT_VP``).
* FSDP2 rows (``S5``, ``T``): the row's ``layout_assumptions`` (zero 3, the EP size, full recompute) fill its nulls.
"""
from __future__ import annotations

import importlib
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

# NeMo-Framework-Launcher @ 24.07 (git tag), launcher_scripts/conf/training/<conf>.yaml, read 2026-11-23:
# table model name -> (conf, activations_checkpoint_granularity, ub_tp_comm_overlap).
NEMO_LAUNCHER: dict[str, tuple[str, str, bool]] = {
    "GPT3-5B": ("gpt3/5b", "none", False),
    "GPT3-20B": ("gpt3/20b", "none", True),
    "GPT3-175B": ("gpt3/175b", "none", False),
    "LLAMA2-7B": ("llama/llama2_7b", "none", False),
    "LLAMA2-13B": ("llama/llama2_13b", "none", False),
    "LLAMA2-70B": ("llama/llama2_70b", "none", True),
    "LLAMA3-8B": ("llama/llama3_8b", "none", False),
    "LLAMA3-70B": ("llama/llama3_70b", "none", True),
    "Nemotron-8B": ("nemotron/nemotron_8b", "none", True),
    "Nemotron-22B": ("nemotron/nemotron_22b", "none", True),
    "Nemotron-340B": ("nemotron/nemotron_340b", "selective", False),
}
# The same tag's SFT launch scripts, examples/peft/llama/h100/{13b_1node,70b_2node}.sh, whose TP/PP/GBS/MBS are the
# SFT rows' layouts: virtual_pipeline_model_parallel_size, which the SFT table leaves out ("VP?").
NEMO_SFT_VP = {"LLAMA2-13B": (10, "13b_1node.sh"), "LLAMA2-70B": (20, "70b_2node.sh")}
MEGATRON_SOURCES = ("S1", "S1f")  # Megatron-Core + Transformer Engine (NeMo 24.07)


@dataclass
class Row:
    """One dev-set run with every field the adapters need resolved (see the module docstring)."""

    name: str
    source_id: str
    model: str
    stack: str  # "megatron" (NeMo / Megatron-Core) or "fsdp2" (NeMo AutoModel, torchtitan)
    gpu: str  # "H100" or "A100"
    gpus_per_node: int
    n_gpus: int
    tp: int
    pp: int
    dp: int
    cp: int
    ep: int
    vp: int
    mbs: int
    gbs: int
    seq: int
    dtype: str  # "bf16" or "fp8"
    zero: int  # 1 = distributed optimizer (ZeRO-1), 3 = FSDP2 full sharding
    recompute: str  # "none", "selective" (Megatron: core attention; torchtitan: op-level SAC) or "full"
    sp: bool
    tp_comm_overlap: bool
    layers: int | None
    hidden: int | None
    heads: int | None
    kv_heads: int | None
    head_dim: int | None
    ffn: int | None
    vocab: int | None
    gated_mlp: bool | None
    num_experts: int | None = None
    top_k: int | None = None
    moe_ffn: int | None = None
    shared_experts: int = 0
    first_dense_layers: int = 0
    mla: dict | None = None  # q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim
    published_step_s: float = 0.0
    out_of_scope: str | None = None  # the dev set's own "meshplan_can_express: no: ..." reason
    assumed: list[str] = field(default_factory=list)  # what was filled in, one line each

    @property
    def moe(self) -> bool:
        return bool(self.num_experts and self.num_experts > 1)

    @property
    def microbatches(self) -> int:
        """Micro-batches per step on one pipeline: gbs / (dp * mbs) (CP ranks share a micro-batch)."""
        return self.gbs // (self.dp * self.mbs)

    @property
    def source(self) -> str:
        return self.source_id


def load_jsonl(path: Path) -> list[dict]:
    """The raw rows of a dev_runs.jsonl; one line names the file and line that does not parse."""
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise SystemExit(f"{path}:{n}: not JSON ({exc.msg})") from None
    return rows


def published_step_s(raw: dict, n_gpus: int) -> float:
    """The README's convention: the published s/step, else gbs*seq/(tokens_per_s_per_gpu*n_gpus)."""
    if raw.get("step_time_s_published_or_derived"):
        return float(raw["step_time_s_published_or_derived"])
    pub = raw["published"]
    if pub.get("step_time_s"):
        return float(pub["step_time_s"])
    return raw["gbs"] * raw["seq"] / (float(pub["tokens_per_s_per_gpu"]) * n_gpus)


def _hf_config(raw: dict, runs_dir: Path) -> dict:
    rel = raw.get("config")
    if not rel:
        return {}
    p = (runs_dir / rel).resolve()
    return json.loads(p.read_text(encoding="utf-8")) if p.exists() else {}


def _zero(raw: dict) -> int | None:
    z = raw.get("layout_assumptions", {}).get("zero", raw.get("zero"))
    if isinstance(z, int):
        return z
    if isinstance(z, str) and "ZeRO-3" in z:
        return 3
    return None


def _recompute(raw: dict) -> str | None:
    r = raw.get("layout_assumptions", {}).get("recompute", raw.get("recompute"))
    if r is None:
        return None
    r = str(r).lower()
    for kind in ("full", "selective", "none"):
        if r.startswith(kind):
            return kind
    raise SystemExit(f"{raw['name']}: recompute {raw.get('recompute')!r} is neither full, selective nor none")


def _nemo_key(model: str) -> str | None:
    head = model.split(" ")[0]
    return head if head in NEMO_LAUNCHER else None


def resolve(raw: dict, runs_dir: Path) -> Row:
    """A raw dev-set row -> Row, with ``assumed`` listing each filled-in field and its source."""
    assumed: list[str] = []
    la = raw.get("layout_assumptions", {}) or {}
    tp, pp, cp = raw["tp"], raw["pp"], raw["cp"]
    n_gpus = raw.get("n_gpus") or tp * pp * raw["dp"] * cp
    if not raw.get("n_gpus"):
        assumed.append(f"n_gpus = tp*pp*dp*cp = {n_gpus}")
    dp = raw["dp"]
    stack = "megatron" if raw["source_id"] in MEGATRON_SOURCES else "fsdp2"
    dtype = raw.get("dtype")
    if dtype is None:
        dtype = "bf16"
        assumed.append("dtype bf16 (torchtitan: the Float8 rows of the same tables are not in the dev set)")
    zero = _zero(raw)
    if zero is None:
        zero = 1 if stack == "megatron" else 3
        assumed.append("ZeRO-1: NeMo launcher optimizer distributed_fused_adam" if stack == "megatron"
                       else "ZeRO-3: FSDP2")
    recompute = _recompute(raw)
    key = _nemo_key(raw["model"]) if stack == "megatron" else None
    if recompute is None:
        recompute = NEMO_LAUNCHER[key][1] if key else "none"
        assumed.append(f"recompute {recompute}" + (f" (NeMo launcher 24.07 {NEMO_LAUNCHER[key][0]})" if key else ""))
    ep = raw.get("ep") or la.get("ep") or 1
    if raw.get("ep") is None and la.get("ep"):
        assumed.append(f"ep {ep} (layout_assumptions)")
    sp = raw.get("sp")
    if sp is None:
        sp = tp > 1
        assumed.append(f"sequence parallel {'on' if sp else 'off'} (on exactly where TP > 1, the NeMo launcher's rule)")
    tp_overlap = bool(key and NEMO_LAUNCHER[key][2] and tp > 1)
    if tp_overlap:
        assumed.append(f"TP comm overlap on (NeMo launcher 24.07 {NEMO_LAUNCHER[key][0]}: ub_tp_comm_overlap)")
    vp = raw.get("pp_interleave") or 1
    if raw["source_id"] == "S1f" and raw.get("pp_interleave") is None and key in NEMO_SFT_VP:
        vp, script = NEMO_SFT_VP[key]
        assumed.append(f"VP {vp} (NeMo launcher 24.07 examples/peft/llama/h100/{script})")
    hf = _hf_config(raw, runs_dir)
    if "approx" in (raw.get("config") or ""):
        assumed.append(f"architecture from the dev set's approximate config {raw['config']}")
    heads = raw.get("heads")
    hidden = raw.get("hidden")
    head_dim = hf.get("head_dim") or (hidden // heads if hidden and heads else None)
    vocab = raw.get("vocab") or hf.get("vocab_size")
    if raw.get("vocab") is None and vocab:
        assumed.append(f"vocab {vocab} (HF config {raw.get('config')})")
    mla = None
    if hf.get("kv_lora_rank"):
        mla = {k: hf[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                                  "v_head_dim")}
    can = str(raw.get("meshplan_can_express", "yes"))
    gpu = "A100" if "A100" in raw.get("gpu", "") else "H100"
    return Row(
        name=raw["name"], source_id=raw["source_id"], model=raw["model"], stack=stack, gpu=gpu,
        gpus_per_node=raw.get("gpus_per_node") or 8, n_gpus=n_gpus, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep,
        vp=vp, mbs=raw["mbs"], gbs=raw["gbs"], seq=raw["seq"], dtype=dtype,
        zero=zero, recompute=recompute, sp=bool(sp), tp_comm_overlap=tp_overlap, layers=raw.get("layers"),
        hidden=hidden, heads=heads, kv_heads=raw.get("kv_heads") or heads, head_dim=head_dim, ffn=raw.get("ffn"),
        vocab=vocab, gated_mlp=raw.get("gated_mlp"), num_experts=raw.get("num_experts"), top_k=raw.get("top_k"),
        moe_ffn=raw.get("moe_ffn"), shared_experts=raw.get("shared_experts") or 0,
        first_dense_layers=raw.get("first_dense_layers") or 0, mla=mla,
        published_step_s=published_step_s(raw, n_gpus),
        out_of_scope=can if can.startswith("no") else None, assumed=assumed)


def load_rows(dev_set: Path) -> list[Row]:
    """Every row of ``dev_set`` (a dev_runs.jsonl; its configs/ are resolved beside it)."""
    return [resolve(raw, dev_set.parent) for raw in load_jsonl(dev_set)]


class NotExpressible(Exception):
    """The peer has no input for something this row needs; the message says what."""


@dataclass
class Prediction:
    """One peer's answer for one row. ``status``: ok, approx (priced with the listed approximations),
    not_expressible, refused (the peer's own check says the run cannot fit; not counted as priced, as a refusal is
    not counted for meshplan) or error (the peer raised; ``reason`` is its message)."""

    name: str
    source_id: str
    peer: str
    published_step_s: float
    predicted_step_s: float | None = None
    status: str = "ok"
    reason: str = ""
    time_if_not_refused_s: float | None = None  # status "refused": the time the peer computed before refusing
    approximations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # the peer's own warnings worth knowing (OOM, missed shapes)
    system_file: str = ""

    @property
    def signed_error(self) -> float | None:
        if self.predicted_step_s is None:
            return None
        return (self.predicted_step_s - self.published_step_s) / self.published_step_s


def map_row(row: Row, peer: str, *builders) -> tuple[Prediction, list[dict] | None]:
    """A Prediction for ``row`` and the peer's inputs from ``builders`` (each row -> (dict, approximations));
    inputs None and status not_expressible when a builder refuses."""
    pred = Prediction(row.name, row.source_id, peer, row.published_step_s)
    try:
        built = [build(row) for build in builders]
    except NotExpressible as exc:
        pred.status, pred.reason = "not_expressible", str(exc)
        return pred, None
    pred.approximations = [a for _, approx in built for a in approx]
    return pred, [doc for doc, _ in built]


def summarize(preds: list[Prediction]) -> list[dict]:
    """Per source, then all sources pooled ("all"): rows priced, mean |error|, worst (largest |error|, signed),
    median signed error. Only priced rows count; refusals and inexpressible rows are counted, not scored."""
    out = []
    for src in [*sorted({p.source_id for p in preds}), "all"]:
        mine = [p for p in preds if src in (p.source_id, "all")]
        errs = sorted(p.signed_error for p in mine if p.signed_error is not None)
        out.append({
            "source_id": src, "rows": len(mine), "priced": len(errs),
            "not_expressible": sum(p.status == "not_expressible" for p in mine),
            "refused": sum(p.status == "refused" for p in mine),
            "errors": sum(p.status == "error" for p in mine),
            "mean_abs_error": sum(abs(e) for e in errs) / len(errs) if errs else None,
            "worst_error": max(errs, key=abs) if errs else None,
            "median_signed_error": _median(errs) if errs else None,
        })
    return out


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def ceil_to(x: int, multiple: int) -> int:
    return int(math.ceil(x / multiple) * multiple)


def from_checkout(checkout: Path, marker: str, *modules: str) -> list:
    """Import ``modules`` from a peer's checkout (put first on sys.path); one line if ``marker`` is not in it."""
    if not (checkout / marker).exists():
        raise SystemExit(f"{checkout}: not a checkout of this peer (no {marker})")
    root = str(checkout.resolve())
    if root not in sys.path:
        sys.path.insert(0, root)
    return [importlib.import_module(m) for m in modules]
