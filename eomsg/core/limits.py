"""What a message may be: the checks every publish passes before anything is written; and
how large a frame must be to carry one.

Frames: each end of a connection says in its handshake the largest frame it accepts, and
a sender never sends more (see :mod:`eomsg.wire.protocol`). A node accepts frames of
``serve --max-frame``, or — left out — of :func:`frame_for` its ``max-payload`` (at least
:data:`DEFAULT_MAX_FRAME`), so every payload it takes fits a frame it accepts; a
``--max-frame`` that cannot carry ``max-payload`` is refused (:func:`check_frame`). A
client accepts :data:`MAX_FRAME`: whatever a node may hold, it can receive."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TypeVar

from eomsg.core.message import Publishable
from eomsg.core.text import is_text
from eomsg.core.topics import validate_topic
from eomsg.errors import (
    InvalidConfig,
    InvalidDuration,
    InvalidHeader,
    InvalidInput,
    PayloadTooLarge,
)

DEFAULT_MAX_PAYLOAD = 1024 * 1024
MAX_ID_LENGTH = 256
MAX_HEADERS_BYTES = 64 * 1024
MAX_MAX_PAYLOAD = 512 << 20  # the largest max-payload a node may be set to
DEFAULT_MAX_FRAME = 4 << 20  # a node's frame limit while its max-payload needs no more
MAX_FRAME = 1 << 30  # the largest frame limit anyone may say; what a client accepts
MIN_FRAME = 64 << 10  # the smallest frame limit a peer may say (an error must fit)
HANDSHAKE_FRAME = 64 << 10  # what a node accepts before the first frame (a hello) is read
# Bytes a frame carrying one message holds besides its payload, at most: the topic (255
# characters), the id (256), headers (64 Ki characters of names and values, each
# character up to 4 bytes of UTF-8, and a few bytes of framing per header) and the
# frame's own fields, with room to spare.
FRAME_OVERHEAD = 1 << 20
_HEADER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")
_SIZE = re.compile(r"(\d{1,30})\s*([kmgtp]i?b|[kmgtp]|b)?", re.IGNORECASE)
# As written: SI units are powers of 1000 (``10MB`` is 10,000,000 bytes), IEC units powers
# of 1024 (``10MiB``); a bare letter (``64m``) is IEC, as in most tools' size options.
_SIZE_UNITS: dict[str, int] = {"b": 1} | {
    unit: base**power
    for power, letter in enumerate("kmgtp", start=1)
    for unit, base in ((f"{letter}b", 1000), (f"{letter}ib", 1024), (letter, 1024))
}

P = TypeVar("P", bound=Publishable)


def parse_size(text: str, *, low: int = 1, high: int = MAX_MAX_PAYLOAD) -> int:
    """Bytes in ``text`` (``65536``, ``64KiB``, ``1MiB``, ``2GiB``; ``10MB`` is 10**7),
    between ``low`` and ``high`` (by default 1 byte and :data:`MAX_MAX_PAYLOAD`, 512 MiB)."""
    m = _SIZE.fullmatch(text.strip())
    if m is None:
        raise InvalidConfig(
            f"size {text!r} is not understood: use bytes, KiB/MiB/GiB/TiB/PiB (powers of "
            "1024) or kB/MB/GB/TB/PB (powers of 1000), e.g. 1MiB"
        )
    size = int(m.group(1)) * _SIZE_UNITS[(m.group(2) or "b").lower()]
    if not low <= size <= high:
        raise InvalidConfig(f"size {text!r} must be between {_show(low)} and {_show(high)}")
    return size


def frame_for(max_payload: int) -> int:
    """The smallest frame limit that carries every message of up to ``max_payload``
    bytes of payload."""
    return max_payload + FRAME_OVERHEAD


def default_frame(max_payload: int) -> int:
    """A node's frame limit when ``serve --max-frame`` is left out: what its
    ``max-payload`` needs, and at least :data:`DEFAULT_MAX_FRAME`."""
    return max(DEFAULT_MAX_FRAME, frame_for(max_payload))


def check_frame(max_frame: int, max_payload: int) -> None:
    """InvalidConfig, naming both settings, if a payload of ``max_payload`` bytes cannot
    travel in a frame of ``max_frame`` bytes: a publish within the limit would be
    refused by the node's frame limit."""
    need = frame_for(max_payload)
    if max_frame < need:
        smaller = max_frame - FRAME_OVERHEAD
        raise InvalidConfig(
            f"max-payload {_show(max_payload)} does not fit in frames of --max-frame "
            f"{_show(max_frame)} (such a payload needs frames of {_show(need)}): give "
            f"--max-frame {_size_arg(need)} or more (or leave it out: frames then follow "
            "max-payload)"
            + (f", or set max-payload {_show(smaller)} or less" if smaller > 0 else "")
        )


