"""The reviewed reference plans in plans/ regenerate exactly; a change needs
`python -m meshplan.planner.search.reference --update --reason "..."` (which records the reason in
plans/CHANGELOG.md)."""
import pytest

from meshplan.planner.plan.schema import load_plan
from meshplan.planner.search.reference import PLANS_DIR, differences, reference_specs, regenerate

SPECS = reference_specs()


@pytest.mark.parametrize("name", sorted(SPECS))
def test_reference_plan_unchanged(name, tmp_path):
    new = regenerate(name, SPECS[name]["args"], tmp_path)
    old = load_plan(PLANS_DIR / f"{name}.yaml")
    diffs = differences(old.model_dump(mode="json"), new.model_dump(mode="json"))
    assert not diffs, (f"reference plan {name} changed: {diffs[:5]}. If intended, run "
                       f"`python -m meshplan.planner.search.reference --update --reason \"...\"`")


def test_every_reference_change_is_explained():
    log = (PLANS_DIR / "CHANGELOG.md").read_text(encoding="utf-8")
    for name in SPECS:
        assert name in log, f"{name} has no recorded reason in plans/CHANGELOG.md"


def test_differences_detects_a_moved_prediction():
    a = {"prediction": {"step_time_s": 1.0}, "meshplan_version": "1"}
    b = {"prediction": {"step_time_s": 1.01}, "meshplan_version": "2"}
    assert differences(a, b) == ["prediction.step_time_s: 1.0 -> 1.01"]
    assert differences(a, {**a, "meshplan_version": "9"}) == []
