"""``Pricer``: what prices one operator or collective. ``Pricer.predict(op, device)`` is the one pricing entry.

A pricer holds a cost model (a loaded ``costmodel.learned.LearnedModel``, or none: the calibrated roofline of
``costmodel.roofline``) and its own memo of prices. Nothing is process-wide: the planner is handed a pricer
(``Pricer.shipped()``, ``Pricer.from_dir(DIR)`` for ``meshplan plan --costmodel DIR``, ``Pricer.roofline()``) and
two pricers in one process never see each other's model or prices.

The learned model predicts a ratio over the ideal roofline and is clipped so it never predicts below it; ops
outside its trained range are priced by the calibrated roofline (``predict_with_source`` says which was used).
On a GPU the model never trained on (an unseen class signature), a learned price clipped to the roofline bound or
above 3x it has its own source string (``learned (unseen device, ...)``) and is collected in ``Pricer.warnings``
(one line per device, op class and reason, with a count) for the planner or CLI to report; library code prints
nothing.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from meshplan.costmodel import (
    aux_loss,
    blackwell_grouped,
    flash2_blackwell,
    fp4_gemm,
    gdn,
    norms,
    router_topk,
    streaming,
    te_gemm,
)
from meshplan.costmodel.attention import (
    LOWP_ATTENTION_DTYPES,
    SDPA_WORDS,
    blackwell_source,
    curve_source,
    fused_attention_s,
    sdpa_backend,
)
from meshplan.costmodel.collectives import Link, collective_time_s
from meshplan.costmodel.devices import DeviceSpec, catalogue
from meshplan.costmodel.fp8_recipes import recipe_time_multiple, recipe_words
from meshplan.costmodel.grouped import SOURCE as GROUPED_SOURCE
from meshplan.costmodel.grouped import grouped_efficiency
from meshplan.costmodel.learned import SOURCE_CALIBRATED, SOURCE_UNSEEN_CLIPPED
from meshplan.costmodel.ops import ANALYTIC_KINDS, OpSpec
from meshplan.costmodel.roofline import roofline_predict
from meshplan.costmodel.sustained import TENSOR_CORE_KINDS, sustained_share
from meshplan.costmodel.xla_gemm import PARTS as XLA_SCALED
from meshplan.costmodel.xla_gemm import gemm_scale

if TYPE_CHECKING:  # xgboost is imported only when a learned model is loaded (CLI start-up stays fast)
    from meshplan.costmodel.collective_model import CollectiveModel
    from meshplan.costmodel.learned import LearnedModel

# How a Mamba-2 SSD scan is priced: no op-level dataset measures it, so the roofline over the FLOPs of the paper's
# chunked algorithm and the bytes of mamba_ssm's kernels (costmodel.ops.ssd_flops / ssd_bytes), at the fractions
# of peak and bandwidth its chunk-scan kernel reached on H800 (costmodel.roofline, "ssd")
SSD_SOURCE = ("roofline over the SSD FLOPs of Dao & Gu 2024 (arXiv:2405.21060 §6) and the HBM bytes of mamba_ssm's "
              "five forward and fourteen backward kernels, with what each head reads again of its group's tensors "
              "past L2, at 13.5% of peak and 41% of HBM bandwidth: what its chunk-scan kernel reached on H800 "
              "(tile-ai/tilelang benchmark/mamba2); mamba_ssm's whole forward timed on H200 (TileOPs PR 1557) and "
              "B200 (flashinfer PR 2709) runs 0.74-1.30x this price (bench/ssd_vs_costmodel.py); no backward "
              "timing is published")


def _analytic_s(op: OpSpec, device: DeviceSpec) -> tuple[float, str]:
    """(seconds, source) of an op of ``ANALYTIC_KINDS``: the router's eager top-k from its measurements
    (``costmodel.router_topk``), its load-balancing loss from the same and its bytes (``costmodel.aux_loss``), Gated
    DeltaNet's scan from FLA's timings (``costmodel.gdn``), the Mamba-2 scan by the calibrated roofline
    (``SSD_SOURCE``)."""
    if op.kind == "gdn":
        return gdn.time_s(op, device), gdn.SOURCE
    if op.kind == "topk":
        return router_topk.time_s(op, device), router_topk.source(device)
    if op.kind == "auxloss":
        return aux_loss.time_s(op, device), aux_loss.source(op, device)
    return roofline_predict(op, device), SSD_SOURCE


MEMO_MAX = 200_000  # distinct (op, device) prices a pricer keeps before starting its memo afresh
GEMM_SCALED = (*XLA_SCALED, te_gemm.PART)  # the parts whose dense GEMM prices carry a measured scale
DIE_CAPPED = ("GB200", "GB300")  # the B200's die (and the GB300, priced from it): GEMMs floored at the die speed

# fp8 GEMMs, priced from their bf16 twin: no fp8 kernel measurements reach the learned model, and an fp8 GEMM is not
# simply twice as fast. Its main loop (the K reduction) runs at twice the bf16 rate, but each output tile's fixed
# work (pipeline fill, the bf16/fp32 epilogue writing C, per-K-block scale promotion) does not shrink, so
#     t_fp8(m, n, k) = t_bf16(m, n, k) * (1/2 + FP8_FIXED_K / k).
# FP8_FIXED_K from DeepGEMM's measured fp8 GEMMs on H800-SXM at M=4096 (deepseek-ai/DeepGEMM PR #73: 748, 1166,
# 1204, 1470 TFLOP/s at K = 512, 1536, 2048, 16384) over the bf16 prices of the same shapes (592, 707, 684, 740):
# the fixed part solves to 148, 163, 139 K-elements at K <= 2048 (and is lost in the noise at 16384), 150 taken.
# DeepGEMM is the block-wise recipe of DeepSeek-V3 §3.3 (scales promoted every 128 K-elements in the main loop) and
# reaches the rates tensor-wise scaling is priced at on large K. The kernels the stacks call differ by recipe
# (cuBLASLt's block-scaled GEMM runs at 0.84 of its tensor-wise one on an H200): ``costmodel.fp8_recipes``.
FP8_FIXED_K = 150.0


# NVFP4 GEMMs take the same rule with the main loop at the measured multiple of the device's bf16 / nvfp4 peak
# ratio (1/4 on B200 and GB200, 1/6 on GB300): t_bf16 * (multiple * bf16 / nvfp4 peak + FP8_FIXED_K / k). The
# multiple (1.30) is the median of five published B200 fp4 GEMMs at M >= 4096, and on Blackwell Ultra (1.61) of
# Transformer Engine's B300 benchmark (``costmodel.fp4_gemm``); the fixed per-tile part is DeepGEMM's fp8 one, kept
# because the epilogue and the per-block scale handling do not shrink.
LOWP_GEMM_DTYPES = ("fp8", "nvfp4")


def fp8_time_share(op: OpSpec, device: DeviceSpec | None = None) -> float:
    """``t_lowp / t_bf16`` of an fp8 or nvfp4 GEMM (forward: its K; backward: the mean over dgrad's K = n and
    wgrad's K = m). fp8's main loop runs at half the bf16 time; nvfp4's at the measured multiple of ``device``'s
    bf16 / nvfp4 peak ratio (``costmodel.fp4_gemm``)."""
    if op.kind == "matmul":
        m, n, k = op.shape
    else:
        _, m, n, k = op.shape
    ks = (n, m) if op.backward else (k,)
    main = 0.5
    if op.dtype == "nvfp4" and device is not None:
        main = fp4_gemm.main_loop_multiple(FP8_FIXED_K, device.name) * device.peak("bf16") / device.peak("nvfp4")
    return sum(main + FP8_FIXED_K / max(1, kk) for kk in ks) / len(ks)


def _bf16_twin(op: OpSpec) -> OpSpec | None:
    """The same GEMM in bf16, when ``op`` is an fp8 or nvfp4 GEMM (priced from it), else ``None``."""
    if op.kind in ("matmul", "bmm") and op.dtype in LOWP_GEMM_DTYPES:
        return OpSpec(op.kind, op.shape, "bf16", backward=op.backward)
    return None


def _unmeasured_lowp_attention(op: OpSpec, device: DeviceSpec) -> bool:
    """An fp8 or MXFP8 attention op on a part with no such measurement (priced at its bf16 twin's rate)."""
    return op.kind == "attention" and op.dtype in LOWP_ATTENTION_DTYPES and blackwell_source(op, device) is None


def _dense_of(op: OpSpec) -> tuple[OpSpec, float]:
    """``(the dense GEMM a grouped one is priced from, its time multiple)`` (``costmodel.grouped``); a GEMM that is
    not grouped is its own, at 1."""
    if op.groups == 1:
        return op, 1.0
    m, n, k = op.shape
    dense = replace(op, shape=(op.groups * m, n, k), groups=1)
    return dense, 1.0 / grouped_efficiency(m, op.dtype, op.backward)


def _floor_replaces_clip(op: OpSpec, device: DeviceSpec, source: str) -> bool:
    """Whether a learned price clipped to the roofline bound on an unseen device is not the price: the streaming
    floor measured on that part (``costmodel.streaming``) lies above the bound and prices the op instead."""
    floor = streaming.floor_s(op, device) if source == SOURCE_UNSEEN_CLIPPED else None
    return floor is not None and floor > op.bytes / device.mem_bw_bytes_per_s


def shipped_model_dir() -> Path:
    """Folder of the default model shipped in the package (``costmodel/data/model``)."""
    return Path(str(resources.files("meshplan.costmodel").joinpath("data/model")))


class Pricer:
    """Prices operators with one cost model; memoises what it priced (per instance).

    Args:
        model: The learned model, or ``None`` for the calibrated roofline / alpha-beta alone.
        sustained: Price compute as a GPU sustains it through a training run: every tensor-core op's one-shot
            price divided by the device's measured sustained share (``costmodel.sustained``). Off, prices are what a
            kernel benchmark measures (``meshplan costmodel predict``, the held-out checks).
    """

    def __init__(self, model: "LearnedModel | None" = None, *, sustained: bool = False):
        self.model = model
        self.sustained = sustained
        self._shares: dict[DeviceSpec, float] = {}
        self._share_names: dict[str, float] = {}  # device name -> a sustained share taken instead (``with_shares``)
        self._memo: dict[tuple[OpSpec, DeviceSpec], tuple[float, str]] = {}
        # every compute op's final (seconds, source), whichever rule priced it: a search asks for the same few
        # thousand ops 10^5 times, and the grouped / fp8 rules each take a rebuilt OpSpec and a second lookup
        self._final: dict[tuple[OpSpec, DeviceSpec], tuple[float, str]] = {}
        self._flags: dict[tuple[str, str, str], int] = {}  # (device, op class, source) -> ops flagged
        self._gemm_scales: dict[str, tuple[float, str]] = {}  # device name -> costmodel.xla_gemm scale
        self._blackwell_fits: dict[str, float] = {}  # costmodel.blackwell_grouped's share and GB300 speed
        self._die_floors: dict[OpSpec, float] = {}  # a dense GEMM's B200 one-shot seconds over the die speed

    def _note(self, sources, ops: list[OpSpec], devices: list[DeviceSpec]) -> None:
        """Count the ops whose source flags an unseen-device price (``learned (unseen device, ...)``)."""
        for src, o, d in zip(sources, ops, devices):
            if str(src).startswith("learned (unseen device") and not _floor_replaces_clip(o, d, str(src)):
                key = (d.name, o.kind, str(src))
                self._flags[key] = self._flags.get(key, 0) + 1

    def under_load(self) -> "Pricer":
        """This pricer's model pricing compute under sustained load (``sustained=True``), sharing its learned prices
        and its warnings; itself when it already does."""
        if self.sustained:
            return self
        twin = Pricer(self.model, sustained=True)
        twin._memo, twin._flags = self._memo, self._flags
        return twin

    def with_shares(self, shares: Mapping[str, float]) -> "Pricer":
        """A twin of this pricer under sustained load that takes ``shares`` (device name -> sustained share) for the
        parts it names instead of their measured share (``costmodel.sustained``), sharing the learned prices and
        warnings: what a plan would take if a part sustained another share (``planner.estimate.sustained_band``)."""
        twin = Pricer(self.model, sustained=True)
        twin._memo, twin._flags = self._memo, self._flags
        twin._share_names = dict(shares)
        return twin

    def _load_factor(self, op: OpSpec, device: DeviceSpec, source: str = "") -> float:
        """1 / the device's sustained share for a tensor-core op when pricing under load, else 1. A price calibrated
        on a profiled run's own kernels (``costmodel fit``: source ``calibrated``) was timed at the cap already."""
        if not self.sustained or op.kind not in TENSOR_CORE_KINDS or source.startswith(SOURCE_CALIBRATED):
            return 1.0
        hit = self._shares.get(device)
        if hit is None:
            share = self._share_names.get(device.name)
            hit = self._shares[device] = 1.0 / (sustained_share(device)[0] if share is None else share)
        return hit

    @property
    def warnings(self) -> list[str]:
        """One line per (device, op class, reason) this pricer flagged since it was made or last cleared: a learned
        price on a device the model never trained on that was clipped to the roofline bound or lies above 3x it
        (``costmodel.learned.SOURCE_UNSEEN_CLIPPED`` / ``SOURCE_UNSEEN_ABOVE``). Each distinct op counts once
        (repeat prices come from the memo)."""
        out = []
        for (dev, kind, src), n in sorted(self._flags.items()):
            why = src[src.index(", ") + 2:-1] if ", " in src else src
            out.append(f"{dev}: {n} {kind} op(s) {why} by a cost model not trained on this device "
                       f"(roofline bound: costmodel.features; verify with a profiled run)")
        return out

    def clear_warnings(self) -> None:
        """Forget the flagged prices (``warnings`` becomes empty)."""
        self._flags.clear()

    @classmethod
    def shipped(cls) -> "Pricer":
        """The model shipped in the package (roofline when none is shipped).

        Raises:
            MeshplanError: the shipped model is corrupt (checksums verified).
        """
        from meshplan.costmodel.learned import LearnedModel

        d = shipped_model_dir()
        return cls(LearnedModel.load(d) if (d / "metadata.json").is_file() else None)

    @classmethod
    def from_dir(cls, directory: str | Path | None) -> "Pricer":
        """The model in ``directory`` (``meshplan costmodel train`` / ``fit --out``); ``None``: the shipped one.

        Raises:
            MeshplanError: corrupt or missing model (checksums verified).
        """
        from meshplan.costmodel.learned import LearnedModel

        return cls.shipped() if directory is None else cls(LearnedModel.load(directory))

    @classmethod
    def roofline(cls) -> "Pricer":
        """No learned model: every price from the calibrated roofline / alpha-beta."""
        return cls(None)

    @property
    def name(self) -> str:
        """What prices compute ops, for plan provenance: ``learned:<model id>`` or ``roofline``."""
        return "roofline" if self.model is None else f"learned:{self.model.model_id}"

    def collective_model(self) -> "CollectiveModel | None":
        """The model's fitted collective model, or ``None``."""
        return self.model.collective_model() if self.model is not None else None

    def predict(self, op: OpSpec, device: DeviceSpec, link: Link | None = None) -> float:
        """Predicted latency of ``op`` on ``device``, seconds.

        Args:
            op: The operator instance.
            device: Where it runs.
            link: For collectives, the slowest link the group crosses (required for collectives).
        """
        return self.predict_with_source(op, device, link)[0]

    def predict_with_source(self, op: OpSpec, device: DeviceSpec, link: Link | None = None) -> tuple[float, str]:
        """``(seconds, source)``: source is ``learned``, ``learned (unseen device, clipped to roofline)``,
        ``learned (unseen device, above 3x roofline)`` (both also noted in :attr:`warnings`), ``roofline (...)``,
        ``calibrated (costmodel fit)`` or ``alpha-beta``/``learned collective``."""
        if op.is_collective:
            if link is None:
                raise ValueError(f"collective {op.kind} needs a link to be priced")
            cm = self.collective_model()
            if cm is None:
                return collective_time_s(op.kind, op.bytes, op.group_size, link), "alpha-beta"
            from meshplan.costmodel.collective_model import predict_collective

            return predict_collective(op.kind, op.bytes, op.group_size, link, model=cm), "learned collective"
        key = (op, device)
        hit = self._final.get(key)
        if hit is None:
            if len(self._final) >= MEMO_MAX:
                self._final.clear()
            sec, src = self._compute_with_source(op, device)
            hit = self._final[key] = (sec * self._load_factor(op, device, src), src)
        return hit

    def _compute_with_source(self, op: OpSpec, device: DeviceSpec) -> tuple[float, str]:
        """``predict_with_source`` of a compute op, not memoised at this level."""
        if op.kind == "attention" and op.impl == "sdpa":
            sec, src = self._compute_with_source(replace(op, impl=sdpa_backend(device)), device)
            return sec, f"{src}; {SDPA_WORDS}"
        if _unmeasured_lowp_attention(op, device):
            sec, src = self._compute_with_source(replace(op, dtype="bf16"), device)
            return sec, f"{src}; no {op.dtype} attention measurement on {device.name}: its bf16 rate"
        if op.kind == "attention" and op.impl:
            t = fused_attention_s(op, device)
            if t is not None:
                source = blackwell_source(op, device) or curve_source(op.impl, device, op.shape[4])
                return t, f"published {op.impl} curve: {source}"
        t = norms.measured_s(op, device)
        if t is not None:
            return t, norms.source(op, device)
        if op.kind == "rmsnorm" and op.impl == "eager":
            return self._eager_norm(op, device)
        if op.kind in ANALYTIC_KINDS:  # the learned model holds no class for it
            return _analytic_s(op, device)
        if op.groups > 1:
            dense, scale, words = self._grouped_of(op, device)
            sec, src = self._compute_with_source(dense, device)
            return sec * scale, f"{src} (grouped: {words})"
        twin = _bf16_twin(op)
        if twin is not None and device.supports("bf16"):
            sec, src = self._compute_with_source(twin, device)
            share = fp8_time_share(op, device) * recipe_time_multiple(op.impl, device)
            rule = f"{op.dtype} rule" + (f", main loop measured: {fp4_gemm.source(device.name)}"
                                         if op.dtype == "nvfp4" else "") + recipe_words(op.impl, device)
            return sec * share, f"{src} (bf16 twin, {rule})"
        sec, src = self.model_price(op, device)
        scale, note = self._gemm_factor(op, device, src)
        sec, src = (sec * scale, f"{src} ({note})") if note else (sec, src)
        return self._streaming_floored(op, device, *self._die_capped(op, device, sec, src))

    def _eager_norm(self, op: OpSpec, device: DeviceSpec) -> tuple[float, str]:
        """Eager code's RMSNorm formula: our runs' rate where one stands for ``device`` (``costmodel.norms``), else
        the norm kernel plus the formula's extra full passes."""
        t = norms.eager_s(op, device)
        if t is not None:
            return t, norms.eager_source(device)
        sec, src = self._compute_with_source(replace(op, impl=""), device)
        rows, width = op.shape
        ew = OpSpec("elementwise", (rows * width,), op.dtype, backward=op.backward)
        return (sec + norms.EAGER_EXTRA_PASSES * self._compute_with_source(ew, device)[0],
                f"{src}; eager formula: + {norms.EAGER_EXTRA_PASSES} elementwise passes (no run on {device.name})")

    @staticmethod
    def _streaming_floored(op: OpSpec, device: DeviceSpec, sec: float, source: str) -> tuple[float, str]:
        """A memory-bound op runs no faster than the streaming kernels measured on ``device`` at its bytes
        (``costmodel.streaming``); a price calibrated on a run's own kernels stands."""
        floor = streaming.floor_s(op, device)
        if floor is None or floor <= sec or source.startswith(SOURCE_CALIBRATED):
            return sec, source
        rate_gbs = op.bytes / floor / 1e9
        return floor, (f"{source}; {streaming.FLOOR_WORDS} {rate_gbs:,.0f} GB/s, the rate of {streaming.SOURCE} "
                       f"on {device.name}")

    def _die_capped(self, op: OpSpec, device: DeviceSpec, sec: float, source: str) -> tuple[float, str]:
        """A GEMM on the GB200 runs no faster than the B200's over the die speed FlashAttention-2 measured on both
        (``costmodel.flash2_blackwell.gemm_die_speed``: 1.08, where the model carries the datasheet peaks' 1.11 into
        compute-bound GEMMs); the GB300, priced from the GB200, takes the same floor over its measured speed."""
        if op.kind != "matmul" or device.name not in DIE_CAPPED or source.startswith(SOURCE_CALIBRATED):
            return sec, source
        die = flash2_blackwell.gemm_die_speed()
        floor = self._die_floors.get(op)
        if floor is None:
            if len(self._die_floors) >= MEMO_MAX:
                self._die_floors.clear()
            floor = self._die_floors[op] = self._compute_with_source(op, catalogue()["B200"])[0] / die
        if device.name == "GB300":
            floor /= self._blackwell("speed")
        if floor <= sec:
            return sec, source
        return floor, (f"{source}; capped at the B200's price over the die speed FlashAttention-2 measured on a GB200 "
                       f"over a B200 ({die:.3f}, {flash2_blackwell.SOURCE})")

    def _gemm_factor(self, op: OpSpec, device: DeviceSpec, source: str) -> tuple[float, str]:
        """``_gemm_scale`` for a GEMM's model price on a Blackwell part; 1 and "" for other ops and parts, and for a
        price calibrated on a run's own kernels (timed on the part already)."""
        if op.kind != "matmul" or device.name not in GEMM_SCALED or source.startswith(SOURCE_CALIBRATED):
            return 1.0, ""
        return self._gemm_scale(device)

    def _gemm_scale(self, device: DeviceSpec) -> tuple[float, str]:
        """(scale, words) of a dense GEMM's model price on ``device``: the B200/H100 time ratio OpenXLA measured,
        over this pricer's own (``costmodel.xla_gemm``), and on the GB300 its speed over the GB200's
        (``costmodel.blackwell_grouped``); on the B300 its own, measured over this pricer's price of the same bf16
        GEMMs (``costmodel.te_gemm``); 1 off Blackwell."""
        hit = self._gemm_scales.get(device.name)
        if hit is None and device.name == te_gemm.PART:
            b300 = catalogue()[te_gemm.PART]
            scale = te_gemm.bf16_scale(lambda op: self.model_price(op, b300)[0])
            hit = self._gemm_scales[device.name] = (scale, f"x {scale:.3f}: measured over priced bf16 GEMMs in "
                                                           f"{te_gemm.SOURCE}")
        if hit is None:
            cat = catalogue()
            scale, words = gemm_scale(lambda op, name: self.model_price(op, cat[name])[0], device.name)
            if device.name == "GB300":
                speed = self._blackwell("speed")
                scale, words = scale / speed, (f"{words}; / {speed:.3f}: the GB300's GEMMs against the GB200's in "
                                               f"{blackwell_grouped.SOURCE}")
            hit = self._gemm_scales[device.name] = (scale, words)
        return hit

    def _blackwell(self, which: str) -> float:
        """``costmodel.blackwell_grouped``'s grouped share ("share") or GB300 speed ("speed") under this pricer's
        one-shot prices."""
        hit = self._blackwell_fits.get(which)
        if hit is None:
            cat = catalogue()
            fit = blackwell_grouped.grouped_share if which == "share" else blackwell_grouped.gb300_speed
            hit = self._blackwell_fits[which] = fit(lambda op, name: self.one_shot_s(op, cat[name]))
        return hit

    def one_shot_s(self, op: OpSpec, device: DeviceSpec) -> float:
        """Seconds of a compute op as a kernel benchmark times it: every rule but the sustained share, not memoised
        at this level (what ``costmodel.blackwell_grouped``'s fits and their held-out checks price with)."""
        return self._compute_with_source(op, device)[0]

    def _grouped_of(self, op: OpSpec, device: DeviceSpec) -> tuple[OpSpec, float, str]:
        """(the dense GEMM a grouped one is priced from, its time multiple, the words): the grouped kernel's
        measured share (``costmodel.grouped``); low-precision grouped GEMMs on Blackwell at the share cuDNN
        frontend's MoE benchmark measured, in the Hopper curve's shape over rows (``costmodel.blackwell_grouped``)."""
        dense, multiple = _dense_of(op)
        if op.dtype not in LOWP_GEMM_DTYPES or device.name not in blackwell_grouped.PARTS or op.groups == 1:
            return dense, multiple, GROUPED_SOURCE
        share = self._blackwell("share")
        at_measured = grouped_efficiency(blackwell_grouped.TOKENS, op.dtype, False)
        return dense, multiple * at_measured / share, (
            f"MXFP8 grouped/dense {share:.3f} at {blackwell_grouped.TOKENS} rows per group measured in "
            f"{blackwell_grouped.SOURCE}, shaped over rows by the Hopper curve")

    def model_price(self, op: OpSpec, device: DeviceSpec) -> tuple[float, str]:
        """The learned model's price of a plain compute op (memoised), or the roofline's without a model."""
        if self.model is None:
            return roofline_predict(op, device), "roofline (no learned model)"
        key = (op, device)
        hit = self._memo.get(key)
        if hit is None:
            if len(self._memo) >= MEMO_MAX:
                self._memo.clear()
            sec, src = self.model.predict_ops([op], device)
            hit = self._memo[key] = (float(sec[0]), str(src[0]))
            self._note(src, [op], [device])
        return hit

    def basis(self, op: OpSpec, device: DeviceSpec) -> str:
        """What ``op``'s price on ``device`` rests on, in words: the source ``predict_with_source`` names and, for a
        learned price, the kernel measurements its op class was trained on (devices, rows). The sustained share a
        pricer under load divides tensor-core prices by is not part of it: ``sustained_share`` names it."""
        source = self.predict_with_source(op, device)[1]
        if source.startswith("roofline"):
            return f"{source}: {device.name}'s datasheet peak and HBM bandwidth (costmodel/data/devices.yaml)"
        if self.model is None or not source.startswith("learned") or op.is_collective:
            return source
        kind = _bf16_twin(_dense_of(op)[0]) or op
        info = self.model.meta.get("kinds", {}).get(kind.kind)
        if not info:
            return source
        seen = "among them" if device.name in info["devices"] else "not among them"
        return (f"{source}: {kind.kind} kernels measured on {', '.join(info['devices'])} ({info['n_train']:,} "
                f"rows; {device.name} {seen})")

    def prime(self, ops: list[OpSpec], device: DeviceSpec) -> None:
        """Price the compute ops of ``ops`` this pricer has not priced yet on ``device`` in one call of the learned
        model (its per-call cost dominates single-op pricing), filling the memo ``predict`` reads."""
        if self.model is None:
            return
        if device.name in DIE_CAPPED:  # its GEMMs are floored at the B200's price (``_die_capped``): one call for both
            self.prime([op for op in ops if op.kind == "matmul"], catalogue()["B200"])
        todo = []
        for op in dict.fromkeys(ops):
            op = _dense_of(op)[0]
            twin = _bf16_twin(op)
            op = twin if twin is not None and device.supports("bf16") else op
            if op.is_collective or (op.kind == "attention" and op.impl) or op.kind in ANALYTIC_KINDS:
                continue
            if (op, device) in self._memo:
                continue
            todo.append(op)
        if not todo:
            return
        if len(self._memo) + len(todo) >= MEMO_MAX:
            self._memo.clear()
        sec, src = self.model.predict_ops(todo, device)
        for op, t, sr in zip(todo, sec, src):
            self._memo[(op, device)] = (float(t), str(sr))
        self._note(src, todo, [device] * len(todo))

    def predict_batch(self, ops: list[OpSpec], device: DeviceSpec | list[DeviceSpec]):
        """Latency (s) of many compute ops at once (numpy array): the fast path of the solvers' problem builders."""
        import numpy as np

        devs = device if isinstance(device, list) else [device] * len(ops)
        scale = np.ones(len(ops))
        priced = list(ops)
        for i, (o, d) in enumerate(zip(ops, devs)):
            o, scale[i], _ = self._grouped_of(o, d)
            priced[i] = o
            twin = _bf16_twin(o)
            if twin is not None and d.supports("bf16"):
                priced[i], scale[i] = twin, scale[i] * fp8_time_share(o, d) * recipe_time_multiple(o.impl, d)
        ssd = [i for i, o in enumerate(priced) if o.kind in ANALYTIC_KINDS]
        for i in ssd:  # priced below (``_analytic_s``); the learned model holds no class for them
            priced[i] = OpSpec("copy", (1,))
        src = [""] * len(ops)
        if self.model is None:
            out = np.array([roofline_predict(o, d) for o, d in zip(priced, devs)])
        else:
            sec, src = self.model.predict_ops(priced, devs)
            self._note(src, priced, devs)
            out = np.array(sec, dtype=float)
        for i in ssd:
            out[i] = _analytic_s(ops[i], devs[i])[0]
        for i, (o, d) in enumerate(zip(priced, devs)):  # as _compute_with_source: the dense price, then its multiples
            out[i] = self._streaming_floored(o, d, *self._die_capped(
                o, d, out[i] * self._gemm_factor(o, d, str(src[i]))[0], str(src[i])))[0]
        out *= scale
        for i, (o, d) in enumerate(zip(ops, devs)):
            if o.kind == "attention" and o.impl:
                if o.impl == "sdpa":
                    o = replace(o, impl=sdpa_backend(d))  # PyTorch SDPA's own order on this part
                if _unmeasured_lowp_attention(o, d):
                    o = replace(o, dtype="bf16")  # no fp8 attention measurement here: its bf16 rate
                t = fused_attention_s(o, d)
                if t is not None:
                    out[i] = t
            if o.kind in norms.NORM_KINDS and o.impl:  # a norm priced by the kernel it names: _compute_with_source's
                out[i] = self.predict(o, d)  # price, memoised
        if self.sustained:
            out = out * np.array([self._load_factor(o, d, str(s)) for o, d, s in zip(ops, devs, src)])
        return out
