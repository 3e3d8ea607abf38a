"""The dev set's paired runs: one release, model, precision and layout published on two systems.

Megatron-Bridge published many runs twice, the same preset on DGX-B200 and DGX-GB200, or DGX-B300 and DGX-GB300
(``blackwell_dev.jsonl``). Where two priced rows have the same name but for the system, the same ``--fix`` string,
global batch, sequence and dtype, the ratio of their published step times measures how much faster one system ran
the same job, with the model's own pricing errors shared by both. Set beside the ratio of meshplan's prices it
checks the device constants (a part's GEMM scale, its sustained share, its attention curve) apart from everything
else: ``priced / published`` above 1 means meshplan makes the first system too slow against the second. Nothing is
fitted here: the table only reads the dev set's output.

    python bench/dev_set.py --json > /tmp/dev.json
    python bench/part_pairs.py /tmp/dev.json [--markdown | --json]

(without a file it prices the dev set first, about a minute).
"""
from __future__ import annotations

import argparse
import itertools
import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# the system word in a Megatron-Bridge row's name (``mbridge26.04-qwen3-30b-a3b-gb200-mxfp8``)
SYSTEM_WORD = re.compile(r"-(gb300|gb200|b300|b200)-")


def pairs(rows: list[dict]) -> list[dict]:
    """Every pair of priced rows that differ only in their system: name (system word aside), what they run (``fix``
    with the profile's values), global batch, sequence and dtype equal. One record per pair: the systems, the
    published and priced step ratios (first over second) and ``priced / published``."""
    groups: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for row in rows:
        inp, hit = row.get("inputs") or {}, SYSTEM_WORD.search(row["name"])
        if row["status"] != "priced" or not hit:
            continue
        # what the row runs: its --fix and its profile's values (a workload preset's come through the profile)
        runs = tuple(sorted(set(inp["fix"].split(",")) | set(inp.get("from_profile") or ())))
        key = (SYSTEM_WORD.sub("-*-", row["name"]), runs, inp["global_batch"], inp["seq_len"], inp["dtype"])
        groups[key][hit.group(1).upper()] = row
    out = []
    for (name, *_), by_system in sorted(groups.items()):
        for a, b in itertools.combinations(sorted(by_system), 2):
            ra, rb = by_system[a], by_system[b]
            published = ra["published_step_s"] / rb["published_step_s"]
            priced = ra["predicted_step_s"] / rb["predicted_step_s"]
            out.append({"run": name, "systems": f"{a} / {b}", "published_ratio": published, "priced_ratio": priced,
                        "priced_over_published": priced / published})
    return out


def by_systems(records: list[dict]) -> list[dict]:
    """Per system pair: how many runs and the median ``priced / published``."""
    grouped: dict[str, list[float]] = defaultdict(list)
    for r in records:
        grouped[r["systems"]].append(r["priced_over_published"])
    return [{"systems": k, "runs": len(v), "median_priced_over_published": statistics.median(v)}
            for k, v in sorted(grouped.items())]


def markdown(records: list[dict]) -> str:
    lines = ["| run | systems | published ratio | priced ratio | priced / published |", "|---|---|---:|---:|---:|"]
    lines += [f"| {r['run']} | {r['systems']} | {r['published_ratio']:.3f} | {r['priced_ratio']:.3f} | "
              f"{r['priced_over_published']:.3f} |" for r in records]
    lines += ["", "| systems | runs | median priced / published |", "|---|---:|---:|"]
    lines += [f"| {s['systems']} | {s['runs']} | {s['median_priced_over_published']:.3f} |"
              for s in by_systems(records)]
    return "\n".join(lines)


def dev_rows(path: str | None) -> list[dict]:
    """The dev set's rows from ``python bench/dev_set.py --json``'s output at ``path``, or priced here (no path)."""
    if path:
        return json.loads(Path(path).read_text(encoding="utf-8"))["rows"]
    from dataclasses import asdict

    import dev_set

    results, _ = dev_set.run(dev_set.DEFAULT_RUNS)
    return [asdict(r) for r in results]


def parse_args(description: str) -> argparse.Namespace:
    """The pair tables' command line: the dev set's JSON (optional), ``--markdown`` or ``--json``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("dev_json", nargs="?", help="the output of `python bench/dev_set.py --json`")
    fmt = parser.add_mutually_exclusive_group()
    fmt.add_argument("--markdown", action="store_true")
    fmt.add_argument("--json", action="store_true")
    return parser.parse_args()


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    records = pairs(dev_rows(args.dev_json))
    if args.json:
        print(json.dumps({"pairs": records, "by_systems": by_systems(records)}, indent=2))
        return
    if args.markdown:
        print(markdown(records))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table()
    for col in ("run", "systems", "published ratio", "priced ratio", "priced / published"):
        table.add_column(col, overflow="fold")  # the cells wrap rather than cut
    for r in records:
        table.add_row(r["run"], r["systems"], f"{r['published_ratio']:.3f}", f"{r['priced_ratio']:.3f}",
                      f"{r['priced_over_published']:.3f}")
    summary = Table("systems", "runs", "median priced / published")
    for s in by_systems(records):
        summary.add_row(s["systems"], str(s["runs"]), f"{s['median_priced_over_published']:.3f}")
    console = Console()
    console.print(table)
    console.print(summary)


if __name__ == "__main__":
    main()