_UNITS = ((1 << 50, "PiB"), (1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))


def format_bytes(size: int) -> str:
    """A size as people read it: ``812 B``, ``12.3 KiB``, ``4.0 MiB``."""
    for unit, name in _UNITS:
        if size >= unit:
            return f"{size / unit:.1f} {name}"
    return f"{size} B"


def _show(size: int) -> str:
    for unit, name in _UNITS:
        if size >= unit and size % unit == 0:
            return f"{size // unit} {name}"
    return "1 byte" if size == 1 else f"{size} bytes"


def _size_arg(size: int) -> str:
    """``size`` as an argument parse_size takes, rounded up to whole KiB or MiB."""
    if size >= 1 << 20:
        return f"{-(-size // (1 << 20))}MiB"
    return f"{-(-size // 1024)}KiB"


# A message's expiry must be a time the store can hold (DuckDB's timestamps end in the
# year 294247); the journal acknowledges it before DuckDB sees it, so it is bounded here.
MAX_TTL = 100 * 365.25 * 86400


@dataclass(frozen=True)
class Limits:
    """Per-node limits on what a publish may carry."""

    max_payload: int = DEFAULT_MAX_PAYLOAD


def check_outgoing(msg: P, limits: Limits) -> P:
    """Return ``msg`` if it may be published, else raise the InvalidInput that says why.

    Pure and side-effect free, so a batch is checked whole before any of it is written.
    """
    validate_topic(msg.topic)
    if not isinstance(msg.payload, bytes):
        raise InvalidInput("payload must be bytes (encode text as UTF-8 first)")
    if len(msg.payload) > limits.max_payload:
        raise PayloadTooLarge(
            f"payload of {len(msg.payload)} bytes exceeds the limit of {limits.max_payload} "
            "bytes; store large data elsewhere and publish a reference"
        )
    if msg.id is not None and (
        not isinstance(msg.id, str)
        or not 0 < len(msg.id) <= MAX_ID_LENGTH
        or not msg.id.isprintable()
    ):
        raise InvalidInput(f"message id must be 1-{MAX_ID_LENGTH} printable characters")
    if msg.ttl is not None and not (
        isinstance(msg.ttl, int | float) and math.isfinite(msg.ttl) and 0 < msg.ttl <= MAX_TTL
    ):
        raise InvalidDuration(
            f"ttl {msg.ttl!r} must be a positive number of seconds, at most {MAX_TTL:.0f} "
            "(100 years; leave it out for a message that never expires)"
        )
    if msg.headers:
        size = 0
        for name, value in msg.headers.items():
            if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name):
                raise InvalidHeader(
                    f"header name {name!r} must be 1-128 letters, digits, '_', '.' or '-'"
                )
            if not is_text(value):
                raise InvalidHeader(f"header {name!r} must have a UTF-8 text value")
            size += len(name) + len(value)
        if size > MAX_HEADERS_BYTES:
            raise InvalidHeader(f"headers exceed {MAX_HEADERS_BYTES} bytes")
    return msg
