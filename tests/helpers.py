"""The one helper tests use to reach real data in ``../shared`` (found relative to the repository)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"


def shared_dir() -> Path:
    """``../shared`` beside the repository root (override with ``MESHPLAN_SHARED``)."""
    env = os.environ.get("MESHPLAN_SHARED")
    return Path(env) if env else REPO.parent / "shared"


def shared_path(*parts: str) -> Path:
    """Path inside ``../shared``; skips the test with a clear reason when the folder is absent."""
    p = shared_dir().joinpath(*parts)
    if not p.exists():
        pytest.skip(f"shared data not found: {p}")
    return p
