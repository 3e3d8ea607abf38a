"""The fused grouped MLP's backward dGLU kernel by cuDNN frontend release (``cudnn_frontend``, ``cudnn_dglu``).

Truths: cuDNN frontend PR #322's table (SM100 issue-shape benchmark, CUTLASS DSL 4.5.0: the grouped GEMM + dGLU
kernel at 139.392 / 1362.768 us without / with the bias gradient before the fix, 138.960 / 155.632 us after; issue
#256: releases 1.24.0 to 1.25.x), and the pins in Megatron-Bridge's ``pyproject.toml`` (v0.5.0 line 140:
``nvidia-cudnn-frontend==1.23.0``; v0.5.1 line 142: ``==1.24.0``).
"""
from __future__ import annotations

import dataclasses

import pytest

from meshplan.costmodel import cudnn_dglu
from meshplan.costmodel.api import Pricer
from meshplan.planner.cluster.spec import load_cluster
from meshplan.planner.estimate.base import time_key
from meshplan.planner.estimate.gpu import GpuEstimator, group_links
from meshplan.planner.estimate.ops_graph import expert_ops
from meshplan.planner.layout.layout import Layout
from meshplan.planner.layout.stacks import load_stacks
from meshplan.planner.model.config import load_model

SEQ = 4096


@pytest.mark.parametrize("release, dbias, us", [("1.23", False, 138.960), ("1.23", True, 155.632),
                                                ("1.24", False, 139.392), ("1.24", True, 1362.768),
                                                ("1.25", True, 1362.768)])
def test_the_multiples_are_the_pull_requests_timings(release: str, dbias: bool, us: float) -> None:
    """Each release's kernel over the fixed one without the bias gradient, as PR #322 timed them (1.25 kept the
    regression: issue #256)."""
    assert cudnn_dglu.dgrad_multiple(release, dbias) == pytest.approx(us / 138.960, rel=1e-9)


def test_an_unknown_release_is_refused() -> None:
    with pytest.raises(ValueError, match="1.22"):
        cudnn_dglu.dgrad_multiple("1.22", True)


def _bwd_s(model_name: str, cluster_name: str, **changes) -> tuple[float, float]:
    """(the MoE layer's backward seconds for one micro-batch, fc2's grouped GEMM backward priced alone)."""
    model, cluster = load_model(model_name), load_cluster(cluster_name)
    layout = Layout(**{**dict(dp_shard=16, ep=16, zero_stage=1, fp8="mxfp8", moe_dispatcher="hybridep",
                              moe_fused_mlp=True, micro_batch=1), **changes})
    est = GpuEstimator(Pricer.shipped())
    tb, key = est.tables(model), time_key(layout)
    moe = next(k for k in tb.rep if "E" in k)
    times = est.layer_times(tb, cluster.device, key, moe, SEQ, "fp8", *group_links(cluster, model, layout))
    rows = SEQ * model.experts_per_token  # one sequence's routed rows, all on this rank's experts (EP spreads them)
    fc2 = expert_ops(model, layout, rows, "fp8")[-1]
    assert fc2.kind == "matmul" and fc2.groups > 1
    # as the estimator prices every op: at the sustained share of one-shot rates a training step holds
    fc2_bwd_s = Pricer.shipped().under_load().predict(dataclasses.replace(fc2, backward=True), cluster.device)
    return times[1], fc2_bwd_s


def test_the_regressed_kernel_adds_its_multiple_of_fc2s_input_gradient() -> None:
    """GPT-OSS 120B (experts with biases) on GB300 trays: under 1.24 a layer's backward grows by fc2's input
    gradient (half its grouped GEMM's backward: the weight gradient has the same FLOPs) times the two releases'
    difference; the fixed kernel's bias gradient alone costs 12%."""
    fixed, fc2_bwd_s = _bwd_s("gpt-oss-120b", "16x4xGB300-NVL72", cudnn_frontend="1.23")
    slow, _ = _bwd_s("gpt-oss-120b", "16x4xGB300-NVL72", cudnn_frontend="1.24")
    expected = (1362.768 - 155.632) / 138.960 * 0.5 * fc2_bwd_s
    assert slow - fixed == pytest.approx(expected, rel=1e-6)
    assert slow / fixed > 1.3  # the kernel's spill is no rounding error


def test_experts_without_biases_barely_move_and_unfused_experts_not_at_all() -> None:
    """Qwen3-30B-A3B's experts carry no bias: 1.24's kernel without it is 139.392 / 138.960 of 1.23's; without the
    fused grouped MLP the release runs no dGLU kernel."""
    fixed, fc2_bwd_s = _bwd_s("qwen3-30b-a3b", "4x4xGB200-NVL72", cudnn_frontend="1.23")
    slow, _ = _bwd_s("qwen3-30b-a3b", "4x4xGB200-NVL72", cudnn_frontend="1.24")
    assert slow - fixed == pytest.approx((139.392 - 138.960) / 138.960 * 0.5 * fc2_bwd_s, rel=1e-6)
    unfused = [_bwd_s("qwen3-30b-a3b", "4x4xGB200-NVL72", moe_fused_mlp=False, cudnn_frontend=r)[0]
               for r in ("1.23", "1.24")]
    assert unfused[0] == unfused[1]


@pytest.mark.parametrize("ref, release", [("megatron-bridge@26.06", "1.23"), ("megatron-bridge@26.06.01", "1.24"),
                                          ("megatron-bridge-perf@26.06.01", "1.24")])
def test_the_profiles_pin_their_releases_cudnn_frontend(ref: str, release: str) -> None:
    """Megatron-Bridge v0.5.0 pins nvidia-cudnn-frontend 1.23.0 and v0.5.1 (NeMo 26.06.01) 1.24.0; the performance
    scripts' profile holds its library's pin."""
    assert load_stacks().get(ref).defaults("fp8", True)["cudnn_frontend"] == release
