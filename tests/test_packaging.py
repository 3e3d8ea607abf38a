"""meshplan installs as one namespace, ``meshplan.*``, from the top-level folders (pyproject's package-dir map).

The wheel is built for real (``pip wheel --no-deps``), unpacked into a folder of its own and imported from a
process whose working directory and path hold nothing of the repository, so what is tested is what a user gets.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import tomllib

from tests.helpers import REPO

ROOMS = {"meshplan.core": "core", "meshplan.costmodel": "costmodel", "meshplan.planner": "planner",
         "meshplan.profiler": "profiler", "meshplan.verify": "verify", "meshplan.cli": "cli",
         "meshplan.examples": "examples"}


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def test_every_package_folder_is_mapped() -> None:
    setup = _pyproject()["tool"]["setuptools"]
    assert {k: v for k, v in setup["package-dir"].items() if k != "meshplan"} == ROOMS
    want = {"meshplan"}
    for pkg, folder in ROOMS.items():
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / folder).parts
            want.add(".".join((pkg, *rel)))
    assert set(setup["packages"]) == want


def test_no_top_level_room_names_leak(tmp_path: Path) -> None:
    """Nothing imports the old top-level names (``planner``, ``cli`` ...): they are other people's modules."""
    bad = []
    for folder in [*ROOMS.values(), "tests", "bench", "examples"]:
        for py in (REPO / folder).rglob("*.py"):
            for n, line in enumerate(py.read_text(encoding="utf-8").splitlines(), 1):
                s = line.strip()
                for room in ("planner", "profiler", "costmodel", "cli", "core", "verify"):
                    if s.startswith((f"from {room}.", f"from {room} import", f"import {room}.", f"import {room}\n")):
                        bad.append(f"{py.relative_to(REPO)}:{n}: {s}")
    assert bad == []


def test_wheel_installs_and_imports(tmp_path: Path) -> None:
    # Build from a copy: an in-tree setuptools build leaves build/ and *.egg-info in the checkout.
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".git", "build", "*.egg-info", "__pycache__", "tests",
                                                             "runs", ".venv"))
    wheels = tmp_path / "wheels"
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                          str(wheels), str(src)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    (wheel,) = wheels.glob("meshplan-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.startswith("meshplan-")}
    assert top == {"meshplan"}, top
    # data files travel with their package
    assert "meshplan/costmodel/data/devices.yaml" in names
    assert "meshplan/planner/presets/models/index.yaml" in names
    # the exports' default entry script (issue 15 item 3)
    assert "meshplan/examples/train_gpt.py" in names and "meshplan/examples/tiny-gpt/config.json" in names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = ("import meshplan.cli.main, meshplan.planner.search.exact, meshplan.profiler.replay, meshplan.verify, "
            "meshplan.core.errors, meshplan.planner.model.config as ms;"
            "import meshplan.planner; assert meshplan.planner.__file__.startswith(%r), meshplan.planner.__file__;"
            "print(ms.load_model('llama-3.1-8b').num_params)" % str(site))
    run = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(site)!r}); {code}"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    # Llama-3.1-8B's parameter count (model card: 8.03B; golden count in shared/model_configs/PROVENANCE.md)
    assert int(run.stdout.strip()) == 8_030_261_248
