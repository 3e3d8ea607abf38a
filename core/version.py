"""The meshplan version recorded in every plan and report."""
from __future__ import annotations

from importlib import metadata


def meshplan_version() -> str:
    """Installed distribution version, or ``0+unknown`` when run from a source tree without install."""
    try:
        return metadata.version("meshplan")
    except metadata.PackageNotFoundError:
        return "0+unknown"
