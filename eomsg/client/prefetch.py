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
claims and settles; every claim is atomic against expiry (both take the lock), and a
settlement takes no lock until enough of them are noted.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable

from eomsg.core.message import Delivered, Key

MAX_MARGIN = 1.0  # seconds before its deadline a delivery is no longer handed out
MARGIN_SHARE = 0.2  # ... or this share of its time, if that is less
FOLD_AT = 1024  # settlements noted before they are taken out of what was seen


class Prefetch:
    """The deliveries pushed to one consumer and not yet handed to its application."""

    __slots__ = ("_lock", "_seen", "_settled", "_unclaimed")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._unclaimed: dict[int, tuple[int, float]] = {}  # seq -> (attempt, hand out by)
        self._seen: dict[int, int] = {}  # seq -> attempt: handed out (and settled since,
        self._settled: deque[Key] = deque()  # ... if it is in here)

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
        shift = node_now - now if offset is None else offset  # node's clock - monotonic
        # by = deadline - shift - margin; the margin is MAX_MARGIN for a delivery with
        # ``full`` seconds or more left, as a delivery mostly has (one subtraction then)
        full, late = node_now + MAX_MARGIN / MARGIN_SHARE, shift + MAX_MARGIN
        entries = {
            d.message.seq: (
                d.attempt,
                d.deadline - late
                if d.deadline >= full
                else d.deadline - shift - MARGIN_SHARE * (d.deadline - node_now),
            )
            for d in deliveries
        }
        with self._lock:
            self._unclaimed.update(entries)
        return min([by for _, by in entries.values()], default=float("inf"))

    def claim(self, d: Delivered, now: float) -> bool:
        """Whether the application may have ``d`` now; if so it counts as seen. False
        for a delivery superseded, given back, or past its hand-out-by time (then
        :meth:`expire` gives it back)."""
        seq, attempt = d.message.seq, d.attempt
        with self._lock:
            entry = self._unclaimed.get(seq)
            if entry is None or entry[0] != attempt or now >= entry[1]:
                return False
            del self._unclaimed[seq]
            self._seen[seq] = attempt
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
        """The application deleted or released ``key``: noted without the lock (a
        deque's append is atomic), and taken out of what was seen a batch at a time."""
        self._settled.append(key)
        if len(self._settled) >= FOLD_AT:
            with self._lock:
                self._fold()

    def _fold(self) -> None:
        """Under the lock: what was settled is no longer seen (unless it was seen again
        since, as a newer attempt)."""
        settled, seen = self._settled, self._seen
        for _ in range(len(settled)):
            seq, attempt = settled.popleft()
            if seen.get(seq) == attempt:
                del seen[seq]

    def drop(self) -> None:
        """Forget the unclaimed deliveries: the node took them back (the flow lost
        activity, or the connection)."""
        with self._lock:
            self._unclaimed.clear()

    def seen(self) -> list[Key]:
        """The deliveries handed out and not settled (they count when given back)."""
        with self._lock:
            self._fold()
            return list(self._seen.items())
