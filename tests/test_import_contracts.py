"""The rooms' import contracts (``.importlinter``) hold: a forbidden arrow fails the suite, not only CI's
``lint-imports``. The contracts are checked by import-linter itself (grimp's import graph of the package)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO

LINT = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"


def _lint(config: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", LINT, "--config", str(config), "--no-cache", "--no-logo"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


def test_every_contract_is_kept() -> None:
    res = _lint(REPO / ".importlinter")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "BROKEN" not in res.stdout and " 0 broken" in res.stdout


def test_the_graph_sees_every_room(tmp_path: Path) -> None:
    """A contract the code is known to break is reported broken: the graph holds the rooms' real imports (were
    grimp to see only ``meshplan/__init__.py``, every contract would pass vacuously)."""
    cfg = tmp_path / "breach.ini"
    cfg.write_text("[importlinter]\nroot_package = meshplan\n\n"
                   "[importlinter:contract:breach]\nname = planner never imports costmodel (false on purpose)\n"
                   "type = forbidden\nsource_modules =\n    meshplan.planner\nforbidden_modules =\n"
                   "    meshplan.costmodel\n", encoding="utf-8")
    res = _lint(cfg)
    assert res.returncode == 1, res.stdout[-4000:]
    assert "BROKEN" in res.stdout and "meshplan.planner.estimate.gpu -> meshplan.costmodel" in res.stdout
