"""Library code reads no environment variable: what a function computes comes from its arguments, so the same call
gives the same answer on every machine. The CLI (``meshplan.cli``) may read the environment and pass values on;
beside it only the entry points below do, each for a reason of its own. The scan reads the source (``ast``): any
use of ``os.environ``, ``os.environb``, ``os.getenv`` or ``os.getenvb``, and any ``from os import`` of them.
"""
from __future__ import annotations

import ast

from tests.test_no_cycles import package_files

# Where the environment is the input channel, by dotted module name or module.function.
ENTRY_POINTS: dict[str, str] = {
    "meshplan.core.cache.cache_dir": "the documented host cache folder, $MESHPLAN_CACHE (a property of the machine)",
    "meshplan.profiler._bootstrap.main": "the per-rank entry `meshplan profile` hands torchrun: the launcher's "
                                         "settings reach the user's process only through its environment",
    "meshplan.profiler.capture.capture": "the library form of capture, called by the user's script under torchrun "
                                         "(RANK, LOCAL_RANK, WORLD_SIZE, MESHPLAN_PLAN)",
    "meshplan.examples.train_gpt": "the exports' example training script, run by torchrun and the rendered launch "
                                   "scripts, which hand it the plan and decisions as MESHPLAN_* variables",
}
_ENV_NAMES = {"environ", "environb", "getenv", "getenvb"}


def _env_reads(tree: ast.Module) -> list[tuple[str, int]]:
    """(qualified name of the enclosing function, or '' at module level; line) of every environment access."""
    hits: list[tuple[str, int]] = []

    def visit(node: ast.AST, scope: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = scope
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = f"{scope}.{child.name}" if scope else child.name
            if (isinstance(child, ast.Attribute) and child.attr in _ENV_NAMES
                    and isinstance(child.value, ast.Name) and child.value.id == "os") or (
                    isinstance(child, ast.ImportFrom) and child.module == "os"
                    and any(a.name in _ENV_NAMES for a in child.names)):
                hits.append((scope, child.lineno))
            visit(child, inner)

    visit(tree, "")
    return hits


def _reads_outside_cli() -> dict[str, list[int]]:
    """``module`` or ``module.function`` -> lines, for every environment access outside ``meshplan.cli``."""
    out: dict[str, list[int]] = {}
    for module, path in package_files():
        if module == "meshplan.cli" or module.startswith("meshplan.cli."):
            continue
        for scope, line in _env_reads(ast.parse(path.read_text(encoding="utf-8"))):
            out.setdefault(f"{module}.{scope}" if scope else module, []).append(line)
    return out


def _allowed(where: str) -> bool:
    return any(where == e or where.startswith(e + ".") for e in ENTRY_POINTS)


def test_library_code_reads_no_environment() -> None:
    found = _reads_outside_cli()
    hidden = {where: lines for where, lines in found.items() if not _allowed(where)}
    assert not hidden, f"environment read outside the CLI and the entry points (pass the value in): {hidden}"


def test_every_entry_point_still_reads_it() -> None:
    """Each allowed entry point is found by the scan (the scan works, and the list holds no stale name)."""
    found = _reads_outside_cli()
    stale = [e for e in ENTRY_POINTS if not any(w == e or w.startswith(e + ".") for w in found)]
    assert not stale, f"entry points that no longer read the environment, remove them from ENTRY_POINTS: {stale}"
