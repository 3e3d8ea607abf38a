"""The one exception type that the CLI turns into a single clear line and an exit code.

Library code raises :class:`MeshplanError` for anything caused by the user's input (a malformed file,
an unknown device, degrees that do not divide). The CLI prints ``error: <message>`` and exits with
``exit_code`` (2 = usage error). Anything else is a bug and keeps its traceback.
"""
from __future__ import annotations


class MeshplanError(Exception):
    """A user-facing error: one line, naming the file or value and the problem.

    Args:
        message: The line shown to the user. Name the file, the value and what was expected.
        exit_code: Process exit status (2 for bad input/usage, 1 for a failed check).
    """

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(one_line(message))
        self.exit_code = exit_code


def one_line(text: str) -> str:
    """``text`` with control characters escaped (``\\n``, ``\\x1b``): a message quoting a user's value (a key
    holding a newline, a terminal escape) stays one line and cannot rewrite the terminal."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def validation_line(exc) -> str:
    """``<field.path>: <problem>`` for the first error of a pydantic ``ValidationError``, without quoting the input
    back (a hostile value may be 1 GB), escaped and bounded so a refusal stays one short line."""
    err = exc.errors(include_url=False, include_input=False)[0]
    loc = ".".join(str(x) for x in err.get("loc", ())).encode("unicode_escape").decode()[:120] or "(top level)"
    msg = str(err.get("msg", "invalid")).encode("unicode_escape").decode()[:200]
    return f"{loc}: {msg}"
