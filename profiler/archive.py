"""Extract a trace archive (``.tar``, ``.tar.gz``, ``.tgz``, ``.zip``) into a temporary folder, bounded.

Hostile archives: a 2 MB zip that expands to GBs, a tar.gz bomb, path traversal, links. Members are
streamed to disk in chunks with a byte budget (``max(MIN_BUDGET_BYTES, MAX_RATIO × archive size)``, the same
budget rule as single traces, :mod:`profiler.jsonstream`) and a member-count limit, whatever sizes the headers
claim; only regular files under the archive root are written (tarfile's ``data`` filter, and the same check for
zip). The folder is removed when the ``with`` block ends, on any exception, and on SIGTERM/SIGINT where the CLI
turns them into exceptions; folders left by a killed process (SIGKILL) are removed by the next extraction, which
finds them by the dead process id in their name.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import IO, Iterator

from meshplan.core.errors import MeshplanError
from meshplan.profiler.jsonstream import MAX_RATIO, MIN_BUDGET_BYTES

MAX_MEMBERS = 100_000
_PREFIX = "meshplan-run-"
_COPY_CHUNK = 1 << 20


def is_archive(p: Path) -> bool:
    n = p.name.lower()
    return n.endswith((".tar.gz", ".tgz", ".tar", ".zip"))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale(tmp_root: str | None = None) -> int:
    """Remove extraction folders of processes that no longer exist. Returns how many were removed."""
    root = Path(tmp_root or tempfile.gettempdir())
    n = 0
    for d in root.glob(f"{_PREFIX}*"):
        parts = d.name[len(_PREFIX):].split("-", 1)
        if d.is_dir() and parts[0].isdigit() and not _pid_alive(int(parts[0])):
            shutil.rmtree(d, ignore_errors=True)
            n += 1
    return n


class _Budget:
    def __init__(self, archive: Path, limit: int):
        self.archive, self.limit, self.used = archive, limit, 0

    def copy(self, src: IO[bytes], dest: Path, name: str) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open(dest, "wb") as out:
            while True:
                chunk = src.read(_COPY_CHUNK)
                if not chunk:
                    return
                self.used += len(chunk)
                if self.used > self.limit:
                    raise MeshplanError(f"{self.archive}: expands past {self.limit / 1e6:.0f} MB (at member "
                                        f"{name!r:.80}; limit {MAX_RATIO}x the archive size): refused as a "
                                        f"decompression bomb")
                out.write(chunk)


def _inside(dest: Path, name: str) -> Path | None:
    target = (dest / name).resolve()
    root = dest.resolve()
    return target if target != root and root in target.parents else None


def extract_bounded(archive: Path, dest: Path) -> None:
    """Extract regular files of ``archive`` into ``dest`` within the byte and member budgets."""
    budget = _Budget(archive, max(MIN_BUDGET_BYTES, MAX_RATIO * archive.stat().st_size))
    try:
        if archive.name.lower().endswith(".zip"):
            with zipfile.ZipFile(archive) as zf:
                infos = zf.infolist()
                if len(infos) > MAX_MEMBERS:
                    raise MeshplanError(f"{archive}: {len(infos)} members, more than {MAX_MEMBERS}")
                for m in infos:
                    target = _inside(dest, m.filename)
                    if m.is_dir() or target is None:
                        continue
                    with zf.open(m) as src:
                        budget.copy(src, target, m.filename)
        else:
            with tarfile.open(archive, mode="r:*") as tf:
                for k, m in enumerate(tf):  # streamed: members are read as the archive is decompressed
                    if k >= MAX_MEMBERS:
                        raise MeshplanError(f"{archive}: more than {MAX_MEMBERS} members")
                    target = _inside(dest, m.name)
                    if not m.isfile() or target is None:
                        continue  # links, devices, absolute or '..' paths: never written
                    src = tf.extractfile(m)
                    if src is not None:
                        budget.copy(src, target, m.name)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError, ValueError, NotImplementedError) as exc:
        raise MeshplanError(f"{archive}: cannot read archive ({str(exc)[:200]})") from None


@contextlib.contextmanager
def extracted(archive: Path) -> Iterator[Path]:
    """``with extracted(p) as folder:`` the archive's files, removed afterwards."""
    clean_stale()
    tmp = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-"))
    try:
        extract_bounded(archive, tmp)
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
