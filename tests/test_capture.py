"""``meshplan profile`` on real torchrun runs: an unmodified script is profiled, warm-up steps are skipped,
run.json holds per-rank step times that agree with the trace, and bad input ends in one line with exit 2."""
from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from meshplan.cli.main import app
from meshplan.planner.plan.schema import ClusterRef, Degrees, DeviceGroupRef, ModelRef, Plan
from tests.helpers import REPO

# A plain DDP script: no meshplan import, its own argument parser (including a --steps of its own that must not
# be taken by `meshplan profile`), and a --plan option, so --from-plan can hand it the plan path.
PLAIN_SCRIPT = textwrap.dedent('''
    import argparse, json, os
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--plan", default=None)
    p.add_argument("--marker", required=True)
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    with open(f"{a.marker}.{rank}", "w") as fh:
        json.dump({"steps": a.steps, "plan": a.plan, "env_plan": os.environ.get("MESHPLAN_PLAN"),
                   "total": os.environ.get("MESHPLAN_CAPTURE_TOTAL_STEPS"),
                   "affinity": sorted(os.sched_getaffinity(0))}, fh)
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(a.steps):
        loss = model(torch.randn(64, 256)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()
''')

WARMUP, STEPS, UNPROFILED = 3, 4, 5


def _plan(world: int) -> Plan:
    model = ModelRef(name="toy", source="test", model_type="gpt2", num_params=1, hidden_size=256, num_layers=2,
                     num_attention_heads=4, num_kv_heads=4, ffn_hidden_size=512, vocab_size=1000)
    cluster = ClusterRef(spec=f"local:{world}", groups=(DeviceGroupRef(nodes=1, devices_per_node=world,
                                                                       device="cpu"),))
    return Plan(name="toy", model=model, cluster=cluster, global_batch=8, micro_batch=4, seq_len=16,
                degrees=Degrees(dp_replicate=world))


@pytest.fixture(scope="module")
def profiled():
    """One real 2-rank run of the plain script under `meshplan profile --from-plan` (world size from the plan)."""
    from typer.testing import CliRunner

    # Own temp folder: pytest prunes old basetemp folders when other sessions start, even mid-run.
    tmp = Path(tempfile.mkdtemp(prefix="meshplan-capture-"))
    script = tmp / "plain_ddp.py"
    script.write_text(PLAIN_SCRIPT)
    plan_path = _plan(2).save(tmp / "toy.yaml")
    out = tmp / "run"
    res = CliRunner().invoke(app, ["profile", "--from-plan", str(plan_path), "--warmup", str(WARMUP),
                                   "--steps", str(STEPS), "--unprofiled-steps", str(UNPROFILED), "--out", str(out),
                                   "--json", str(script),
                                   "--steps", "40", "--marker", str(tmp / "marker")])
    assert res.exit_code == 0, res.output
    yield {"out": out, "tmp": tmp, "plan": plan_path, "output": res.stdout}
    shutil.rmtree(tmp, ignore_errors=True)


def _trace_steps(path: Path) -> dict[int, float]:
    """ProfilerStep number -> duration (s), read straight from the gzip Kineto file."""
    trace = json.loads(gzip.decompress(path.read_bytes()))
    out = {}
    for ev in trace["traceEvents"]:
        m = re.match(r"ProfilerStep#(\d+)$", ev.get("name", ""))
        if m and ev.get("ph") == "X":
            out[int(m.group(1))] = ev["dur"] / 1e6
    return out


