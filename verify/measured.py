"""A measured run as ``meshplan check`` judges it: its steps (``run.json``), and whether it is the plan's job.

The measured step time is the median over the run's measured (post warm-up) steps of the step time of the
slowest rank (a synchronous step ends when its last rank does); ``run.json``'s ``step_times_s`` holds them, and
``unprofiled_step_times_s`` the steps timed with the profiler stopped, judged when every rank has enough of them.
The run must be the plan's job: its world size, model shape, batch and layout are compared with the plan's
(from the plan file the run was launched with, ``run.json`` ``plan``/``argv``, or the trainer flags in
``argv``) and any difference refuses the comparison (exit 2) naming it.
"""
from __future__ import annotations

import shlex
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from meshplan.core.errors import MeshplanError
from meshplan.planner.plan.schema import Plan, load_plan
from meshplan.profiler.capture import RUN_JSON, load_run_json


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    pos = q * (len(s) - 1)
    i = int(pos)
    j = min(i + 1, len(s) - 1)
    return s[i] + (s[j] - s[i]) * (pos - i)


@dataclass(frozen=True)
class MeasuredRun:
    """Step times of a run folder, seconds."""

    path: Path
    world_size: int
    step_s: tuple[float, ...]  # per measured step: slowest rank
    median_s: float
    spread: float  # (p90 - p10) / median over steps
    peak_memory_bytes: Optional[int]
    record: dict
    traced_median_s: float = 0.0  # median of the traced steps (== median_s unless ``unprofiled``)
    unprofiled: bool = False  # step_s are the steps timed with the profiler stopped
    window_note: Optional[str] = None  # why the unprofiled steps were not used although the run has them

    @property
    def profiler_overhead_s(self) -> float:
        """Traced median minus unprofiled median (the profiler's cost per step; 0 without unprofiled steps)."""
        return self.traced_median_s - self.median_s if self.unprofiled else 0.0


def load_measured(run_dir: str | Path) -> MeasuredRun:
    """The measured steps of a ``meshplan profile`` folder (its ``run.json``).

    Raises:
        MeshplanError: no run.json, or no step times in it.
    """
    p = Path(run_dir)
    folder = p if p.is_dir() or not p.exists() else p.parent  # a run folder, or its run.json
    f = folder / RUN_JSON
    rec = load_run_json(folder)  # the one reader of run.json (profiler.capture)
    times = rec.get("step_times_s")
    if not isinstance(times, dict) or not times or not all(isinstance(v, list) and v for v in times.values()):
        raise MeshplanError(f"{f}: no measured step times (step_times_s) for every rank")
    step = _slowest_rank_steps(times)
    traced_med = statistics.median(step)
    # the steps timed with the profiler stopped, when every rank has enough: the job as it runs unprofiled
    free = rec.get("unprofiled_step_times_s")
    unprofiled = (isinstance(free, dict) and set(free) == set(times)
                  and all(isinstance(v, list) and len(v) >= MIN_UNPROFILED for v in free.values()))
    note = None
    if unprofiled:
        free_step = _slowest_rank_steps(free)
        free_med = statistics.median(free_step)
        gap = (traced_med - free_med) / free_med
        if PROFILER_GAP[0] <= gap <= PROFILER_GAP[1]:
            step = free_step
        else:  # the host changed between the windows: the traced steps go with the traces (and their contention)
            unprofiled = False
            note = (f"the traced steps (median {1e3 * traced_med:.1f} ms) and the unprofiled ones "
                    f"({1e3 * free_med:.1f} ms) differ by {100 * gap:+.0f}%, beyond what the profiler costs "
                    f"({100 * PROFILER_GAP[0]:+.0f}% to {100 * PROFILER_GAP[1]:+.0f}%): the host's load changed "
                    "between them, so the traced steps are judged (the traces say what that load was)")
    med = statistics.median(step)
    spread = (_quantile(list(step), 0.9) - _quantile(list(step), 0.1)) / med if med > 0 else 0.0
    peak = None
    for key in ("peak_memory_bytes", "max_rss_bytes"):
        v = rec.get(key)
        if isinstance(v, dict) and v:
            peak = int(max(float(x) for x in v.values()))
            break
        if isinstance(v, (int, float)):
            peak = int(v)
            break
    world = int(rec.get("world_size") or len(times))
    return MeasuredRun(folder, world, step, med, spread, peak, rec, traced_med, unprofiled, note)


