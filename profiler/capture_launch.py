"""``meshplan profile``'s library side: launch a script under torchrun with the capture bootstrap.

The launcher validates the request, chooses cores to pin local ranks to, runs
``python -m torch.distributed.run ... -m profiler._bootstrap SCRIPT ARGS`` (``--standalone`` on one node, the
``--rdzv-*`` options otherwise), shows progress from the ranks' step counters, and merges the rank records into
``run.json`` (see :mod:`profiler.capture` for the folder format).

The run is written atomically: the ranks write into a new hidden folder beside ``--out``, which replaces the
folder only when the run succeeded (the previous run is kept until then); a failed attempt is kept as
``OUT.failed`` with its ``launch.log``.

Pinning: on this kind of shared host a 2-rank gloo run's median step varied 120-196 ms unpinned and 117-138 ms
pinned, so each local rank gets its own core whenever there are enough cores, and a run with more ranks than
cores is flagged as unfit for timing.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Optional

from meshplan.core.atomic import write_atomic
from meshplan.core.errors import MeshplanError
from meshplan.profiler.capture import (
    ENV_CORES,
    ENV_OUT,
    ENV_PLAN,
    ENV_STEPS,
    ENV_STOP,
    ENV_TOTAL,
    ENV_UNPROFILED,
    ENV_WARMUP,
    RECORD_DIR,
    capture_steps,
    load_run_json,
    read_rank_records,
    write_run_json,
)

LOG_NAME = "launch.log"
PLAN_COPY = "plan.yaml"  # the --from-plan file, copied into the run folder


@dataclass
class LaunchConfig:
    """One ``meshplan profile`` request.

    Attributes:
        script: Training script (run unmodified).
        out_dir: Run folder to write.
        script_args: Arguments passed through to the script.
        nproc: Processes (ranks) per node; None = from the plan, else 1.
        nnodes: Nodes; > 1 needs ``rdzv_endpoint``.
        node_rank: This node's rank (multi-node).
        rdzv_backend, rdzv_endpoint, rdzv_id: torchrun rendezvous (multi-node).
        warmup: Steps skipped before measuring.
        steps: Steps measured.
        unprofiled: Steps timed after the traced window with the profiler stopped (``Capture``); the
            script learns how many steps to run from ``$MESHPLAN_CAPTURE_TOTAL_STEPS``.
        pin: Pin each local rank to its own core; None = when there are enough cores.
        plan: Plan file (``--from-plan``): its path reaches the script and is copied into the run folder.
        plan_world_size: The plan's world size (the caller reads the plan; the profiler knows no plan format):
            sets nproc per node.
        stop_when_done: End the script once the measured steps are written.
        show_output: Stream the ranks' output instead of writing it to ``launch.log``.
        environ: Environment the ranks start from (``meshplan profile`` passes its own); the capture's
            ``MESHPLAN_CAPTURE_*`` settings, the plan path and the package's folder on ``PYTHONPATH`` are added.
    """

    script: Path
    out_dir: Path
    script_args: list[str] = field(default_factory=list)
    nproc: Optional[int] = None
    nnodes: int = 1
    node_rank: int = 0
    rdzv_backend: str = "c10d"
    rdzv_endpoint: Optional[str] = None
    rdzv_id: str = "meshplan"
    warmup: int = 2
    steps: int = 8
    unprofiled: int = 0
    pin: Optional[bool] = None
    plan: Optional[Path] = None
    plan_world_size: Optional[int] = None
    stop_when_done: bool = True
    show_output: bool = False
    environ: Mapping[str, str] = field(default_factory=dict)


@dataclass
class LaunchResult:
    """What a launch produced: the run record, its folder, the torchrun command and warnings to show."""

    run: dict
    out_dir: Path
    command: list[str]
    warnings: list[str]


def available_cores() -> list[int]:
    """Cores this process may run on (its affinity mask), sorted."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def _script_accepts_plan(script: Path) -> bool:
    # Cheap and honest: pass --plan only to scripts whose source declares that option.
    try:
        return "--plan" in script.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False


