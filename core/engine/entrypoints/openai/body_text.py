"""Lone UTF-16 surrogates in a JSON body: found in the raw bytes, refused with a 400.

JSON may spell a code point as ``\\ud83d\\ude00`` (a surrogate pair); a lone half such as
``"a\\ud800b"`` parses to a Python string that no encoder accepts, so the tokenizer, the
log or the error writer would fail later with a 500. ``json.loads`` of bytes also lets the
raw (invalid UTF-8) encoding of a surrogate through. One regex pass over the buffered
body finds both before anything parses it.
"""

from __future__ import annotations

import re

# ``\uD800``-``\uDFFF`` escapes (hex in either case) and raw UTF-8 encodings of surrogates.
_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}|\xed[\xa0-\xbf]")
_LOW = re.compile(rb"\\u[dD][c-fC-F][0-9a-fA-F]{2}")


def _is_escape(body: bytes, start: int) -> bool:
    """Whether the backslash at ``start`` begins an escape (an even run of ``\\`` before it)."""
    num_backslashes = 0
    i = start - 1
    while i >= 0 and body[i] == 0x5C:
        num_backslashes += 1
        i -= 1
    return num_backslashes % 2 == 0


def find_lone_surrogate(body: bytes) -> int | None:
    """Byte offset of the first lone surrogate in a JSON ``body``, or None."""
    paired_low = -1
    for match in _ESCAPE.finditer(body):
        start = match.start()
        if body[start] == 0xED:
            return start
        if start == paired_low or not _is_escape(body, start):
            continue
        if body[start + 3] in b"89abAB" and _LOW.match(body, start + 6):
            paired_low = start + 6
            continue
        return start
    return None


def lone_surrogate_message(body: bytes, offset: int) -> str:
    escape = body[offset : offset + 6].decode("latin-1")
    shown = escape if escape.startswith("\\u") else "a raw UTF-8 encoded surrogate"
    return (
        f"The request body holds a lone UTF-16 surrogate ({shown} at byte {offset}), which is "
        "not valid Unicode text. Send valid UTF-8; a character outside the Basic "
        "Multilingual Plane is escaped as a high-low pair such as \\ud83d\\ude00."
    )
