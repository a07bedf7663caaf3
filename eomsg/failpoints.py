"""Failpoints: named places where a test can make this process crash or fail on purpose.

``EOMSG_FAILPOINTS="publish.after_commit=crash@3,store.commit.before=error"`` makes the
third pass through ``publish.after_commit`` kill the process with SIGKILL (no cleanup, no
flush — as a power cut would) and every pass through ``store.commit.before`` raise;
``stop`` pauses the process there with SIGSTOP, for a test to act (crash a server, say)
at a known step and then continue it. Unset, a failpoint costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

from eomsg.errors import EomsgError

ENV = "EOMSG_FAILPOINTS"


class FailpointError(EomsgError):
    """A failpoint set to ``error`` was reached."""

    code = "failpoint"


def _parse(spec: str) -> dict[str, tuple[str, int]]:
    points: dict[str, tuple[str, int]] = {}
    for item in filter(None, (p.strip() for p in spec.split(","))):
        name, _, action = item.partition("=")
        action, _, nth = action.partition("@")
        if action not in ("crash", "error", "stop") or not name:
            raise ValueError(f"{ENV}: {item!r} is not name=crash|error|stop[@N]")
        points[name] = (action, int(nth) if nth else 1)
    return points


_points = _parse(os.environ.get(ENV, ""))
_hits: dict[str, int] = {}


def configure(spec: str) -> None:
    """Replace the failpoints of this process (``""`` clears them), as the env var would."""
    global _points
    _points = _parse(spec)
    _hits.clear()


def failpoint(name: str) -> None:
    """Crash or raise here if the environment asked for it (see the module docstring)."""
    if not _points:
        return
    spec = _points.get(name)
    if spec is None:
        return
    action, nth = spec
    _hits[name] = hits = _hits.get(name, 0) + 1
    if hits < nth:
        return
    if action == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "stop":
        if hits == nth:
            os.kill(os.getpid(), signal.SIGSTOP)
        return
    raise FailpointError(f"failpoint {name} triggered")
