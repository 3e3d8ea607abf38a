"""``meshplan advise`` reads what ran as CUDA graphs from a trace's ``cudaGraphLaunch`` calls.

Truths: the counts in the traces HTA publishes as test data (``data/traces/hta_testdata``, PROVENANCE.md there):
``negative_queue_length_values_check/rank0.json.gz`` holds 70 ``cudaGraphLaunch`` calls over its five profiler
steps (``ProfilerStep#550-554``), ``trace_diff/control/control.json.gz`` none; and Megatron-Core's rules for what a
layer may capture (full recomputation only under the whole-iteration graph; a dropless MoE layer per layer).
"""
from __future__ import annotations

from meshplan.profiler.trace import load_trace
from meshplan.verify.advise.evidence import rank_evidence
from meshplan.verify.advise.infer import HIGH, MEDIUM, Part, _cuda_graphs, infer_layout
from meshplan.verify.advise.job import ran_layout
from tests.helpers import data_path


def _evidence(*parts: str):
    return rank_evidence(load_trace(data_path("traces", "hta_testdata", *parts)))


def test_a_trace_that_replays_graphs_each_step_ran_them():
    ev = _evidence("negative_queue_length_values_check", "rank0.json.gz")
    assert ev.steps == 5 and ev.graph_launches == 70 / 5
    inf = infer_layout([ev], 16)
    assert inf.parts["cuda_graphs"].value == "layers" and inf.parts["cuda_graphs"].confidence == MEDIUM
    assert "14 cudaGraphLaunch calls per step" in inf.parts["cuda_graphs"].evidence
    assert ran_layout(inf, "megatron").cuda_graphs == "layers"


def test_a_trace_without_graph_launches_ran_none():
    ev = _evidence("trace_diff", "control", "control.json.gz")
    assert ev.graph_launches == 0
    part = infer_layout([ev], 8).parts["cuda_graphs"]
    assert part.value == "none" and part.confidence == HIGH


def test_megatron_cores_capture_rules_settle_the_scope():
    ev = _evidence("negative_queue_length_values_check", "rank0.json.gz")
    full, selective = Part("full", HIGH, ""), Part("none", HIGH, "")
    assert _cuda_graphs(ev, full, moe=False).value == "iteration"  # whole layers re-run: only the iteration graph
    assert _cuda_graphs(ev, selective, moe=True).value == "layers"  # a dropless MoE layer, per layer
    ev.graph_launches = 1.0
    assert _cuda_graphs(ev, selective, moe=False).value == "iteration"  # one replay a step: the whole step
