"""Every Megatron-Bridge performance preset prices as a run kept apart would reach it (``bench/preset_coverage.py``).

A published row meshplan never saw (the performance tables' DGX-H100 rows, other releases) is priced from its table's
facts and its release's ``megatron-bridge-perf`` profile, whose launcher preset supplies the rest. A preset meshplan
refuses is a published run it could not judge: Megatron-Bridge's H100 presets of Nemotron 3 Nano graph the mixers
alone and recompute the MoE block, which meshplan refused until it could say ``cuda_graphs=mixers``.
"""
from __future__ import annotations

import json
from collections import Counter

import pytest

from tests.helpers import data_path, jsonl_rows, load_bench, load_dev_set

dev_set = load_dev_set()
coverage = load_bench("preset_coverage", "coverage")


def test_the_newest_releases_h100_presets_all_price() -> None:
    """The newest profile's DGX-H100 presets, pre-training, SFT and LoRA: the Nemotron 3 Nano ones among them."""
    newest = coverage.bridge_profiles()[-1]
    records = coverage.coverage(data_path("published_runs"), [newest], {"H100-SXM"})
    assert Counter(r["status"] for r in records) == {"priced": len(records)}, [
        (r["preset"], r["detail"]) for r in records if r["status"] != "priced"]
    # and as table rows, the path a kept-apart row of the performance tables takes (where the dev set has a row of
    # that model and task to write it from)
    tables = Counter(r["table_status"] for r in records)
    assert set(tables) <= {"priced", "no dev-set row"} and tables["priced"] >= 30, [
        (r["preset"], r["table_detail"]) for r in records if r["table_status"] not in ("priced", "no dev-set row")]
    nano = [r for r in records if r["preset"].startswith("NEMOTRON_3_NANO_PRETRAIN_CONFIG_H100")]
    assert len(nano) == 2 and {r["seq"] for r in nano} == {8192}  # the dev set's Nano rows state 8192


@pytest.mark.slow
def test_every_preset_of_every_release_prices() -> None:
    """Every preset of every release from v0.2.0 (NeMo 25.11) on prices on its own GPU, as a row of a source without a
    mapping and as a table row. r0.1.0's perf matrices (25.09) list a precision per GPU even where the matrix gives
    it no block, whose launcher then runs the common block's batch with tp = pp = 1 (``utils/helpers.py
    apply_perf_matrix_overrides``): Megatron-Core refuses those meshes (a global batch below the data-parallel size,
    virtual stages without a pipeline), and so does meshplan, in one line that says so; and it lists MXFP8 entries
    for H100, which has no block-scaled tensor cores."""
    records = coverage.coverage(data_path("published_runs"), coverage.bridge_profiles())
    ok = ("priced", "precision not on this part", "no dev-set row")
    bad = [r for r in records if r["status"] not in ok]
    bad += [r | {"detail": r["table_detail"]} for r in records if r["table_status"] not in ok]
    assert all(r["profile"].endswith("@25.09") and r["preset"].startswith("perf_matrix.") for r in bad), bad
    assert all("not divisible" in r["detail"] or "needs pipeline parallelism" in r["detail"] for r in bad), bad
    skipped = [r for r in records if r["status"] == "precision not on this part"]
    assert skipped and all(r["gpu"] == "H100-SXM" for r in skipped)
    assert len(records) > 1000


def test_a_kept_apart_table_row_under_a_mixers_preset_prices(tmp_path):
    """A DGX-H100 row of the performance tables, as the dev set's own rows are written (its release's preset quoted
    under ``recipe``), under Nemotron 3 Nano's H100 preset (``cuda_graph_scope`` attn + mamba, the MoE block
    recomputed): the harness reads its graphs as the mixers alone and prices it. The row is the dev set's GB200 Nano
    row restated for 16 H100s with the H100 preset's settings (v0.5.0 nemotron_3_workload_base_configs.py)."""
    from meshplan.planner.search.workloads import load_workloads

    base = next(r for r in jsonl_rows(data_path("published_runs", "blackwell_dev.jsonl"))
                if r["name"] == "mbridge26.06-nemotron3-nano-gb200-mxfp8")
    preset = next(p for p in load_workloads("megatron-bridge-perf@26.06").presets
                  if p.name == "NEMOTRON_3_NANO_PRETRAIN_CONFIG_H100_BF16_V1")
    row = {**base, "name": "h100-nano", "gpu": "H100-SXM 80GB (DGX-H100)", "system": "DGX-H100", "gpus_per_node": 8,
           "nvlink_domain": 8, "n_gpus": 16, "dp": 16, "mbs": 1, "gbs": 1024, "dtype": "bf16",
           "precision_recipe": "BF16",
           "recipe": {**base["recipe"], "workload_config": preset.name, "workload_settings": dict(preset.settings)}}
    assert dev_set.bridge_cuda_graphs(row) == "mixers only"  # (a KeyError before ``mixers``)
    res = dev_set.price_row(row, data_path("published_runs"), tmp_path)  # (DGX-H100 named no device before)
    assert res.status == "priced", res.detail
    assert "cuda_graphs=mixers" in res.inputs["fix"] or "cuda_graphs=mixers" in res.inputs["from_profile"]


