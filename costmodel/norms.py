"""RMSNorm and LayerNorm kernels priced from their measurements: Transformer Engine's fused norms (Megatron-Core and
NeMo AutoModel) from cuDNN's published norm benchmark, the RMSNorm formula of eager model code (HF, torchtitan
without compile) from our own H100 and H200 runs.

``data/published/cudnn_norms.json`` (NVIDIA/cudnn-frontend ``benchmark/norms``, results of 2026-02-26/27): the
forward and the backward of the norms of nine training models (Llama 3 8B/70B/405B, Llama 4, Mixtral, Nemotron-H,
DeepSeek-V3, Qwen3 30B/235B; rows = batch x sequence tokens, width = the norm's), bf16, timed alone on an H200, a
GB200 and a GB300 under three backends: cuDNN's fused norm, PyTorch's ``F.rms_norm`` (its fused CUDA kernels) and
the same under ``torch.compile``. A fused norm (``OpSpec.impl`` ``fused``: the stacks whose norms Transformer
Engine runs) is priced at cuDNN's rate: Transformer Engine's norms are one fused kernel each pass as cuDNN's are,
and can run cuDNN's (``NVTE_NORM_FWD_USE_CUDNN`` / ``NVTE_NORM_BWD_USE_CUDNN``); no timing of TE's own is
published. A compiled norm (``compiled``: torchtitan under ``torch.compile``) is priced at the ``torch_compile``
rows: inductor's forward runs as fast as cuDNN's, its backward 1.5-2.5x slower.

The rate is the bytes meshplan counts for the op (``OpSpec.bytes``: forward 2, backward 4 bytes-of-dtype a
element) over the measured time, interpolated log-linearly in those bytes between the measured shapes (the median
where several models share one) and held flat beyond them. Other parts take the nearest measured one's rate times
their HBM bandwidth over its: Hopper parts the H200's, B200 the GB200's, B300 the GB300's (the benchmark's PyTorch
rows scaled so to an H100 land within 7% of our own H100 run of the same kernel, ``tests/test_norms.py``). LayerNorm
has one measured shape per part (GPT-3 175B's), so its rate is that one figure at every size.

Eager model code (``OpSpec.impl`` ``eager``: the eager stack) writes RMSNorm as a formula, ``(x.float() *
rsqrt(x.float().pow(2).mean(-1) + eps)).to(dtype) * w`` (HF ``LlamaRMSNorm``; torchtitan's ``RMSNorm`` at 4d88a8a):
an upcast, the square, the row mean, the scale, the downcast and the weight, one kernel each. Its forward was timed by
``bench/gpu_kernels.py`` on one H100 and one H200 (``rms_norm_eager``, ``costmodel/data/measured/nvidia-h1*0.json``,
2026-11-26, at 8192 and 32768 rows of 4096): a Hopper part takes the rate of the same part's run where there is one,
else the H100's scaled by HBM bandwidth. Its backward (autograd through the same chain; not timed) moves twice the
forward's bytes, as every norm's backward here (``OpSpec.bytes``), at the rate the forward reaches at that size. A
part with no run of it has no price here; the pricer then adds the formula's three extra full passes to the norm
kernel (``EAGER_EXTRA_PASSES``).
LayerNorm in eager code is ``nn.LayerNorm``, one fused PyTorch kernel, and takes the kind's default price.
Units: seconds returned, bytes/s inside.
"""
from __future__ import annotations

import statistics
from dataclasses import replace
from functools import lru_cache

from meshplan.costmodel.attention import HOPPER
from meshplan.costmodel.devices import DeviceSpec, catalogue
from meshplan.costmodel.measured import measured_files, published_file
from meshplan.costmodel.ops import OpSpec
from meshplan.costmodel.streaming import interp_by_bytes

DATA_FILE = "cudnn_norms.json"  # in costmodel/data/published
NORM_KINDS = {"rmsnorm": "rms_norm", "layernorm": "layer_norm"}  # OpSpec.kind -> the benchmark's norm_type
MEASURED_DTYPES = ("bf16",)
BACKEND = "cudnn"  # the benchmark's backend a fused norm is priced at (module docstring)
BACKEND_OF = {"fused": BACKEND, "compiled": "torch_compile"}  # OpSpec.impl -> the benchmark backend that prices it
# Our own runs of the eager formula (bench/gpu_kernels.py ``rms_norm_eager``): measurement file -> the part it ran on
EAGER_RUNS = {"nvidia-h100.json": "H100-SXM", "nvidia-h200.json": "H200"}
EAGER_SCALED_FROM = "H100-SXM"  # the run other Hopper parts scale from by HBM bandwidth
# Where no run prices the formula: the norm kernel plus the passes the formula adds over it (upcast, scale, weight),
# counted from the modelling code (transformers ``models/llama/modeling_llama.py``)
EAGER_EXTRA_PASSES = 3


def measured_part(device: DeviceSpec) -> str | None:
    """The part whose timings stand for ``device``'s, or ``None`` (no timing of its family)."""
    if device.name in HOPPER:
        return "H200"
    return {"B200": "GB200", "GB200": "GB200", "B300": "GB300", "GB300": "GB300"}.get(device.name)


def _row_op(kind: str, row: dict, backward: bool) -> OpSpec:
    return OpSpec(kind, (row["N"], row["C"]), "bf16", backward=backward, impl="fused")


