"""The publish dedup window (seed 001): a publish id is remembered as long as its message
can live, so a producer retrying after a lost reply gets the original sequence number back
instead of a second copy.

A message with a time-to-live can live until it expires; after that a receiver would drop
it anyway, so the id is forgotten and the same id may publish anew. A message without one
lives as long as the log retains it, so its id is forgotten when garbage collection drops
that part of the log (:meth:`DedupWindow.forget_below`).

The window is tiered, newest first, and bounded in memory:

* ids published since the last fold are in dictionaries of strings to numbers (CPython's
  cycle collector never tracks those); every :data:`FOLD` of them are folded into
* **runs**: :class:`RetainedIds`, columns sorted by :func:`id_hash`, searched a batch at
  a time (a quarter of a dictionary's memory, and no object per id). Runs cover
  consecutive ranges of seqs, oldest first; four of a size merge into one, up to
  :data:`LARGEST_MERGE` ids, so a lookup searches a handful — and only for the ids a
  bitmap of the runs' hashes (:class:`HashBitmap`, two to four bytes an id) does not rule
  out, which most new ids are. The ids the store held at open come back as runs too.
* the oldest runs **spill**: once the runs outgrow the window's share of the node's
  memory (:meth:`DedupWindow.oldest`), the node writes the oldest to disk
  (:class:`eomsg.store.spill.SpilledIds`) and drops it here (:meth:`DedupWindow.spilled`);
  an id found in no tier in memory is then looked up there (:attr:`DedupWindow.has_spilled`).
  So the memory stays within its share whatever the rate and the retention, and no id
  that can still live is forgotten: a spilled one costs a disk lookup, not a duplicate.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa


def id_hash(msg_id: str) -> int:
    """The 32-bit hash the store keeps beside each publish id and :class:`RetainedIds`
    are sorted by: CRC-32 of its UTF-8 bytes, the same in every process and version.
    Two ids may share one; a match is always confirmed on the id itself."""
    return zlib.crc32(msg_id.encode("utf-8", "surrogatepass"))


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

    def mark(self, hashes: np.ndarray) -> None:
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

    def keep(self, mask: np.ndarray) -> RetainedIds:
        """These columns with only the rows ``mask`` selects (still sorted)."""
        return RetainedIds(
            self.hashes[mask],
            self.seqs[mask],
            self.expires[mask],
            self.ids.filter(pa.array(mask)),
        )


FOLD = 65_536  # ids kept in dictionaries before they are folded into a run
MERGE_SLICE = 65_536  # ids a merge gathers at a time: one chunk of the merged run
LARGEST_MERGE = 1 << 20  # runs grow by merging four of a size up to about this many ids
DICT_ENTRY = 150  # bytes a dictionary entry of a short id takes, about (key, value, slot)
RUNS_FILTER_MIN = 4096  # bytes the runs' filter takes at least


class DedupWindow:
    """Live publish ids and their sequence numbers; pure, ``now`` passed in. See the
    module docstring for its tiers."""

    def __init__(self, retained: RetainedIds | None = None, spilled: bool = False) -> None:
        self._lasting: dict[str, int] = {}  # no TTL; insertion order is seq order
        self._ttl_seq: dict[str, int] = {}
        self._ttl_expiry: dict[str, float] = {}
        self._runs: list[RetainedIds] = []  # oldest first, consecutive ranges of seqs
        self._filter: HashBitmap | None = None  # every hash of every run is marked in it
        self._marked = 0  # hashes marked in it since it was made
        if retained is not None:
            self.add_run(retained)
        self._horizon = 0  # ids without a TTL below it are forgotten
        self.has_spilled = spilled  # some live ids are on disk, not here

    def __len__(self) -> int:
        """Ids remembered in memory (those of runs counted until a sweep drops them)."""
        return len(self._lasting) + len(self._ttl_seq) + sum(len(r) for r in self._runs)

    @property
    def horizon(self) -> int:
        return self._horizon

    @property
    def nbytes(self) -> int:
        """About the memory the window takes: its runs' columns and their filter, and
        its dictionaries."""
        return (
            (len(self._lasting) + len(self._ttl_seq)) * DICT_ENTRY
            + sum(r.nbytes for r in self._runs)
            + (self._filter.nbytes if self._filter is not None else 0)
        )

    def _take(self, run: RetainedIds) -> None:
        """Append ``run`` as the newest run, its hashes marked in the runs' filter —
        made anew, sized for the ids the runs hold, once it has taken a byte's worth
        of marks for each of its bytes (past that it lets through more than one new
        id in nine) or holds four times the ids the runs still do."""
        self._runs.append(run)
        held = sum(len(r) for r in self._runs)
        f = self._filter
        if f is None or self._marked + len(run) > f.nbytes or 4 * held < self._marked:
            f = self._filter = HashBitmap(max(RUNS_FILTER_MIN, 1 << (2 * held - 1).bit_length()))
            for r in self._runs:
                f.mark(r.hashes)
            self._marked = held
        else:
            f.mark(run.hashes)
            self._marked += len(run)

    def lookup(self, msg_id: str, now: float) -> int | None:
        """The sequence number published under ``msg_id``, if that message can still live
        and its id is in memory (see :attr:`has_spilled`)."""
        return self.lookup_many([msg_id], now).get(msg_id)

    def lookup_many(self, msg_ids: Sequence[str], now: float) -> dict[str, int]:
        """:meth:`lookup` for a batch: the original seq of each of ``msg_ids`` whose
        message can still live, from memory. An id published since the last fold
        answers from a dictionary; only the others are searched for in the runs, newest
        first. With :attr:`has_spilled`, the ids not found may still be on disk."""
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
            # else lapsed: published anew since, so any entry in an older tier is older still
        if not others or not self._runs:
            return found
        wanted = hashes_of(others)  # once for every run searched
        if self._filter is not None:  # most new ids are in no run: no run is searched
            maybe = self._filter.maybe(wanted)
            if not all(maybe):
                left = [k for k, m in enumerate(maybe) if m]
                if not left:
                    return found
                others, wanted = [others[k] for k in left], wanted[left]
        for run in reversed(self._runs):
            hits = run.find(others, now, self._horizon, wanted)
            if hits:
                found.update(hits)
                left = [k for k, msg_id in enumerate(others) if msg_id not in hits]
                if not left:
                    break
                others, wanted = [others[k] for k in left], wanted[left]
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
        self._fold()

    def remember_many(
        self, ids: list[str], seqs: list[int], expires_at: list[float | None]
    ) -> None:
        """:meth:`remember` for many ids published together, in seq order."""
        if not any(expires_at) and (not self._ttl_seq or not self._ttl_seq.keys() & ids):
            self._lasting.update(zip(ids, seqs, strict=True))
            self._fold()
            return
        for msg_id, seq, expires in zip(ids, seqs, expires_at, strict=True):
            self.remember(msg_id, seq, expires)

    def _fold(self) -> None:
        """Fold the dictionaries into a run once they hold :data:`FOLD` ids (what each
        holds is newer than every run), then merge runs four of a size at a time."""
        if len(self._lasting) + len(self._ttl_seq) < FOLD:
            return
        nan = float("nan")
        ids = [*self._lasting, *self._ttl_seq]
        seqs = [*self._lasting.values(), *self._ttl_seq.values()]
        expires = [nan] * len(self._lasting) + [*self._ttl_expiry.values()]
        if self._ttl_seq and self._lasting:  # one seq order for both, as runs keep
            order = sorted(range(len(seqs)), key=seqs.__getitem__)
            ids = [ids[i] for i in order]
            seqs = [seqs[i] for i in order]
            expires = [expires[i] for i in order]
        for lo in range(0, len(ids), FOLD):  # a run each FOLD ids, so each can spill
            hi = lo + FOLD
            self._take(RetainedIds.of(ids[lo:hi], seqs[lo:hi], expires[lo:hi]))
        self._lasting, self._ttl_seq, self._ttl_expiry = {}, {}, {}
        runs = self._runs
        while (
            len(runs) >= 4
            and 4 * len(runs[-1]) <= LARGEST_MERGE
            and all(len(r) <= 2 * len(runs[-1]) for r in runs[-4:])
        ):
            runs[-4:] = [RetainedIds.merged(runs[-4:])]

    def add_run(self, run: RetainedIds) -> None:
        """Take ``run`` — ids newer than every one held, none in the dictionaries — as
        the newest run (a store's ids, read at open a run at a time)."""
        if len(run):
            self._take(run)

    def oldest(self, budget: int) -> RetainedIds | None:
        """The oldest run, when the window takes more than ``budget`` bytes and holds
        other ids besides it: what the node spills next. Until :meth:`spilled` drops
        it, it stays and answers."""
        if self.nbytes <= budget or len(self._runs) < 2:
            return None
        return self._runs[0]

    def spilled(self, run: RetainedIds) -> None:
        """``run`` (what :meth:`oldest` gave) is on disk now: drop it from memory."""
        if self._runs and self._runs[0] is run:
            self._runs.pop(0)
            self.has_spilled = True

    def expire(self, now: float) -> int:
        """Forget ids whose messages expired at or before ``now``; returns how many were
        dropped (those of runs go in bulk: see :meth:`_sweep`).

        A sweep over the ids that have a TTL: run it periodically, not per publish
        (:meth:`lookup` already ignores expired ids)."""
        lapsed = [i for i, expires in self._ttl_expiry.items() if expires <= now]
        for msg_id in lapsed:
            del self._ttl_seq[msg_id], self._ttl_expiry[msg_id]
        return len(lapsed) + self._sweep(lambda r: ~(r.expires <= now))

    def forget_below(self, horizon: int) -> int:
        """Forget ids without a TTL whose messages (seq < ``horizon``) left the log;
        returns how many were dropped (those of runs go in bulk: see :meth:`_sweep`)."""
        doomed = []
        for msg_id, seq in self._lasting.items():
            if seq >= horizon:
                break
            doomed.append(msg_id)
        for msg_id in doomed:
            del self._lasting[msg_id]
        self._horizon = max(self._horizon, horizon)
        return len(doomed) + self._sweep(lambda r: ~np.isnan(r.expires) | (r.seqs >= horizon))

    def _sweep(self, keep: Callable[[RetainedIds], np.ndarray]) -> int:
        """Drop the ids of each run ``keep`` does not select once they are a quarter of
        the run (a run left empty goes); returns how many were dropped. Until then they
        stay, answering as forgotten (:meth:`RetainedIds.find` checks the horizon and
        expiry): a copy costs ~0.1 s per million ids, and runs under the node's lock."""
        dropped = 0
        runs = []
        for run in self._runs:
            kept = keep(run)
            dead = len(kept) - int(np.count_nonzero(kept))
            if dead * 4 > len(kept):
                run = run.keep(kept)
                dropped += dead
            if len(run):
                runs.append(run)
        self._runs = runs
        return dropped
