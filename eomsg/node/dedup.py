"""The node's publish dedup (seed 001): its window in memory (:mod:`eomsg.core.dedup`)
and the ids that window spilled to disk (:mod:`eomsg.store.spill`), held together to the
window's share of the node's memory (:mod:`eomsg.core.memory`).

Lookups and remembering run under the node's lock, as part of a publish. Spilling and
collecting run on the maintenance thread: the disk is written without the lock, which
is taken only to change the window — and a lookup on disk reads through a connection of
its own, so a publish does not wait for a spill's transaction (only, at times, for a
filter's chunk of hashes or mark); an id is always in memory or on disk, never neither
(it leaves memory only once the disk holds it)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from eomsg.core.dedup import FOLD, DedupWindow
from eomsg.store.spill import SpilledIds
from eomsg.store.store import Store

LOAD_ROWS = 16 * FOLD  # ids read from DuckDB at a time when a node opens
FEW_IDS = FOLD // 4  # ids up to which they are read as rows, into the dictionaries
FILTER_SHARE = 8  # the spill's filter takes about this part of the window's budget
log = logging.getLogger("eomsg.node")


class Deduplication:
    """A node's publish ids: see the module docstring. ``budget``: the bytes the window
    may take in memory; ``lock``: the node's."""

    def __init__(
        self, window: DedupWindow, spill: SpilledIds, budget: int, lock: threading.Lock
    ) -> None:
        self.window = window
        self.spill = spill
        self.budget = budget
        self._lock = lock

    @classmethod
    def load(cls, store: Store, now_us: int, budget: int, lock: threading.Lock) -> Deduplication:
        """The live ids the store holds: those the spill file covers stay on disk, the
        rest are read into memory in seq order — and spilled, oldest first, as they
        pass the budget (so opening a store of a hundred million ids does not need
        memory for them). Up to :data:`FEW_IDS` of them are remembered as if just
        published, and no run is made (nor numpy and Arrow imported: ≈ 0.1 s of a
        command that opens a data directory)."""
        spill = store.spill
        spill.start_filter(budget // FILTER_SHARE)
        dedup = cls(DedupWindow(spilled=len(spill) > 0), spill, budget, lock)
        few = store.few_publish_ids(now_us, spill.covered, FEW_IDS)
        if few is not None:
            if few:
                ids, seqs, expires = map(list, zip(*few, strict=True))
                dedup.window.remember_many(ids, seqs, expires)
            return dedup
        for run in store.publish_id_runs(now_us, spill.covered, LOAD_ROWS):
            dedup.window.add_run(run)
            dedup.spill_over()
        return dedup

    def __len__(self) -> int:
        """Ids remembered in memory."""
        return len(self.window)

    def lookup_many(self, msg_ids: Sequence[str], now: float) -> dict[str, int]:
        """The original seq of each of ``msg_ids`` whose message can still live: from
        memory, then — for those not found there, once anything was spilled — from
        disk. Under the node's lock."""
        found = self.window.lookup_many(msg_ids, now)
        if self.window.has_spilled and len(found) < len(msg_ids):
            missing = [i for i in msg_ids if i not in found]
            found.update(self.spill.find(missing, now, self.window.horizon))
        return found

    def remember_many(
        self, ids: list[str], seqs: list[int], expires_at: list[float | None]
    ) -> None:
        """Under the node's lock."""
        self.window.remember_many(ids, seqs, expires_at)

    def spill_over(self) -> int:
        """While the window takes more than its budget, write its oldest run to disk
        (without the node's lock), then drop it from memory (with it); how many ids
        went."""
        moved = 0
        while True:
            with self._lock:
                run = self.window.oldest(self.budget - self.spill.filter_bytes)
            if run is None:
                return moved
            self.spill.add(run)
            with self._lock:
                self.window.spilled(run)
            moved += len(run)

    def collect(self, horizon: int, now: float) -> None:
        """Forget the ids whose messages left the log (below ``horizon``) or expired,
        in memory (with the node's lock) and on disk (without it)."""
        with self._lock:
            self.window.forget_below(horizon)
            self.window.expire(now)
        self.spill.forget_below(horizon, now)

    def fill_filter(self) -> None:
        """Read another chunk of the spilled ids' hashes into the spill's filter (on the
        maintenance thread, until it holds them all)."""
        self.spill.fill_filter()

    @property
    def nbytes(self) -> int:
        """The window in memory and the spill's filter."""
        return self.window.nbytes + self.spill.filter_bytes
