"""Per-rank parsing and reductions in parallel: a local process pool by default, Ray when asked, Parquet cache.

A job of 1,024 ranks × 500 MB is ~7 h of JSON parsing on one core. Each rank's file is independent, so each is
one task: parse the JSON (:func:`profiler.trace.load_trace`), turn it into a columnar table
(:mod:`profiler.columnar`), write it to the cache as Parquet, and reduce it (counts, busy time per kind ...).
A worker holds one trace at a time, so its peak memory is that of the largest single trace.

Engines:

* ``workers=1``: in this process (no pool; the default for a single file);
* ``workers=N`` (default: the cores this process may use, at most the number of files; in process when the
  files add up to less than ``SERIAL_BELOW_BYTES``): a
  :class:`concurrent.futures.ProcessPoolExecutor` (local process pool);
* ``ray="local"`` starts a local Ray instance, ``ray="auto"`` joins the running cluster (``ray start --head``),
  any other value is a cluster address; Ray is an optional extra (``pip install meshplan[ray]``).

Cache: one ``<key>.parquet`` per trace file under ``cache_dir``, the key a hash of the file's path, size,
modification time, the parser version and the step cut. A hit reads the Parquet file, never the JSON. An
unreadable cache file is a miss (and is rewritten).
"""
from __future__ import annotations

import hashlib
import os
import resource
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import pyarrow as pa

from meshplan.core.errors import MeshplanError
from meshplan.profiler.columnar import (
    FORMAT_VERSION,
    REDUCED_COLUMNS,
    read_parquet,
    reduce_table,
    reduce_trace,
    table_meta,
    table_to_trace,
    trace_to_table,
    write_parquet,
)
from meshplan.profiler.trace import RankTrace, load_trace

# Default engine: in process below this many bytes of trace files (forking workers and importing pyarrow in each
# costs ~0.3-1 s here; parsing 16 MB of Kineto JSON takes ~2-3 s on one core).
SERIAL_BELOW_BYTES = 16 << 20


@dataclass(frozen=True)
class Task:
    """One trace file to ingest: its path, the label used in messages, and the string its cache key is made of."""

    path: str
    label: str
    key_src: str


@dataclass
class Ingested:
    """What a task returns: the reductions, and the table (as Parquet path or Arrow IPC bytes) for a full load."""

    label: str
    reductions: dict[str, Any] | None
    parquet: str | None
    ipc: bytes | None
    cached: bool
    peak_rss_bytes: int
    error: str | None = None
    trace: RankTrace | None = None  # in-process ingestion without a cache: the parsed trace itself


def task_for(path: Path, label: str, origin: Path | None = None, member: str = "") -> Task:
    """A task whose cache key follows ``origin`` (the archive it came from) or the file itself."""
    src = origin or path
    try:
        st = src.stat()
        key = f"{src.resolve()}|{st.st_size}|{st.st_mtime_ns}|{member}"
    except OSError:
        key = f"{src}|{member}"
    return Task(str(path), label, key)


def cache_key(task: Task, step_at: str | None) -> str:
    return hashlib.sha256(f"{FORMAT_VERSION}|{step_at}|{task.key_src}".encode()).hexdigest()[:32]


def _peak_rss_bytes() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def ingest_one(task: Task, step_at: str | None, cache_dir: str | None, want: str) -> Ingested:
    """Parse (or read from cache) one trace; ``want`` is ``reductions``, ``table`` or ``both``.

    Runs in a worker process (or a Ray task): it returns plain data, and a user-input problem as ``error`` (the
    caller raises it as a :class:`MeshplanError` in the main process).
    """
    path = Path(cache_dir) / f"{cache_key(task, step_at)}.parquet" if cache_dir else None
    table: pa.Table | None = None
    cached = False
    if path is not None and path.is_file():
        try:
            # a summary reads only the columns it reduces (Parquet is columnar: the rest is never decoded)
            table = read_parquet(path, REDUCED_COLUMNS if want == "reductions" else None)
            table_meta(table)
            cached = True
        except (OSError, pa.ArrowException, ValueError, KeyError):
            table = None  # a damaged cache file: parse again and rewrite it
    if table is None:
        try:
            t = load_trace(task.path, task.label, step_at=step_at)
        except MeshplanError as exc:
            return Ingested(task.label, None, None, None, False, _peak_rss_bytes(), error=str(exc))
        try:
            t.file_bytes = Path(task.path).stat().st_size
        except OSError:
            pass
        if path is None and want == "reductions":  # nothing to store or send: reduce the parsed trace directly
            return Ingested(task.label, reduce_trace(t), None, None, False, _peak_rss_bytes())
        table = trace_to_table(t)
        del t
        if path is not None:
            try:
                write_parquet(table, path)
            except OSError:
                path = None  # a read-only cache: go on without it
    red = reduce_table(table) if want in ("reductions", "both") else None
    ipc = None
    if want in ("table", "both") and path is None:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
        ipc = sink.getvalue().to_pybytes()
    return Ingested(task.label, red, str(path) if path is not None else None, ipc, cached, _peak_rss_bytes())


