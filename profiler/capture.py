"""Capture a real multi-rank run: torch.profiler on every rank, step times, and the run folder.

Two ways in:

* ``meshplan profile`` (see :mod:`profiler.capture_launch`) runs an *unmodified* script under torchrun with
  :mod:`profiler._bootstrap`, which builds a :class:`Capture` from the environment before the script's first
  line and finds step boundaries with a global optimizer-step hook.
* The library form, for scripts that want control::

      with capture("runs/x", warmup=2, steps=8) as cap:
          for batch in data:
              train_step(batch)
              cap.step()

The run folder (the profiler-core's input, read by ``profiler.runs``):

* ``rank{R}.trace.json.gz`` - one gzip Kineto trace per rank, holding only the active (measured) steps;
* ``run.json`` - world size, backend, devices, command, argv, torch version, hostname, pinned cores, warm-up
  steps skipped and the measured step times per rank in seconds (``{"step_times_s": {"0": [...]}}``).

Each rank first writes its own record to ``.capture/rank{R}.json``; ``run.json`` is the merge of all of them
(written by the launcher, or, in the library form, by whichever rank finds every record present).
All files are written atomically (:func:`meshplan.core.atomic.write_atomic`).
"""
from __future__ import annotations

import gzip
import json
import os
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

from meshplan.core.atomic import write_atomic
from meshplan.core.bounds import load_json_file
from meshplan.core.errors import MeshplanError

RUN_FORMAT = "meshplan-run/1"
_SETTLE_S = 0.02  # pause before stopping the profiler so helper threads close their spans (s)
RUN_JSON = "run.json"
RECORD_DIR = ".capture"

# Environment the launcher hands to the bootstrap on every rank.
ENV_OUT = "MESHPLAN_CAPTURE_OUT"
ENV_WARMUP = "MESHPLAN_CAPTURE_WARMUP"
ENV_STEPS = "MESHPLAN_CAPTURE_STEPS"
ENV_CORES = "MESHPLAN_CAPTURE_CORES"  # comma list of cores to pin local ranks to; empty = no pinning
ENV_STOP = "MESHPLAN_CAPTURE_STOP"  # "1": end the script once the measured window is written
ENV_UNPROFILED = "MESHPLAN_CAPTURE_UNPROFILED"  # steps timed with the profiler off, after the traced window
ENV_TOTAL = "MESHPLAN_CAPTURE_TOTAL_STEPS"  # steps the capture needs: a script may size its loop from it
ENV_PLAN = "MESHPLAN_PLAN"


def trace_name(rank: int) -> str:
    """File name of one rank's trace inside a run folder."""
    return f"rank{rank}.trace.json.gz"


def _env_int(environ: Mapping[str, str], name: str, default: int) -> int:
    value = environ.get(name, "")
    try:
        return int(value) if value else default
    except ValueError:
        raise MeshplanError(f"${name}={value!r}: expected an integer") from None


@dataclass(frozen=True)
class RankEnv:
    """What a rank learns from its launcher: torchrun's ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE``, and the plan
    path (``$MESHPLAN_PLAN``) that ``meshplan profile --from-plan`` or an exported launch script hands the script.

    Read once, by the entry point that runs inside the user's process (:func:`capture`,
    :func:`profiler._bootstrap.main`), with :meth:`from_environ`, and passed down from there.
    """

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    plan: Optional[str] = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> "RankEnv":
        """The launcher's settings in ``environ`` (unset: rank 0 of 1, no plan)."""
        return cls(rank=_env_int(environ, "RANK", 0), local_rank=_env_int(environ, "LOCAL_RANK", 0),
                   world_size=_env_int(environ, "WORLD_SIZE", 1), plan=environ.get(ENV_PLAN) or None)


def capture_steps(warmup: int, steps: int, unprofiled: int) -> int:
    """Steps a capture needs the script to run: warm-up, traced, and (with unprofiled steps) the step that stops
    the profiler plus the unprofiled ones."""
    return warmup + steps + (1 + unprofiled if unprofiled else 0)


