"""Atomic file writes: an interrupted run never leaves a half-written plan, model or report."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Optional

from meshplan.core.errors import MeshplanError


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

    Raises:
        MeshplanError: ``path`` is a folder, lies under a file, or cannot be written (read-only file system,
            no permission, disk full): the path and the reason, nothing written.
    """
    dest = Path(path)
    _prepare(dest)
    try:
        return _write(dest, data)
    except OSError as exc:
        raise MeshplanError(f"{dest}: cannot write ({exc.strerror or exc}); nothing was written") from None


def check_writable(path: str | os.PathLike) -> None:
    """Refuse now what ``write_atomic(path, ...)`` would refuse at the end (a folder, a path under a file, a
    folder that takes no new file): a command that works for minutes before writing says so first. Creates the
    parent folders, as the write would.

    Raises:
        MeshplanError: the path and the reason.
    """
    dest = Path(path)
    _prepare(dest)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".probe", dir=dest.parent)
    except OSError as exc:
        raise MeshplanError(f"{dest}: cannot write ({exc.strerror or exc}); nothing was written") from None
    os.close(fd)
    os.unlink(tmp)


def _prepare(dest: Path) -> None:
    """Refuse a destination that is a folder; create its parent folders (refused when one is a file)."""
    if dest.is_dir():
        raise MeshplanError(f"{dest}: is a folder; expected a file path to write (nothing was written)")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise MeshplanError(f"{dest}: a part of its folder {dest.parent} is a file, not a folder "
                            "(nothing was written)") from None
    except OSError as exc:
        raise MeshplanError(f"{dest}: cannot create its folder {dest.parent} ({exc.strerror or exc}); nothing "
                            "was written") from None


def _write(dest: Path, data: str | bytes) -> Path:
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


FileState = Optional[tuple[int, int, int]]  # (inode, size, mtime_ns) of a file, None when absent


def file_state(path: str | os.PathLike) -> FileState:
    """What a later ``write_atomic(..., expect=...)`` compares against: the file as it is now."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):  # absent, or under a file (refused when written)
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def write_checked(path: str | os.PathLike, data: str | bytes, expect: FileState) -> Path:
    """``write_atomic``, unless ``path`` changed since ``expect = file_state(path)`` was taken (compare-and-swap):
    another writer (a second ``meshplan plan`` with the same name, an editor) got there first, and its file is
    kept. A lock file beside ``path`` (``O_EXCL``) makes compare and replace one step among meshplan processes.

    Raises:
        MeshplanError: ``path`` changed meanwhile, or another meshplan process is writing it now.
    """
    dest = Path(path)
    _prepare(dest)
    lock = dest.with_name(f".{dest.name}.lock")
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        raise MeshplanError(f"{dest}: another meshplan process is writing it (lock {lock}); not overwritten "
                            "(remove the lock if no such process runs)") from None
    except OSError as exc:
        raise MeshplanError(f"{dest}: cannot write ({exc.strerror or exc}); nothing was written") from None
    try:
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        if file_state(dest) != expect:
            raise MeshplanError(f"{dest}: changed since this command started (another writer?); not overwritten, "
                                "run again to replace it")
        return write_atomic(dest, data)
    finally:
        lock.unlink(missing_ok=True)


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two paths name one file or folder (resolved, or the same inode through a link)."""
    try:
        return Path(a).resolve() == Path(b).resolve() or (Path(a).exists() and Path(b).exists()
                                                          and os.path.samefile(a, b))
    except OSError:
        return False


def refuse_overwrite(out: str | os.PathLike, inputs: dict[str, object], flag: str) -> None:
    """Refuse an output path that is one of the command's inputs (``{option: path}``; ``None`` values are
    skipped): writing it would destroy what the command read.

    Raises:
        MeshplanError: naming the option, the input and the path.
    """
    for option, value in inputs.items():
        if value is not None and same_file(out, str(value)):
            raise MeshplanError(f"{flag} {out}: would overwrite the {option} input of this command; choose another "
                                "path (nothing was written)")


def refuse_overlap(out_dir: str | os.PathLike, inputs: dict[str, object], flag: str) -> None:
    """Refuse an output *folder* that is, holds or lies inside one of the command's inputs (``{option: path or
    list of paths}``; ``None`` skipped): its files would replace or mix with what the command read.

    Raises:
        MeshplanError: naming the option, the input and the path.
    """
    out = Path(out_dir).resolve()
    for option, value in inputs.items():
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if v is None:
                continue
            ip = Path(str(v)).resolve()
            if same_file(out, ip) or out in ip.parents or ip in out.parents:
                raise MeshplanError(f"{flag} {out_dir}: is, holds or lies inside the {option} input {v} of this "
                                    "command; choose a folder of its own (nothing was written)")
