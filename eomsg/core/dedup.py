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
* **runs**: :class:`~eomsg.core.idruns.RetainedIds`, columns sorted by
  :func:`~eomsg.core.idhash.id_hash`, searched a batch at a time (a quarter of a
  dictionary's memory, and no object per id). Runs cover consecutive ranges of seqs,
  oldest first; four of a size merge into one, up to :data:`LARGEST_MERGE` ids, so a
  lookup searches a handful — and only for the ids a bitmap of the runs' hashes
  (:class:`~eomsg.core.idruns.HashBitmap`, two to four bytes an id) does not rule out,
  which most new ids are. The ids the store held at open come back as runs too, or —
  fewer than :data:`FOLD` of them — into the dictionaries, as if just published: the
  runs' module (numpy, Arrow) is imported only once a first run is made, so a command
  opening a store with few live ids does without them.
* the oldest runs **spill**: once the runs outgrow the window's share of the node's
  memory (:meth:`DedupWindow.oldest`), the node writes the oldest to disk
  (:class:`eomsg.store.spill.SpilledIds`) and drops it here (:meth:`DedupWindow.spilled`);
  an id found in no tier in memory is then looked up there (:attr:`DedupWindow.has_spilled`).
  So the memory stays within its share whatever the rate and the retention, and no id
  that can still live is forgotten: a spilled one costs a disk lookup, not a duplicate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

    from eomsg.core.idruns import HashBitmap, RetainedIds


FOLD = 65_536  # ids kept in dictionaries before they are folded into a run
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
            from eomsg.core.idruns import HashBitmap  # loaded: a run exists

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
        from eomsg.core.idruns import hashes_of  # loaded: a run exists

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
        from eomsg.core.idruns import RetainedIds  # the first run loads numpy and Arrow

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
        return len(lapsed) + self._sweep(lambda r: r.unexpired(now))

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
        return len(doomed) + self._sweep(lambda r: r.retained_from(horizon))

    def _sweep(self, keep: Callable[[RetainedIds], np.ndarray]) -> int:
        """Drop the ids of each run ``keep`` does not select once they are a quarter of
        the run (a run left empty goes); returns how many were dropped. Until then they
        stay, answering as forgotten (:meth:`RetainedIds.find` checks the horizon and
        expiry): a copy costs ~0.1 s per million ids, and runs under the node's lock."""
        dropped = 0
        runs = []
        for run in self._runs:
            kept = keep(run)
            dead = len(kept) - int(kept.sum())
            if dead * 4 > len(kept):
                run = run.keep(kept)
                dropped += dead
            if len(run):
                runs.append(run)
        self._runs = runs
        return dropped
