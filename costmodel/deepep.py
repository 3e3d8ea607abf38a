"""DeepEP's token dispatch and combine over Blackwell's NVLink, from the bandwidths DeepEP's own API reached there.

``data/published/hybridep_bandwidth.json`` (deepseek-ai/DeepEP branch ``hybrid-ep`` @ 94a9f8f,
``docs/README_Hybrid-EP.md``) also times DeepEP, through its PyTorch API as Megatron-Core and NeMo AutoModel call it
(``Buffer.dispatch`` / ``combine`` returning tensors), at the README's 4096 tokens per rank, hidden 7168, top-8: on a
B200 node (8 ranks, 16-48 SMs) and inside one GB200 NVL72 domain (8, 16 and 24 ranks; 16, 24 and 32 SMs). Past one
8-GPU node its normal kernels lose much of NVLink 5 (at 24 ranks on 32 SMs the combine runs 207 GB/s against 519
at 8), which NCCL's ring efficiency, what a DeepEP transfer inside NVLink was priced at before, does not show.

A job's DeepEP runs on ``SMS`` SMs: ``Buffer.num_sms`` is 20 in DeepEP, and Megatron-Core sets the same
(``TransformerConfig.moe_deepep_num_sms``, core_r0.16.0 to core_v0.17.0); NeMo AutoModel keeps DeepEP's. The share of
900 GB/s per direction (NVIDIA DGX B200 datasheet) is the mean of the bf16 dispatch and the combine figure (a step
sends one of each), averaged over the parts measured at that rank count, taken at 20 SMs along the straight line
between the measured SM counts on each side (both kernels' bandwidth grows with their SMs along every measured row).
A rank count the table lacks takes the largest measured one not above it (8 below 8); above 24 ranks the 24-rank
share holds, and ``--explain`` says so. Hopper's NVLink keeps NCCL's efficiency: DeepEP's intranode kernels on
H800 reach 153 and 158 of its ~160 GB/s (DeepEP README), within NCCL's 0.80.
"""
from __future__ import annotations

from functools import lru_cache

from meshplan.costmodel.hybridep import NVLINK5_BYTES_PER_S, published_rows

SMS = 20  # DeepEP's Buffer.num_sms, Megatron-Core's moe_deepep_num_sms (module docstring)
PARTS = ("B200", "B300", "GB200", "GB300")  # NVLink 5: the parts the Blackwell rows price
SOURCE = "deepseek-ai/DeepEP hybrid-ep @ 94a9f8f docs/README_Hybrid-EP.md, DeepEP's torch-API rows"


def rows() -> list[dict]:
    """DeepEP's rows of the file (B200 node, GB200 NVL72 domain), as transcribed."""
    return [r for r in published_rows() if r["impl"] == "deepep"]


def _share(row: dict) -> float:
    return (row["dispatch_bf16_GBps"] + row["combine_GBps"]) / 2 * 1e9 / NVLINK5_BYTES_PER_S


def _at_sms(points: dict[int, float], sms: int) -> float:
    """The share at ``sms`` SMs on the line between the measured counts either side (the nearest end outside)."""
    counts = sorted(points)
    lo = max((c for c in counts if c <= sms), default=counts[0])
    hi = min((c for c in counts if c >= sms), default=counts[-1])
    if lo == hi:
        return points[lo]
    return points[lo] + (points[hi] - points[lo]) * (sms - lo) / (hi - lo)


@lru_cache(maxsize=None)
def nvlink_shares(sms: int = SMS) -> dict[int, float]:
    """Rank count -> DeepEP's share of NVLink 5 per direction at ``sms`` SMs, averaged over the parts measured."""
    by_part: dict[tuple[int, str], dict[int, float]] = {}
    for r in rows():
        by_part.setdefault((r["ranks"], r["device"]), {})[r["sm_count"]] = _share(r)
    out: dict[int, list[float]] = {}
    for (ranks, _), points in sorted(by_part.items()):
        out.setdefault(ranks, []).append(_at_sms(points, sms))
    return {k: sum(v) / len(v) for k, v in sorted(out.items())}


def deepep_nvlink_share(ep: int, device_name: str) -> float:
    """DeepEP's share of NVLink at ``ep`` ranks on a Blackwell part (``PARTS``): the largest measured rank count not
    above ``ep`` (the smallest below it); 0 elsewhere (NCCL's efficiency stands)."""
    if device_name not in PARTS:
        return 0.0
    shares = nvlink_shares()
    fit = [k for k in shares if k <= ep]
    return shares[max(fit) if fit else min(shares)]


def explain(ep: int, device_name: str) -> tuple[str, str]:
    """(what DeepEP's NVLink transfer is priced from, what no measurement covers) for ``--explain``."""
    if device_name not in PARTS:
        return "", ""
    top = max(nvlink_shares())
    basis = (f"DeepEP NVLink at {deepep_nvlink_share(ep, device_name):.3f} of 900 GB/s: {SOURCE}, bf16 dispatch and "
             f"combine at {SMS} SMs (between the measured 16 and 24)")
    gap = f"EP {ep} is above the {top} ranks measured; the {top}-rank share is taken" if ep > top else ""
    return basis, gap
