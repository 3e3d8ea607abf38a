"""Shared CLI plumbing: the console, JSON output, and turning ``MeshplanError`` into one line + exit code."""
from __future__ import annotations

import functools
import json
import math
import sys
from typing import Any, Callable, Optional

import typer
from rich.console import Console
from rich.markup import escape

from meshplan.core.bounds import MAX_COUNT
from meshplan.core.errors import MeshplanError

# Ranges of the count options (typer.Option(..., **COUNT)): a count of zero or less means nothing, and one past
# core.bounds.MAX_COUNT is a typo. Typer refuses a value outside with its usage box, exit 2.
COUNT = {"min": 1, "max": MAX_COUNT}
INDEX = {"min": 0, "max": MAX_COUNT}  # a rank or a step number: 0 is the first

# soft_wrap: a message line (often holding a long file path) stays one line however narrow the terminal, so
# users can copy the path and CI logs can be grepped; tables still fit the terminal width.
console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)


def print_json(obj: Any) -> None:
    """Machine-readable output on stdout (no rich markup, no wrapping)."""
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


# The solvers hand a budget to CP-SAT scaled to integer units (x10^3 and more), and CP-SAT's integers end at 2^63;
# 10^12 is far above any sum of per-layer or per-bucket indicators and far below that end.
MAX_BUDGET = 1e12


def finite_budget(value: Optional[float]) -> Optional[float]:
    """Typer callback of a budget option: a finite number in [0, MAX_BUDGET] (no bound: leave the option out)."""
    if value is not None and not (math.isfinite(value) and 0 <= value <= MAX_BUDGET):
        raise typer.BadParameter(f"{value}: expected a finite number in [0, {MAX_BUDGET:g}] (leave the option out "
                                 "for no bound)")
    return value


def handle_errors(fn: Callable) -> Callable:
    """Decorator for every command: a ``MeshplanError`` becomes ``error: <message>`` on stderr and its exit code."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except MeshplanError as exc:
            # escaped: a message's own "[...]" (a list, a bracketed aside) is text, not rich markup to swallow
            err_console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
            raise typer.Exit(exc.exit_code) from None

    return wrapper
