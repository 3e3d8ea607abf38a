"""Copy NVIDIA AIConfigurator's streaming-kernel and NVLink NCCL timings into ``costmodel/data/published``.

ai-dynamo/aiconfigurator collects kernel timings per GPU with each inference framework's own kernels
(``collector/<framework>/collect_computescale.py``, under ``helper.benchmark_with_power``: 3 warm-up calls, then 6
CUDA-graph replays of 5 back-to-back calls, one-shot). Its FP8 ``scale_matrix`` rows time a per-tensor static
quantize of an ``m x k`` bf16 tensor with a given scale: one read of 2 B and one write of 1 B an element, nothing
else, the plainest streaming kernel there is. Two frameworks' kernels are kept: TensorRT-LLM's
``torch.ops.tensorrt_llm.static_quantize_e4m3_per_tensor`` (``quantize/trtllm/1.3.0rc20``) and vLLM's
``static_scaled_fp8_quant`` (``quantize/vllm/0.24.0``); SGLang's reached under 10% of HBM bandwidth on every part, a
kernel not tuned for throughput, and is left out. Rows move at least 1 MiB.

Its ``nccl_perf`` rows (``comm/nccl/2.29.2``, ``collector/network/collect_nccl.py``: the nccl-tests binaries, fp16,
one node; ``message_size`` in elements, the nccl-tests size over 2 B) time all-gather, reduce-scatter, all-reduce
and all-to-all over NVLink: 2, 4 and 8 GPUs of an H100 and H200 node (NVLink4) and of a DGX B200 and B300, 2 and 4
of a GB200 and GB300 compute tray (NVLink5) (``aic_nccl_nvlink.json``, every size).

Run (needs a checkout of the repository, e.g. ``fetch github:ai-dynamo/aiconfigurator``):

    python bench/import_aic_streaming.py GIT_DIR [--commit SHA]  (writes both files)
"""
from __future__ import annotations

import argparse
import io
import json
import subprocess
from pathlib import Path

import pandas as pd

PUBLISHED = Path(__file__).resolve().parents[1] / "meshplan/costmodel/data/published"
OUT = PUBLISHED / "aic_streaming.json"
NCCL_OUT = PUBLISHED / "aic_nccl_nvlink.json"
NCCL = "comm/nccl/2.29.2/nccl_perf.parquet"
NVLINK_OF = {"H100-SXM": "nvlink4", "H200": "nvlink4", "B200": "nvlink5", "GB200": "nvlink5", "B300": "nvlink5",
             "GB300": "nvlink5"}  # part -> its GPU-to-GPU link family (planner/presets/clusters/links.yaml)
NCCL_KINDS = {"all_gather": "allgather", "reduce_scatter": "reducescatter", "all_reduce": "allreduce",
              "alltoall": "alltoall"}  # nccl-tests' collective -> meshplan's kind
DATA = "aic-core/src/aiconfigurator_core/systems/data"
# AIConfigurator's system folder -> meshplan's catalogue name (the rows' device column names the card)
PARTS = {"h100_sxm": "H100-SXM", "h200_sxm": "H200", "b200_sxm": "B200", "gb200": "GB200", "b300_sxm": "B300",
         "gb300": "GB300"}
KERNELS = {"trtllm": ("quantize/trtllm/1.3.0rc20", "torch.ops.tensorrt_llm.static_quantize_e4m3_per_tensor"),
           "vllm": ("quantize/vllm/0.24.0", "vllm static_scaled_fp8_quant")}
BYTES_PER_ELEMENT = 3  # bf16 read, fp8 written
MIN_BYTES = 1 << 20


def read_parquet(git_dir: str, commit: str, path: str) -> pd.DataFrame:
    blob = subprocess.run(["git", "--git-dir", git_dir, "show", f"{commit}:{path}"], check=True,
                          capture_output=True).stdout
    return pd.read_parquet(io.BytesIO(blob))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("git_dir")
    ap.add_argument("--commit", default="HEAD")
    args = ap.parse_args()
    commit = subprocess.run(["git", "--git-dir", args.git_dir, "rev-parse", args.commit], check=True,
                            capture_output=True, text=True).stdout.strip()
    parts = {}
    for folder, name in PARTS.items():
        kernels = {}
        for key, (sub, kernel) in KERNELS.items():
            t = read_parquet(args.git_dir, commit, f"{DATA}/{folder}/{sub}/scale_matrix_perf.parquet")
            t = t[t.m * t.k * BYTES_PER_ELEMENT >= MIN_BYTES].sort_values(["m", "k"])
            kernels[key] = {"kernel": kernel, "file": f"{DATA}/{folder}/{sub}/scale_matrix_perf.parquet",
                            "device_name": str(t.device.iloc[0]),
                            "rows": [[int(m), int(k), float(f"{lat:.5g}")]
                                     for m, k, lat in zip(t.m, t.k, t.latency)]}
        parts[name] = kernels
    doc = {"schema": "meshplan.published_streaming/1",
           "source": {"repository": "ai-dynamo/aiconfigurator", "commit": commit,
                      "collector": "collector/trtllm/collect_computescale.py, collector/vllm/collect_computescale.py",
                      "timing": "helper.benchmark_with_power: 3 warm-up calls, 6 CUDA-graph replays of 5 calls on "
                                "one input; latency per call, ms",
                      "license": "Apache-2.0"},
           "bytes_per_element": BYTES_PER_ELEMENT, "row_fields": ["m", "k", "latency_ms"], "parts": parts}
    OUT.write_text(json.dumps(doc, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {OUT} ({OUT.stat().st_size:,} bytes)")
    write_nccl(args.git_dir, commit)


def write_nccl(git_dir: str, commit: str) -> None:
    """``aic_nccl_nvlink.json``: per part, its link family and the ``(kind, ranks, bytes, latency_ms)`` rows of its
    fp16 table."""
    folders = {name: folder for folder, name in PARTS.items()}
    parts = {}
    for name, link in NVLINK_OF.items():
        t = read_parquet(git_dir, commit, f"{DATA}/{folders[name]}/{NCCL}")
        t = t[t.nccl_dtype == "half"].sort_values(["op_name", "num_gpus", "message_size"])
        parts[name] = {"link": link, "file": f"{DATA}/{folders[name]}/{NCCL}", "device_name": str(t.device.iloc[0]),
                       "rows": [[NCCL_KINDS[op], int(p), int(m) * 2, float(f"{lat:.5g}")]
                                for op, p, m, lat in zip(t.op_name, t.num_gpus, t.message_size, t.latency)]}
    doc = {"schema": "meshplan.published_nccl/1",
           "source": {"repository": "ai-dynamo/aiconfigurator", "commit": commit,
                      "collector": "collector/network/collect_nccl.py (nccl-tests all_gather_perf, "
                                   "reduce_scatter_perf, all_reduce_perf, alltoall_perf; NCCL 2.29.2; fp16)",
                      "timing": "nccl-tests' out-of-place time; latency ms; bytes = message_size x 2 (the "
                                "nccl-tests size column)",
                      "license": "Apache-2.0"},
           "row_fields": ["kind", "ranks", "bytes", "latency_ms"], "parts": parts}
    NCCL_OUT.write_text(json.dumps(doc, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {NCCL_OUT} ({NCCL_OUT.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
