"""``predict(op, device)``: the one entry point the planner and the replay use to price an operator.

Until a learned model is loaded (``costmodel.learned``), compute ops are priced by a roofline with a
per-op-class efficiency (``ROOFLINE_EFFICIENCY``): time = max(flops / (peak * eff_flops), bytes / (bw * eff_bw)).
The learned model predicts a ratio over this roofline bound and is clipped so it never predicts below
the ideal roofline (peak, full bandwidth).
"""
from __future__ import annotations

from contextlib import contextmanager
from functools import lru_cache

from meshplan.costmodel.collectives import Link, collective_time_s
from meshplan.costmodel.devices import DeviceSpec
from meshplan.costmodel.ops import OpSpec

# Fraction of peak FLOP/s and of peak memory bandwidth reached by each op class on large shapes.
# Physical constants, not fitted to any single benchmark row:
#  - matmul 0.75 FLOP efficiency: the median of Vidur's measured fp16 Llama-2 GEMMs at 4096 tokens is 0.76 of
#    dense peak on A100 and 0.72 on H100 (../shared/kernels/vidur compute/*/mlp.csv, TP 1-8 shard shapes).
#  - bmm 0.70: batched GEMMs with small per-head matrices run below large GEMMs.
#  - attention 0.60: FlashAttention-2 forward+backward reaches 50-70% of peak on A100 (Dao 2023, Fig. 4-6).
#  - memory-bound ops 0.80 of HBM bandwidth: STREAM-like kernels on HBM2e/HBM3 (Jia et al. 2018,
#    "Dissecting the NVIDIA Volta GPU Architecture via Microbenchmarking", Table 3.1: ~85% of peak).
ROOFLINE_EFFICIENCY: dict[str, tuple[float, float]] = {
    # kind: (flop efficiency, bandwidth efficiency)
    "matmul": (0.75, 0.80),
    "bmm": (0.70, 0.80),
    "attention": (0.60, 0.80),
    "layernorm": (0.80, 0.80),
    "rmsnorm": (0.80, 0.80),
    "softmax": (0.80, 0.80),
    "elementwise": (0.80, 0.80),
    "activation": (0.80, 0.80),
    "embedding": (0.80, 0.60),
    "optimizer": (0.80, 0.80),
    "copy": (0.80, 0.80),
    "cast": (0.80, 0.80),
}
KERNEL_LAUNCH_S = 4e-6  # floor per kernel on a GPU (CUDA launch + tail), seconds


def roofline_s(op: OpSpec, device: DeviceSpec, ideal: bool = False) -> float:
    """Roofline time of a compute op, seconds. ``ideal`` uses 100% of peak and bandwidth (the lower bound)."""
    eff_f, eff_b = (1.0, 1.0) if ideal else ROOFLINE_EFFICIENCY[op.kind]
    dtype = op.dtype if op.dtype in device.peak_flops else ("fp32" if "fp32" in device.peak_flops else op.dtype)
    t_flops = op.flops / (device.peak(dtype) * eff_f)
    t_bytes = op.bytes / (device.mem_bw_bytes_per_s * eff_b)
    return max(t_flops, t_bytes)


def predict(op: OpSpec, device: DeviceSpec, link: Link | None = None) -> float:
    """Predicted latency of ``op`` on ``device``, seconds.

    Uses the learned model (``active_model()``: the one loaded with ``load_model``, else the shipped default)
    when there is one; the calibrated roofline otherwise, and for ops outside the model's trained range
    (``predict_with_source`` says which was used).

    Args:
        op: The operator instance.
        device: Where it runs.
        link: For collectives, the slowest link the group crosses (required for collectives).
    """
    return predict_with_source(op, device, link)[0]


def roofline_predict(op: OpSpec, device: DeviceSpec, link: Link | None = None) -> float:
    """The calibrated roofline / alpha-beta price alone, seconds (no learned model)."""
    if op.is_collective:
        if link is None:
            raise ValueError(f"collective {op.kind} needs a link to be priced")
        return collective_time_s(op.kind, op.bytes, op.group_size, link)
    t = roofline_s(op, device)
    return t + (KERNEL_LAUNCH_S if device.vendor != "cpu" else device.launch_s)


# --- learned model (additive: costmodel.learned / costmodel.collective_model) -------------------------------
_UNSET = object()
_model = _UNSET  # LearnedModel, None (roofline only) or _UNSET (load the shipped default on first use)


def shipped_model_dir():
    """Folder of the default model shipped in the package (``costmodel/data/model``)."""
    from importlib import resources

    return resources.files("meshplan.costmodel").joinpath("data/model")


def load_model(directory=None):
    """Load a model folder (``None``: the shipped default) and make it the active one. Returns it.

    Raises:
        MeshplanError: corrupt or missing model (checksum verified).
    """
    global _model
    from meshplan.costmodel.learned import LearnedModel

    _model = LearnedModel.load(directory if directory is not None else shipped_model_dir())
    _cached.cache_clear()
    return _model


@contextmanager
def using_model(directory):
    """Price with the model in ``directory`` inside the block, then restore the model active before.

    Raises:
        MeshplanError: corrupt or missing model (checksum verified).
    """
    global _model
    before = _model
    load_model(directory)
    try:
        yield _model
    finally:
        _model = before
        _cached.cache_clear()


def set_roofline_only() -> None:
    """Disable the learned model: every price comes from the calibrated roofline / alpha-beta."""
    global _model
    _model = None
    _cached.cache_clear()


def active_model():
    """The active ``LearnedModel``; loads the shipped default on first use (``None`` if none is shipped)."""
    global _model
    if _model is _UNSET:
        from pathlib import Path

        d = Path(str(shipped_model_dir()))
        _model = load_model(d) if (d / "metadata.json").is_file() else None
    return _model


def collective_model():
    """The active model's fitted collective model, or ``None``."""
    m = active_model()
    return m.collective_model() if m is not None else None


@lru_cache(maxsize=200_000)
def _cached(op: OpSpec, device: DeviceSpec) -> tuple[float, str]:
    sec, src = active_model().predict_ops([op], device)
    return float(sec[0]), str(src[0])


def predict_with_source(op: OpSpec, device: DeviceSpec, link: Link | None = None) -> tuple[float, str]:
    """``(seconds, source)``: source is ``learned``, ``roofline (...)`` or ``alpha-beta``/``learned collective``."""
    if op.is_collective:
        if link is None:
            raise ValueError(f"collective {op.kind} needs a link to be priced")
        if collective_model() is None:
            return collective_time_s(op.kind, op.bytes, op.group_size, link), "alpha-beta"
        from meshplan.costmodel.collective_model import predict_collective

        return predict_collective(op.kind, op.bytes, op.group_size, link), "learned collective"
    if active_model() is None:
        return roofline_predict(op, device), "roofline (no learned model)"
    return _cached(op, device)


def predict_batch(ops: list[OpSpec], device: DeviceSpec | list[DeviceSpec]):
    """Latency (s) of many compute ops at once (numpy array); the fast path for the planner.

    Falls back to the roofline per op when no model is active.
    """
    import numpy as np

    m = active_model()
    if m is None:
        devs = device if isinstance(device, list) else [device] * len(ops)
        return np.array([roofline_predict(o, d) for o, d in zip(ops, devs)])
    return m.predict_ops(ops, device)[0]


def predictor_name() -> str:
    """What prices compute ops now, for plan provenance: ``learned:<model id>`` or ``roofline``."""
    m = active_model()
    if m is None:
        return "roofline"
    return f"learned:{m.model_id}"