MIN_UNPROFILED = 3  # unprofiled steps per rank needed to judge on them (else the traced steps are used)
# (traced - unprofiled) / unprofiled median that the profiler's own cost explains: measured 13-15% on tiny GPT DDP
# and TP steps (5 us per op), -3% to +13% between the windows of quiet runs. Outside it the host's load changed
# between the windows (seen in a CI run: traced steps 0.24 -> 0.41 s, unprofiled 0.25 s, contention 2.0 in the
# traces), and the contention measured in the traces only fits the traced steps.
PROFILER_GAP = (-0.10, 0.25)


def _slowest_rank_steps(times: dict) -> tuple[float, ...]:
    n = min(len(v) for v in times.values())
    return tuple(max(float(v[i]) for v in times.values()) for i in range(n))


# ---------------------------------------------------------------- is this run the plan's job?

_FLAGS = {"--global-batch": "global_batch", "--micro-batch": "micro_batch", "--seq-len": "seq_len",
          "--layers": "num_layers", "--hidden": "hidden_size", "--heads": "num_attention_heads",
          "--vocab": "vocab_size", "--ffn": "ffn_hidden_size", "--tp": "tp", "--pp": "pp",
          "--dp-shard": "dp_shard", "--dp-replicate": "dp_replicate"}


def _plan_facts(plan: Plan) -> dict:
    m, d = plan.model, plan.degrees
    return {"world_size": d.world_size, "num_layers": m.num_layers, "hidden_size": m.hidden_size,
            "num_attention_heads": m.num_attention_heads, "vocab_size": m.vocab_size,
            "ffn_hidden_size": m.ffn_hidden_size, "global_batch": plan.global_batch, "seq_len": plan.seq_len,
            "micro_batch": plan.micro_batch, "tp": d.tp, "pp": d.pp, "dp_shard": d.dp_shard,
            "dp_replicate": d.dp_replicate}


def launched_plan_path(run: MeasuredRun) -> tuple[Path, str] | None:
    """(readable file, the name the run records) of the plan a run was launched with, or None.

    Looked up in the order: the run folder's own copy (``meshplan profile --from-plan`` writes ``plan.yaml``
    there), the path ``run.json`` records (as given, then relative to the run folder), the trainer's ``--plan``.
    """
    rec = run.record
    argv = rec.get("argv") or []
    if isinstance(argv, str):
        argv = shlex.split(argv)
    named = rec.get("plan")
    if "--plan" in argv[:-1]:
        named = argv[argv.index("--plan") + 1]
    candidates = []
    if rec.get("plan_copy"):
        candidates.append(run.path / rec["plan_copy"])
    if named:
        candidates.append(Path(named))
        if not Path(named).is_absolute():
            candidates.append(run.path / named)
    for c in candidates:
        if c.is_file():
            return c, str(named or c)
    return None


def run_facts(run: MeasuredRun) -> tuple[dict, str]:
    """What the run says about its job: from the plan it was launched with, then explicit trainer flags.

    Returns:
        (facts, where they came from). Facts absent from the record are absent from the dict.
    """
    rec = run.record
    argv = rec.get("argv") or []
    if isinstance(argv, str):
        argv = shlex.split(argv)
    facts: dict = {"world_size": run.world_size}
    source = "run.json world_size"
    found = launched_plan_path(run)
    if found is not None:
        launched = load_plan(found[0])
        facts.update({k: v for k, v in _plan_facts(launched).items() if k != "world_size"})
        source = f"the plan the run was launched with ({found[1]})"
    for i, a in enumerate(argv[:-1]):  # explicit trainer flags override the plan's values, as in train_gpt.py
        key = _FLAGS.get(a)
        if key is None:
            continue
        try:
            facts[key] = int(argv[i + 1])
        except ValueError:
            continue
        source = source + " and its argv" if "argv" not in source else source
    return facts, source


def identity_mismatches(plan: Plan, run: MeasuredRun) -> tuple[list[str], list[str]]:
    """(differences that refuse the comparison, warnings about facts the run does not record)."""
    want = _plan_facts(plan)
    got, _src = run_facts(run)
    diffs = [f"{k.replace('_', ' ')}: plan {want[k]}, run {got[k]}" for k in want if k in got and got[k] != want[k]]
    missing = [k for k in want if k not in got]
    warns = []
    if missing:
        warns.append("the run does not record its " + ", ".join(k.replace("_", " ") for k in missing)
                     + "; compared by world size only for those")
    return diffs, warns
