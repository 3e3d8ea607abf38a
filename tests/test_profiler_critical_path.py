"""Critical path cross-checked against Holistic Trace Analysis's golden output for the same trace."""
from __future__ import annotations

import gzip
import json

from meshplan.profiler.critical_path import critical_path, dominant_ops
from meshplan.profiler.report import analyze_run
from tests.helpers import data_path

_DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def test_device_ops_on_our_path_are_on_htas_path():
    # hta_testdata/critical_path: HTA's critical_path_analysis overlaid on the simple_add trace (its reference
    # output) marks 22 of the trace's 98 device ops critical. Every device op on our replay's critical path must
    # be one of those 22 (matched by name and start time).
    golden = json.loads(gzip.decompress(data_path(
        "traces", "hta_testdata", "critical_path", "end_to_end", "simple_add", "output",
        "overlaid_critical_path_trace.json.gz").read_bytes()))
    dev = [e for e in golden["traceEvents"] if e.get("ph") == "X" and e.get("cat") in _DEVICE_CATS]
    hta_crit = {(e["name"], round(e["ts"])) for e in dev if (e.get("args") or {}).get("critical")}
    assert len(dev) == 98 and len(hta_crit) == 22
    a = analyze_run(data_path("traces", "hta_testdata", "critical_path", "simple_add",
                                "benchmark_result_493459_1694039959_trace.json.gz"))
    origin = a.graph.graph["steps"][0]["origin_us"]
    path = critical_path(a.timeline, 0)
    ours = set()
    for p in path:
        if p.node is not None and p.kind in ("compute", "memcpy", "comm"):
            n = a.graph.nodes[p.node]
            ours.add((n["name"], round(origin + n["measured_start_s"] * 1e6)))
    assert len(ours) >= 10
    assert ours <= hta_crit, ours - hta_crit
    top = dominant_ops(path)
    assert abs(sum(p.exposed_s for p in path) - a.timeline.steps[0]) < 1e-9
    assert top[0]["share"] >= top[-1]["share"]


def test_stream_wait_event_becomes_an_edge():
    # hta_testdata critical_path/cuda_event_sync_multi_stream (PROVENANCE §7): cudaEventRecord (correlation 1385)
    # after an sgemm on stream 20, then cudaStreamWaitEvent(stream 24) -> the next op on stream 24 (a memset)
    # must wait for that sgemm. cuda_sync records are not ops and create no lanes.
    a = analyze_run(data_path("traces", "hta_testdata", "critical_path", "cuda_event_sync_multi_stream",
                                "event_sync_trace.json.gz"))
    G = a.graph
    ev = [(G.nodes[u], G.nodes[v]) for u, v, t in G.edges(data="type") if t == "event"]
    assert len(ev) == 1
    src, dst = ev[0]
    assert src["lane"] == "stream:0:20" and src["name"].startswith("ampere_sgemm")
    assert dst["lane"] == "stream:0:24" and dst["name"].startswith("Memset")
    assert {d["lane"] for _, d in G.nodes(data=True)} == {"stream:0:20", "stream:0:24", "stream:0:28",
                                                          "thread:3727853"}
