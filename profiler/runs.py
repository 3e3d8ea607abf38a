"""A run = one Kineto trace per rank: a ``meshplan profile`` folder, any folder, a ``.tar.gz``/``.zip``, or one file.

``load_run`` finds the traces, loads each (:func:`profiler.trace.load_trace`), puts them on one clock base and
checks that they belong together:

* a file that is not a Kineto trace (a PyTorch/Chakra execution trace, a protobuf ``.et``) is skipped and named
  in ``Run.skipped`` with the reason; when nothing is left, :class:`MeshplanError`;
* traces of different runs mixed in one folder (different world sizes or backends, or time windows that do not
  overlap) -> :class:`MeshplanError` naming both files;
* two files claiming the same rank -> :class:`MeshplanError` naming both;
* a missing rank: an error for a ``meshplan profile`` run folder (``run.json`` says which traces it wrote);
  for other inputs a warning, and the run is *partial* (collectives whose other participants are absent keep
  their measured durations in the graph).
"""
from __future__ import annotations

import json
import os
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from meshplan.core.errors import MeshplanError
from meshplan.profiler.trace import RankTrace, load_trace

RUN_JSON = "run.json"
_TRACE_SUFFIXES = (".json", ".json.gz", ".gz")
# Two traces whose event windows are further apart than this cannot be one run (profiling windows of the ranks
# of one job overlap; a cross-host clock error is milliseconds, not minutes).
MAX_WINDOW_GAP_S = 60.0


@dataclass
class Run:
    """Traces of one job, one per rank, on a common clock base (µs, relative to ``base_ns``).

    Attributes:
        source: What was loaded (folder, archive or file).
        ranks: rank -> :class:`RankTrace`.
        world_size: From the traces (or run.json); None if no trace says.
        backend: ``nccl``, ``gloo`` ...
        base_ns: Common clock base of all ``ts_us``.
        run_json: The ``run.json`` record of a ``meshplan profile`` folder, else None.
        skipped: (file, reason) for inputs that were not Kineto traces.
        warnings: Consistency problems that still allow a replay.
    """

    source: str
    ranks: dict[int, RankTrace]
    world_size: int | None
    backend: str | None
    base_ns: int
    run_json: dict | None = None
    skipped: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def missing_ranks(self) -> list[int]:
        if not self.world_size:
            return []
        return [r for r in range(self.world_size) if r not in self.ranks]

    @property
    def partial(self) -> bool:
        """True when some ranks of the job are absent (a sampled subset)."""
        return bool(self.missing_ranks)

    @property
    def steps(self) -> list[int]:
        """Step numbers present on every rank (sorted); [0] when traces have no ProfilerStep."""
        sets = [set(t.steps) for t in self.ranks.values()]
        if not sets or not any(sets):
            return [0]
        common = set.intersection(*sets)
        return sorted(common)


def _is_trace_name(name: str) -> bool:
    n = name.lower()
    return (n.endswith(".json") or n.endswith(".json.gz")) and n != RUN_JSON and not Path(n).name.startswith("._")


def _collect_files(root: Path) -> list[Path]:
    files = [p for p in sorted(root.rglob("*")) if p.is_file() and not any(
        part.startswith(".") for part in p.relative_to(root).parts)]
    return files


def load_run(path: str | os.PathLike, allow_empty: bool = False) -> Run:
    """Load a run from a folder, an archive (``.tar``, ``.tar.gz``, ``.tgz``, ``.zip``) or a single trace file.

    Args:
        path: The run.
        allow_empty: Return a Run with no ranks (and ``skipped`` saying why) instead of raising when nothing in
            ``path`` is a Kineto trace (``meshplan replay --summary`` lists what it found).

    Raises:
        MeshplanError: Path missing, no Kineto trace found, traces of different runs mixed, a duplicated rank,
            or a rank missing from a ``meshplan profile`` run folder.
    """
    p = Path(path)
    if not p.exists():
        raise MeshplanError(f"{p}: no such file or folder")
    if p.is_dir():
        return _load_folder(p, str(p), allow_empty=allow_empty)
    name = p.name.lower()
    if name.endswith((".tar.gz", ".tgz", ".tar")) or name.endswith(".zip"):
        with tempfile.TemporaryDirectory(prefix="meshplan-run-") as tmp:
            _extract(p, Path(tmp))
            return _load_folder(Path(tmp), str(p), label_root=str(p) + "!", allow_empty=allow_empty)
    try:
        trace = load_trace(p)
    except MeshplanError as exc:
        if allow_empty and "not a Kineto trace" in str(exc):
            return Run(str(p), {}, None, None, 0, skipped=[(str(p), str(exc).split(": ", 1)[-1])])
        raise
    return _assemble([trace], [], str(p), None)


