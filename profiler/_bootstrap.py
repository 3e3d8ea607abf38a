"""Per-rank entry point that ``meshplan profile`` hands to torchrun:
``python -m meshplan.profiler._bootstrap SCRIPT ARGS``.

It pins the rank to its core, starts :class:`profiler.capture.Capture` before the script's first line, installs a
global optimizer-step hook (``torch.optim.optimizer.register_optimizer_step_post_hook``) so step boundaries are
found without help from the script, then runs the unmodified script with :func:`runpy.run_path` as
``__main__`` (its ``sys.argv`` and ``sys.path[0]`` set as if it had been launched directly).

Only the first optimizer that steps defines the step clock: a script with several optimizers (one per pipeline
stage or per parameter group set) still counts one boundary per training step.
"""
from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path
from typing import Any, Optional

import meshplan.profiler.capture as capture_mod
from meshplan.profiler.capture import (
    ENV_CORES,
    ENV_OUT,
    ENV_STEPS,
    ENV_STOP,
    ENV_UNPROFILED,
    ENV_WARMUP,
    Capture,
    CaptureDone,
    RankEnv,
    _env_int,
)


def pin_to_core(local_rank: int, cores_spec: str) -> Optional[int]:
    """Pin this process (and the threads it starts later) to ``cores[local_rank % len(cores)]``.

    Args:
        local_rank: Rank on this node.
        cores_spec: Comma-separated core ids; empty means no pinning.

    Returns:
        The core pinned to, or None.
    """
    cores = [int(c) for c in cores_spec.split(",") if c.strip()]
    if not cores or not hasattr(os, "sched_setaffinity"):
        return None
    core = cores[local_rank % len(cores)]
    os.sched_setaffinity(0, {core})
    return core


class _StepHook:
    """Optimizer-step post hook: the first optimizer seen is the step clock."""

    def __init__(self, cap: Capture):
        self.cap = cap
        self.clock_id: Optional[int] = None

    def __call__(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.clock_id is None:
            self.clock_id = id(optimizer)
        if id(optimizer) == self.clock_id:
            self.cap.step()


def main(argv: list[str]) -> int:
    """Run ``argv[0]`` (a script path) with ``argv[1:]`` under a capture configured from the environment."""
    if not argv:
        print("usage: python -m meshplan.profiler._bootstrap SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    script = Path(argv[0])
    # This runs under torchrun inside the user's process: the environment is the one channel through which
    # `meshplan profile` (profiler.capture_launch) and torchrun hand each rank its settings. It is read here, at
    # this entry point only, and the values are passed down.
    env = os.environ
    cap = Capture(env[ENV_OUT], warmup=_env_int(env, ENV_WARMUP, 2), steps=_env_int(env, ENV_STEPS, 8),
                  stop_when_done=env.get(ENV_STOP, "1") == "1", merge=False,
                  unprofiled=_env_int(env, ENV_UNPROFILED, 0), launch=RankEnv.from_environ(env))
    cap.pinned_core = pin_to_core(cap.local_rank, env.get(ENV_CORES, ""))

    import torch.optim.optimizer as optim_mod

    handle = optim_mod.register_optimizer_step_post_hook(_StepHook(cap))
    capture_mod._BOOTSTRAP_ACTIVE = True
    sys.argv = [str(script), *argv[1:]]
    sys.path[0] = str(script.resolve().parent)
    cap.start()
    code = 0
    try:
        runpy.run_path(str(script), run_name="__main__")
    except CaptureDone:
        code = 0  # measured window written; the rest of the script's loop is not needed
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        handle.remove()
        cap.stop()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
