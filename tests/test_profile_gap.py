"""``bench/profile_gap.py``: the excess of pricing from profiles alone over the recipes' settings, by per-row key."""
from __future__ import annotations

import importlib.util

import pytest

from tests.helpers import REPO

_spec = importlib.util.spec_from_file_location("profile_gap", REPO / "bench" / "profile_gap.py")
profile_gap = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(profile_gap)


def _row(name: str, error, per_row=(), source="B1") -> dict:
    return {"name": name, "source": source, "error": error, "inputs": {"per_row": list(per_row)}}


def test_each_key_sums_the_excess_of_the_rows_that_carry_it():
    """Three B1 rows priced both ways, one refused from profiles, one of another source. Worked by hand: excesses
    |0.30| - |0.05| = 0.25 (graphs and overlap), |-0.20| - |-0.10| = 0.10 (graphs), |0.02| - |0.04| = -0.02 (none);
    over the 3 rows graphs = (0.25 + 0.10) / 3, overlap = 0.25 / 3; the means 6.33% and 17.33%."""
    recipe = {r["name"]: r for r in (
        _row("a", 0.05, ("cuda_graphs=iteration: preset", "moe_overlap=true: preset")),
        _row("b", -0.10, ("cuda_graphs=layers: preset", "cuda_graphs=layers: said twice")),
        _row("c", 0.04), _row("d", 0.10, ("pp_layout=4*15+1: preset",)), _row("e", 0.5, ("mtp=1: x",), "S5"))}
    profile = {r["name"]: r for r in (_row("a", 0.30), _row("b", -0.20), _row("c", 0.02), _row("d", None),
                                      _row("e", 0.0, source="S5"))}
    out = profile_gap.gap(recipe, profile, "B1")
    assert out["rows"] == 3
    assert out["recipe_mean_abs"] == pytest.approx(100 * (0.05 + 0.10 + 0.04) / 3)
    assert out["profile_mean_abs"] == pytest.approx(100 * (0.30 + 0.20 + 0.02) / 3)
    by = {k["key"]: k for k in out["by_key"]}
    assert set(by) == {"cuda_graphs", "moe_overlap"}
    assert by["cuda_graphs"]["rows"] == 2 and by["cuda_graphs"]["points"] == pytest.approx(100 * 0.35 / 3)
    assert by["moe_overlap"]["rows"] == 1 and by["moe_overlap"]["points"] == pytest.approx(100 * 0.25 / 3)
    assert [k["key"] for k in out["by_key"]] == ["cuda_graphs", "moe_overlap"]


def test_a_source_with_no_row_priced_both_ways_is_empty():
    recipe = {"a": _row("a", 0.1, ("mtp=1: x",))}
    assert profile_gap.gap(recipe, {"a": _row("a", None)}, "B1")["rows"] == 0
    assert profile_gap.gap(recipe, recipe, "S1")["by_key"] == []
