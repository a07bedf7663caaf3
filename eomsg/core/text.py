"""What eomsg stores as text: a string that is UTF-8 text.

Python holds bytes it could not decode (an argument typed in another encoding, a file
name) as lone surrogates, which no UTF-8 store, wire or terminal can carry. Every string
that reaches the store is checked with :func:`is_text` first, so such input is a typed
error that changes nothing — never a failed write that stops the store."""

from __future__ import annotations

import re

_SURROGATE = re.compile("[\ud800-\udfff]")


def is_text(value: object) -> bool:
    """Whether ``value`` is a string that encodes as UTF-8 (no lone surrogates)."""
    return isinstance(value, str) and not _SURROGATE.search(value)
