"""Blackwell MXFP8 grouped GEMMs, and the GB300's GEMMs against the GB200's, from cuDNN frontend's MoE benchmark.

NVIDIA/cudnn-frontend times Transformer Engine's unfused MoE path (``benchmark/cutedsl_fusion_kernels``: a TE grouped
GEMM of MXFP8 inputs, then TE's activation with its MXFP8 quantize; CUDA-graph replay) on a GB200 and a GB300, two
runs each, at 8 experts x 4096 tokens, K 8192, GEMM N 8192 (SwiGLU, GeGLU) or 4096 (the rest)
(``costmodel/data/published/cudnn_moe_grouped_blackwell.json``). A case's GEMM time is its measured path less the
pricer's own price of the memory-bound ops meshplan lists for the same work (``path_ops``: the activation and the
next GEMM's input cast; backward also the routing-probability scale and the activation's backward, at the
estimator's twice-the-forward rule). Two numbers follow:

- the grouped share on Blackwell: the pricer's dense MXFP8 price of the same M x N x K over the GB200's GEMM time,
  median of the forward cases (the backward ones move twice the bytes around the GEMM, which the split prices least
  well). The Hopper share (``costmodel.grouped``, 0.66 at 4096 rows: torch's rowwise ``_scaled_grouped_mm``) is not
  the kernel Transformer Engine runs on Blackwell. Other row counts keep the Hopper curve's shape. The dense MXFP8
  price includes the MXFP8 GEMM's time over the tensor-wise one (``costmodel.te_gemm``), so the share is what
  grouping costs alone: the grouped MXFP8 price stays the measured one, and a tensor-wise or NVFP4 grouped GEMM, priced
  at the same share of its own dense price, runs without MXFP8's 1x32 block scales (NVFP4's dense price carries its
  own), as their dense kernels do. No grouped tensor-wise or NVFP4 kernel is measured here.
- the GB300's speed: the GB200's GEMM time over the GB300's, median of every case. Both parts have the same dense
  peaks and HBM; the GB300 (1,400 W against 1,200 W) runs the same kernels faster, as cuDNN's own attention
  benchmark shows too (``costmodel.attention``). The B300 has no measurement and takes 1.

Held out: the second run of each part (the B200 and B300 result folders, whose device lines say GB200 and GB300).
"""
from __future__ import annotations

import functools
import statistics

from meshplan.costmodel.measured import published_file
from meshplan.costmodel.ops import OpSpec
from meshplan.costmodel.xla_gemm import Price

DATA_FILE = "cudnn_moe_grouped_blackwell.json"  # in costmodel/data/published
EXPERTS, TOKENS, K, N = 8, 4096, 8192, 4096
FORWARD = ("swiglu", "geglu", "srelu")
GATED = ("swiglu", "geglu", "dswiglu", "dgeglu")
PARTS = ("B200", "GB200", "B300", "GB300")  # the parts whose low-precision grouped GEMMs take the Blackwell share
SOURCE = "cuDNN frontend's MoE benchmark (Transformer Engine's MXFP8 grouped GEMM path, GB200 and GB300)"


@functools.lru_cache(maxsize=1)
def runs() -> tuple[dict, ...]:
    """The packaged runs (device, folder, TE path ms per activation), read once per process."""
    return tuple(published_file(DATA_FILE)["runs"])


def gemm_n(act: str) -> int:
    """The GEMM's N: twice the activation width for a forward GLU, else the width."""
    return 2 * N if act in ("swiglu", "geglu") else N


def path_ops(act: str) -> list[tuple[OpSpec, float]]:
    """(op, times) of the memory-bound work around the GEMM, as the op list holds it for the same tensors."""
    m = EXPERTS * TOKENS
    kind = "swiglu" if act in GATED else "activation"
    if act in FORWARD:
        return [(OpSpec(kind, (m * N,), "bf16"), 1.0), (OpSpec("cast", (m * N,), "bf16"), 1.0)]
    out = 2 * N if act in GATED else N
    return [(OpSpec("elementwise", (m * N,), "bf16"), 1.0), (OpSpec(kind, (m * N,), "bf16"), 2.0),
            (OpSpec("cast", (m * out,), "bf16"), 1.0)]


def gemm_s(price: Price, run: dict, act: str) -> float:
    """The GEMM's seconds in one run's case: the measured path less the priced memory-bound ops."""
    rest = sum(t * price(op, run["device"]) for op, t in path_ops(act))
    return run["te_ms"][act] * 1e-3 - rest


def dense_op(act: str) -> OpSpec:
    """The dense MXFP8 GEMM of the case's whole M x N x K."""
    return OpSpec("matmul", (EXPERTS * TOKENS, gemm_n(act), K), "fp8", impl="mxfp8")


def _shares(price: Price, run: dict) -> list[float]:
    return [price(dense_op(a), "GB200") / gemm_s(price, run, a) for a in FORWARD]


def _speeds(price: Price, gb200: dict, gb300: dict) -> list[float]:
    return [gemm_s(price, gb200, a) / gemm_s(price, gb300, a) for a in gb200["te_ms"]]


def _pairs() -> list[tuple[dict, dict]]:
    """(GB200 run, GB300 run) in file order: the first runs of each part, then the second."""
    gb200 = [r for r in runs() if r["device"] == "GB200"]
    gb300 = [r for r in runs() if r["device"] == "GB300"]
    return list(zip(gb200, gb300))


def grouped_share(price: Price) -> float:
    """Dense / grouped MXFP8 GEMM time at 4096 rows per group on Blackwell (first GB200 run's forward cases)."""
    return statistics.median(_shares(price, _pairs()[0][0]))


def gb300_speed(price: Price) -> float:
    """GB200 / GB300 GEMM time on the same cases (first runs)."""
    return statistics.median(_speeds(price, *_pairs()[0]))


def held_out_ratios(price: Price) -> dict[str, tuple[list[float], list[float]]]:
    """{constant: (in sample, held out)} measured / priced ratios: the first runs the constants are medians of,
    and the second runs."""
    (a200, a300), (b200, b300) = _pairs()[:2]
    share, speed = grouped_share(price), gb300_speed(price)
    return {"share": ([s / share for s in _shares(price, a200)], [s / share for s in _shares(price, b200)]),
            "speed": ([s / speed for s in _speeds(price, a200, a300)],
                      [s / speed for s in _speeds(price, b200, b300)])}