class CaptureDone(SystemExit):
    """Raised from the step hook to end a script once its measured window is on disk (exit status 0)."""

    def __init__(self) -> None:
        super().__init__(0)


class Capture:
    """Profiler + step clock for one rank.

    Steps are counted by :meth:`step` calls (one per training step, after the optimizer update). The first
    ``warmup`` steps are skipped: the profiler ``schedule`` waits ``warmup - 1`` steps and warms up for one
    (torch discards the warm-up step's events), then records ``steps`` active steps and exports the trace.
    With ``unprofiled`` > 0 the profiler is stopped at the end of the step after the traced window (that
    step is discarded) and the next ``unprofiled`` steps are timed with no profiler attached: the profiler's
    own cost per recorded op (about 5 us here, 13-15% of a small CPU step) is in the traced steps only, so
    ``meshplan check`` judges a plan on the steps the job runs without it.

    Args:
        out_dir: Run folder.
        warmup: Steps skipped before measuring (>= 0).
        steps: Steps measured (>= 1).
        rank: Global rank; defaults to ``launch.rank``.
        record_shapes: Record input shapes of ops (needed by the cost model).
        stop_when_done: Raise :class:`CaptureDone` from :meth:`step` once the trace is written (and the
            unprofiled steps are timed).
        unprofiled: Steps timed after the traced window with the profiler stopped (>= 0).
        merge: On :meth:`stop`, write ``run.json`` once every rank's record is present (library form; the
            launcher merges itself and turns this off).
        launch: The launcher's settings (:meth:`RankEnv.from_environ`, read by the entry point); torch.distributed
            replaces rank and world size once the script has initialised it.
    """

    def __init__(self, out_dir: str | os.PathLike, warmup: int = 2, steps: int = 8, rank: Optional[int] = None,
                 record_shapes: bool = True, stop_when_done: bool = False, merge: bool = True,
                 unprofiled: int = 0, launch: RankEnv = RankEnv()):
        if warmup < 0:
            raise MeshplanError(f"warmup={warmup}: must be >= 0")
        if steps < 1:
            raise MeshplanError(f"steps={steps}: must be >= 1")
        if unprofiled < 0:
            raise MeshplanError(f"unprofiled={unprofiled}: must be >= 0")
        self.unprofiled = unprofiled
        self.out_dir = Path(out_dir)
        self.warmup = warmup
        self.steps = steps
        self.rank = launch.rank if rank is None else rank
        self.local_rank = launch.local_rank
        self.world_size = launch.world_size
        self.plan = launch.plan
        self.record_shapes = record_shapes
        self.stop_when_done = stop_when_done
        self.merge = merge
        self.pinned_core: Optional[int] = None
        self.backend: Optional[str] = None
        self.device = "cpu"
        self._prof = None
        self._boundaries_s: list[float] = []  # perf_counter at start and after each step
        self._trace_written = False
        self._window_closed = False  # all measured steps ended; the profiler still to be stopped
        self._stopped = False
        self._profiler_stopped = False
        self._ready_prof: Any = None
        self._progress_fd: Optional[int] = None

    # -- life cycle ---------------------------------------------------------------------------------------
    def start(self) -> "Capture":
        """Start the step clock and the profiler (call before the first training step)."""
        import torch.profiler as tp

        # wait/warmup/active: the skipped steps never reach the trace, so its ProfilerStep#N spans are
        # exactly the measured steps. torch wants >= 1 warm-up step to stabilise its own overhead.
        warm = 1 if self.warmup >= 1 else 0
        sched = tp.schedule(wait=self.warmup - warm, warmup=warm, active=self.steps, repeat=1)
        activities = [tp.ProfilerActivity.CPU]
        try:
            import torch

            if torch.cuda.is_available():
                activities.append(tp.ProfilerActivity.CUDA)
        except Exception:  # pragma: no cover - torch without CUDA support
            pass
        self._prof = tp.profile(activities=activities, schedule=sched, on_trace_ready=self._on_trace_ready,
                                record_shapes=self.record_shapes)
        self._prof.start()
        self._boundaries_s = [time.perf_counter()]
        return self

    def step(self) -> None:
        """Mark the end of one training step."""
        if self._stopped:
            return
        self._boundaries_s.append(time.perf_counter())
        self._note_distributed()
        n = len(self._boundaries_s) - 1
        done = n >= self.warmup + self.steps
        if self._prof is not None and not self._trace_written and not self._window_closed:
            if done and (self.stop_when_done or self.unprofiled) and self._end_step_span():
                # Called from the optimizer post-hook, i.e. inside the Optimizer.step span: stopping the profiler
                # here would cut that span open. End the step span only; the profiler is stopped later (stop(),
                # once the script has unwound, or after the next step), so the last step looks like the others.
                self._window_closed = True
            else:
                self._prof.step()  # after the last active step the profiler stops and calls on_trace_ready
        elif self._window_closed and self.unprofiled and n == self.warmup + self.steps + 1:
            self._stop_profiler()  # the first step after the window ran traced: it is not timed
            self._boundaries_s[-1] = time.perf_counter()  # and it, not the next, holds the stop's cost
        self._write_progress()
        finished = n >= self.total_steps
        if self.stop_when_done and (self._trace_written or self._window_closed) and finished:
            raise CaptureDone()  # the bootstrap catches it and calls stop(), which exports

    def stop(self) -> Path:
        """Stop profiling (exporting a partial trace if the window did not complete) and write this rank's record.

        Returns:
            The path of the rank record (``.capture/rank{R}.json``).
        """
        if not self._stopped:
            self._stopped = True
            if self._prof is not None and not self._trace_written:
                self._stop_profiler()
            self._prof = None
            self._export()
            if self._progress_fd is not None:
                os.close(self._progress_fd)
                self._progress_fd = None
            path = write_atomic(self.out_dir / RECORD_DIR / f"rank{self.rank}.json",
                                json.dumps(self.record(), indent=1))
            if self.merge:
                self._try_merge()
            return path
        return self.out_dir / RECORD_DIR / f"rank{self.rank}.json"

    def _stop_profiler(self) -> None:
        if self._profiler_stopped or self._prof is None:
            return
        self._profiler_stopped = True
        if self._window_closed:
            # Let helper threads (the gloo worker, pinned to this rank's core) close the spans of the last
            # step's collectives; an op still open when the profiler stops gets the stop time as its end
            # (seen: a 2 ms all-reduce recorded as 400 ms).
            time.sleep(_SETTLE_S)
        self._prof.stop()  # a RECORD phase (complete or cut short) ends in on_trace_ready

    def __enter__(self) -> "Capture":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- results ------------------------------------------------------------------------------------------
    @property
    def all_step_times_s(self) -> list[float]:
        """Duration of every step seen, warm-up included, seconds."""
        b = self._boundaries_s
        return [b[i + 1] - b[i] for i in range(len(b) - 1)]

    @property
    def step_times_s(self) -> list[float]:
        """Duration of the measured (active) steps, seconds: the steps the trace holds."""
        return self.all_step_times_s[self.warmup:self.warmup + self.steps]

    @property
    def total_steps(self) -> int:
        """Steps the capture needs the script to run (``capture_steps``)."""
        return capture_steps(self.warmup, self.steps, self.unprofiled)

    @property
    def unprofiled_step_times_s(self) -> list[float]:
        """Duration of the steps timed with the profiler stopped (after the traced window), seconds."""
        if not self.unprofiled:
            return []
        start = self.warmup + self.steps + 1
        return self.all_step_times_s[start:start + self.unprofiled]

    def record(self) -> dict[str, Any]:
        """This rank's entry of ``run.json``."""
        import torch

        return {
            "rank": self.rank, "local_rank": self.local_rank, "world_size": self.world_size,
            "backend": self.backend, "device": self.device, "hostname": socket.gethostname(),
            "pid": os.getpid(), "pinned_core": self.pinned_core, "torch_version": torch.__version__,
            "warmup_steps_skipped": self.warmup, "steps_requested": self.steps,
            "step_times_s": self.step_times_s, "all_step_times_s": self.all_step_times_s,
            "unprofiled_steps_requested": self.unprofiled, "unprofiled_step_times_s": self.unprofiled_step_times_s,
            "trace": trace_name(self.rank) if (self.out_dir / trace_name(self.rank)).is_file() else None,
            "peak_memory_bytes": _peak_memory_bytes(),
        }

    # -- internals ----------------------------------------------------------------------------------------
    def _note_distributed(self) -> None:
        if self.backend is not None:
            return
        try:
            import torch
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                self.backend = str(dist.get_backend())
                self.world_size = dist.get_world_size()
                self.rank = dist.get_rank()
                if "nccl" in self.backend and torch.cuda.is_available():
                    self.device = torch.cuda.get_device_name(torch.cuda.current_device())
        except Exception:  # the record is informative; never break the user's run for it
            pass

    def _end_step_span(self) -> bool:
        # torch.profiler.profile keeps the open ProfilerStep#N record function in ``step_rec_fn``; profile.step()
        # and profile.stop() exit it the same way. False when this torch lays it out differently.
        rec = getattr(self._prof, "step_rec_fn", None)
        if rec is None or not hasattr(rec, "__exit__"):
            return False
        rec.__exit__(None, None, None)
        self._prof.step_rec_fn = None
        return True

    def _on_trace_ready(self, prof: Any) -> None:
        # Called inside the last measured step's boundary (inside the user's Optimizer.step span): only note it.
        # Exporting here would stretch that span by the export time; :meth:`stop` exports instead.
        self._ready_prof = prof
        self._trace_written = True

    def _export(self) -> None:
        # export_chrome_trace writes plain JSON; gzip it, then move it in place atomically.
        prof, self._ready_prof = self._ready_prof, None
        if prof is None:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".rank{self.rank}.", suffix=".json", dir=self.out_dir)
        os.close(fd)
        try:
            prof.export_chrome_trace(tmp)
            data = Path(tmp).read_bytes()
        finally:
            Path(tmp).unlink(missing_ok=True)
        write_atomic(self.out_dir / trace_name(self.rank), gzip.compress(data, compresslevel=6))

    def _write_progress(self) -> None:
        # Read by the launcher's progress bar. This runs inside the user's Optimizer.step span, so it must cost
        # microseconds: one pwrite on a file opened once (open/close per step took 0.3-7 ms on a loaded host).
        try:
            if self._progress_fd is None:
                p = self.out_dir / RECORD_DIR / f"progress.rank{self.rank}"
                p.parent.mkdir(parents=True, exist_ok=True)
                self._progress_fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)
            os.pwrite(self._progress_fd, b"%10d" % (len(self._boundaries_s) - 1), 0)
        except OSError:
            pass

    def _try_merge(self) -> None:
        # Library form: the rank that finds every record present writes run.json (all such writes agree).
        records = read_rank_records(self.out_dir)
        if len(records) == self.world_size and all(r.get("world_size") == self.world_size
                                                   for r in records.values()):
            write_run_json(self.out_dir, records, plan=self.plan)


