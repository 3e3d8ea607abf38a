"""Streaming reader for Chrome/Kineto trace JSON: yields ``traceEvents`` one at a time.

A 500 MB trace parsed with ``json.load`` needs several GB (the raw text plus one dict per event, all alive at
once). This reader walks the top-level object itself, keeps a bounded text window (a few MB), decodes one event
at a time with :meth:`json.JSONDecoder.raw_decode` and hands it to the caller, so the caller's compact records
are the only thing that grows. Standard library only (no ijson needed).
"""
from __future__ import annotations

import gzip
import io
import json
import zlib
from pathlib import Path
from typing import Any, Callable

from meshplan.core.errors import MeshplanError

_CHUNK_CHARS = 1 << 20  # 1 Mi characters read per refill
_WS = " \t\n\r"


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

    def __init__(self, fh: io.TextIOBase, label: str):
        self.fh, self.label = fh, label
        self.buf, self.pos, self.eof = "", 0, False

    def fill(self) -> bool:
        """Append the next chunk; False at end of file. Truncated/corrupt gzip becomes a MeshplanError."""
        if self.eof:
            return False
        try:
            chunk = self.fh.read(_CHUNK_CHARS)
        except (EOFError, OSError, zlib.error) as exc:
            raise MeshplanError(f"{self.label}: truncated or corrupt gzip ({exc})") from None
        if not chunk:
            self.eof = True
            return False
        if self.pos > _CHUNK_CHARS:  # drop consumed text so the window stays bounded
            self.buf, self.pos = self.buf[self.pos:], 0
        self.buf += chunk
        return True

    def peek(self) -> str:
        """Next non-whitespace character ('' at end of file), without consuming it."""
        while True:
            buf, n = self.buf, len(self.buf)
            while self.pos < n and buf[self.pos] in _WS:
                self.pos += 1
            if self.pos < n:
                return buf[self.pos]
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
                if self.fill():
                    continue
                raise MeshplanError(f"{self.label}: malformed JSON ({exc.msg}) — file truncated?") from None
            # A number cut at the window edge decodes "successfully" as a shorter number: read on to be sure.
            if end >= len(self.buf) and not self.eof and self.fill():
                continue
            self.pos = end
            return obj


def stream_trace(path: str | Path, on_event: Callable[[dict], None]) -> dict[str, Any]:
    """Parse a trace file, calling ``on_event`` for every element of ``traceEvents``.

    Args:
        path: ``.json`` or ``.json.gz`` Chrome/Kineto trace.
        on_event: Called once per event dict (the dict is not kept by this reader).

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
        w = _Window(fh, label)
        first = w.peek()
        if first == "[":  # a bare JSON array of events is also valid Chrome trace format
            saw_events = True
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
