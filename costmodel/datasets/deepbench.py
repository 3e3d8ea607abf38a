"""DeepBench results (baidu-research/DeepBench, Apache-2.0; data/kernels/deepbench/README.md).

``tidy/gemm.csv``: one cuBLAS GEMM ``C[M,N] = op(A)[M,K] op(B)[K,N]`` per row, ``time_ms`` in
**milliseconds**; the unit is verified against the file's own ``tflops_reported`` (= 2MNK / time).
``tidy/allreduce.csv``: all-reduce of ``size_floats`` fp32 values, ``mean_ms``. Conv rows are not loaded
(meshplan has no conv OpSpec kind); int8, pseudo-fp16 (fp32 math) and phone rows are skipped.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from meshplan.core.errors import MeshplanError
from meshplan.costmodel.datasets.devices import canonical
from meshplan.costmodel.datasets.table import (
    MEDIAN_LATENCY_BAND_S,
    KernelTable,
    check_latency_units,
    read_csv,
    table_file,
    to_float,
)
from meshplan.costmodel.features import flops_bytes

PRECISION = {"fp32": "fp32", "fp16_in_fp16_mul_fp32_acc": "fp16"}


def is_dataset(root: Path) -> bool:
    return table_file(root / "tidy" / "gemm.csv") is not None


def load_gemm(path: Path) -> KernelTable:
    """GEMM rows for fp32 and tensor-core fp16 on NVIDIA GPUs.

    Raises:
        MeshplanError: missing column, or ``time_ms`` inconsistent with ``tflops_reported`` (unit mismatch).
    """
    cols = read_csv(path, ("device", "precision", "M", "N", "K", "time_ms", "tflops_reported"))
    keep = np.array([p in PRECISION and d.startswith("NV_") for p, d in zip(cols["precision"], cols["device"])])
    M, N, K = (to_float(path, c, cols[c])[keep] for c in ("M", "N", "K"))
    t_ms = to_float(path, "time_ms", cols["time_ms"])[keep]
    tflops = to_float(path, "tflops_reported", cols["tflops_reported"])[keep]
    ok = np.isfinite(t_ms) & np.isfinite(tflops) & (t_ms > 0)
    ratio = (2 * M * N * K / (t_ms * 1e-3) / 1e12)[ok] / tflops[ok]
    if len(ratio) and abs(float(np.median(ratio)) - 1.0) > 0.05:
        raise MeshplanError(
            f"{path}: column 'time_ms' unit mismatch: 2MNK/time disagrees with tflops_reported "
            f"by {float(np.median(ratio)):.3g}x (expected milliseconds)")
    lat_s = t_ms[ok] * 1e-3
    check_latency_units(path, "time_ms", lat_s, *MEDIAN_LATENCY_BAND_S)
    dtype = np.array([PRECISION[p] for p in np.array(cols["precision"])[keep][ok]], dtype=object)
    dev = np.array([canonical(d) for d in np.array(cols["device"])[keep][ok]], dtype=object)
    # Operand layout: NN and TN of one (M, N, K) differ up to 3-4x on these cuBLAS versions (bench/lodo_floor.py).
    ta, tb = (np.array([v == "T" for v in cols[c]])[keep][ok] if c in cols else np.zeros(len(lat_s), dtype=bool)
              for c in ("a_trans", "b_trans"))
    rows = len(lat_s)
    op = np.full(rows, "matmul", dtype=object)
    b = np.ones(rows)
    flops, nbytes = flops_bytes(op, b, M[ok], N[ok], K[ok], dtype)
    return KernelTable.from_columns(rows, device=dev, op=op, variant="gemm", dtype=dtype, source="deepbench",
                                    b=b, m=M[ok], n=N[ok], k=K[ok], flops=flops, bytes=nbytes, latency_s=lat_s,
                                    trans=2.0 * ta + tb)


def load_allreduce(path: Path) -> KernelTable:
    """All-reduce rows (NVIDIA, NCCL algorithms only): bytes = 4 * size_floats."""
    cols = read_csv(path, ("device", "size_floats", "n_nodes", "n_cards", "mean_ms", "algorithm"))
    keep = np.array([d.startswith("NV_") and "NCCL" in a for d, a in zip(cols["device"], cols["algorithm"])])
    size = to_float(path, "size_floats", cols["size_floats"])[keep] * 4.0
    lat_s = to_float(path, "mean_ms", cols["mean_ms"])[keep] * 1e-3
    cards = to_float(path, "n_cards", cols["n_cards"])[keep]
    nodes = to_float(path, "n_nodes", cols["n_nodes"])[keep]
    p = np.where(np.isfinite(cards), cards, nodes)
    dev = np.array([canonical(d) for d in np.array(cols["device"])[keep]], dtype=object)
    # "MPI" runs span nodes with 8 cards each where p > 8 (DeepBench README); single-process runs are one node.
    n_nodes = np.maximum(1.0, np.ceil(p / 8.0))
    return KernelTable.from_columns(len(lat_s), device=dev, op="allreduce", variant="allreduce", dtype="fp32",
                                    source="deepbench/allreduce", m=size, group_size=p, nodes=n_nodes,
                                    flops=0.0, bytes=size, latency_s=lat_s)


def load(root: Path, collectives: bool = True) -> tuple[KernelTable, list[str]]:
    files = [table_file(root / "tidy" / "gemm.csv")]
    tables = [load_gemm(files[0])]
    allreduce = table_file(root / "tidy" / "allreduce.csv")
    if collectives and allreduce is not None:
        files.append(allreduce)
        tables.append(load_allreduce(allreduce))
    return KernelTable.concat(tables), [str(f) for f in files]
