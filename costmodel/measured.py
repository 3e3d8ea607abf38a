"""meshplan's own GPU measurements, kept as data (``costmodel/data/measured/*.json``, with its README), and the
reader of the published ones (``costmodel/data/published/*.json``).

Each file is the unedited output of one run of a script in ``bench/`` on one lent GPU, and names its kind in
``schema``: ``meshplan.gpu_kernels/1`` (``bench/gpu_kernels.py``: grouped GEMMs, permute, attention, casts) or
``meshplan.gpu_sustained/1`` (``bench/gpu_sustained.py``: rates held for tens of seconds, launch costs, fp8 recipes)
or ``meshplan.gpu_varlen/1`` (``bench/gpu_varlen.py``: per-document attention over packed sequences, host time per
op) or ``meshplan.gpu_rope/1`` (``bench/gpu_rope.py``: Megatron-Core's unfused RoPE chain against one copy pass).
"""
from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

FOLDER = "data/measured"
KERNELS = "meshplan.gpu_kernels/1"
SUSTAINED = "meshplan.gpu_sustained/1"
VARLEN = "meshplan.gpu_varlen/1"
ROPE = "meshplan.gpu_rope/1"


@lru_cache(maxsize=4)
def _all() -> tuple[tuple[str, dict], ...]:
    folder = resources.files("meshplan.costmodel").joinpath(FOLDER)
    return tuple((e.name, json.loads(e.read_text(encoding="utf-8")))
                 for e in sorted(folder.iterdir(), key=lambda p: p.name) if e.name.endswith(".json"))


def measured_files(schema: str = KERNELS) -> dict[str, dict]:
    """File name -> the parsed measurement file, for every file of ``schema``. Callers get their own dicts' keys
    but share the parsed contents: read, never change them."""
    return {name: data for name, data in _all() if data.get("schema") == schema}


@lru_cache(maxsize=None)
def published_file(name: str) -> dict:
    """``costmodel/data/published/<name>``, parsed once per process (callers read it, never change it)."""
    return json.loads(resources.files("meshplan.costmodel").joinpath("data/published", name).read_text(
        encoding="utf-8"))
