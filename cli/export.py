"""``meshplan export PLAN --to TARGET``: a launch config for an existing launcher (library: planner.export)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from meshplan.cli.common import console, err_console, handle_errors, print_json
from meshplan.planner.export import TARGETS, export_file


def register(app: typer.Typer) -> None:
    """Add the ``export`` command to the root app."""

    @app.command("export")
    @handle_errors
    def export(
        plan: Annotated[Path, typer.Argument(help="Plan file (YAML) written by `meshplan plan`.")],
        to: Annotated[str, typer.Option("--to", help=f"Target: {', '.join(TARGETS)}.")],
        out: Annotated[Optional[Path], typer.Option("--out", help="Write here (atomically) instead of stdout.")] = None,
        json_out: Annotated[bool, typer.Option("--json", help="Print a JSON object (target, text, warnings).")] = False,
    ) -> None:
        """Render PLAN as a launch config for TARGET; unsupported plan decisions are warned on stderr."""
        result = export_file(plan, to, out)
        for w in result.warnings:
            err_console.print(f"[yellow]warning:[/yellow] {escape(w)}", highlight=False, soft_wrap=True)
        if json_out:
            print_json({"plan": str(plan), "target": result.target, "out": str(out) if out else None,
                        "text": None if out else result.text, "warnings": result.warnings})
        elif out is None:
            sys.stdout.write(result.text)
        else:
            table = Table(title="meshplan export", show_header=False)
            table.add_column("field", style="bold")
            table.add_column("value", overflow="fold")
            for key, value in (("plan", plan), ("target", result.target), ("written", out),
                               ("bytes", len(result.text.encode())), ("warnings", len(result.warnings))):
                table.add_row(key, str(value))
            console.print(table)
