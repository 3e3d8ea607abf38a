"""Calibration of this host for ``local:N`` clusters (N CPU processes on one machine, gloo over loopback).

Measures, in about 10-20 s (``planner.host.measure``: GEMM, memory bandwidth, gloo alpha-beta;
``planner.host.gloo_in_step``: gloo collectives as a step issues them, time-slicing), and caches the result as JSON
in the host cache folder (``core.cache.cache_dir``: ``~/.cache/meshplan``, ``MESHPLAN_CACHE`` overrides). Nothing
here runs when a cluster is parsed: the CLI obtains the calibration (``calibration_for``, measuring only when the
cache is absent or stale) and passes it to ``planner.cluster.spec.load_cluster``.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from meshplan.core.atomic import write_atomic
from meshplan.core.cache import cache_dir
from meshplan.core.errors import MeshplanError
from meshplan.costmodel.collectives import Link
from meshplan.costmodel.devices import DeviceSpec, catalogue, device_from_dict, device_to_dict, get_device
from meshplan.planner.host.cpu_bench import HostBench
from meshplan.planner.host.gloo_in_step import STEP_GROUPS, measure_gloo_in_step, measure_time_slicing
from meshplan.planner.host.measure import (
    COPY_BYTES,
    GEMM_N,
    clock_hz,
    llc_bytes,
    measure_copy_bandwidth,
    measure_gemm_flops,
    measure_link,
    ram_bytes,
)

CACHE_VERSION = 7  # 2: peak figures from the fastest block, not the median; 3: gloo collectives in a step;
# 4: groups inside an oversubscribed world (``in_world_key``); 5: back-to-back all-reduce bursts;
# 6: median of 3 launches; 7: sizes round-robin, 100 calls per size on own cores
DEVICE_NAME = "cpu-local"


@dataclass(frozen=True)
class Calibration:
    """One host calibration.

    Attributes:
        device: The ``cpu-local`` device (peak_flops = measured 1-thread GEMM FLOP/s; memory = host RAM, bytes).
        link: gloo loopback all-reduce link (bytes/s per rank, latency s).
        measured: Raw measurements (seconds, bytes) and the 8 MiB check of the alpha-beta fit.
        path: Cache file it was read from or written to.
        cached: True when read from the cache, False when just measured.
    """

    device: DeviceSpec
    link: Link
    measured: dict
    path: Path
    cached: bool


def host_fingerprint() -> dict:
    """What a calibration is valid for: host, machine, CPU count, torch version."""
    import torch

    return {"host": platform.node(), "machine": platform.machine(), "cpu_count": os.cpu_count() or 1,
            "torch": torch.__version__.split("+")[0]}


def cache_path() -> Path:
    """The calibration file in the host cache folder."""
    return cache_dir() / "calibration-cpu.json"


CALIBRATION_STEPS = ("gemm fp32", "gemm bf16", "memory bandwidth", "gloo all-reduce (2 processes)",
                     "gloo collectives in a step (2 and 4 processes, groups of 2 among 4)",
                     "time-slicing (4 processes)")


def calibrate(progress: Optional[Callable[[str], None]] = None, quick: bool = False) -> Calibration:
    """Measure this host now and write the cache atomically. ``progress`` is called before each step
    (``CALIBRATION_STEPS``). ``quick``: fewer in-step gloo calls and one launch per table (34 s instead of 121 s on
    a 2-core host, noisier; ``planner.host.gloo_in_step.QUICK``); the record says so."""
    import torch

    step = progress or (lambda _s: None)
    t0 = time.perf_counter()
    step("gemm fp32")
    fp32 = measure_gemm_flops("fp32")
    step("gemm bf16")
    bf16 = measure_gemm_flops("bf16")
    step("memory bandwidth")
    mem_bw = measure_copy_bandwidth()
    step("gloo all-reduce (2 processes)")
    link, check, times = measure_link()
    step("gloo collectives in a step (2 and 4 processes, groups of 2 among 4)")
    in_step = measure_gloo_in_step(quick)
    step("time-slicing (4 processes)")
    slicing = measure_time_slicing(max(STEP_GROUPS))
    llc, llc_src = llc_bytes()
    clock, clock_src = clock_hz()
    when = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    measured = f"measured by meshplan devices calibrate on {when}"
    dev = DeviceSpec(
        name=DEVICE_NAME, vendor="cpu",
        peak_flops={"fp32": fp32, "bf16": bf16},
        memory_bytes=ram_bytes(), mem_bw_bytes_per_s=mem_bw, sm_count=os.cpu_count() or 1,
        l2_bytes=llc, clock_hz=clock, family="local", aliases=("local", "cpu"),
        sources={"peak_flops": f"{measured}: torch.mm {GEMM_N}x{GEMM_N}, 1 thread, torch.utils.benchmark fastest "
                               "block (contention only slows)",
                 "memory_bytes": "os.sysconf SC_PHYS_PAGES x SC_PAGE_SIZE (host RAM)",
                 "mem_bw": f"{measured}: 1-thread copy of {COPY_BYTES >> 20} MiB (2x bytes moved)",
                 "sm_count": "os.cpu_count() (logical CPUs)", "l2_bytes": llc_src, "clock_hz": clock_src},
    )
    record = {"version": CACHE_VERSION, "fingerprint": host_fingerprint(), "created": when,
              "wall_s": time.perf_counter() - t0, "torch_threads_used": 1, "quick": quick,
              "device": device_to_dict(dev),
              "link": {"name": link.name, "bandwidth_bytes_per_s": link.bandwidth_bytes_per_s,
                       "latency_s": link.latency_s},
              "measured": {**times, **check, "in_step_s": in_step, "time_slicing": slicing,
                           "torch": torch.__version__}}
    path = write_atomic(cache_path(), json.dumps(record, indent=2) + "\n")
    return Calibration(dev, link, record["measured"], path, cached=False)


def _read_cache() -> Optional[Calibration]:
    path = cache_path()
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # absent or unreadable: measure again
    if record.get("version") != CACHE_VERSION or record.get("fingerprint") != host_fingerprint():
        return None  # another host, CPU count or torch: stale
    try:
        dev = device_from_dict(record["device"], str(path))
        ld = record["link"]
        link = Link(str(ld["name"]), float(ld["bandwidth_bytes_per_s"]), float(ld["latency_s"]))
    except (KeyError, TypeError, ValueError, MeshplanError):
        return None
    if not (link.bandwidth_bytes_per_s > 0 and link.latency_s > 0 and math.isfinite(link.bandwidth_bytes_per_s)):
        return None
    if "in_step_s" not in record.get("measured", {}):
        return None
    return Calibration(dev, link, dict(record.get("measured", {})), path, cached=True)


def load_calibration(force: bool = False, progress: Optional[Callable[[str], None]] = None,
                     quick: bool = False) -> Calibration:
    """The cached calibration of this host, measuring it first (``quick``: see :func:`calibrate`) when absent,
    stale or ``force``."""
    if not force:
        cal = _read_cache()
        if cal is not None:
            return cal
    return calibrate(progress, quick)


def cached_calibration() -> Optional[Calibration]:
    """The cached calibration if there is a valid one; never measures."""
    return _read_cache()


def is_local_spec(spec: str) -> bool:
    """True for a ``local:N`` cluster specification (N CPU processes on this host)."""
    return str(spec).strip().lower().startswith("local:")


def local_process_count(spec: str) -> int:
    """N of a ``local:N`` specification.

    Raises:
        MeshplanError: N is not a whole number >= 1.
    """
    s = str(spec).strip()
    n = s.split(":", 1)[1]
    if not n.isdigit() or int(n) < 1:
        raise MeshplanError(f"cluster '{s}': local:N needs a process count N >= 1")
    return int(n)


def calibration_for(cluster_spec: str, progress: Optional[Callable[[str], None]] = None) -> Optional[Calibration]:
    """The calibration a cluster specification needs: this host's (measured now only when the cache is absent or
    stale) for ``local:N``, None for any other cluster. The one call the CLI makes before building a cluster.

    Raises:
        MeshplanError: a malformed ``local:N`` (checked before anything is measured).
    """
    if not is_local_spec(cluster_spec):
        return None
    local_process_count(cluster_spec)
    return load_calibration(progress=progress)


def known_devices() -> list[DeviceSpec]:
    """The catalogue plus this host's ``cpu-local`` device when the host was calibrated (never measures)."""
    cal = cached_calibration()
    return [*catalogue().values(), *((cal.device,) if cal is not None else ())]


def find_device(name: str) -> DeviceSpec:
    """A catalogue device by name or alias, or this host's calibrated ``cpu-local`` (never measures).

    Raises:
        MeshplanError: unknown device (names the closest and the known ones).
    """
    cal = cached_calibration()
    return get_device(name, extra=(cal.device,) if cal is not None else ())


def host_bench(cal: Calibration) -> HostBench:
    """The measured per-op prices of this host (``planner.host.cpu_bench.HostBench``), kept beside the calibration."""
    return HostBench(cal.path.parent / "cpu-ops.json", host_fingerprint(), cal.device.l2_bytes)
