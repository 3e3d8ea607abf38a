"""``meshplan advise`` reads what ran as CUDA graphs from a trace's ``cudaGraphLaunch`` calls.

Truths: the counts in the traces HTA publishes as test data (``data/traces/hta_testdata``, PROVENANCE.md there):
``negative_queue_length_values_check/rank0.json.gz`` holds 70 ``cudaGraphLaunch`` calls over its five profiler
steps (``ProfilerStep#550-554``), ``trace_diff/control/control.json.gz`` none; Megatron-Core's capture rules (a fully
recomputed layer is graphed only within the whole iteration; a dropless MoE model's whole iteration only behind
Hybrid-EP's sync-free dispatch); and ``Layout.validate``, which must accept the layout that ran.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.planner.model.config import load_model
from meshplan.profiler.trace import load_trace
from meshplan.verify.advise.evidence import rank_evidence
from meshplan.verify.advise.infer import HIGH, MEDIUM, InferredLayout, Part, _cuda_graphs, infer_layout
from meshplan.verify.advise.job import ran_layout
from tests.helpers import data_path


def _evidence(*parts: str):
    return rank_evidence(load_trace(data_path("traces", "hta_testdata", *parts)))


@pytest.fixture(scope="module")
def graphed():
    """The HTA trace whose steps replay CUDA graphs (read once for the module)."""
    return _evidence("negative_queue_length_values_check", "rank0.json.gz")


def test_a_trace_that_replays_graphs_each_step_ran_them(graphed):
    ev = graphed
    assert ev.steps == 5 and ev.graph_launches == 70 / 5
    part = infer_layout([ev], 16).parts["cuda_graphs"]
    assert (part.value, part.confidence) == ("layers", MEDIUM)
    assert "14.0 cudaGraphLaunch calls per step" in part.evidence


def test_a_trace_without_graph_launches_ran_none():
    ev = _evidence("trace_diff", "control", "control.json.gz")
    assert ev.graph_launches == 0
    part = infer_layout([ev], 8).parts["cuda_graphs"]
    assert part.value == "none" and part.confidence == HIGH


def test_one_launch_a_step_is_the_whole_iteration(graphed):
    ev = replace(graphed, graph_launches=0.2)  # one graph every fifth step
    part = _cuda_graphs(ev)
    assert part.value == "iteration" and "0.2 cudaGraphLaunch calls per step" in part.evidence


def _inferred(ep: int, recompute: str, graphs: str) -> InferredLayout:
    parts = {"dp_replicate": 8, "dp_shard": 1, "tp": 1, "pp": 1, "ep": ep, "zero": 1,
             "recompute": recompute, "micro_batch": 1, "fp8": "none", "sp": False, "cuda_graphs": graphs}
    return InferredLayout(parts={k: Part(v, HIGH, "") for k, v in parts.items()})


@pytest.mark.parametrize("ep, recompute, graphs, want", [
    (8, "full", "layers", ("iteration", "hybridep")),  # graphed whole layers: the whole iteration
    (1, "none", "iteration", ("iteration", "hybridep")),  # a dropless MoE iteration graph: Hybrid-EP ran
    (8, "none", "layers", ("layers", "alltoall")),
    (8, "none", "none", ("none", "alltoall")),
])
def test_the_layout_that_ran_is_one_megatron_core_runs(ep, recompute, graphs, want):
    model = load_model("qwen3-30b-a3b")
    lay = ran_layout(_inferred(ep, recompute, graphs), "megatron", model.num_experts)
    assert (lay.cuda_graphs, lay.moe_dispatcher) == want
    lay.validate(world_size=8, num_layers=model.num_layers, num_heads=model.num_heads,
                 num_kv_heads=model.num_kv_heads, seq_len=4096, global_batch=64, num_experts=model.num_experts)
