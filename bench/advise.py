"""Predicted against measured gain of ``meshplan advise`` on this host, over a few deliberately poor layouts.

For each starting layout of the tiny GPT on ``local:2``: plan it pinned (``--fix``), run it under ``meshplan
profile``, ``meshplan advise`` the run (``--to torchrun``; host terms fitted in the run's own conditions, the
default) and advise it again with the free-core terms (``verify.learn``'s, ``AdviseRequest(in_run_terms=False)``),
then run the starting plan's and each advised plan's torchrun exports ``--repeats`` times each, alternating, and
compare the medians of the trainer's own ``median_step_ms``. Prints one row per layout with the host's load
average (and ``--json``); BENCHMARKS.md records the figures.

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


_FREE_CORE = """
import json, sys
from pathlib import Path
from meshplan.cli.common import print_json
from meshplan.planner.host.terms import load_host
from meshplan.verify.advise.job import AdviseRequest, advise
a = advise(AdviseRequest(Path(sys.argv[1]), out=Path(sys.argv[2]), to="torchrun", in_run_terms=False),
           host_for=load_host)
print(json.dumps(a.as_dict(), default=str))
"""


def _advise(run: Path, out: Path, in_run: bool) -> dict:
    """``meshplan advise RUN --to torchrun`` as JSON; free-core terms (the library, run from the repository so the
    checkout's meshplan answers) when ``in_run`` is False."""
    if in_run:
        return json.loads(_meshplan("advise", str(run), "--out", str(out), "--to", "torchrun", "--json").stdout)
    r = subprocess.run([sys.executable, "-c", _FREE_CORE, str(run), str(out)], capture_output=True, text=True,
                       cwd=REPO)
    if r.returncode != 0:
        raise SystemExit(f"advise (free-core terms) failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _row(a: dict) -> dict:
    return {"advised": a["best_layout"], "price_error": a["price_error"], "predicted_gain": a["predicted_gain"],
            "changes": a["changes"], "still_best": a["still_best"], "export": a["export"],
            "calibration": a["calibration"] + [n for n in a["notes"] if "free-core" in n]}


def one(start: str, tmp: Path, repeats: int, steps: int, batch: int, seq: int) -> dict:
    name = re.sub(r"[^a-z0-9]+", "-", start)
    load = os.getloadavg()[0]
    bad = tmp / f"{name}.yaml"
    _meshplan("plan", "--model", str(CONFIG), "--cluster", "local:2", "--global-batch", str(batch), "--seq-len",
              str(seq), "--dtype", "fp32", "--fix", start, "--out", str(bad), "--json")
    run = tmp / f"run-{name}"
    _meshplan("profile", "--from-plan", str(bad), "--out", str(run), "--warmup", "2", "--steps", str(steps),
              "--unprofiled-steps", "4", "--json", str(TRAINER))
    a = _advise(run, tmp / f"{name}-advised.yaml", True)
    free = _row(_advise(run, tmp / f"{name}-advised-free-core.yaml", False))
    bad_sh = tmp / f"{name}.torchrun.sh"
    bad_sh.write_text(_meshplan("export", str(bad), "--to", "torchrun").stdout)
    row = {"start": start, "ran": a["ran_layout"], "measured_step_s": a["measured_step_s"], **_row(a),
           "free_core": free}
    scripts = {"before": bad_sh}
    for key, r in (("after", row), ("after_free_core", free)):
        if not r["still_best"]:
            scripts[key] = Path(r["export"])
    same = free["advised"] == row["advised"] and not row["still_best"]
    if same:
        scripts.pop("after_free_core", None)  # one layout advised both ways: measured once
    times: dict[str, list[float]] = {k: [] for k in scripts}
    for _ in range(repeats):  # alternating, so a change in the host's load hits every layout alike
        for k, sh in scripts.items():
            times[k].append(_run_export(sh, steps))
    med = {k: statistics.median(v) for k, v in times.items()}
    gain = {k: (med["before"] - med[k]) / med["before"] for k in med if k != "before"}
    free["measured_gain"] = None if free["still_best"] else gain["after" if same else "after_free_core"]
    return {**row, "steps_s": times, "measured_gain": None if row["still_best"] else gain.get("after"),
            "load_avg_1min": [load, os.getloadavg()[0]]}


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
            for label, x in (("in-run terms", r), ("free-core terms", r["free_core"])):
                meas = "still best" if x["measured_gain"] is None else f"{100 * x['measured_gain']:+.1f}%"
                print(f"{r['start']:40} {label:16} -> {x['advised']:48} price error {100 * x['price_error']:+6.1f}%"
                      f"  gain predicted {100 * x['predicted_gain']:+6.1f}%  measured {meas}  (load "
                      f"{r['load_avg_1min'][0]:.1f}-{r['load_avg_1min'][1]:.1f})", flush=True)
    if a.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
