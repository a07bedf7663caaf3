"""Exactly-once transfer over one link (seeds 000 and 003): the log on one node, the
cursor on the other, joined by a network that may drop, repeat, reorder or cut.

The **sender** keeps every message routed to the peer until the peer has durably taken
it. It sends them in sequence order, each frame naming the sequence that came before
its first message (``prev``), starts a timer, and when no acknowledgement moves within
``resend_after`` — or the peer says it missed something — goes back and sends again from
the last sequence the peer acknowledged (go-back-N). An acknowledgement is cumulative:
"I hold everything up to ``read``"; the sender then deletes what it covers.

The **receiver** keeps, per sender, its *read sequence*: the last sequence it has taken,
stored in the same commit as the messages. It takes a frame's messages only when the
frame continues from what it holds (``prev`` is the read sequence, or the frame's
messages reach across it); what it holds already is a resend, recognised and only
acknowledged again; a frame that starts past it means something was lost in between,
and the receiver asks for what follows its read sequence (seed 003's cursor asking for
the next messages). So a message is stored once however often it is sent.

Pure state: no I/O, no clock (every call that needs the time takes ``now``).
"""

from __future__ import annotations

import bisect
import enum
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from eomsg.errors import IllegalMove

RESEND_AFTER = 2.0  # seconds without progress after which the sender goes back


class Verdict(enum.Enum):
    TAKE = "take"  # store these messages with the new read sequence, then acknowledge
    REPEAT = "repeat"  # all held already: acknowledge the read sequence again
    GAP = "gap"  # something before them was lost: ask for what follows the read sequence


@dataclass(frozen=True)
class Offer:
    """What the receiver makes of a frame: the verdict, and for TAKE the positions in the
    frame of the messages to store (the ones past the read sequence)."""

    verdict: Verdict
    start: int = 0


class Receiver:
    """The receiving end of one link: its read sequence, durable (``read``), and the
    last sequence taken but not yet committed (``accepted``), so frames that arrive while
    a commit is under way are judged against what they follow."""

    def __init__(self, read: int) -> None:
        self.read = read
        self.accepted = read
        self._before_take = read

    def offer(self, prev: int, seqs: Sequence[int]) -> Offer:
        """Judge a frame continuing from ``prev`` with messages ``seqs`` (strictly
        increasing, each following the one before). For TAKE the caller stores
        ``seqs[start:]`` with read sequence ``seqs[-1]`` in one commit, then calls
        :meth:`committed`."""
        if not seqs or any(b <= a for a, b in zip((prev, *seqs), seqs, strict=False)):
            raise IllegalMove(f"transfer frame after {prev}: sequences must increase")
        held = self.accepted
        if seqs[-1] <= held:
            return Offer(Verdict.REPEAT)
        if prev == held:
            start = 0
        else:
            try:
                start = seqs.index(held) + 1
            except ValueError:
                return Offer(Verdict.GAP)
        self._before_take = held
        self.accepted = seqs[-1]
        return Offer(Verdict.TAKE, start)

    def committed(self, read: int) -> None:
        """The commit holding the messages up to ``read`` is durable: acknowledge it."""
        self.read = max(self.read, read)

    def took(self, read: int) -> None:
        """Of the frame just offered, only the messages up to ``read`` are taken (a
        queue has no room for the next): the sender sends the rest again."""
        self.accepted = read

    def refused(self) -> None:
        """The store refused, before queueing it, the commit of the frame just taken (a
        full disk): those messages are not taken (the sender will send them again)."""
        self.accepted = self._before_take


@dataclass(frozen=True)
class Frame:
    """Send these sequences, continuing from ``prev``."""

    prev: int
    seqs: tuple[int, ...]


