"""The publish dedup window (seed 001): a publish id is remembered as long as its message
can live, so a producer retrying after a lost reply gets the original sequence number back
instead of a second copy.

A message with a time-to-live can live until it expires; after that a receiver would drop
it anyway, so the id is forgotten and the same id may publish anew. A message without one
lives as long as the log retains it, so its id is forgotten when garbage collection drops
that part of the log (:meth:`DedupWindow.forget_below`).
"""

from __future__ import annotations

import heapq
from collections import deque


class DedupWindow:
    """In-memory map of live publish ids to sequence numbers; pure, ``now`` passed in."""

    def __init__(self) -> None:
        self._ids: dict[str, tuple[int, float | None]] = {}
        self._expiring: list[tuple[float, int, str]] = []  # heap of (expires_at, seq, id)
        self._lasting: deque[tuple[int, str]] = deque()  # (seq, id) in seq order, no TTL

    def __len__(self) -> int:
        return len(self._ids)

    def lookup(self, msg_id: str, now: float) -> int | None:
        """The sequence number published under ``msg_id``, if that message can still live."""
        entry = self._ids.get(msg_id)
        if entry is None:
            return None
        seq, expires_at = entry
        if expires_at is not None and expires_at <= now:
            return None
        return seq

    def remember(self, msg_id: str, seq: int, expires_at: float | None) -> None:
        """Record that ``msg_id`` was published as ``seq``; replaces a lapsed entry."""
        self._ids[msg_id] = (seq, expires_at)
        if expires_at is None:
            self._lasting.append((seq, msg_id))
        else:
            heapq.heappush(self._expiring, (expires_at, seq, msg_id))

    def remember_many(
        self, ids: list[str], seqs: list[int], expires_at: list[float | None]
    ) -> None:
        """:meth:`remember` for many ids published together, in seq order."""
        if not any(expires_at):  # the common case, done in C
            self._ids.update(zip(ids, zip(seqs, expires_at, strict=True), strict=True))
            self._lasting.extend(zip(seqs, ids, strict=True))
            return
        for msg_id, seq, expires in zip(ids, seqs, expires_at, strict=True):
            self.remember(msg_id, seq, expires)

    def expire(self, now: float) -> int:
        """Forget ids whose messages expired at or before ``now``; returns how many."""
        dropped = 0
        heap = self._expiring
        while heap and heap[0][0] <= now:
            _, seq, msg_id = heapq.heappop(heap)
            if self._ids.get(msg_id, (None,))[0] == seq:
                del self._ids[msg_id]
                dropped += 1
        return dropped

    def forget_below(self, horizon: int) -> int:
        """Forget ids without a TTL whose messages (seq < ``horizon``) left the log."""
        dropped = 0
        lasting = self._lasting
        while lasting and lasting[0][0] < horizon:
            seq, msg_id = lasting.popleft()
            if self._ids.get(msg_id, (None,))[0] == seq:
                del self._ids[msg_id]
                dropped += 1
        return dropped