def _extract(archive: Path, dest: Path) -> None:
    try:
        if archive.name.lower().endswith(".zip"):
            with zipfile.ZipFile(archive) as zf:
                for m in zf.infolist():
                    target = (dest / m.filename).resolve()
                    if not str(target).startswith(str(dest.resolve())) or m.is_dir():
                        continue
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(zf.read(m))
        else:
            with tarfile.open(archive) as tf:
                tf.extractall(dest, filter="data")
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as exc:
        raise MeshplanError(f"{archive}: cannot read archive ({exc})") from None


def _load_folder(root: Path, source: str, label_root: str | None = None, allow_empty: bool = False) -> Run:
    run_json = None
    rj = root / RUN_JSON
    if rj.is_file():
        try:
            run_json = json.loads(rj.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise MeshplanError(f"{rj}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    traces: list[RankTrace] = []
    skipped: list[tuple[str, str]] = []

    def label(f: Path) -> str:
        return f"{label_root}{f.relative_to(root)}" if label_root else str(f)

    if run_json is not None and isinstance(run_json.get("traces"), dict):
        world = int(run_json.get("world_size") or 0)
        listed = {int(k): v for k, v in run_json["traces"].items()}
        missing = [r for r in range(world) if r not in listed or not (root / listed[r]).is_file()]
        if missing:
            raise MeshplanError(f"{rj}: world size {world} but no trace for rank(s) {missing} "
                                f"(expected {root}/{{rank}}.trace.json.gz)")
        for r in sorted(listed):
            traces.append(load_trace(root / listed[r], label(root / listed[r])))
    else:
        for f in _collect_files(root):
            if Path(f.name).name.startswith("._"):
                skipped.append((label(f), "macOS resource-fork stub"))
                continue
            if not _is_trace_name(f.name):
                if f.name != RUN_JSON:
                    why = "Chakra protobuf execution trace (not Kineto)" if f.suffix == ".et" else \
                        "not a .json/.json.gz trace"
                    if f.suffix.lower() not in (".md",):
                        skipped.append((label(f), why))
                continue
            try:
                traces.append(load_trace(f, label(f)))
            except MeshplanError as exc:
                msg = str(exc)
                if "not a Kineto trace" in msg:
                    skipped.append((label(f), msg.split(": ", 1)[-1]))
                else:
                    raise
    if not traces and allow_empty:
        return Run(source, {}, None, None, 0, run_json=run_json, skipped=skipped)
    if not traces:
        what = "; ".join(f"{n}: {why}" for n, why in skipped[:5]) or "no .json/.json.gz files"
        raise MeshplanError(f"{source}: no Kineto trace found ({what})")
    return _assemble(traces, skipped, source, run_json)


def _window_ns(t: RankTrace) -> tuple[float, float]:
    if not t.events:
        return (t.base_ns, t.base_ns)
    lo = min(e.ts_us for e in t.events[:1000])
    hi = max(e.ts_us + e.dur_us for e in t.events[-1000:])
    return (t.base_ns + lo * 1000.0, t.base_ns + hi * 1000.0)


def _assemble(traces: list[RankTrace], skipped: list[tuple[str, str]], source: str, run_json: dict | None) -> Run:
    worlds = {t.world_size for t in traces if t.world_size}
    if len(worlds) > 1:
        a = next(t for t in traces if t.world_size == min(worlds))
        b = next(t for t in traces if t.world_size == max(worlds))
        raise MeshplanError(f"{source}: traces of different runs mixed: {a.path} has world size {a.world_size}, "
                            f"{b.path} has world size {b.world_size}")
    backends = {t.backend for t in traces if t.backend}
    if len(backends) > 1:
        a, b = sorted(backends)[:2]
        ta = next(t for t in traces if t.backend == a)
        tb = next(t for t in traces if t.backend == b)
        raise MeshplanError(f"{source}: traces of different runs mixed: {ta.path} uses {a}, {tb.path} uses {b}")
    by_rank: dict[int, RankTrace] = {}
    for t in traces:
        if t.rank in by_rank:
            raise MeshplanError(f"{source}: rank {t.rank} appears twice ({by_rank[t.rank].path} and {t.path}); "
                                f"traces of different runs mixed?")
        by_rank[t.rank] = t
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
    world = next(iter(worlds)) if worlds else (int(run_json["world_size"]) if run_json else None)
    run = Run(source=source, ranks=dict(sorted(by_rank.items())), world_size=world,
              backend=next(iter(backends)) if backends else None, base_ns=base, run_json=run_json,
              skipped=skipped)
    for t in traces:
        run.warnings.extend(t.warnings)
    if run.missing_ranks:
        have = sorted(run.ranks)
        run.warnings.append(f"{source}: partial run: rank(s) {_ranges(have)} of world size {world} present; "
                            f"collectives whose other participants are absent keep their measured durations")
    for name, why in skipped:
        run.warnings.append(f"{name}: skipped ({why})")
    return run


def _ranges(xs: list[int]) -> str:
    if not xs:
        return "none"
    out, start, prev = [], xs[0], xs[0]
    for x in xs[1:] + [None]:
        if x is not None and x == prev + 1:
            prev = x
            continue
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
        if x is not None:
            start = prev = x
    return ",".join(out)
