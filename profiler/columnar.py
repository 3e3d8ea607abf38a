"""A parsed rank trace as a columnar table (Apache Arrow), its Parquet cache file, and per-rank reductions.

One row per kept :class:`profiler.trace.Event`; string columns are dictionary-encoded (a few thousand distinct op
names over millions of events), the rest of the :class:`RankTrace` (rank, steps, categories seen ...) rides in
the schema metadata as JSON. A second analysis of the same run reads these files instead of the JSON
(``profiler.ingest``): no JSON is parsed again.

:func:`reduce_table` computes what ``meshplan replay --summary`` shows from four columns with Arrow compute,
so a summary of thousands of ranks never builds event objects in the main process.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from meshplan.core.atomic import write_atomic
from meshplan.profiler.trace import KINDS, Event, RankTrace

# Bump when the parser or the table layout changes: old cache files are then ignored (their key differs).
FORMAT_VERSION = 3
_META_KEY = b"meshplan.ranktrace"
_STR_COLS = ("lane", "kind", "cat", "name", "shapes", "coll", "pg", "group_ranks")
_SCHEMA = pa.schema([
    *(pa.field(c, pa.dictionary(pa.int32(), pa.string())) for c in _STR_COLS),
    pa.field("ts_us", pa.float64()), pa.field("dur_us", pa.float64()), pa.field("bytes", pa.float64()),
    pa.field("seq", pa.int64()), pa.field("corr", pa.int64()), pa.field("step", pa.int64()),
    pa.field("peer", pa.int64()),
])


def _shape_text(shapes: Any, memo: dict[int, str | None]) -> str | None:
    if shapes is None:
        return None
    k = id(shapes)  # shapes are shared tuples (one object per distinct shape): encode each once
    t = memo.get(k)
    if t is None:
        t = memo[k] = json.dumps(shapes, separators=(",", ":"))
    return t


def _to_tuple(x: Any) -> Any:
    return tuple(_to_tuple(v) for v in x) if isinstance(x, list) else x


def trace_to_table(t: RankTrace) -> pa.Table:
    """The trace as an Arrow table (events as rows, the rest as schema metadata)."""
    ev = t.events
    memo: dict[int, str | None] = {}
    cols: dict[str, Any] = {
        "lane": [e.lane for e in ev], "kind": [e.kind for e in ev], "cat": [e.cat for e in ev],
        "name": [e.name for e in ev], "shapes": [_shape_text(e.shapes, memo) for e in ev],
        "coll": [e.coll for e in ev], "pg": [e.pg for e in ev],
        "group_ranks": [None if e.group_ranks is None else ",".join(map(str, e.group_ranks)) for e in ev],
        "ts_us": [e.ts_us for e in ev], "dur_us": [e.dur_us for e in ev], "bytes": [e.bytes for e in ev],
        "seq": [e.seq for e in ev], "corr": [e.corr for e in ev], "step": [e.step for e in ev],
        "peer": [e.peer for e in ev],
    }
    arrays = []
    for f in _SCHEMA:
        if f.name in _STR_COLS:
            arrays.append(pa.array(cols[f.name], pa.string()).dictionary_encode())
        else:
            arrays.append(pa.array(cols[f.name], f.type))
    meta = {
        "version": FORMAT_VERSION, "path": t.path, "rank": t.rank, "world_size": t.world_size,
        "backend": t.backend, "base_ns": t.base_ns, "steps": [[n, s, d] for n, (s, d) in t.steps.items()],
        "main_lane": t.main_lane, "pg_config": t.pg_config, "devices": t.devices, "hostname": t.hostname,
        "warnings": t.warnings, "stream_waits": t.stream_waits, "categories": t.categories,
        "step_source": t.step_source, "empty_steps": t.empty_steps, "file_bytes": t.file_bytes,
    }
    return pa.Table.from_arrays(arrays, schema=_SCHEMA.with_metadata({_META_KEY: json.dumps(meta, default=str)}))


def table_meta(table: pa.Table | pa.Schema) -> dict:
    schema = table if isinstance(table, pa.Schema) else table.schema
    return json.loads(schema.metadata[_META_KEY])


def table_to_trace(table: pa.Table) -> RankTrace:
    """Rebuild the :class:`RankTrace` (events in file order, steps assigned) from its table."""
    meta = table_meta(table)
    cols = {c: table.column(c).to_pylist() for c in table.column_names}
    shape_memo: dict[str, Any] = {}

    def shape(s: str | None) -> Any:
        if s is None:
            return None
        v = shape_memo.get(s)
        if v is None:
            v = shape_memo[s] = _to_tuple(json.loads(s))
        return v

    rank = meta["rank"]
    events: list[Event] = []
    app = events.append
    for lane, kind, cat, name, shp, coll, pg, gr, ts, dur, nb, seq, corr, step, peer in zip(
            cols["lane"], cols["kind"], cols["cat"], cols["name"], cols["shapes"], cols["coll"], cols["pg"],
            cols["group_ranks"], cols["ts_us"], cols["dur_us"], cols["bytes"], cols["seq"], cols["corr"],
            cols["step"], cols["peer"]):
        e = Event(rank, lane, kind, cat, name, ts, dur, shape(shp), nb, coll, pg, seq,
                  tuple(int(x) for x in gr.split(",")) if gr else None, corr)
        e.step, e.peer = step, peer
        app(e)
    return RankTrace(
        path=meta["path"], rank=rank, world_size=meta["world_size"], backend=meta["backend"],
        base_ns=meta["base_ns"], events=events, steps={int(n): (s, d) for n, s, d in meta["steps"]},
        main_lane=meta["main_lane"], pg_config=meta["pg_config"], devices=meta["devices"],
        hostname=meta["hostname"], warnings=meta["warnings"],
        stream_waits=[tuple(w) for w in meta["stream_waits"]], categories=meta["categories"],
        step_source=meta["step_source"], empty_steps=meta["empty_steps"], file_bytes=meta["file_bytes"])


def write_parquet(table: pa.Table, path: Path) -> Path:
    """Write the table atomically (temp file + rename), zstd-compressed."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    return write_atomic(path, sink.getvalue().to_pybytes())


