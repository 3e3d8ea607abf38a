"""The fastest a memory-bound kernel runs on a part, by the bytes it moves: published streaming-kernel timings.

NVIDIA's AIConfigurator (ai-dynamo/aiconfigurator) times, on each part it supports, the per-tensor static FP8
quantize of an ``m x k`` bf16 tensor under TensorRT-LLM's kernel and vLLM's: one read of 2 B and one write of 1 B
an element and nothing else, from 1 MiB to 6.4 GB moved (``costmodel/data/published/aic_streaming.json``, copied by
``bench/import_aic.py``). What the faster of the two reaches, by the bytes moved, is the rate a streaming
kernel gets there:

| bytes moved | 8-17 MB | 34-67 MB | 67-134 MB | 134-268 MB | 0.5-1.1 GB | 1.1-2.1 GB |
|---|---|---|---|---|---|---|
| H100-SXM, of 3.35 TB/s | 0.94 | 0.86 | 0.87 | 0.89 | 0.91 | 0.91 |
| B200, of 7.67 TB/s | 0.38 | 0.71 | 0.82 | 0.78 | 0.83 | 0.89 |
| GB300, of 8 TB/s | 0.37 | 0.71 | 0.83 | 0.76 | 0.83 | 0.88 |

Hopper streams at 85-91% of its HBM bandwidth from a few MB up; Blackwell, twice the bandwidth over two dies,
reaches that only past a gigabyte, and at the sizes of a training step's activations (an 8k-token micro-batch at
hidden 4096 is 67 MB a bf16 tensor) 70-83%. The cost model's learned memory-bound classes price some kernels faster
than any of these: its elementwise class, extrapolated to Blackwell parts it never saw, at 93-100% of HBM bandwidth,
and on the H100 and H200 at up to 100% between 50 and 400 MB, where our own residual adds of 201 MB measured 73% on
both (``bench/gpu_kernels.py``; ``costmodel/data/measured/nvidia-h100.json``, ``nvidia-h200.json``). So a
memory-bound op (``STREAMING_KINDS``) on a part with these timings is priced no faster than this rate at its own
bytes (``floor_s``); a slower learned price (norms, most casts) stands. Below 1 MiB no floor is set: there the
timings carry the graph's per-kernel gaps more than the kernel.
"""
from __future__ import annotations

import math
import statistics
from functools import lru_cache

from meshplan.costmodel.devices import DeviceSpec
from meshplan.costmodel.measured import published_file
from meshplan.costmodel.ops import OpSpec

DATA_FILE = "aic_streaming.json"  # in costmodel/data/published
SOURCE = ("the faster of TensorRT-LLM's and vLLM's static FP8 quantize kernels timed at the same bytes moved "
          "(ai-dynamo/aiconfigurator scale_matrix tables; costmodel/data/published/aic_streaming.json)")
# Memory-bound op classes whose price is floored: each moves its ``OpSpec.bytes`` through HBM and does little else
STREAMING_KINDS = ("elementwise", "activation", "swiglu", "cast", "copy", "layernorm", "rmsnorm", "softmax")
FLOOR_WORDS = "floored at"  # in a source string: the floor priced the op (``costmodel.api``)
MIN_ROWS = 3  # rows of one kernel an octave of bytes needs for its median to count


def _octave(nbytes: float) -> int:
    return int(math.floor(math.log2(nbytes)))


def kernel_rates(rows: list[list[float]], bytes_per_element: int) -> dict[int, float]:
    """{octave of bytes moved: median achieved bytes/s} of one kernel's ``(m, k, latency_ms)`` rows, octaves with
    at least ``MIN_ROWS`` rows."""
    by = {}
    for m, k, ms in rows:
        nbytes = m * k * bytes_per_element
        by.setdefault(_octave(nbytes), []).append(nbytes / (ms * 1e-3))
    return {o: statistics.median(v) for o, v in sorted(by.items()) if len(v) >= MIN_ROWS}


@lru_cache(maxsize=None)
def curve(part: str) -> tuple[tuple[float, float], ...]:
    """((bytes at the octave's geometric centre, bytes/s), ...) for ``part``, by bytes: per octave the faster
    kernel's median; empty for a part with no timings."""
    data = published_file(DATA_FILE)
    kernels = data["parts"].get(part)
    if not kernels:
        return ()
    rates = [kernel_rates(k["rows"], data["bytes_per_element"]) for k in kernels.values()]
    octaves = sorted(set().union(*rates))
    return tuple((2.0 ** (o + 0.5), max(r[o] for r in rates if o in r)) for o in octaves)


def rate_at(part: str, nbytes: float) -> float | None:
    """Bytes/s a streaming kernel moving ``nbytes`` reaches on ``part`` (log-linear between octave centres, the
    last octave's beyond them); ``None`` for a part with no timings or below the first measured octave."""
    pts = curve(part)
    if not pts or nbytes < pts[0][0] / math.sqrt(2.0):
        return None
    return interp_by_bytes(pts, nbytes)


def interp_by_bytes(pts: tuple[tuple[float, float], ...], nbytes: float) -> float:
    """The rate at ``nbytes`` on a curve of ``(bytes, rate)`` points sorted by bytes: log-linear in bytes between
    points, the end points' rates beyond them."""
    if nbytes <= pts[0][0]:
        return pts[0][1]
    for (b0, r0), (b1, r1) in zip(pts, pts[1:]):
        if nbytes <= b1:
            w = math.log(nbytes / b0) / math.log(b1 / b0)
            return r0 + w * (r1 - r0)
    return pts[-1][1]


def floor_s(op: OpSpec, device: DeviceSpec) -> float | None:
    """Seconds ``op`` takes at least on ``device``: its bytes at the measured streaming rate (``rate_at``), for a
    memory-bound op class; ``None`` where no floor applies."""
    if op.kind not in STREAMING_KINDS or op.is_collective:
        return None
    rate = rate_at(device.name, op.bytes)
    return None if rate is None else op.bytes / rate


def _chosen_rows(part: str) -> list[tuple[float, float]]:
    """(bytes, bytes/s) of the rows of ``part`` whose kernel sets the curve in their octave (the faster one)."""
    data = published_file(DATA_FILE)
    bpe, kernels = data["bytes_per_element"], data["parts"][part]
    rates = {name: kernel_rates(k["rows"], bpe) for name, k in kernels.items()}
    out = []
    for name, k in kernels.items():
        for m, kk, ms in k["rows"]:
            nbytes = m * kk * bpe
            o = _octave(nbytes)
            if o in rates[name] and rates[name][o] == max(r.get(o, 0.0) for r in rates.values()):
                out.append((nbytes, nbytes / (ms * 1e-3)))
    return out


def held_out_ratios(bandwidth: dict[str, float]) -> tuple[list[float], list[float]]:
    """(in sample, one part held out): floor rate / measured rate of every row that sets its part's curve. In
    sample, the part's own curve; held out, the median over the other parts of their curve's share of their HBM
    bandwidth (``bandwidth``: part -> bytes/s) at the same bytes, times this part's."""
    parts = list(published_file(DATA_FILE)["parts"])
    inside, held = [], []
    for part in parts:
        for nbytes, rate in _chosen_rows(part):
            own = rate_at(part, nbytes)
            shares = [r / bandwidth[p] for p in parts if p != part and (r := rate_at(p, nbytes)) is not None]
            if own is None or not shares:
                continue
            inside.append(own / rate)
            held.append(statistics.median(shares) * bandwidth[part] / rate)
    return inside, held
