"""The dedup window's columnar tiers (seed 001; :mod:`eomsg.core.dedup` holds the window):
:class:`RetainedIds`, runs of publish ids as columns sorted by :func:`~eomsg.core.idhash.id_hash`
and searched a batch at a time, and :class:`HashBitmap`, the filter over their hashes.

numpy and Arrow take ≈ 0.1 s to import, so this module is loaded only once a window or a
spill file holds a run: a command that opens a store with few live ids never loads it
(:meth:`eomsg.core.dedup.DedupWindow` keeps those in dictionaries)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from eomsg.core.idhash import id_hash

MERGE_SLICE = 65_536  # ids a merge gathers at a time: one chunk of the merged run


def hashes_of(msg_ids: Sequence[str]) -> np.ndarray:
    """The :func:`id_hash` of each of ``msg_ids``, as an array."""
    return np.fromiter(map(id_hash, msg_ids), np.uint32, len(msg_ids))


class HashBitmap:
    """A filter of 32-bit hashes (a Bloom filter): ``probes`` bits of its ``8 * nbytes``
    for each hash — the top bits of the hash, and of it times an odd constant for each
    further probe (a bijection of 32-bit words: a different bit, for a different hash)
    — set for every hash marked and never cleared, so "not here" is certain and "maybe"
    is confirmed by whoever holds the ids. More probes rule out more when the filter
    holds few hashes for its size and cost a pass over the hashes each. ``nbytes``: a
    power of two."""

    def __init__(self, nbytes: int, probes: int = 1) -> None:
        if not 1 <= probes <= len(_PROBE_MIX):
            raise ValueError(f"a filter takes 1 to {len(_PROBE_MIX)} probes, not {probes}")
        self.bits = np.zeros(nbytes, np.uint8)
        self._bytes = self.bits.data  # the same bytes, read one at a time as ints
        self._shift = np.uint32(32 - (nbytes * 8).bit_length() + 1)
        self._mix = [np.uint32(m) for m in _PROBE_MIX[:probes]]

    @property
    def nbytes(self) -> int:
        return len(self.bits)

    @property
    def probes(self) -> int:
        return len(self._mix)

    def _bits(self, hashes: np.ndarray, mix: np.uint32) -> np.ndarray:
        if mix == 1:  # the first probe: the hash's own top bits, no copy
            return hashes >> self._shift
        return (hashes.astype(np.uint32, copy=False) * mix) >> self._shift

    def mark(self, hashes: np.ndarray | Sequence[int]) -> None:
        hashes = np.asarray(hashes, np.uint32)
        for mix in self._mix:
            b = self._bits(hashes, mix)
            np.bitwise_or.at(self.bits, b >> 3, (1 << (b & 7)).astype(np.uint8))

    def maybe(self, hashes: np.ndarray) -> list[bool]:
        """For each of ``hashes``: whether it may have been marked."""
        if len(hashes) <= 8:  # a few: cheaper one at a time than as arrays
            bits, shift, mixes = self._bytes, int(self._shift), [int(m) for m in self._mix]
            if len(mixes) == 1:  # (each publish asks the runs' filter: kept lean)
                return [
                    bool(bits[b >> 3] >> (b & 7) & 1) for b in (h >> shift for h in hashes.tolist())
                ]
            return [
                all(
                    bits[b >> 3] >> (b & 7) & 1
                    for b in ((h * m & 0xFFFFFFFF) >> shift for m in mixes)
                )
                for h in hashes.tolist()
            ]
        found = np.ones(len(hashes), bool)
        for mix in self._mix:
            b = self._bits(hashes, mix)
            found &= ((self.bits[b >> 3] >> (b & 7)) & 1).astype(bool)
        result: list[bool] = found.tolist()
        return result


# Odd multipliers, one a probe (the first leaves the hash as it is): the golden ratio's
# and MurmurHash3's finalising constants.
_PROBE_MIX = (1, 0x9E3779B1, 0x85EBCA6B, 0xC2B2AE35, 0x27D4EB2F, 0x165667B1)


def _starts(chunks: Sequence[pa.Array]) -> np.ndarray:
    """Where each of ``chunks`` starts, counted across them all."""
    return np.cumsum([0] + [len(c) for c in chunks[:-1]], dtype=np.int64)


def _gather(chunks: Sequence[pa.Array], starts: np.ndarray, rows: np.ndarray) -> pa.Array:
    """The strings at ``rows`` — positions across ``chunks``, which begin at ``starts``
    — in that order. Each chunk gives its own rows: Arrow's take over a chunked array
    first copies every chunk into one array (tens of MiB for a run of a million ids,
    for a few rows)."""
    rows = np.asarray(rows, np.int64)
    if len(chunks) == 1:
        return chunks[0].take(pa.array(rows))
    which = np.searchsorted(starts, rows, "right") - 1
    group = np.argsort(which, kind="stable")
    grouped, bounds = rows[group], np.searchsorted(which[group], np.arange(len(chunks) + 1))
    pieces = [
        chunks[c].take(pa.array(grouped[bounds[c] : bounds[c + 1]] - starts[c]))
        for c in range(len(chunks))
        if bounds[c] < bounds[c + 1]
    ]
    joined = pa.concat_arrays(pieces) if pieces else pa.array([], pa.string())
    return joined.take(pa.array(np.argsort(group)))


@dataclass(frozen=True)
class RetainedIds:
    """The live publish ids a store held at open, as columns sorted by ``hashes``:
    ``expires`` is NaN for an id without a time-to-live."""

    hashes: np.ndarray  # uint32, ascending
    seqs: np.ndarray  # int64
    expires: np.ndarray  # float64 seconds; NaN: none
    ids: pa.ChunkedArray  # strings in chunks (DuckDB's, or a merge's): never copied into one

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
        return _starts(self.ids.chunks)

    def _id(self, i: int) -> str:
        c = int(np.searchsorted(self._chunk_starts, i, "right")) - 1
        return str(self.ids.chunks[c][i - int(self._chunk_starts[c])].as_py())

    @classmethod
    def of(
        cls, ids: Sequence[str], seqs: Sequence[int], expires: Sequence[float | None]
    ) -> RetainedIds:
        """Columns in any order, sorted here (the store has DuckDB sort them instead)."""
        hashes = hashes_of(ids)
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

    @property
    def nbytes(self) -> int:
        """The memory its columns take."""
        return int(self.hashes.nbytes + self.seqs.nbytes + self.expires.nbytes + self.ids.nbytes)

    @property
    def last_seq(self) -> int:
        return int(self.seqs.max()) if len(self.seqs) else 0

    @classmethod
    def merged(cls, runs: Sequence[RetainedIds]) -> RetainedIds:
        """One run of the ids of ``runs``, sorted by hash (a stable sort: the order
        within a hash is the runs' order). Its ids are gathered :data:`MERGE_SLICE` at a
        time into chunks of their own, so a merge holds the runs, the result and one
        slice, never a copy of all the runs' ids in one."""
        hashes = np.concatenate([r.hashes for r in runs])
        order = np.argsort(hashes, kind="stable")
        chunks = [c for r in runs for c in r.ids.chunks]
        starts = _starts(chunks)
        return cls(
            hashes[order],
            np.concatenate([r.seqs for r in runs])[order],
            np.concatenate([r.expires for r in runs])[order],
            pa.chunked_array(
                [
                    _gather(chunks, starts, order[lo : lo + MERGE_SLICE])
                    for lo in range(0, len(order), MERGE_SLICE)
                ],
                pa.string(),
            ),
        )

    def ids_at(self, rows: np.ndarray) -> pa.Array:
        """The ids at ``rows``, in that order (each taken from its own chunk)."""
        return _gather(self.ids.chunks, self._chunk_starts, rows)

    def find(
        self,
        msg_ids: Sequence[str],
        now: float,
        horizon: int,
        wanted: np.ndarray | None = None,
    ) -> dict[str, int]:
        """The seqs of those of ``msg_ids`` that are here and can still live: one
        vectorised search for the batch (``wanted``: their :func:`hashes_of`, when the
        caller searches several runs), then the id itself compared at each hash match."""
        hashes = self.hashes
        if not len(hashes) or not msg_ids:
            return {}
        if wanted is None:
            wanted = hashes_of(msg_ids)
        lo = hashes.searchsorted(wanted)
        hit = hashes.take(lo, mode="clip") == wanted  # (few numpy calls: a batch is small)
        if not hit.any():
            return {}
        found: dict[str, int] = {}
        for k in np.flatnonzero(hit).tolist():
            msg_id, h = msg_ids[k], wanted[k]
            j = int(lo[k])
            while j < len(hashes) and hashes[j] == h:
                if self._id(j) == msg_id:
                    expires = float(self.expires[j])
                    seq = int(self.seqs[j])
                    live = expires > now if expires == expires else seq >= horizon
                    if live and seq > found.get(msg_id, -1):
                        found[msg_id] = seq
                j += 1
        return found

    def unexpired(self, now: float) -> np.ndarray:
        """Which rows have not expired at ``now`` (an id without a TTL never does)."""
        return ~(self.expires <= now)

    def retained_from(self, horizon: int) -> np.ndarray:
        """Which rows the log still holds from ``horizon`` on, or that have a TTL (whose
        expiry, not the log, bounds them)."""
        return ~np.isnan(self.expires) | (self.seqs >= horizon)  # type: ignore[no-any-return]

    def keep(self, mask: np.ndarray) -> RetainedIds:
        """These columns with only the rows ``mask`` selects (still sorted)."""
        return RetainedIds(
            self.hashes[mask],
            self.seqs[mask],
            self.expires[mask],
            self.ids.filter(pa.array(mask)),
        )
