"""How a message is written to stdout.

A text line is for people: it shows any payload, what a line cannot carry escaped (as
every text view does, :func:`~eomsg.cli.output.shown_payload`), so no payload stops a
queue. JSON lines and raw payloads are exact. ``consume`` deletes a message once it has
been written, so the one format that cannot write some message at all — raw payloads
separated by a delimiter that the payload holds — refuses it with
:class:`~eomsg.errors.Unprintable` rather than writing what could not be told apart: the
message is given back, never lost to the output format."""

from __future__ import annotations

import json
from collections.abc import Callable

from eomsg.cli.output import shown_payload
from eomsg.core.message import Delivered
from eomsg.errors import Unprintable, UsageError

Format = Callable[[Delivered], bytes]
"""A message to the bytes written for it; raises Unprintable when none can be."""


def text_line(d: Delivered) -> bytes:
    """``SEQ TOPIC PAYLOAD`` and a newline: the payload as :func:`shown_payload` shows
    it, so every message is one line (never refused)."""
    m = d.message
    return f"{m.seq} {m.topic} {shown_payload(m.payload)}\n".encode()


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
