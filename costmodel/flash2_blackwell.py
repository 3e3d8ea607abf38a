"""FlashAttention-2 on Blackwell, and how much faster a GB200 runs the B200's die, from cuDNN frontend's artifacts.

PyTorch SDPA's flash backend is FlashAttention-2: what torchtitan's December 2024 code ran, and what SDPA runs on an
older torch or outside sm90 / sm100 / sm103 (``costmodel.attention.sdpa_backend``). Its kernels issue Ampere-style
``mma.sync``, not Blackwell's ``tcgen05`` tensor-core instructions: on a B200 at 32k tokens it ran at 404 TFLOP/s
forward where PyTorch's cuDNN backend ran at 1,419 in the same run, 18% of the bf16 peak. NVIDIA's cuDNN frontend
timed both in ``benchmark/sdpa_benchmark_training/artifacts``
(``costmodel/data/published/sdpa_artifacts_blackwell.json``): a B200 and a GB300 in one container (cudnn-frontend
v1.15 release, commit 0b1577c, 2025-10-10, torch nv25.09) and a GB200 and a GB300 in a later one (v1.17, commit
b372d39, 2025-12-19, torch nv25.11). One shape, 128 query heads, 8 KV heads, head dim 128, causal, batch 1, 512 to
131,072 tokens; the script sleeps after every call "to avoid GPU throttling", so the rates are one-shot, as every
other kernel price here.

- The later container's PyTorch runs FlashAttention-2 much faster at short lengths: the GB300, run in both, went
  from 58.6 to 165 TFLOP/s forward at 512 tokens and 1.06x as fast at 4k, while from 16k on the two runs agree
  within 0.6% forward and 1.8% backward. So the curves are the later container's: the GB200's and GB300's own.
- Die speed: FlashAttention-2's rate is bound by ``mma.sync`` issue, so it runs as fast as the die's SMs and clock.
  The GB200 is the B200's die at a higher power limit and clock: from 16k tokens on it ran FlashAttention-2 1.08x as
  fast as the B200 forward and backward (1.083 and 1.085), where the datasheets' bf16 peaks say 1.11 (2.5 against 2.25
  PFLOP/s). The B200 takes the GB200's FlashAttention-2 and cuDNN curves at that speed (``costmodel.attention``);
  the B300, with no run, the GB300's at the bf16 peaks' ratio, and the source says so. A GB200 GEMM runs no faster
  than the B200's at the pooled forward and backward speed, 1.084 (``costmodel.api``): the learned model carries
  the peaks' 1.11 into compute-bound GEMMs.
- The mask and a head dim of 64 take the H100 FlashAttention-2 curves' ratios at the same length (FlashAttention-3
  paper Fig. 5-6), the same kernel code. FlashAttention-3 needs Hopper's ``wgmma`` (sm_90a): on Blackwell the
  FlashAttention package runs its FlashAttention-2 kernels, priced so. FlexAttention takes FlashAttention-2's rate
  times the Hopper shares (PyTorch blog), as on Hopper: no Blackwell measurement of it is published.
"""
from __future__ import annotations

import functools
import statistics
from types import MappingProxyType
from typing import Mapping

from meshplan.costmodel.devices import catalogue
from meshplan.costmodel.measured import published_file

DATA_FILE = "sdpa_artifacts_blackwell.json"  # in costmodel/data/published
SOURCE = "NVIDIA/cudnn-frontend sdpa_benchmark_training artifacts"
BACKEND = "pyt_flash_attention"  # PyTorch SDPA's flash backend: FlashAttention-2
# each part's newest run (commit): the curves price from the later container; the B200 ran only in the earlier one
NEWEST_RUN = {"B200": "0b1577c", "GB200": "b372d39", "GB300": "b372d39"}
# part -> the NVL72 part whose FlashAttention-2 curve prices it (itself where its newest run is the later container)
CURVE_PART = {"GB200": "GB200", "GB300": "GB300", "B200": "GB200", "B300": "GB300"}
# the die speed is read where the kernel runs at its plateau and the two containers agree (module docstring)
DIE_SPEED_MIN_SEQ = 16384