def _peak_memory_bytes() -> int | None:
    """Peak device memory of this rank: CUDA's max allocated bytes on GPUs, the process's max RSS on CPUs."""
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            return int(torch.cuda.max_memory_allocated())
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB
    except Exception:  # informative only; never break the user's run for it
        return None


class _Passive:
    """What :func:`capture` returns inside ``meshplan profile``: the bootstrap already profiles this rank."""

    def __enter__(self) -> "_Passive":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def step(self) -> None:
        return None


_BOOTSTRAP_ACTIVE = False  # set by profiler._bootstrap; a second torch.profiler session would fail to start


def capture(out_dir: str | os.PathLike, warmup: int = 2, steps: int = 8,
            record_shapes: bool = True, unprofiled: int = 0) -> Capture | _Passive:
    """Library form: ``with capture(out) as cap: ... cap.step()`` profiles the steps of the ``with`` body.

    Under ``meshplan profile`` it does nothing (the launcher's bootstrap already profiles the script and finds
    its steps from the optimizer), so a script written with it can be run both ways.

    Args:
        out_dir: Run folder (created).
        warmup: Steps skipped before measuring.
        steps: Steps measured.
        record_shapes: Record op input shapes.
        unprofiled: Steps timed after the traced window with the profiler stopped.
    """
    if _BOOTSTRAP_ACTIVE:
        return _Passive()
    # The user's script calls this inside its own process under torchrun: the environment is the channel the
    # launcher talks through (RANK, LOCAL_RANK, WORLD_SIZE, MESHPLAN_PLAN), read here, at the entry point, only.
    return Capture(out_dir, warmup=warmup, steps=steps, record_shapes=record_shapes, unprofiled=unprofiled,
                   launch=RankEnv.from_environ(os.environ))


