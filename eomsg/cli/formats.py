"""How a message is written to stdout: whole, or not at all.

``consume`` deletes a message once it has been written, so a format that cannot carry a
message whole (a binary payload on a text line, a payload holding the delimiter that
separates raw payloads) refuses it with :class:`~eomsg.errors.Unprintable` rather than
writing a stand-in: the message is given back, never lost to the output format."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from eomsg.core.message import Delivered
from eomsg.errors import Unprintable, UsageError

Format = Callable[[Delivered], bytes]
"""A message to the bytes that carry it whole; raises Unprintable when they cannot."""

# What would break a text line or be acted on by a terminal (tab is kept: it is text).
_NOT_ONE_LINE = re.compile(
    "[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)


def text_line(d: Delivered) -> bytes:
    """``SEQ TOPIC PAYLOAD`` and a newline, for payloads that are one line of UTF-8 text."""
    m = d.message
    try:
        text = m.payload.decode("utf-8")
    except UnicodeDecodeError:
        raise _refused(d, f"is binary ({len(m.payload)} bytes)", "--json or --raw") from None
    if _NOT_ONE_LINE.search(text):
        raise _refused(d, "is not one line of text", "--json or --raw")
    return f"{m.seq} {m.topic} {text}\n".encode()


def json_line(d: Delivered) -> bytes:
    """One JSON object per line: the message and its delivery (``payload`` as text, or
    ``payload_b64``); every message fits."""
    return (json.dumps(d.to_json(), ensure_ascii=False) + "\n").encode()


def raw(delimiter: bytes) -> Format:
    """The payload's bytes exactly, each followed by ``delimiter``; a payload holding
    the delimiter could not be told apart from two, so it is refused."""

    def write(d: Delivered) -> bytes:
        if delimiter and delimiter in d.message.payload:
            shown = delimiter.decode("latin-1").encode("unicode_escape").decode("ascii")
            raise _refused(d, f"holds the delimiter '{shown}'", "another --delimiter, or --json")
        return d.message.payload + delimiter

    return write


def parse_delimiter(text: str) -> bytes:
    """A delimiter as typed, with backslash escapes: ``\\n`` (the default), ``\\0``,
    ``\\x1e``, ``\\r\\n``; other characters stand for their UTF-8 bytes."""
    try:
        return text.encode("utf-8").decode("unicode_escape").encode("latin-1")
    except (UnicodeDecodeError, UnicodeEncodeError) as e:
        raise UsageError(f"--delimiter {text!r} is not a valid escape sequence") from e


def _refused(d: Delivered, why: str, instead: str) -> Unprintable:
    return Unprintable(
        f"message {d.message.seq} on {d.queue} {why}: given back, not deleted (use {instead})"
    )
