"""A FIFO of sequence numbers: what a queue's cursor has yet to read, ascending."""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterable, Iterator
from itertools import islice


class SeqQueue:
    """A FIFO of sequence numbers in an ``array('q')``: 8 bytes each and invisible to the
    cycle collector, whose full passes would otherwise walk every queued int."""

    __slots__ = ("_head", "_seqs")

    def __init__(self) -> None:
        self._seqs = array("q")
        self._head = 0

    def __len__(self) -> int:
        return len(self._seqs) - self._head

    def __iter__(self) -> Iterator[int]:
        return islice(self._seqs, self._head, None)

    def last(self) -> int:
        return self._seqs[-1]

    def first(self) -> int:
        return self._seqs[self._head]

    def __contains__(self, seq: int) -> bool:
        """Whether ``seq`` is queued (found by bisection: the queue is ascending)."""
        seqs = self._seqs
        i = bisect.bisect_left(seqs, seq, lo=self._head)
        return i < len(seqs) and seqs[i] == seq

    def since(self, seq: int) -> Iterator[int]:
        """The queued seqs from ``seq`` on (the queue is ascending: found by bisection)."""
        return islice(self._seqs, bisect.bisect_left(self._seqs, seq, lo=self._head), None)

    def append(self, seq: int) -> None:
        self._seqs.append(seq)

    def extend(self, seqs: Iterable[int]) -> None:
        self._seqs.extend(seqs)

    def popleft(self) -> int:
        seq = self._seqs[self._head]
        self._head += 1
        self._reclaim()
        return seq

    def popmany(self, n: int) -> list[int]:
        """The first ``n`` seqs (fewer if it holds fewer), taken off the queue at once."""
        head = self._head
        seqs = self._seqs[head : head + n].tolist()
        self._head = head + len(seqs)
        self._reclaim()
        return seqs

    def _reclaim(self) -> None:
        if self._head > 4096 and self._head * 2 > len(self._seqs):
            del self._seqs[: self._head]  # reclaim the consumed front
            self._head = 0
