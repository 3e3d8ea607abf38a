"""The calibrated roofline: an operator's time from its FLOPs and bytes on a device, with per-class efficiencies.

time = max(flops / (peak * eff_flops), bytes / (bw * eff_bw)) + the launch floor. The learned model predicts a
ratio over the *ideal* roofline (100% of peak and bandwidth) and falls back to this calibrated one outside its
trained range; with no learned model this prices every compute op. Collectives: the alpha-beta ring model of
``costmodel.collectives``.
"""
from __future__ import annotations

from meshplan.costmodel.collectives import Link, collective_time_s
from meshplan.costmodel.devices import DeviceSpec
from meshplan.costmodel.ops import OpSpec, ssd_bytes

# Fraction of peak FLOP/s and of peak memory bandwidth reached by each op class on large shapes.
# Physical constants, not fitted to any single benchmark row:
#  - matmul 0.75 FLOP efficiency: the median of Vidur's measured fp16 Llama-2 GEMMs at 4096 tokens is 0.76 of
#    dense peak on A100 and 0.72 on H100 (data/kernels/vidur compute/*/mlp.csv, TP 1-8 shard shapes).
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
    "swiglu": (0.80, 0.80),
    "embedding": (0.80, 0.60),
    "optimizer": (0.80, 0.80),
    "copy": (0.80, 0.80),
    "cast": (0.80, 0.80),
    # Mamba-2 SSD (mamba_ssm's chunked-scan kernels): what its chunk-scan forward kernel reached, timed on H800
    # (tile-ai/tilelang benchmark/mamba2 @ be9c08f, autotuned: 1.278 ms at b 8, H 80, T 8192, P 64, N 128,
    # Q 256; costmodel/data/published/ssd_chunk_scan_h800.json): the median over its six sequence lengths is
    # 13.5% of the fp16 peak and 41% of HBM bandwidth at once. Neither unit is the limit: the per-element decay
    # exp(dA_i - dA_j), the causal mask and the small Q x P tiles hold it to that rate. The same fractions are
    # taken for the other SSD kernels (small GEMMs and scans of the same structure) and for other GPUs, where no
    # timing of these kernels is published (SSD_SOURCE says so).
    "ssd": (0.135, 0.41),
}
KERNEL_LAUNCH_S = 4e-6  # floor per kernel on a GPU (CUDA launch + tail), seconds


def roofline_s(op: OpSpec, device: DeviceSpec, ideal: bool = False) -> float:
    """Roofline time of a compute op, seconds. ``ideal`` uses 100% of peak and bandwidth (the lower bound)."""
    eff_f, eff_b = (1.0, 1.0) if ideal else ROOFLINE_EFFICIENCY[op.kind]
    dtype = op.dtype if op.dtype in device.peak_flops else ("fp32" if "fp32" in device.peak_flops else op.dtype)
    t_flops = op.flops / (device.peak(dtype) * eff_f)
    nbytes = ssd_bytes(op, device.l2_bytes) if op.kind == "ssd" else op.bytes  # its heads' rereads past L2
    t_bytes = nbytes / (device.mem_bw_bytes_per_s * eff_b)
    return max(t_flops, t_bytes)


def roofline_predict(op: OpSpec, device: DeviceSpec, link: Link | None = None) -> float:
    """The calibrated roofline / alpha-beta price alone, seconds (no learned model)."""
    if op.is_collective:
        if link is None:
            raise ValueError(f"collective {op.kind} needs a link to be priced")
        return collective_time_s(op.kind, op.bytes, op.group_size, link)
    t = roofline_s(op, device)
    return t + (KERNEL_LAUNCH_S if device.vendor != "cpu" else device.launch_s)
