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
* **Read when present**: the ``args`` keys meshplan reads (``correlation``, ``Collective name``, ``In msg nelems``
  ...), each of one JSON type (:data:`ARG_TYPES`, checked by :func:`arg_problem`); absent or ``null`` is fine (old
  PyTorch versions leave most of them out), another type (``args`` a list or a string, a count as a string) refuses
  the file naming the event and the key. ROCm writes a copy's ``bytes``/``size`` on its runtime events as a decimal
  string (traces/external/tracelens_mi300_*, hta_amd_mi250_minitoy): accepted, not read.
* **Informational**: the header's ``backend``, ``host_name``, ``deviceProperties``: a value of the wrong type reads
  as absent.

Integers are bounded by ``core.bounds.MAX_ABS_INT`` (64 bits) and numbers must be finite, as in every other file
meshplan reads.
"""
from __future__ import annotations

import math
from typing import Annotated, Any, Optional, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    WrapValidator,
    field_validator,
    model_validator,
)

from meshplan.core.bounds import MAX_ABS_INT
from meshplan.core.errors import MeshplanError, validation_line

# The largest training jobs published run on about 10^5 accelerators; 2^20 leaves an order of magnitude.
MAX_WORLD_SIZE = 1 << 20


def _absent_if_wrong(value: Any, handler: Any) -> Any:
    """An informational field of the wrong type reads as absent (None)."""
    try:
        return handler(value)
    except ValidationError:
        return None


def number_ok(value: Any) -> bool:
    """A JSON number meshplan can use: an int within 64 bits or a finite float (no bool, no string)."""
    t = type(value)
    return (t is float and math.isfinite(value)) or (t is int and -MAX_ABS_INT < value < MAX_ABS_INT)


def _finite(value: Any) -> float:
    if not number_ok(value):
        raise ValueError("must be a finite number (an integer within 64 bits or a float)")
    return float(value)


# The args keys meshplan reads and the JSON types each may hold (null always allowed: absent).
_NUM, _INT = (int, float), (int,)
ARG_TYPES: dict[str, tuple[type, ...]] = {
    "correlation": _INT, "stream": (int, str), "Input Dims": (list,), "Input type": (list,),
    "Collective name": (str,), "In msg nelems": _NUM, "dtype": (str,), "Process Group Name": (str, int),
    "Process Group Ranks": (list, str), "Seq": _NUM, "seq": _NUM, "bytes": (int, float, str), "size": (int, float, str),
    "cuda_sync_kind": (str,), "wait_on_stream": _INT, "wait_on_cuda_event_record_corr_id": _INT,
    "Concrete Inputs": (list,)}
_DECIMAL_STRING_KEYS = ("bytes", "size")  # ROCm runtime events: "bytes": "128"
_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", list: "a list"}


def arg_problem(key: str, value: Any) -> str | None:
    """Why ``args[key]`` cannot be read (None when it can, or when meshplan does not read ``key``)."""
    allowed = ARG_TYPES.get(key)
    if allowed is None or value is None:
        return None
    t = type(value)
    if t not in allowed:
        want = " or ".join(dict.fromkeys(_TYPE_NAMES[a] for a in allowed if not (a is int and float in allowed)))
        return f"args.{key}: expected {want}, got a {'boolean' if t is bool else type(value).__name__}"
    if t in _NUM and not number_ok(value):
        return f"args.{key}: not a finite number within 64 bits"
    if t is str and key in _DECIMAL_STRING_KEYS and not value.isdigit():
        return f"args.{key}: expected a count (a number or a string of digits), got {value[:20]!r}"
    return None


Info = WrapValidator(_absent_if_wrong)
Number = StrictFloat  # a JSON number, integer or not (strict: no strings, no booleans)
# JSON integers, or floats holding an integer (some writers emit 3.0): the header's rank and world size.
Integral = Annotated[StrictFloat, Field(json_schema_extra={"multipleOf": 1})]


class EventArgs(BaseModel):
    """The ``args`` keys meshplan reads (profiler/normalise.py), each of one JSON type (:data:`ARG_TYPES`); others
    kept unread."""

    model_config = ConfigDict(extra="allow")

    @model_validator(mode="before")
    @classmethod
    def _types(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key, value in data.items():
                why = arg_problem(key, value)
                if why:
                    raise ValueError(why)
        return data

    correlation: Optional[StrictInt] = None
    """Launch <-> device-op join key."""
    stream: Optional[Union[StrictInt, StrictStr]] = None
    """Device queue of a kernel or copy (2021 traces: the tid ``"stream 7"`` instead)."""
    input_dims: Optional[list] = Field(None, alias="Input Dims")
    """Shapes of a host op's inputs (nested lists)."""
    input_type: Optional[list] = Field(None, alias="Input type")
    """Dtypes of a host op's inputs: the element size of a collective annotation."""
    collective_name: Optional[StrictStr] = Field(None, alias="Collective name")
    """Collective type recorded on NCCL kernels and ``nccl:*`` annotations (PyTorch >= 2.2)."""
    in_msg_nelems: Annotated[Optional[Annotated[Number, Field(ge=0)]], Info] = Field(None, alias="In msg nelems")
    """Elements a collective sends (with ``dtype``: its bytes)."""
    dtype: Optional[StrictStr] = None
    process_group_name: Optional[Union[StrictStr, StrictInt]] = Field(None, alias="Process Group Name")
    process_group_ranks: Annotated[Optional[Union[list[StrictInt], StrictStr]], Info] = Field(
        None, alias="Process Group Ranks")
    """Global ranks of the group: a list, or the string ``"[0, 1]"`` that PyTorch 2.3-2.5 wrote."""
    seq: Optional[Number] = Field(None, alias="Seq")
    """Per-process-group sequence number (2026+ traces)."""
    seq_lower: Optional[Number] = Field(None, alias="seq")
    """The same, as some writers spell it (read when ``Seq`` is absent or not a number)."""
    bytes: Optional[Union[Number, StrictStr]] = None
    """Bytes moved by a copy (a string of digits on ROCm's runtime events: accepted, not read)."""
    size: Optional[Union[Number, StrictStr]] = None
    """Bytes moved by a copy, as older traces name it (read when ``bytes`` is absent or 0)."""
    cuda_sync_kind: Optional[StrictStr] = None
    """``Stream Wait Event`` on the ``cuda_sync`` events of newer traces (pytorch#105187)."""
    wait_on_stream: Optional[StrictInt] = None
    """The stream a ``cudaStreamWaitEvent`` waits for."""
    wait_on_cuda_event_record_corr_id: Optional[StrictInt] = None
    """Correlation of the ``cudaEventRecord`` waited for."""
    concrete_inputs: Optional[list] = Field(None, alias="Concrete Inputs")
    """Scalar arguments of a host op: ``c10d::send``/``recv_`` carry the peer rank third."""


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
    args: Optional[EventArgs] = None
    """Event arguments: an object (or absent)."""


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
