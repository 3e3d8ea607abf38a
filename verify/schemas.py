"""JSON Schemas of the files users write or meshplan reads: cluster YAML files, plan files, a profiled run's
``run.json`` and the parts of a Kineto trace that are read (header and event), generated from their pydantic models
and published in ``docs/schemas/`` (for editors and CI validators). They live in verify, the one room that sees
both the planner's and the profiler's files. Regenerate with ``python -m meshplan.verify.schemas docs/schemas``;
tests/test_schemas.py checks the published ones are current."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from meshplan.core.atomic import write_atomic
from meshplan.planner.cluster.file import cluster_file_schema
from meshplan.planner.plan.schema import Plan
from meshplan.profiler import trace_schema
from meshplan.profiler.runrecord import RunRecord


def schemas() -> dict[str, dict]:
    """File name -> JSON Schema (draft 2020-12, as pydantic writes it)."""
    plan = Plan.model_json_schema()
    plan["description"] = "A meshplan plan file (`meshplan plan` writes it; planner/plan/schema.py, class Plan)."
    cluster = cluster_file_schema()
    cluster["description"] = "A meshplan cluster YAML file (planner/presets/clusters/README.md)."
    run = RunRecord.model_json_schema()
    run["description"] = "The run.json of a `meshplan profile` run folder (profiler/runrecord.py, class RunRecord)."
    return {"cluster.schema.json": cluster, "plan.schema.json": plan, "run.schema.json": run,
            **trace_schema.schemas()}


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
