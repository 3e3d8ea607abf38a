"""Feature vectors for the learned latency model: op shape, dtype, FLOPs, bytes, arithmetic intensity,
wave/tile counts and the device vector (peak FLOP/s for the dtype, memory bandwidth, SMs, L2, clock).

Everything is vectorised over rows (numpy) so that the planner can price millions of ops in batch.
The roofline bound used as the model's normaliser is the *ideal* one, time = max(flops / peak, bytes / bw)
(plus the device's measured cost of one op call, ``DeviceSpec.launch_s``, where known: this machine's CPU), so
``latency / roofline >= 1`` for every physical measurement and the model predicts ``log`` of that ratio
(notes/costmodel.md sec. 5.1; Williams, Waterman & Patterson 2009, "Roofline", CACM 52(4)).
"""
from __future__ import annotations

import numpy as np

from meshplan.costmodel.devices import DeviceSpec
from meshplan.costmodel.ops import DTYPE_BYTES
from meshplan.costmodel.roofline import KERNEL_LAUNCH_S, ROOFLINE_EFFICIENCY

# Shape fields of the table per kind (see costmodel.datasets.table): which (b, m, n, k) an OpSpec maps to.
GEMM_KINDS = ("matmul", "bmm", "attention")
ROW_KINDS = ("layernorm", "rmsnorm", "softmax", "embedding")
NUMEL_KINDS = ("elementwise", "activation", "swiglu", "copy", "cast", "optimizer")

# Output-tile edge lengths of cuBLAS/CUTLASS GEMM kernels (NeuSight's ``*_sgemm_128x64`` etc. kernel names):
# the number of tiles and waves (tiles / SMs, rounded up) drives the quantisation effect on efficiency
# (Habitat, ATC'21, sec. 4; NeuSight, ASPLOS'25, sec. 4.2).
TILES = (64, 128)
ROOF_FLOOR_S = 1e-9  # 1 ns: keeps the log ratio finite for FLOP-free ops whose bytes sit in a CPU cache

# Model inputs. The device enters through peak FLOP/s (for the dtype), bandwidth, L2/LLC, the ridge point and the
# SM count inside the wave features. Clock and raw SM count are computed (``DEVICE_EXTRA``) but not fed to the
# trees: no training GPU clocks as high as an H100 except the power-capped T4, so a split on clock sent H100
# queries to T4-like leaves (NeuSight split, H100 bmm 51% -> 21% MAPE without them; BENCHMARKS.md).
DEVICE_EXTRA = ("sm_count", "clock_ghz")
FEATURES = (
    "log2_b", "log2_m", "log2_n", "log2_k", "dtype_bytes",
    "log2_flops", "log2_bytes", "log2_intensity",
    "log2_peak_flops", "log2_bw", "log2_l2", "is_cpu",
    "log2_ridge", "log2_intensity_over_ridge", "log2_t_flops", "log2_t_bytes", "log2_roofline_s",
    "log2_bytes_over_l2",
    "waves_64", "wave_eff_64", "waves_128", "wave_eff_128", "log2_rows_per_sm",
    "align_m64", "align_n64", "align_k64", "align_m8", "align_n8", "align_k8",
)


def dtype_bytes(dtype: np.ndarray) -> np.ndarray:
    return np.array([DTYPE_BYTES.get(d, 2) for d in dtype], dtype=np.float64)


