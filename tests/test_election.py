"""The election state machine (seed 002), against a model that states the rules plainly."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from eomsg.core.election import TRANSITIONS, Change, Election, Epochs, FlowState, Move
from eomsg.errors import FlowNotFound


def test_exclusive_queue_first_bound_is_active_others_stand_by() -> None:
    e = Election(1, immediate=True, epochs=Epochs())
    assert e.bind(1) == [Change(1, True, 1)]
    assert e.bind(2) == []
    assert [(v.flow, v.active) for v in e.flows()] == [(1, True), (2, False)]


def test_unbinding_the_active_flow_promotes_the_best_standby() -> None:
    e = Election(1, immediate=True, epochs=Epochs())
    e.bind(1, priority=0)
    e.bind(2, priority=5)  # immediate: takes over at once
    e.bind(3, priority=3)
    assert e.unbind(2) == [Change(2, False, 2), Change(3, True, 3)]


def test_unbinding_a_standby_flow_changes_nothing() -> None:
    e = Election(1, immediate=False, epochs=Epochs())
    e.bind(1)
    e.bind(2)
    assert e.unbind(2) == [] and e.is_active(1)


def test_immediate_lets_a_higher_priority_newcomer_depose_the_active_flow() -> None:
    e = Election(1, immediate=True, epochs=Epochs())
    e.bind(1, priority=1)
    assert e.bind(2, priority=9) == [Change(1, False, 1), Change(2, True, 2)]
    assert e.bind(3, priority=9) == []  # equal priority: the earlier bind keeps it


def test_without_immediate_a_newcomer_waits_for_a_free_slot() -> None:
    e = Election(1, immediate=False, epochs=Epochs())
    e.bind(1, priority=1)
    e.bind(2, priority=2)
    assert e.bind(3, priority=9) == []
    assert e.unbind(1) == [Change(1, False, 1), Change(3, True, 2)]  # best standby wins


def test_limited_queue_keeps_n_active_and_epochs_never_repeat() -> None:
    epochs = Epochs()
    a, b = Election(2, True, epochs), Election(0, True, epochs)
    a.bind(1)
    a.bind(2)
    a.bind(3)
    assert a.active_count() == 2
    b.bind(4)
    b.bind(5)
    assert b.active_count() == 2  # 0: no limit
    assert sorted(a.live_epochs() | b.live_epochs()) == [1, 2, 3, 4]


def test_unknown_flow_and_illegal_moves_are_refused() -> None:
    e = Election(1, True, Epochs())
    with pytest.raises(FlowNotFound):
        e.unbind(7)
    assert (FlowState.STANDBY, Move.DEACTIVATE) not in TRANSITIONS


class Model:
    """The rules, written as directly as possible: the active set is recomputed from
    scratch (immediate) or kept and topped up (not immediate)."""

    def __init__(self, max_active: int, immediate: bool) -> None:
        self.limit, self.immediate = max_active, immediate
        self.flows: dict[int, tuple[int, int]] = {}  # flow -> (priority, order)
        self.active: set[int] = set()
        self.order = 0

    def ranked(self) -> list[int]:
        return sorted(self.flows, key=lambda f: (-self.flows[f][0], self.flows[f][1]))

    def settle(self) -> None:
        limit = self.limit or len(self.flows)
        if self.immediate:
            self.active = set(self.ranked()[:limit])
            return
        while len(self.active) < min(limit, len(self.flows)):
            self.active.add(next(f for f in self.ranked() if f not in self.active))


class ElectionMachine(RuleBasedStateMachine):
    """Random binds and unbinds: the election agrees with the model, never exceeds
    max_active, and reports every change exactly once, alternating per flow."""

    def __init__(self) -> None:
        super().__init__()
        self.epochs = Epochs()
        self.election: Election | None = None
        self.model: Model | None = None
        self.next_flow = 1
        self.seen: dict[int, list[Change]] = {}
        self.notified_active: set[int] = set()

    @precondition(lambda self: self.election is None)
    @rule(max_active=st.integers(0, 4), immediate=st.booleans())
    def configure(self, max_active: int, immediate: bool) -> None:
        self.election = Election(max_active, immediate, self.epochs)
        self.model = Model(max_active, immediate)

    def _apply(self, changes: list[Change]) -> None:
        deactivations = [c for c in changes if not c.active]
        assert changes[: len(deactivations)] == deactivations  # inactive before active
        for c in changes:
            history = self.seen.setdefault(c.flow, [])
            if history:
                assert history[-1].active != c.active  # alternates: each change once
            if c.active:
                assert c.epoch > max((h.epoch for h in history), default=0)
                self.notified_active.add(c.flow)
            else:
                assert history and history[-1].epoch == c.epoch
                self.notified_active.discard(c.flow)
            history.append(c)

    @precondition(lambda self: self.election is not None)
    @rule(priority=st.integers(-3, 3))
    def bind(self, priority: int) -> None:
        assert self.election is not None and self.model is not None
        flow, self.next_flow = self.next_flow, self.next_flow + 1
        self.model.order += 1
        self.model.flows[flow] = (priority, self.model.order)
        self.model.settle()
        self._apply(self.election.bind(flow, priority))

    @precondition(lambda self: self.model is not None and self.model.flows)
    @rule(data=st.data())
    def unbind(self, data: st.DataObject) -> None:
        assert self.election is not None and self.model is not None
        flow = data.draw(st.sampled_from(sorted(self.model.flows)))
        del self.model.flows[flow]
        self.model.active.discard(flow)
        self.model.settle()
        self._apply(self.election.unbind(flow))
        self.notified_active.discard(flow)

    @invariant()
    def agrees_with_the_model(self) -> None:
        if self.election is None or self.model is None:
            return
        active = {v.flow for v in self.election.flows() if v.active}
        assert active == self.model.active == self.notified_active
        limit = self.model.limit or len(self.model.flows)
        assert len(active) == min(limit, len(self.model.flows))  # never more, no idle slot
        assert len(self.election.live_epochs()) == len(active)
        if self.model.immediate:  # settled: always the best-ranked flows
            assert active == set(self.model.ranked()[:limit])


TestElectionMachine = ElectionMachine.TestCase
TestElectionMachine.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
