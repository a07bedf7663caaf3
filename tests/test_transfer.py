"""The transfer rules of one link (core/transfer.py): a message is stored once on the
receiving side however the network drops, repeats, reorders or cuts, and however often
either side restarts."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eomsg.core.transfer import Frame, Outbox, Receiver, Sender, Verdict
from eomsg.errors import IllegalMove


def test_a_frame_is_taken_repeated_or_a_gap() -> None:
    r = Receiver(read=10)
    assert r.offer(10, [12, 15]).verdict is Verdict.TAKE
    r.committed(15)
    assert r.offer(10, [12, 15]).verdict is Verdict.REPEAT  # a resend: acknowledged again
    assert r.offer(20, [21]).verdict is Verdict.GAP  # what came after 15 was lost
    taken = r.offer(10, [12, 15, 16, 19])  # a resend reaching past the read sequence
    assert (taken.verdict, taken.start) == (Verdict.TAKE, 2)
    assert r.accepted == 19 and r.read == 15  # judged against what is being committed
    r.refused()  # its commit was refused: not taken after all
    assert r.accepted == 15


@pytest.mark.parametrize("frame", [(5, []), (5, [5]), (5, [7, 7]), (5, [8, 6])])
def test_a_frame_whose_sequences_do_not_increase_is_refused(frame: tuple[int, list[int]]) -> None:
    with pytest.raises(IllegalMove, match="sequences must increase"):
        Receiver(read=0).offer(*frame)


def test_the_sender_goes_back_on_its_timer_or_when_the_peer_says_so() -> None:
    s = Sender(2, [1, 2, 3, 5, 8], 0.0, batch=2, window=3, resend_after=1.0)
    assert s.frames(0.0, take=False) == [Frame(2, (3, 5)), Frame(5, (8,))]  # a look
    assert s.frames(0.0) == [Frame(2, (3, 5)), Frame(5, (8,))]
    assert s.frames(0.1) == [] and s.in_flight == 3
    assert not s.tick(0.9) and s.tick(1.0)  # nothing acknowledged for a second
    assert s.frames(1.0) == [Frame(2, (3, 5)), Frame(5, (8,))] and s.resends == 1
    assert s.acknowledged(5, 1.2) == [3, 5] and s.pending == 1
    s.add([9, 11])
    assert s.frames(1.2) == [Frame(8, (9, 11))]
    assert s.acknowledged(8, 1.3, gap=True) == [8]  # the peer missed 9: from there again
    assert s.frames(1.3) == [Frame(8, (9, 11))] and s.resends == 2
    with pytest.raises(IllegalMove):
        s.add([10])


class Link:
    """A sender and a receiver joined by a channel that drops, repeats and reorders
    frames and acknowledgements, either side of which may restart: the sender keeps only
    what its store keeps (the sequences not yet acknowledged to it), the receiver its
    durable read sequence and what it stored."""

    def __init__(self, rng: random.Random, fault: float) -> None:
        self.rng = rng
        self.fault = fault
        self.now = 0.0
        self.routed: list[int] = []  # what the sender's store holds for the peer, ever
        self.deleted: set[int] = set()  # … and deleted on an acknowledgement
        self.stored: list[int] = []  # what the receiver's store holds, in commit order
        self.read = 0  # the receiver's durable read sequence
        self.receiver = Receiver(self.read)
        self.sender = self._connect()
        self.to_peer: list[Frame] = []
        self.to_sender: list[tuple[int, bool]] = []
        self.committing: list[tuple[list[int], int]] = []

    def _connect(self) -> Sender:
        """(Re)connect: the receiver says its read sequence; the sender starts from it
        with what its store still holds."""
        pending = [s for s in self.routed if s not in self.deleted]
        window, batch = self.rng.randint(1, 10), self.rng.randint(1, 4)  # frames cut anew
        sender = Sender(0, pending, self.now, window=window, batch=batch, resend_after=1.0)
        self.deleted.update(sender.acknowledged(self.read, self.now))
        return sender

    def publish(self, n: int) -> None:
        first = (self.routed[-1] if self.routed else 0) + self.rng.randint(1, 3)
        seqs = list(range(first, first + 2 * n, 2))
        self.routed.extend(seqs)
        self.sender.add(seqs)

    def _deliver(self, queue: list, item: object) -> None:
        roll = self.rng.random()
        if roll < self.fault:
            return  # dropped
        if roll < 2 * self.fault:
            queue.append(item)  # repeated
        if roll < 3 * self.fault and queue:
            queue.insert(self.rng.randrange(len(queue)), item)  # reordered
        else:
            queue.append(item)

    def step(self) -> None:
        self.now += 0.3
        self.sender.tick(self.now)
        self.sender.batch = self.rng.randint(1, 4)  # frames cut anew, so resends overlap
        for f in self.sender.frames(self.now):
            self._deliver(self.to_peer, f)
        while self.to_peer:
            f = self.to_peer.pop(0)
            offer = self.receiver.offer(f.prev, list(f.seqs))
            if offer.verdict is Verdict.TAKE and self.rng.random() < self.fault / 3:
                self.receiver.refused()  # the store refused the commit (a full disk)
            elif offer.verdict is Verdict.TAKE:
                self.committing.append((list(f.seqs[offer.start :]), f.seqs[-1]))
            else:
                self._deliver(self.to_sender, (self.receiver.read, offer.verdict is Verdict.GAP))
        while self.committing and self.rng.random() < 0.6:  # commits become durable late
            seqs, read = self.committing.pop(0)
            self.stored.extend(seqs)
            self.read = read
            self.receiver.committed(read)
            self._deliver(self.to_sender, (read, False))
        while self.to_sender:
            read, gap = self.to_sender.pop(0)
            self.deleted.update(self.sender.acknowledged(read, self.now, gap=gap))

    def restart_sender(self) -> None:
        self.to_peer.clear()
        self.to_sender.clear()
        self.sender = self._connect()

    def restart_receiver(self) -> None:
        self.committing.clear()  # lost with the process: never durable
        self.to_peer.clear()
        self.to_sender.clear()
        self.receiver = Receiver(self.read)
        self.sender = self._connect()  # the connection died with it


@settings(max_examples=300, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    fault=st.sampled_from([0.0, 0.1, 0.3]),
    script=st.lists(
        st.sampled_from(["publish", "step", "step", "restart_sender", "restart_receiver"]),
        min_size=5,
    ),
)
def test_each_message_is_stored_once_and_in_order(
    seed: int, fault: float, script: list[str]
) -> None:
    link = Link(random.Random(seed), fault)
    for move in script:
        if move == "publish":
            link.publish(link.rng.randint(1, 6))
        else:
            getattr(link, move)()
    link.fault = 0.0  # the network heals
    for _ in range(100):
        link.step()
    assert link.stored == link.routed  # each once, in order
    assert link.deleted == set(link.routed) and link.sender.pending == 0
    assert link.stored == sorted(set(link.stored))


def test_a_peer_that_lost_its_state_is_sent_what_follows_from_where_it_stands() -> None:
    sender = Sender(0, [1, 2, 3], 0.0)
    sender.frames(0.0)
    assert sender.acknowledged(3, 0.0) == [1, 2, 3]
    sender.add([4])
    assert sender.reconnected(0, 1.0) == []  # the receiver starts again from nothing
    receiver = Receiver(0)
    (frame,) = sender.frames(1.0)
    assert receiver.offer(frame.prev, frame.seqs).verdict is Verdict.TAKE


@given(st.lists(st.integers(1, 3), min_size=1, max_size=60), st.data())
def test_an_outbox_knows_each_message_s_route_and_settles_by_route(
    routes: list[int], data: st.DataObject
) -> None:
    """Messages 1..n, each added on its route: a frame's routes are theirs (one route or
    several), and an acknowledgement settles, by route, exactly what it newly covers."""
    box = Outbox(0, 0.0)
    for seq, route in enumerate(routes, 1):
        box.add(route, [seq])
    seqs = list(range(1, len(routes) + 1))
    lo = data.draw(st.integers(1, len(seqs)))
    hi = data.draw(st.integers(lo, len(seqs)))
    table, index = box.routes_of(seqs[lo - 1 : hi])
    each = [table[0]] * (hi - lo + 1) if index is None else [table[i] for i in index]
    assert each == routes[lo - 1 : hi]
    assert len(table) == len(set(table)) and (index is None) == (len(table) == 1)
    settled: dict[int, list[int]] = {}
    for read in sorted(data.draw(st.lists(st.integers(0, len(seqs)), max_size=4))):
        for route, done in box.acknowledged(read, 1.0).items():
            settled.setdefault(route, []).extend(done)
        assert box.sender.acked == max(read, box.sender.acked)
    covered = box.sender.acked
    want: dict[int, list[int]] = {}
    for seq, route in enumerate(routes[:covered], 1):
        want.setdefault(route, []).append(seq)
    assert settled == want
    assert box.lowest() == (covered + 1 if covered < len(seqs) else None)
