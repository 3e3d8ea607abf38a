"""Where pricing from stack profiles alone loses to pricing with each row's own launch settings, by setting.

``bench/dev_set.py`` prices every row twice: with the per-row settings read from its launch files, and with
``--profile-only`` (its table's facts and its stack profile, every other decision left to meshplan's search). For each
row priced both ways the excess is ``|profile-only error| - |recipe error|``. A row's per-row setting keys are the
``--fix`` keys its recipe-mode inputs list under ``per_row``. Each key's figure is the summed excess of the rows that
carry it, over every row of the source: rows with several keys count under each, so the figures overlap and do
not add up to the source's gap. It shows which settings a profile would have to know. Nothing is fitted: the table
only reads the dev set's two outputs.

    python bench/dev_set.py --json > /tmp/recipe.json
    python bench/dev_set.py --profile-only --json > /tmp/profile.json
    python bench/profile_gap.py /tmp/recipe.json /tmp/profile.json [--source B1] [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path


def _rows(path: str) -> dict[str, dict]:
    return {r["name"]: r for r in json.loads(Path(path).read_text(encoding="utf-8"))["rows"]}


def gap(recipe: dict[str, dict], profile: dict[str, dict], source: str) -> dict:
    """``{"rows", "recipe_mean_abs", "profile_mean_abs", "by_key": [{key, rows, points}]}`` for ``source``'s rows
    priced in both modes; ``points``: the key's summed excess over all those rows, in percentage points."""
    both = [(recipe[n], profile[n]) for n in recipe if n in profile and recipe[n]["source"] == source
            and recipe[n]["error"] is not None and profile[n]["error"] is not None]
    if not both:
        return {"rows": 0, "recipe_mean_abs": None, "profile_mean_abs": None, "by_key": []}
    summed: dict[str, float] = defaultdict(float)
    carried: dict[str, int] = defaultdict(int)
    for r, p in both:
        excess = abs(p["error"]) - abs(r["error"])
        for key in sorted({s.split("=")[0] for s in r["inputs"].get("per_row", ())}):
            summed[key] += excess
            carried[key] += 1
    by_key = [{"key": k, "rows": carried[k], "points": 100 * v / len(both)}
              for k, v in sorted(summed.items(), key=lambda kv: -kv[1])]
    return {"rows": len(both), "recipe_mean_abs": 100 * statistics.mean(abs(r["error"]) for r, _ in both),
            "profile_mean_abs": 100 * statistics.mean(abs(p["error"]) for _, p in both), "by_key": by_key}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe_json", help="the output of `python bench/dev_set.py --json`")
    parser.add_argument("profile_json", help="the output of `python bench/dev_set.py --profile-only --json`")
    parser.add_argument("--source", default="B1", help="the dev-set source to read (default B1)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = gap(_rows(args.recipe_json), _rows(args.profile_json), args.source)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not out["rows"]:
        console.print(f"no row of source {args.source} is priced in both files")
        return
    console.print(f"{args.source}: {out['rows']} rows priced both ways, mean |error| "
                  f"{out['recipe_mean_abs']:.2f}% with the recipes' settings, {out['profile_mean_abs']:.2f}% from "
                  "profiles alone")
    table = Table("per-row key", "rows", "points of excess", title="excess of the rows that carry each key")
    for k in out["by_key"]:
        table.add_row(k["key"], str(k["rows"]), f"{k['points']:+.2f}")
    console.print(table)


if __name__ == "__main__":
    main()
