"""``bench/host_wait_implied.py``: the MoE host wait priced on the dev set's rows beside the wait their published
steps leave room for. The arithmetic is checked by hand on made-up rows, and one real row's layer forwards against
its table's own counts."""
from __future__ import annotations

import pytest

from tests.helpers import data_path, load_bench

hwi = load_bench("host_wait_implied", "implied")


def _row(name, published, predicted, wait_s, forwards, pp, host):
    return {"name": name, "published_step_s": published, "predicted_step_s": predicted, "wait_s": wait_s,
            "layer_forwards": forwards, "pp": pp, "cuda_graphs": "partial", "host": host}


def test_the_implied_wait_is_the_priced_one_less_the_rows_error():
    """Priced 4 s over 2,000 layer forwards (2 ms each); the row is priced 3 s slower than published, so the wait
    would be 1 s (0.5 ms) with everything else right: half the priced one. Priced 1 s faster: 2.5 ms, 1.25 of it."""
    over = hwi.implied(_row("a", 20.0, 23.0, 4.0, 2000, 1, "grace"))
    assert (over["priced_ms"], over["implied_ms"], over["implied_over_priced"]) == pytest.approx((2.0, 0.5, 0.25))
    under = hwi.implied(_row("b", 20.0, 19.0, 4.0, 2000, 1, "grace"))
    assert (under["implied_ms"], under["implied_over_priced"]) == pytest.approx((2.5, 1.25))


def test_the_summary_groups_by_pipelining_and_host():
    rows = [hwi.implied(r) for r in (_row("a", 20.0, 23.0, 4.0, 2000, 1, "grace"),
                                     _row("b", 20.0, 19.0, 4.0, 2000, 1, "grace"),
                                     _row("c", 10.0, 10.0, 1.0, 1000, 8, "x86"))]
    got = {(s["pipelined"], s["host"]): s for s in hwi.summary(rows)}
    assert set(got) == {(False, "grace"), (True, "x86")}
    assert got[(False, "grace")]["rows"] == 2
    assert got[(False, "grace")]["median_implied_over_priced"] == pytest.approx((0.25 + 1.25) / 2)
    assert got[(True, "x86")]["median_implied_over_priced"] == pytest.approx(1.0)


def test_a_real_row_pays_its_wait_over_its_tables_micro_batches():
    """Qwen3-235B-A22B on 256 GB200s at 26.04 (dp 32, micro-batch 1, global batch 8192: 256 micro-batches, the
    table's own numbers) waits at its per-layer graphs' syncs on a Grace host, pipelined over 8 stages."""
    (row,) = hwi.priced_rows(data_path("published_runs"), "mbridge26.04-qwen3-235b-a22b-gb200-mxfp8")
    assert row["pp"] == 8 and row["host"] == "grace" and row["cuda_graphs"] == "partial"
    assert row["layer_forwards"] % 256 == 0 and row["wait_s"] > 0