def _in_process(task: Task, step_at: str | None, want: str) -> Ingested:
    """Serial, uncached: parse straight into the :class:`RankTrace` (no table round trip)."""
    try:
        t = load_trace(task.path, task.label, step_at=step_at)
    except MeshplanError as exc:
        return Ingested(task.label, None, None, None, False, _peak_rss_bytes(), error=str(exc))
    return Ingested(task.label, None, None, None, False, _peak_rss_bytes(), trace=t)


def to_trace(res: Ingested) -> RankTrace:
    """The full :class:`RankTrace` of an ingested file (read back from Parquet or the IPC bytes)."""
    if res.trace is not None:
        return res.trace
    if res.parquet is not None:
        return table_to_trace(read_parquet(Path(res.parquet)))
    assert res.ipc is not None
    return table_to_trace(pa.ipc.open_stream(res.ipc).read_all())


def _total_bytes(tasks: list[Task]) -> int:
    total = 0
    for t in tasks:
        try:
            total += os.path.getsize(t.path)
        except OSError:
            pass
    return total


def default_workers(n_files: int) -> int:
    """Cores this process may run on, at most one per file."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, n_files))


def run_tasks(tasks: list[Task], *, step_at: str | None = None, cache_dir: str | os.PathLike | None = None,
              workers: int | None = None, ray: str | None = None, want: str = "table",
              progress: Callable[[int, int], None] | None = None) -> list[Ingested]:
    """Ingest every task, in parallel; results in task order.

    Files already in the cache need no parsing: they are read in this process (starting a worker costs more than
    the read) and only the misses go to the engine.

    Raises:
        MeshplanError: A bad worker count, Ray asked for but not installed / not reachable, or (the first) trace
            that is malformed for a reason other than "not a Kineto trace" (those come back with ``error`` set).
    """
    if workers is not None and workers < 1:
        raise MeshplanError(f"--workers {workers}: must be >= 1")
    cdir = str(cache_dir) if cache_dir is not None else None
    if cdir is not None:
        Path(cdir).mkdir(parents=True, exist_ok=True)
    n = len(tasks)
    out: list[Ingested | None] = [None] * n
    count = [0]

    def tick() -> None:
        count[0] += 1
        if progress:
            progress(count[0], n)

    if cdir is not None:
        for i, t in enumerate(tasks):
            if (Path(cdir) / f"{cache_key(t, step_at)}.parquet").is_file():
                out[i] = ingest_one(t, step_at, cdir, want)
                tick()
    rest = [i for i in range(n) if out[i] is None]
    for i, r in _dispatch([tasks[i] for i in rest], rest, step_at, cdir, workers, ray, want):
        out[i] = r
        tick()
    return out  # type: ignore[return-value]


def _dispatch(tasks: list[Task], index: list[int], step_at: str | None, cdir: str | None, workers: int | None,
              ray: str | None, want: str) -> Iterator[tuple[int, Ingested]]:
    """(index, result) as each task finishes, on Ray, a process pool, or in this process."""
    if not tasks:
        return
    if ray is not None:
        yield from zip(index, _run_ray(tasks, step_at, cdir, ray, want))
        return
    n = len(tasks)
    w = workers if workers is not None else default_workers(n)
    if workers is None and _total_bytes(tasks) < SERIAL_BELOW_BYTES:
        w = 1  # a pool costs more than it saves on a small run (and forks nothing inside callers' processes)
    if w == 1 or n == 1:
        for i, t in zip(index, tasks):
            yield i, (_in_process(t, step_at, want) if cdir is None and want == "table" else
                      ingest_one(t, step_at, cdir, want))
        return
    with ProcessPoolExecutor(max_workers=min(w, n)) as pool:
        futs = {pool.submit(ingest_one, t, step_at, cdir, want): i for i, t in zip(index, tasks)}
        for f in as_completed(futs):
            yield futs[f], f.result()


def _run_ray(tasks: list[Task], step_at: str | None, cdir: str | None, address: str,
             want: str) -> list[Ingested]:
    try:
        import ray
    except ImportError:
        raise MeshplanError("--ray: Ray is not installed (pip install 'meshplan[ray]')") from None
    if not ray.is_initialized():
        try:
            if address == "local":
                ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
            else:
                ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise MeshplanError(f"--ray {address}: cannot join a Ray cluster ({str(exc).splitlines()[0][:200]}); "
                                f"start one with `ray start --head`, or use --ray local") from None
    remote = ray.remote(ingest_one)
    return ray.get([remote.remote(t, step_at, cdir, want) for t in tasks])
