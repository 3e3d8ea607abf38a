"""Every trace set of data/traces/external loads, and its counts match what its README states.

Each test cites the README line it checks (``data/traces/external/<set>/README.md``); those counts were
taken by their authors with plain ``gzip`` + ``json``, independently of meshplan.
"""
from __future__ import annotations

import json
from collections import Counter

import pytest

from meshplan.cli.main import app
from meshplan.profiler.report import analyze_run, replay_report
from meshplan.profiler.runs import load_run
from tests.helpers import data_path

EXT = ("traces", "external")


def _run(name: str, **kw):
    return load_run(data_path(*EXT, name), workers=1, **kw)


def _kernels(t) -> int:
    c = t.counts_by_kind()
    return c["compute"] + c["comm"]


def _annotations(t, prefix: str) -> Counter:
    return Counter(e.name for e in t.events if e.cat == "user_annotation" and e.name.startswith(prefix))


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path / "cache"))


def test_astra_megatron_tp8():
    # README: 8 ranks, nccl, world 8; ProfilerStep#3, 589-626 ms per rank; 690 kernels per rank of which 84 NCCL
    # (ncclDevKernel_AllReduce_*), no metadata on kernels; 85 nccl:all_reduce annotations.
    run = _run("astra_megatron_tp8_a100")
    assert sorted(run.ranks) == list(range(8)) and run.world_size == 8 and run.backend == "nccl"
    assert run.steps == [3]
    for t in run.ranks.values():
        assert _kernels(t) == 690
        comm = [e for e in t.events if e.kind == "comm"]
        assert len(comm) == 84 and {e.coll for e in comm} == {"allreduce"}
        assert _annotations(t, "nccl:") == {"nccl:all_reduce": 85}
        assert 589 <= round(t.steps[3][1] / 1e3) <= 626


def test_deepseek_deepep_is_comm():
    # README: rank 0 of 64, ProfilerStep#1 (112 ms); communication is DeepEP dpsk::ep::internode::dispatch/combine
    # kernels on stream 27 (not NCCL). Issue 14: comm=0.5 changed nothing when these counted as compute.
    a = analyze_run(_run("deepseek_v3_train_h800_r0"))
    t = a.run.ranks[0]
    assert a.run.world_size == 64 and sorted(a.run.ranks) == [0] and a.run.steps == [1]
    assert round(t.steps[1][1] / 1e3) == 112
    comm = [e for e in t.events if e.kind == "comm"]
    assert comm and all("dpsk::ep::internode::" in e.name and e.lane.endswith(":27") for e in comm)
    assert {"dispatch", "combine"} <= {k for e in comm for k in ("dispatch", "combine") if k in e.name}
    # the layout kernel is local work (a routing table), not communication
    assert all(e.kind == "compute" for e in t.events if "get_dispatch_layout" in e.name)
    rep = replay_report(a, ["comm=0.5"])
    assert rep["what_if_ops"]["comm=0.5"] == len(comm)
    assert rep["steps"][0]["whatif_s"] < rep["steps"][0]["replayed_s"]


def test_tracelens_mi300_rccl():
    # README: rank 0 of 8, nccl backend (RCCL), steps #15-17 (16-17 ms CPU side), 17 ncclDevKernel_Generic kernels,
    # nccl:all_reduce x6 and nccl:broadcast x6 annotations; python_function events present (with_stack).
    run = _run("tracelens_mi300_resnet_ddp_r0")
    t = run.ranks[0]
    assert run.world_size == 8 and run.steps == [15, 16, 17]
    assert all(15.5e3 <= d <= 17.5e3 for _, d in t.steps.values())
    comm = [e for e in t.events if e.kind == "comm"]
    assert len(comm) == 17 and all(e.name.startswith("ncclDevKernel_Generic") for e in comm)
    assert _annotations(t, "nccl:") == {"nccl:all_reduce": 6, "nccl:broadcast": 6}
    assert t.categories["python_function"]["used"] == 0 and "stack" in t.categories["python_function"]["why"]
    assert run.partial and any("absent" in w for w in run.warnings)


