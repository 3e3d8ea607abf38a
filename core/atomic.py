"""Atomic file writes: an interrupted run never leaves a half-written plan, model or report."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def _umask() -> int:
    """The process umask (read by setting and restoring it: POSIX has no read-only call)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write ``data`` to ``path`` via a temp file in the same folder and ``os.replace``.

    Args:
        path: Destination file; parent folders are created.
        data: Text (written UTF-8) or bytes.

    Returns:
        The destination path.
    """
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    mode = "wb" if isinstance(data, bytes) else "w"
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    try:
        # mkstemp creates the file 0600; a written plan or report gets the mode any new file of the user gets.
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, mode, **({} if mode == "wb" else {"encoding": "utf-8"})) as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dest
