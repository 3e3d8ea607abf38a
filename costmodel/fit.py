"""Calibrate the learned model on a profiled run (``meshplan costmodel fit --runs RUN_DIR``).

The op records of the run's Kineto traces (``profiler.trace``: op name, ``Input Dims`` from
``record_shapes``, duration) become training rows for the device the run used; for each op class present a
calibration ``t = overhead + multiple * roofline`` is fitted on those rows (a run holds a handful of shapes
per class: too few for trees, which cannot interpolate a fixed per-op overhead between them) and stored in
the model's metadata; queries for that device and class then use it, all others keep the learned trees.

On CPU runs a ``cpu_op`` duration is the op's run time; on GPU runs the kernels launched inside the op are
matched by ``correlation`` id and their durations summed. Rows are fp32 (traces do not record the math dtype
of every op reliably).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from meshplan.costmodel.datasets.table import KernelTable, file_sha256
from meshplan.costmodel.features import flops_bytes
from meshplan.costmodel.learned import LearnedModel
from meshplan.costmodel.train import prepare
from meshplan.core.atomic import write_atomic
from meshplan.core.errors import MeshplanError


MIN_SHAPES = 2  # distinct shapes of a class a run must hold for that class to be calibrated


def _dims(shapes, i):
    try:
        d = shapes[i]
        return tuple(int(x) for x in d) if d is not None else None
    except (IndexError, TypeError, ValueError):
        return None


def op_row(name: str, shapes) -> tuple[str, float, float, float, float] | None:
    """``(kind, b, m, n, k)`` for an aten op with its ``Input Dims``, or ``None`` if not a priced leaf op."""
    a, w = _dims(shapes, 0), _dims(shapes, 1)
    if name == "aten::mm" and a and w and len(a) == 2 and len(w) == 2:
        return "matmul", 1, a[0], w[1], a[1]
    if name == "aten::addmm":  # addmm(bias, x, w)
        x, w2 = _dims(shapes, 1), _dims(shapes, 2)
        if x and w2 and len(x) == 2 and len(w2) == 2:
            return "matmul", 1, x[0], w2[1], x[1]
    if name == "aten::bmm" and a and w and len(a) == 3:
        return "bmm", a[0], a[1], w[2], a[2]
    if name in ("aten::native_layer_norm",) and a:
        return "layernorm", 1, int(np.prod(a[:-1])), a[-1], 1
    if name in ("aten::_softmax",) and a:
        return "softmax", 1, int(np.prod(a[:-1])), a[-1], 1
    if name in ("aten::add", "aten::mul", "aten::sub", "aten::div") and a and w:  # tensor-tensor only
        return "elementwise", 1, int(np.prod(a)), 1, 1
    if name in ("aten::gelu", "aten::relu", "aten::silu", "aten::tanh", "aten::sigmoid") and a:
        return "activation", 1, int(np.prod(a)), 1, 1
    if name == "aten::embedding" and a and w:
        return "embedding", 1, int(np.prod(w)), a[-1], 1
    return None


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
    from meshplan.profiler.runs import load_run
    from meshplan.profiler.trace import load_trace

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


def affine_fit(roof_s: np.ndarray, lat_s: np.ndarray) -> tuple[float, float]:
    """Fit ``t = overhead + multiple * roofline`` minimising relative error, with overhead >= 0, multiple >= 1.

    The multiple >= 1 keeps every calibrated prediction at or above the ideal roofline; the overhead is the
    per-op dispatch cost a profiled run pays (notes/costmodel.md sec. 5.1 item 6, launch floor).
    """
    if len(lat_s) == 1:
        return 0.0, float(max(1.0, lat_s[0] / roof_s[0]))
    A = np.column_stack([1.0 / lat_s, roof_s / lat_s])
    (a, c), *_ = np.linalg.lstsq(A, np.ones_like(lat_s), rcond=None)
    if a < 0:  # no overhead: pure multiple, fitted in relative error
        a, c = 0.0, float(np.sum(roof_s / lat_s) / np.sum((roof_s / lat_s) ** 2))
    if c < 1.0:  # cannot beat the roofline: refit the overhead alone
        c = 1.0
        a = float(max(0.0, np.sum((lat_s - roof_s) / lat_s ** 2) / np.sum(1.0 / lat_s ** 2)))
    return float(a), float(c)


def refit(base: LearnedModel, rows: KernelTable) -> LearnedModel:
    """A new model: ``base`` plus a per-(device, op class) calibration fitted on ``rows``.

    For each op class with at least ``MIN_SHAPES`` distinct shapes in the run, ``t = overhead + multiple *
    roofline`` is fitted on that device's rows
    (``affine_fit``); queries for that device and class use it ("calibrated"), others keep the base model.
    """
    prep = prepare(rows)
    if len(prep.table) == 0:
        raise MeshplanError(f"device {rows.device[0]} is unknown; pass a collect folder with its device.json")
    meta = json.loads(json.dumps(base.meta))
    cal = meta.setdefault("calibration", {})
    for dev in np.unique(prep.table.device):
        for kind in np.unique(prep.table.op):
            idx = (prep.table.op == kind) & (prep.table.device == dev)
            if idx.sum() < MIN_SHAPES:  # one shape cannot tell a per-op overhead from a multiple of the roofline
                continue
            a, c = affine_fit(prep.roof_s[idx], prep.table.latency_s[idx])
            cal.setdefault(str(dev), {})[str(kind)] = {"overhead_s": a, "roofline_multiple": c, "rows": int(idx.sum())}
    return LearnedModel(base.directory, meta, dict(base.boosters))


def save_model(model: LearnedModel, out_dir: str | Path) -> Path:
    """Write a (refitted) model folder with fresh checksums."""
    out = Path(out_dir)
    meta = json.loads(json.dumps(model.meta))
    for kind, booster in model.boosters.items():
        fname = f"{kind}.ubj"
        write_atomic(out / fname, bytes(booster.save_raw(raw_format="ubj")))
        meta["kinds"].setdefault(kind, {})
        meta["kinds"][kind]["file"] = fname
        meta["kinds"][kind]["sha256"] = file_sha256(out / fname)
    write_atomic(out / "metadata.json", json.dumps(meta, indent=1, sort_keys=True))
    return out


def fit_runs(runs: list[str | Path], base_dir: str | Path | None, out_dir: str | Path, device_dir: str | Path | None = None,
             device: str | None = None) -> dict:
    """Calibrate on ``runs`` and save to ``out_dir``; returns a summary (rows per op, device).

    Args:
        runs: Run folders / trace files.
        base_dir: Model to start from (``None``: the shipped default).
        out_dir: Where the calibrated model goes.
        device_dir: A ``collect`` output whose ``device.json`` describes the run's CPU (else measured now).
        device: Device name (else the GPU in the traces' ``deviceProperties``, else this host's CPU).
    """
    from meshplan.costmodel import api
    from meshplan.costmodel.collect import measure_device
    from meshplan.costmodel.datasets.local import load_device

    base = LearnedModel.load(base_dir) if base_dir else (api.active_model() or None)
    if base is None:
        raise MeshplanError("no base model: pass --model DIR (none is shipped)")
    loaded = load_runs(runs)
    if device is None:
        device = trace_device(loaded)
    if device is None:
        if device_dir is not None:
            device = load_device(Path(device_dir) / "device.json").name
        else:
            d = measure_device("cpu", quick=True)
            tmp = Path(out_dir) / "device.json"
            write_atomic(tmp, json.dumps(d, indent=1))
            device = load_device(tmp).name
    table = KernelTable.concat([rows_from_run(p, device, traces) for p, traces in loaded.items()])
    model = refit(base, table)
    save_model(model, out_dir)
    ops = {k: int((table.op == k).sum()) for k in sorted(set(table.op))}
    return {"device": device, "rows": int(len(table)), "ops": ops, "out": str(out_dir),
            "calibrated": sorted(k for k, n in ops.items() if n >= MIN_SHAPES)}
