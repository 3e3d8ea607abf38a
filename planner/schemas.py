"""JSON Schemas of the files users write or read: cluster YAML files and plan files, generated from their pydantic
models and published in ``docs/schemas/`` (for editors and CI validators). Regenerate with
``python -m meshplan.planner.schemas docs/schemas``; tests/test_schemas.py checks the published ones are current."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from meshplan.core.atomic import write_atomic
from meshplan.planner.cluster_file import cluster_file_schema
from meshplan.planner.plan import Plan


def schemas() -> dict[str, dict]:
    """File name -> JSON Schema (draft 2020-12, as pydantic writes it)."""
    plan = Plan.model_json_schema()
    plan["description"] = "A meshplan plan file (`meshplan plan` writes it; planner/plan.py, class Plan)."
    cluster = cluster_file_schema()
    cluster["description"] = "A meshplan cluster YAML file (planner/presets/clusters/README.md)."
    return {"cluster.schema.json": cluster, "plan.schema.json": plan}


def render(schema: dict) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    folder = Path(argv[0] if argv else "docs/schemas")
    for name, schema in schemas().items():
        write_atomic(folder / name, render(schema))
        print(folder / name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
