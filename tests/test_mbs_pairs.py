"""``bench/mbs_pairs.py``: one model, system and mesh published at two micro-batch sizes, beside meshplan's prices."""
from __future__ import annotations

import importlib.util

import pytest

from tests.helpers import REPO, data_path, jsonl_rows, load_dev_set

dev_set = load_dev_set()
_spec = importlib.util.spec_from_file_location("mbs_pairs", REPO / "bench" / "mbs_pairs.py")
mbs_pairs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mbs_pairs)

SMALL, LARGE = "mbridge26.02-qwen3-30b-a3b-b200-mxfp8", "mbridge26.02.01-qwen3-30b-a3b-b200-mxfp8"  # mbs 1 and 4
OTHER_SYSTEM = "mbridge26.02-qwen3-30b-a3b-gb200-mxfp8"  # the same mesh at mbs 4 on another system


@pytest.fixture(scope="module")
def results():
    """The three rows as ``bench/dev_set.py --json`` writes them, with made-up prices (16 s at micro-batch 1, 8 s
    at 4): the pairing and the ratios are under test, not the prices."""
    runs = data_path("published_runs")
    by = {r["name"]: r for r in jsonl_rows(runs / "blackwell_dev.jsonl")}
    out = []
    for name, priced in zip((SMALL, LARGE, OTHER_SYSTEM), (16.0, 8.0, 8.0)):
        inp = dev_set.row_needs(by[name], runs, profile_only=True)
        out.append({"name": name, "status": "priced", "published_step_s": inp.published_step_s,
                    "predicted_step_s": priced, "inputs": dev_set._inputs_dict(inp)})
    return out


def test_a_pair_is_one_mesh_at_two_micro_batch_sizes(results):
    """One pair: the GB200 row shares the mesh but not the system. 8 GPUs, DP 8, GBS 512 x 4096 tokens: a rank runs
    64 micro-batches at MBS 1 and 16 at MBS 4, so one micro-batch takes 4096 x MBS / (tokens/s/GPU) seconds: the
    quoted rows' 9691 (26.02, MBS 1) and 26695 (26.02.01, MBS 4) tokens/s/GPU give the published ratio
    (1 / 9691) / (4 / 26695); the made-up prices (16 s / 64) / (8 s / 16) = 0.5."""
    found = mbs_pairs.pairs(results)
    assert len(found) == 1
    (pair,) = found
    assert pair["rows"] == f"{SMALL} / {LARGE}" and pair["mbs"] == "1 / 4" and pair["system"] == "DGX-B200"
    assert pair["published_s_per_micro_batch"][0] == pytest.approx(4096 / 9691, rel=1e-3)
    assert pair["published_ratio"] == pytest.approx((1 / 9691) / (4 / 26695), rel=1e-3)
    assert pair["token_ratio"] == pytest.approx(0.25)
    assert pair["priced_ratio"] == pytest.approx(0.5)
    assert pair["priced_over_published"] == pytest.approx(0.5 / ((1 / 9691) / (4 / 26695)), rel=1e-3)
    assert "moe_dispatcher=alltoall" in pair["differs"] and "moe_dispatcher=hybridep" in pair["differs"]


def test_unpriced_rows_make_no_pair(results):
    refused = [dict(r, status="refused OOM") if r["name"] == LARGE else r for r in results]
    assert mbs_pairs.pairs(refused) == []
