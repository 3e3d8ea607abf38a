"""Every Megatron-Bridge performance preset prices as a run kept apart would reach it (``bench/preset_coverage.py``).

A published row meshplan never saw (the performance tables' DGX-H100 rows, other releases) is priced from its table's
facts and its release's ``megatron-bridge-perf`` profile, whose launcher preset supplies the rest. A preset meshplan
refuses is a published run it could not judge: Megatron-Bridge's H100 presets of Nemotron 3 Nano graph the mixers
alone and recompute the MoE block, which meshplan refused until it could say ``cuda_graphs=mixers``.
"""
from __future__ import annotations

from collections import Counter

import pytest

from tests.helpers import data_path, load_bench, load_dev_set

load_dev_set()
coverage = load_bench("preset_coverage", "coverage")


def test_the_newest_releases_h100_presets_all_price() -> None:
    """The newest profile's DGX-H100 presets, pre-training, SFT and LoRA: the Nemotron 3 Nano ones among them."""
    newest = coverage.bridge_profiles()[-1]
    records = coverage.coverage(data_path("published_runs"), [newest], {"H100-SXM"})
    assert Counter(r["status"] for r in records) == {"priced": len(records)}, [
        (r["preset"], r["detail"]) for r in records if r["status"] != "priced"]
    nano = [r for r in records if r["preset"].startswith("NEMOTRON_3_NANO_PRETRAIN_CONFIG_H100")]
    assert len(nano) == 2 and {r["seq"] for r in nano} == {8192}  # the dev set's Nano rows state 8192


@pytest.mark.slow
def test_every_preset_of_every_release_prices() -> None:
    """Every preset of every release from v0.2.0 (NeMo 25.11) on prices on its own GPU. r0.1.0's perf matrices
    (25.09) list a precision per GPU even where the matrix gives it no block, whose launcher then runs the common
    block's batch with tp = pp = 1 (``utils/helpers.py apply_perf_matrix_overrides``): Megatron-Core refuses those
    meshes (a global batch below the data-parallel size, virtual stages without a pipeline), and so does meshplan,
    in one line that says so; and it lists MXFP8 entries for H100, which has no block-scaled tensor cores."""
    records = coverage.coverage(data_path("published_runs"), coverage.bridge_profiles())
    bad = [r for r in records if r["status"] not in ("priced", "precision not on this part")]
    assert all(r["profile"].endswith("@25.09") and r["preset"].startswith("perf_matrix.") for r in bad), bad
    assert all("not divisible" in r["detail"] or "needs pipeline parallelism" in r["detail"] for r in bad), bad
    skipped = [r for r in records if r["status"] == "precision not on this part"]
    assert skipped and all(r["gpu"] == "H100-SXM" for r in skipped)
    assert len(records) > 1000
