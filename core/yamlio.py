"""Reading YAML that users hand us (plans, cluster files) within bounds: PyYAML's ``safe_load`` shares an aliased
node instead of copying it, but whatever walks the result afterwards (pydantic, ``yaml.dump``) visits it once per
reference, so nested aliases ("billion laughs") cost exponential time. Files past a byte budget or holding more
aliases than any hand-written or generated file needs are refused in one line."""
from __future__ import annotations

from pathlib import Path

import yaml

from meshplan.core.bounds import MAX_DEPTH, MAX_INT_DIGITS, check_tree
from meshplan.core.errors import MeshplanError

MAX_YAML_BYTES = 16 * 2**20  # the largest plan meshplan writes is ~0.2 MB (300 compression buckets)
MAX_ALIASES = 64  # meshplan writes none; a hand-written file may reuse a few anchors


class _BoundedLoader(yaml.SafeLoader):
    aliases = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                raise yaml.YAMLError(f"more than {MAX_ALIASES} aliases (*name references)")
        if self.check_event(yaml.SequenceStartEvent, yaml.MappingStartEvent):
            # PyYAML composes recursively: ~1,000 open brackets would end in a RecursionError, not a YAMLError
            self.depth = getattr(self, "depth", 0) + 1
            if self.depth > MAX_DEPTH:
                raise yaml.YAMLError(f"nested more than {MAX_DEPTH} levels deep")
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1
        return super().compose_node(parent, index)

    def construct_yaml_int(self, node):
        digits = len(str(node.value).lstrip("+-").replace("_", ""))
        if digits > MAX_INT_DIGITS:
            raise yaml.YAMLError(f"an integer of {digits} digits at line {node.start_mark.line + 1}; expected "
                                 "one below 2^64")
        return super().construct_yaml_int(node)


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)


def load_yaml_file(path: str | Path, where: str | None = None):
    """Parse a YAML file a user gave (``where`` names it in errors, default the path).

    Raises:
        MeshplanError: unreadable, larger than ``MAX_YAML_BYTES``, not YAML, too many aliases, or past a bound of
            ``core.bounds`` (nesting depth, integer size, a float that is not finite).
    """
    p = Path(path)
    where = where or str(p)
    try:
        size = p.stat().st_size
        if size > MAX_YAML_BYTES:
            raise MeshplanError(f"{where}: {size:,} bytes, larger than the {MAX_YAML_BYTES:,} a plan or cluster "
                                "file may be")
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise
    except UnicodeDecodeError:
        raise MeshplanError(f"{where}: not UTF-8 text") from None
    except IsADirectoryError:
        raise MeshplanError(f"{where}: is a folder, not a YAML file") from None
    except OSError as exc:
        raise MeshplanError(f"{where}: cannot read ({exc.strerror})") from None
    try:
        doc = yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise MeshplanError(f"{where}: not valid YAML ({str(exc).splitlines()[0]})") from None
    return check_tree(doc, where)  # integers within 64 bits, floats finite (.inf, .nan refused)


# libyaml's C parser where PyYAML was built with it (the same YAML 1.1 safe schema, ~10x faster), else PyYAML's own
_PACKAGED_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_packaged(text: str):
    """Parse a YAML file meshplan ships (the device catalogue, the link families, the preset index): trusted text
    read on every run, so the fastest safe parser (a cluster's loading was 60-90 ms of pure-Python parsing)."""
    return yaml.load(text, Loader=_PACKAGED_LOADER)  # noqa: S506 - a safe loader (SafeLoader or CSafeLoader)
