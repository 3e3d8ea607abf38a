"""The one normalised latency table every dataset loader produces (numpy columns, no pandas).

Columns (one numpy array each, all the same length):
    device:     canonical device name (``get_device`` name, a dataset device the catalogue lacks keeps its own
                name and is resolved later by ``costmodel.datasets.devices.resolve``), or a network name for
                collectives (``a100_dgx``).
    op:         ``OpSpec`` kind (``matmul``, ``bmm``, ``layernorm``, ..., ``allreduce``, ``sendrecv``).
    variant:    the dataset's own op name (``gelu``, ``addu``, ``mlp_up_proj``) for reporting.
    b, m, n, k: shape fields in meshplan's convention (``costmodel.ops``): matmul C[m,n] = A[m,k] B[k,n] with
                k the contraction; bmm adds the batch b; rows x cols ops use m=rows, n=cols; numel ops m=numel;
                collectives m=payload bytes. Unused fields are 1.
    dtype:      ``fp32``, ``fp16``, ``bf16`` ...
    group_size, nodes: collectives only (participants, nodes they span); 1 for compute.
    flops:      FLOPs of the op (multiply-add = 2).
    bytes:      compulsory bytes moved (compute) or payload bytes (collectives).
    latency_s:  measured latency, **seconds** (loaders convert ms / us).
    noise:      relative spread of the measurement (std/median or IQR/median) when the dataset has it, else NaN.
    trans:      GEMM operand layout where the dataset records it (cuBLAS ``op(A)``/``op(B)``): 0 NN, 1 NT, 2 TN,
                3 TT; NaN when unknown (every source but DeepBench).
    source:     ``neusight/train``, ``vidur/a100``, ``deepbench``, ``local`` ...
"""
from __future__ import annotations

import csv
import gzip
import lzma
from dataclasses import dataclass, fields
from io import StringIO
from pathlib import Path
from typing import IO

import numpy as np

from meshplan.core.atomic import write_atomic
from meshplan.core.errors import MeshplanError

# Plausible median single-op GPU/CPU latency, seconds. A median outside this band means the file's unit is
# not the one the loader assumes (e.g. microseconds read as milliseconds gives a 1000x larger median).
MEDIAN_LATENCY_BAND_S = (2e-6, 0.1)
# A table may be stored compressed beside its name (``gemm.csv.xz`` for ``gemm.csv``: the repository's data/ holds
# the large kernel tables so); every reader below opens whichever is there.
COMPRESSED = {".xz": lzma.open, ".gz": gzip.open}

STR_COLS = ("device", "op", "variant", "dtype", "source")
NUM_COLS = ("b", "m", "n", "k", "group_size", "nodes", "flops", "bytes", "latency_s", "noise", "trans")


@dataclass
class KernelTable:
    """Columnar latency table; see the module docstring for the columns and units."""

    device: np.ndarray
    op: np.ndarray
    variant: np.ndarray
    dtype: np.ndarray
    source: np.ndarray
    b: np.ndarray
    m: np.ndarray
    n: np.ndarray
    k: np.ndarray
    group_size: np.ndarray
    nodes: np.ndarray
    flops: np.ndarray
    bytes: np.ndarray
    latency_s: np.ndarray
    noise: np.ndarray
    trans: np.ndarray

    def __len__(self) -> int:
        return len(self.latency_s)

    @classmethod
    def from_columns(cls, n_rows: int, **cols) -> "KernelTable":
        """Build a table; missing numeric columns default to 1 (shape/group) or NaN (noise, trans)."""
        out = {}
        for name in STR_COLS:
            v = cols.get(name, "")
            out[name] = np.asarray(v, dtype=object) if np.ndim(v) else np.full(n_rows, v, dtype=object)
        for name in NUM_COLS:
            default = np.nan if name in ("noise", "trans") else 1.0
            v = cols.get(name, default)
            arr = np.asarray(v, dtype=np.float64)
            out[name] = arr if arr.ndim else np.full(n_rows, float(arr))
        for name, arr in out.items():
            if len(arr) != n_rows:
                raise ValueError(f"column {name} has {len(arr)} rows, expected {n_rows}")
        return cls(**out)

    @classmethod
    def empty(cls) -> "KernelTable":
        return cls.from_columns(0)

    def select(self, mask: np.ndarray) -> "KernelTable":
        """Rows where ``mask`` is true (boolean array or index array)."""
        return KernelTable(**{f.name: getattr(self, f.name)[mask] for f in fields(self)})

    @staticmethod
    def concat(tables: list["KernelTable"]) -> "KernelTable":
        tables = [t for t in tables if len(t)]
        if not tables:
            return KernelTable.empty()
        return KernelTable(**{f.name: np.concatenate([getattr(t, f.name) for t in tables])
                              for f in fields(KernelTable)})

    def write_csv(self, path: Path) -> None:
        """Write the table as CSV (atomically)."""
        buf = StringIO()
        w = csv.writer(buf)
        names = [f.name for f in fields(self)]
        w.writerow(names)
        cols = [getattr(self, n) for n in names]
        for i in range(len(self)):
            w.writerow([c[i] for c in cols])
        write_atomic(path, buf.getvalue())


