"""The ``meshplan`` console script: one typer app, one sub-app per command group (joined with ``add_typer``)."""
from __future__ import annotations

from typing import Annotated

import typer

app = typer.Typer(
    name="meshplan",
    help="Plan, predict and verify distributed training jobs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _register() -> None:
    # Each module registers its own commands; imported here so `meshplan --help` lists them all.
    import importlib

    for mod in ("meshplan.cli.models", "meshplan.cli.devices", "meshplan.cli.stacks", "meshplan.cli.plan",
                "meshplan.cli.export", "meshplan.cli.profile", "meshplan.cli.replay",
                "meshplan.cli.costmodel", "meshplan.cli.check", "meshplan.cli.examples", "meshplan.cli.advise"):
        try:
            module = importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name == mod:  # command group not built yet
                continue
            raise
        module.register(app)


def _version(value: bool) -> None:
    if value:
        from meshplan.core.version import meshplan_version

        typer.echo(f"meshplan {meshplan_version()}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="Print meshplan's version and exit.")] = False) -> None:
    """Plan, predict and verify distributed training jobs."""


_register()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
