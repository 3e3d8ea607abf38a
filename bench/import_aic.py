"""Copy NVIDIA AIConfigurator's streaming-kernel, NVLink NCCL and power-held GEMM timings into
``costmodel/data/published``.

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

Some of its GEMM tables were collected with ``COLLECTOR_MEASURE_POWER`` on: each shape run back to back for at least
a second (``benchmark_with_power``'s ``power_min_duration``) with the board power read meanwhile, shape after shape,
so the GPU works at its power limit as in training; the others one-shot. Each such table is matched, shape by shape
(bf16, kernel source, m >= 4096, n and k >= 2048), with the same framework's one-shot table of the nearest release:
vLLM 0.22.0 against 0.19.0 on an H200, a B200 and a GB200, TensorRT-LLM 1.3.0rc15 / rc17 against rc20 on a B200 /
GB200 (``aic_gemm_sustained.json``).

Run (needs a checkout of the repository, e.g. ``fetch github:ai-dynamo/aiconfigurator``):

    python bench/import_aic.py GIT_DIR [--commit SHA]  (writes the three files)
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
SUSTAINED_OUT = PUBLISHED / "aic_gemm_sustained.json"
# (part, framework): (the table collected under power measurement, the one-shot table it is matched with)
POWER_PAIRS = {("H200", "vllm"): ("vllm/0.22.0", "vllm/0.19.0"), ("B200", "vllm"): ("vllm/0.22.0", "vllm/0.19.0"),
               ("GB200", "vllm"): ("vllm/0.22.0", "vllm/0.19.0"),
               ("B200", "trtllm"): ("trtllm/1.3.0rc15", "trtllm/1.3.0rc20"),
               ("GB200", "trtllm"): ("trtllm/1.3.0rc17", "trtllm/1.3.0rc20")}
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
    write_sustained(args.git_dir, commit)


def write_sustained(git_dir: str, commit: str) -> None:
    """``aic_gemm_sustained.json``: per (part, framework), the bf16 GEMMs of a power-measured table matched with the
    one-shot table: ``(m, n, k, power-run ms, one-shot ms, power W, power limit W)``."""
    folders = {name: folder for folder, name in PARTS.items()}
    key = ["kernel_source", "m", "n", "k"]
    runs = []
    for (name, framework), (held, one_shot) in POWER_PAIRS.items():
        paths = [f"{DATA}/{folders[name]}/gemm/{v}/gemm_perf.parquet" for v in (held, one_shot)]
        p, q = (read_parquet(git_dir, commit, path) for path in paths)
        p, q = (t[(t.gemm_dtype == "bfloat16") & (t.m >= 4096) & (t.n >= 2048) & (t.k >= 2048)] for t in (p, q))
        j = p.merge(q[key + ["latency"]], on=key, suffixes=("_held", "_one")).sort_values(key)
        runs.append({"part": name, "framework": framework, "held_file": paths[0], "one_shot_file": paths[1],
                     "device_name": str(p.device.iloc[0]),
                     "rows": [[int(m), int(n), int(k), float(f"{a:.5g}"), float(f"{b:.5g}"), float(f"{w:.4g}"),
                               float(f"{cap:.4g}")] for m, n, k, a, b, w, cap in
                              zip(j.m, j.n, j.k, j.latency_held, j.latency_one, j.power, j.power_limit)]})
    doc = {"schema": "meshplan.published_sustained_pairs/1",
           "source": {"repository": "ai-dynamo/aiconfigurator", "commit": commit,
                      "collector": "collector/<framework>/collect_gemm.py under collector/helper.py "
                                   "benchmark_with_power (COLLECTOR_MEASURE_POWER: each shape held >= 1 s, board power "
                                   "read; otherwise 3 warm-up calls and 6 CUDA-graph replays)",
                      "license": "Apache-2.0"},
           "row_fields": ["m", "n", "k", "held_ms", "one_shot_ms", "power_w", "power_limit_w"], "runs": runs}
    SUSTAINED_OUT.write_text(json.dumps(doc, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {SUSTAINED_OUT} ({SUSTAINED_OUT.stat().st_size:,} bytes)")


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