def test_unmodified_script_is_profiled(profiled):
    out = profiled["out"]
    run = json.loads((out / "run.json").read_text())
    assert run["world_size"] == 2 and run["backend"] == "gloo" and run["nproc_per_node"] == 2
    assert sorted(run["traces"]) == ["0", "1"]
    for r in (0, 1):
        assert (out / f"rank{r}.trace.json.gz").is_file()
    assert not (out / ".capture").exists()  # the per-rank records were merged and removed
    # Script arguments pass through untouched, even one named like a meshplan option (--steps 40).
    for r in (0, 1):
        seen = json.loads((profiled["tmp"] / f"marker.{r}").read_text())
        assert seen["steps"] == 40
        # --from-plan: the script declares --plan, so it gets the path; the env var is always set.
        assert seen["plan"] == str(profiled["plan"]) and seen["env_plan"] == str(profiled["plan"])
        if len(os.sched_getaffinity(0)) >= 2:
            assert seen["affinity"] == [sorted(os.sched_getaffinity(0))[r]]  # really pinned, one core each
            assert run["pinned_cores"][str(r)] == seen["affinity"][0]
    assert run["plan"] == str(profiled["plan"])
    # the run folder keeps its own copy of the plan, so check / costmodel fit still find it after the folder moves
    assert run["plan_copy"] == "plan.yaml"
    assert (out / "plan.yaml").read_bytes() == profiled["plan"].read_bytes()
    assert json.loads(profiled["output"])["step_times_s"] == run["step_times_s"]  # --json prints run.json


def test_warmup_steps_are_skipped(profiled):
    out = profiled["out"]
    run = json.loads((out / "run.json").read_text())
    assert run["warmup_steps_skipped"] == WARMUP
    for r in (0, 1):
        steps = _trace_steps(out / f"rank{r}.trace.json.gz")
        # Steps 0..WARMUP-1 never reach the trace; exactly STEPS measured steps follow.
        assert sorted(steps) == list(range(WARMUP, WARMUP + STEPS))


def test_unprofiled_steps_follow_the_traced_window(profiled):
    out = profiled["out"]
    run = json.loads((out / "run.json").read_text())
    assert run["unprofiled_steps_requested"] == UNPROFILED
    for r in (0, 1):
        # warm-up + traced + the step that stops the profiler + the unprofiled ones, told to the script
        seen = json.loads((profiled["tmp"] / f"marker.{r}").read_text())
        assert seen["total"] == str(WARMUP + STEPS + 1 + UNPROFILED)
        free = run["unprofiled_step_times_s"][str(r)]
        assert len(free) == UNPROFILED and all(t > 0 for t in free)
        # the profiler really stopped: the trace ends with the traced window (no ProfilerStep after it)
        assert max(_trace_steps(out / f"rank{r}.trace.json.gz")) == WARMUP + STEPS - 1


def test_step_times_per_rank_match_the_trace(profiled):
    out = profiled["out"]
    run = json.loads((out / "run.json").read_text())
    for r in (0, 1):
        times = run["step_times_s"][str(r)]
        assert len(times) == STEPS and all(t > 0 for t in times)
        traced = _trace_steps(out / f"rank{r}.trace.json.gz")
        # The hook times the same steps the trace holds: two clocks (perf_counter in the step hook, Kineto's
        # ProfilerStep span) over one interval. The hook's own bookkeeping sits between the two readings (2 ms +
        # 5%); judged on the median step, since a loaded host can preempt a rank between two readings of one step.
        gaps = [abs(measured - traced[step]) - 0.05 * traced[step] for measured, step in zip(times, sorted(traced))]
        assert len(traced) == len(times) and statistics.median(gaps) <= 2e-3, (r, times, traced)


def test_library_form_writes_a_run_folder(tmp_path):
    script = tmp_path / "lib_form.py"
    script.write_text(textwrap.dedent('''
        import sys, torch, torch.distributed as dist
        from meshplan.profiler.capture import capture
        dist.init_process_group("gloo")
        w = torch.nn.Parameter(torch.randn(128, 128))
        with capture(sys.argv[1], warmup=1, steps=3) as cap:
            for _ in range(6):
                g = (w @ torch.randn(128, 32)).sum()
                g.backward()
                dist.all_reduce(w.grad)
                w.grad = None
                cap.step()
        dist.destroy_process_group()
    '''))
    out = tmp_path / "lib"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script), str(out)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = json.loads((out / "run.json").read_text())
    assert run["world_size"] == 2 and run["warmup_steps_skipped"] == 1
    assert {k: len(v) for k, v in run["step_times_s"].items()} == {"0": 3, "1": 3}
    assert sorted(_trace_steps(out / "rank1.trace.json.gz")) == [1, 2, 3]


