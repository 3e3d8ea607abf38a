"""``meshplan plan --explain``'s ``unmeasured`` notes: what a plan's price leaves out, said where it is measured to
matter."""
from __future__ import annotations

from meshplan.planner.search.job import PlanRequest, plan_job


def test_explain_says_what_host_time_is_left_out_for_moe_only(tmp_path) -> None:
    """``--explain`` names what it leaves out: the host time it does not price, for an MoE model (measured to
    matter there), not for a dense one."""
    from meshplan.planner.estimate.explain import HOST_TIME_NOTE

    mesh = "tp=1,pp=1,cp=1,ep=8,mbs=1,zero=3,recompute=full"
    moe = plan_job(PlanRequest.of("qwen3-30b-a3b", "1x8xH100", 512, 4096, fix=mesh, top=1, explain=True,
                                  out=tmp_path / "moe.yaml")).plan
    assert moe.explain["unmeasured"]["host time"] == HOST_TIME_NOTE
    dense = plan_job(PlanRequest.of("llama3.1-8b", "1x8xH100", 64, 4096, fix="tp=1,pp=1,cp=1,mbs=1,zero=1", top=1,
                                    explain=True, out=tmp_path / "dense.yaml")).plan
    assert "host time" not in dense.explain.get("unmeasured", {})