def resolve(cfg: LaunchConfig) -> tuple[LaunchConfig, list[str], list[int]]:
    """Validate a request and fill in nproc, script args and cores.

    Returns:
        (resolved config, warnings, cores to pin local ranks to - empty for no pinning).

    Raises:
        MeshplanError: missing script, bad counts, a plan whose world size does not fit.
    """
    warnings: list[str] = []
    script = Path(cfg.script)
    if not script.is_file():
        raise MeshplanError(f"{script}: script not found")
    if cfg.nproc is not None and cfg.nproc < 1:
        raise MeshplanError(f"--nproc {cfg.nproc}: must be >= 1")
    if cfg.nnodes < 1:
        raise MeshplanError(f"--nnodes {cfg.nnodes}: must be >= 1")
    if not 0 <= cfg.node_rank < cfg.nnodes:
        raise MeshplanError(f"--node-rank {cfg.node_rank}: must be in [0, {cfg.nnodes - 1}] for --nnodes {cfg.nnodes}")
    if cfg.nnodes > 1 and not cfg.rdzv_endpoint:
        raise MeshplanError(f"--nnodes {cfg.nnodes}: multi-node runs need --rdzv-endpoint HOST:PORT")
    if cfg.warmup < 0:
        raise MeshplanError(f"--warmup {cfg.warmup}: must be >= 0")
    if cfg.steps < 1:
        raise MeshplanError(f"--steps {cfg.steps}: must be >= 1")
    nproc = cfg.nproc
    args = list(cfg.script_args)
    if cfg.plan is not None:
        if cfg.plan_world_size is None:
            raise ValueError("LaunchConfig.plan needs plan_world_size (the caller reads the plan)")
        world = cfg.plan_world_size
        if world % cfg.nnodes:
            raise MeshplanError(f"{cfg.plan}: world size {world} does not split over --nnodes {cfg.nnodes}")
        want = world // cfg.nnodes
        if nproc is not None and nproc != want:
            raise MeshplanError(f"{cfg.plan}: plan world size {world} needs --nproc {want} on {cfg.nnodes} "
                                f"node(s), got --nproc {nproc}")
        nproc = want
        if "--plan" not in args and _script_accepts_plan(script):
            args = ["--plan", str(cfg.plan), *args]
    nproc = nproc or 1
    cores = available_cores()
    pin = cfg.pin if cfg.pin is not None else nproc <= len(cores)
    if nproc > len(cores):
        warnings.append(f"{nproc} ranks on {len(cores)} cores: ranks share cores, so step times are not fit for "
                        f"timing (use --nproc {len(cores)} or fewer)")
    pin_cores = cores if pin else []
    resolved = LaunchConfig(**{**cfg.__dict__, "script": script, "nproc": nproc, "script_args": args,
                               "pin": bool(pin)})
    return resolved, warnings, pin_cores


def torchrun_command(cfg: LaunchConfig) -> list[str]:
    """The torchrun command line for a resolved config."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(cfg.nproc),
           "--nnodes", str(cfg.nnodes), "--max-restarts", "0"]
    if cfg.nnodes == 1 and not cfg.rdzv_endpoint:
        cmd.append("--standalone")  # c10d store on a free port: parallel local runs never collide
    else:
        cmd += ["--node-rank", str(cfg.node_rank), "--rdzv-backend", cfg.rdzv_backend,
                "--rdzv-endpoint", str(cfg.rdzv_endpoint), "--rdzv-id", cfg.rdzv_id]
    return [*cmd, "-m", "meshplan.profiler._bootstrap", str(cfg.script), *cfg.script_args]


def _staging_dir(out: Path) -> Path:
    """A fresh folder beside ``out`` that the ranks write into; renamed to ``out`` only on success."""
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists() and not out.is_dir():
        raise MeshplanError(f"--out {out}: exists and is not a folder")
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.new-", dir=out.parent))


def _publish(staged: Path, out: Path) -> None:
    """Replace ``out`` by ``staged``: the old run is moved aside, the new one renamed in, then the old one removed.

    Between the two renames ``out`` is briefly absent, never half-written; a crash there leaves the old run in
    ``.NAME.old-*`` beside it.
    """
    old = None
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        os.rmdir(old)
        os.replace(out, old)
    os.replace(staged, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _keep_failed(staged: Path, out: Path) -> Path:
    """A failed attempt's folder (its launch.log) kept as ``OUT.failed``; the previous run in OUT is untouched."""
    failed = out.parent / f"{out.name}.failed"
    shutil.rmtree(failed, ignore_errors=True)
    os.replace(staged, failed)
    return failed


def _steps_done(out: Path) -> int:
    counts = []
    for p in (out / RECORD_DIR).glob("progress.rank*"):
        try:
            counts.append(int(p.read_text().strip() or 0))
        except (OSError, ValueError):
            pass
    return min(counts) if counts else 0


def _last_error_line(log: Path) -> str:
    """The script's own exception line (``ValueError: ...``), not torchrun's ChildFailedError wrapper."""
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    for ln in reversed(lines):
        if re.match(r"^[\w.]*(Error|Exception|Interrupt)\b", ln) and not ln.startswith("torch.distributed.elastic"):
            return ln[:300]
    return ""


