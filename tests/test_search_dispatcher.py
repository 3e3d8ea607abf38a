"""The token dispatcher a free search takes (``planner.layout.space.free_dispatcher``): Megatron-Core's flex
dispatcher where ep > 1 on NVIDIA GPUs, Hybrid-EP on Blackwell and DeepEP elsewhere, as Megatron-Bridge's own
performance recipes choose (``moe_flex_dispatcher_backend`` in ``data/published_runs/blackwell_dev.jsonl``).

The rule stands in for a search over the three dispatchers, so the check is that the search would pick no other:
priced on the same layout, the rule's dispatcher never loses to the alltoall dispatcher, inside one node or
NVLink domain and across nodes, on Hopper and Blackwell.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from meshplan.costmodel.devices import get_device
from meshplan.planner.layout.space import Pins, enumerate_layouts, free_dispatcher
from meshplan.planner.model.config import load_model
from meshplan.planner.search.job import PlanRequest, plan_job

B1 = Path(__file__).resolve().parents[1] / "data" / "published_runs" / "blackwell_dev.jsonl"
MESH = "tp=1,pp=1,cp=1,mbs=1,zero=1,recompute=full,moe_overlap=false,cuda_graphs=none"


def _step_s(tmp_path, cluster: str, ep: int, dispatcher: str) -> float:
    out = plan_job(PlanRequest.of("qwen3-30b-a3b", cluster, 512, 4096, fix=f"{MESH},ep={ep},moe_dispatcher="
                                  f"{dispatcher}", top=1, out=tmp_path / f"{dispatcher}.yaml"))
    return out.plan.prediction.step_time_s


@pytest.mark.parametrize("cluster,ep", [("1x8xH100", 8), ("2x8xH100", 16), ("2x4xGB200-NVL72", 8),
                                        ("4x8xB200", 32)])
def test_the_free_dispatcher_never_loses_to_the_alltoall(tmp_path, cluster, ep):
    """One copy per destination node and rank instead of one per routed expert, DeepEP's NIC at line rate, no
    second token sort: inside a node (H100 EP 8, GB200 EP 8 in a rack) and across nodes (H100 EP 16, B200 EP 32)."""
    device = get_device(cluster.split("x")[-1].split("-")[0])
    free = free_dispatcher(device)
    assert free == ("hybridep" if device.supports("mxfp8") else "deepep")
    assert _step_s(tmp_path, cluster, ep, free) <= _step_s(tmp_path, cluster, ep, "alltoall")


def test_a_free_search_takes_the_rule_and_keeps_a_pinned_dispatcher(tmp_path):
    fix = f"{MESH},ep=8"
    free = plan_job(PlanRequest.of("qwen3-30b-a3b", "1x8xH100", 512, 4096, fix=fix, top=1, out=tmp_path / "a.yaml"))
    assert free.plan.moe_dispatcher == "deepep"
    pinned = plan_job(PlanRequest.of("qwen3-30b-a3b", "1x8xH100", 512, 4096, fix=f"{fix},moe_dispatcher=alltoall",
                                     top=1, out=tmp_path / "b.yaml"))
    assert pinned.plan.moe_dispatcher == "alltoall"
    model = load_model("qwen3-30b-a3b")
    dispatch = {(lay.ep, lay.moe_dispatcher) for lay in enumerate_layouts(model, 8, 8, 64, 4096, Pins(tp=1, pp=1),
                                                                         graphs=True, dispatcher="deepep")}
    assert {d for ep, d in dispatch if ep == 1} == {"alltoall"}  # nothing to dispatch across ranks
    assert {d for ep, d in dispatch if ep > 1} == {"deepep"}
    titan = {(lay.ep, lay.moe_dispatcher) for lay in enumerate_layouts(
        model, 8, 8, 64, 4096, Pins(tp=1, pp=1, stack="torchtitan"), graphs=True, dispatcher="deepep")}
    assert {ep for ep, _ in titan} > {1} and {d for _, d in titan} == {"alltoall"}  # its own all-to-all, every ep


def test_the_rule_is_what_nvidias_blackwell_recipes_run():
    """Megatron-Bridge's performance presets of the dev set name a flex backend on most MoE rows: Hybrid-EP on all
    four Blackwell systems, DeepEP on two; the rule takes Hybrid-EP on each."""
    backends: Counter = Counter()
    for line in B1.read_text().splitlines():
        row = json.loads(line)
        ws = (row.get("recipe") or {}).get("workload_settings") or {}
        if row.get("num_experts") and ws.get("moe_flex_dispatcher_backend"):
            backends[ws["moe_flex_dispatcher_backend"]] += 1
            assert free_dispatcher(get_device(row["system"])) == "hybridep"
    assert backends.most_common(1)[0][0] == "hybridep" and backends["hybridep"] > 10 * backends["deepep"]
