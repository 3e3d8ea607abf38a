"""Learning an op model from profiled runs (``meshplan costmodel fit --runs RUN --out DIR``).

The op records of the run's Kineto traces (``profiler.trace``: op name, ``Input Dims`` from ``record_shapes``,
duration) become training rows for the device the run used, and ``costmodel.refit`` fits a per-class calibration
on them. On CPU runs a ``cpu_op`` duration is the op's run time; on GPU runs the kernels launched inside the op
are matched by ``correlation`` id and their durations summed. Rows are fp32 (traces do not record the math dtype
of every op reliably).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from meshplan.core.atomic import write_atomic
from meshplan.core.errors import MeshplanError
from meshplan.costmodel.api import Pricer
from meshplan.costmodel.datasets.table import KernelTable
from meshplan.costmodel.features import flops_bytes
from meshplan.costmodel.refit import MIN_SHAPES, op_row, refit, save_model
from meshplan.profiler.runs import load_run
from meshplan.profiler.trace import load_trace


def _gpu_time_us(tr) -> dict[int, float]:
    """Kernel time launched inside each host op window: ``{id(cpu_op event): summed kernel us}``."""
    import bisect

    kernels: dict[int, float] = {}
    for e in tr.events:
        if e.cat == "kernel" and e.corr is not None:
            kernels[e.corr] = kernels.get(e.corr, 0.0) + e.dur_us
    if not kernels:
        return {}
    launches: dict[str, list[tuple[float, int]]] = {}
    for e in tr.events:
        if e.cat in ("cuda_runtime", "cuda_driver") and e.corr in kernels:
            launches.setdefault(e.lane, []).append((e.ts_us, e.corr))
    for v in launches.values():
        v.sort()
    out = {}
    for e in tr.events:
        if e.cat != "cpu_op" or e.shapes is None or e.lane not in launches:
            continue
        lane = launches[e.lane]
        i = bisect.bisect_left(lane, (e.ts_us, -1))
        total = 0.0
        while i < len(lane) and lane[i][0] <= e.ts_us + e.dur_us:
            total += kernels[lane[i][1]]
            i += 1
        if total > 0:
            out[id(e)] = total
    return out


def _traces(p: Path):
    if p.is_file() and p.name.endswith((".json", ".json.gz")):
        return [load_trace(p)]
    return list(load_run(p).ranks.values())


def load_runs(runs: list[str | Path]) -> dict[Path, list]:
    """Every run's rank traces, loaded once: ``{path: [profiler.trace.RankTrace]}``.

    Raises:
        MeshplanError: a missing run folder, or an unreadable trace (from ``profiler``).
    """
    out = {}
    for r in runs:
        p = Path(r)
        if not p.exists():
            raise MeshplanError(f"{p}: run folder not found")
        out[p] = _traces(p)
    return out


def trace_device(loaded: dict[Path, list]) -> str | None:
    """Catalogue name of the GPU the runs' traces recorded (``deviceProperties``), or None for CPU-only traces.

    Args:
        loaded: ``load_runs`` output.

    Raises:
        MeshplanError: a GPU the catalogue does not know (pass ``--device``), or runs on different GPUs.
    """
    from meshplan.costmodel.devices import get_device

    names = {d for traces in loaded.values() for tr in traces if tr.has_gpu for d in tr.devices}
    first = next(iter(loaded), "")
    if not names:
        return None
    try:
        found = {get_device(n).name for n in names}
    except MeshplanError as exc:
        raise MeshplanError(f"{first}: the traces' GPU is not in the catalogue; pass --device NAME ({exc})") from None
    if len(found) > 1:
        raise MeshplanError(f"{first}: the runs' traces recorded different GPUs ({', '.join(sorted(found))}); "
                            "fit one device at a time")
    return found.pop()


def rows_from_run(run_dir: str | Path, device: str, traces: list | None = None) -> KernelTable:
    """Training rows (median duration per distinct op and shape) from every trace of a run.

    CPU runs: the ``cpu_op`` duration is the op's time. GPU runs: the durations of the kernels launched inside
    the op's host window (joined on ``correlation``) are summed; ops that launched no kernel are skipped.

    Args:
        run_dir: A ``meshplan profile`` folder, a folder or archive of Kineto traces, or one trace file.
        device: Device name the rows belong to (resolvable by ``costmodel.datasets.devices.resolve``).
        traces: The run's traces when already loaded (``load_runs``); else loaded here.

    Raises:
        MeshplanError: unreadable trace (from ``profiler``), or no priced op in the run.
    """
    p = Path(run_dir)
    if traces is None:
        traces = load_runs([p])[p]
    samples: dict[tuple, list[float]] = {}
    for tr in traces:
        gpu = _gpu_time_us(tr)
        for e in tr.events:
            if e.cat != "cpu_op" or e.shapes is None:
                continue
            r = op_row(e.name, e.shapes)
            if r is None:
                continue
            if gpu or tr.has_gpu:
                if id(e) not in gpu:
                    continue
                dur_us = gpu[id(e)]
            else:
                dur_us = e.dur_us
            samples.setdefault(r, []).append(dur_us * 1e-6)
    if not samples:
        raise MeshplanError(f"{p}: no priced ops with input shapes in the run's traces (profile with "
                            f"record_shapes=True)")
    keys = list(samples)
    kind = np.array([k[0] for k in keys], dtype=object)
    b, m, n, k = (np.array([x[i] for x in keys], dtype=np.float64) for i in range(1, 5))
    dtype = np.full(len(keys), "fp32", dtype=object)
    lat = np.array([float(np.median(samples[x])) for x in keys])
    noise = np.array([float(np.std(samples[x]) / np.mean(samples[x])) if len(samples[x]) > 1 else np.nan for x in keys])
    flops, nbytes = flops_bytes(kind, b, m, n, k, dtype)
    return KernelTable.from_columns(len(keys), device=device, op=kind, variant=kind, dtype=dtype, source="run",
                                    b=b, m=m, n=n, k=k, flops=flops, bytes=nbytes, latency_s=lat, noise=noise)


def fit_runs(runs: list[str | Path], base_dir: str | Path | None, out_dir: str | Path,
             device_dir: str | Path | None = None, device: str | None = None) -> dict:
    """Calibrate on ``runs`` and save to ``out_dir``; returns a summary (rows per op, device).

    Args:
        runs: Run folders / trace files.
        base_dir: Model to start from (``None``: the shipped default).
        out_dir: Where the calibrated model goes.
        device_dir: A ``collect`` output whose ``device.json`` describes the run's CPU (else measured now).
        device: Device name (else the GPU in the traces' ``deviceProperties``, else this host's CPU).
    """
    from meshplan.costmodel.collect import measure_device
    from meshplan.costmodel.datasets.local import load_device

    base = Pricer.from_dir(base_dir).model
    if base is None:
        raise MeshplanError("no base model: pass --model DIR (none is shipped)")
    loaded = load_runs(runs)
    if device is None:
        device = trace_device(loaded)
    measured = ()  # the CPU the rows were timed on, when it is this host's: in no catalogue, so passed to the refit
    if device is None:
        if device_dir is not None:
            measured = (load_device(Path(device_dir) / "device.json"),)
        else:
            d = measure_device("cpu", quick=True)
            tmp = Path(out_dir) / "device.json"
            write_atomic(tmp, json.dumps(d, indent=1))
            measured = (load_device(tmp),)
        device = measured[0].name
    table = KernelTable.concat([rows_from_run(p, device, traces) for p, traces in loaded.items()])
    model = refit(base, table, measured)
    save_model(model, out_dir)
    ops = {k: int((table.op == k).sum()) for k in sorted(set(table.op))}
    return {"device": device, "rows": int(len(table)), "ops": ops, "out": str(out_dir),
            "calibrated": sorted(k for k, n in ops.items() if n >= MIN_SHAPES)}
