"""NeuSight kernel latencies (sitar-lab/NeuSight, MIT; data/kernels/neusight/README.md).

fp32 (no TF32) CUDA-event timings in **milliseconds** on P4, P100, T4, V100, A100-40GB (train split, small
shapes) and larger shapes plus A100-80GB, L4, H100 (test split). NeuSight's ``N`` is the contraction dim:
``bmm(A[B,M,N], W[B,N,K])``; ``linear`` is ``nn.Linear(N, K)`` on ``x[B,M,N]``. Remapped here to meshplan's
matmul ``(m, n, k)`` with ``k`` the contraction.
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
    table_files,
    to_float,
)
from meshplan.costmodel.features import flops_bytes

# NeuSight vector-op name -> meshplan kind. Tensor-scalar ops (``addu`` = x + c) read one tensor and write
# one, like an activation, so they share the unary class; ``add`` etc. read two tensors.
VECTOR_KIND = {
    "add": "elementwise", "mul": "elementwise", "pow": "elementwise", "div": "elementwise",
    "addu": "activation", "mulu": "activation", "powu": "activation", "divu": "activation",
    "relu": "activation", "gelu": "activation", "tanh": "activation",
    "ln": "layernorm", "softmax": "softmax",
}


def is_dataset(root: Path) -> bool:
    return (root / "train").is_dir() and (root / "test").is_dir()


def _files(root: Path) -> list[tuple[Path, str]]:
    out = [(f, "neusight/train") for f in table_files(root / "train", "*/*.csv")]
    out += [(f, "neusight/train") for f in table_files(root / "train", "*.csv")]
    out += [(f, "neusight/test") for f in table_files(root / "test", "*.csv")]
    return out


def load_file(path: Path, source: str) -> KernelTable:
    """One NeuSight CSV (GEMM or vector op) -> KernelTable.

    Raises:
        MeshplanError: missing column, non-numeric cell, unknown op name, or a latency unit mismatch.
    """
    head = read_csv(path, ("OPName", "Latency", "Device", "B"))
    gemm = "M" in head
    cols = read_csv(path, ("OPName", "Latency", "Device", "B", "M", "N", "K") if gemm else ("OPName", "Latency",
                                                                                            "Device", "B", "H"))
    lat_s = to_float(path, "Latency", cols["Latency"]) * 1e-3  # NeuSight Latency is ms (collect.py)
    check_latency_units(path, "Latency", lat_s, *MEDIAN_LATENCY_BAND_S)
    names = np.array(cols["OPName"], dtype=object)
    B = to_float(path, "B", cols["B"])
    n_rows = len(lat_s)
    if gemm:
        M, N, K = (to_float(path, c, cols[c]) for c in ("M", "N", "K"))
        is_bmm = names == "bmm"
        if not np.all(is_bmm | (names == "linear")):
            raise MeshplanError(f"{path}: column 'OPName' has ops other than bmm/linear: {sorted(set(names))[:5]}")
        op = np.where(is_bmm, "bmm", "matmul").astype(object)
        b = np.where(is_bmm, B, 1.0)
        m = np.where(is_bmm, M, B * M)
        n_out, k_con = K, N  # NeuSight N is the contraction dim
    else:
        H = to_float(path, "H", cols["H"])
        unknown = sorted(set(names) - set(VECTOR_KIND))
        if unknown:
            raise MeshplanError(f"{path}: column 'OPName' has unknown op '{unknown[0]}'")
        op = np.array([VECTOR_KIND[x] for x in names], dtype=object)
        rowwise = np.isin(op, ("layernorm", "softmax"))
        b = np.ones(n_rows)
        m = np.where(rowwise, B, B * H)
        n_out = np.where(rowwise, H, 1.0)
        k_con = np.ones(n_rows)
    devices = np.array([canonical(d) for d in cols["Device"]], dtype=object)
    flops, nbytes = flops_bytes(op, b, m, n_out, k_con, np.full(n_rows, "fp32", dtype=object))
    return KernelTable.from_columns(
        n_rows, device=devices, op=op, variant=names, dtype="fp32", source=source,
        b=b, m=m, n=n_out, k=k_con, flops=flops, bytes=nbytes, latency_s=lat_s,
    )


def load(root: Path, collectives: bool = True) -> tuple[KernelTable, list[str]]:
    """All NeuSight kernel CSVs under ``root`` (train and test splits, tagged in ``source``)."""
    files = _files(root)
    return KernelTable.concat([load_file(f, s) for f, s in files]), [str(f) for f, _ in files]
