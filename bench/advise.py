"""Predicted against measured gain of ``meshplan advise`` on this host, over a few deliberately poor layouts.

For each starting layout of the tiny GPT on ``local:2``: plan it pinned (``--fix``), run it under ``meshplan
profile``, ``meshplan advise`` the run (``--to torchrun``), then run the starting plan's and the advised plan's
torchrun exports ``--repeats`` times each, alternating, and compare the medians of the trainer's own
``median_step_ms``. Prints one row per layout (and ``--json``); BENCHMARKS.md records the figures.

    python bench/advise.py [--repeats 3] [--steps 6] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "tiny-gpt" / "config.json"
TRAINER = REPO / "examples" / "train_gpt.py"
STARTS = ("tp=2,mbs=1,recompute=full", "pp=2,mbs=1", "dp_shard=2,zero=3,mbs=1,recompute=full")
_STEP = re.compile(r"median_step_ms=([0-9.]+)")


def _meshplan(*args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "meshplan.cli.main", *args], capture_output=True, text=True,
                       cwd=REPO)
    if r.returncode != 0:
        raise SystemExit(f"meshplan {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    return r


def _run_export(script: Path, steps: int) -> float:
    """One run of an exported torchrun script; the trainer's median step (s) after its warm-up steps."""
    env = {**os.environ, "MESHPLAN_ENTRY": str(TRAINER)}
    r = subprocess.run(["bash", str(script), "--steps", str(steps)], capture_output=True, text=True, cwd=REPO,
                       env=env)
    m = _STEP.search(r.stdout + r.stderr)
    if r.returncode != 0 or m is None:
        raise SystemExit(f"{script} failed ({r.returncode}): {(r.stdout + r.stderr)[-2000:]}")
    return float(m.group(1)) / 1e3


def one(start: str, tmp: Path, repeats: int, steps: int, batch: int, seq: int) -> dict:
    name = re.sub(r"[^a-z0-9]+", "-", start)
    bad = tmp / f"{name}.yaml"
    _meshplan("plan", "--model", str(CONFIG), "--cluster", "local:2", "--global-batch", str(batch), "--seq-len",
              str(seq), "--dtype", "fp32", "--fix", start, "--out", str(bad), "--json")
    run = tmp / f"run-{name}"
    _meshplan("profile", "--from-plan", str(bad), "--out", str(run), "--warmup", "2", "--steps", str(steps),
              "--unprofiled-steps", "4", "--json", str(TRAINER))
    advised = tmp / f"{name}-advised.yaml"
    a = json.loads(_meshplan("advise", str(run), "--out", str(advised), "--to", "torchrun", "--json").stdout)
    bad_sh = tmp / f"{name}.torchrun.sh"
    bad_sh.write_text(_meshplan("export", str(bad), "--to", "torchrun").stdout)
    row = {"start": start, "ran": a["ran_layout"], "advised": a["best_layout"], "price_error": a["price_error"],
           "predicted_gain": a["predicted_gain"], "changes": a["changes"]}
    if a["still_best"]:
        return {**row, "measured_gain": None}
    before, after = [], []
    for _ in range(repeats):  # alternating, so a change in the host's load hits both alike
        before.append(_run_export(bad_sh, steps))
        after.append(_run_export(Path(a["export"]), steps))
    b, n = statistics.median(before), statistics.median(after)
    return {**row, "before_s": before, "after_s": after, "measured_gain": (b - n) / b}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--start", action="append", help="a starting layout (--fix text); default: three poor ones")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="meshplan-advise-bench-") as tmp:
        for start in a.start or STARTS:
            rows.append(one(start, Path(tmp), a.repeats, a.steps, a.global_batch, a.seq_len))
            r = rows[-1]
            meas = "still best" if r["measured_gain"] is None else f"{100 * r['measured_gain']:+.1f}%"
            print(f"{r['start']:42} -> {r['advised']:50} price error {100 * r['price_error']:+6.1f}%  "
                  f"gain predicted {100 * r['predicted_gain']:+6.1f}%  measured {meas}", flush=True)
    if a.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
