"""Achieved speed of fused attention kernels (FlashAttention-2, FlashAttention-3, cuDNN) by sequence length.

Fused attention is one kernel whose speed depends on the implementation far more than on the shape: on an H100 the
same causal attention runs at 333 TFLOP/s with FlashAttention-2 (Ampere-style ``mma.sync``, no TMA/WGMMA) and at 602
with FlashAttention-3 (Shah et al. 2024). The training stack decides which runs (``planner.estimate.ops_graph``:
Megatron-Core
through Transformer Engine -> cuDNN fused attention; PyTorch SDPA's flash backend in torchtitan and HF code ->
FlashAttention-2), and ``OpSpec.impl`` carries it here. No op-level dataset in data/kernels measures fused attention on
these GPUs, so the published kernel benchmarks below are the measurements.

Sources (BF16, head dim 128, FLOPs counted as 4 s^2 d h forward, halved when causal, backward 2.5x forward):
  * H100 SXM5 80GB: FlashAttention-3 paper (Shah, Bikshandi, Zhang, Thakkar, Ramani, Dao 2024, arXiv:2407.08608),
    Figure 5 (forward, causal, head dim 128) and Figure 6 (backward, head dim 128): FlashAttention-2, cuDNN and
    FlashAttention-3 at sequence lengths 512 .. 16k (batch x seq = 16k tokens, hidden 2048).
  * A100 80GB SXM4: FlashAttention-2 paper (Dao 2023, arXiv:2307.08691) §4.1: forward "up to 73%" and backward
    "up to 63%" of the theoretical peak; the curve over sequence length is taken with the H100 FlashAttention-2
    curve's shape (both kernels are the same code, limited by the same non-matmul work at short sequences).
    FlashAttention-3 and cuDNN's Hopper kernels do not exist on Ampere: they fall back to FlashAttention-2.
  * FlexAttention (torch.compile-generated Triton): PyTorch blog "FlexAttention: The Flexibility of PyTorch with the
    Performance of FlashAttention" (Aug 2024): "90% of FlashAttention2's performance in the forward pass and 85%
    in the backward pass" (H100): the FlashAttention-2 curve times those shares.
  * GB200 and GB300 (cuDNN through Transformer Engine): cuDNN's own training-attention benchmark,
    NVIDIA/cudnn-frontend ``benchmark/sdpa_benchmark_training/results`` @ 3929da2 (2026-04-24, cudnn-frontend
    1.21.1, cuDNN 9.22), kept in ``costmodel/data/published/cudnn_sdpa_blackwell.json``: forward and
    (non-deterministic) backward times at 2k..32k tokens for Llama 3.1's heads (64 query, 8 KV, head dim 128;
    causal and unmasked), DeepSeek-V3's (128 heads, head dims 192/128) and GPT-OSS's sliding window (128 keys,
    head dim 64, causal). The B200 takes the GB200's curve at the die speed FlashAttention-2 measured on both
    (1.08x), the B300 the GB300's scaled by bf16 peak (no run of it is published): ``costmodel.flash2_blackwell``.
  * FlashAttention-2 on B200, GB200, GB300 (and B300 from the GB300): PyTorch SDPA's flash backend, timed by the same
    cuDNN benchmark's earlier releases (``costmodel.flash2_blackwell``): 18% of the bf16 peak, as its ``mma.sync``
    kernels leave Blackwell's tensor cores idle. FlashAttention-3 (Hopper's ``wgmma``) runs as FlashAttention-2
    there, FlexAttention at FlashAttention-2's rate times the blog's shares.
  * Head dim 64: the same FA3 paper figures at head dim 64 (Fig. 5 (a) unmasked and (d) causal forward, Fig. 6 (a)
    backward), H100 SXM5: a head-dim-64 attention on Hopper takes those curves. A short head does less matmul work
    per softmax element and per K/V tile load, so every kernel runs it slower (cuDNN's causal forward at 4k: 363
    against 518 TFLOP/s at d128). No Blackwell full-mask head-dim-64 cuDNN case is published: there a d64
    attention takes the d128 curve times the H100 cuDNN d64 / d128 ratio at the same length and pass (GPT-OSS's
    full-attention layers; its window layers have their own measured d64 curve). The source string says so.
Other devices have no published curve here and keep the learned model's / roofline's price.
Units: TFLOP/s in the tables, seconds returned.
"""
from __future__ import annotations

