"""Read-only views of parsed data, for loaders that cache what they read: a caller that changes what it got would
otherwise change what every later caller gets."""
from __future__ import annotations

from types import MappingProxyType
from typing import Any


def freeze(value: Any) -> Any:
    """``value`` with every dict made a read-only mapping and every list a tuple, all the way down."""
    if isinstance(value, dict):
        return MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value
