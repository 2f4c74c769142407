"""Console output helpers shared by the providers' ``output`` (``costopt.cloud.CloudProvider.output``)."""

from __future__ import annotations

import base64
import binascii
import contextlib

__all__ = ["decode_console", "tail_lines"]


def tail_lines(text: str, tail: int | None) -> str:
    """The last ``tail`` lines of ``text`` (None: all of it; 0: ""), each ending in a newline."""
    if tail is not None and tail < 0:
        raise ValueError(f"tail must be >= 0 lines, got {tail}")
    lines = text.splitlines()
    if tail is not None:
        lines = lines[len(lines) - tail :] if tail else []
    return "".join(line + "\n" for line in lines)


def decode_console(value: str | bytes | None) -> str:
    """EC2's console output (base64 in the API answer) as text; text that is not base64 is kept as it is,
    undecodable bytes are replaced."""
    if not value:
        return ""
    raw = value.encode() if isinstance(value, str) else value
    with contextlib.suppress(binascii.Error, ValueError):
        raw = base64.b64decode(raw, validate=True)
    return raw.decode("utf-8", errors="replace")
