"""Reviewed reference plans (``plans/reference.yaml``): regenerate, compare, and accept changes with a reason.

    python -m meshplan.planner.search.reference            # regenerate into memory and list differences (exit 1 if any)
    python -m meshplan.planner.search.reference --update --reason "learned cost model now prices GEMMs"
"""
from __future__ import annotations

import argparse
import datetime as _dt
import sys
from pathlib import Path

import yaml

from meshplan.core.atomic import write_atomic
from meshplan.planner.plan.schema import Plan, load_plan

PLANS_DIR = Path(__file__).resolve().parents[2] / "plans"
IGNORED = ("meshplan_version",)  # a version bump alone is not a change of plan
REL_TOL = 1e-6


def reference_specs(plans_dir: Path = PLANS_DIR) -> dict[str, dict]:
    return yaml.safe_load((plans_dir / "reference.yaml").read_text(encoding="utf-8"))["plans"]


def regenerate(name: str, args: dict, tmp_dir: Path) -> Plan:
    from meshplan.planner.search.job import PlanRequest, plan_job

    out = plan_job(PlanRequest.of(args["model"], args["cluster"], int(args["global_batch"]), int(args["seq_len"]),
                   fix=args.get("fix"), top=1, name=name, out=tmp_dir / f"{name}.yaml"))
    return load_plan(out.path)


def differences(old, new, path: str = "") -> list[str]:
    """Field-by-field differences (floats compared with a relative tolerance)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new)):
            if k in IGNORED:
                continue
            out += differences(old.get(k), new.get(k), f"{path}.{k}" if path else k)
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [d for i, (a, b) in enumerate(zip(old, new)) for d in differences(a, b, f"{path}[{i}]")]
    if isinstance(old, (int, float)) and isinstance(new, (int, float)) and not isinstance(old, bool):
        if abs(old - new) <= REL_TOL * max(abs(old), abs(new), 1e-30):
            return []
    elif old == new:
        return []
    return [f"{path}: {old!r} -> {new!r}"]


def main(argv: list[str] | None = None) -> int:
    import tempfile

    ap = argparse.ArgumentParser(prog="python -m meshplan.planner.search.reference")
    ap.add_argument("--update", action="store_true")
    ap.add_argument("--reason", default="")
    ns = ap.parse_args(argv)
    if ns.update and not ns.reason.strip():
        ap.error("--update needs --reason: say why the reference plans change")
    changed = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, spec in reference_specs().items():
            new = regenerate(name, spec["args"], Path(tmp))
            path = PLANS_DIR / f"{name}.yaml"
            diffs = differences(load_plan(path).model_dump(mode="json"), new.model_dump(mode="json")) \
                if path.exists() else ["(new plan)"]
            if diffs:
                changed.append(name)
                print(f"{name}: " + "; ".join(diffs[:8]))
                if ns.update:
                    new.save(path)
    if ns.update and changed:
        log = PLANS_DIR / "CHANGELOG.md"
        old = log.read_text(encoding="utf-8") if log.exists() else "# Reference plan changes\n"
        stamp = _dt.date.today().isoformat()
        write_atomic(log, old + f"\n- {stamp}: {', '.join(changed)} — {ns.reason.strip()}\n")
    return 1 if changed and not ns.update else 0


if __name__ == "__main__":
    sys.exit(main())
