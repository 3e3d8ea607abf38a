"""Units written by users: bandwidths (``25Gbps``, ``50GB/s``) and sizes (``25MB``, ``4MiB``), parsed in one place."""
from __future__ import annotations

import re

from meshplan.core.errors import MeshplanError

_BW_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?\d+)?)\s*([kmgt]?)(i?)(b|bit|byte)(?:ps|/s|its/s|it/s|ytes/s)?\s*$",
                    re.IGNORECASE)
_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_BIN_PREFIX = {"": 1.0, "k": 2.0**10, "m": 2.0**20, "g": 2.0**30, "t": 2.0**40}


def parse_bandwidth(text: str) -> float:
    """Parse a bandwidth such as ``25Gbps``, ``400Gb/s``, ``50GB/s``, ``1.5TB/s`` or ``10GiB/s`` into bytes/s.

    Lower-case ``b``/``bit`` is bits, upper-case ``B``/``byte`` is bytes; prefixes are decimal (network
    convention) unless written ``Ki``/``Mi``/``Gi``/``Ti``.

    Raises:
        MeshplanError: not a positive number with a unit.
    """
    raw = str(text)
    m = _BW_RE.match(raw.replace("bits", "bit"))
    if not m:
        raise MeshplanError(f"bandwidth '{raw}': expected a number and a unit, e.g. 25Gbps, 400Gb/s, 50GB/s")
    value, prefix, binary, unit = float(m.group(1)), m.group(2).lower(), m.group(3), m.group(4)
    if unit == "b" or unit.lower() == "bit":
        per_unit = 1 / 8  # bits
    elif unit == "B" or unit.lower() == "byte":
        per_unit = 1.0
    else:  # pragma: no cover - the regex admits only the forms above
        raise MeshplanError(f"bandwidth '{raw}': unknown unit {unit!r}")
    scale = (_BIN_PREFIX if binary else _PREFIX)[prefix]
    bw = value * scale * per_unit
    if not bw > 0:
        raise MeshplanError(f"bandwidth '{raw}': must be positive")
    return bw


_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "kib": 2**10, "m": 1e6, "mb": 1e6, "mib": 2**20, "g": 1e9,
               "gb": 1e9, "gib": 2**30, "t": 1e12, "tb": 1e12, "tib": 2**40}


def parse_size(text: str, default_unit: str = "b") -> float:
    """Parse a size such as ``25MB``, ``4MiB``, ``1e6`` (bytes unless ``default_unit`` says otherwise) into bytes.

    Prefixes are decimal (``MB`` = 10^6) unless written ``KiB``/``MiB``/``GiB``/``TiB``; case is ignored.

    Raises:
        MeshplanError: not a positive number with an optional unit.
    """
    raw = str(text)
    m = _SIZE_RE.match(raw)
    unit = ((m.group(2) or default_unit) if m else "").lower()
    if not m or unit not in _SIZE_UNITS:
        raise MeshplanError(f"size '{raw}': expected a number and an optional unit, e.g. 25MB, 4MiB, 1000000")
    size = float(m.group(1)) * _SIZE_UNITS[unit]
    if not size > 0 or size == float("inf"):
        raise MeshplanError(f"size '{raw}': must be a positive, finite number of bytes")
    return size


# PyTorch's and NumPy's names for the math dtypes meshplan prices (``torch.bfloat16`` -> ``bf16``). fp8 means the
# e4m3 forward / e5m2 gradient formats Transformer Engine and torchao train with.
DTYPE_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32",
                 "single": "fp32", "float8": "fp8", "float8_e4m3fn": "fp8", "e4m3": "fp8", "fp8_e4m3": "fp8"}


def canonical_dtype(text: str) -> str:
    """``bfloat16`` -> ``bf16``, ``torch.float16`` -> ``fp16``, ``FP32`` -> ``fp32``; other names are returned
    lower-cased (the device then says whether it has that math)."""
    name = str(text).strip().lower().removeprefix("torch.")
    return DTYPE_ALIASES.get(name, name)
