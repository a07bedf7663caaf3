"""The publish dedup window (seed 001): a publish id is remembered as long as its message
can live, so a producer retrying after a lost reply gets the original sequence number back
instead of a second copy.

A message with a time-to-live can live until it expires; after that a receiver would drop
it anyway, so the id is forgotten and the same id may publish anew. A message without one
lives as long as the log retains it, so its id is forgotten when garbage collection drops
that part of the log (:meth:`DedupWindow.forget_below`).

The window may hold millions of ids, so it is built only from dictionaries of strings to
numbers: CPython's cycle collector never tracks those, and a full collection does not
walk them — otherwise the cost of every publish would grow with the size of the window.
"""

from __future__ import annotations


class DedupWindow:
    """In-memory map of live publish ids to sequence numbers; pure, ``now`` passed in."""

    def __init__(self) -> None:
        self._lasting: dict[str, int] = {}  # no TTL; insertion order is seq order
        self._ttl_seq: dict[str, int] = {}
        self._ttl_expiry: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self._lasting) + len(self._ttl_seq)

    def lookup(self, msg_id: str, now: float) -> int | None:
        """The sequence number published under ``msg_id``, if that message can still live."""
        seq = self._lasting.get(msg_id)
        if seq is not None:
            return seq
        seq = self._ttl_seq.get(msg_id)
        if seq is None or self._ttl_expiry[msg_id] <= now:
            return None
        return seq

    def remember(self, msg_id: str, seq: int, expires_at: float | None) -> None:
        """Record that ``msg_id`` was published as ``seq``; replaces a lapsed entry."""
        if expires_at is None:
            self._ttl_seq.pop(msg_id, None)
            self._ttl_expiry.pop(msg_id, None)
            self._lasting[msg_id] = seq
        else:
            self._lasting.pop(msg_id, None)
            self._ttl_seq[msg_id] = seq
            self._ttl_expiry[msg_id] = expires_at

    def remember_many(
        self, ids: list[str], seqs: list[int], expires_at: list[float | None]
    ) -> None:
        """:meth:`remember` for many ids published together, in seq order."""
        if not any(expires_at) and (not self._ttl_seq or not self._ttl_seq.keys() & ids):
            self._lasting.update(zip(ids, seqs, strict=True))
            return
        for msg_id, seq, expires in zip(ids, seqs, expires_at, strict=True):
            self.remember(msg_id, seq, expires)

    def expire(self, now: float) -> int:
        """Forget ids whose messages expired at or before ``now``; returns how many.

        A sweep over the ids that have a TTL: run it periodically, not per publish
        (:meth:`lookup` already ignores expired ids)."""
        lapsed = [i for i, expires in self._ttl_expiry.items() if expires <= now]
        for msg_id in lapsed:
            del self._ttl_seq[msg_id], self._ttl_expiry[msg_id]
        return len(lapsed)

    def forget_below(self, horizon: int) -> int:
        """Forget ids without a TTL whose messages (seq < ``horizon``) left the log."""
        doomed = []
        for msg_id, seq in self._lasting.items():
            if seq >= horizon:
                break
            doomed.append(msg_id)
        for msg_id in doomed:
            del self._lasting[msg_id]
        return len(doomed)