import bisect
import functools
import math
from types import MappingProxyType
from typing import Mapping

from meshplan.costmodel import flash2_blackwell
from meshplan.costmodel.devices import DeviceSpec, catalogue
from meshplan.costmodel.measured import published_file
from meshplan.costmodel.ops import OpSpec

SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384)
H100_SXM_BF16_PEAK_TFLOPS = 989.4  # the figures below are on this device; other Hopper parts scale by their peak
HOPPER_TFLOPS = {  # FA3 paper Fig. 5 (forward, causal) / Fig. 6 (backward, no mask), H100 SXM5, head dim 128
    "flash2": {"fwd": (191, 260, 298, 319, 333, 335), "bwd": (214, 260, 291, 310, 318, 322)},
    "cudnn": {"fwd": (315, 410, 484, 518, 529, 539), "bwd": (305, 408, 465, 499, 518, 516)},
    "flash3": {"fwd": (292, 423, 521, 579, 602, 616), "bwd": (316, 424, 501, 542, 559, 561)},
}
# FA3 paper Fig. 5 (d) (forward, causal) and Fig. 6 (a) (backward, no mask) at head dim 64, the same H100 and inputs
HOPPER_TFLOPS_D64 = {
    "flash2": {"fwd": (180, 229, 262, 284, 295, 299), "bwd": (198, 238, 264, 279, 287, 291)},
    "cudnn": {"fwd": (225, 288, 334, 363, 379, 388), "bwd": (266, 348, 395, 417, 432, 433)},
    "flash3": {"fwd": (197, 265, 371, 420, 460, 473), "bwd": (272, 363, 422, 453, 472, 474)},
}
# FA3 paper Fig. 5 (a): forward without the mask at head dim 64
HOPPER_FWD_UNMASKED_D64 = {"flash2": (282, 306, 318, 321, 322, 324), "cudnn": (335, 373, 395, 408, 412, 413),
                           "flash3": (333, 392, 460, 476, 496, 497)}
SHORT_HEAD_DIM = 64  # a head this short or shorter takes the head-dim-64 curves; longer ones, up to 128, the d128 ones
# FA3 paper Fig. 5, forward without the mask: the causal/unmasked ratio at each length is the masking overhead (tiles
# on the diagonal, fewer tiles to balance), applied to the backward too, which the paper shows unmasked only
HOPPER_FWD_UNMASKED = {"flash2": (309, 350, 362, 368, 370, 370), "cudnn": (497, 574, 617, 609, 600, 595),
                       "flash3": (467, 565, 625, 638, 646, 648)}
AMPERE_FA2_PLATEAU = {"fwd": 0.73, "bwd": 0.63}  # FA2 paper §4.1: share of the A100's 312 TFLOP/s peak
HOPPER = frozenset({"H100-SXM", "H100-PCIe", "H800", "H200", "H100-SXM-96GB-500W"})
AMPERE = frozenset({"A100-80GB", "A100-40GB", "A100-PCIe-40GB", "A100-PCIe-80GB"})
FUSED_IMPLS = ("flash2", "flash3", "cudnn", "flex")
FLEX_SHARE_OF_FA2 = {"fwd": 0.90, "bwd": 0.85}  # PyTorch FlexAttention blog, Aug 2024
# on Blackwell FlashAttention-3 (Hopper's wgmma only) runs as FlashAttention-2, and flex takes FA2's rate
BLACKWELL_FA2_IMPLS = ("flash2", "flash3", "flex")
# PyTorch SDPA's own backend order ("sdpa": what torchtitan's and HF's SDPA calls run unless a profile names the
# kernel): aten/src/ATen/native/transformers/cuda/sdp_utils.cpp, check_prefer_cudnn_attention, puts cuDNN first on
# sm90, sm100 and sm103 once the cuDNN it loads is above 9.15 (the torch 2.11 wheels on; pytorch/pytorch #169849),
# FlashAttention-2 first elsewhere. An older torch runs FlashAttention-2 there too: pin attention=flash2.
SDPA_CUDNN_FIRST = HOPPER | {"B200", "GB200", "B300", "GB300"}
SDPA_WORDS = ("PyTorch SDPA's order (torch >= 2.11, cuDNN above 9.15: cuDNN first on sm90 / sm100 / sm103, "
              "FlashAttention-2 elsewhere; sdp_utils.cpp check_prefer_cudnn_attention)")