def test_a_kept_apart_row_whose_recipe_leaves_a_stage_without_a_decoder_layer_prices_approximated(tmp_path):
    """DeepSeek-V3's H100 presets lay 61 layers over pp 8 x vpp 4 as 'Et|(tt|)*30mL' (v0.5.1
    deepseek_workload_base_configs.py): one layer with the embedding, thirty stages of two, and a last virtual stage
    holding the MTP module and the loss alone, which meshplan's split cannot hold. A DGX-H100 table row under it
    (the dev set's GB200 DeepSeek-V3 row restated with the preset's facts) is priced at the nearest split, a layer
    moved into that stage from the one before, and counted as approximated, not refused."""
    from meshplan.planner.layout.splits import format_pp_layout
    from meshplan.planner.search.workloads import load_workloads

    assert dev_set._fill_empty_stages([1] + [2] * 30 + [0]) == [1] + [2] * 29 + [1, 1]
    assert dev_set._fill_empty_stages([0, 2, 1]) == [1, 1, 1] and dev_set._fill_empty_stages([1, 1, 0]) is None
    base = next(r for r in jsonl_rows(data_path("published_runs", "blackwell_dev.jsonl"))
                if r["name"] == "mbridge26.06-deepseekv3-gb200-mxfp8")
    preset = next(p for p in load_workloads("megatron-bridge-perf@26.06.01").presets
                  if p.name == "DEEPSEEK_V3_PRETRAIN_CONFIG_H100_BF16_V1")
    row = {**base, "name": "h100-dsv3", "gpu": "H100-SXM 80GB (DGX-H100)", "system": "DGX-H100", "gpus_per_node": 8,
           "nvlink_domain": 8, "n_gpus": 1024, "tp": 2, "pp": 8, "pp_interleave": 4, "cp": 1, "ep": 64, "dp": 64,
           "mbs": 1, "gbs": 8192, "dtype": "bf16", "precision_recipe": "BF16",
           "recompute": "selective, recompute_modules=['mla_up_proj', 'mlp']",
           "recipe": {**base["recipe"], "workload_config": preset.name, "workload_settings": dict(preset.settings)}}
    for alone in (False, True):
        res = dev_set.price_row(row, data_path("published_runs"), tmp_path, profile_only=alone)
        assert res.status == "priced", res.detail
    inp = dev_set.row_needs(row, data_path("published_runs"))
    assert [nd.key for nd in inp.approximated] == ["pp_layout"]
    assert inp.fix["pp_layout"] == format_pp_layout([1] + [2] * 29 + [1, 1])


def test_a_table_row_meshplan_cannot_read_does_not_stop_the_others(tmp_path):
    """A folder of table rows, one naming a system the catalogue lacks: that row is reported not expressible in one
    line naming the system, and the other still prices (``bench/dev_set.py RUNS_DIR`` runs every row)."""
    base = next(r for r in jsonl_rows(data_path("published_runs", "blackwell_dev.jsonl"))
                if r["name"] == "mbridge26.06-qwen3-30b-a3b-gb300-mxfp8")
    base = {**base, "config": "qwen3-30b-a3b"}  # meshplan's preset: the folder holds no config files
    odd = {**base, "name": "odd-system", "system": "DGX-X999", "gpu": "X999 (DGX-X999)"}
    (tmp_path / "kept_apart.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (base, odd)))
    results, _ = dev_set.run(tmp_path, ("kept_apart.jsonl",), profile_only=True)
    got = {r.name: r for r in results}
    assert got[base["name"]].status == "priced"
    assert got["odd-system"].status == "not expressible" and "X999" in got["odd-system"].detail
    assert "\n" not in got["odd-system"].detail
