"""Durations as people type them (``500ms``, ``30s``, ``1h30m``, ``7d``) and back."""

from __future__ import annotations

import re

from eomsg.errors import InvalidDuration

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
MAX_SECONDS = 100 * 365 * 86400.0


def ttl_seconds(ttl: float | str | None) -> float | None:
    """A message's time to live as a publish call takes it: seconds, or a duration as
    people type it (``"1h"``, as ``eomsg publish --ttl``); None for none."""
    return parse_duration(ttl) if isinstance(ttl, str) else ttl


def parse_duration(text: str, *, allow_zero: bool = False) -> float:
    """Seconds in ``text``: a plain number of seconds or parts like ``1h30m``.

    Raises InvalidDuration for anything else, for a negative value, for zero unless
    ``allow_zero``, and for more than a hundred years.
    """
    raw = text.strip().lower() if isinstance(text, str) else ""
    seconds: float | None = None
    try:
        seconds = float(raw)
    except ValueError:
        pos, total = 0, 0.0
        for m in _PART.finditer(raw):
            if m.start() != pos:
                break
            total += float(m.group(1)) * _UNITS[m.group(2)]
            pos = m.end()
        if raw and pos == len(raw):
            seconds = total
    if seconds is None or seconds != seconds:  # None, or NaN
        raise InvalidDuration(
            f"duration {text!r} is not understood: use a number of seconds or parts like "
            "500ms, 30s, 5m, 1h30m, 7d"
        )
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise InvalidDuration(f"duration {text!r} must be greater than zero")
    if seconds > MAX_SECONDS:
        raise InvalidDuration(f"duration {text!r} is longer than 100 years")
    return seconds


def format_duration(seconds: float) -> str:
    """A short human form: ``850ms``, ``42s``, ``3m12s``, ``5h04m``, ``2d03h``."""
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"
