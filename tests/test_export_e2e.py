"""End to end: the rendered torchrun script launches examples/train_gpt.py for real (2 CPU processes, gloo) and
the trainer reports the layout and batch arithmetic of the plan (dp_shard 2, micro 2, 2 accumulation steps)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from meshplan.planner.export import render
from meshplan.planner.plan.schema import ClusterRef, Degrees, DeviceGroupRef, ModelRef, Plan
from tests.helpers import REPO

# examples/tiny-gpt/config.json: GPT-2 layout, 4 layers, 128 wide, 4 heads, vocab 2048, tied embeddings.
TINY = ModelRef(name="tiny-gpt", source="examples/tiny-gpt/config.json", model_type="gpt2", num_params=0,
                hidden_size=128, num_layers=4, num_attention_heads=4, num_kv_heads=4, ffn_hidden_size=512,
                vocab_size=2048, tied_embeddings=True)


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not available")
def test_torchrun_script_trains(tmp_path: Path) -> None:
    if not (REPO / "examples" / "train_gpt.py").exists():
        pytest.skip("examples/train_gpt.py not present")
    plan = Plan(name="tiny-fsdp2", model=TINY,
                cluster=ClusterRef(spec="local:2", groups=(DeviceGroupRef(nodes=1, devices_per_node=2, device="cpu"),)),
                global_batch=8, micro_batch=2, seq_len=64, degrees=Degrees(dp_shard=2), zero_stage=3,
                recompute="full", dtype="fp32")
    plan_file = plan.save(tmp_path / "tiny.yaml")
    script = tmp_path / "launch.sh"
    script.write_text(render(plan, "torchrun").text)
    bindir = Path(sys.executable).parent  # the torchrun of this interpreter
    env = {**os.environ, "MESHPLAN_PLAN": str(plan_file), "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}",
           "OMP_NUM_THREADS": "1"}
    res = subprocess.run(["bash", str(script), "--steps", "2"], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=180)
    assert res.returncode == 0, res.stderr[-2000:]
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("train_gpt:"))
    fields = dict(re.findall(r"(\w+)=([\w.]+)", line))
    assert (fields["world"], fields["dp_shard"], fields["tp"], fields["pp"]) == ("2", "2", "1", "1")
    # global 8 = micro 2 x dp 2 x accum 2
    assert (fields["micro"], fields["accum"], fields["steps"]) == ("2", str(plan.grad_accum), "2")