def read_rank_records(out_dir: str | os.PathLike) -> dict[int, dict[str, Any]]:
    """Rank records (``.capture/rank{R}.json``) present in a run folder, by rank."""
    records: dict[int, dict[str, Any]] = {}
    for p in sorted((Path(out_dir) / RECORD_DIR).glob("rank*.json")):
        try:
            rec = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        records[int(rec["rank"])] = rec
    return records


def write_run_json(out_dir: str | os.PathLike, records: dict[int, dict[str, Any]],
                   extra: Optional[dict[str, Any]] = None, plan: Optional[str] = None) -> Path:
    """Merge rank records into ``run.json`` (atomically).

    Args:
        out_dir: Run folder.
        records: Rank records by rank (see :meth:`Capture.record`).
        extra: Launcher fields (command, argv, script, plan, nproc...) merged on top.
        plan: Path of the plan the run followed (``RankEnv.plan``), or None.

    Returns:
        Path of ``run.json``.
    """
    ranks = sorted(records)
    first = records[ranks[0]]
    world = max(r.get("world_size") or 1 for r in records.values())
    run: dict[str, Any] = {
        "format": RUN_FORMAT,
        "world_size": world,
        "backend": next((r["backend"] for r in records.values() if r.get("backend")), None),
        "devices": {str(k): records[k].get("device") for k in ranks},
        "torch_version": first.get("torch_version"),
        "hostname": first.get("hostname"),
        "hostnames": {str(k): records[k].get("hostname") for k in ranks},
        "pinned_cores": {str(k): records[k].get("pinned_core") for k in ranks},
        "warmup_steps_skipped": first.get("warmup_steps_skipped"),
        "steps_requested": first.get("steps_requested"),
        "step_times_s": {str(k): records[k].get("step_times_s", []) for k in ranks},
        "unprofiled_steps_requested": first.get("unprofiled_steps_requested") or 0,
        "unprofiled_step_times_s": {str(k): records[k].get("unprofiled_step_times_s") or [] for k in ranks},
        "peak_memory_bytes": {str(k): records[k].get("peak_memory_bytes") for k in ranks
                              if records[k].get("peak_memory_bytes") is not None},
        "traces": {str(k): records[k]["trace"] for k in ranks if records[k].get("trace")},
        "ranks_missing": [r for r in range(world) if r not in records],
        "command": None, "argv": None, "plan": plan,
    }
    if extra:
        run.update(extra)
    return write_atomic(Path(out_dir) / RUN_JSON, json.dumps(run, indent=2))


def load_run_json(run_dir: str | os.PathLike) -> dict[str, Any]:
    """Read and validate a run folder's ``run.json`` (the one reader of that file).

    The file is bounded in size (:data:`profiler.runrecord.MAX_RUN_JSON_BYTES`), must be UTF-8 JSON and is
    validated by :class:`profiler.runrecord.RunRecord` (world size within physical bounds, finite positive step
    times, trace names inside the folder, ranks below the world size).

    Raises:
        MeshplanError: missing, unreadable, not JSON, not a meshplan run record, or a field of the wrong type or
            out of range (the file and field named).
    """
    from meshplan.profiler.runrecord import MAX_RUN_JSON_BYTES, validate_run_record

    p = Path(run_dir) / RUN_JSON
    try:
        run = load_json_file(p, max_bytes=MAX_RUN_JSON_BYTES)  # depth, integer size, finite numbers bounded
    except FileNotFoundError:
        raise MeshplanError(f"{p}: not found (is {run_dir} a meshplan run folder?)") from None
    return validate_run_record(run, str(p))
