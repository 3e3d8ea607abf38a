"""Hybrid-EP's token dispatch and combine over NVLink, from NVIDIA's published kernel bandwidths.

``data/published/hybridep_bandwidth.json`` (deepseek-ai/DeepEP branch ``hybrid-ep`` @ 94a9f8f,
``docs/README_Hybrid-EP.md``): per-GPU algorithm bandwidth of Hybrid-EP's dispatch and combine, 4096 tokens per
rank, hidden 7168, top-8, on B200 (8 ranks, one NVLink node) and GB200 (8-36 ranks, one NVL72 domain). Megatron-Core
runs Hybrid-EP on ``moe_hybridep_num_sms`` = 16 SMs by default (megatron-core 0.16.1 ``TransformerConfig``), so the
16-SM "Kernel Only" rows are the measurement: the mean of the bf16 dispatch and the combine figure (a step sends one
of each), as a share of NVLink5's 900 GB/s per direction (NVIDIA DGX B200 datasheet). The RDMA side is the H100
rows' line rate, as DeepEP's (``planner.cluster.spec.ClusterSpec.alltoall_link``).
"""
from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

HYBRIDEP_FILE = "data/published/hybridep_bandwidth.json"
NVLINK5_BYTES_PER_S = 900e9  # NVIDIA DGX B200 datasheet: 1.8 TB/s GPU-to-GPU, 900 GB/s per direction
DEFAULT_SMS = 16  # megatron-core 0.16.1 TransformerConfig.moe_hybridep_num_sms


def published_rows() -> list[dict]:
    """The file's rows, as transcribed."""
    text = resources.files("meshplan.costmodel").joinpath(HYBRIDEP_FILE).read_text(encoding="utf-8")
    return json.loads(text)["rows"]


@lru_cache(maxsize=1)
def nvlink_shares() -> dict[int, float]:
    """Rank count -> achieved share of NVLink5 per direction: Hybrid-EP, 16 SMs, kernel only, NVLink rows,
    mean of (bf16 dispatch + combine) / 2 over the devices measured at that rank count."""
    by_ranks: dict[int, list[float]] = {}
    for r in published_rows():
        if (r["impl"], r["measurement"], r["sm_count"]) == ("hybridep", "kernel_only", DEFAULT_SMS) \
                and r["device"] in ("B200", "GB200"):
            gbps = (r["dispatch_bf16_GBps"] + r["combine_GBps"]) / 2
            by_ranks.setdefault(r["ranks"], []).append(gbps * 1e9 / NVLINK5_BYTES_PER_S)
    return {k: sum(v) / len(v) for k, v in sorted(by_ranks.items())}


def hybridep_nvlink_share(ep: int) -> float:
    """Share of nominal NVLink Hybrid-EP reaches at ``ep`` ranks: the largest measured rank count not above ``ep``
    (the smallest below 8); above 36 ranks, half an NVL72 rack, nothing is published and the 36-rank share holds."""
    shares = nvlink_shares()
    fit = [k for k in shares if k <= ep]
    return shares[max(fit) if fit else min(shares)]


def measured_range() -> tuple[int, int]:
    """(fewest, most) ranks the NVLink share was measured at, for ``--explain``."""
    shares = nvlink_shares()
    return min(shares), max(shares)


def explain(ep: int, crosses_nodes: bool) -> tuple[str, str]:
    """(what the EP dispatch is priced from, what no measurement covers: '' where all is measured) for ``--explain``."""
    lo, hi = measured_range()
    basis = (f"Hybrid-EP NVLink at {hybridep_nvlink_share(ep):.3f} of 900 GB/s: deepseek-ai/DeepEP hybrid-ep @ 94a9f8f "
             f"docs/README_Hybrid-EP.md, B200/GB200 kernel-only bf16 dispatch and combine at {DEFAULT_SMS} SMs")
    gaps = []
    if ep > hi:
        gaps.append(f"EP {ep} is above the {hi} ranks measured; the {hi}-rank share is taken")
    if crosses_nodes:
        gaps.append("no Blackwell RDMA row is published; the NICs run at line rate as DeepEP's (H100/H800 rows)")
    return basis, "; ".join(gaps)
