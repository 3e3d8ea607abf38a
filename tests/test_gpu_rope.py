"""Megatron-Core's eager chains around GPT-OSS's fused kernels measured on an H200 (unfused RoPE, the fc1 clamp, the
fc2 bias; costmodel/data/measured/nvidia-h200-rope.json, bench/gpu_rope.py; the measured README's section). Each RoPE
case's bytes are recomputed from its shape and every rate checked against the H200's published HBM bandwidth
(costmodel/data/devices.yaml: 4.8 TB/s); the pass counts the op list prices the chains at (``ops_graph``) are
recomputed from the measured times and the estimator's price of one pass; the script's --quick mode runs here."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from meshplan.costmodel.api import Pricer
from meshplan.costmodel.devices import get_device
from meshplan.costmodel.measured import ROPE, measured_files
from meshplan.costmodel.ops import OpSpec
from meshplan.planner.estimate.ops_graph import EXPERT_BIAS_PASSES, GLU_CLAMP_PASSES, MEGATRON_UNFUSED_ROPE_PASSES
from tests.helpers import load_gpu_script

ROOT = Path(__file__).resolve().parents[1]
NAME = "nvidia-h200-rope.json"


@pytest.fixture(scope="module")
def rope_script():
    """bench/gpu_rope.py loaded in this process (it imports bench/gpu_kernels.py beside it, as on the GPU)."""
    return load_gpu_script("gpu_rope")


@pytest.fixture(scope="module")
def records() -> list[dict]:
    data = measured_files(ROPE)[NAME]
    assert data["environment"]["device_name"] == "NVIDIA H200" and data["environment"]["device_type"] == "cuda"
    assert data["sections"]["rope"]["guard"]["cases_skipped"] == 0
    return data["sections"]["rope"]["records"]


@pytest.fixture(scope="module")
def experts() -> dict[str, dict]:
    recs = measured_files(ROPE)[NAME]["sections"]["experts"]["records"]
    assert all("error" not in r for r in recs)
    return {r["kind"]: r for r in recs}


def test_every_case_ran_and_moves_no_more_than_hbm_allows(records):
    assert {(r["shape"], r["kind"]) for r in records if "error" not in r} == {
        (s, k) for s in ("gpt-oss-mbs1", "gpt-oss-mbs4") for k in ("copy", "unfused", "unfused_view")}
    hbm = get_device("H200").mem_bw_bytes_per_s
    for r in records:
        elements = (r["q_heads"] + r["kv_heads"]) * r["tokens"] * r["micro_batch"] * r["head_dim"]
        assert r["elements"] == elements and r["pass_bytes"] == 2 * 2 * elements
        assert r["pass_bytes"] / (r["fwd"]["median_ms"] * 1e-3) <= hbm, r
    copies = [r for r in records if r["kind"] == "copy"]
    assert all(r["pass_bytes"] / (r["fwd"]["median_ms"] * 1e-3) > 0.5 * hbm for r in copies)  # a copy streams


def _pass_ms(*ops: OpSpec) -> float:
    """What the estimator prices one pass of ``ops`` at on an H200, forward and backward (a memory-bound op's backward
    at twice its forward, ``GpuEstimator._bwd_s``), milliseconds."""
    pricer, h200 = Pricer.shipped().under_load(), get_device("H200")
    return sum(3 * pricer.predict(op, h200) for op in ops) * 1e3


def _measured_passes(r: dict, *ops: OpSpec) -> float:
    return r["fwd_bwd"]["median_ms"] / _pass_ms(*ops)


def test_the_priced_pass_counts_are_the_measured_chains_whole_passes(records, experts):
    """Each chain is priced at the whole number of its passes the measurement at the dev set's shape exceeds."""
    rope = {r["shape"]: r for r in records if r["kind"] == "unfused"}
    ratios = {s: _measured_passes(r, OpSpec("elementwise", (r["elements"],), "bf16")) for s, r in rope.items()}
    assert math.floor(ratios["gpt-oss-mbs4"]) == MEGATRON_UNFUSED_ROPE_PASSES <= min(ratios.values()), ratios
    clamp = experts["clamp"]
    n = clamp["rows"] * clamp["width"]
    assert math.floor(_measured_passes(clamp, OpSpec("activation", (n,), "bf16"))) == GLU_CLAMP_PASSES
    bias = [r for k, r in experts.items() if k.startswith("bias_")]
    n = bias[0]["rows"] * bias[0]["width"]
    got = [_measured_passes(r, OpSpec("elementwise", (n,), "fp32"), OpSpec("cast", (n,), "fp32")) for r in bias]
    assert math.floor(min(got)) == EXPERT_BIAS_PASSES and len(got) == 3, got


def test_quick_mode_writes_the_schema_and_tables_read_it(tmp_path, rope_script):
    out = tmp_path / "r.json"
    assert rope_script.main(["--quick", "--out", str(out)]) == 0
    result = json.loads(out.read_text(encoding="utf-8"))
    assert result["schema"] == ROPE and [r["kind"] for r in result["sections"]["rope"]["records"]] == [
        "copy", "unfused", "unfused_view"]
    assert [r["kind"] for r in result["sections"]["experts"]["records"]] == ["clamp", "bias_2"]
    kept = "\n".join(rope_script.tables(str(ROOT / "costmodel" / "data" / "measured" / NAME)))
    assert "NVIDIA H200" in kept and kept.count("unfused") == 4 and "bias_16" in kept