def table_file(path: Path) -> Path | None:
    """The file that holds the table named ``path``: ``path`` itself, else ``path.xz`` or ``path.gz``; None if none."""
    path = Path(path)
    if path.is_file():
        return path
    return next((p for p in (path.with_name(path.name + s) for s in COMPRESSED) if p.is_file()), None)


def table_name(path: Path) -> Path:
    """The table's own name: ``path`` without a compression suffix (``gemm.csv.xz`` -> ``gemm.csv``)."""
    path = Path(path)
    return path.with_suffix("") if path.suffix in COMPRESSED else path


def table_files(folder: Path, pattern: str) -> list[Path]:
    """Files under ``folder`` holding the tables that match ``pattern`` (plain or compressed), in the order of
    their own names, so a compressed copy loads its rows in the same order as the plain one."""
    found = {table_name(p): p for s in ("", *COMPRESSED) for p in Path(folder).glob(pattern + s) if p.is_file()}
    return [found[name] for name in sorted(found)]


def open_table(path: Path) -> IO[str]:
    """Text handle on the table named ``path`` (decompressed as its suffix says).

    Raises:
        MeshplanError: no file holds it.
    """
    found = table_file(path)
    if found is None:
        raise MeshplanError(f"{path}: dataset file not found")
    opener = COMPRESSED.get(found.suffix)
    if opener is None:
        return open(found, newline="", encoding="utf-8")
    return opener(found, "rt", newline="", encoding="utf-8")


def table_bytes(path: Path) -> bytes:
    """The table's content (decompressed), e.g. for the sha256 a model records of its training data."""
    found = table_file(path)
    if found is None:
        raise MeshplanError(f"{path}: dataset file not found")
    opener = COMPRESSED.get(found.suffix)
    if opener is None:
        return found.read_bytes()
    with opener(found, "rb") as fh:
        return fh.read()


def read_csv(path: Path, required: tuple[str, ...]) -> dict[str, list[str]]:
    """Read a CSV into ``{column: [str values]}``, checking that every ``required`` column is present.

    Raises:
        MeshplanError: the file is missing, empty or lacks a required column (names file and column).
    """
    path = Path(path)
    try:
        with open_table(path) as fh:
            reader = csv.reader(fh)
            try:
                header = next(reader)
            except StopIteration:
                raise MeshplanError(f"{path}: empty file, expected columns {', '.join(required)}") from None
            rows = list(reader)
    except (lzma.LZMAError, gzip.BadGzipFile, EOFError, UnicodeDecodeError) as exc:
        raise MeshplanError(f"{path}: not a readable table ({type(exc).__name__}: {exc})") from None
    missing = [c for c in required if c not in header]
    if missing:
        raise MeshplanError(f"{path}: missing column '{missing[0]}' (has: {', '.join(header[:12])})")
    idx = {c: header.index(c) for c in header}
    return {c: [r[i] if i < len(r) else "" for r in rows] for c, i in idx.items()}


def to_float(path: Path, col: str, values: list[str]) -> np.ndarray:
    """Column of numbers; a non-numeric cell is a MeshplanError naming file, column and row."""
    try:
        return np.array([float(v) if v != "" else np.nan for v in values], dtype=np.float64)
    except ValueError:
        bad = next(i for i, v in enumerate(values) if not _is_float(v))
        raise MeshplanError(f"{path}: column '{col}' row {bad + 2} is not a number: {values[bad]!r}") from None


def _is_float(v: str) -> bool:
    try:
        float(v)
        return True
    except ValueError:
        return v == ""


def check_latency_units(path: Path, col: str, latency_s: np.ndarray, lo_s: float, hi_s: float) -> None:
    """Guard against a unit mix-up (ms read as s, us read as ms): the median must lie in ``[lo_s, hi_s]``.

    Raises:
        MeshplanError: naming the file, the column and the median found.
    """
    ok = latency_s[np.isfinite(latency_s)]
    if len(ok) == 0:
        raise MeshplanError(f"{path}: column '{col}' has no numeric latencies")
    if (ok <= 0).any():
        raise MeshplanError(f"{path}: column '{col}' has non-positive latencies (min {ok.min():g})")
    med = float(np.median(ok))
    if not lo_s <= med <= hi_s:
        raise MeshplanError(
            f"{path}: column '{col}' unit mismatch: median {med:g} s after conversion, expected {lo_s:g}-{hi_s:g} s"
        )
