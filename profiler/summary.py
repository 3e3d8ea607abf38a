"""What a run holds: ranks, steps, ops per kind, lanes, collectives (``meshplan replay RUN --summary``)."""
from __future__ import annotations

from typing import Any

from meshplan.profiler.runs import Run
from meshplan.profiler.trace import KINDS


def run_summary(run: Run) -> dict[str, Any]:
    """JSON-ready summary of a loaded run.

    Returns:
        ``{"source", "world_size", "backend", "ranks": [...], "steps": [...], "ops": {kind: n},
        "per_rank": [{"rank", "file", "events", "ops", "lanes", "steps", "collectives"}], "skipped": [{"file",
        "reason"}], "warnings": [...]}``
    """
    total = {k: 0 for k in KINDS}
    per_rank = []
    for r, t in run.ranks.items():
        counts = t.counts_by_kind()
        for k, v in counts.items():
            total[k] += v
        lanes = sorted({e.lane for e in t.events})
        per_rank.append({
            "rank": r, "file": t.path, "events": len(t.events), "ops": counts,
            "host_threads": sum(1 for x in lanes if x.startswith("thread:")),
            "gpu_streams": sum(1 for x in lanes if x.startswith("stream:")),
            "steps": sorted(t.steps), "collectives": sum(1 for e in t.events if e.kind == "comm"),
            "devices": sorted(set(t.devices))[:2],
        })
    return {
        "source": run.source, "world_size": run.world_size, "backend": run.backend, "ranks": sorted(run.ranks),
        "steps": run.steps if run.ranks else [], "ops": total, "per_rank": per_rank,
        "skipped": [{"file": f, "reason": why} for f, why in run.skipped], "warnings": list(run.warnings),
    }
