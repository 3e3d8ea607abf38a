"""Trace ingestion: counts checked against the PROVENANCE.md files of the shared traces (independent loads)."""
from __future__ import annotations

import gzip
import json
from collections import Counter

import pytest

import meshplan.profiler.jsonstream as jsonstream
from meshplan.profiler.runs import load_run
from meshplan.profiler.trace import collective_type, load_trace
from tests.helpers import DATA, data_path

DLRM = ("traces", "param_dlrm_8rank", "dlrm_kineto.tar.gz")


@pytest.fixture(scope="module")
def dlrm():
    return load_run(data_path(*DLRM))


def test_dlrm_ranks_kernels_and_collectives(dlrm):
    # PROVENANCE.md (param_dlrm_8rank): 8 ranks, kernel count per rank 245/310/246/315/251/245/246/246,
    # 16 gpu_memcpy (+6 memset on ranks 3 and 4), 8 NCCL kernels = 5 all_to_all + 3 all_reduce, step #10.
    kernels = {0: 245, 1: 310, 2: 246, 3: 315, 4: 251, 5: 245, 6: 246, 7: 246}
    memset = {3: 6, 4: 6}
    assert sorted(dlrm.ranks) == list(range(8)) and dlrm.world_size == 8 and dlrm.backend == "nccl"
    assert dlrm.steps == [10]
    for r, t in dlrm.ranks.items():
        c = t.counts_by_kind()
        assert c["compute"] + c["comm"] == kernels[r]
        assert c["memcpy"] == 16 + memset.get(r, 0)
        comm = [e for e in t.events if e.kind == "comm"]
        assert Counter(e.coll for e in comm) == {"alltoall": 5, "allreduce": 3}
        assert {e.lane.rsplit(":", 1)[-1] for e in comm} == {"84"}
        assert all(e.step == 10 for e in comm)
    # rank 0 annotation order (PROVENANCE): a2a [6144], [24], [384], [3392], allreduce [394241] float, ...
    r0 = [e for e in dlrm.ranks[0].events if e.kind == "comm"]
    assert r0[4].coll == "allreduce" and r0[4].bytes == 394241 * 4


def test_modern_metadata_and_ns_timestamps():
    # PROVENANCE.md (hta_testdata §2): 21 NCCL kernels with metadata (15 allreduce + 6 broadcast) on stream 40,
    # pg "0" = ranks [0, 1], baseTimeNanoseconds 1711964646000000000, steps 4-6.
    t = load_trace(data_path("traces", "hta_testdata", "nccl_parser_config", "nccl_data.json.gz"))
    comm = [e for e in t.events if e.kind == "comm"]
    assert Counter(e.coll for e in comm) == {"allreduce": 15, "broadcast": 6}
    assert {e.pg for e in comm} == {"0"} and {e.group_ranks for e in comm} == {(0, 1)}
    assert t.base_ns == 1711964646000000000 and sorted(t.steps) == [4, 5, 6]
    assert all(e.lane == "stream:0:40" for e in comm)
    # first kernel of the file: In msg nelems 6563840 floats in the PROVENANCE example
    assert any(e.bytes == 6563840 * 4 for e in comm)
    # ns digits kept: ts values are not all integers
    assert any(e.ts_us != int(e.ts_us) for e in t.events[:100])


def test_ns_resolution_trace_steps_and_no_comm():
    # PROVENANCE.md (hta_testdata §6): ProfilerStep#101-105, world 1, 0 NCCL kernels, 4350 kernels.
    t = load_trace(data_path("traces", "hta_testdata", "ns_resolution_trace",
                               "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"))
    assert sorted(t.steps) == [101, 102, 103, 104, 105]
    c = t.counts_by_kind()
    assert c["comm"] == 0 and c["compute"] == 4350


def test_gloo_cpu_trace():
    # tests/data/profiler/gloo_ddp_2rank/PROVENANCE.md: steps 2-5, 3 gloo:all_reduce per rank and step.
    run = load_run(DATA / "profiler" / "gloo_ddp_2rank")
    assert run.backend == "gloo" and sorted(run.ranks) == [0, 1] and run.steps == [2, 3, 4, 5]
    for t in run.ranks.values():
        comm = [e for e in t.events if e.kind == "comm"]
        assert len(comm) == 12 and {e.coll for e in comm} == {"allreduce"}
        assert all(e.lane.startswith("thread:") for e in comm)
        assert not t.has_gpu


def test_rank_from_file_name_when_distributed_info_missing(tmp_path):
    src = data_path("traces", "hta_testdata", "execution_trace", "benchmark_simple_add_trace.json.gz")
    doc = json.loads(gzip.decompress(src.read_bytes()))
    doc.pop("distributedInfo")
    p = tmp_path / "worker5.pt.trace.json"
    p.write_text(json.dumps(doc))
    assert load_trace(p).rank == 5


def test_stream_parser_matches_json_load_across_chunk_edges(tmp_path, monkeypatch):
    # Tiny windows split numbers, strings and escapes at every position; the streamed events must equal json.load.
    src = data_path("traces", "hta_testdata", "critical_path", "cuda_event_sync_multi_stream",
                      "event_sync_trace.json.gz")
    text = gzip.decompress(src.read_bytes()).decode()
    p = tmp_path / "t.json"
    p.write_text(text)
    monkeypatch.setattr(jsonstream, "_CHUNK_CHARS", 7)
    got: list[dict] = []
    header = jsonstream.stream_trace(p, got.append)
    ref = json.loads(text)
    assert got == ref["traceEvents"]
    assert header["distributedInfo"] == ref["distributedInfo"]


@pytest.mark.parametrize("name,expected", [
    ("ncclKernel_AllReduce_RING_LL_Sum_float", "allreduce"), ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL",
                                                              "reducescatter"),
    ("nccl:_all_gather_base", "allgather"), ("gloo:all_reduce", "allreduce"), ("nccl:all_to_all", "alltoall"),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", "sendrecv"), ("matmul", None)])
def test_collective_type(name, expected):
    assert collective_type(name) == expected


def test_ingest_memory_is_per_kept_event_not_per_file_byte(tmp_path):
    # Small version of bench/replay_speed.py's 500 MB ingest check: a ~8 MB trace of repeated real DLRM events.
    # Streaming keeps only compact records, so traced peak memory per kept event stays far below what holding
    # the parsed JSON costs (json.loads of this file takes ~1.7 KB per kept event; streaming ~0.5 KB).
    import importlib.util
    import tracemalloc

    from tests.helpers import REPO

    data_path(*DLRM)
    spec = importlib.util.spec_from_file_location("replay_speed", REPO / "bench" / "replay_speed.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    path = tmp_path / "big.trace.json"
    size, n_events = bench.make_big_trace(path, 8)
    tracemalloc.start()
    t = load_trace(path)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(t.events) > 20_000 and len(t.steps) >= 8
    assert peak / len(t.events) < 700, peak / len(t.events)
    tracemalloc.start()
    json.loads(path.read_text())
    _, peak_json = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < peak_json / 2
