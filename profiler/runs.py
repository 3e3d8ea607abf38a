"""A run = one Kineto trace per rank: a ``meshplan profile`` folder, any folder, a ``.tar.gz``/``.zip``, or one file.

``load_run`` finds the traces (:func:`discover`), ingests them in parallel (:mod:`profiler.ingest`: process pool,
or Ray, with a Parquet cache), puts them on one clock base and checks that they belong together:

* a file that is not a Kineto trace (a PyTorch/Chakra execution trace, a protobuf ``.et``) is skipped and named
  in ``Run.skipped`` with the reason; when nothing is left, :class:`MeshplanError`;
* traces of different runs mixed in one folder (different world sizes or backends, or time windows that do not
  overlap) -> :class:`MeshplanError` naming both files;
* two files claiming the same rank -> :class:`MeshplanError` naming both;
* a missing rank: an error for a ``meshplan profile`` run folder (``run.json`` says which traces it wrote);
  for other inputs a warning, and the run is *partial* (collectives whose other participants are absent keep
  their measured durations in the graph);
* ``ranks=`` samples a subset of a big job (``--ranks 0-7,128-135``): only those files are parsed (a file's rank
  comes from its name or from the ``distributedInfo`` written before its events), the run is partial and says so.

Archives are extracted with a byte budget (:mod:`profiler.archive`) into a temporary folder removed afterwards.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from meshplan.core.errors import MeshplanError
from meshplan.profiler.archive import extracted, is_archive
from meshplan.profiler.ingest import Ingested, Task, run_tasks, task_for, to_trace
from meshplan.profiler.jsonstream import stream_trace
from meshplan.profiler.trace import MAX_WORLD_SIZE, RankTrace, rank_from_name

RUN_JSON = "run.json"
# Two traces whose event windows are further apart than this cannot be one run (profiling windows of the ranks
# of one job overlap; a cross-host clock error is milliseconds, not minutes).
MAX_WINDOW_GAP_S = 60.0
_RANGE = re.compile(r"^(\d{1,9})(?:-(\d{1,9}))?$")


@dataclass
class Run:
    """Traces of one job, one per rank, on a common clock base (µs, relative to ``base_ns``).

    Attributes:
        source: What was loaded (folder, archive or file).
        ranks: rank -> :class:`RankTrace`.
        world_size: From the traces (or run.json); None if no trace says.
        backend: ``nccl``, ``gloo`` ...
        base_ns: Common clock base of all ``ts_us``.
        run_json: The validated ``run.json`` record of a ``meshplan profile`` folder, else None.
        skipped: (file, reason) for inputs that were not Kineto traces.
        warnings: Consistency problems that still allow a replay.
        sampled: The ``ranks=`` selection when a subset was asked for, else None.
    """

    source: str
    ranks: dict[int, RankTrace]
    world_size: int | None
    backend: str | None
    base_ns: int
    run_json: dict | None = None
    skipped: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    sampled: list[int] | None = None

    @property
    def missing_ranks(self) -> list[int]:
        if not self.world_size:
            return []
        return [r for r in range(self.world_size) if r not in self.ranks]

    @property
    def partial(self) -> bool:
        """True when some ranks of the job are absent (a sampled subset)."""
        return bool(self.world_size) and len(self.ranks) < self.world_size

    @property
    def steps(self) -> list[int]:
        """Step numbers present on every rank (sorted); [0] when traces have no steps."""
        sets = [set(t.steps) for t in self.ranks.values()]
        if not sets or not any(sets):
            return [0]
        return sorted(set.intersection(*sets))


def parse_rank_list(spec: str) -> list[int]:
    """``0-7,128-135`` -> sorted ranks. Raises MeshplanError on a malformed or negative list."""
    out: set[int] = set()
    for part in str(spec).split(","):
        m = _RANGE.match(part.strip())
        if m is None:
            raise MeshplanError(f"--ranks {spec!r}: {part.strip()!r} is not a rank or a range of ranks >= 0 "
                                f"(e.g. 0-7,128-135)")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo or hi >= MAX_WORLD_SIZE:
            raise MeshplanError(f"--ranks {spec!r}: {part.strip()!r} must be a range a-b with a <= b < "
                                f"{MAX_WORLD_SIZE}")
        if hi - lo + len(out) > MAX_WORLD_SIZE:
            raise MeshplanError(f"--ranks {spec!r}: more than {MAX_WORLD_SIZE} ranks")
        out.update(range(lo, hi + 1))
    return sorted(out)


def _is_trace_name(name: str) -> bool:
    n = name.lower()
    return (n.endswith(".json") or n.endswith(".json.gz")) and n != RUN_JSON and not Path(n).name.startswith("._")


@dataclass
class Discovery:
    """The trace files of a run (before parsing)."""

    source: str
    tasks: list[Task]
    skipped: list[tuple[str, str]]
    run_json: dict | None
    sampled: list[int] | None


def _peek_rank(path: Path) -> int | None:
    """Rank from the file name, else from ``distributedInfo`` if Kineto wrote it before the events."""
    r = rank_from_name(path)
    if r is not None:
        return r
    try:
        head = stream_trace(path, lambda _e: None, stop_at_events=True)
    except MeshplanError:
        return None
    d = head.get("distributedInfo")
    r = d.get("rank") if isinstance(d, dict) else None
    return r if isinstance(r, int) and not isinstance(r, bool) else None


def discover(root: Path, source: str, label_root: str | None = None, ranks: list[int] | None = None,
             origin: Path | None = None, run_json: dict | None = None) -> Discovery:
    """The traces in a folder: those ``run.json`` lists, or every ``.json``/``.json.gz`` (others skipped).

    ``run_json``: the folder's ``run.json`` when the caller has already read it (None: read here if present).
    """
    from meshplan.profiler.capture import load_run_json

    if run_json is None and (root / RUN_JSON).is_file():
        run_json = load_run_json(root)
    want = set(ranks) if ranks is not None else None
    tasks: list[Task] = []
    skipped: list[tuple[str, str]] = []

    def label(f: Path) -> str:
        return f"{label_root}{f.relative_to(root)}" if label_root else str(f)

    def task(f: Path) -> Task:
        return task_for(f, label(f), origin, str(f.relative_to(root)) if origin else "")

    if run_json is not None and run_json.get("traces"):
        world = int(run_json["world_size"])
        listed = {int(k): v for k, v in run_json["traces"].items()}
        missing = [r for r in range(world) if (want is None or r in want)
                   and (r not in listed or not (root / listed[r]).is_file())]
        if missing:
            raise MeshplanError(f"{root / RUN_JSON}: world size {world} but no trace for rank(s) {missing[:16]} "
                                f"(expected {root}/{{rank}}.trace.json.gz)")
        tasks = [task(root / listed[r]) for r in sorted(listed) if want is None or r in want]
        return Discovery(source, tasks, skipped, run_json, ranks)
    files = [p for p in sorted(root.rglob("*")) if p.is_file() and not any(
        part.startswith(".") for part in p.relative_to(root).parts)]
    for f in files:
        if f.name.startswith("._"):
            skipped.append((label(f), "macOS resource-fork stub"))
        elif not _is_trace_name(f.name):
            if f.name != RUN_JSON and f.suffix.lower() != ".md":
                skipped.append((label(f), "Chakra protobuf execution trace (not Kineto)" if f.suffix == ".et"
                                else "not a .json/.json.gz trace"))
        elif want is None:
            tasks.append(task(f))
        else:
            r = _peek_rank(f)
            if r is None or r in want:  # rank unknown before parsing: parsed, then kept only if asked for
                tasks.append(task(f))
    return Discovery(source, tasks, skipped, run_json, ranks)


def load_run(path: str | os.PathLike, allow_empty: bool = False, *, step_at: str | None = None,
             ranks: list[int] | None = None, workers: int | None = None, ray: str | None = None,
             cache_dir: str | os.PathLike | None = None,
             progress: Callable[[int, int], None] | None = None, run_json: dict | None = None) -> Run:
    """Load a run from a folder, an archive (``.tar``, ``.tar.gz``, ``.tgz``, ``.zip``) or a single trace file.

    Args:
        path: The run.
        allow_empty: Return a Run with no ranks (and ``skipped`` saying why) instead of raising when nothing in
            ``path`` is a Kineto trace.
        step_at: Cut steps at this op (``optimizer`` or an op name) instead of ``ProfilerStep#`` markers.
        ranks: Load only these ranks (a sampled subset of a big job).
        workers, ray: Parallel ingestion (:func:`profiler.ingest.run_tasks`).
        cache_dir: Parquet cache of parsed traces (None: no cache).
        progress: Called with (files done, files) while ingesting.
        run_json: The folder's ``run.json`` as already read (:func:`profiler.capture.load_run_json`), so it is not
            read again; None: read here when present.

    Raises:
        MeshplanError: Path missing, no Kineto trace found, traces of different runs mixed, a duplicated rank,
            a rank missing from a ``meshplan profile`` run folder, or a malformed trace.
    """
    results, disc = ingest_run(path, step_at=step_at, ranks=ranks, workers=workers, ray=ray, cache_dir=cache_dir,
                               progress=progress, want="table", run_json=run_json)
    traces = [to_trace(r) for r in results if r.error is None]
    if ranks is not None:
        traces = [t for t in traces if t.rank in set(ranks)]
    skipped = disc.skipped + [(r.label, r.error.split(": ", 1)[-1]) for r in results if r.error is not None]
    if not traces and allow_empty:
        return Run(disc.source, {}, None, None, 0, run_json=disc.run_json, skipped=skipped)
    if not traces:
        what = "; ".join(f"{n}: {why}" for n, why in skipped[:5]) or "no .json/.json.gz files"
        if ranks is not None:
            what = f"none of rank(s) {_ranges(ranks)} found; " + what
        raise MeshplanError(f"{disc.source}: no Kineto trace found ({what})")
    run = _assemble(traces, skipped, disc.source, disc.run_json, disc.sampled)
    if ranks is not None:
        absent = sorted(set(ranks) - set(run.ranks))
        if absent:
            run.warnings.append(f"{disc.source}: rank(s) {_ranges(absent)} asked for with --ranks are not in this run")
    return run


def ingest_run(path: str | os.PathLike, *, step_at: str | None = None, ranks: list[int] | None = None,
               workers: int | None = None, ray: str | None = None, cache_dir: str | os.PathLike | None = None,
               progress: Callable[[int, int], None] | None = None,
               want: str = "table", run_json: dict | None = None) -> tuple[list[Ingested], Discovery]:
    """Discover and ingest a run's traces (archives extracted for the duration). Files that are not Kineto traces
    come back with ``error`` set; any other malformed trace raises. ``run_json``: a folder's ``run.json`` as
    already read (see :func:`load_run`)."""
    p = Path(path)
    if not p.exists():
        raise MeshplanError(f"{p}: no such file or folder")
    if p.is_dir():
        disc = discover(p, str(p), ranks=ranks, run_json=run_json)
        return _ingest(disc, step_at, workers, ray, cache_dir, progress, want), disc
    if is_archive(p):
        with extracted(p) as tmp:
            disc = discover(tmp, str(p), label_root=str(p) + "!", ranks=ranks, origin=p)
            # Archive members live in a temporary folder: results must not point at it (IPC or cache only).
            return _ingest(disc, step_at, workers, ray, cache_dir, progress, want), disc
    disc = Discovery(str(p), [task_for(p, str(p))], [], None, ranks)
    return _ingest(disc, step_at, workers, ray, cache_dir, progress, want), disc


def _ingest(disc: Discovery, step_at, workers, ray, cache_dir, progress, want) -> list[Ingested]:
    results = run_tasks(disc.tasks, step_at=step_at, cache_dir=cache_dir, workers=workers, ray=ray, want=want,
                        progress=progress)
    for r in results:
        if r.error is not None and "not a Kineto trace" not in r.error:
            raise MeshplanError(r.error)
    return results


def _window_ns(t: RankTrace) -> tuple[float, float]:
    if not t.events:
        return (t.base_ns, t.base_ns)
    lo = min(e.ts_us for e in t.events[:1000])
    hi = max(e.ts_us + e.dur_us for e in t.events[-1000:])
    return (t.base_ns + lo * 1000.0, t.base_ns + hi * 1000.0)


def check_together(items: list[tuple[str, int, int | None, str | None]], source: str) -> None:
    """(file, rank, world size, backend) of every trace: MeshplanError when they cannot be one run."""
    worlds = {w for _, _, w, _ in items if w}
    if len(worlds) > 1:
        a = next(i for i in items if i[2] == min(worlds))
        b = next(i for i in items if i[2] == max(worlds))
        raise MeshplanError(f"{source}: traces of different runs mixed: {a[0]} has world size {a[2]}, "
                            f"{b[0]} has world size {b[2]}")
    backends = sorted({b for _, _, _, b in items if b})
    if len(backends) > 1:
        ta = next(i for i in items if i[3] == backends[0])
        tb = next(i for i in items if i[3] == backends[1])
        raise MeshplanError(f"{source}: traces of different runs mixed: {ta[0]} uses {backends[0]}, {tb[0]} uses "
                            f"{backends[1]}")
    seen: dict[int, str] = {}
    for f, r, _, _ in items:
        if r in seen:
            raise MeshplanError(f"{source}: rank {r} appears twice ({seen[r]} and {f}); traces of different runs "
                                f"mixed?")
        seen[r] = f


def _assemble(traces: list[RankTrace], skipped: list[tuple[str, str]], source: str, run_json: dict | None,
              sampled: list[int] | None = None) -> Run:
    check_together([(t.path, t.rank, t.world_size, t.backend) for t in traces], source)
    by_rank = {t.rank: t for t in traces}
    windows = {r: _window_ns(t) for r, t in by_rank.items()}
    if len(windows) > 1:
        ranks = sorted(windows)
        ref = ranks[0]
        for r in ranks[1:]:
            a0, a1 = windows[ref]
            b0, b1 = windows[r]
            gap_s = max(a0 - b1, b0 - a1) / 1e9
            if gap_s > MAX_WINDOW_GAP_S:
                raise MeshplanError(f"{source}: traces of different runs mixed: {by_rank[ref].path} (rank {ref}) "
                                    f"and {by_rank[r].path} (rank {r}) were recorded {gap_s:.0f} s apart")
    base = min(t.base_ns for t in traces)
    for t in traces:
        if t.base_ns != base:  # ranks recorded across a 3-month kineto base boundary: one clock base for all
            t.shift((t.base_ns - base) / 1000.0)
            t.base_ns = base
    worlds = {t.world_size for t in traces if t.world_size}
    backends = {t.backend for t in traces if t.backend}
    world = next(iter(worlds)) if worlds else (int(run_json["world_size"]) if run_json else None)
    run = Run(source=source, ranks=dict(sorted(by_rank.items())), world_size=world,
              backend=next(iter(backends)) if backends else None, base_ns=base, run_json=run_json,
              skipped=skipped, sampled=sampled)
    for t in traces:
        run.warnings.extend(t.warnings)
    no_steps = [t for t in traces if t.step_source is None]
    if no_steps:
        span_s = max((_window_ns(t)[1] - _window_ns(t)[0]) / 1e9 for t in no_steps)
        run.warnings.append(f"{source}: {len(no_steps)} of {len(traces)} trace(s) have no ProfilerStep# markers: "
                            f"the whole trace (up to {span_s:.1f} s) is replayed as one step 0; cut steps with "
                            f"--steps-at optimizer or --steps-at OP_NAME")
    empty = sorted({s for t in traces for s in t.empty_steps})
    if empty:
        run.warnings.append(f"{source}: step(s) {_ranges(empty)} hold no op on some rank (the profiler stopped, or "
                            f"the trace was thinned): replayed as idle at the marker's length")
    if run.partial:
        have = sorted(run.ranks)
        why = f"sampled with --ranks {_ranges(sampled)}" if sampled is not None else "partial run"
        run.warnings.append(f"{source}: {why}: rank(s) {_ranges(have)} of world size {world} present; "
                            f"collectives whose other participants are absent keep their measured durations")
    for name, why in skipped:
        run.warnings.append(f"{name}: skipped ({why})")
    return run


def _ranges(xs: list[int]) -> str:
    if not xs:
        return "none"
    xs = sorted(xs)
    out, start, prev = [], xs[0], xs[0]
    for x in xs[1:] + [None]:
        if x is not None and x == prev + 1:
            prev = x
            continue
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
        if x is not None:
            start = prev = x
    return ",".join(out)
