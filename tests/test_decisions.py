"""Each decision is declared once (``planner.layout.decisions``): the plan file's schema, ``--fix``, the layout
space, ``Layout``, ``meshplan plan --help`` and ``docs/decisions.md`` all agree with the registry."""
from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from meshplan.cli.main import app
from meshplan.planner.layout.decisions import DECISIONS, Decision
from meshplan.planner.layout.decisions_page import render
from meshplan.planner.layout.layout import DEGREE_NAMES, Layout
from meshplan.planner.layout.space import DEGREE_KEYS, FIX_KEYS, STAGE_KEYS, Pins, enumerate_layouts, parse_fix
from meshplan.planner.model.config import load_model
from meshplan.planner.plan.build import plan_layout
from meshplan.planner.plan.schema import OMIT_AT_DEFAULT, Plan, load_plan
from tests.helpers import REPO


def _other_value(d: Decision) -> object:
    """A value of ``d`` other than its default (what the round trips below carry)."""
    if d.kind == "recompute":
        return "full:2"
    if d.kind == "stages":
        return (7, 9, 8, 8)
    if d.kind in ("bool", "tristate"):
        return True
    if d.choices:
        return d.choices[-1] if d.choices[-1] != d.default else d.choices[0]
    return d.lo + 1.5 if d.kind == "float" else int(d.lo) + 2


def test_layout_is_the_degrees_and_the_registry() -> None:
    names = [f.name for f in dataclasses.fields(Layout)]
    assert names == [*DEGREE_NAMES, *DECISIONS]
    for d in DECISIONS.values():
        assert getattr(Layout(), d.name) == d.default, d.name


def test_fix_keys_and_pins_come_from_the_registry() -> None:
    assert FIX_KEYS == (*DEGREE_KEYS, *(d.fix_key for d in DECISIONS.values()), *STAGE_KEYS)
    assert [f.name for f in dataclasses.fields(Pins)] == list(FIX_KEYS)
    assert len(set(FIX_KEYS)) == len(FIX_KEYS)


@pytest.mark.parametrize("name", list(DECISIONS))
def test_every_decision_parses_from_fix_and_refuses_a_bad_value(name: str) -> None:
    d = DECISIONS[name]
    value = _other_value(d)
    text = "+".join(map(str, value)) if d.kind == "stages" else str(value).lower()
    assert getattr(parse_fix(f"{d.fix_key}={text}"), d.fix_key) == value
    if d.kind != "stages":
        with pytest.raises(Exception, match=f"--fix {d.fix_key}=bogus"):
            parse_fix(f"{d.fix_key}=bogus")


def test_plan_fields_follow_the_registry() -> None:
    schema = Plan.model_json_schema()["properties"]
    for d in DECISIONS.values():
        if not d.plan_field:
            continue
        assert d.plan_field in Plan.model_fields, d.name
        if d.plan_optional:
            assert OMIT_AT_DEFAULT[d.plan_field] == d.default
            assert Plan.model_fields[d.plan_field].default == d.default
        if d.kind == "choice" and isinstance(d.default, str) and d.plan_field != "schedule":
            enum = set(schema[d.plan_field]["enum"])
            assert enum == set(d.choices) | ({""} if d.stack_own else set()), d.name
    published = json.loads((REPO / "docs" / "schemas" / "plan.schema.json").read_text())["properties"]
    assert set(published) >= {d.plan_field for d in DECISIONS.values() if d.plan_field}


def test_a_plan_file_carries_every_decision_back_to_the_same_layout(tmp_path) -> None:
    """Every decision at a value other than its default, through a plan file and back (``plan_layout``)."""
    base = load_plan(REPO / "plans" / "llama-3.1-8b.yaml")
    wanted = {d.name: _other_value(d) for d in DECISIONS.values() if d.plan_field and d.plan_field != "schedule"}
    plan = base.model_copy(update={DECISIONS[n].plan_field: v for n, v in wanted.items()} | {"schedule": "zbh1"})
    path = tmp_path / "p.yaml"
    path.write_text(plan.to_yaml())
    back = plan_layout(load_plan(path))
    for n, v in wanted.items():
        assert getattr(back, n) == v, n
    assert back.pipeline_schedule == "zbh1"


def test_a_free_search_leaves_the_unsearched_decisions_at_their_default_or_pin() -> None:
    model = load_model("mixtral-8x7b")
    unsearched = [d for d in DECISIONS.values() if not d.searched]
    free = list(enumerate_layouts(model, 16, 8, 64, 4096, Pins()))
    assert free and all(getattr(lay, d.name) == d.default for lay in free for d in unsearched)
    pins = {d.fix_key: _other_value(d) for d in unsearched if d.kind != "tristate"}
    pinned = list(enumerate_layouts(model, 16, 8, 64, 4096, Pins(**pins)))
    assert pinned and all(getattr(lay, DECISIONS_BY_KEY[k].name) == v for lay in pinned for k, v in pins.items())
    for d in DECISIONS.values():
        if d.searched and d.choices:
            values = {getattr(lay, d.name) for lay in free}
            if d.kind == "modules":  # a "+"-joined list of the choices
                values = {m for v in values for m in v.split("+") if m}
            assert values <= set(d.choices) | {d.default}, d.name


DECISIONS_BY_KEY = {d.fix_key: d for d in DECISIONS.values()}


def test_plan_help_names_every_fix_key() -> None:
    out = CliRunner().invoke(app, ["plan", "--help"], terminal_width=400).output
    for key in FIX_KEYS:
        assert f"{key}=" in out, key


def test_the_decisions_page_is_current() -> None:
    """``docs/decisions.md`` is ``decisions_page.render()`` (regenerate:
    ``python -m meshplan.planner.layout.decisions_page docs/decisions.md``)."""
    assert (REPO / "docs" / "decisions.md").read_text(encoding="utf-8") == render()
