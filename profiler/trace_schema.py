"""The schema of what meshplan reads from a Kineto trace: the header (``distributedInfo``,
``baseTimeNanoseconds``, ``deviceProperties``) and one event, as pydantic models.

The header is validated with :class:`TraceHeader` on every load (one object per file). Events are not: a pydantic
call per event adds half again to a load (1.07 s on top of 2.20 s for the 216,092 events of
``../shared/traces/hta_testdata/df_index_resolver``), and a 501 MB trace holds millions, so :func:`profiler.trace.
load_trace` checks the same rules inline. :class:`TraceEvent` is their contract: tests/test_trace_schema.py feeds
one hostile corpus to both and asserts they agree event by event (kept or skipped as malformed, and the argument
values used). ``docs/schemas/trace_event.schema.json`` and ``trace_header.schema.json`` publish them
(``python -m meshplan.verify.schemas docs/schemas``).

Two kinds of field:

* **Required for use**: an ``X`` event's ``ts``, ``dur`` (finite, ``dur >= 0``) and ``name`` (a string); the header's
  ``rank``, ``world_size``, ``pg_config`` and ``baseTimeNanoseconds``. A wrong one skips the event (counted and
  warned) or refuses the file, naming the field.
* **Informational**: everything in ``args`` (``correlation``, ``Collective name``, ``In msg nelems`` ...), the
  header's ``backend``, ``host_name``, ``deviceProperties``. A value of the wrong type is read as absent, as the
  profiler wrote nothing there (old PyTorch versions leave most of them out).
"""
from __future__ import annotations

import math
from typing import Annotated, Any, Optional, Union

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, StrictFloat, StrictInt, StrictStr, ValidationError,
                      WrapValidator, field_validator)

from meshplan.core.errors import MeshplanError, validation_line

# The largest training jobs published run on about 10^5 accelerators; 2^20 leaves an order of magnitude.
MAX_WORLD_SIZE = 1 << 20


def _absent_if_wrong(value: Any, handler: Any) -> Any:
    """An informational field of the wrong type reads as absent (None)."""
    try:
        return handler(value)
    except ValidationError:
        return None


