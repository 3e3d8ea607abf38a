"""Where the dev set's MoE rows miss, in milliseconds per MoE layer and micro-batch.

Run: python bench/moe_residuals.py [DEV_JSON] [--json]
(DEV_JSON: the output of ``python bench/dev_set.py --json``; without it the dev set is priced here, about a minute)

A step's error in percent mixes what a mechanism costs with how long the rest of the step is. A mechanism priced per
MoE layer and micro-batch (the host's launches after the token-count sync, a per-expert launch cost, a dispatch
kernel) shows as a constant in ``(published - predicted) / (MoE layers per pipeline rank x micro-batches per rank)``
(the MoE layers averaged over the pipeline ranks; an uneven split or MTP modules make the busiest rank's share a
little larger): the residual each MoE layer's forward and backward leave unpriced (positive: the run took longer
than meshplan prices). The table groups the priced MoE rows of every source by what the host-time mechanisms depend
on: the CUDA-graph scope the row ran ("searched" where the row pins none and meshplan's search chose,
``space.free_cuda_graphs``), the host CPU of its part (``costmodel/data/devices.yaml`` ``host_cpu``) and the routed
experts each rank holds. Nothing is fitted here; the table is where a per-layer mechanism would have to show before
it is priced.
"""
from __future__ import annotations

import json
import statistics
import sys
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table


@dataclass(frozen=True)
class MoeRow:
    """One priced MoE row, reduced to what a per-layer mechanism depends on."""

    name: str
    source: str
    model: str
    device: str
    host_cpu: str
    cuda_graphs: str
    local_experts: int
    micro_batch: int
    micro_batches: int
    moe_layers_per_rank: float
    error: float
    residual_ms: float
    """(published - predicted) per MoE layer and micro-batch on one pipeline rank, milliseconds."""


def residual_ms(published_s: float, predicted_s: float, moe_layers_per_rank: float, micro_batches: int) -> float:
    """Milliseconds of the step each MoE layer's forward and backward leave unpriced, one micro-batch."""
    return (published_s - predicted_s) / (moe_layers_per_rank * micro_batches) * 1e3


def parse_fix(fix: str) -> dict[str, str]:
    """A ``--fix`` string's ``key=value`` pairs."""
    return dict(kv.split("=", 1) for kv in fix.split(",") if kv)


@lru_cache(maxsize=None)
def _model(name: str):
    from meshplan.planner.model.config import load_model

    return load_model(name)


def moe_row(row: dict) -> Optional[MoeRow]:
    """The row's facts, or None for a dense, unpriced or out-of-scope row."""
    from meshplan.planner.cluster.spec import parse_shorthand

    inp = row.get("inputs") or {}
    if row.get("predicted_step_s") is None or not inp.get("moe") or not inp.get("fix"):
        return None
    spec, fix = _model(inp["model"]), parse_fix(inp["fix"])
    device = parse_shorthand(inp["cluster"]).device
    dp, pp, mbs = int(fix.get("dp", 1)), int(fix.get("pp", 1)), int(fix.get("mbs", 1))
    micro_batches = inp["global_batch"] // (dp * mbs)
    per_rank = len(spec.moe_layers) / pp
    return MoeRow(name=row["name"], source=row["source"], device=device.name, host_cpu=device.host_cpu,
                  cuda_graphs=fix.get("cuda_graphs") or "searched",
                  local_experts=spec.num_experts // int(fix.get("ep", 1)), micro_batch=mbs,
                  micro_batches=micro_batches, moe_layers_per_rank=per_rank, error=row["error"],
                  residual_ms=residual_ms(row["published_step_s"], row["predicted_step_s"], per_rank,
                                          micro_batches), model=spec.name)


def groups(rows: list[MoeRow]) -> list[dict]:
    """Rows grouped by (CUDA graphs, host CPU, local experts): count, median and range of the residual and error."""
    keyed: dict[tuple, list[MoeRow]] = {}
    for r in rows:
        keyed.setdefault((r.cuda_graphs, r.host_cpu, r.local_experts), []).append(r)
    out = []
    for (graphs, host, local), rs in sorted(keyed.items()):
        res = [r.residual_ms for r in rs]
        out.append(dict(cuda_graphs=graphs, host_cpu=host, local_experts=local, rows=len(rs),
                        residual_ms_median=statistics.median(res), residual_ms_min=min(res),
                        residual_ms_max=max(res), error_median=statistics.median(r.error for r in rs),
                        models=sorted({r.model for r in rs})))
    return out


def load_results(dev_json: Optional[Path]) -> list[dict]:
    """The dev set's rows: from a saved ``dev_set.py --json`` output, else priced now."""
    if dev_json is not None:
        return json.loads(dev_json.read_text())["rows"]
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: dev_set.py sits beside it
    import dev_set

    results, _ = dev_set.run(dev_set.DEFAULT_RUNS)
    return [asdict(r) for r in results]


def render(table: list[dict], console: Console) -> None:
    t = Table(title="MoE rows: residual per MoE layer and micro-batch, ms (positive = the run took longer)")
    for col in ("CUDA graphs", "host", "local experts", "rows", "median ms", "range ms", "median error", "models"):
        t.add_column(col, overflow="fold")
    for g in table:
        t.add_row(g["cuda_graphs"], g["host_cpu"], str(g["local_experts"]), str(g["rows"]),
                  f"{g['residual_ms_median']:+.2f}", f"{g['residual_ms_min']:+.2f}..{g['residual_ms_max']:+.2f}",
                  f"{g['error_median'] * 100:+.1f}%", ", ".join(g["models"]))
    console.print(t)


def main(
    dev_json: Annotated[Optional[Path], typer.Argument(help="Output of `python bench/dev_set.py --json`")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the rows and groups as JSON")] = False,
) -> None:
    """Group the dev set's MoE rows by CUDA graphs, host CPU and local experts, with the residual per layer."""
    rows = [r for r in (moe_row(x) for x in load_results(dev_json)) if r is not None]
    table = groups(rows)
    if json_out:
        print(json.dumps({"rows": [asdict(r) for r in rows], "groups": table}, indent=2))
        return
    render(table, Console())


if __name__ == "__main__":
    typer.run(main)
