"""What a run holds and what meshplan used of it (``meshplan replay RUN --summary``).

:func:`summarize_run` works from per-rank reductions computed where each trace is parsed (a worker process or a
Ray task, :mod:`profiler.ingest`), so summarising thousands of ranks never holds their events in one process.
Every summary and report says which event categories were used (and as what) and which were not (and why).
"""
from __future__ import annotations

import os
from typing import Any, Callable

from meshplan.profiler.ingest import Ingested
from meshplan.profiler.runs import Run, _ranges, check_together, ingest_run
from meshplan.profiler.trace import KINDS

_ROLE_WORDS = {"host": "host ops", "annotation": "annotations (steps, collectives)", "runtime": "runtime calls",
               "device": "device ops", "copy": "device copies", "sync": "stream waits"}


def inputs_report(categories: list[dict[str, dict]]) -> dict[str, list[dict]]:
    """Per-rank category tables merged: ``{"used": [{"category", "role", "events", "used"}], "not_used":
    [{"category", "events", "why"}]}``, largest first."""
    merged: dict[str, dict] = {}
    for cats in categories:
        for c, v in cats.items():
            m = merged.setdefault(c, {"events": 0, "used": 0, "role": v.get("role"), "why": v.get("why")})
            m["events"] += v["events"]
            m["used"] += v["used"]
            if v.get("why"):
                m["why"] = v["why"]
    used = [{"category": c, "role": _ROLE_WORDS.get(m["role"], m["role"]), "events": m["events"], "used": m["used"]}
            for c, m in merged.items() if m["used"]]
    unused = [{"category": c, "events": m["events"], "why": m["why"] or "no event of a usable kind"}
              for c, m in merged.items() if not m["used"]]
    used.sort(key=lambda x: -x["events"])
    unused.sort(key=lambda x: -x["events"])
    return {"used": used, "not_used": unused}


def _rank_row(red: dict[str, Any]) -> dict[str, Any]:
    return {k: red[k] for k in ("rank", "file", "events", "ops", "host_threads", "gpu_streams", "steps",
                                "empty_steps", "collectives", "devices", "step_source")}


def summarize_run(path: str | os.PathLike, *, step_at: str | None = None, ranks: list[int] | None = None,
                  workers: int | None = None, ray: str | None = None, cache_dir: str | os.PathLike | None = None,
                  progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """JSON-ready summary of a run, from per-rank reductions (see :func:`build_summary` for the keys)."""
    results, disc = ingest_run(path, step_at=step_at, ranks=ranks, workers=workers, ray=ray, cache_dir=cache_dir,
                               progress=progress, want="reductions")
    return build_summary(disc.source, results, disc.skipped, disc.run_json, ranks)


def build_summary(source: str, results: list[Ingested], skipped: list[tuple[str, str]], run_json: dict | None,
                  sampled: list[int] | None) -> dict[str, Any]:
    """The summary document.

    Returns:
        ``{"source", "world_size", "backend", "ranks", "steps", "ops": {kind: n}, "per_rank": [...],
        "inputs": {"used": [...], "not_used": [...]}, "skipped": [{"file", "reason"}], "warnings": [...],
        "cached": n files read from the Parquet cache}``
    """
    reds = [r.reductions for r in results if r.error is None and r.reductions is not None]
    if sampled is not None:
        reds = [x for x in reds if x["rank"] in set(sampled)]
    skipped = skipped + [(r.label, r.error.split(": ", 1)[-1]) for r in results if r.error is not None]
    check_together([(x["file"], x["rank"], x["world_size"], x["backend"]) for x in reds], source)
    reds.sort(key=lambda x: x["rank"])
    total = {k: sum(x["ops"][k] for x in reds) for k in KINDS}
    worlds = {x["world_size"] for x in reds if x["world_size"]}
    world = next(iter(worlds)) if worlds else (run_json or {}).get("world_size")
    step_sets = [set(x["steps"]) for x in reds]
    steps = sorted(set.intersection(*step_sets)) if step_sets and any(step_sets) else ([0] if reds else [])
    warnings = [w for x in reds for w in x["warnings"]]
    if any(x["step_source"] is None for x in reds):
        n = sum(1 for x in reds if x["step_source"] is None)
        warnings.append(f"{source}: {n} of {len(reds)} trace(s) have no ProfilerStep# markers: the whole trace is "
                        f"one step 0; cut steps with --steps-at optimizer or --steps-at OP_NAME")
    empty = sorted({s for x in reds for s in x["empty_steps"]})
    if empty:
        warnings.append(f"{source}: step(s) {_ranges(empty)} hold no op on some rank: replayed as idle")
    if world and len(reds) < world and reds:
        why = f"sampled with --ranks {_ranges(sampled)}" if sampled is not None else "partial run"
        warnings.append(f"{source}: {why}: rank(s) {_ranges([x['rank'] for x in reds])} of world size {world} "
                        f"present; collectives whose other participants are absent keep their measured durations")
    warnings += [f"{name}: skipped ({why})" for name, why in skipped]
    return {
        "source": source, "world_size": world,
        "backend": next(iter({x["backend"] for x in reds if x["backend"]}), None),
        "ranks": [x["rank"] for x in reds], "steps": steps, "ops": total,
        "per_rank": [_rank_row(x) for x in reds], "inputs": inputs_report([x["categories"] for x in reds]),
        "skipped": [{"file": f, "reason": why} for f, why in skipped], "warnings": warnings,
        "cached": sum(1 for r in results if r.cached),
    }


def run_summary(run: Run) -> dict[str, Any]:
    """Summary of a run already loaded in this process (same keys as :func:`build_summary`)."""
    from meshplan.profiler.columnar import reduce_trace

    results = [Ingested(t.path, reduce_trace(t), None, None, False, 0) for t in run.ranks.values()]
    return build_summary(run.source, results, run.skipped, run.run_json, run.sampled)
