"""``docs/decisions.md``, the reference page of every decision, rendered from the registry (``decisions.DECISIONS``).

Run: ``python -m meshplan.planner.layout.decisions_page docs/decisions.md`` (tests/test_decisions.py checks the page
is current).
"""
from __future__ import annotations

import ast
import inspect
import sys
import textwrap
from pathlib import Path

from meshplan.core.atomic import write_atomic
from meshplan.planner.layout.decisions import DECISIONS, Decision, Decisions
from meshplan.planner.layout.space import DEGREE_KEYS, STAGE_KEYS

_HEAD = """# Decisions

Every decision `meshplan plan` makes, as declared once in `planner/layout/decisions.py` (this page is generated
from it: `python -m meshplan.planner.layout.decisions_page docs/decisions.md`). Pin any of them with
`--fix key=value,...`; the rest are searched or left at their default, as the table says.

The degrees are pinned the same way: {degrees} (`dp` is dp_replicate x dp_shard). Uneven pipeline
stages are pinned with `pp_layout=7+8*14+7`, or Megatron's way with {stages}.

| `--fix` key | values | default | a free search | what it is |
|---|---|---|---|---|
"""


def _values(d: Decision) -> str:
    if d.kind == "recompute":
        return "none, selective, full, op, full:N"
    if d.kind == "stages":
        return "layers per stage, `7+8*14+7`"
    if d.kind in ("bool", "tristate"):
        return "true, false"
    if d.kind == "modules":
        return "any of " + ", ".join(d.choices) + ", joined with +"
    if d.choices:
        return ", ".join(map(str, d.choices))
    hi = "" if d.hi is None else f", at most {d.hi:g}"
    return f"{'integer' if d.kind == 'int' else 'number'} >= {d.lo:g}{hi}"


def _default(d: Decision) -> str:
    if d.stack_own and d.default in ("", None):
        return "the stack's own"
    if isinstance(d.default, bool):
        return f"`{str(d.default).lower()}`"
    return f"`{d.default}`" if d.default != () else "even stages"


def _search(d: Decision) -> str:
    if d.free:
        return "takes " + d.free
    if not d.searched:
        return "keeps the default"
    if d.stack_values:
        return "tries what the stack runs"
    return "searches it"


def field_docs() -> dict[str, str]:
    """The docstring under each ``Decisions`` field (Megatron-Core ``TransformerConfig``'s convention), one
    paragraph per field; a field without one is absent."""
    body = ast.parse(textwrap.dedent(inspect.getsource(Decisions))).body[0].body
    out = {}
    for stmt, after in zip(body, body[1:]):
        if isinstance(stmt, ast.AnnAssign) and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
            out[stmt.target.id] = " ".join(str(after.value.value).split())
    return out


def render() -> str:
    """The page's Markdown."""
    out = _HEAD.format(degrees=", ".join(f"`{k}`" for k in DEGREE_KEYS), stages=" and ".join(f"`{k}`"
                                                                                           for k in STAGE_KEYS))
    notes = field_docs()
    for d in DECISIONS.values():
        stack = f" Left free: {d.stack_own}." if d.stack_own else ""
        text = f"{d.doc[0].upper()}{d.doc[1:]}.{stack} {notes.get(d.name, '')}".strip()
        out += f"| `{d.fix_key}` | {_values(d)} | {_default(d)} | {_search(d)} | {text} |\n"
    return out


if __name__ == "__main__":
    write_atomic(Path(sys.argv[1]), render())
