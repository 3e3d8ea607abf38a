"""Streaming reader for Chrome/Kineto trace JSON: yields ``traceEvents`` one at a time.

A 500 MB trace parsed with ``json.load`` needs several GB (the raw text plus one dict per event, all alive at
once). This reader walks the top-level object itself, keeps a bounded text window (a few MB), decodes one event
at a time with :meth:`json.JSONDecoder.raw_decode` and hands it to the caller, so the caller's compact records
are the only thing that grows. Standard library only (no ijson needed).

Bounds (hostile input): one JSON value (an event, a header field) may hold at most
``MAX_VALUE_CHARS`` characters, so a gzip bomb that decompresses to one 2 GiB string is refused after 64 Mi
characters instead of filling memory; the decompressed text may be at most ``max_bytes`` (default: a budget from
the compressed size, :func:`byte_budget`); nesting deeper than the decoder's recursion limit is refused. Each is
one :class:`MeshplanError` naming the file.
"""
from __future__ import annotations

import gzip
import io
import json
import re
import zlib
from pathlib import Path
from typing import Any, Callable

from meshplan.core.errors import MeshplanError

_CHUNK_CHARS = 1 << 20  # 1 Mi characters read per refill
_NON_WS = re.compile(r"[^ \t\n\r]")
# Largest single event or header value: real events are a few KB; templated kernel names and long stacks reach
# ~100 KB; 64 Mi characters is ~600x that and bounds the window (and peak memory) of a hostile file.
MAX_VALUE_CHARS = 64 << 20
# Decompressed bytes allowed per compressed byte. Kineto JSON compresses 8-30x with gzip -6/-9 (the shared traces:
# 8.7x-29x); deflate itself cannot exceed ~1032x. 200x leaves room for any real trace and stops bombs early.
MAX_RATIO = 200
MIN_BUDGET_BYTES = 256 << 20  # small files may always expand to this much


def byte_budget(path: str | Path) -> int:
    """Decompressed-size budget of a trace file: ``max(MIN_BUDGET_BYTES, MAX_RATIO * file size)``."""
    try:
        size = Path(path).stat().st_size
    except OSError:
        size = 0
    return max(MIN_BUDGET_BYTES, MAX_RATIO * size)


def open_text(path: str | Path) -> io.TextIOBase:
    """Open a ``.json`` or ``.json.gz`` (detected by magic bytes, not the suffix) as UTF-8 text."""
    p = Path(path)
    with open(p, "rb") as fh:
        magic = fh.read(2)
    if magic == b"\x1f\x8b":
        return io.TextIOWrapper(gzip.open(p, "rb"), encoding="utf-8", errors="replace")
    return open(p, "r", encoding="utf-8", errors="replace")


class _Window:
    """A sliding text window over a file: ``buf[pos:]`` is unread text."""

    def __init__(self, fh: io.TextIOBase, label: str, max_chars: int):
        self.fh, self.label, self.max_chars = fh, label, max_chars
        self.buf, self.pos, self.eof = "", 0, False
        self.read_chars = 0

    def fill(self, grow: bool = False) -> bool:
        """Append the next chunk; False at end of file. Truncated/corrupt gzip becomes a MeshplanError.

        ``grow``: a value is incomplete; read as much again as is pending (doubling, so decoding a large value
        costs linear, not quadratic, time), up to ``MAX_VALUE_CHARS`` pending.
        """
        if self.eof:
            return False
        pending = len(self.buf) - self.pos
        if grow and pending >= MAX_VALUE_CHARS:
            raise MeshplanError(f"{self.label}: one JSON value is larger than {MAX_VALUE_CHARS >> 20} Mi characters "
                                f"(at character {self.read_chars - pending}); not a trace event")
        want = max(_CHUNK_CHARS, pending) if grow else _CHUNK_CHARS
        try:
            chunk = self.fh.read(want)
        except (EOFError, OSError, zlib.error, gzip.BadGzipFile) as exc:
            raise MeshplanError(f"{self.label}: truncated or corrupt gzip ({exc})") from None
        if not chunk:
            self.eof = True
            return False
        self.read_chars += len(chunk)
        if self.read_chars > self.max_chars:
            raise MeshplanError(f"{self.label}: more than {self.max_chars / 1e6:.0f} MB of text after decompression "
                                f"(limit {MAX_RATIO}x the file size): refused as a decompression bomb")
        if self.pos > _CHUNK_CHARS:  # drop consumed text so the window stays bounded
            self.buf, self.pos = self.buf[self.pos:], 0
        self.buf += chunk
        return True

    def peek(self) -> str:
        """Next non-whitespace character ('' at end of file), without consuming it."""
        while True:
            m = _NON_WS.search(self.buf, self.pos)  # C-speed skip over the indentation between events
            if m is not None:
                self.pos = m.start()
                return self.buf[self.pos]
            self.pos = len(self.buf)
            if not self.fill():
                return ""

    def expect(self, ch: str) -> None:
        got = self.peek()
        if got != ch:
            raise MeshplanError(f"{self.label}: not a Kineto/Chrome trace JSON (expected {ch!r}, found "
                                f"{got or 'end of file'!r} at character {self.pos})")
        self.pos += 1

    def value(self, decoder: json.JSONDecoder) -> Any:
        """Decode the next JSON value, refilling the window until it is complete."""
        self.peek()
        while True:
            try:
                obj, end = decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                if self.fill(grow=True):
                    continue
                raise MeshplanError(f"{self.label}: malformed JSON ({exc.msg}) — file truncated?") from None
            except RecursionError:
                raise MeshplanError(f"{self.label}: JSON nested too deeply (at character {self.pos}); "
                                    f"not a trace event") from None
            except ValueError as exc:  # an integer of more than 4,300 digits (Python's int parsing limit)
                raise MeshplanError(f"{self.label}: {str(exc).split(':')[0]} (at character {self.pos}); not a "
                                    "trace event") from None
            # A number cut at the window edge decodes "successfully" as a shorter number: read on to be sure.
            if end >= len(self.buf) and not self.eof and self.fill(grow=True):
                continue
            self.pos = end
            return obj