@functools.lru_cache(maxsize=1)
def curves() -> Mapping[tuple, tuple]:
    """``{(gpu, commit, backend, pass): ((seq, ...), (TFLOP/s, ...))}`` of the packaged runs (read once, handed out
    read-only), rates as the CSVs give them (meshplan counts the same FLOPs: 4 b h s^2 d, halved when causal,
    backward 2.5x)."""
    points: dict = {}
    for r in published_file(DATA_FILE)["rows"]:
        for pass_ in ("fwd", "bwd"):
            key = (r["gpu"], r["commit"], r["backend"], pass_)
            points.setdefault(key, {})[r["seq"]] = r[f"{pass_}_tflops"]
    return MappingProxyType({k: (tuple(sorted(v)), tuple(v[s] for s in sorted(v))) for k, v in points.items()})


def curve_part(device_name: str) -> str | None:
    """The part whose FlashAttention-2 curve prices ``device_name``'s (``None``: not a Blackwell part)."""
    return CURVE_PART.get(device_name)


def _plateau_ratios(part: str, over: str, pass_: str, backend: str = BACKEND) -> dict[int, float]:
    """Length -> ``part``'s rate of ``backend`` over ``over``'s, each in its newest run, at the lengths of at least
    ``DIE_SPEED_MIN_SEQ`` tokens."""
    other = dict(zip(*curves()[(over, NEWEST_RUN[over], backend, pass_)]))
    seqs, rates = curves()[(part, NEWEST_RUN[part], backend, pass_)]
    return {s: x / other[s] for s, x in zip(seqs, rates) if s >= DIE_SPEED_MIN_SEQ and s in other}


@functools.lru_cache(maxsize=64)
def die_speed(part: str, over: str, backward: bool, backend: str = BACKEND) -> float:
    """How many times as fast ``part`` ran ``backend`` as ``over`` did: the median of the plateau ratios."""
    return statistics.median(_plateau_ratios(part, over, "bwd" if backward else "fwd", backend).values())


@functools.lru_cache(maxsize=1)
def gemm_die_speed() -> float:
    """The GB200's die speed over the B200 for its GEMMs (``costmodel.api``): the median of the forward and backward
    plateau ratios pooled."""
    return statistics.median([r for pass_ in ("fwd", "bwd") for r in _plateau_ratios("GB200", "B200", pass_).values()])


def sibling_speed(device_name: str, backward: bool) -> float:
    """What carries ``curve_part(device_name)``'s rate to ``device_name``: 1 on itself; the die speed
    FlashAttention-2 measured where the part ran too (B200); else the ratio of bf16 peaks (B300: no run)."""
    part = CURVE_PART[device_name]
    if part == device_name:
        return 1.0
    if device_name in NEWEST_RUN:
        return die_speed(device_name, part, backward)
    return catalogue()[device_name].peak("bf16") / catalogue()[part].peak("bf16")


def flash2_points(device_name: str, backward: bool) -> tuple[tuple, tuple] | None:
    """(sequence lengths, TFLOP/s) of FlashAttention-2 causal d128 on ``device_name`` (``None`` off Blackwell)."""
    part = curve_part(device_name)
    if part is None:
        return None
    seqs, rates = curves()[(part, NEWEST_RUN[part], BACKEND, "bwd" if backward else "fwd")]
    scale = sibling_speed(device_name, backward)
    return seqs, tuple(x * scale for x in rates)


def speed_words(device_name: str) -> str:
    """How the curve part's rate is carried to ``device_name``, in words ('' on the part itself)."""
    part = CURVE_PART[device_name]
    if part == device_name:
        return ""
    if device_name in NEWEST_RUN:
        return f"scaled by the die speed FlashAttention-2 measured on both to {device_name} ({SOURCE})"
    return f"no run on the {device_name}: scaled by bf16 peak"


def source_words(device_name: str) -> str:
    """What a FlashAttention-2 price on a Blackwell part rests on, in words."""
    part = CURVE_PART[device_name]
    out = f"PyTorch SDPA FlashAttention-2 measured on {part} ({SOURCE} @ {NEWEST_RUN[part]})"
    speed = speed_words(device_name)
    return f"{out}, {speed}" if speed else out


def held_out_ratios() -> tuple[list[float], list[float]]:
    """(in sample, held out) priced / measured rate of the B200's FlashAttention-2 at the plateau lengths, forward
    and backward: the GB200's rate over the die speed from every such length, and from the others only."""
    inside, held = [], []
    for pass_ in ("fwd", "bwd"):
        ratios = _plateau_ratios("GB200", "B200", pass_)
        speed = statistics.median(ratios.values())
        for s, r in ratios.items():
            inside.append(r / speed)
            held.append(r / statistics.median(v for t, v in ratios.items() if t != s))
    return inside, held