@lru_cache(maxsize=None)
def curve(part: str, kind: str, backward: bool, backend: str = BACKEND) -> tuple[tuple[float, float], ...]:
    """((bytes meshplan counts, bytes/s), ...) of the ``backend`` rows of ``kind`` on ``part``, by bytes; one point
    per distinct size (the median time where models share it)."""
    times: dict[float, list[float]] = {}
    for r in published_file(DATA_FILE)["rows"]:
        if (r["device"], r["norm_type"], r["backend"]) == (part, NORM_KINDS[kind], backend):
            nbytes = _row_op(kind, r, backward).bytes
            times.setdefault(nbytes, []).append((r["bwd_ms"] if backward else r["fwd_ms"]) * 1e-3)
    return tuple((b, b / statistics.median(t)) for b, t in sorted(times.items()))


def measured_s(op: OpSpec, device: DeviceSpec) -> float | None:
    """Seconds of a fused norm ``op`` on ``device`` from the benchmark, or ``None`` (not a fused norm, a dtype or a
    part the benchmark has no timing for)."""
    if op.kind not in NORM_KINDS or op.impl not in BACKEND_OF:
        return None
    return backend_s(op, device, BACKEND_OF[op.impl])


def backend_s(op: OpSpec, device: DeviceSpec, backend: str) -> float | None:
    """Seconds of norm ``op`` on ``device`` at the benchmark's ``backend`` rate (its family's part scaled by HBM
    bandwidth), or ``None`` where the benchmark has no timing."""
    part = measured_part(device)
    if op.kind not in NORM_KINDS or op.dtype not in MEASURED_DTYPES or part is None:
        return None
    return _priced_s(op, device, part, curve(part, op.kind, op.backward, backend))


def _priced_s(op: OpSpec, device: DeviceSpec, part: str, pts: tuple[tuple[float, float], ...]) -> float | None:
    """``op``'s bytes at the rate of ``part``'s curve ``pts``, scaled to ``device`` by HBM bandwidth (``None``: no
    points)."""
    if not pts:
        return None
    scale = device.mem_bw_bytes_per_s / catalogue()[part].mem_bw_bytes_per_s
    return op.bytes / (interp_by_bytes(pts, op.bytes) * scale)


def source(op: OpSpec, device: DeviceSpec) -> str:
    """What ``measured_s`` of ``op`` on ``device`` rests on, for ``--explain``."""
    part = measured_part(device)
    scaled = "" if part == device.name else f", scaled by HBM bandwidth to {device.name}"
    who = "cuDNN's fused" if op.impl == "fused" else "torch.compile's"
    return (f"measured: {who} {NORM_KINDS[op.kind].replace('_', '')} on {part} (NVIDIA/cudnn-frontend "
            f"benchmark/norms, costmodel/data/published/{DATA_FILE}){scaled}")


@lru_cache(maxsize=None)
def eager_curve(part: str) -> tuple[tuple[float, float], ...]:
    """((bytes meshplan counts for the forward, bytes/s), ...) of our ``part`` run's eager RMSNorm formula."""
    runs = [f for f, p in EAGER_RUNS.items() if p == part]
    files = measured_files()
    pts = []
    for f in runs:
        for r in files[f]["sections"]["memory"]["records"]:
            if (r["op"], r["variant"]) == ("rms_norm", "eager"):
                nbytes = OpSpec("rmsnorm", tuple(r["shape"]), "bf16", impl="eager").bytes
                pts.append((nbytes, nbytes / (r["median_ms"] * 1e-3)))
    return tuple(sorted(pts))


def eager_s(op: OpSpec, device: DeviceSpec) -> float | None:
    """Seconds of eager code's RMSNorm formula ``op`` on ``device`` from our runs, or ``None`` (another op, dtype, or
    a part none of them stands for)."""
    part = _eager_part(device)
    if op.kind != "rmsnorm" or op.impl != "eager" or op.dtype not in MEASURED_DTYPES or part is None:
        return None
    return _priced_s(op, device, part, eager_curve(part))


def _eager_part(device: DeviceSpec) -> str | None:
    """The part whose run of the eager formula stands for ``device``'s: its own, else the H100's for a Hopper part."""
    if device.name in EAGER_RUNS.values():
        return device.name
    return EAGER_SCALED_FROM if device.name in HOPPER else None


def eager_source(device: DeviceSpec) -> str:
    """What ``eager_s`` on ``device`` rests on, for ``--explain``."""
    part = _eager_part(device)
    scaled = "" if part == device.name else f", scaled by HBM bandwidth to {device.name}"
    return (f"measured: eager code's RMSNorm formula (upcast, square, mean, scale, downcast, weight) on {part} "
            f"(bench/gpu_kernels.py, costmodel/data/measured){scaled}; backward at twice the forward's bytes")


def measured_backward(op: OpSpec, device: DeviceSpec) -> bool:
    """Whether the backward of norm ``op`` on ``device`` has its own measured price (``measured_s`` / ``eager_s`` of
    the backward op), which an estimator takes instead of its twice-the-forward rule for memory-bound ops."""
    bwd = replace(op, backward=True)
    return measured_s(bwd, device) is not None or eager_s(bwd, device) is not None
