"""Shared CLI plumbing: the console, JSON output, and turning ``MeshplanError`` into one line + exit code."""
from __future__ import annotations

import functools
import json
import sys
from typing import Any, Callable

import typer
from rich.console import Console

from meshplan.core.errors import MeshplanError

# soft_wrap: a message line (often holding a long file path) stays one line however narrow the terminal, so
# users can copy the path and CI logs can be grepped; tables still fit the terminal width.
console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)


def print_json(obj: Any) -> None:
    """Machine-readable output on stdout (no rich markup, no wrapping)."""
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


def handle_errors(fn: Callable) -> Callable:
    """Decorator for every command: a ``MeshplanError`` becomes ``error: <message>`` on stderr and its exit code."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except MeshplanError as exc:
            err_console.print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
            raise typer.Exit(exc.exit_code) from None

    return wrapper