def flops_bytes(op, b, m, n, k, dtype) -> tuple[np.ndarray, np.ndarray]:
    """FLOPs and compulsory bytes per row: the ``costmodel.ops`` formulas (forward ops), vectorised.

    Args:
        op: kinds (array of str); b, m, n, k: shape fields in table convention; dtype: array of str.

    Returns:
        ``(flops, bytes)`` float arrays.
    """
    op = np.asarray(op, dtype=object)
    b, m, n, k = (np.asarray(x, dtype=np.float64) for x in (b, m, n, k))
    e = dtype_bytes(dtype)
    flops = np.zeros(len(op))
    nbytes = np.zeros(len(op))
    sel = lambda *kinds: np.isin(op, kinds)  # noqa: E731
    g = sel("matmul", "bmm")
    flops[g] = 2.0 * b[g] * m[g] * n[g] * k[g]
    nbytes[g] = e[g] * b[g] * (m[g] * k[g] + k[g] * n[g] + m[g] * n[g])
    a = sel("attention")  # b = batch*heads, m = s_q, n = s_kv, k = d_head; causal halves the score FLOPs
    flops[a] = 4.0 * b[a] * m[a] * n[a] * k[a] / 2.0
    nbytes[a] = e[a] * b[a] * k[a] * (2 * m[a] + 2 * n[a])
    r = sel("layernorm", "rmsnorm", "softmax")
    flops[r] = 5.0 * m[r] * n[r]
    nbytes[r] = e[r] * 2.0 * m[r] * n[r]
    el = sel("elementwise")  # binary: two inputs, one output
    flops[el] = m[el]
    nbytes[el] = e[el] * 3.0 * m[el]
    # Unary activations read one tensor and write one (measured unary ops on NeuSight run at 1.1x of this bound).
    ac = sel("activation")
    flops[ac] = m[ac]
    nbytes[ac] = e[ac] * 2.0 * m[ac]
    sw = sel("swiglu")  # fused SiLU(gate) * up over m outputs: reads gate and up, writes the product
    flops[sw] = 5.0 * m[sw]
    nbytes[sw] = e[sw] * 3.0 * m[sw]
    c = sel("copy", "cast")
    flops[c] = m[c]
    nbytes[c] = e[c] * 2.0 * m[c]
    o = sel("optimizer")
    flops[o] = 12.0 * m[o]
    nbytes[o] = 18.0 * m[o]
    em = sel("embedding")
    nbytes[em] = e[em] * 2.0 * m[em] * n[em]
    return flops, nbytes


def peak_for(dev: DeviceSpec, dtype: str) -> float:
    """Peak FLOP/s of the math unit ``dtype`` runs on; bf16/fp16 and tf32/fp32 stand in for each other."""
    for d in (dtype, {"bf16": "fp16", "fp16": "bf16", "tf32": "fp32"}.get(dtype, "fp32"), "fp32"):
        if d in dev.peak_flops:
            return dev.peak_flops[d]
    return max(dev.peak_flops.values())


def device_columns(devices: np.ndarray, dtype: np.ndarray, specs: dict[str, DeviceSpec]) -> dict[str, np.ndarray]:
    """Per-row device vector: peak FLOP/s for the row's dtype, bandwidth, SMs, L2, clock, cpu flag."""
    n = len(devices)
    out = {k: np.empty(n) for k in ("peak", "bw", "sm", "l2", "clock", "is_cpu", "launch")}
    keys = np.char.add(devices.astype(str), np.char.add("|", dtype.astype(str))) if n else np.array([])
    for key in np.unique(keys):
        dev_name, dt = key.split("|")
        dev = specs[dev_name]
        idx = keys == key
        out["peak"][idx] = peak_for(dev, dt)
        out["bw"][idx] = dev.mem_bw_bytes_per_s
        out["sm"][idx] = dev.sm_count
        out["l2"][idx] = dev.l2_bytes
        out["clock"][idx] = dev.clock_hz
        out["is_cpu"][idx] = 1.0 if dev.vendor == "cpu" else 0.0
        out["launch"][idx] = dev.launch_s
    return out