def stream_trace(path: str | Path, on_event: Callable[[dict], None], max_bytes: int | None = None,
                 stop_at_events: bool = False) -> dict[str, Any]:
    """Parse a trace file, calling ``on_event`` for every element of ``traceEvents``.

    Args:
        path: ``.json`` or ``.json.gz`` Chrome/Kineto trace.
        on_event: Called once per event dict (the dict is not kept by this reader).
        max_bytes: Decompressed-text budget (default :func:`byte_budget`).
        stop_at_events: Return the header keys written before ``traceEvents`` without reading the events (a
            cheap peek at ``distributedInfo``, which Kineto writes first).

    Returns:
        The other top-level keys (``distributedInfo``, ``deviceProperties``, ``baseTimeNanoseconds`` ...).

    Raises:
        MeshplanError: Not JSON, not an object with ``traceEvents``, truncated gzip or JSON.
    """
    label = str(path)
    try:
        fh = open_text(path)
    except OSError as exc:
        raise MeshplanError(f"{label}: cannot read ({exc.strerror or exc})") from None
    dec = json.JSONDecoder()
    header: dict[str, Any] = {}
    saw_events = False
    with fh:
        w = _Window(fh, label, max_bytes if max_bytes is not None else byte_budget(path))
        first = w.peek()
        if first == "[":  # a bare JSON array of events is also valid Chrome trace format
            saw_events = True
            if stop_at_events:
                return header
            _stream_array(w, dec, on_event)
        else:
            w.expect("{")
            while True:
                if w.peek() == "}":
                    w.pos += 1
                    break
                key = w.value(dec)
                if not isinstance(key, str):
                    raise MeshplanError(f"{label}: not a Kineto/Chrome trace JSON (object key expected)")
                w.expect(":")
                if key == "traceEvents":
                    saw_events = True
                    if stop_at_events:
                        return header
                    _stream_array(w, dec, on_event)
                else:
                    header[key] = w.value(dec)
                nxt = w.peek()
                if nxt == ",":
                    w.pos += 1
                elif nxt == "}":
                    w.pos += 1
                    break
                else:
                    raise MeshplanError(f"{label}: malformed JSON after key {key!r} — file truncated?")
    if not saw_events:
        keys = ", ".join(sorted(header)[:6])
        what = " (looks like a PyTorch execution trace)" if "nodes" in header and "schema" in header else ""
        raise MeshplanError(f"{label}: not a Kineto trace: no traceEvents (top-level keys: {keys}){what}")
    return header


def _stream_array(w: _Window, dec: json.JSONDecoder, on_event: Callable[[dict], None]) -> None:
    if w.peek() != "[":
        raise MeshplanError(f"{w.label}: traceEvents is not a list (found {w.peek() or 'end of file'!r} at character "
                            f"{w.pos})")
    w.expect("[")
    if w.peek() == "]":
        w.pos += 1
        return
    while True:
        ev = w.value(dec)
        if isinstance(ev, dict):
            on_event(ev)
        nxt = w.peek()
        if nxt == ",":
            w.pos += 1
        elif nxt == "]":
            w.pos += 1
            return
        else:
            raise MeshplanError(f"{w.label}: malformed traceEvents array — file truncated?")
