"""The kernels measured on an H200 and an H100 (costmodel/data/measured/nvidia-h200.json, nvidia-h100.json): schema,
shapes against the models' HF configs, and physics against each device's published peaks (costmodel/data/devices.yaml:
the NVIDIA H200 datasheet's 989.4 TFLOP/s dense bf16, 1978.9 fp8, 4.8 TB/s HBM3e; the H100 SXM's 989.4, 1978.9 and
3.35 TB/s HBM3). Every rate is recomputed from the stored FLOPs or bytes and
the median time, and every FLOP or byte count from the case's shape, so a wrong count cannot hide a rate above peak.
Also: the measuring script's --quick mode (tiny shapes on this CPU) writes the same schema."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from meshplan.costmodel.devices import get_device

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "costmodel" / "data" / "measured"
FILES = {"nvidia-h200.json": "H200", "nvidia-h100.json": "H100"}  # file -> the catalogue's device it ran on
SCRIPT = ROOT / "bench" / "gpu_kernels.py"
SECTIONS = ("gemm", "permute", "attention", "fp8cast", "memory")
TIMING_KEYS = ("median_ms", "min_ms", "max_ms", "reps", "first_call_ms")


@pytest.fixture(scope="module", params=sorted(FILES))
def measured(request) -> tuple[dict, str]:
    return json.loads((MEASURED / request.param).read_text(encoding="utf-8")), FILES[request.param]


@pytest.fixture(scope="module")
def data(measured) -> dict:
    return measured[0]


@pytest.fixture(scope="module")
def h200(measured):
    """The catalogued device the file ran on (the name kept from the first file, an H200)."""
    return get_device(measured[1])


def timings(rec: dict) -> list[dict]:
    """The timing blocks of one record (a GEMM has grouped and dense, attention fwd and bwd, others their own)."""
    blocks = [rec[k] for k in ("grouped", "dense", "fwd", "bwd") if k in rec]
    return blocks or [rec]


def check_schema(result: dict) -> None:
    assert result["schema"] == "meshplan.gpu_kernels/1"
    for key in ("date_utc", "torch", "device_type", "clocks_locked"):
        assert key in result["environment"], key
    assert set(result["sections"]) == set(SECTIONS)
    for name in SECTIONS:
        section = result["sections"][name]
        assert section["records"], name
        assert set(section["guard"]) == {"budget_s", "used_s", "cases_skipped"}
        for rec in section["records"]:
            if "error" in rec:  # the quick mode's CPU has no cuDNN attention: recorded, not raised
                continue
            for block in timings(rec):
                assert all(k in block for k in TIMING_KEYS), (name, rec)
                assert 0 < block["min_ms"] <= block["median_ms"] <= block["max_ms"], (name, rec)


def test_file_schema_and_no_failed_case(data):
    check_schema(data)
    assert data["environment"]["clocks_locked"] is False
    for name in SECTIONS:
        section = data["sections"][name]
        assert [r for r in section["records"] if "error" in r] == [], name
        assert section["guard"]["cases_skipped"] == 0, name
        assert min(b["reps"] for r in section["records"] for b in timings(r)) >= 3, name


def test_every_planned_case_is_there(data):
    plan = data["plan"]
    grid = len(plan["models"]) * len(plan["experts_local"]) * len(plan["tokens_per_expert"]) * 2  # gate_up, down
    passes = {(r["dtype"], r["pass"]) for r in data["sections"]["gemm"]["records"]}
    assert passes == {("bf16", "fwd"), ("bf16", "wgrad"), ("fp8", "fwd")}
    assert len(data["sections"]["gemm"]["records"]) == grid * len(passes)
    attn = len(plan["attention_heads"]) * len(plan["attention_backends"]) * len(plan["attention_seqs"])
    assert len(data["sections"]["attention"]["records"]) == attn
    assert len(data["sections"]["permute"]["records"]) == len(plan["models"]) * len(plan["permute_tokens"]) * 6


def test_device_is_the_catalogued_one(data, h200, measured):
    env = data["environment"]
    assert measured[1] in env["device_name"]
    assert env["sm_count"] == h200.sm_count
    assert env["memory_bytes"] <= h200.memory_bytes
    assert env["nvidia_smi"]["driver_version"]


@pytest.mark.parametrize("model", ["qwen3-30b-a3b", "deepseek-v3"])
def test_gemm_shapes_are_the_hf_configs(data, model):
    cfg = json.loads((ROOT / "planner" / "presets" / "models" / f"{model}.json").read_text(encoding="utf-8"))
    h, f = cfg["hidden_size"], cfg["moe_intermediate_size"]
    recs = [r for r in data["sections"]["gemm"]["records"] if r["model"] == model]
    assert recs
    for r in recs:
        assert (r["k"], r["n"]) == ((h, 2 * f) if r["proj"] == "gate_up" else (f, h))


def test_gemm_rates_below_the_datasheet_peak(data, h200):
    for r in data["sections"]["gemm"]["records"]:
        assert r["m_total"] == r["experts_local"] * r["tokens_per_expert"]
        assert r["flops"] == 2.0 * r["m_total"] * r["k"] * r["n"]
        peak_tflops = h200.peak_flops[r["dtype"]] / 1e12
        for block, stored in (("grouped", "grouped_tflops"), ("dense", "dense_tflops")):
            tflops = r["flops"] / (r[block]["median_ms"] * 1e-3) / 1e12
            assert math.isclose(tflops, r[stored], rel_tol=1e-9)
            assert tflops <= peak_tflops, (r["model"], r["experts_local"], r["tokens_per_expert"], r["proj"], block)


def test_attention_rates_below_the_bf16_peak(data, h200):
    peak_tflops = h200.peak_flops["bf16"] / 1e12
    for r in data["sections"]["attention"]["records"]:
        fwd = 4.0 * r["batch"] * r["seq"] ** 2 * r["q_heads"] * r["head_dim"] / 2  # causal
        assert math.isclose(r["flops_fwd"], fwd) and math.isclose(r["flops_bwd"], 2.5 * fwd)
        for p in ("fwd", "bwd"):
            tflops = r[f"flops_{p}"] / (r[p]["median_ms"] * 1e-3) / 1e12
            assert math.isclose(tflops, r[f"{p}_tflops"], rel_tol=1e-9)
            assert tflops <= peak_tflops, (r["backend"], r["seq"], p)


def unique_bytes(section: str, r: dict) -> int:
    """Bytes by the file's convention (each input read once, each output written once), from the shapes alone."""
    if section == "permute":
        if r["op"].startswith("router"):
            return r["tokens"] * r["experts"] * 4  # fp32 logits
        return r["tokens"] * r["hidden"] * 2 * (1 + r["topk"])  # T rows one way, T*k rows the other, bf16
    if section == "fp8cast":
        return r["numel"] * (2 if r["op"].startswith("amax") else 3)
    numel = math.prod(r["shape"])
    per_op = {"swiglu": 3 / 2 * 2, "residual_add": 3 / 2 * 2, "rms_norm": 2 * 2, "cross_entropy_fwd": 2,
              "cross_entropy_fwd_bwd": 2 * 2}
    return round(numel * per_op[r["op"]])


@pytest.mark.parametrize("section", ["permute", "fp8cast", "memory"])
def test_memory_bound_rates_below_hbm_bandwidth(data, h200, section):
    for r in data["sections"][section]["records"]:
        assert r["bytes"] == unique_bytes(section, r), r
        gbps = r["bytes"] / (r["median_ms"] * 1e-3) / 1e9
        assert math.isclose(gbps, r["gbps"], rel_tol=1e-9)
        assert gbps * 1e9 <= h200.mem_bw_bytes_per_s, (section, r)


def test_quick_mode_writes_the_same_schema(tmp_path):
    out = tmp_path / "quick.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--out", str(out)], capture_output=True,
                         text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr
    check_schema(json.loads(out.read_text(encoding="utf-8")))


def test_unknown_section_is_one_line_and_exit_2(tmp_path):
    run = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "x.json"), "--sections", "gemm,nope"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == ["--sections: 'nope' is not a section (known: gemm, permute, attention, "
                                               "fp8cast, memory)"]