def sdpa_backend(device: DeviceSpec) -> str:
    """The fused kernel PyTorch SDPA runs on ``device`` by its own backend order (``SDPA_CUDNN_FIRST``)."""
    return "cudnn" if device.name in SDPA_CUDNN_FIRST else "flash2"
BLACKWELL_FILE = "cudnn_sdpa_blackwell.json"  # in costmodel/data/published
# the part whose cuDNN curve each Blackwell device takes (B200 / B300: the same dies as GB200 / GB300 at lower clocks)
BLACKWELL_MEASURED = {"GB200": "GB200", "B200": "GB200", "GB300": "GB300", "B300": "GB300"}


def curve_source(impl: str, device: DeviceSpec, head_dim: int = 128) -> str:
    """The publication a fused-attention price on ``device`` rests on (the module docstring gives the details), and
    for a head longer than 128 (Gemma's 256) that no curve here measures it."""
    longer = f"; no head-dim-{head_dim} measurement here: the d128 curve" if head_dim > 128 else ""
    if device.name in AMPERE:
        return ("FlashAttention-2 paper §4.1 plateau on A100 (73% fwd, 63% bwd), shaped by the H100 FA2 curve"
                + longer)
    base = {"flash2": "FlashAttention-2", "cudnn": "cuDNN", "flash3": "FlashAttention-3",
            "flex": "FlashAttention-2 x FlexAttention blog shares (0.90 fwd, 0.85 bwd)"}[impl]
    return f"{base} curve, FlashAttention-3 paper Fig. 5-6 (H100 SXM5, d128 and d64), scaled by bf16 peak{longer}"


def _interp(seq: float, values: tuple[float, ...]) -> float:
    """Linear in log2(sequence length) between the published points; flat beyond them."""
    x = math.log2(max(SEQ_LENS[0], min(SEQ_LENS[-1], seq)))
    xs = [math.log2(s) for s in SEQ_LENS]
    i = min(len(xs) - 2, max(0, bisect.bisect_right(xs, x) - 1))
    f = (x - xs[i]) / (xs[i + 1] - xs[i])
    return values[i] + f * (values[i + 1] - values[i])


def _curve(impl: str, pass_: str, causal: bool, head_dim: int = 128) -> tuple[float, ...]:
    """The H100 TFLOP/s of ``impl`` per ``SEQ_LENS`` for one pass, with or without the causal mask, at head dim 128
    or, for a head of ``SHORT_HEAD_DIM`` or shorter, 64."""
    short = head_dim <= SHORT_HEAD_DIM
    tflops, unmasked = (HOPPER_TFLOPS_D64, HOPPER_FWD_UNMASKED_D64) if short else (HOPPER_TFLOPS, HOPPER_FWD_UNMASKED)
    vals = tflops[impl][pass_]
    if pass_ == "bwd" and causal:
        mask = [c / u for c, u in zip(tflops[impl]["fwd"], unmasked[impl])]
        return tuple(v * r for v, r in zip(vals, mask))
    if pass_ == "fwd" and not causal:
        return unmasked[impl]
    return vals


def short_head_share(seq: float, backward: bool, causal: bool) -> float:
    """The H100 cuDNN head-dim-64 rate over its d128 rate at ``seq`` for one pass (FA3 paper Fig. 5-6): what a
    Blackwell d64 attention keeps of the measured d128 curve."""
    pass_ = "bwd" if backward else "fwd"
    return _interp(seq, _curve("cudnn", pass_, causal, SHORT_HEAD_DIM)) / _interp(seq, _curve("cudnn", pass_, causal))


