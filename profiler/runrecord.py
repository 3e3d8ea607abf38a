"""The ``run.json`` of a ``meshplan profile`` run folder, as a typed model (pydantic) with physical limits.

:func:`profiler.capture.load_run_json` is the one reader: it parses the file (size, encoding and depth bounded),
validates it with :class:`RunRecord` and returns the plain dict every consumer already reads. A field of the
wrong type or out of range is one line naming the file and the field (never a traceback, never a 1 GB message
quoting the input back).
"""
from __future__ import annotations

import math
import shlex
from typing import Any, Optional, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from meshplan.core.bounds import NonNegFloat
from meshplan.core.errors import MeshplanError, validation_line
from meshplan.profiler.trace import MAX_WORLD_SIZE

MAX_RUN_JSON_BYTES = 64 << 20  # a 1,024-rank run.json with 10^3 steps per rank is ~20 MB
MAX_STEPS_PER_RANK = 1_000_000


def _finite_positive(name: str, xs: list[float]) -> list[float]:
    for x in xs:
        if not (isinstance(x, (int, float)) and math.isfinite(x) and x > 0):
            raise ValueError(f"{name} must be finite and > 0 (got {x!r:.30})")
    return xs


def _inside(what: str, name: str) -> str:
    """A file of the run folder itself: no absolute path, no '..', not empty."""
    parts = name.replace("\\", "/").split("/")
    if name.startswith("/") or ".." in parts or not name or len(name) > 255:
        raise ValueError(f"{what} {name!r:.60} is not a file name inside the run folder")
    return name


class RunRecord(BaseModel):
    """``run.json`` (format ``meshplan-run/1``). Unknown keys are kept as they are (``extra="allow"``)."""

    model_config = ConfigDict(extra="allow", strict=False)

    format: Optional[str] = None
    world_size: int = Field(ge=1, le=MAX_WORLD_SIZE)
    backend: Optional[str] = None
    devices: dict[str, Optional[str]] = Field(default_factory=dict)
    hostnames: dict[str, Optional[str]] = Field(default_factory=dict)
    pinned_cores: dict[str, Optional[int]] = Field(default_factory=dict)
    warmup_steps_skipped: Optional[int] = Field(default=None, ge=0)
    steps_requested: Optional[int] = Field(default=None, ge=0)
    step_times_s: dict[str, list[float]]
    unprofiled_steps_requested: int = Field(default=0, ge=0)
    unprofiled_step_times_s: dict[str, list[float]] = Field(default_factory=dict)
    peak_memory_bytes: dict[str, Optional[NonNegFloat]] = Field(default_factory=dict)
    max_rss_bytes: Union[None, NonNegFloat, dict[str, Optional[NonNegFloat]]] = None
    traces: dict[str, str] = Field(default_factory=dict)
    ranks_missing: list[int] = Field(default_factory=list)
    # what the launcher recorded (profiler.capture_launch): read by verify.measured to find the run's plan and
    # trainer flags, so typed too (a string where a list belongs was a TypeError there)
    argv: Union[None, list[StrictStr], StrictStr] = None
    """The trainer's arguments: a list, or one shell-quoted string (split as a shell would)."""
    command: Optional[StrictStr] = None
    torchrun: Optional[list[StrictStr]] = None
    script: Optional[StrictStr] = None
    plan: Optional[StrictStr] = None
    plan_copy: Optional[StrictStr] = None
    pinned: Optional[StrictBool] = None
    nproc_per_node: Optional[int] = Field(default=None, ge=1, le=MAX_WORLD_SIZE)
    nnodes: Optional[int] = Field(default=None, ge=1, le=MAX_WORLD_SIZE)

    @field_validator("argv")
    @classmethod
    def _argv_words(cls, v: Union[None, list[str], str]) -> Optional[list[str]]:
        if isinstance(v, str):
            try:
                return shlex.split(v)
            except ValueError as exc:  # "No closing quotation"
                raise ValueError(f"not a shell command line ({exc}); expected a list of words or one quoted "
                                 "string") from None
        return v

    @field_validator("step_times_s", "unprofiled_step_times_s")
    @classmethod
    def _times(cls, v: dict[str, list[float]], info) -> dict[str, list[float]]:
        for k, xs in v.items():
            if len(xs) > MAX_STEPS_PER_RANK:
                raise ValueError(f"rank {k}: {len(xs)} steps, more than {MAX_STEPS_PER_RANK}")
            _finite_positive(f"rank {k}'s step times", xs)
        return v

    @field_validator("traces")
    @classmethod
    def _trace_names(cls, v: dict[str, str]) -> dict[str, str]:
        for k, name in v.items():
            _inside(f"rank {k}: trace file", name)
        return v

    @field_validator("plan_copy")
    @classmethod
    def _plan_copy_inside(cls, v: Optional[str]) -> Optional[str]:
        return v if v is None else _inside("plan copy", v)

    @model_validator(mode="after")
    def _ranks_in_world(self) -> "RunRecord":
        for field in ("step_times_s", "unprofiled_step_times_s", "traces", "devices", "hostnames"):
            for k in getattr(self, field):
                if not k.isdigit() or int(k) >= self.world_size:
                    raise ValueError(f"{field}: rank {k!r:.20} is not a rank of world size {self.world_size}")
        return self


def validate_run_record(raw: Any, label: str) -> dict[str, Any]:
    """Validate a decoded ``run.json``; returns it as a dict (validated fields normalised, others kept).

    Raises:
        MeshplanError: ``<label>: <field>: <problem>`` for the first problem found.
    """
    if not isinstance(raw, dict):
        raise MeshplanError(f"{label}: not a meshplan run record (a JSON {type(raw).__name__}, not an object)")
    if "step_times_s" not in raw:
        raise MeshplanError(f"{label}: not a meshplan run record (no step_times_s)")
    try:
        rec = RunRecord.model_validate(raw)
    except ValidationError as exc:
        raise MeshplanError(f"{label}: {validation_line(exc)}") from None
    return rec.model_dump()
