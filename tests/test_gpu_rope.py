"""Megatron-Core's unfused RoPE chain measured on an H200 (costmodel/data/measured/nvidia-h200-rope.json,
bench/gpu_rope.py; the measured README's section). Each case's bytes are recomputed from its shape and every rate
checked against the H200's published HBM bandwidth (costmodel/data/devices.yaml: 4.8 TB/s); the pass count the op
list prices the chain at (``ops_graph.MEGATRON_UNFUSED_ROPE_PASSES``) is recomputed from the measured times and the
shipped cost model's price of one elementwise pass; the script's --quick mode runs its code paths here."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from meshplan.costmodel.api import Pricer
from meshplan.costmodel.devices import get_device
from meshplan.costmodel.measured import ROPE, measured_files
from meshplan.costmodel.ops import OpSpec
from meshplan.planner.estimate.ops_graph import MEGATRON_UNFUSED_ROPE_PASSES

ROOT = Path(__file__).resolve().parents[1]
NAME = "nvidia-h200-rope.json"


@pytest.fixture(scope="module")
def rope_script():
    """bench/gpu_rope.py loaded in this process (it imports bench/gpu_kernels.py beside it, as on the GPU)."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        spec = importlib.util.spec_from_file_location("gpu_rope", ROOT / "bench" / "gpu_rope.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return module


@pytest.fixture(scope="module")
def records() -> list[dict]:
    data = measured_files(ROPE)[NAME]
    assert data["environment"]["device_name"] == "NVIDIA H200" and data["environment"]["device_type"] == "cuda"
    assert data["sections"]["rope"]["guard"]["cases_skipped"] == 0
    return data["sections"]["rope"]["records"]


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


def _elementwise_passes(r: dict, phase_ms: float, backward: bool) -> float:
    """A measured time over the shipped cost model's H200 price of one elementwise pass over the case's q and k."""
    op = OpSpec("elementwise", (r["elements"],), "bf16", backward=backward)
    return phase_ms / (Pricer.shipped().under_load().predict(op, get_device("H200")) * 1e3)


def test_the_priced_pass_count_is_the_measured_forward(records):
    unfused = {r["shape"]: r for r in records if r["kind"] == "unfused"}
    at4 = _elementwise_passes(unfused["gpt-oss-mbs4"], unfused["gpt-oss-mbs4"]["fwd"]["median_ms"], False)
    assert round(at4) == MEGATRON_UNFUSED_ROPE_PASSES, at4
    for r in unfused.values():  # never above what either shape measured, forward or backward
        bwd_ms = r["fwd_bwd"]["median_ms"] - r["fwd"]["median_ms"]
        assert MEGATRON_UNFUSED_ROPE_PASSES <= _elementwise_passes(r, r["fwd"]["median_ms"], False) + 0.5
        assert MEGATRON_UNFUSED_ROPE_PASSES <= _elementwise_passes(r, bwd_ms, True)


def test_quick_mode_writes_the_schema_and_tables_read_it(tmp_path, rope_script):
    out = tmp_path / "r.json"
    assert rope_script.main(["--quick", "--out", str(out)]) == 0
    result = json.loads(out.read_text(encoding="utf-8"))
    assert result["schema"] == ROPE and [r["kind"] for r in result["sections"]["rope"]["records"]] == [
        "copy", "unfused", "unfused_view"]
    kept = "\n".join(rope_script.tables(str(ROOT / "costmodel" / "data" / "measured" / NAME)))
    assert "NVIDIA H200" in kept and kept.count("unfused") == 4
