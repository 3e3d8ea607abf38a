"""``meshplan example-trainer PATH``: write out the example trainer the launch exports run by default."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from meshplan.cli.common import console, handle_errors, print_json


def example_trainer(
    path: Annotated[Path, typer.Argument(help="File (or folder) to write train_gpt.py to, e.g. "
                                              "examples/train_gpt.py")],
    force: Annotated[bool, typer.Option("--force", help="Replace an existing file")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print {\"written\": PATH} as JSON")] = False,
) -> None:
    """Write the small GPT trainer (plain PyTorch: DDP, FSDP2, TP, PP from a plan) that the torchrun, Slurm and
    Kubeflow exports launch (MESHPLAN_ENTRY, default examples/train_gpt.py)."""
    from meshplan.planner.export import write_example_trainer

    written = write_example_trainer(path, force=force)
    if json_out:
        print_json({"written": str(written)})
    else:
        console.print(f"example trainer written to [bold]{written}[/bold]; launch it with the exported script "
                      f"(MESHPLAN_ENTRY={written})")


def register(app: typer.Typer) -> None:
    app.command("example-trainer")(handle_errors(example_trainer))
