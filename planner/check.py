"""``meshplan check PLAN RUN``: does a measured run keep the step time and memory its plan predicted?

The measured step time is the median over the run's measured (post warm-up) steps of the step time of the
slowest rank (a synchronous step ends when its last rank does); ``run.json``'s ``step_times_s`` holds them.
The run must be the plan's job: its world size, model shape, batch and layout are compared with the plan's
(from the plan file the run was launched with, ``run.json`` ``plan``/``argv``, or the trainer flags in
``argv``) and any difference refuses the comparison (exit 2) naming it.

Noise: the spread of the measured steps is ``(p90 - p10) / median``; when it exceeds the tolerance the
verdict cannot be trusted and a warning says so (issue 6: derive tolerances from the measured spread).
Memory: compared when the run records a peak (``run.json`` ``peak_memory_bytes`` or ``max_rss_bytes`` per
rank); otherwise reported as not recorded.
"""
from __future__ import annotations

import json
import shlex
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from meshplan.core.errors import MeshplanError
from meshplan.planner.plan import Plan, load_plan

PHASE_LABEL = {"compute_s": "compute", "exposed_comm_s": "exposed comm", "bubble_s": "bubble"}


def parse_tolerance(text: str | float) -> float:
    """``15%``, ``0.15`` or ``15`` (percent when > 1) -> fraction.

    Raises:
        MeshplanError: not a number in (0, 100%].
    """
    raw = str(text).strip()
    try:
        v = float(raw[:-1]) / 100.0 if raw.endswith("%") else float(raw)
    except ValueError:
        raise MeshplanError(f"--tolerance {raw!r}: expected a percentage such as 15% or a fraction such as 0.15") \
            from None
    if not raw.endswith("%") and v > 1.0:
        v /= 100.0
    if not 0.0 < v <= 1.0:
        raise MeshplanError(f"--tolerance {raw!r}: must be between 0 and 100%")
    return v


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
    """Read ``run.json`` of a ``meshplan profile`` folder.

    Raises:
        MeshplanError: no run.json, or no step times in it.
    """
    p = Path(run_dir)
    f = p / "run.json" if p.is_dir() else p
    try:
        rec = json.loads(f.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MeshplanError(f"{f}: run.json not found (make the run with `meshplan profile --out {p}`)") from None
    except (OSError, ValueError) as exc:
        raise MeshplanError(f"{f}: not a readable run.json ({exc})") from None
    times = rec.get("step_times_s") if isinstance(rec, dict) else None
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
    return MeasuredRun(p, world, step, med, spread, peak, rec, traced_med, unprofiled, note)


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


# ---------------------------------------------------------------- the check

@dataclass
class CheckResult:
    """Everything ``meshplan check`` reports. Times in seconds, memory in bytes, error as a fraction."""

    plan_path: str
    run_path: str
    tolerance: float
    predicted_s: float
    measured_s: float
    error: float  # (measured - predicted) / predicted
    passed: bool
    spread: float
    noisy: bool
    steps: int
    step_s: list[float]
    predicted_peak_bytes: int
    measured_peak_bytes: Optional[int]
    phases: list[dict] = field(default_factory=list)  # [{"phase", "predicted_s", "measured_s", "delta_s"}]
    moved_phase: Optional[str] = None
    breakdown_rank: Optional[int] = None
    warnings: list[str] = field(default_factory=list)
    raw_error: Optional[float] = None  # vs the plan's own prediction, when judged on a contention-scaled one
    contention: Optional[float] = None  # traced / fastest time of the run's repeated ops (planner.contention)
    traced_s: Optional[float] = None  # median of the traced steps when measured_s comes from unprofiled ones
    profiler_overhead_s: float = 0.0  # traced minus unprofiled median: taken off the measured compute phase

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def as_dict(self) -> dict:
        d = asdict(self)
        d["exit_code"] = self.exit_code
        return d


def check(plan_path: str | Path, run_path: str | Path, tolerance: float = 0.15,
          breakdown: bool = True, contention: Optional[float] = None) -> CheckResult:
    """Compare a plan's prediction with a measured run.

    Args:
        plan_path: Plan YAML with a prediction.
        run_path: ``meshplan profile`` run folder (run.json + one trace per rank).
        tolerance: Allowed relative step-time error (fraction).
        breakdown: Also split the measured steps into phases from the traces (slower: loads every trace).
        contention: Host contention factor (``planner.contention.run_contention``, 1.0 = free cores): when
            given, the prediction's CPU work (compute, optimizer, bubble) is scaled by it before judging (a rank
            that gets 1/f of its core runs f times slower) and the unscaled error is kept in ``raw_error``. The
            exposed communication is not scaled: its price is already what ranks paid on this host (the
            calibration's in-step collectives, timed with the gloo thread on the rank's core), while compute
            is priced at free-core speed.

    Raises:
        MeshplanError: unreadable inputs, a plan without prediction, or a run of another job (names the field).
    """
    plan = load_plan(plan_path)
    if plan.prediction is None:
        raise MeshplanError(f"{plan_path}: the plan has no prediction to check (re-run `meshplan plan`)")
    run = load_measured(run_path)
    diffs, warns = identity_mismatches(plan, run)
    if diffs:
        raise MeshplanError(f"{run_path}: not a run of {plan_path}: " + "; ".join(diffs))
    pred = plan.prediction
    if contention:
        # An op's stretch in an oversubscribed run includes the plan's own ranks sharing cores, which the
        # prediction already holds: only the part beyond ranks/cores is other people's load.
        contention = max(1.0, contention / _own_oversubscription(plan))
    predicted_s = scaled_step_s(pred, contention or 1.0)
    err = (run.median_s - predicted_s) / predicted_s
    noisy = run.spread > tolerance
    if noisy:
        warns.append(f"measured steps vary {100 * run.spread:.0f}% (p10-p90 over {len(run.step_s)} steps), more "
                     f"than the {100 * tolerance:.0f}% tolerance: the verdict is not reliable (noisy host? pin "
                     f"ranks, run more steps)")
    if len(run.step_s) < 5:
        warns.append(f"only {len(run.step_s)} measured steps: a median of fewer than 5 steps is fragile")
    pinned = run.record.get("pinned")
    if pinned is False:
        warns.append("ranks were not pinned to cores (or shared them): expect step-time noise")
    res = CheckResult(str(plan_path), str(run_path), tolerance, predicted_s, run.median_s, err,
                      abs(err) <= tolerance, run.spread, noisy, len(run.step_s), list(run.step_s),
                      pred.peak_memory_bytes, run.peak_memory_bytes, warnings=warns)
    if run.window_note:
        res.warnings.append(run.window_note)
    if run.unprofiled:
        res.traced_s, res.profiler_overhead_s = run.traced_median_s, run.profiler_overhead_s
        res.warnings.append(f"judged on {len(run.step_s)} steps timed with the profiler stopped (median "
                            f"{1e3 * run.median_s:.1f} ms; the traced steps' {1e3 * run.traced_median_s:.1f} ms, "
                            f"{100 * run.profiler_overhead_s / run.median_s:+.1f}%, hold the profiler's cost, "
                            "taken off the measured compute phase)")
    if contention:
        res.contention = contention
        res.raw_error = (run.median_s - pred.step_time_s) / pred.step_time_s
        res.warnings.append(f"host contention {contention:.2f}x (the run's repeated operators took {contention:.2f}x "
                            f"their fastest time): prediction scaled from {1e3 * pred.step_time_s:.1f} ms to "
                            f"{1e3 * predicted_s:.1f} ms; unscaled error {100 * res.raw_error:+.1f}%")
    if run.peak_memory_bytes is None:
        res.warnings.append("the run records no peak memory; memory not compared")
    if breakdown:
        _add_phases(res, plan, run_path)
    return res


def scaled_step_s(pred, f: float) -> float:
    """Predicted step time with its CPU work stretched by contention ``f`` (see ``check``), seconds."""
    return f * (pred.step_time_s - pred.breakdown.exposed_comm_s) + pred.breakdown.exposed_comm_s


def _own_oversubscription(plan: Plan) -> float:
    if not plan.cluster.spec.lower().startswith("local:"):
        return 1.0
    from meshplan.planner.estimate_cpu import world_cores

    return max(1.0, plan.degrees.world_size / world_cores(None))


def _add_phases(res: CheckResult, plan: Plan, run_path) -> None:
    from meshplan.planner.run_breakdown import measured_breakdown

    mb = measured_breakdown(run_path)
    b = plan.prediction.breakdown
    f = res.contention or 1.0
    predicted = {"compute_s": f * (b.compute_s + b.other_s), "exposed_comm_s": b.exposed_comm_s,
                 "bubble_s": f * b.bubble_s}
    measured = mb.as_dict()
    # the traces hold the profiler's own cost per op (main-thread CPU time): the unprofiled steps show how much
    measured["compute_s"] = max(0.0, measured["compute_s"] - res.profiler_overhead_s)
    rows = [{"phase": PHASE_LABEL[k], "predicted_s": predicted[k], "measured_s": measured[k],
             "delta_s": measured[k] - predicted[k]} for k in PHASE_LABEL]
    res.phases = rows
    res.breakdown_rank = mb.rank
    res.moved_phase = max(rows, key=lambda r: abs(r["delta_s"]))["phase"]


# ---------------------------------------------------------------- reports

def _esc(s: str) -> str:
    return (s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;"))


def verdict_line(r: CheckResult) -> str:
    word = "within" if r.passed else "outside"
    line = (f"step time {1e3 * r.measured_s:.1f} ms measured vs {1e3 * r.predicted_s:.1f} ms predicted: "
            f"{100 * r.error:+.1f}%, {word} the {100 * r.tolerance:.0f}% tolerance")
    if r.moved_phase:
        line += f"; the phase that differs most: {r.moved_phase}"
    return line


def junit_xml(r: CheckResult) -> str:
    """JUnit XML (one test suite, one case per check) for CI test reporters."""
    cases = [("step_time", r.passed, verdict_line(r))]
    fails = sum(1 for _, ok, _ in cases if not ok)
    out = ['<?xml version="1.0" encoding="UTF-8"?>',
           f'<testsuites tests="{len(cases)}" failures="{fails}">',
           f'  <testsuite name="meshplan check" tests="{len(cases)}" failures="{fails}" errors="0" '
           f'time="{sum(r.step_s):.3f}">',
           f'    <properties><property name="plan" value="{_esc(r.plan_path)}"/>'
           f'<property name="run" value="{_esc(r.run_path)}"/></properties>']
    for name, ok, msg in cases:
        out.append(f'    <testcase classname="meshplan.check" name="{name}" time="{r.measured_s:.6f}">')
        if not ok:
            out.append(f'      <failure message="{_esc(msg)}" type="StepTimeDrift">{_esc(msg)}</failure>')
        if r.warnings:
            out.append(f"      <system-out>{_esc(chr(10).join('warning: ' + w for w in r.warnings))}</system-out>")
        out.append("    </testcase>")
    out += ["  </testsuite>", "</testsuites>", ""]
    return "\n".join(out)


def markdown(r: CheckResult) -> str:
    """Markdown summary (GitHub Actions ``$GITHUB_STEP_SUMMARY``)."""
    icon = "PASS" if r.passed else "FAIL"
    lines = [f"## meshplan check: {icon}", "", f"`{r.plan_path}` vs `{r.run_path}`", "", verdict_line(r), "",
             "| | predicted | measured |", "|---|---:|---:|",
             f"| step time (ms) | {1e3 * r.predicted_s:.1f} | {1e3 * r.measured_s:.1f} |",
             f"| peak memory (MiB) | {r.predicted_peak_bytes / 2**20:.1f} | "
             + (f"{r.measured_peak_bytes / 2**20:.1f} |" if r.measured_peak_bytes is not None else "not recorded |")]
    for ph in r.phases:
        lines.append(f"| {ph['phase']} (ms) | {1e3 * ph['predicted_s']:.1f} | {1e3 * ph['measured_s']:.1f} |")
    lines += ["", f"Measured steps: {r.steps}, spread (p10-p90) {100 * r.spread:.1f}%."]
    if r.breakdown_rank is not None:
        lines.append(f"Breakdown of the critical rank {r.breakdown_rank}.")
    for w in r.warnings:
        lines.append(f"- warning: {w}")
    return "\n".join(lines) + "\n"
