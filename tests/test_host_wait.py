"""An MoE layer's wait for the host after its token-count sync (``planner.estimate.host_wait``), priced by the
``cuda_graphs`` decision.

Truths the pricing does not compute: where Megatron-Core syncs (a dropless layer once per forward; dropping and
padding to capacity never: ``token_dispatcher.py`` ``drop_and_pad``), what a whole-iteration graph removes, the
host times NVIDIA's GB200 timeline shows (2.6 ms for the routed experts' eager stretch, 2.8 ms more for an eager router
and preprocessing), the x86 / Grace ratio TransformerEngine issue 2053 measured (13.48 / 37.08 us), and the
combinations Megatron-Core refuses.
"""
from __future__ import annotations

import pytest

from meshplan.core.errors import MeshplanError
from meshplan.costmodel.devices import get_device
from meshplan.planner.estimate.gpu import straggler_slowdown
from meshplan.planner.search.job import PlanRequest, plan_job

# Qwen3-30B-A3B as Megatron-Bridge's GB200 preset runs it: EP8 over 2 trays, micro-batch 4, Hybrid-EP
MESH = "tp=1,pp=1,cp=1,ep=8,mbs=4,zero=1,recompute=none,moe_dispatcher=hybridep"
LAYERS, MICRO_BATCHES = 48, 512 // (8 * 4)
GRACE_ROUTED_S, GRACE_ROUTER_S, X86_OVER_GRACE = 2.6e-3, 2.8e-3, 13.48 / 37.08


def _plan(tmp_path, graphs: str, cluster: str = "2x4xGB200-NVL72", extra: str = ""):
    out = plan_job(PlanRequest.of("qwen3-30b-a3b", cluster, 512, 4096, fix=f"{MESH},cuda_graphs={graphs}{extra}",
                                  top=1, dtype="fp8", explain=True, out=tmp_path / f"{graphs}.yaml"))
    return out.rows[0]["step_time_s"], out.plan.explain


def _wait_s(explain: dict) -> float:
    stage = explain["stages"][0]["exposed_comm_s"]
    return stage.get("host wait after the MoE token-count sync", 0.0)


def test_the_wait_is_what_the_graphs_leave_eager(tmp_path) -> None:
    """Whole-iteration graphs remove the wait; per-layer graphs leave the routed experts' stretch to the host;
    nothing captured adds the router and preprocessing. Each step differs from the graphed one by the wait the
    breakdown names, and each layer waits less than the host time the timeline measured (the GPU runs part of it)."""
    full, full_x = _plan(tmp_path, "iteration")
    layers, layers_x = _plan(tmp_path, "layers")
    eager, eager_x = _plan(tmp_path, "none")
    assert _wait_s(full_x) == 0.0 and full < layers < eager
    for step, explain, host_s in ((layers, layers_x, GRACE_ROUTED_S),
                                  (eager, eager_x, GRACE_ROUTED_S + GRACE_ROUTER_S)):
        wait = _wait_s(explain)
        # the slowest of the 8 ranks stretches the stage the wait is part of (``straggler_slowdown``)
        assert step - full == pytest.approx(wait * (1 + straggler_slowdown(8)), rel=1e-6)
        assert 0 < wait / (LAYERS * MICRO_BATCHES) < host_s


def test_an_x86_host_waits_less_than_grace(tmp_path) -> None:
    """The same run on DGX B200 nodes: its Xeon launches at 13.48 / 37.08 of Grace's time per op."""
    _, grace = _plan(tmp_path, "layers")
    _, x86 = _plan(tmp_path, "layers", cluster="1x8xB200")
    assert _wait_s(x86) / (LAYERS * MICRO_BATCHES) < GRACE_ROUTED_S * X86_OVER_GRACE
    assert _wait_s(x86) < _wait_s(grace)


def test_dropping_and_padding_has_no_sync(tmp_path) -> None:
    """Token dropping padded to capacity sizes every buffer before the step: Megatron-Core skips the sync."""
    step, explain = _plan(tmp_path, "layers", extra=",moe_capacity=1")
    same, _ = _plan(tmp_path, "iteration", extra=",moe_capacity=1")
    assert _wait_s(explain) == 0.0 and step == pytest.approx(same, rel=1e-9)


def test_a_dense_model_has_no_wait(tmp_path) -> None:
    fix = "tp=1,pp=1,cp=1,mbs=1,zero=1,recompute=selective,cuda_graphs="
    steps = [plan_job(PlanRequest.of("llama3.1-8b", "1x8xGB200-NVL72", 64, 4096, fix=fix + g, top=1,
                                     out=tmp_path / f"{g}.yaml")).rows[0]["step_time_s"] for g in ("none", "layers")]
    assert steps[0] == steps[1]


@pytest.mark.parametrize("fix, said", [
    ("cuda_graphs=iteration,moe_dispatcher=alltoall", "needs moe_dispatcher=hybridep"),
    ("cuda_graphs=layers,recompute=full", "full-iteration graph"),
])
def test_what_megatron_core_refuses_is_refused_by_name(tmp_path, fix: str, said: str) -> None:
    mesh = "tp=1,pp=1,cp=1,ep=8,mbs=4,zero=1"
    with pytest.raises(MeshplanError, match=said):
        plan_job(PlanRequest.of("qwen3-30b-a3b", "2x4xGB200-NVL72", 512, 4096, fix=f"{mesh},{fix}", top=1,
                                out=tmp_path / "p.yaml"))


def test_the_catalogue_says_which_parts_grace_launches() -> None:
    """GB200 and GB300 superchips pair a Grace CPU with two GPUs (NVIDIA's NVL72 specifications); DGX / HGX parts
    are x86-hosted."""
    assert {n: get_device(n).host_cpu for n in ("GB200", "GB300", "B200", "B300", "H100")} == {
        "GB200": "grace", "GB300": "grace", "B200": "x86", "B300": "x86", "H100": "x86"}
    assert "Grace" in get_device("GB200").sources["host_cpu"]
