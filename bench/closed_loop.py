"""How close meshplan's predictions land on this host's real runs (issues 6 and 15). Not part of the test suite.

The suite asserts what does not depend on the host's speed (tests/test_loop_real.py, tests/test_realrun_gpt.py);
the accuracy itself is a measurement of a shared, noisy 2-core host and lives here:

1. Closed loop: for each plan (the tiny GPT of examples/tiny-gpt on ``local:2`` / ``local:4``, unfitted model,
   ``--no-host-terms``), ``--sets`` independent runs under ``meshplan profile`` (one pinned core per rank), each
   judged by ``meshplan check --contention`` on the steps timed with the profiler stopped. Printed per plan: the
   error of every run set, the median, how many within 15%, and the median contention.
2. Straggler: the DDP plan run with ``--delay-rank 1 --delay-ms D`` (D = 1.5 measured steps): the check's verdict,
   the phase it names, and how much of D the breakdown finds in the straggler's compute (growth / D).
3. What-if against a real run: the small GPT with a 40 ms sleep on rank 1 (run A), the what-if
   ``name~meshplan::delay@1=4`` replayed from A against a real run with 160 ms (run B): error of the what-if.

Error = (measured - predicted) / predicted. Usage:
``python bench/closed_loop.py [--sets 3] [--plans ddp,fsdp,tp,pp,dp2pp2] [--skip-straggler] [--skip-whatif]
[--json]``
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from meshplan.cli.main import app  # noqa: E402

CONFIG = REPO / "examples" / "tiny-gpt" / "config.json"
TRAINER = REPO / "examples" / "train_gpt.py"
PLANS = {  # name -> (--fix, cluster): the plans of BENCHMARKS.md's closed-loop table
    "ddp": ("dp_replicate=2,mbs=4", "local:2"),
    "fsdp": ("dp_shard=2,zero=3,mbs=4", "local:2"),
    "tp": ("tp=2,mbs=4", "local:2"),
    "pp": ("pp=2,vpp=1,mbs=4", "local:2"),
    "dp2pp2": ("dp_replicate=2,pp=2,vpp=1,mbs=2", "local:4"),
}
SMALL = ["--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "512", "--seq-len", "32",
         "--micro-batch", "2", "--global-batch", "4"]
DELAY_A_MS, DELAY_FACTOR = 40.0, 4
RUNNER = CliRunner()


def _invoke(args: list[str]) -> str:
    r = RUNNER.invoke(app, args)
    if r.exit_code not in (0, 1):
        raise SystemExit(f"meshplan {' '.join(args[:2])} failed: {r.output}")
    return r.stdout


def plan(tmp: Path, name: str) -> Path:
    fix, cluster = PLANS[name]
    out = tmp / f"{name}.yaml"
    _invoke(["plan", "--model", str(CONFIG), "--cluster", cluster, "--global-batch", "16", "--seq-len", "256",
             "--dtype", "fp32", "--no-host-terms", "--fix", fix, "--out", str(out), "--json"])
    return out


def profile(plan_path: Path | None, out: Path, *script_args: str, steps: int = 8) -> dict:
    ranks = ["--from-plan", str(plan_path)] if plan_path else ["--nproc", "2"]
    _invoke(["profile", *ranks, "--out", str(out), "--warmup", "2", "--steps", str(steps), "--json", str(TRAINER),
             *script_args])
    return json.loads((out / "run.json").read_text())


def check(plan_path: Path, run: Path) -> dict:
    return json.loads(_invoke(["check", str(plan_path), str(run), "--contention", "--json"]))


def closed_loop(tmp: Path, names: list[str], sets: int) -> list[dict]:
    rows = []
    for name in names:
        p = plan(tmp, name)
        checks = [check(p, (profile(p, tmp / f"{name}-{i}"), tmp / f"{name}-{i}")[1]) for i in range(sets)]
        errors = [c["error"] for c in checks]
        rows.append({"plan": name, "fix": PLANS[name][0], "cluster": PLANS[name][1], "errors": errors,
                     "median_error": statistics.median(errors),
                     "within_15": sum(abs(e) <= 0.15 for e in errors),
                     "median_contention": statistics.median(c["contention"] for c in checks),
                     "median_spread": statistics.median(c["spread"] for c in checks)})
    return rows


def straggler(tmp: Path) -> dict:
    p = plan(tmp, "ddp")
    profile(p, tmp / "base")
    base = check(p, tmp / "base")
    delay_s = max(0.3, 1.5 * base["measured_s"])
    profile(p, tmp / "slow", "--delay-rank", "1", "--delay-ms", f"{1e3 * delay_s:.0f}", steps=5)
    slow = check(p, tmp / "slow")

    def compute(d: dict) -> float:
        return next(ph["measured_s"] for ph in d["phases"] if ph["phase"] == "compute")

    return {"delay_s": delay_s, "failed": slow["exit_code"] == 1, "moved_phase": slow["moved_phase"],
            "rank": slow["breakdown_rank"], "found_of_delay": (compute(slow) - compute(base)) / delay_s}


def whatif(tmp: Path) -> dict:
    from meshplan.profiler.report import analyze_run, replay_report

    profile(None, tmp / "A", *SMALL, "--delay-rank", "1", "--delay-ms", str(DELAY_A_MS), steps=6)
    profile(None, tmp / "B", *SMALL, "--delay-rank", "1", "--delay-ms", str(DELAY_A_MS * DELAY_FACTOR), steps=6)
    rep = replay_report(analyze_run(tmp / "A"), what_if=[f"name~meshplan::delay@1={DELAY_FACTOR}"])
    predicted = statistics.median(r["whatif_s"] for r in rep["steps"])
    b = statistics.median(r["measured_s"] for r in replay_report(analyze_run(tmp / "B"))["steps"])
    return {"predicted_s": predicted, "measured_s": b, "error": (predicted - b) / b}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", type=int, default=3, help="independent runs per plan")
    ap.add_argument("--plans", default=",".join(PLANS), help="comma-separated: " + ",".join(PLANS))
    ap.add_argument("--skip-straggler", action="store_true")
    ap.add_argument("--skip-whatif", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    names = [n for n in a.plans.split(",") if n]
    unknown = [n for n in names if n not in PLANS]
    if unknown:
        raise SystemExit(f"--plans: unknown {unknown}; choose from {list(PLANS)}")
    with tempfile.TemporaryDirectory(prefix="meshplan-loop-") as d:
        tmp = Path(d)
        out = {"closed_loop": closed_loop(tmp, names, a.sets)}
        if not a.skip_straggler:
            out["straggler"] = straggler(tmp)
        if not a.skip_whatif:
            out["whatif"] = whatif(tmp)
    if a.json:
        print(json.dumps(out, indent=2))
        return
    con = Console()
    t = Table(title="closed loop: check --contention on unprofiled steps (error %, measured vs predicted)")
    for col in ("plan (--fix)", "cluster", "per run set", "median", "within 15%", "contention", "spread"):
        t.add_column(col, overflow="fold")
    for r in out["closed_loop"]:
        t.add_row(f"{r['plan']} ({r['fix']})", r["cluster"], " / ".join(f"{100 * e:+.1f}" for e in r["errors"]),
                  f"{100 * r['median_error']:+.1f}", f"{r['within_15']} of {len(r['errors'])}",
                  f"{r['median_contention']:.2f}x", f"{100 * r['median_spread']:.0f}%")
    con.print(t)
    if "straggler" in out:
        s = out["straggler"]
        con.print(f"straggler (--delay-ms {1e3 * s['delay_s']:.0f} on rank 1): check failed {s['failed']}, names "
                  f"{s['moved_phase']} on rank {s['rank']}, compute growth = {s['found_of_delay']:.2f} x the delay")
    if "whatif" in out:
        w = out["whatif"]
        con.print(f"what-if name~meshplan::delay@1={DELAY_FACTOR} from run A: {1e3 * w['predicted_s']:.1f} ms vs run "
                  f"B measured {1e3 * w['measured_s']:.1f} ms: {100 * w['error']:+.1f}%")


if __name__ == "__main__":
    main()
