"""``meshplan check`` reads a run once: ``run.json`` is parsed once and each rank's trace loaded once, however
many analyses use them (the check, the phase split, the contention measure). Counted at the profiler's own
readers (``profiler.runrecord.validate_run_record``, which every read of run.json ends in, and the trace parser
``profiler.ingest.load_trace``), which still do the real work."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import meshplan.profiler.ingest as ingest
import meshplan.profiler.runrecord as runrecord
from meshplan.cli.main import app
from meshplan.planner.plan.schema import Breakdown, ClusterRef, Degrees, DeviceGroupRef, ModelRef, Plan, Prediction
from tests.helpers import DATA

TRACES = DATA / "profiler" / "gloo_ddp_2rank"  # two ranks of a real gloo DDP run


def _counted(monkeypatch, module, name: str) -> list[int]:
    calls = [0]
    real = getattr(module, name)

    def counting(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counting)
    return calls


def _plan(tmp: Path) -> Path:
    model = ModelRef(name="tiny-gpt", source="examples/tiny-gpt/config.json", model_type="gpt2",
                     num_params=1088256, hidden_size=128, num_layers=4, num_attention_heads=4, num_kv_heads=4,
                     ffn_hidden_size=512, vocab_size=2048)
    plan = Plan(name="t", model=model, cluster=ClusterRef(spec="local:2", groups=(
        DeviceGroupRef(nodes=1, devices_per_node=2, device="cpu-local"),)), global_batch=16,
        micro_batch=4, seq_len=256, degrees=Degrees(dp_replicate=2), dtype="fp32",
        prediction=Prediction(step_time_s=0.2, tokens_per_s=1.0, tflops_per_device=0.0,
                              hw_tflops_per_device=0.0, mfu=0.0, peak_memory_bytes=2**30,
                              breakdown=Breakdown(compute_s=0.15, exposed_comm_s=0.04, bubble_s=0.0, other_s=0.01)))
    return plan.save(tmp / "plan.yaml")


def _run(tmp: Path) -> Path:
    d = tmp / "run"
    d.mkdir()
    for r in (0, 1):
        shutil.copy(TRACES / f"rank{r}.trace.json.gz", d / f"rank{r}.trace.json.gz")
    rec = {"format": "meshplan-run/1", "world_size": 2, "backend": "gloo", "pinned": True, "argv": [],
           "step_times_s": {"0": [0.2] * 5, "1": [0.21] * 5},
           "traces": {"0": "rank0.trace.json.gz", "1": "rank1.trace.json.gz"}}
    (d / "run.json").write_text(json.dumps(rec))
    return d


def test_check_reads_run_json_and_each_trace_once(tmp_path, runner, monkeypatch):
    plan, run = _plan(tmp_path), _run(tmp_path)
    parses = _counted(monkeypatch, runrecord, "validate_run_record")
    loads = _counted(monkeypatch, ingest, "load_trace")
    r = runner.invoke(app, ["check", str(plan), str(run), "--contention", "--json"])
    assert r.exit_code in (0, 1), r.output
    out = json.loads(r.stdout)
    assert {p["phase"] for p in out["phases"]} == {"compute", "exposed comm", "bubble"}  # the traces were used
    assert parses[0] == 1
    assert loads[0] == 2  # one per rank
