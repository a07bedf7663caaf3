"""A consumer's prefetch buffer: which pushed deliveries it may still hand to its
application, and which it gives back unseen.

A node pushes up to ``prefetch`` deliveries ahead of the application. Each has a deadline
on the node's clock; by then the consumer must have settled it, or the node times it out
and hands the message out again (attempt + 1), perhaps to another consumer. So a
consumer never hands out a delivery it can know is over:

- one superseded by a newer attempt of the same message that reached it;
- one whose hand-out-by time has passed: its deadline, less a margin for the settlement
  to reach the node (at most :data:`MAX_MARGIN`, a fifth of its time at most), turned
  into this process's monotonic clock by the offset its pings measured — so the two
  clocks need not agree, and a delivery read late (it sat in a socket buffer while the
  process was paused) is known for what it is. Before the first ping's answer, it is
  measured from when the delivery arrived.

Such deliveries are given back *unseen* (the node un-counts them: the attempt stays the
number of times the application saw the message), as is everything still buffered when
the consumer closes; what the application saw and did not settle is reported as
:meth:`Prefetch.seen` and counts.

Thread-safe: the connection's loop thread adds and expires, the application's thread
claims and settles; every claim is atomic against expiry.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from eomsg.core.message import Delivered, Key

MAX_MARGIN = 1.0  # seconds before its deadline a delivery is no longer handed out
MARGIN_SHARE = 0.2  # ... or this share of its time, if that is less


class Prefetch:
    """The deliveries pushed to one consumer and not yet handed to its application."""

    __slots__ = ("_lock", "_seen", "_unclaimed")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._unclaimed: dict[int, tuple[int, float]] = {}  # seq -> (attempt, hand out by)
        self._seen: dict[int, int] = {}  # seq -> attempt: handed out, not settled

    def arrived(
        self,
        deliveries: Iterable[Delivered],
        node_now: float,
        now: float,
        offset: float | None = None,
    ) -> float:
        """Take note of deliveries pushed at ``node_now`` on the node's clock and
        received at ``now`` (monotonic), the node's clock being ``offset`` ahead of the
        monotonic one (None: not known yet). A newer attempt supersedes an older one
        still buffered. Returns the earliest hand-out-by time among them (``inf`` if
        none)."""
        first = float("inf")
        with self._lock:
            for d in deliveries:
                left = d.deadline - node_now
                margin = min(MAX_MARGIN, MARGIN_SHARE * left)
                by = (d.deadline - offset if offset is not None else now + left) - margin
                self._unclaimed[d.seq] = (d.attempt, by)
                first = min(first, by)
        return first

    def claim(self, d: Delivered, now: float) -> bool:
        """Whether the application may have ``d`` now; if so it counts as seen. False
        for a delivery superseded, given back, or past its hand-out-by time (then
        :meth:`expire` gives it back)."""
        with self._lock:
            entry = self._unclaimed.get(d.seq)
            if entry is None or entry[0] != d.attempt or now >= entry[1]:
                return False
            del self._unclaimed[d.seq]
            self._seen[d.seq] = d.attempt
            return True

    def expire(self, now: float) -> list[Key]:
        """Withdraw the unclaimed deliveries past their hand-out-by time: the caller
        gives them back unseen."""
        with self._lock:
            late = [(s, a) for s, (a, by) in self._unclaimed.items() if by <= now]
            for seq, _ in late:
                del self._unclaimed[seq]
        return late

    def next_expiry(self) -> float:
        """The earliest hand-out-by time still pending (``inf`` if none)."""
        with self._lock:
            return min((by for _, by in self._unclaimed.values()), default=float("inf"))

    def settled(self, key: Key) -> None:
        """The application deleted or released ``key``."""
        with self._lock:
            if self._seen.get(key[0]) == key[1]:
                del self._seen[key[0]]

    def drop(self) -> None:
        """Forget the unclaimed deliveries: the node took them back (the flow lost
        activity, or the connection)."""
        with self._lock:
            self._unclaimed.clear()

    def seen(self) -> list[Key]:
        """The deliveries handed out and not settled (they count when given back)."""
        with self._lock:
            return list(self._seen.items())
