"""Physical monotonicity of the step price, on published runs of four kinds, each planned as ``bench/dev_set.py
--profile-only`` plans it (its layout pinned, its stack profile).

Two truths that need no measurement: a faster network between nodes never makes the same layout's step slower (nor a
slower one faster), and twice the global batch on the same layout takes at least the step it took and at most twice
it (twice the micro-batches through the same kernels and links; the pipeline fill, gradient exchange and optimizer
step are paid once either way). A price that breaks either has an error somewhere that the published step times
alone would not show: it could cancel against another. Over every priced dev-set row (258 of them, 2026-11-29) none
broke either, network x0.5 / x2 and batch x2 (``bench/monotone.py``; BENCHMARKS.md, "The step price is monotone in
the network and the batch"); these four rows keep the check in the default suite.
"""
from __future__ import annotations

import pytest

from tests.helpers import data_path, load_bench, load_dev_set

dev_set = load_dev_set()
monotone = load_bench("monotone", "check_row")

ROWS = (
    "nemo2407-gpt3-175b-512",  # dense, TP 4 x PP 8 interleaved over 64 nodes' InfiniBand (NeMo 24.07)
    "mbridge26.04-deepseekv3-gb200-mxfp8",  # MoE on NVL72 racks, MXFP8, host wait, Hybrid-EP (Megatron-Bridge)
    "automodel-dsv3-256",  # FSDP2 + PP over 32 nodes, DeepEP across nodes (NeMo AutoModel)
    "row52",  # dense FSDP2 over 128 GPUs (torchtitan)
)


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """Each row's step at its own network and batch, at half and twice the network, at twice the batch
    (``bench/monotone.py``'s ``check_row``: the prices, whose comparisons are made here)."""
    runs, out = data_path("published_runs"), tmp_path_factory.mktemp("monotone")
    rows = {r["name"]: r for r in dev_set.load_rows(runs)}
    got = {}
    for name in ROWS:
        inp = dev_set.row_needs(rows[name], runs, True)
        assert not inp.missing and not inp.out_of_scope, (name, inp.missing, inp.out_of_scope)
        got[name] = monotone.check_row(inp, out)
        assert got[name] is not None, name
    return got


@pytest.mark.parametrize("name", ROWS)
def test_a_faster_network_never_prices_a_step_slower(records, name):
    rec = records[name]
    base, slower, faster = rec["step_s"], rec["net_s"]["0.5"], rec["net_s"]["2.0"]
    assert faster <= base * (1 + 1e-9) <= slower * (1 + 1e-9), (name, slower, base, faster)
    # the network carries something in each of these runs: halving it costs time
    assert slower > base, (name, slower, base)


@pytest.mark.parametrize("name", ROWS)
def test_twice_the_batch_takes_between_once_and_twice_the_step(records, name):
    base, double = records[name]["step_s"], records[name]["batch_x2_s"]
    assert base <= double <= 2 * base, (name, base, double)
