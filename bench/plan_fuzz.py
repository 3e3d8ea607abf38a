"""Random plan requests through the planner and every exporter: each either plans or is refused in one line.

Run: python bench/plan_fuzz.py [--seed N] [--per-model N] [--workers N] [--json]
(prints a table of outcomes; exits 1 if any request raised anything but ``MeshplanError`` or a refusal ran to more
than one line; figures go to BENCHMARKS.md)

For every bundled model preset, ``--per-model`` requests drawn with ``--seed`` from fixed lists: a cluster (H100 /
H200 / H800 / A100 nodes, DGX B200 / B300, GB200 / GB300 NVL72 racks of uneven size, MI300X), a math dtype, one set
of pinned decisions, a stack profile, a task (pre-training, SFT, LoRA), a global batch and a sequence length. Each
is planned (``plan_job``, ``--top 1 --explain``) and, where it plans, rendered to every export target. What the
planner refuses (a layout that does not divide, a dtype the part lacks, a model that fits nowhere) is the expected
answer to most of these; what it must never do is raise anything else.
"""
from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import tempfile
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout, not an installed meshplan

CLUSTERS = ("1x8xH100", "4x8xH100", "1x8xH200", "2x8xH800", "1x4xA100-80GB", "3x8xB200", "5x8xB300",
            "3x4xGB200-NVL72", "40x4xGB200-NVL72", "20x4xGB300-NVL72", "1x1xH100", "2x2xMI300X", "1x8xMI300X")
DTYPES = (None, "bf16", "fp8", "nvfp4")
PINS = ("", "tp=2", "pp=2", "cp=2", "tp=2,pp=2", "zero=3", "recompute=full", "mbs=2", "ep=4", "tp=4,sp=true",
        "pp=4,vpp=2", "cuda_graphs=layers", "fp8=mxfp8", "fp8=blockwise", "moe_dispatcher=deepep",
        "moe_dispatcher=hybridep,cuda_graphs=iteration", "cp=2,cp_kind=a2a", "recompute=selective", "offload_layers=2",
        "pp=2,schedule=zbh1", "zero=1,grad_dtype=bf16", "attention=cudnn", "tp=8", "ep=8,etp=1", "moe_overlap=true",
        "pp=3", "cp=4,cp_kind=allgather")
STACKS = (None, None, "torchtitan", "automodel", "megatron-lm")
TASKS = ("pretrain", "pretrain", "pretrain", "sft", "lora")
BATCHES = (1, 7, 64, 240, 1024, 4096)
SEQS = (128, 2048, 4096, 32768, 131072)


def draw(models: list[str], per_model: int, seed: int) -> list[tuple]:
    """The requests: (model, cluster, dtype, pins, stack, task, global batch, sequence length)."""
    rng = random.Random(seed)
    return [(m, rng.choice(CLUSTERS), rng.choice(DTYPES), rng.choice(PINS), rng.choice(STACKS), rng.choice(TASKS),
             rng.choice(BATCHES), rng.choice(SEQS)) for m in models for _ in range(per_model)]


def run_one(request: tuple) -> dict:
    """Plan one request and render the plan to every target; the outcome and, for a refusal, its first words."""
    from meshplan.core.errors import MeshplanError
    from meshplan.planner.export import TARGETS, render
    from meshplan.planner.search.job import PlanRequest, plan_job

    model, cluster, dtype, pins, stack, task, batch, seq = request
    with tempfile.TemporaryDirectory() as tmp:
        try:
            outcome = plan_job(PlanRequest.of(model, cluster, batch, seq, fix=pins or None, dtype=dtype, stack=stack,
                                              task=task, lora="16" if task == "lora" else None, top=1, explain=True,
                                              out=Path(tmp) / "plan.yaml"))
        except MeshplanError as exc:
            text = str(exc).strip()
            kind = "refusal over lines" if "\n" in text else "refused"
            return {"request": request, "outcome": kind, "says": " ".join(text.split()[:6])}
        except Exception:  # noqa: BLE001 - what this bench exists to find
            return {"request": request, "outcome": "crashed in plan", "says": traceback.format_exc(limit=3)}
        for target in TARGETS:
            try:
                render(outcome.plan, target)
            except MeshplanError as exc:
                if "\n" in str(exc).strip():
                    return {"request": request, "outcome": "refusal over lines", "says": str(exc)}
            except Exception:  # noqa: BLE001
                return {"request": request, "outcome": f"crashed in export {target}",
                        "says": traceback.format_exc(limit=3)}
    return {"request": request, "outcome": "planned", "says": ""}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--per-model", type=int, default=10)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--json", action="store_true", help="print the outcomes as JSON")
    args = ap.parse_args()
    from meshplan.planner.model.config import preset_names

    requests = draw(preset_names(), args.per_model, args.seed)
    with ProcessPoolExecutor(args.workers) as pool:
        results = list(pool.map(run_one, requests, chunksize=4))
    counts = collections.Counter(r["outcome"] for r in results)
    bad = [r for r in results if r["outcome"] not in ("planned", "refused")]
    if args.json:
        print(json.dumps({"requests": len(results), "outcomes": dict(counts), "failures": bad}, indent=1))
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"{len(results)} plan requests (seed {args.seed}, {args.per_model} a preset)")
        for col in ("outcome", "requests"):
            table.add_column(col)
        for kind, n in counts.most_common():
            table.add_row(kind, str(n))
        Console().print(table)
        refusals = collections.Counter(r["says"] for r in results if r["outcome"] == "refused")
        top = Table(title="most frequent refusals (first words)")
        top.add_column("refusal", overflow="fold")
        top.add_column("requests")
        for says, n in refusals.most_common(12):
            top.add_row(says, str(n))
        Console().print(top)
        for r in bad:
            print(r["outcome"], r["request"], r["says"], sep="\n", end="\n\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