def attention_tflops(impl: str, device: DeviceSpec, seq: float, backward: bool,
                     causal: bool = True, head_dim: int = 128) -> float | None:
    """Achieved TFLOP/s of ``impl`` on ``device`` at key length ``seq`` and ``head_dim``, or ``None`` when no curve
    applies."""
    if impl not in FUSED_IMPLS or device.vendor != "nvidia":
        return None
    pass_ = "bwd" if backward else "fwd"
    if impl == "flex":
        fa2 = attention_tflops("flash2", device, seq, backward, causal, head_dim)
        return None if fa2 is None else fa2 * FLEX_SHARE_OF_FA2[pass_]
    if flash2_blackwell.curve_part(device.name) and impl in BLACKWELL_FA2_IMPLS:
        return _blackwell_flash2(device, seq, pass_, causal, head_dim)
    peak = device.peak_flops.get("bf16", 0.0) / 1e12
    if device.name in HOPPER:
        return _interp(seq, _curve(impl, pass_, causal, head_dim)) * peak / H100_SXM_BF16_PEAK_TFLOPS
    if device.name in AMPERE:  # FlashAttention-3 / cuDNN's Hopper kernels fall back to FlashAttention-2
        curve = _curve("flash2", pass_, causal, head_dim)
        return _interp(seq, curve) / max(_curve("flash2", pass_, causal)) * AMPERE_FA2_PLATEAU[pass_] * peak
    return None


def _blackwell_flash2(device: DeviceSpec, seq: float, pass_: str, causal: bool, head_dim: int) -> float:
    """FlashAttention-2's measured causal d128 rate on a Blackwell part (``costmodel.flash2_blackwell``), times the
    H100 FlashAttention-2 curves' ratio of this mask and head dim to causal d128 at the same length."""
    seqs, rates = flash2_blackwell.flash2_points(device.name, pass_ == "bwd")
    shape = _interp(seq, _curve("flash2", pass_, causal, head_dim)) / _interp(seq, _curve("flash2", pass_, True))
    return _interp_at(seq, seqs, rates) * shape


def _window_keys(seq: int, window: int) -> float:
    """Keys one query sees on average under a causal window of ``window`` keys (``planner.model.flops.window_keys``,
    restated here: the cost model sits below the planner)."""
    return (window * (window + 1) / 2 + (seq - window) * window) / seq if 0 < window < seq else seq / 2


def _measured_flops(r: dict) -> float:
    """FLOPs of one published cuDNN case counted as ``costmodel.ops`` counts the op meshplan prices against it: head
    dim the q/k one (``planner.estimate.ops_graph`` lists MLA's attention at its q/k head dim, 192, so the same shape
    prices at the measured time); a window as causal attention over ``round(2 * window keys)`` keys, as the op
    list holds it."""
    d = r["d_qk"]
    keys = max(1, round(2 * _window_keys(r["seq"], r["window"]))) if r["window"] else r["seq"]
    f = 4.0 * r["batch"] * r["heads_q"] * r["seq"] * keys * d / (2.0 if r["mask"] == "top_left" else 1.0)
    return f * (2.5 if r["pass"] == "bwd" else 1.0)


def _blackwell_kind(r: dict) -> str:
    """``window``, ``d128-causal``, ``d128-full``, ``d192-causal`` or ``d192-full``: which curve a case belongs to."""
    if r["window"]:
        return "window"
    return ("d192" if r["d_qk"] > 128 else "d128") + ("-causal" if r["mask"] == "top_left" else "-full")


# meshplan's op dtype -> the cuDNN benchmark's ``dtype`` column: fp8 there is per-tensor-scaled E4M3 (what Transformer
# Engine's fp8 dot-product attention runs under tensor-wise and delayed scaling), mxfp8 E4M3 in 1x32 blocks (its
# MXFP8 path).
BENCH_DTYPE = {"bf16": "bfloat16", "fp16": "bfloat16", "fp8": "fp8", "mxfp8": "mxfp8"}
LOWP_ATTENTION_DTYPES = ("fp8", "mxfp8")


