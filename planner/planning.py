"""The ``meshplan plan`` job as a library call: load inputs, search, write the best plan atomically."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from planner.errors import MeshplanError
from planner.estimate import Workload
from planner.search import SearchResult, layout_row, search, to_plan
from planner.space import parse_fix


@dataclass
class PlanOutcome:
    work: Workload
    result: SearchResult
    rows: list[dict]
    path: Path


def plan_name(model_arg: str) -> str:
    """``llama-3.1-70b`` for a preset; the folder name for ``.../tiny-gpt/config.json``; else the file stem."""
    p = Path(model_arg)
    if p.suffix == ".json":
        return p.parent.name if p.stem == "config" and p.parent.name else p.stem
    if p.is_dir():
        return p.resolve().name
    return model_arg


def plan_job(model: str, cluster: str, global_batch: int, seq_len: int, *, fix: str | None = None,
             top: int = 10, dtype: str = "bf16", name: str | None = None, out: Path | None = None,
             progress: Optional[Callable[[int], None]] = None, plans_dir: Path = Path("plans")) -> PlanOutcome:
    """Search layouts and write the best plan to ``out`` (default ``plans/<name>.yaml``)."""
    from planner.cluster import load_cluster
    from planner.model_spec import load_model

    if global_batch < 1:
        raise MeshplanError(f"--global-batch {global_batch} must be >= 1")
    if seq_len < 1:
        raise MeshplanError(f"--seq-len {seq_len} must be >= 1")
    fixes = parse_fix(fix)
    spec = load_model(model)
    clus = load_cluster(cluster)
    spec_dtype = dtype
    clus.device.peak(spec_dtype)  # refuses a dtype the device lacks, naming the device
    work = Workload(spec, clus, global_batch, seq_len, dtype)
    result = search(work, fixes, top=top, progress=progress)
    nm = name or plan_name(model)
    best_layout, best_est = result.ranked[0]
    plan = to_plan(work, best_layout, best_est, nm, model)
    path = plan.save(out or plans_dir / f"{nm}.yaml")
    return PlanOutcome(work, result, [layout_row(lay, est) for lay, est in result.ranked], path)
