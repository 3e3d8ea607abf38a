"""``meshplan stacks``: the stack profiles ``meshplan plan --stack`` starts from, with the sources of their values."""
from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from meshplan.cli.common import console, handle_errors, print_json
from meshplan.planner.layout.stacks import load_stacks
from meshplan.planner.search.workloads import load_workloads


@handle_errors
def stacks(
    json_out: Annotated[bool, typer.Option("--json", help="Print the profiles as JSON.")] = False,
) -> None:
    """List the stack profiles: each value a stack sets by default, with the file and version that says so."""
    cat = load_stacks()
    if json_out:
        print_json([{**p.model_dump(mode="json"), "ref": p.ref, "default": cat.newest[p.name] == p.version,
                     "workload_presets": len(wl.presets) if (wl := load_workloads(p.ref)) else 0,
                     "workload_presets_source": wl.source if wl else None}
                    for p in cat.profiles.values()])
        return
    for prof in cat.profiles.values():
        newest = " (default)" if cat.newest[prof.name] == prof.version else ""
        base = f"; adds to {prof.base}, whose values it keeps where it sets none" if prof.base else ""
        wl = load_workloads(prof.ref)
        presets = (f"; and {len(wl.presets)} workload presets of its launcher, one per model, GPU, precision and task "
                   f"(the job's facts choose one), read at {wl.source}") if wl else ""
        place = (f"; a job of more than {prof.placement.segment_nodes_at_most} nodes of "
                 f"{prof.placement.gpus_per_node} GPUs runs in rack-sized segments ({prof.placement.source})"
                 if prof.placement else "")
        table = Table(title=f"{prof.ref}{newest}: {prof.title}",
                      caption=f"read at {prof.source}{base}{presets}{place}")
        for col in ("--fix", "value", "when", "source"):
            table.add_column(col, overflow="fold", no_wrap=col in ("--fix", "value"))
        for v in prof.values:
            when = " + ".join(w for w in (v.when, f"model {v.model}" if v.model else None,
                                           f"mesh {v.mesh}" if v.mesh else None) if w) or "always"
            table.add_row(v.key, v.value, when, v.source)
        for d in prof.lora:  # what --task lora trains where --lora names nothing
            table.add_row("--lora", d.value, f"--task lora{' + model ' + d.model if d.model else ''}", d.source)
        for u in prof.unpriced:
            table.add_row("(not priced)", "", "", f"{u.what} [{u.source}]")
        console.print(table)


def register(app: typer.Typer) -> None:
    app.command("stacks")(stacks)