@pytest.mark.parametrize("name,step,ms,kernels,instants", [
    # README: ProfilerStep#6 (4.4 ms), 60 kernels; python_function and cpu_instant_event present
    ("tracelens_h100_bert_small", 6, 4.4, 60, None),
    # README: ProfilerStep#6 (47 ms CPU side), 1,465 kernels, 2,450 cpu_instant_event
    ("tracelens_h100_qwen05b", 6, 47, 1465, 2450),
])
def test_tracelens_h100(name, step, ms, kernels, instants):
    run = _run(name)
    t = run.ranks[0]
    assert run.steps == [step] and round(t.steps[step][1] / 1e3, 1 if ms < 10 else 0) == ms
    assert _kernels(t) == kernels and t.counts_by_kind()["comm"] == 0
    cie = t.categories["cpu_instant_event"]
    assert cie["used"] == 0 and (instants is None or cie["events"] == instants)


def test_mi250_empty_second_step_replays_idle(runner):
    # README: 220 events; ProfilerStep#1 (9.3 ms) and a stub ProfilerStep#2 (49 µs, no ops: the profiler stopped).
    p = data_path(*EXT, "hta_amd_mi250_minitoy")
    run = load_run(p, workers=1)
    t = run.ranks[0]
    assert sum(c["events"] for c in t.categories.values()) == 220
    assert t.empty_steps == [2] and round(t.steps[1][1] / 1e3, 1) == 9.3 and round(t.steps[2][1]) == 49
    res = runner.invoke(app, ["replay", str(p), "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["step"]: r for r in json.loads(res.output)["steps"]}
    assert rows[2]["idle"] and rows[2]["replayed_s"] == pytest.approx(rows[2]["measured_s"], rel=1e-4)  # not dropped


def test_cuda_event_sync():
    # README: ProfilerStep#100 (3.2 ms), 4 kernels, 4 cuda_sync events.
    t = _run("hta_cuda_event_sync_a100").ranks[0]
    assert list(t.steps) == [100] and round(t.steps[100][1] / 1e3, 1) == 3.2
    assert _kernels(t) == 4 and t.categories["cuda_sync"]["events"] == 4


def test_cpu_only_gloo_idle_training_thread():
    # README: rank 34 of 300, gloo, 10 process groups; 30 events: ProfilerStep#551 (210 ms), 10 gloo:all_reduce on
    # two gloo threads, 4 aten::empty; the training thread has no op inside the step (issue 14: replayed
    # 210.1 -> 197.3 ms). The step now replays at its length.
    a = analyze_run(_run("hta_cpu_only_gloo_r34"))
    t = a.run.ranks[34]
    # pg_config lists the 10 of pg_count plus one hashed-name group the README does not count
    assert a.run.world_size == 300 and a.run.backend == "gloo" and len([g for g in t.pg_config if
                                                                        g["pg_name"].isdigit()]) == 10
    assert sum(c["events"] for c in t.categories.values()) == 30
    comm = [e for e in t.events if e.kind == "comm"]
    assert len(comm) == 10 and {e.name for e in comm} == {"gloo:all_reduce"} and len({e.lane for e in comm}) == 2
    assert sum(1 for e in t.events if e.name == "aten::empty") == 4
    assert a.timeline.steps[551] == pytest.approx(t.steps[551][1] * 1e-6)


@pytest.mark.parametrize("name,events,kernels,span_s", [
    # README: distributedInfo {"rank": 0}, 1,408 events, 79 kernels, 41 cuda_sync; no ProfilerStep; window 43 s
    ("hta_alexnet_a100", 1408, 79, 43),
    # README: 70 events, TorchDynamo -> one triton kernel (cuLaunchKernel) -> cudaDeviceSynchronize; no ProfilerStep
    ("hta_triton_a100", 70, 1, None),
])
def test_no_step_markers_warn_once(name, events, kernels, span_s):
    run = _run(name)
    t = run.ranks[0]
    assert sum(c["events"] for c in t.categories.values()) == events and _kernels(t) == kernels
    warns = [w for w in run.warnings if "no ProfilerStep# markers" in w]
    assert len(warns) == 1 and "--steps-at" in warns[0]
    if span_s:
        assert f"{span_s}." in warns[0]


@pytest.mark.parametrize("name,events,kernels,optimizer_steps", [
    # README: 111,631 events, 9,628 kernels over 16.2 s; 30 iterations visible only as Optimizer.step#SGD.step
    ("param_resnet_rtx2080", 111_631, 9_628, 30),
    # README: 29,746 events over 3.4 s, 2,360 kernels, no NCCL kernels; five iterations as Optimizer.step
    ("tracelens_mi300_ddp_resnet18", 29_746, 2_360, 5),
])
def test_steps_cut_at_optimizer(name, events, kernels, optimizer_steps):
    a = analyze_run(_run(name, step_at="optimizer"))
    t = a.run.ranks[0]
    assert sum(c["events"] for c in t.categories.values()) == events and _kernels(t) == kernels
    assert t.counts_by_kind()["comm"] == 0
    assert a.run.steps == list(range(optimizer_steps - 1))  # n optimizer steps bound n - 1 whole steps
    rep = replay_report(a)
    p = rep["prediction"]
    assert p["available"] and p["held_out_steps"] and p["median_abs_error"] is not None


def test_every_external_set_summarises(runner):
    # README table: 12 sets; each loads with --summary --json and says what it used and what not.
    sets = sorted(p for p in data_path(*EXT).iterdir() if p.is_dir())
    assert len(sets) == 12
    for p in sets:
        res = runner.invoke(app, ["replay", str(p), "--summary", "--json", "--workers", "1"])
        assert res.exit_code == 0, (p, res.output)
        s = json.loads(res.output)
        assert s["ranks"] and sum(s["ops"].values()) > 0
        assert s["inputs"]["used"] and all(u["why"] for u in s["inputs"]["not_used"])


HTA = ("traces", "hta_testdata")


@pytest.mark.parametrize("rel,kernels,steps,nccl", [
    # PROVENANCE.md §1: sampled pair of a 128-rank job; rank 0 kernel 1154 (10 NCCL SendRecv), steps 551-552
    ("trace_filter/sampled_rank-0.json.gz", 1154, [551, 552], 10),
    ("trace_filter/sampled_rank-1.json.gz", 1104, [551, 552], 10),
    # §7: simple_add, 79 kernels, 41 cuda_sync; multi-stream event sync, 149 events
    ("critical_path/simple_add/benchmark_result_493459_1694039959_trace.json.gz", 79, None, 0),
    pytest.param("negative_queue_length_values_check/rank0.json.gz", 6080, [550, 551, 552, 553, 554], 80,
                 marks=pytest.mark.slow),  # §4: 80 NCCL SendRecv kernels on six streams
    pytest.param("trace_diff/control/control.json.gz", 8568, list(range(1009, 1015)), 60,
                 marks=pytest.mark.slow),  # §3: 42 SendRecv + 18 AllReduce
    pytest.param("trace_diff/test/test.json.gz", 9876, list(range(1009, 1015)), 64, marks=pytest.mark.slow),
    pytest.param("df_index_resolver/df_index_resolver.json.gz", 19370, [2, 3, 4, 5, 6], 2020,
                 marks=pytest.mark.slow),  # §5: 2020 AllReduce kernels, 28,010 [memory] instants not used
])
def test_hta_testdata_counts(rel, kernels, steps, nccl):
    t = load_run(data_path(*HTA, *rel.split("/")), workers=1).ranks
    (t,) = t.values()
    assert _kernels(t) == kernels and t.counts_by_kind()["comm"] == nccl
    if steps is not None:
        assert sorted(t.steps) == steps
    if "simple_add" in rel:
        assert t.categories["cuda_sync"]["events"] == 41 and sorted(t.steps) == []
