"""Clock alignment from collective end times (issue 3, item 3)."""
from __future__ import annotations

from meshplan.profiler.align import estimate_offsets
from meshplan.profiler.match import match_collectives
from meshplan.profiler.runs import load_run
from tests.helpers import data_path

DLRM = ("traces", "param_dlrm_8rank", "dlrm_kineto.tar.gz")


def test_dlrm_one_host_offsets_near_zero():
    # One node, one clock: PROVENANCE.md says NCCL kernel ends agree within 1-7 µs, so offsets must be ~0.
    run = load_run(data_path(*DLRM))
    groups, warnings = match_collectives(run)
    assert warnings == []
    assert len(groups) == 8 and all(g.complete and len(g.members) == 8 for g in groups)
    a = estimate_offsets(run, groups)
    assert a.n_collectives == 8 and a.unaligned == []
    assert all(abs(v) <= 10.0 for v in a.offsets_us.values()), a.offsets_us


def test_dlrm_shifted_rank_recovered():
    run = load_run(data_path(*DLRM))
    run.ranks[5].shift(3000.0)  # rank 5's clock runs 3 ms ahead
    groups, _ = match_collectives(run)
    a = estimate_offsets(run, groups)
    assert abs(a.offsets_us[5] - (-3000.0)) <= 20.0, a.offsets_us
    assert all(abs(v) <= 10.0 for r, v in a.offsets_us.items() if r != 5)


def test_reference_rank_shift_moves_everyone_else():
    # Shifting the reference rank (0) by +3 ms is the same as shifting all others by -3 ms.
    run = load_run(data_path(*DLRM))
    run.ranks[0].shift(3000.0)
    groups, _ = match_collectives(run)
    a = estimate_offsets(run, groups)
    assert a.offsets_us[0] == 0.0
    assert all(abs(v - 3000.0) <= 20.0 for r, v in a.offsets_us.items() if r != 0)


def test_partial_pair_is_not_aligned_and_says_so():
    # 2 sampled ranks of a 128-rank job: no complete collective, so no offsets are invented.
    run = load_run(data_path("traces", "hta_testdata", "trace_filter"))
    groups, _ = match_collectives(run)
    a = estimate_offsets(run, groups)
    assert a.n_collectives == 0 and a.offsets_us == {0: 0.0, 1: 0.0} and a.unaligned == [0, 1]


def test_one_offset_per_host():
    # Pretend ranks 4-7 ran on a second host whose clock is 3 ms ahead: one offset for the four of them.
    run = load_run(data_path(*DLRM))
    for r, t in run.ranks.items():
        t.hostname = "hostA" if r < 4 else "hostB"
        if r >= 4:
            t.shift(3000.0)
    groups, _ = match_collectives(run)
    a = estimate_offsets(run, groups)
    assert {a.offsets_us[r] for r in range(4)} == {0.0}
    assert len({a.offsets_us[r] for r in range(4, 8)}) == 1
    assert abs(a.offsets_us[4] + 3000.0) <= 20.0


def test_same_host_cpu_run_has_zero_offsets():
    # The gloo fixture's ranks both report host_name "vm": one clock, so no offset even though gloo worker
    # threads end the same all-reduce up to ms apart on a loaded machine.
    from tests.helpers import DATA

    run = load_run(DATA / "profiler" / "gloo_ddp_2rank")
    assert {t.hostname for t in run.ranks.values()} == {"vm"}
    groups, _ = match_collectives(run)
    assert estimate_offsets(run, groups).offsets_us == {0: 0.0, 1: 0.0}
