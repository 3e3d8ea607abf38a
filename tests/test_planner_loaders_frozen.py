"""The planner's cached loaders hand out read-only values: a caller that edits what it got cannot change what the
next caller gets (model presets, link families)."""
from __future__ import annotations

import pytest

from meshplan.core.frozen import freeze
from meshplan.planner.cluster.links import link_families
from meshplan.planner.model.config import list_presets, load_model


def test_freeze_reaches_every_level() -> None:
    got = freeze({"a": [1, {"b": [2]}]})
    with pytest.raises(TypeError):
        got["a"] = 0
    with pytest.raises(TypeError):
        got["a"][1]["b"] = ()
    assert got["a"][1]["b"] == (2,)


def test_link_families_cannot_be_edited() -> None:
    fams = link_families()
    with pytest.raises(TypeError):
        fams["dgx-h100"] = None
    assert link_families()["dgx-h100"].intra.name == fams["dgx-h100"].intra.name


def test_a_listed_preset_edited_by_one_caller_is_intact_for_the_next() -> None:
    first = list_presets()
    first[0]["aliases"].append("not-an-alias")
    first[0]["name"] = "edited"
    again = list_presets()
    assert again[0]["name"] != "edited" and "not-an-alias" not in again[0]["aliases"]
    spec = load_model(again[0]["name"])
    with pytest.raises(Exception):
        spec.num_layers = 0  # ModelSpec is frozen
