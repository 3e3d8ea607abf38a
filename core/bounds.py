"""The bounds every file a user hands meshplan is held to, in one place: nesting depth, integer size, finite
numbers and counts that mean something, for JSON and YAML alike.

Every reader of a user's file (a model's config.json, a plan, a cluster YAML, a run's run.json, a cost model's
metadata.json, a sensitivity file) parses through :func:`load_json_file` / :func:`loads_json` or
``core.yamlio.load_yaml_file``, which apply :func:`check_tree`; the typed models (pydantic) then state each
field's range with the types below (:data:`FiniteFloat`, :data:`PositiveInt` ...). A value outside the bounds is
one :class:`MeshplanError` line naming the file and where in it, never a ``RecursionError``, an
``OverflowError`` when an integer of a thousand digits meets ``float()``, or ``inf`` travelling into a plan.

Trace events are the exception that is checked inline, event by event (``profiler.trace``), against the same
integer bound (:data:`MAX_ABS_INT`), because millions of them are read and a walk per event would double a load.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, Field

from meshplan.core.errors import MeshplanError

# The deepest file meshplan reads nests 6 levels (a plan's explain breakdown; a HF config's rope_parameters 3;
# a trace event's Input Dims 3). 64 is ten times that and far below the ~1,000 frames where Python's parsers
# (json's C scanner, PyYAML's composer) or any walk of the result recurse out of stack.
MAX_DEPTH = 64
# Every integer a real producer writes fits 64 bits (C int64/uint64: Kineto's ids and ns clocks, PyTorch's
# shapes); one past that is corrupt or hostile, and near 10^308 it no longer fits a float at all.
MAX_ABS_INT = 2**64
MAX_INT_DIGITS = len(str(MAX_ABS_INT))  # 20: refused while parsing, before Python builds a 4,000-digit int
# Counts of things (layers, heads, devices, steps, rounds): 2^40 is beyond any real model or cluster.
MAX_COUNT = 2**40


def _where(path: list) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if path and i else str(p))
                   for i, p in enumerate(path))[:120] or "(top level)"


def check_tree(obj: Any, where: str, max_depth: int = MAX_DEPTH) -> Any:
    """``obj`` (a decoded JSON or YAML document) unchanged when it nests at most ``max_depth`` levels, holds no
    integer of magnitude ``MAX_ABS_INT`` or more and no infinite or NaN float; walked without recursion.

    Raises:
        MeshplanError: ``<where>: <key path>: <problem>``.
    """
    stack: list[tuple[Any, int, list]] = [(obj, 0, [])]
    while stack:
        node, depth, path = stack.pop()
        if isinstance(node, (dict, list)):
            if depth >= max_depth:
                raise MeshplanError(f"{where}: {_where(path)}: nested too deeply (more than {max_depth} levels)")
            items = node.items() if isinstance(node, dict) else enumerate(node)
            stack.extend((v, depth + 1, path + [k]) for k, v in items)
        elif isinstance(node, bool) or node is None or isinstance(node, str):
            continue
        elif isinstance(node, int):
            if not -MAX_ABS_INT < node < MAX_ABS_INT:
                raise MeshplanError(f"{where}: {_where(path)}: an integer of {len(str(abs(node)))} digits; "
                                    f"expected one below 2^64")
        elif isinstance(node, float) and not math.isfinite(node):
            raise MeshplanError(f"{where}: {_where(path)}: {node} is not a finite number")
    return obj


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text.lstrip('-'))} digits; expected one below 2^64")
    return int(text)


def loads_json(text: str, where: str, max_depth: int = MAX_DEPTH) -> Any:
    """Parse JSON text within the bounds (see :func:`check_tree`): ``NaN``/``Infinity`` tokens and numbers past
    a float's range are refused naming their key.

    Raises:
        MeshplanError: malformed JSON or a bound passed, naming ``where``.
    """
    try:
        obj = json.loads(text, parse_int=_bounded_int)  # NaN, Infinity, 1e999: refused with their key below
    except json.JSONDecodeError as exc:
        raise MeshplanError(f"{where}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise MeshplanError(f"{where}: nested too deeply (more than {max_depth} levels)") from None
    except ValueError as exc:
        raise MeshplanError(f"{where}: {exc}") from None
    return check_tree(obj, where, max_depth)


def load_json_file(path: str | Path, where: str | None = None, max_bytes: int = 64 << 20) -> Any:
    """Read and parse a user's JSON file within the bounds (and ``max_bytes``).

    Raises:
        FileNotFoundError: left to the caller, which knows what the file was for.
        MeshplanError: a folder, unreadable, too large, not UTF-8, not JSON, or a bound passed.
    """
    p = Path(path)
    where = where or str(p)
    try:
        size = p.stat().st_size
        if p.is_dir():
            raise MeshplanError(f"{where}: is a folder, not a JSON file")
        if size > max_bytes:
            raise MeshplanError(f"{where}: {size:,} bytes, larger than the {max_bytes:,} this file may be")
        text = p.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise
    except UnicodeDecodeError as exc:
        raise MeshplanError(f"{where}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise MeshplanError(f"{where}: cannot read ({exc.strerror or exc})") from None
    return loads_json(text, where)


def _finite(v: float) -> float:
    if not math.isfinite(v):
        raise ValueError("must be a finite number")
    return v


# Field types of the typed models (pydantic). Strings that hold numbers are refused where the models are strict.
FiniteFloat = Annotated[float, AfterValidator(_finite)]
NonNegFloat = Annotated[float, Field(ge=0), AfterValidator(_finite)]
PositiveFloat = Annotated[float, Field(gt=0), AfterValidator(_finite)]
BoundedInt = Annotated[int, Field(gt=-MAX_ABS_INT, lt=MAX_ABS_INT)]
NonNegInt = Annotated[int, Field(ge=0, lt=MAX_ABS_INT)]
Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]  # how many of something: 0 allowed (none of them)
PositiveInt = Annotated[int, Field(ge=1, le=MAX_COUNT)]  # how many of something that must exist
