"""Per-document attention over packed sequences and the host's time per op, measured on an H200 and an H100
(costmodel/data/measured/nvidia-h{200,100}-varlen.json, bench/gpu_varlen.py; the measured README's sections). Each
file's FLOP counts are recomputed from each case's shape, every rate from the stored time, and each against its
device's published dense bf16 peak (costmodel/data/devices.yaml: 989.4 TFLOP/s on both); the measuring script's
--quick mode runs its code paths here and writes the same schema."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshplan.costmodel.devices import get_device
from meshplan.costmodel.measured import VARLEN, measured_files
from tests.helpers import load_gpu_script

ROOT = Path(__file__).resolve().parents[1]
# file -> (the device name it recorded, the catalogue's device)
FILES = {"nvidia-h200-varlen.json": ("NVIDIA H200", "H200"),
         "nvidia-h100-varlen.json": ("NVIDIA H100 80GB HBM3", "H100")}
KINDS = {"varlen_flash", "varlen_cudnn", "batched_flash", "batched_cudnn"}


@pytest.fixture(scope="module")
def varlen_script():
    """bench/gpu_varlen.py loaded in this process (it imports bench/gpu_kernels.py beside it, as on the GPU)."""
    return load_gpu_script("gpu_varlen")


@pytest.fixture(scope="module", params=sorted(FILES))
def measured(request) -> tuple[dict, str, str]:
    return (measured_files(VARLEN)[request.param], *FILES[request.param])


@pytest.fixture(scope="module")
def data(measured) -> dict:
    return measured[0]


def records(data: dict) -> list[dict]:
    return data["sections"]["varlen"]["records"]


def test_the_file_names_its_device_and_covers_the_grid(measured):
    data, device_name, _ = measured
    env = data["environment"]
    assert env["device_name"] == device_name and env["device_type"] == "cuda"
    plan = data["plan"]
    want = {(h[0], doc, kind) for h in plan["heads"] for doc in plan["docs"] for kind in KINDS}
    got = {(r["heads"], r["doc"], r["kind"]) for r in records(data) if "error" not in r}
    assert got == want
    assert data["sections"]["varlen"]["guard"]["cases_skipped"] == 0


def test_flops_follow_from_each_shape(data):
    """Causal attention inside each document: tokens / L documents of 4 L^2 hq d / 2 forward FLOPs; at L = pack the
    same count as bench/gpu_kernels.py's whole-sequence attention of the pack."""
    for r in records(data):
        docs = r["tokens"] // r["doc"]
        assert r["tokens"] % r["doc"] == 0
        assert r["flops_fwd"] == docs * 4 * r["doc"] ** 2 * r["q_heads"] * r["head_dim"] / 2
        assert r["flops_bwd"] == 2.5 * r["flops_fwd"]
    whole = next(r for r in records(data) if r["doc"] == r["pack"])
    packs = whole["tokens"] // whole["pack"]
    assert whole["flops_fwd"] == packs * 4 * whole["pack"] ** 2 * whole["q_heads"] * whole["head_dim"] / 2


def test_every_rate_is_below_the_device_peak(measured):
    data, _, device = measured
    peak_tflops = get_device(device).peak_flops["bf16"] / 1e12
    for r in records(data):
        for phase in ("fwd", "bwd"):
            for key in (phase, f"{phase}_kernel_ms"):
                ms = (r.get(key) or {}).get("median_ms")
                if ms is None:
                    continue
                tflops = r[f"flops_{phase}"] / (ms * 1e-3) / 1e12
                assert 0 < tflops < peak_tflops, (r["kind"], r["heads"], r["doc"], key, tflops)
            if phase in r and "median_ms" in r[phase]:
                stored = r[f"{phase}_tflops"]
                assert stored == pytest.approx(r[f"flops_{phase}"] / (r[phase]["median_ms"] * 1e-3) / 1e12)


def test_cudnn_varlen_event_time_is_host_planning_not_kernels(data):
    """The reason the README reads the profiler's kernel time for varlen_cudnn: its CUDA-event time barely moves
    with L while its kernels' time grows with the work, and at every L the event time dwarfs the kernels'."""
    for heads in dict.fromkeys(r["heads"] for r in records(data)):
        rows = sorted((r for r in records(data) if r["heads"] == heads and r["kind"] == "varlen_cudnn"),
                      key=lambda r: r["doc"])
        kernel = [r["fwd_kernel_ms"]["median_ms"] for r in rows]
        event = [r["fwd"]["median_ms"] for r in rows]
        assert all(e > 10 * k for e, k in zip(event, kernel)), heads
        assert kernel[-1] > 2 * kernel[0], heads


def test_host_section_names_its_cpu(data):
    host = data["sections"]["host"]
    assert host["cpu_model"] and host["machine"] == "x86_64"
    assert host["linear_shape"] == [8192, 2048]  # TransformerEngine issue 2053's shape
    assert set(host["records"]) == {"nn_linear_fwd", "nn_linear_fwd_autograd", "add_16", "empty_1mib", "split_8"}


def test_quick_mode_writes_the_schema(tmp_path, varlen_script):
    out = tmp_path / "v.json"
    assert varlen_script.main(["--quick", "--out", str(out)]) == 0
    result = json.loads(out.read_text(encoding="utf-8"))
    assert result["schema"] == VARLEN
    assert set(result["sections"]) == {"varlen", "host"}
    batched = [r for r in result["sections"]["varlen"]["records"] if r["kind"] == "batched_flash"]
    assert batched and all("fwd" in r and "bwd" in r for r in batched)  # the CPU runs SDPA; varlen needs CUDA
    assert set(result["sections"]["host"]["records"]) == {"nn_linear_fwd", "nn_linear_fwd_autograd", "add_16",
                                                         "empty_1mib", "split_8"}


@pytest.mark.parametrize("name", sorted(FILES))
def test_tables_print_each_share(name, varlen_script):
    out = "\n".join(varlen_script.tables(str(ROOT / "costmodel" / "data" / "measured" / name)))
    assert FILES[name][0] in out
    assert out.count("100% (100%)") == 16  # one whole-pack cell per head shape and kind
