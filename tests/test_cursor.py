"""The cursor against a reference model that states the rules directly: deliveries
named by ``(seq, attempt)``, settled only by their holder, un-counted when given back
unseen."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from eomsg.core.cursor import Cursor, Outcome, Release, Settlement
from eomsg.errors import InvalidInput, NotInFlight, StaleDelivery

ACK = 10.0


@dataclass
class M:
    state: str  # unread | flight | parked
    attempt: int = 0
    due: float = 0.0
    expires: float | None = None
    holder: int = 0


class Model:
    """A dictionary of messages and the rules, applied in the simplest order."""

    def __init__(self, max_redeliveries: int | None) -> None:
        self.max = max_redeliveries
        self.msgs: dict[int, M] = {}
        self.settled: dict[int, Outcome] = {}
        self.read_seq = 0

    def advance(self, now: float) -> set[tuple[int, Outcome]]:
        out = set()
        for seq, m in sorted(self.msgs.items()):
            if m.state == "flight" and m.due <= now:
                if m.expires is not None and m.expires <= now:
                    out.add(self._settle(seq, Outcome.EXPIRED))
                elif self.max is not None and m.attempt > self.max:
                    out.add(self._settle(seq, Outcome.DEAD_LETTERED))
                else:
                    m.state, m.due = "parked", now
            elif m.state != "flight" and m.expires is not None and m.expires <= now:
                out.add(self._settle(seq, Outcome.EXPIRED))
        return out

    def take(self, now: float, limit: int, holder: int) -> tuple[list[tuple[int, int]], set]:
        out = self.advance(now)
        ready = sorted(s for s, m in self.msgs.items() if m.state == "parked" and m.due <= now)
        unread = sorted(s for s, m in self.msgs.items() if m.state == "unread")
        got = []
        for seq in ready + unread:
            if len(got) == limit:
                break
            m = self.msgs[seq]
            if m.state == "unread":
                self.read_seq = seq
            m.state, m.attempt, m.due, m.holder = "flight", m.attempt + 1, now + ACK, holder
            got.append((seq, m.attempt))
        return got, out

    def _settle(self, seq: int, outcome: Outcome) -> tuple[int, Outcome]:
        del self.msgs[seq]
        self.settled[seq] = outcome
        return seq, outcome


class CursorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 1000.0
        self.next_seq = 1
        self.max = 2
        self.cursor = Cursor(ack_timeout=ACK, max_redeliveries=self.max)
        self.model = Model(self.max)

    @rule(ttl=st.one_of(st.none(), st.floats(1, 60)), gap=st.integers(0, 3))
    def append(self, ttl: float | None, gap: int) -> None:
        self.next_seq += gap
        seq = self.next_seq
        self.next_seq += 1
        expires = None if ttl is None else self.now + ttl
        self.cursor.append(seq, expires)
        self.model.msgs[seq] = M("unread", expires=expires)

    @rule(data=st.data())
    def move_in(self, data: st.DataObject) -> None:
        """A message dead-lettered here from another queue: a seq skipped below the read
        position (ready at once), or one above everything here (unread)."""
        known = self.model.msgs.keys() | self.model.settled.keys()
        free = [s for s in range(1, self.cursor.read_seq) if s not in known]
        seq = data.draw(st.sampled_from([*free, self.next_seq]))
        self.next_seq = max(self.next_seq, seq + 1)
        self.cursor.append(seq, moved=True)
        self.model.msgs[seq] = M("parked") if seq in free else M("unread")

    @rule(limit=st.integers(1, 5), holder=st.sampled_from([1, 2]))
    def take(self, limit: int, holder: int) -> None:
        taken = self.cursor.take(self.now, limit, holder=holder)
        expected, settled = self.model.take(self.now, limit, holder)
        assert [(d.seq, d.attempt) for d in taken.deliveries] == expected
        assert {(s.seq, s.outcome) for s in taken.settlements} == settled
        if taken.run is not None:  # every message pending in its range, handed out first
            run = taken.deliveries[taken.run :]
            assert {d.attempt for d in run} == {1}
            first, last = run[0].seq, run[-1].seq
            inside = {s for s in self.cursor.pending() if first <= s <= last}
            assert inside == {d.seq for d in run}

    @rule(seconds=st.floats(0.5, 30))
    def wait(self, seconds: float) -> None:
        self.now += seconds

    @rule()
    def poll(self) -> None:
        got = {(s.seq, s.outcome) for s in self.cursor.poll(self.now)}
        assert got == self.model.advance(self.now)

    @precondition(lambda self: any(m.attempt > 0 for m in self.model.msgs.values()))
    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        delivered = [s for s, m in self.model.msgs.items() if m.attempt > 0]
        seq = data.draw(st.sampled_from(delivered))
        m = self.model.msgs[seq]
        key = (seq, m.attempt)
        with pytest.raises(StaleDelivery):  # an attempt that is over
            self.cursor.delete_many([(seq, m.attempt - 1)], holder=m.holder)
        with pytest.raises(StaleDelivery):  # someone else's
            self.cursor.delete_many([key], holder=3 - m.holder)
        assert self.cursor.delete_many([key], holder=m.holder) == [True]
        self.model._settle(seq, Outcome.DELETED)
        assert self.cursor.delete_many([key], holder=m.holder) == [False]  # idempotent

    @precondition(lambda self: any(m.state == "flight" for m in self.model.msgs.values()))
    @rule(data=st.data())
    def delete_batch(self, data: st.DataObject) -> None:
        """Several of one holder's deliveries deleted in one call, in any order, with
        some settled already and some listed twice: each is settled once, True the
        first time it is named."""
        flying = sorted((s, m.holder) for s, m in self.model.msgs.items() if m.state == "flight")
        holder = data.draw(st.sampled_from(sorted({h for _, h in flying})))
        mine = [s for s, h in flying if h == holder]
        chosen = data.draw(st.lists(st.sampled_from(mine), min_size=1, max_size=6))
        gone = [s for s in self.model.settled if s <= self.cursor.read_seq]
        extra = data.draw(st.lists(st.sampled_from(gone), max_size=2)) if gone else []
        keys = [(s, self.model.msgs[s].attempt) for s in chosen] + [(s, 1) for s in extra]
        keys = data.draw(st.permutations(keys))
        named: set[int] = set()
        expected = []
        for seq, _ in keys:
            expected.append(seq in self.model.msgs and seq not in named)
            named.add(seq)
        assert self.cursor.delete_many(keys, holder=holder) == expected
        for seq in set(chosen):
            self.model._settle(seq, Outcome.DELETED)

    @precondition(lambda self: any(m.state == "flight" for m in self.model.msgs.values()))
    @rule(data=st.data(), delay=st.sampled_from([0.0, 5.0]))
    def release(self, data: st.DataObject, delay: float) -> None:
        flying = sorted(s for s, m in self.model.msgs.items() if m.state == "flight")
        seq = data.draw(st.sampled_from(flying))
        m = self.model.msgs[seq]
        with pytest.raises(StaleDelivery):
            self.cursor.release_many([(seq, m.attempt)], self.now, delay, holder=3 - m.holder)
        (result,) = self.cursor.release_many([(seq, m.attempt)], self.now, delay, holder=m.holder)
        m = self.model.msgs[seq]
        if m.expires is not None and m.expires <= self.now:
            assert result == Settlement(seq, Outcome.EXPIRED)
            self.model._settle(seq, Outcome.EXPIRED)
        elif m.attempt > self.max:
            assert result == Settlement(seq, Outcome.DEAD_LETTERED)
            self.model._settle(seq, Outcome.DEAD_LETTERED)
        else:
            assert result == Release(seq, m.attempt, self.now + delay)
            m.state, m.due = "parked", self.now + delay

    @precondition(lambda self: any(m.attempt > 0 for m in self.model.msgs.values()))
    @rule(data=st.data())
    def return_unseen(self, data: st.DataObject) -> None:
        """A consumer gives back a delivery it never handed out: in flight, or timed
        out and not handed out again, it is un-counted; anything else is ignored."""
        seq = data.draw(st.sampled_from(sorted(self.model.msgs)))
        m = self.model.msgs[seq]
        attempt, holder = data.draw(
            st.sampled_from(
                [(m.attempt, m.holder), (m.attempt, 3 - m.holder), (m.attempt + 1, m.holder)]
            )
        )
        got = self.cursor.return_unseen([(seq, attempt)], self.now, holder=holder)
        mine = (attempt, holder) == (m.attempt, m.holder) and m.attempt > 0
        if mine and m.state == "flight":
            m.attempt -= 1
            if m.expires is not None and m.expires <= self.now:
                assert got == [Settlement(seq, Outcome.EXPIRED)]
                self.model._settle(seq, Outcome.EXPIRED)
            else:
                assert got == [Release(seq, m.attempt, self.now, unseen=True)]
                m.state, m.due = "parked", self.now
        elif mine and m.state == "parked" and m.due <= self.now and self._ready(seq):
            m.attempt -= 1
            assert got == [Release(seq, m.attempt, self.cursor._delivered[seq].due, unseen=True)]
        else:
            assert got == []

    def _ready(self, seq: int) -> bool:
        """Whether the cursor made a parked message ready (its timer fired)."""
        entry = self.cursor._delivered.get(seq)
        return entry is not None and entry.ready

    @rule(n=st.integers(1, 4))
    def make_room(self, n: int) -> None:
        """The oldest waiting — unread or parked, never in flight — are dead-lettered."""
        waiting = sorted(s for s, m in self.model.msgs.items() if m.state != "flight")[:n]
        got = [(s.seq, s.outcome) for s in self.cursor.make_room(n)[0]]
        assert got == [(s, Outcome.DEAD_LETTERED) for s in waiting]
        for seq in waiting:
            self.model._settle(seq, Outcome.DEAD_LETTERED)

    @rule()
    def delete_unread_is_refused(self) -> None:
        unread = [s for s, m in self.model.msgs.items() if m.attempt == 0]
        if unread:
            with pytest.raises(NotInFlight):
                self.cursor.delete_many([(unread[0], 1)])

    @invariant()
    def counts_agree(self) -> None:
        assert self.cursor.depth == len(self.model.msgs)
        assert self.cursor.in_flight == sum(m.state == "flight" for m in self.model.msgs.values())
        assert self.cursor.pending() == sorted(self.model.msgs)
        assert self.cursor.lowest_pending() == min(self.model.msgs, default=None)


TestCursorAgainstModel = CursorMachine.TestCase
TestCursorAgainstModel.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_delivers_in_order_then_redelivers_first() -> None:
    c = Cursor(ack_timeout=10)
    for seq in (3, 5, 8):
        c.append(seq)
    first = c.take(100.0, 2).deliveries
    assert [(d.seq, d.attempt, d.deadline) for d in first] == [(3, 1, 110.0), (5, 1, 110.0)]
    assert c.read_seq == 5
    later = c.take(111.0, 5).deliveries  # 3 and 5 timed out: they come back before 8
    assert [(d.seq, d.attempt) for d in later] == [(3, 2), (5, 2), (8, 1)]


def test_dead_letter_after_max_redeliveries() -> None:
    c = Cursor(ack_timeout=10, max_redeliveries=1)
    c.append(1)
    for attempt in (1, 2):
        (d,) = c.take(0.0, 1).deliveries
        assert d.attempt == attempt
        result = c.release_many([(1, attempt)], 0.0)
    assert result == [Settlement(1, Outcome.DEAD_LETTERED)]
    assert c.depth == 0


def test_expired_message_is_never_delivered() -> None:
    c = Cursor(ack_timeout=10)
    c.append(1, expires_at=50.0)
    c.append(2)
    taken = c.take(60.0, 10)
    assert [d.seq for d in taken.deliveries] == [2]
    assert taken.settlements == [Settlement(1, Outcome.EXPIRED)]


def test_late_arrival_is_ready_at_once() -> None:
    c = Cursor(ack_timeout=10)
    c.append(10)
    c.take(0.0, 1)
    c.append(4)  # dead-lettered here from another queue, older than read_seq
    assert [d.seq for d in c.take(0.0, 5).deliveries] == [4]


def test_delete_and_release_are_atomic() -> None:
    c = Cursor(ack_timeout=10)
    c.append(1)
    c.append(2)
    c.take(0.0, 1)
    with pytest.raises(NotInFlight):
        c.delete_many([(1, 1), (2, 1)])  # 2 was never delivered: 1 must stay in flight
    assert c.in_flight == 1
    with pytest.raises(NotInFlight):
        c.release_many([(1, 1), (1, 1)], 0.0)
    assert c.in_flight == 1


@pytest.mark.parametrize("delay", [math.nan, math.inf, -math.inf, -1.0, 1e308, 4e9])
def test_a_release_delay_out_of_range_is_refused_changing_nothing(delay: float) -> None:
    c = Cursor(ack_timeout=10)
    c.append(1)
    c.take(0.0, 1)
    with pytest.raises(InvalidInput, match="release delay is 0 to"):
        c.release_many([(1, 1)], 0.0, delay)
    assert c.in_flight == 1
    assert c.release_many([(1, 1)], 0.0, 0.0) == [Release(1, 1, 0.0)]


def test_restore_then_append_rebuilds_the_same_queue() -> None:
    c = Cursor(ack_timeout=10)
    c.restore(5, attempt=2, due=20.0, in_flight=True, expires_at=None)
    c.append(3)  # below read_seq: undelivered, becomes ready
    c.append(9)
    assert c.read_seq == 5
    assert [d.seq for d in c.take(10.0, 5).deliveries] == [3, 9]
    c.delete_many([(3, 1), (9, 1)])
    with pytest.raises(StaleDelivery, match="node restarted"):  # its holder is gone
        c.delete_many([(5, 2)])
    assert [(d.seq, d.attempt) for d in c.take(21.0, 5).deliveries] == [(5, 3)]
