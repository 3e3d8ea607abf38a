"""``bench/part_pairs.py``: runs published twice, on two systems, set beside meshplan's prices of both."""
from __future__ import annotations

import importlib.util

import pytest

from tests.helpers import REPO, data_path, jsonl_rows, load_dev_set

dev_set = load_dev_set()
_spec = importlib.util.spec_from_file_location("part_pairs", REPO / "bench" / "part_pairs.py")
part_pairs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(part_pairs)

PAIR = ("mbridge25.09-llama3-8b-b200-fp8-unstated", "mbridge25.09-llama3-8b-gb200-fp8-unstated")
OTHER_LAYOUT = "mbridge25.09-llama3-8b-gb200-fp8-32x32"  # same model and systems, another precision and fix


@pytest.fixture(scope="module")
def results():
    """The three rows as ``bench/dev_set.py --json`` writes them, with made-up prices (2 s on the B200, 1 s on
    the GB200): the pairing and the ratios are under test, not the prices."""
    runs = data_path("published_runs")
    by = {r["name"]: r for r in jsonl_rows(runs / "blackwell_dev.jsonl")}
    out = []
    for name, priced in zip((*PAIR, OTHER_LAYOUT), (2.0, 1.0, 1.0)):
        inp = dev_set.row_needs(by[name], runs)
        out.append({"name": name, "status": "priced", "published_step_s": inp.published_step_s,
                    "predicted_step_s": priced, "inputs": dev_set._inputs_dict(inp)})
    return out


def test_a_pair_is_the_same_run_on_two_systems(results):
    """One pair: the 32x32 row has another fix string, so it pairs with neither. The published ratio is the table's
    own: 8 GPUs each, GBS 128 x 8192, so B200 step / GB200 step = GB200 tokens/s/GPU over B200's, 31357 / 29994
    (the two quoted 25.09 rows)."""
    found = part_pairs.pairs(results)
    assert len(found) == 1
    (pair,) = found
    assert pair["systems"] == "B200 / GB200" and pair["run"] == "mbridge25.09-llama3-8b-*-fp8-unstated"
    assert pair["published_ratio"] == pytest.approx(31357 / 29994, rel=1e-3)
    assert pair["priced_ratio"] == pytest.approx(2.0)
    assert pair["priced_over_published"] == pytest.approx(2.0 * 29994 / 31357, rel=1e-3)
    (summary,) = part_pairs.by_systems(found)
    assert summary == {"systems": "B200 / GB200", "runs": 1,
                       "median_priced_over_published": pair["priced_over_published"]}


def test_unpriced_rows_make_no_pair(results):
    refused = [dict(r, status="refused OOM") if r["name"] == PAIR[1] else r for r in results]
    assert part_pairs.pairs(refused) == []