@functools.lru_cache(maxsize=4)
def blackwell_curves(dtype: str = "bfloat16") -> Mapping[tuple, tuple]:
    """``{(gpu, kind, pass): ((seq, ...), (TFLOP/s, ...))}`` of the packaged cuDNN benchmark's cases of ``dtype``
    (its column: bfloat16, fp8, mxfp8; read once per process, handed out read-only): TFLOP/s under
    ``_measured_flops``, by sequence length."""
    data = published_file(BLACKWELL_FILE)
    points: dict = {}
    for r in data["rows"]:
        if r["dtype"] == dtype:
            key = (r["gpu"], _blackwell_kind(r), r["pass"])
            points.setdefault(key, {})[r["seq"]] = _measured_flops(r) / (r["time_ms"] * 1e-3) / 1e12
    return MappingProxyType({k: (tuple(sorted(v)), tuple(v[s] for s in sorted(v))) for k, v in points.items()})


def _interp_at(seq: float, xs: tuple, ys: tuple) -> float:
    """Linear in log2(sequence length) between measured points; flat beyond them."""
    x = math.log2(max(xs[0], min(xs[-1], seq)))
    lx = [math.log2(s) for s in xs]
    i = min(len(lx) - 2, max(0, bisect.bisect_right(lx, x) - 1))
    f = (x - lx[i]) / (lx[i + 1] - lx[i])
    return ys[i] + f * (ys[i + 1] - ys[i])


def _blackwell_key(op: OpSpec, device: DeviceSpec) -> tuple | None:
    """The curve a cuDNN attention ``op`` on a Blackwell ``device`` is priced from, or ``None``: keys fewer than
    queries under the causal mask is a sliding window; otherwise the head dim picks the d128 or d192 curve."""
    measured = BLACKWELL_MEASURED.get(device.name)
    if measured is None or op.impl != "cudnn" or op.dtype not in BENCH_DTYPE:
        return None
    _, _, s_q, s_kv, d = op.shape
    kind = "window" if op.causal and s_kv < s_q else ("d192" if d > 128 else "d128") + (
        "-causal" if op.causal else "-full")
    return measured, kind, "bwd" if op.backward else "fwd"


def blackwell_source(op: OpSpec, device: DeviceSpec) -> str | None:
    """What a Blackwell attention price rests on, in words (``None``: no Blackwell curve applies)."""
    if flash2_blackwell.curve_part(device.name) and op.impl in BLACKWELL_FA2_IMPLS and op.dtype in ("bf16", "fp16"):
        return _flash2_source(op, device)
    key = _blackwell_key(op, device)
    if key is None:
        return None
    measured, kind, _ = key
    what = {"window": "GPT-OSS sliding window (128 keys, head dim 64)",
            "d128-causal": "Llama 3.1 heads (d128), causal", "d128-full": "Llama 3.1 heads (d128), unmasked",
            "d192-causal": "DeepSeek-V3 heads (d192/128), causal",
            "d192-full": "DeepSeek-V3 heads (d192/128), unmasked"}[kind]
    out = (f"cuDNN 9.22 {BENCH_DTYPE[op.dtype]} on {measured}, {what}: NVIDIA/cudnn-frontend "
           "sdpa_benchmark_training results @ 3929da2")
    if measured != device.name and device.name in flash2_blackwell.NEWEST_RUN:
        out += f", {flash2_blackwell.speed_words(device.name)}"
    elif measured != device.name:
        out += f", scaled by {_scale_dtype(op)} peak to {device.name}"
    if kind.startswith("d128") and op.shape[4] <= SHORT_HEAD_DIM:
        out += (f"; no head-dim-{op.shape[4]} measurement with this mask: the d128 rate times the H100 cuDNN d64 / "
                "d128 ratio (FlashAttention-3 paper Fig. 5-6)")
    elif kind.startswith("d128") and op.shape[4] < 128:
        out += f"; no head-dim-{op.shape[4]} measurement with this mask: the d128 rate"
    if kind == "window" and op.shape[4] != 64:
        out += f"; head dim {op.shape[4]} priced at the measured d64 window rate"
    if kind.startswith("d192") and op.shape[4] > 192:
        out += f"; no head-dim-{op.shape[4]} measurement: the d192 rate"
    return out