class Sender:
    """The sending end of one link, while it is connected: the sequences routed to the
    peer and not yet acknowledged (in order), how far this connection has sent, and when
    the acknowledgement last moved. Costs stay flat with the backlog: the sequences are
    one array, acknowledged ones dropped from its head in bulk.

    ``window`` bounds the messages sent and not acknowledged; ``batch`` those of one
    frame."""

    def __init__(
        self,
        acked: int,
        pending: Sequence[int],
        now: float,
        *,
        window: int = 4096,
        batch: int = 256,
        resend_after: float = RESEND_AFTER,
    ) -> None:
        self.acked = acked  # the peer's read sequence, as it last said
        self._seqs = array("q", (s for s in pending if s > acked))
        self._head = 0  # _seqs[_head:] are not acknowledged
        self._next = 0  # _seqs[_next:] are not sent on this connection
        self.window = window
        self.batch = batch
        self.resend_after = resend_after
        self.resends = 0  # go-backs on this connection (for inspect links)
        self._progress_at = now

    @property
    def sent(self) -> int:
        """The last sequence sent on this connection (or acknowledged)."""
        return self._seqs[self._next - 1] if self._next > self._head else self.acked

    @property
    def pending(self) -> int:
        """Messages routed to the peer and not acknowledged."""
        return len(self._seqs) - self._head

    @property
    def in_flight(self) -> int:
        """Messages sent on this connection and not acknowledged."""
        return self._next - self._head

    def add(self, seqs: Sequence[int]) -> None:
        """Newly committed messages for the peer (higher than every pending one)."""
        if seqs and len(self._seqs) and seqs[0] <= self._seqs[-1]:
            raise IllegalMove(f"link: {seqs[0]} added after {self._seqs[-1]}")
        self._seqs.extend(seqs)

    def frames(self, now: float, *, take: bool = True) -> list[Frame]:
        """What to send now: the pending messages not sent yet, within the window
        (``take=False``: what would be, nothing changed)."""
        end = min(len(self._seqs), self._head + self.window)
        out: list[Frame] = []
        sent, nxt = self.sent, self._next
        while nxt < end:
            stop = min(nxt + self.batch, end)
            chunk = tuple(self._seqs[nxt:stop])
            out.append(Frame(sent, chunk))
            sent, nxt = chunk[-1], stop
        if take:
            if self.in_flight == 0:
                self._progress_at = now  # the timer starts with the first frame unacknowledged
            self._next = nxt
        return out

    def acknowledged(self, read: int, now: float, *, gap: bool = False) -> list[int]:
        """The peer holds everything up to ``read``: the sequences that covers, now to be
        deleted here. With ``gap`` the peer missed what followed ``read``: go back and
        send it again."""
        done: list[int] = []
        if read > self.acked:
            self.acked = read
            self._progress_at = now
            end = bisect.bisect_right(self._seqs, read, self._head)
            done = self._seqs[self._head : end].tolist()
            self._head = end
            self._next = max(self._next, end)
            if self._head > 4096 and self._head * 2 > len(self._seqs):
                del self._seqs[: self._head]
                self._next -= self._head
                self._head = 0
        if gap and self.in_flight:
            self._go_back(now)
        return done

    def reconnected(self, read: int, now: float) -> list[int]:
        """A new connection, on which the peer said it holds everything up to ``read``:
        what that covers (to delete), and everything after it goes out again. A peer
        whose read sequence went back (it lost its state: a link made anew, a data
        directory rebuilt) is believed: what it had acknowledged before is gone here,
        and the stream goes on from where it now stands."""
        self.acked = min(self.acked, read)
        done = self.acknowledged(read, now)
        self._next = self._head
        self._progress_at = now
        return done

    def tick(self, now: float) -> bool:
        """Whether the timer ran out (nothing acknowledged for ``resend_after`` while
        messages were in flight): if so, what was sent goes out again."""
        if self.in_flight and now - self._progress_at >= self.resend_after:
            self._go_back(now)
            return True
        return False

    def _go_back(self, now: float) -> None:
        self._next = self._head
        self.resends += 1
        self._progress_at = now


class Outbox:
    """What one link owes its peer: a :class:`Sender` over every sequence routed to the
    peer, and for each sequence its *route* — an id naming the nodes the peer is to carry
    it to (a link has a few routes, one per set of targets its messages had). Keeps each
    route's sequences as an array, so finding a frame's routes and what an
    acknowledgement settles costs a bisection per route, flat with the backlog."""

    def __init__(self, acked: int, now: float, **sender: int | float) -> None:
        self.sender = Sender(acked, (), now, **sender)  # type: ignore[arg-type]
        self._routes: dict[int, array[int]] = {}
        self._heads: dict[int, int] = {}

    def add(self, route: int, seqs: Sequence[int]) -> None:
        """Newly committed messages for the peer on ``route`` (above all pending)."""
        self.sender.add(seqs)
        if route not in self._routes:
            self._routes[route] = array("q")
            self._heads[route] = 0
        self._routes[route].extend(seqs)

    def restore(self, by_route: dict[int, list[int]]) -> None:
        """At start: what each route still owes (each list ascending)."""
        merged = sorted((seq, route) for route, seqs in by_route.items() for seq in seqs)
        for route, seqs in by_route.items():
            self._routes[route] = array("q", seqs)
            self._heads[route] = 0
        self.sender.add([seq for seq, _ in merged])

    def routes_of(self, seqs: Sequence[int]) -> tuple[list[int], list[int] | None]:
        """The routes of ``seqs`` (ascending, all pending): the ids of those among them,
        and each one's index in that list — None when all go the one way (the usual
        link: then nothing is looked up a message)."""
        if len(self._routes) == 1:
            return list(self._routes), None
        found: dict[int, int] = {}
        lo, hi = seqs[0], seqs[-1]
        for route, arr in self._routes.items():
            i = bisect.bisect_left(arr, lo, self._heads[route])
            end = bisect.bisect_right(arr, hi, i)
            for seq in arr[i:end]:
                found[seq] = route
        each = [found[seq] for seq in seqs]
        table = list(dict.fromkeys(each))
        if len(table) == 1:
            return table, None
        index = {route: i for i, route in enumerate(table)}
        return table, [index[route] for route in each]

    def acknowledged(self, read: int, now: float, *, gap: bool = False) -> dict[int, list[int]]:
        """:meth:`Sender.acknowledged`; returns, by route, the sequences the peer now
        holds (to delete here)."""
        self.sender.acknowledged(read, now, gap=gap)
        return self._settle(read)

    def reconnected(self, read: int, now: float) -> dict[int, list[int]]:
        """:meth:`Sender.reconnected`; returns, by route, the sequences to delete."""
        self.sender.reconnected(read, now)
        return self._settle(read)

    def _settle(self, read: int) -> dict[int, list[int]]:
        done: dict[int, list[int]] = {}
        for route, arr in self._routes.items():
            head = self._heads[route]
            end = bisect.bisect_right(arr, read, head)
            if end > head:
                done[route] = arr[head:end].tolist()
                if end > 4096 and end * 2 > len(arr):
                    del arr[:end]
                    end = 0
                self._heads[route] = end
        return done

    def lowest(self) -> int | None:
        """The lowest sequence still owed, if any (the log keeps it)."""
        heads = [arr[h] for r, arr in self._routes.items() if len(arr) > (h := self._heads[r])]
        return min(heads, default=None)

    def owed(self, route: int) -> int:
        """How many messages ``route`` still owes."""
        return len(self._routes.get(route, ())) - self._heads.get(route, 0)
