"""The host cache folder (calibrations of this machine, fitted host terms): the one place, beside the CLI, that
reads the environment, because the folder is a property of the user's machine, not of a computation."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Folder for cached host measurements: ``$MESHPLAN_CACHE`` or ``~/.cache/meshplan``."""
    env = os.environ.get("MESHPLAN_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "meshplan"