def launch(cfg: LaunchConfig, on_progress: Optional[Callable[[int, int], None]] = None,
           meshplan_command: Optional[str] = None) -> LaunchResult:
    """Run a script under torchrun with the profiler attached and write the run folder.

    Args:
        cfg: The request.
        on_progress: Called with (steps done, steps expected) while the ranks run.
        meshplan_command: The user's command line, recorded in ``run.json``.

    Returns:
        The run record and warnings.

    Raises:
        MeshplanError: bad request, the script failed, or no step boundary was found.
    """
    cfg, warnings, cores = resolve(cfg)
    final = Path(cfg.out_dir)
    out = _staging_dir(final)  # ranks write here; the run in `final` stays intact until this one succeeds
    try:
        result = _launch_into(cfg, out, final, cores, warnings, on_progress, meshplan_command)
    except BaseException as exc:
        failed = _keep_failed(out, final)
        if isinstance(exc, MeshplanError):
            raise MeshplanError(str(exc).replace(str(out), str(failed)), exc.exit_code) from None
        raise
    _publish(out, final)
    return LaunchResult(run=load_run_json(final), out_dir=final, command=result, warnings=warnings)


def _launch_into(cfg: LaunchConfig, out: Path, final: Path, cores: list[int], warnings: list[str],
                 on_progress: Optional[Callable[[int, int], None]], meshplan_command: Optional[str]) -> list[str]:
    """Run torchrun with the ranks writing into ``out``; returns the command. Raises MeshplanError on failure."""
    cmd = torchrun_command(cfg)
    pkg_root = str(Path(__file__).resolve().parents[1])
    env = dict(cfg.environ)
    total = capture_steps(cfg.warmup, cfg.steps, cfg.unprofiled)
    env.update({ENV_OUT: str(out.resolve()), ENV_WARMUP: str(cfg.warmup), ENV_STEPS: str(cfg.steps),
                ENV_CORES: ",".join(map(str, cores)), ENV_STOP: "1" if cfg.stop_when_done else "0",
                ENV_UNPROFILED: str(cfg.unprofiled), ENV_TOTAL: str(total),
                "PYTHONPATH": os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH", "")) if p)})
    if cfg.plan is not None:
        env[ENV_PLAN] = str(cfg.plan)
    if cores:
        env.setdefault("OMP_NUM_THREADS", "1")  # one pinned core per rank: more threads only contend
    log = out / LOG_NAME
    with open(log, "wb") as log_fh:
        sink = None if cfg.show_output else log_fh
        proc = subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT if sink else None)
        try:
            while proc.poll() is None:
                if on_progress:
                    on_progress(min(_steps_done(out), total), total)
                time.sleep(0.2)
        except BaseException:
            proc.terminate()  # Ctrl-C / SIGTERM while the ranks run: stop them before the folder is moved
            proc.wait(timeout=30)
            raise
    rc = proc.returncode
    records = read_rank_records(out)
    if rc != 0:
        detail = _last_error_line(log) if not cfg.show_output else ""
        raise MeshplanError(f"{cfg.script}: torchrun exited with status {rc}"
                            + (f" ({detail})" if detail else "") + f"; output in {log}; the previous run in "
                            f"{final} (if any) is unchanged")
    if not records:
        raise MeshplanError(f"{cfg.script}: no rank wrote a capture record; output in {log}")
    for rank, rec in sorted(records.items()):
        if not rec.get("all_step_times_s"):
            raise MeshplanError(f"{cfg.script}: no optimizer step seen on rank {rank}; meshplan profile finds steps "
                                "through torch.optim's step hook - without a torch.optim optimizer, use "
                                "profiler.capture.capture() and call cap.step()")
        got = len(rec.get("step_times_s") or [])
        if got < cfg.steps:
            warnings.append(f"rank {rank}: only {got} of {cfg.steps} measured steps (the script ran "
                            f"{len(rec['all_step_times_s'])} steps, {cfg.warmup} skipped as warm-up)")
        elif len(rec.get("unprofiled_step_times_s") or []) < cfg.unprofiled:
            warnings.append(f"rank {rank}: only {len(rec.get('unprofiled_step_times_s') or [])} of "
                            f"{cfg.unprofiled} unprofiled steps (the script ran {len(rec['all_step_times_s'])} "
                            f"steps; it needs {total}, given to it as ${ENV_TOTAL})")
    extra = {"command": meshplan_command or shlex.join(cmd), "torchrun": cmd, "script": str(cfg.script),
             "argv": cfg.script_args, "nproc_per_node": cfg.nproc, "nnodes": cfg.nnodes,
             "plan": str(cfg.plan) if cfg.plan else None, "pinned": bool(cores)}
    if cfg.plan is not None:  # the run folder keeps the plan it ran, so check/fit work after the folder moves
        write_atomic(out / PLAN_COPY, Path(cfg.plan).read_bytes())
        extra["plan_copy"] = PLAN_COPY
    write_run_json(out, records, extra)
    shutil.rmtree(out / RECORD_DIR, ignore_errors=True)
    load_run_json(out)  # validate what was written before it replaces the previous run
    if on_progress:
        on_progress(total, total)
    return cmd