def feature_matrix(op, b, m, n, k, dtype, flops, nbytes, dev: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Build the feature matrix (rows x ``FEATURES``) and the ideal roofline time per row (seconds)."""
    op = np.asarray(op, dtype=object)
    b, m, n, k = (np.maximum(np.asarray(x, dtype=np.float64), 1.0) for x in (b, m, n, k))
    lg = lambda x: np.log2(np.maximum(x, 1e-30))  # noqa: E731
    e = dtype_bytes(dtype)
    t_f = flops / dev["peak"]
    # On a CPU, a working set that fits in the last-level cache has no compulsory DRAM traffic in a warm loop,
    # so only the FLOP bound holds there (measured: 1 in 4 such ops beat bytes / DRAM-bandwidth by > 2x).
    in_llc = (dev["is_cpu"] > 0) & (nbytes <= dev["l2"])
    t_b = np.where(in_llc, 0.0, nbytes / dev["bw"])
    # Plus the device's measured cost of one op call where it is known (CPU: ~1 us of dispatch; 0 for the GPU
    # catalogue): without it a microsecond-scale CPU op's bound is a few nanoseconds, so the trees' ratio for a
    # tiny held-out shape scaled with that meaningless bound (local split: rmsnorm 10.5-11.2% -> 3.8-4.2% MAPE).
    roof = np.maximum(np.maximum(t_f, t_b), ROOF_FLOOR_S) + dev["launch"]
    ridge = dev["peak"] / dev["bw"]
    intensity = np.maximum(flops, 1.0) / np.maximum(nbytes, 1.0)
    sm = dev["sm"]
    cols = {
        "log2_b": lg(b), "log2_m": lg(m), "log2_n": lg(n), "log2_k": lg(k), "dtype_bytes": e,
        "log2_flops": lg(flops + 1.0), "log2_bytes": lg(nbytes + 1.0), "log2_intensity": lg(intensity),
        "log2_peak_flops": lg(dev["peak"]), "log2_bw": lg(dev["bw"]), "sm_count": sm, "log2_l2": lg(dev["l2"]),
        "clock_ghz": dev["clock"] / 1e9, "is_cpu": dev["is_cpu"],
        "log2_ridge": lg(ridge), "log2_intensity_over_ridge": lg(intensity / ridge),
        "log2_t_flops": lg(t_f + 1e-12), "log2_t_bytes": lg(t_b + 1e-12), "log2_roofline_s": lg(roof),
        "log2_bytes_over_l2": lg(nbytes / dev["l2"]),
    }
    gemm = np.isin(op, GEMM_KINDS)
    for t in TILES:
        # GEMM: output tiles of t x t; row-wise / numel ops: one CTA per row or per 1024-element chunk.
        tiles = np.where(gemm, b * np.ceil(m / t) * np.ceil(n / t), np.ceil(b * m / (t * 8)))
        waves = np.ceil(tiles / sm)
        cols[f"waves_{t}"] = lg(waves)
        cols[f"wave_eff_{t}"] = tiles / (waves * sm)
    cols["log2_rows_per_sm"] = lg(b * m / sm)
    for name, x in (("m", m), ("n", n), ("k", k)):
        cols[f"align_{name}64"] = (np.mod(x, 64) == 0).astype(np.float64)
        cols[f"align_{name}8"] = (np.mod(x, 8) == 0).astype(np.float64)
    X = np.column_stack([cols[f] for f in FEATURES]) if len(op) else np.zeros((0, len(FEATURES)))
    return X.astype(np.float32), roof


def wave_quantisation(b, m, n, sm: np.ndarray, tile: tuple[int, int]) -> np.ndarray:
    """Work a GEMM's output tiles really occupy over its ideal work, per row (>= 1).

    The ``b * ceil(m / tm) * ceil(n / tn)`` output tiles of ``tm x tn`` run in ``ceil(tiles / SMs)`` waves and
    every wave costs a full tile per SM, so the FLOP term of the roofline grows by
    ``waves * SMs * tm * tn / (b * m * n)``: padding of partial tiles plus the idle SMs of the last wave
    (Habitat, ATC'21, sec. 4; NeuSight, ASPLOS'25, sec. 4.2: GEMM latency = waves x per-wave time).
    """
    b, m, n = (np.maximum(np.asarray(x, dtype=np.float64), 1.0) for x in (b, m, n))
    tm, tn = tile
    tiles = b * np.ceil(m / tm) * np.ceil(n / tn)
    waves = np.ceil(tiles / sm)
    return waves * sm * tm * tn / (b * m * n)


def calibrated_roofline_s(op, flops: np.ndarray, nbytes: np.ndarray, dev: dict[str, np.ndarray],
                          shape: tuple | None = None, tile: tuple[int, int] | None = None,
                          wave_s: float = 0.0) -> np.ndarray:
    """Roofline with the per-class efficiencies of ``costmodel.roofline.ROOFLINE_EFFICIENCY`` plus the GPU launch
    floor, seconds per row: max(q F / (eff_f peak), B / (eff_b bw)) + launch (notes/costmodel.md sec. 5.7 item 3).

    ``q`` is 1, or with ``tile`` and ``shape = (b, m, n)`` (table convention) the wave quantisation of the GEMM
    rows on the row's own device (:func:`wave_quantisation`). ``wave_s`` > 0 (with ``shape``) adds a fixed cost per
    wave of output tiles on GEMM rows (``ceil(tiles / SMs)`` waves of ``tile``, 128x128 when no tile is given):
    each tile's prologue (first operand loads) and epilogue (C write) do not shrink with a faster SM. Both are the
    unseen-device blend partner of the GEMM classes, chosen by leave-one-signature-out
    (``costmodel.train.unseen_device_weight``).
    """
    op = np.asarray(op, dtype=object)
    eff = np.array([ROOFLINE_EFFICIENCY[o] for o in op]).reshape(-1, 2) if len(op) else np.zeros((0, 2))
    q = 1.0
    if tile is not None and shape is not None:
        q = np.where(np.isin(op, GEMM_KINDS), wave_quantisation(*shape, dev["sm"], tuple(tile)), 1.0)
    t = np.maximum(q * flops / (dev["peak"] * eff[:, 0]), nbytes / (dev["bw"] * eff[:, 1]))
    if wave_s > 0.0 and shape is not None:
        b, m, n = (np.maximum(np.asarray(x, dtype=np.float64), 1.0) for x in shape)
        tm, tn = tuple(tile) if tile is not None else (128, 128)
        waves = np.ceil(b * np.ceil(m / tm) * np.ceil(n / tn) / dev["sm"])
        t = t + np.where(np.isin(op, GEMM_KINDS), wave_s * waves, 0.0)
    return t + np.where(dev["is_cpu"] > 0, dev["launch"], KERNEL_LAUNCH_S)


def device_signature(op, dev: dict[str, np.ndarray]) -> np.ndarray:
    """The two spec figures a class's roofline rests on, per row: ``(SMs, peak FLOP/s)`` for GEMM-like classes,
    ``(bandwidth, L2 bytes)`` for the memory-bound ones. Two devices with the same signature are the same chip
    configuration as far as that class is concerned (A100-PCIe-40GB and -80GB share the GEMM signature but not the
    memory one), so a signature the model trained on is "seen" and any other is an unseen device.
    """
    gemm = np.isin(np.asarray(op, dtype=object), GEMM_KINDS)
    return np.column_stack([np.where(gemm, dev["sm"], dev["bw"]), np.where(gemm, dev["peak"], dev["l2"])])


def signature_seen(sig: np.ndarray, trained: list[list[float]], rtol: float = 0.01) -> np.ndarray:
    """True for rows whose signature matches one in ``trained`` within ``rtol`` (relative, both figures)."""
    seen = np.zeros(len(sig), dtype=bool)
    for a, b in trained:
        seen |= (np.abs(sig[:, 0] / a - 1) <= rtol) & (np.abs(sig[:, 1] / b - 1) <= rtol)
    return seen


def blend(roof_s: np.ndarray, log_ratio: np.ndarray, cal_s: np.ndarray, w) -> np.ndarray:
    """Unseen-device prediction, seconds: ``cal^(1-w) * learned^w`` (``w`` a number or one per row), never below
    the ideal roofline."""
    log_learned = np.log(roof_s) + np.maximum(log_ratio, 0.0)
    return np.maximum(np.exp(w * log_learned + (1.0 - w) * np.log(cal_s)), roof_s)
