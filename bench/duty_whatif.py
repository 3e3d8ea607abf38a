"""What-if: the sustained share by how busy a step keeps the tensor cores, against the dev set's Blackwell rows.

A power-capped GPU throttles by how long it draws its tensor cores' power: one H200 held a GEMM in bursts kept 0.991,
0.984 and 0.933 of its rate at busy fractions 0.38, 0.58 and 0.78 (``costmodel.sustained.duty_points``), and one
H100 held a Qwen3-30B-A3B MoE layer at its cap kept 0.988 (GEMMs 0.907-0.938). meshplan prices one flat share per
part (``costmodel.sustained``: B200 and B300 0.866, GB200 0.894, GB300 1). This prices every B1 and B2 row as
``bench/dev_set.py --profile-only`` does, reads the slowest stage's tensor-core seconds (matmul, grouped matmul,
attention, SSD) off ``--explain``, and reprices the step two ways, each only in those seconds:

- ``now``: the flat shares priced;
- ``duty``: each part's throttle scaled by the H200's duty curve at the step's busy fraction (tensor-core seconds
  over the step): ``costmodel.sustained.duty_share``.

Run: python bench/duty_whatif.py [--json]   (about 2 minutes; nothing here prices a plan)
"""
from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import dev_set  # noqa: E402

TENSOR_CORE_CLASSES = ("matmul", "grouped matmul", "attention", "ssd")
POLICIES = ("now", "duty")


def priced_rows() -> list[dict]:
    """Each B1 / B2 row: source, part, published and priced step, and the slowest stage's tensor-core seconds."""
    from meshplan.core.errors import MeshplanError
    from meshplan.planner.search.job import PlanRequest, plan_job

    out = []
    rows = [r for r in dev_set.load_rows(dev_set.DEFAULT_RUNS) if r["source_id"] in ("B1", "B2")]
    with tempfile.TemporaryDirectory() as tmp:
        for row in rows:
            inp = dev_set.row_needs(row, dev_set.DEFAULT_RUNS, True)
            if inp.out_of_scope or inp.missing:
                continue
            try:
                res = plan_job(PlanRequest.of(inp.model, inp.cluster, inp.global_batch, inp.seq_len,
                                              fix=inp.fix_string, stack=inp.profile, top=1, dtype=inp.dtype,
                                              lora=inp.lora, task=inp.task, explain=True, out=Path(tmp) / "p.yaml"))
            except MeshplanError:  # refused at the table's layout: bench/dev_set.py prices it at the recipe's
                continue
            ex = res.plan.explain
            stage = ex["stages"][ex["slowest_stage"]]
            tc_s = sum(s for cls, s in stage["compute_s"].items() if cls.startswith(TENSOR_CORE_CLASSES))
            out.append({"name": inp.name, "source": inp.source, "part": res.plan.cluster.groups[0].device,
                        "published_s": inp.published_step_s, "step_s": res.rows[0]["step_time_s"], "tc_s": tc_s})
    return out


def repriced_s(row: dict, policy: str) -> float:
    """The row's step under ``policy``, its tensor-core seconds alone rescaled: priced at the flat share, under
    ``duty`` they run at flat / duty share of it."""
    from meshplan.costmodel.devices import catalogue
    from meshplan.costmodel.sustained import duty_share, sustained_share

    part = catalogue()[row["part"]]
    step, tc = row["step_s"], row["tc_s"]
    if policy == "duty":
        return step - tc * (1.0 - sustained_share(part)[0] / duty_share(part, tc / step))
    return step


def summary(rows: list[dict]) -> list[dict]:
    """Per source and per source and part: mean |error| and median signed error under each policy."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        for key in (r["source"], f"{r['source']} {r['part']}"):
            groups.setdefault(key, []).append(r)
    out = []
    for key, rs in sorted(groups.items()):
        entry = {"group": key, "rows": len(rs),
                 "busy_median": statistics.median(r["tc_s"] / r["step_s"] for r in rs)}
        for p in POLICIES:
            errs = [repriced_s(r, p) / r["published_s"] - 1.0 for r in rs]
            entry[p] = {"mean_abs_error": statistics.fmean(abs(e) for e in errs),
                        "median_signed_error": statistics.median(errs)}
        out.append(entry)
    return out


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.table import Table

    argv = sys.argv[1:] if argv is None else argv
    result = summary(priced_rows())
    if "--json" in argv:
        print(json.dumps(result, indent=1))
        return 0
    t = Table(title="mean |error| (median signed) by sustained-share policy")
    for col in ("group", "rows", "busy (median)", *POLICIES):
        t.add_column(col)
    for e in result:
        t.add_row(e["group"], str(e["rows"]), f"{e['busy_median']:.2f}",
                  *(f"{100 * e[p]['mean_abs_error']:.1f}% ({100 * e[p]['median_signed_error']:+.1f})"
                    for p in POLICIES))
    Console().print(t)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
