"""Hybrid-EP's token dispatch and combine over NVLink, from NVIDIA's published kernel bandwidths.

``data/published/hybridep_bandwidth.json`` (deepseek-ai/DeepEP branch ``hybrid-ep`` @ 94a9f8f,
``docs/README_Hybrid-EP.md``): per-GPU algorithm bandwidth of Hybrid-EP's dispatch and combine, 4096 tokens per
rank, hidden 7168, top-8, on B200 (8 ranks, one NVLink node) and GB200 (8-36 ranks, one NVL72 domain), at 16 and 32
SMs. The "Kernel Only" rows at the SMs a job gives Hybrid-EP (the layout's ``hybridep_sms``: Megatron-Core's
``moe_hybridep_num_sms``, 16 in its ``TransformerConfig`` of core_r0.16.0 and core_v0.17.0; Megatron-Bridge's
performance scripts set 32) are the measurement: the mean of the bf16 dispatch and the combine figure (a step sends
one of each), as a share of NVLink5's 900 GB/s per direction (NVIDIA DGX B200 datasheet). An SM count the table has
no row for takes the nearest measured one below it (16 below 16), and ``explain`` says so. The RDMA side is the H100
rows' line rate, as DeepEP's (``planner.cluster.spec.ClusterSpec.alltoall_link``).
"""
from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

HYBRIDEP_FILE = "data/published/hybridep_bandwidth.json"
NVLINK5_BYTES_PER_S = 900e9  # NVIDIA DGX B200 datasheet: 1.8 TB/s GPU-to-GPU, 900 GB/s per direction
DEFAULT_SMS = 16  # megatron-core core_r0.16.0 / core_v0.17.0 TransformerConfig.moe_hybridep_num_sms


def published_rows() -> list[dict]:
    """The file's rows, as transcribed."""
    text = resources.files("meshplan.costmodel").joinpath(HYBRIDEP_FILE).read_text(encoding="utf-8")
    return json.loads(text)["rows"]


def nvlink_rows() -> list[dict]:
    """Hybrid-EP's kernel-only rows measured over NVLink (B200, GB200; the H100 rows are InfiniBand's)."""
    return [r for r in published_rows() if (r["impl"], r["measurement"]) == ("hybridep", "kernel_only")
            and r["device"] in ("B200", "GB200")]


def measured_sms() -> tuple[int, ...]:
    """The SM counts the NVLink rows were measured at."""
    return tuple(sorted({r["sm_count"] for r in nvlink_rows()}))


def table_sms(sms: int) -> int:
    """The measured SM count that stands for ``sms``: the largest measured not above it (the smallest below all)."""
    counts = measured_sms()
    fit = [k for k in counts if k <= sms]
    return max(fit) if fit else min(counts)


@lru_cache(maxsize=None)
def nvlink_shares(sms: int = DEFAULT_SMS) -> dict[int, float]:
    """Rank count -> achieved share of NVLink5 per direction: Hybrid-EP, kernel only, NVLink rows at the measured SM
    count standing for ``sms`` (``table_sms``), mean of (bf16 dispatch + combine) / 2 over the devices measured at
    that rank count."""
    at = table_sms(sms)
    by_ranks: dict[int, list[float]] = {}
    for r in nvlink_rows():
        if r["sm_count"] == at:
            gbps = (r["dispatch_bf16_GBps"] + r["combine_GBps"]) / 2
            by_ranks.setdefault(r["ranks"], []).append(gbps * 1e9 / NVLINK5_BYTES_PER_S)
    return {k: sum(v) / len(v) for k, v in sorted(by_ranks.items())}


def hybridep_nvlink_share(ep: int, sms: int = DEFAULT_SMS) -> float:
    """Share of nominal NVLink Hybrid-EP reaches at ``ep`` ranks on ``sms`` SMs: the largest measured rank count not
    above ``ep`` (the smallest below 8); above 36 ranks, half an NVL72 rack, nothing is published and the 36-rank
    share holds."""
    shares = nvlink_shares(sms)
    fit = [k for k in shares if k <= ep]
    return shares[max(fit) if fit else min(shares)]


def measured_range(sms: int = DEFAULT_SMS) -> tuple[int, int]:
    """(fewest, most) ranks the NVLink share was measured at, for ``--explain``."""
    shares = nvlink_shares(sms)
    return min(shares), max(shares)


def explain(ep: int, crosses_nodes: bool, sms: int = DEFAULT_SMS) -> tuple[str, str]:
    """(what the EP dispatch is priced from, what no measurement covers: '' where all is measured) for ``--explain``."""
    hi, at = measured_range(sms)[1], table_sms(sms)
    devices = "/".join(sorted({r["device"] for r in nvlink_rows() if r["sm_count"] == at}))
    basis = (f"Hybrid-EP NVLink at {hybridep_nvlink_share(ep, sms):.3f} of 900 GB/s: deepseek-ai/DeepEP hybrid-ep @ "
             f"94a9f8f docs/README_Hybrid-EP.md, {devices} kernel-only bf16 dispatch and combine at {at} SMs")
    gaps = []
    if at != sms:
        gaps.append(f"Hybrid-EP on {sms} SMs: no row at that count; the {at}-SM rows are taken")
    if ep > hi:
        gaps.append(f"EP {ep} is above the {hi} ranks measured; the {hi}-rank share is taken")
    if crosses_nodes:
        gaps.append("no Blackwell RDMA row is published; the NICs run at line rate as DeepEP's (H100/H800 rows)")
    return basis, "; ".join(gaps)