def _finite(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError("must be a finite number")
    return float(value)


Info = WrapValidator(_absent_if_wrong)
Number = StrictFloat  # a JSON number, integer or not (strict: no strings, no booleans)
# JSON integers, or floats holding an integer (some writers emit 3.0): the header's rank and world size.
Integral = Annotated[StrictFloat, Field(json_schema_extra={"multipleOf": 1})]


class EventArgs(BaseModel):
    """The ``args`` keys meshplan reads (profiler/normalise.py); every one informational, others kept."""

    model_config = ConfigDict(extra="allow")

    correlation: Annotated[Optional[StrictInt], Info] = None
    """Launch <-> device-op join key."""
    stream: Annotated[Optional[Union[StrictInt, StrictStr]], Info] = None
    """Device queue of a kernel or copy (2021 traces: the tid ``"stream 7"`` instead)."""
    input_dims: Annotated[Optional[list], Info] = Field(None, alias="Input Dims")
    """Shapes of a host op's inputs (nested lists)."""
    input_type: Annotated[Optional[list], Info] = Field(None, alias="Input type")
    """Dtypes of a host op's inputs: the element size of a collective annotation."""
    collective_name: Annotated[Optional[StrictStr], Info] = Field(None, alias="Collective name")
    """Collective type recorded on NCCL kernels and ``nccl:*`` annotations (PyTorch >= 2.2)."""
    in_msg_nelems: Annotated[Optional[Annotated[Number, Field(ge=0)]], Info] = Field(None, alias="In msg nelems")
    """Elements a collective sends (with ``dtype``: its bytes)."""
    dtype: Annotated[Optional[StrictStr], Info] = None
    process_group_name: Annotated[Optional[Union[StrictStr, StrictInt]], Info] = Field(None, alias="Process Group Name")
    process_group_ranks: Annotated[Optional[Union[list[StrictInt], StrictStr]], Info] = Field(
        None, alias="Process Group Ranks")
    """Global ranks of the group: a list, or the string ``"[0, 1]"`` that PyTorch 2.3-2.5 wrote."""
    seq: Annotated[Optional[Number], Info] = Field(None, alias="Seq")
    """Per-process-group sequence number (2026+ traces)."""
    seq_lower: Annotated[Optional[Number], Info] = Field(None, alias="seq")
    """The same, as some writers spell it (read when ``Seq`` is absent or not a number)."""
    bytes: Annotated[Optional[Number], Info] = None
    """Bytes moved by a copy."""
    size: Annotated[Optional[Number], Info] = None
    """Bytes moved by a copy, as older traces name it (read when ``bytes`` is absent or 0)."""
    cuda_sync_kind: Annotated[Optional[StrictStr], Info] = None
    """``Stream Wait Event`` on the ``cuda_sync`` events of newer traces (pytorch#105187)."""
    wait_on_stream: Annotated[Optional[StrictInt], Info] = None
    """The stream a ``cudaStreamWaitEvent`` waits for."""
    wait_on_cuda_event_record_corr_id: Annotated[Optional[StrictInt], Info] = None
    """Correlation of the ``cudaEventRecord`` waited for."""
    concrete_inputs: Annotated[Optional[list], Info] = Field(None, alias="Concrete Inputs")
    """Scalar arguments of a host op: ``c10d::send``/``recv_`` carry the peer rank third."""

    @field_validator("in_msg_nelems", "seq", "seq_lower", "bytes", "size")
    @classmethod
    def _finite_or_absent(cls, v: Optional[float]) -> Optional[float]:
        return v if v is None or math.isfinite(v) else None


class TraceEvent(BaseModel):
    """One ``traceEvents`` entry as meshplan reads it. Only complete events (``ph: "X"``) of a used category are
    timed; the rules on ``ts``/``dur``/``name`` apply to those (others are counted by category and skipped)."""

    model_config = ConfigDict(extra="allow")

    ph: Optional[StrictStr] = None
    """Event phase: ``X`` (complete, with a duration) is the one timed; ``i``/``s``/``f``/``M`` are not."""
    cat: Optional[StrictStr] = None
    """Category (``kernel``, ``cpu_op``, ``cuda_runtime``, ``Kernel`` in 2021 ...): decides the event's role."""
    name: StrictStr = ""
    """Op, kernel or annotation name (``ProfilerStep#N`` marks a step)."""
    ts: Annotated[float, BeforeValidator(_finite)]
    """Start, microseconds (relative to ``baseTimeNanoseconds`` when the header has it)."""
    dur: Annotated[float, Field(ge=0), BeforeValidator(_finite)] = 0.0
    """Duration, microseconds."""
    pid: Any = None
    """Process, or the device index of a device op."""
    tid: Any = None
    """Thread, or the stream of a device op."""
    args: Annotated[Optional[EventArgs], Info] = None
    """Event arguments; not an object reads as none."""


class DistributedInfo(BaseModel):
    """``distributedInfo``: which rank wrote the trace (PyTorch >= 1.13)."""

    model_config = ConfigDict(extra="allow")

    rank: Optional[Integral] = Field(None, ge=0, le=MAX_WORLD_SIZE - 1)
    """Global rank; absent: taken from the file name (``rank-3``, ``worker3``), else 0 with a warning."""
    world_size: Optional[Integral] = Field(None, ge=1, le=MAX_WORLD_SIZE)
    backend: Annotated[Optional[StrictStr], Info] = None
    """``nccl``, ``gloo`` ..."""
    pg_config: Optional[list] = None
    """Process groups (``pg_name``, ``ranks`` ...); entries that are not objects are ignored."""

    @field_validator("rank", "world_size")
    @classmethod
    def _integer(cls, v: Optional[float]) -> Optional[int]:
        if v is None:
            return None
        if isinstance(v, float) and not v.is_integer():
            raise ValueError("expected an integer")
        return int(v)


class TraceHeader(BaseModel):
    """The top-level keys of a Kineto trace other than ``traceEvents``."""

    model_config = ConfigDict(extra="allow")

    distributedInfo: Optional[DistributedInfo] = None
    baseTimeNanoseconds: Optional[Number] = Field(None, ge=0)
    """Clock origin of the events' ``ts`` (ns since the epoch); absent in traces before PyTorch 2.0."""
    deviceProperties: Annotated[Optional[list], Info] = None
    """One object per device; ``name`` is read."""
    host_name: Annotated[Optional[StrictStr], Info] = None

    @field_validator("baseTimeNanoseconds")
    @classmethod
    def _finite_base(cls, v: Optional[float]) -> Optional[float]:
        if v is not None and not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v


def validate_header(header: dict, label: str) -> TraceHeader:
    """The header typed, or one line naming the file and the field (``MeshplanError``)."""
    try:
        return TraceHeader.model_validate({k: v for k, v in header.items() if k != "traceEvents"})
    except ValidationError as exc:
        raise MeshplanError(f"{label}: {validation_line(exc)}") from None


def schemas() -> dict[str, dict]:
    """Published JSON Schemas (file name -> schema)."""
    event = TraceEvent.model_json_schema(by_alias=True)
    event["description"] = ("One Kineto traceEvents entry as meshplan reads it (profiler/trace_schema.py). "
                             "Informational fields of the wrong type read as absent.")
    header = TraceHeader.model_json_schema(by_alias=True)
    header["description"] = "The top-level keys of a Kineto trace that meshplan reads (profiler/trace_schema.py)."
    return {"trace_event.schema.json": event, "trace_header.schema.json": header}