REDUCED_COLUMNS = ["kind", "lane", "dur_us", "bytes"]  # what reduce_table reads


def read_parquet(path: Path, columns: list[str] | None = None) -> pa.Table:
    return pq.read_table(path, columns=columns)


def reduce_table(table: pa.Table) -> dict[str, Any]:
    """Per-rank reductions for the summary, from the table's columns with Arrow compute (no Python loop per event;
    ~1 ms per rank where a loop over the events took ~9). See :func:`reductions` for the keys."""
    counts = {k: 0 for k in KINDS}
    busy_us = {k: 0.0 for k in KINDS}
    comm_bytes = 0.0
    lanes: list[str] = []
    if table.num_rows:
        sub = table.select(["kind", "dur_us", "bytes"])
        sub = sub.set_column(0, "kind", pc.cast(sub.column("kind"), pa.string()))
        agg = sub.group_by("kind").aggregate([("dur_us", "sum"), ("dur_us", "count"), ("bytes", "sum")])
        for k, d, c, b in zip(agg.column("kind").to_pylist(), agg.column("dur_us_sum").to_pylist(),
                              agg.column("dur_us_count").to_pylist(), agg.column("bytes_sum").to_pylist()):
            counts[k], busy_us[k] = c, d
            if k == "comm":
                comm_bytes = b
        lanes = pc.unique(pc.cast(table.column("lane"), pa.string())).to_pylist()
    return reductions(table_meta(table), table.num_rows, counts, busy_us, comm_bytes, lanes)


def reduce_trace(t: RankTrace) -> dict[str, Any]:
    """The same reductions straight from a parsed trace (no table: the uncached summary path)."""
    counts = {k: 0 for k in KINDS}
    busy_us = {k: 0.0 for k in KINDS}
    comm_bytes = 0.0
    for e in t.events:
        counts[e.kind] += 1
        busy_us[e.kind] += e.dur_us
        if e.kind == "comm":
            comm_bytes += e.bytes
    meta = {"rank": t.rank, "path": t.path, "steps": [[n, s, d] for n, (s, d) in t.steps.items()],
            "empty_steps": t.empty_steps, "devices": t.devices, "categories": t.categories,
            "step_source": t.step_source, "world_size": t.world_size, "backend": t.backend, "warnings": t.warnings,
            "file_bytes": t.file_bytes}
    return reductions(meta, len(t.events), counts, busy_us, comm_bytes, list({e.lane for e in t.events}))


def reductions(meta: dict, n_events: int, counts: dict[str, int], busy_us: dict[str, float], comm_bytes: float,
               lanes: list[str]) -> dict:
    """The per-rank summary record (sums may differ between the two paths in the last bits: summation order).

    Returns:
        ``{"rank", "file", "events", "ops": {kind: n}, "host_threads", "gpu_streams", "steps", "empty_steps",
        "collectives", "comm_bytes", "busy_s": {kind: s}, "devices", "categories", "step_source", "world_size",
        "backend", "warnings", "file_bytes"}``
    """
    return {
        "rank": meta["rank"], "file": meta["path"], "events": n_events, "ops": counts,
        "host_threads": sum(1 for x in lanes if x.startswith("thread:")),
        "gpu_streams": sum(1 for x in lanes if x.startswith("stream:")),
        "steps": sorted(int(n) for n, _, _ in meta["steps"]), "empty_steps": meta["empty_steps"],
        "collectives": counts["comm"], "comm_bytes": comm_bytes,
        "busy_s": {k: v * 1e-6 for k, v in busy_us.items()},
        "devices": sorted(set(meta["devices"]))[:2], "categories": meta["categories"],
        "step_source": meta["step_source"], "world_size": meta["world_size"], "backend": meta["backend"],
        "warnings": meta["warnings"], "file_bytes": meta["file_bytes"],
    }
