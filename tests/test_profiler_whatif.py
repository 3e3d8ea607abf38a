"""What-if knobs: each one moves the prediction the right way, by the hand-computed amount on small graphs."""
from __future__ import annotations

import pytest

from meshplan.core.errors import MeshplanError
from meshplan.profiler.dataflow_graph import GraphBuilder
from meshplan.profiler.fusion import rebucket_allreduces
from meshplan.profiler.replay import replay
from meshplan.profiler.report import analyze_run
from meshplan.profiler.whatif import apply_whatif, fit_alpha_beta, parse_knob
from tests.helpers import DATA

MS = 1e-3
MB = 1e6


def _dp_graph():
    """2 ranks: launch (1 ms) -> fwd (rank0 2 ms, rank1 5 ms) -> all-reduce (0.5 ms) -> opt (1 ms, rank 0)."""
    b = GraphBuilder()
    for r, fwd in ((0, 2), (1, 5)):
        h = b.add_op(r, "host", "host", "launch", 1 * MS, peer=("h", 0))
        c = b.add_op(r, "stream", "compute", "fwd", fwd * MS, deps=[h], peer=("fwd", 0))
        a = b.add_op(r, "comm", "comm", "nccl:all_reduce", 0.5 * MS, deps=[c], coll="x", coll_type="allreduce",
                     peer=("ar", 0))
        if r == 0:
            b.add_op(r, "stream", "compute", "opt", 1 * MS, deps=[a], peer=("opt", 0))
    return b.build()


@pytest.mark.parametrize("knob,expected_ms", [
    (None, 7.5),                 # 1 + 5 (rank 1's fwd) + 0.5 + 1
    ("compute=0.5", 4.5),        # 1 + 2.5 + 0.5 + 0.5
    ("compute=2", 13.5),         # 1 + 10 + 0.5 + 2
    ("comm=2", 8.0),
    ("name~allreduce=0", 7.0),   # "allreduce" matches "nccl:all_reduce" (underscores ignored)
    ("host=0", 6.5),
    ("compute@1=2", 12.5),       # only rank 1's fwd: 1 + 10 + 0.5 + 1
    ("compute@0=0.5", 7.0),      # rank 0's fwd and opt halve; the collective still waits for rank 1: 6.5 + 0.5
    ("stragglers=median", 6.0),  # fwd -> median(2, 5) = 3.5 on both ranks: 1 + 3.5 + 0.5 + 1
    ("all=0.5", 3.75),
])
def test_knobs_on_hand_graph(knob, expected_ms):
    G = _dp_graph()
    H = apply_whatif(G, [parse_knob(knob)]) if knob else G
    assert replay(H).steps[0] == pytest.approx(expected_ms * MS)
    assert replay(G).steps[0] == pytest.approx(7.5 * MS)  # the input graph is not modified


def test_alpha_beta_fit_and_bandwidth_knob():
    # Linear ground truth t = 100 µs + bytes * 0.1 ns (10 GB/s): the fit must recover it exactly.
    b = GraphBuilder()
    for r in (0, 1):
        for i, mb in enumerate((1, 3, 8)):
            b.add_op(r, "comm", "comm", "allreduce", 100e-6 + mb * MB * 1e-10, coll=f"c{i}", coll_type="allreduce",
                     nbytes=mb * MB)
    G = b.build()
    alpha, beta = fit_alpha_beta(G)["allreduce"]
    assert alpha == pytest.approx(100e-6) and beta == pytest.approx(1e-10)
    base = replay(G).steps[0]
    fast = replay(apply_whatif(G, [parse_knob("bandwidth=2")])).steps[0]
    # 3 latency terms stay, the bandwidth terms halve: 0.3 ms + 1.2 ms / 2
    assert base == pytest.approx(0.3e-3 + 1.2e-3) and fast == pytest.approx(0.3e-3 + 0.6e-3)


def _ddp_backward():
    """2 ranks: 4 backward ops of 1 ms, each followed by a 1 MB gradient all-reduce; optimizer waits for all."""
    b = GraphBuilder()
    for r in (0, 1):
        ars = []
        for i in range(4):
            c = b.add_op(r, "stream", "compute", f"bwd{i}", 1 * MS)
            ars.append(b.add_op(r, "comm", "comm", "allreduce", 0.5 * MS, deps=[c], coll=f"ar{i}",
                                coll_type="allreduce", nbytes=1 * MB, dep_type="launch"))
        b.add_op(r, "host", "host", "optimizer", 1 * MS, deps=ars, dep_type="wait")
    return b.build()


@pytest.mark.parametrize("bucket_mb,expected_ms", [
    (1, 5.5),    # unchanged buckets: last all-reduce 4.0-4.5, optimizer 4.5-5.5
    (4, 6.7),    # one bucket after all backward: 4.0 + (0.1 + 1.6) + 1
    (2, 5.9),    # two buckets, ready at 2 and 4 ms: 4.0 + 0.9 + 1
    (0.5, 5.6),  # eight buckets of 0.3 ms, pairs ready at 1..4 ms: 4.0 + 0.6 + 1
])
def test_bucket_size_rebucketing(bucket_mb, expected_ms):
    # Priced with known alpha = 0.1 ms, beta = 0.4 ms/MB (so an original 1 MB bucket costs its 0.5 ms).
    G = _ddp_backward()
    H = rebucket_allreduces(G, bucket_mb * MB, {"allreduce": (0.1 * MS, 0.4 * MS / MB)})
    assert replay(H).steps[0] == pytest.approx(expected_ms * MS)
    n_ar = sum(1 for _, a in H.nodes(data=True) if a["kind"] == "comm")
    assert n_ar == 2 * max(1, round(4 / bucket_mb))


def test_bucket_knob_through_parser():
    G = _ddp_backward()  # all buckets 1 MB: the fit falls back to alpha = 10 µs, beta from the mean
    one = replay(apply_whatif(G, [parse_knob("bucket=4MB")])).steps[0]
    assert one > replay(G).steps[0]  # one big bucket loses all overlap with backward


@pytest.mark.parametrize("bad", ["compute", "foo=1", "compute=-1", "compute=abc", "bucket=lots", "compute@x=2",
                                 "bandwidth=0", "stragglers=max"])
def test_bad_knobs(bad):
    with pytest.raises(MeshplanError, match="what-if"):
        parse_knob(bad)


@pytest.mark.parametrize("bad", ["tp=abc", "tp=2", "name~=1"])
def test_an_unknown_knob_is_named_before_its_value(bad):
    """A knob that does not exist is the error, whatever its value (``tp=abc`` said the value was not a number)."""
    with pytest.raises(MeshplanError, match="unknown knob"):
        parse_knob(bad)


@pytest.fixture(scope="module")
def gloo():
    return analyze_run(DATA / "profiler" / "gloo_ddp_2rank")


@pytest.mark.parametrize("knob,direction", [("compute=0.5", -1), ("compute=1.5", +1), ("comm=2", +1),
                                            ("comm=0.5", -1), ("compute@1=2", +1), ("bucket=64KB", +1)])
def test_knobs_move_real_cpu_run(gloo, knob, direction):
    base = replay(gloo.graph).steps
    new = replay(apply_whatif(gloo.graph, [parse_knob(knob)])).steps
    moved = [(new[s] - base[s]) * direction for s in base]
    assert all(m >= -1e-9 for m in moved) and sum(moved) > 0.01 * sum(base.values()), (knob, base, new)
