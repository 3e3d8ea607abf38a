"""The one helper tests use to reach real public data: the repository's ``data/`` (``data/README.md``)."""
from __future__ import annotations

from pathlib import Path
from typing import IO

import pytest

from meshplan.costmodel.datasets.table import open_table, table_file

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
PUBLIC_DATA = REPO / "data"


def data_path(*parts: str) -> Path:
    """Path inside the repository's ``data/``: a folder, a file, or a table stored compressed beside its name
    (``gemm.csv`` finds ``gemm.csv.xz``; read it with :func:`open_data`). Skips the test, with the path in the
    reason, when a checkout lacks it."""
    p = PUBLIC_DATA.joinpath(*parts)
    found = p if p.exists() else table_file(p)
    if found is None:
        pytest.skip(f"public data not in this checkout: {p} (data/sync.py --from ../shared copies it)",
                    allow_module_level=True)  # also from a module-level parametrize list
    return found


def open_data(*parts: str) -> IO[str]:
    """Text handle on a table in ``data/``, decompressed when it is stored compressed."""
    return open_table(data_path(*parts))


def load_bench(name: str, defines: str):
    """``bench/<name>.py`` as a module, registered under ``name`` (its dataclasses look their module up); reused
    once it defines ``defines``."""
    import importlib.util
    import sys

    if name in sys.modules and getattr(sys.modules[name], defines, None):
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    module = sys.modules.setdefault(name, importlib.util.module_from_spec(spec))
    spec.loader.exec_module(module)
    return module


def load_gpu_script(name: str):
    """``bench/<name>.py``, a standalone GPU script, loaded in this process as the GPU machine runs it: with
    bench/gpu_kernels.py importable beside it."""
    import importlib.util
    import sys

    sys.path.insert(0, str(REPO / "bench"))
    try:
        spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(REPO / "bench"))
    return module


def load_dev_set():
    """``bench/dev_set.py`` as a module, registered as ``dev_set``."""
    return load_bench("dev_set", "row_needs")


def jsonl_rows(path: Path) -> list[dict]:
    """The JSON objects of a ``.jsonl`` file, one per non-empty line."""
    import json

    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
