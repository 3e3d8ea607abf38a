"""DeepEP's dispatch and combine inside Blackwell's NVLink (``costmodel.deepep``), priced from the bandwidths its API
reached there, against the runs of NVIDIA's DeepSeek-V3 GB200 guide that swapped it for Hybrid-EP.

Truths: the README's DeepEP rows, typed here from ``docs/README_Hybrid-EP.md`` (deepseek-ai/DeepEP hybrid-ep @
94a9f8f; GB/s of algorithm bandwidth, bf16 dispatch and combine), and the guide's optimization history
(Megatron-LM ``docs/discussions/deepseek-v3-gb200-optimization``, commit 402bc50b1c): 829.93 TFLOPS with tuned DeepEP,
943.56 once Hybrid-EP replaced it, on TP1 PP8 VP4 EP32, micro-batch 1, global batch 2048 of 4096 tokens, 256 GB200,
no 1F1B all-to-all overlap, per-layer graphs.
"""
from __future__ import annotations

import pytest

from meshplan.costmodel.deepep import deepep_nvlink_share, explain
from meshplan.planner.cluster.spec import load_cluster
from meshplan.planner.search.job import PlanRequest, plan_job

NVLINK5 = 900.0  # GB/s per direction (NVIDIA DGX B200 datasheet)
# (dispatch bf16, combine) GB/s at 16 and 24 SMs: DeepEP's 20 lies between
B200_EP8 = {16: (348.0, 302.0), 24: (494.0, 420.0)}
GB200 = {8: {16: (362.01, 310.21), 24: (512.72, 425.95)},
         16: {16: (328.8, 278.34), 24: (442.47, 378.32)},
         24: {16: (324.64, 126.53), 24: (450.22, 163.62)}}


def _at_20(points: dict) -> float:
    lo, hi = (sum(points[s]) / 2 for s in (16, 24))
    return (lo + hi) / 2 / NVLINK5  # 20 SMs: halfway between 16 and 24


def test_shares_are_the_readme_rows_at_deepeps_20_sms() -> None:
    eight = (_at_20(B200_EP8) + _at_20(GB200[8])) / 2  # both parts measured at 8 ranks
    assert deepep_nvlink_share(8, "B200") == pytest.approx(eight, rel=1e-9)
    assert deepep_nvlink_share(4, "GB300") == pytest.approx(eight, rel=1e-9)  # below 8: the 8-rank share
    assert deepep_nvlink_share(16, "GB200") == pytest.approx(_at_20(GB200[16]), rel=1e-9)
    for ep in (24, 32, 64):  # 24 and above: the 24-rank share, its combine at 127-164 GB/s
        assert deepep_nvlink_share(ep, "GB200") == pytest.approx(_at_20(GB200[24]), rel=1e-9)
    assert deepep_nvlink_share(8, "H100-SXM") == 0.0  # Hopper keeps NCCL's efficiency


def test_a_blackwell_domain_carries_deepep_at_its_share() -> None:
    rack = load_cluster("16x4xGB200-NVL72")
    share = deepep_nvlink_share(16, "GB200")
    link = rack.alltoall_link(16, 1, dedup_topk=8, experts=256, nvlink_share=share, dispatcher="deepep")
    ring = rack.alltoall_link(16, 1, dedup_topk=8, experts=256, dispatcher="deepep")  # at NCCL's efficiency
    assert link.name == ring.name == "nvlink5-deepep"
    assert link.bandwidth_bytes_per_s / ring.bandwidth_bytes_per_s == pytest.approx(share / 0.80, rel=1e-9)


def test_explain_says_where_the_ranks_run_past_the_table() -> None:
    basis, gap = explain(32, "GB200")
    assert "DeepEP's torch-API rows" in basis and "20 SMs" in basis
    assert gap == "EP 32 is above the 24 ranks measured; the 24-rank share is taken"
    assert explain(8, "B300")[1] == "" and explain(8, "H100-SXM") == ("", "")


GUIDE = ("tp=1,pp=8,vpp=4,ep=32,etp=1,mbs=1,zero=1,recompute=selective,recompute_modules=mlp+moe_act,fp8=mxfp8,"
         "optim_dtype=bf16,pp_layout=1+2*30+0,schedule=interleaved,moe_overlap=false,cuda_graphs=layers")


def test_the_guides_switch_from_deepep_to_hybridep(tmp_path) -> None:
    """The guide's runs gained 943.56 / 829.93 = 1.137 when Hybrid-EP replaced DeepEP (it also fused the copy out
    of Hybrid-EP's buffer into the permute, which meshplan's permute carries). Priced on its EP32 groups inside
    NVLink (64 trays in segments of 16), the swap gains within 10% of that; at NCCL's efficiency DeepEP priced
    faster than Hybrid-EP, the other way round."""
    steps = {}
    for disp in ("deepep", "hybridep"):
        out = plan_job(PlanRequest.of("deepseek-v3", "64x4xGB200-NVL64", 2048, 4096,
                                      fix=f"{GUIDE},moe_dispatcher={disp}", top=1, dtype="fp8",
                                      out=tmp_path / f"{disp}.yaml"))
        steps[disp] = out.rows[0]["step_time_s"]
    assert steps["deepep"] / steps["hybridep"] == pytest.approx(943.56 / 829.93, rel=0.10)
