"""The publish dedup window (seed 001): a publish id is remembered as long as its message
can live, so a producer retrying after a lost reply gets the original sequence number back
instead of a second copy.

A message with a time-to-live can live until it expires; after that a receiver would drop
it anyway, so the id is forgotten and the same id may publish anew. A message without one
lives as long as the log retains it, so its id is forgotten when garbage collection drops
that part of the log (:meth:`DedupWindow.forget_below`).

The window has two tiers. Ids published since the node opened are in dictionaries of
strings to numbers (CPython's cycle collector never tracks those, so a full collection does
not walk them). Ids the store held when the node opened — possibly tens of millions — are
:class:`RetainedIds`: columns sorted by :func:`id_hash`, searched a batch at a time. Loading
them takes a sort of numbers instead of a dictionary insert per id (seconds at 10^7), and
they take a quarter of the memory.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def id_hash(msg_id: str) -> int:
    """The 32-bit hash the store keeps beside each publish id and :class:`RetainedIds`
    are sorted by: CRC-32 of its UTF-8 bytes, the same in every process and version.
    Two ids may share one; a match is always confirmed on the id itself."""
    return zlib.crc32(msg_id.encode("utf-8", "surrogatepass"))


@dataclass(frozen=True)
class RetainedIds:
    """The live publish ids a store held at open, as columns sorted by ``hashes``:
    ``expires`` is NaN for an id without a time-to-live."""

    hashes: np.ndarray  # uint32, ascending
    seqs: np.ndarray  # int64
    expires: np.ndarray  # float64 seconds; NaN: none
    ids: pa.ChunkedArray  # strings, as DuckDB handed them over: never copied into one

    @classmethod
    def empty(cls) -> RetainedIds:
        return cls(
            np.empty(0, np.uint32),
            np.empty(0, np.int64),
            np.empty(0, np.float64),
            pa.chunked_array([], pa.string()),
        )

    @functools.cached_property
    def _chunk_starts(self) -> np.ndarray:
        """Where each chunk of :attr:`ids` starts: an id is found in O(log chunks)."""
        return np.cumsum([0] + [len(c) for c in self.ids.chunks[:-1]], dtype=np.int64)

    def _id(self, i: int) -> str:
        c = int(np.searchsorted(self._chunk_starts, i, "right")) - 1
        return str(self.ids.chunks[c][i - int(self._chunk_starts[c])].as_py())

    @classmethod
    def of(
        cls, ids: Sequence[str], seqs: Sequence[int], expires: Sequence[float | None]
    ) -> RetainedIds:
        """Columns in any order, sorted here (the store has DuckDB sort them instead)."""
        hashes = np.fromiter(map(id_hash, ids), np.uint32, len(ids))
        order = np.argsort(hashes, kind="stable")
        nan = float("nan")
        return cls(
            hashes[order],
            np.asarray(seqs, np.int64)[order],
            np.array([nan if e is None else e for e in expires], np.float64)[order],
            pa.chunked_array([pa.array(ids, pa.string()).take(pa.array(order))]),
        )

    def __len__(self) -> int:
        return len(self.hashes)

    def find(self, msg_ids: Sequence[str], now: float, horizon: int) -> dict[str, int]:
        """The seqs of those of ``msg_ids`` that are here and can still live: one
        vectorised search for the batch, then the id itself compared at each hash match."""
        if not len(self.hashes) or not msg_ids:
            return {}
        wanted = np.fromiter(map(id_hash, msg_ids), np.uint32, len(msg_ids))
        lo = np.searchsorted(self.hashes, wanted, "left")
        hi = np.searchsorted(self.hashes, wanted, "right")
        found: dict[str, int] = {}
        for k in np.flatnonzero(hi > lo).tolist():
            msg_id = msg_ids[k]
            for j in range(int(lo[k]), int(hi[k])):
                if self._id(j) != msg_id:
                    continue
                expires = float(self.expires[j])
                seq = int(self.seqs[j])
                live = expires > now if expires == expires else seq >= horizon
                if live and seq > found.get(msg_id, -1):
                    found[msg_id] = seq
        return found

    def keep(self, mask: np.ndarray) -> RetainedIds:
        """These columns with only the rows ``mask`` selects (still sorted)."""
        return RetainedIds(
            self.hashes[mask],
            self.seqs[mask],
            self.expires[mask],
            pc.filter(self.ids, pa.array(mask)),
        )


class DedupWindow:
    """Live publish ids and their sequence numbers; pure, ``now`` passed in."""

    def __init__(self, retained: RetainedIds | None = None) -> None:
        self._lasting: dict[str, int] = {}  # no TTL; insertion order is seq order
        self._ttl_seq: dict[str, int] = {}
        self._ttl_expiry: dict[str, float] = {}
        self._retained = retained if retained is not None else RetainedIds.empty()
        self._horizon = 0  # retained ids without a TTL below it are forgotten

    def __len__(self) -> int:
        """Ids remembered (retained ones counted until a sweep drops them)."""
        return len(self._lasting) + len(self._ttl_seq) + len(self._retained)

    def lookup(self, msg_id: str, now: float) -> int | None:
        """The sequence number published under ``msg_id``, if that message can still live."""
        return self.lookup_many([msg_id], now).get(msg_id)

    def lookup_many(self, msg_ids: Sequence[str], now: float) -> dict[str, int]:
        """:meth:`lookup` for a batch: the original seq of each of ``msg_ids`` whose
        message can still live. An id published since open answers from memory; only
        the others are searched for among the retained ids."""
        found: dict[str, int] = {}
        others: list[str] = []
        lasting, ttl_seq, ttl_expiry = self._lasting, self._ttl_seq, self._ttl_expiry
        for msg_id in msg_ids:
            seq = lasting.get(msg_id)
            if seq is not None:
                found[msg_id] = seq
                continue
            seq = ttl_seq.get(msg_id)
            if seq is None:
                others.append(msg_id)
            elif ttl_expiry[msg_id] > now:
                found[msg_id] = seq
            # else lapsed: published anew since open, so its retained entry is older still
        if others and len(self._retained):
            found.update(self._retained.find(others, now, self._horizon))
        return found

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
        """Forget ids whose messages expired at or before ``now``; returns how many were
        dropped (retained ones go in bulk: see :meth:`_sweep`).

        A sweep over the ids that have a TTL: run it periodically, not per publish
        (:meth:`lookup` already ignores expired ids)."""
        lapsed = [i for i, expires in self._ttl_expiry.items() if expires <= now]
        for msg_id in lapsed:
            del self._ttl_seq[msg_id], self._ttl_expiry[msg_id]
        return len(lapsed) + self._sweep(~(self._retained.expires <= now))

    def forget_below(self, horizon: int) -> int:
        """Forget ids without a TTL whose messages (seq < ``horizon``) left the log;
        returns how many were dropped (retained ones go in bulk: see :meth:`_sweep`)."""
        doomed = []
        for msg_id, seq in self._lasting.items():
            if seq >= horizon:
                break
            doomed.append(msg_id)
        for msg_id in doomed:
            del self._lasting[msg_id]
        self._horizon = max(self._horizon, horizon)
        retained = self._retained
        return len(doomed) + self._sweep(~np.isnan(retained.expires) | (retained.seqs >= horizon))

    def _sweep(self, keep: np.ndarray) -> int:
        """Drop the retained ids ``keep`` does not select once they are a quarter of
        them; returns how many were dropped. Until then they stay, answering as
        forgotten (:meth:`RetainedIds.find` checks the horizon and expiry): the copy
        costs ~0.1 s per million ids, and runs under the node's lock."""
        dead = len(keep) - int(np.count_nonzero(keep))
        if dead * 4 <= len(keep):
            return 0
        self._retained = self._retained.keep(keep)
        return dead
