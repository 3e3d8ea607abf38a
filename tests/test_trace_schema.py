"""The trace reader's inline checks are the published event schema (profiler/trace_schema.py): one hostile corpus
goes through both, and every event the schema accepts is kept with the same argument values read, every event it
rejects refuses the file in one line naming the event and the field; headers the schema refuses are refused in one
line naming the file and the field."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from meshplan.core.errors import MeshplanError
from meshplan.profiler.trace import load_trace
from meshplan.profiler.trace_schema import TraceEvent, TraceHeader
from tests.test_profiler_fuzz import _ARGS, _values

_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
# One event per role the reader times (shapes as PyTorch 2.5 writes them, ../shared/notes/profiler.md §2).
_TEMPLATES = [
    {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)", "pid": 0,
     "tid": 7, "ts": 120.5, "dur": 30.0,
     "args": {"correlation": 11, "stream": 7, "Collective name": "allreduce", "In msg nelems": 1024,
              "dtype": "Float", "Process Group Name": "0", "Process Group Ranks": [0, 1], "Seq": 3}},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 100.0, "dur": 10.0,
     "args": {"Input Dims": [[8, 16], [16, 4]], "Input type": ["float", "float"], "correlation": 9}},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 101.0, "dur": 2.0,
     "args": {"correlation": 11}},
    {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": 7, "ts": 90.0,
     "dur": 3.0, "args": {"bytes": 4096, "correlation": 5, "stream": 7}},
]
_STEP = {"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 50.0, "dur": 500.0}


@st.composite
def _events(draw) -> dict:
    ev = json.loads(json.dumps(draw(st.sampled_from(_TEMPLATES))))
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            ev[draw(st.sampled_from(["ts", "dur", "name", "args"]))] = draw(_values)
        elif isinstance(ev.get("args"), dict):
            ev["args"][draw(st.sampled_from(_ARGS + ["bytes", "size", "seq"]))] = draw(_values)
    return ev


def _load(tmp_path, ev: dict, header: dict | None = None):
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({**(header or {}), "traceEvents": [_STEP, ev]}))
    return load_trace(path)


def _with(i: int, **fields) -> dict:
    return {**_TEMPLATES[i], **fields}


@_SETTINGS
@given(ev=_events())
@example(ev=_with(1, dur=-10.0))
@example(ev=_with(1, dur=-1))
@example(ev=_with(1, ts="100"))
@example(ev=_with(1, ts=True))
@example(ev=_with(1, ts=float("inf")))
@example(ev=_with(1, name=5))
@example(ev=_with(1, args=[1, 2]))
@example(ev=_with(0, args={**_TEMPLATES[0]["args"], "correlation": "11", "Seq": "3", "seq": 4}))
@example(ev=_with(0, args={**_TEMPLATES[0]["args"], "Process Group Ranks": "[0, 1]", "Process Group Name": 3}))
@example(ev=_with(2, args={"correlation": 1.5}))
@example(ev=_with(2, args="x"))
@example(ev=_with(1, ts=10**1000))
@example(ev=_with(0, args={**_TEMPLATES[0]["args"], "In msg nelems": "1024"}))
@example(ev=_with(0, args={**_TEMPLATES[0]["args"], "correlation": 2**64}))
@example(ev=_with(3, args={**_TEMPLATES[3]["args"], "bytes": "4096"}))
def test_reader_keeps_exactly_what_the_schema_accepts(tmp_path_factory, ev):
    if isinstance(ev.get("name"), str) and ev["name"].startswith("ProfilerStep#"):
        return
    try:
        typed = TraceEvent.model_validate(ev)
    except ValidationError:
        typed = None
    if typed is None:
        with pytest.raises(MeshplanError) as exc:
            _load(tmp_path_factory.mktemp("t"), ev)
        assert "\n" not in str(exc.value) and "traceEvents[1]" in str(exc.value), str(exc.value)
        return
    rt = _load(tmp_path_factory.mktemp("t"), ev)
    assert len(rt.events) == 1, (ev, rt.warnings)
    e, args = rt.events[0], typed.args
    assert e.ts_us == typed.ts and e.dur_us == typed.dur and e.name == typed.name
    assert e.corr == (args.correlation if args else None)
    if e.kind == "comm":
        seq = None if args is None else (args.seq if args.seq is not None else args.seq_lower)
        assert e.seq == (None if seq is None else int(seq))
        pgn = None if args is None else args.process_group_name
        assert e.pg == (None if pgn is None else str(pgn)[:200])
        ranks = None if args is None else args.process_group_ranks
        if ranks is None:
            assert e.group_ranks is None
        elif isinstance(ranks, list) and ranks:
            assert e.group_ranks == tuple(ranks)
    if e.cat == "cpu_op" and (args is None or args.input_dims is None):
        assert e.shapes is None


@pytest.mark.parametrize("header, field", [
    ({"distributedInfo": {"rank": "x"}}, "distributedInfo.rank"),
    ({"distributedInfo": {"rank": 2.5}}, "distributedInfo.rank"),
    ({"distributedInfo": {"rank": True}}, "distributedInfo.rank"),
    ({"distributedInfo": {"world_size": "many"}}, "distributedInfo.world_size"),
    ({"distributedInfo": {"world_size": 1e8}}, "distributedInfo.world_size"),
    ({"distributedInfo": {"pg_config": 5}}, "distributedInfo.pg_config"),
    ({"distributedInfo": [1]}, "distributedInfo"),
    ({"baseTimeNanoseconds": "abc"}, "baseTimeNanoseconds"),
    ({"baseTimeNanoseconds": 1e309}, "baseTimeNanoseconds"),
    ({"baseTimeNanoseconds": -5}, "baseTimeNanoseconds"),
])
def test_bad_header_is_one_line_naming_file_and_field(tmp_path, header, field):
    with pytest.raises(ValidationError):
        TraceHeader.model_validate(header)
    with pytest.raises(MeshplanError) as exc:
        _load(tmp_path, _TEMPLATES[1], header)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(str(tmp_path / "rank0.json")) and field in msg, msg


def test_informational_header_fields_of_the_wrong_type_read_as_absent(tmp_path):
    rt = _load(tmp_path, _TEMPLATES[1], {"distributedInfo": {"rank": 1, "world_size": 2, "backend": 5},
                                          "host_name": ["x"], "deviceProperties": {"name": "H100"}})
    assert (rt.rank, rt.world_size, rt.backend, rt.hostname, rt.devices) == (1, 2, None, None, [])
