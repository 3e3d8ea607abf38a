"""Published JSON Schemas (docs/schemas/) are current, and the files meshplan ships validate against them with an
independent validator (jsonschema), while a misspelt key does not."""
from __future__ import annotations

import json

import jsonschema
import pytest
import yaml

from meshplan.verify.schemas import render, schemas
from tests.helpers import REPO

DOCS = REPO / "docs" / "schemas"


@pytest.mark.parametrize("name", sorted(schemas()))
def test_published_schema_is_current(name):
    assert (DOCS / name).read_text(encoding="utf-8") == render(schemas()[name]), (
        "regenerate with `python -m meshplan.verify.schemas docs/schemas`")


def test_shipped_files_validate_and_typos_do_not():
    cluster = json.loads((DOCS / "cluster.schema.json").read_text())
    plan = json.loads((DOCS / "plan.schema.json").read_text())
    presets = sorted((REPO / "planner" / "presets" / "clusters").glob("*.yaml"))
    presets = [p for p in presets if p.name != "links.yaml"]
    assert len(presets) >= 5
    for p in presets:
        jsonschema.validate(yaml.safe_load(p.read_text()), cluster)
    plans = sorted((REPO / "plans").glob("*.yaml"))
    plans = [p for p in plans if p.name != "reference.yaml"]
    assert plans
    for p in plans:
        jsonschema.validate(yaml.safe_load(p.read_text()), plan)
    bad = yaml.safe_load(presets[0].read_text())
    bad["groups"][0]["devices_per_nod"] = bad["groups"][0].pop("devices_per_node")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, cluster)
