"""This machine's measurements written by ``meshplan costmodel collect`` (``local.csv`` + ``device.json``).

``local.csv`` columns: device, op, variant, b, m, n, k, dtype, latency_s (**seconds**, median of the repeats),
noise (relative spread of the repeats). ``device.json`` holds the measured device vector (peak FLOP/s per
dtype from the largest GEMM, bandwidth from a large copy) so an unseen CPU can be featurised like a GPU.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from meshplan.core.errors import MeshplanError
from meshplan.costmodel.datasets.table import KernelTable, check_latency_units, read_csv, to_float
from meshplan.costmodel.devices import DeviceSpec
from meshplan.costmodel.features import flops_bytes

COLUMNS = ("device", "op", "variant", "b", "m", "n", "k", "dtype", "latency_s", "noise")
# CPU single-op medians: tens of microseconds to tens of milliseconds on this grid.
LOCAL_MEDIAN_BAND_S = (1e-7, 1.0)


def is_dataset(root: Path) -> bool:
    return (root / "local.csv").is_file()


def load_device(path: Path) -> DeviceSpec:
    """Read ``device.json``: the measured device the rows of its folder were timed on (in no catalogue).

    Raises:
        MeshplanError: missing file or field.
    """
    if not path.is_file():
        raise MeshplanError(f"{path}: device file not found (written by `meshplan costmodel collect`)")
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
        dev = DeviceSpec(name=d["name"], vendor=d.get("vendor", "cpu"),
                         peak_flops={k: float(v) for k, v in d["peak_flops"].items()},
                         memory_bytes=int(d["memory_bytes"]), mem_bw_bytes_per_s=float(d["mem_bw_bytes_per_s"]),
                         sm_count=int(d["sm_count"]), l2_bytes=int(d["l2_bytes"]), clock_hz=float(d["clock_hz"]),
                         launch_s=float(d.get("launch_s", 0.0)),
                         sources={"all": d.get("source", "measured by meshplan costmodel collect")})
    except (KeyError, ValueError, TypeError, json.JSONDecodeError) as exc:
        raise MeshplanError(f"{path}: bad device file ({type(exc).__name__}: {exc})") from None
    return dev


def load(root: Path, collectives: bool = True) -> tuple[KernelTable, list[str], DeviceSpec]:
    """``local.csv`` and ``device.json`` in ``root``: the rows, the files read and the measured device."""
    root = Path(root)
    dev = load_device(root / "device.json")
    path = root / "local.csv"
    cols = read_csv(path, COLUMNS)
    lat_s = to_float(path, "latency_s", cols["latency_s"])
    check_latency_units(path, "latency_s", lat_s, *LOCAL_MEDIAN_BAND_S)
    op = np.array(cols["op"], dtype=object)
    dtype = np.array(cols["dtype"], dtype=object)
    b, m, n, k = (to_float(path, c, cols[c]) for c in ("b", "m", "n", "k"))
    flops, nbytes = flops_bytes(op, b, m, n, k, dtype)
    t = KernelTable.from_columns(len(lat_s), device=np.array(cols["device"], dtype=object), op=op,
                                 variant=np.array(cols["variant"], dtype=object), dtype=dtype, source="local",
                                 b=b, m=m, n=n, k=k, flops=flops, bytes=nbytes, latency_s=lat_s,
                                 noise=to_float(path, "noise", cols["noise"]))
    return t, [str(path), str(root / "device.json")], dev