def _flash2_source(op: OpSpec, device: DeviceSpec) -> str:
    """What a FlashAttention-2-family price on a Blackwell part rests on: the measured causal d128 curve, and what
    the op differs from it in."""
    words = flash2_blackwell.source_words(device.name)
    if op.impl == "flash3":
        words = f"FlashAttention-3 needs Hopper (sm_90a), FlashAttention-2 runs: {words}"
    if op.impl == "flex":
        words += (f" x FlexAttention blog shares ({FLEX_SHARE_OF_FA2['fwd']:.2f} fwd, {FLEX_SHARE_OF_FA2['bwd']:.2f} "
                  "bwd; no Blackwell measurement of flex)")
    d = op.shape[4]
    if not op.causal or d != 128:
        what = "unmasked" if not op.causal else f"head-dim-{d}"
        words += f"; no {what} measurement: the causal d128 rate times the H100 FlashAttention-2 curves' ratio"
    return words


def blackwell_tflops(op: OpSpec, device: DeviceSpec) -> float | None:
    """Achieved TFLOP/s of a cuDNN attention ``op`` on a Blackwell ``device`` (``None``: no curve applies), at the
    query length for a window, else the shorter of the query and key lengths."""
    key = _blackwell_key(op, device)
    curve = blackwell_curves(BENCH_DTYPE[op.dtype]).get(key) if key else None
    if curve is None:
        return None
    _, _, s_q, s_kv, d = op.shape
    seq = s_q if key[1] == "window" else min(s_q, s_kv)
    short = short_head_share(seq, op.backward, op.causal) if key[1].startswith("d128") and d <= SHORT_HEAD_DIM else 1.0
    # carried to a sibling part by FlashAttention-2's rule for the pair (the measured die speed for the B200, bf16
    # peaks for the B300): costmodel.flash2_blackwell.sibling_speed, which is 1 on the measured part itself
    return _interp_at(seq, *curve) * flash2_blackwell.sibling_speed(device.name, op.backward) * short


def _scale_dtype(op: OpSpec) -> str:
    """The dense peak that carries a measured rate to a sibling part: the one of the dtype the kernel's GEMMs run in."""
    return "fp8" if op.dtype in LOWP_ATTENTION_DTYPES else "bf16"


def blackwell_held_out_ratios() -> tuple[list[float], list[float]]:
    """(in sample, held out) priced / measured time of every bf16 case of the cuDNN benchmark: in sample from its
    own GPU's curve (exact at a measured length), held out from the other GPU's curve scaled by bf16 peak."""
    curves = blackwell_curves()
    inside, held = [], []
    for (gpu, kind, pass_), (seqs, rates) in curves.items():
        other = {"GB200": "GB300", "GB300": "GB200"}[gpu]
        for seq, rate in zip(seqs, rates):
            inside.append(rate / _interp_at(seq, seqs, rates))
            o_seqs, o_rates = curves[(other, kind, pass_)]
            held.append(rate / (_interp_at(seq, o_seqs, o_rates) * _peak_of(gpu) / _peak_of(other)))
    return inside, held


def _peak_of(name: str, dtype: str = "bf16") -> float:
    """Dense ``dtype`` peak of a catalogued device, FLOP/s."""
    return catalogue()[name].peak(dtype)


def fused_attention_s(op: OpSpec, device: DeviceSpec) -> float | None:
    """Seconds of a fused-attention ``op`` from the published curves (``None``: no curve for it).

    The sequence length that sets the kernel's efficiency is the shorter of the query and key lengths: a context-
    parallel ring runs blocks of the local length.
    """
    if op.kind != "attention" or op.dtype not in BENCH_DTYPE:
        return None
    blackwell = blackwell_tflops(op, device)
    if blackwell:
        return op.flops / (blackwell * 1e12)
    if op.dtype in LOWP_ATTENTION_DTYPES:
        return None  # fp8 attention is measured only on Blackwell (cuDNN's rows): the caller takes the bf16 rate
    _, _, s_q, s_kv, d = op.shape
    tflops = attention_tflops(op.impl, device, min(s_q, s_kv), op.backward, op.causal, d)
    if not tflops:
        return None
    return op.flops / (tflops * 1e12)