def _one_line_error(res, *needles: str) -> None:
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), res.output
    for n in needles:
        assert n in lines[0], (n, lines[0])


def test_bad_input_is_one_line(runner, tmp_path):
    missing = tmp_path / "nope.py"
    _one_line_error(runner.invoke(app, ["profile", "--out", str(tmp_path / "o"), str(missing)]),
                    str(missing), "not found")
    script = tmp_path / "ok.py"
    script.write_text("print('hi')\n")
    _one_line_error(runner.invoke(app, ["profile", "--nproc", "0", "--out", str(tmp_path / "o"), str(script)]),
                    "--nproc 0")
    _one_line_error(runner.invoke(app, ["profile", "--steps", "0", "--out", str(tmp_path / "o"), str(script)]),
                    "--steps 0")
    plan_path = _plan(4).save(tmp_path / "p4.yaml")
    _one_line_error(runner.invoke(app, ["profile", "--from-plan", str(plan_path), "--nproc", "2",
                                        "--out", str(tmp_path / "o"), str(script)]), "world size 4", "--nproc 2")
    _one_line_error(runner.invoke(app, ["profile", "--nnodes", "2", "--out", str(tmp_path / "o"), str(script)]),
                    "--rdzv-endpoint")


def test_failing_script_is_one_line(runner, tmp_path):
    script = tmp_path / "boom.py"
    script.write_text("raise ValueError('bad learning rate 42')\n")
    res = runner.invoke(app, ["profile", "--nproc", "1", "--out", str(tmp_path / "o"), str(script)])
    _one_line_error(res, str(script), "ValueError: bad learning rate 42")
    # A script that never steps an optimizer cannot be measured: said so, not an empty run folder.
    quiet = tmp_path / "no_optim.py"
    quiet.write_text("import torch\nprint(torch.ones(2).sum())\n")
    res = runner.invoke(app, ["profile", "--nproc", "1", "--out", str(tmp_path / "q"), str(quiet)])
    _one_line_error(res, "no optimizer step seen on rank 0")
    assert not (tmp_path / "q" / "run.json").exists()


def test_more_ranks_than_cores_warns_and_does_not_pin(tmp_path):
    from meshplan.profiler.capture_launch import LaunchConfig, available_cores, resolve

    script = tmp_path / "ok.py"
    script.write_text("print('hi')\n")
    n = len(available_cores()) + 1
    cfg, warnings, cores = resolve(LaunchConfig(script=script, out_dir=tmp_path / "o", nproc=n))
    assert cores == [] and cfg.pin is False
    assert any(f"{n} ranks on {n - 1} cores" in w for w in warnings)
    cfg, warnings, cores = resolve(LaunchConfig(script=script, out_dir=tmp_path / "o", nproc=1))
    assert cores == available_cores() and not warnings


def test_multi_node_command_passes_rendezvous_through(tmp_path):
    from meshplan.profiler.capture_launch import LaunchConfig, resolve, torchrun_command

    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    cfg, _, _ = resolve(LaunchConfig(script=script, out_dir=tmp_path / "o", nproc=1, nnodes=2, node_rank=1,
                                     rdzv_endpoint="head:29400", rdzv_id="job7", script_args=["--lr", "3e-4"]))
    cmd = torchrun_command(cfg)
    assert "--standalone" not in cmd
    for flag, value in (("--nnodes", "2"), ("--node-rank", "1"), ("--rdzv-backend", "c10d"),
                        ("--rdzv-endpoint", "head:29400"), ("--rdzv-id", "job7"), ("--nproc-per-node", "1")):
        assert cmd[cmd.index(flag) + 1] == value
    assert cmd[-5:] == ["-m", "meshplan.profiler._bootstrap", str(script), "--lr", "3e-4"]
