"""Which consumers of a queue are active (seed 002): the election state machine.

A *flow* is one consumer bound to one queue. A queue lets at most ``max_active`` of its
flows be active at a time (1: an exclusive queue, N: a limited queue, 0: no limit); the
rest wait on standby. Flows rank by priority (higher first), then by bind order (earlier
first). The selection runs on every stimulus — a bind, an unbind for any reason — and:

- fills free active slots with the best-ranked standby flows;
- with ``immediate``, also lets a better-ranked newcomer take the slot of the worst-ranked
  active flow, so the active set is always the best ``max_active`` flows;
- without ``immediate``, never deposes an active flow for a newcomer: a restarted
  high-priority consumer waits until a slot frees, so activity does not flap back and
  forth as consumers fail and recover.

Every activation draws a new **epoch** from a node-wide, strictly increasing source. Work
handed out to a flow is tagged with its epoch, and the node refuses a delete from an
epoch that is over — a deposed consumer cannot settle what now belongs to another.

Pure state: no clock, no I/O, no threads. Each stimulus returns the :class:`Change` list
the node must announce, deactivations before activations, each change once.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from eomsg.errors import FlowNotFound, IllegalMove


class FlowState(enum.Enum):
    STANDBY = "standby"
    ACTIVE = "active"
    GONE = "gone"


class Move(enum.Enum):
    ACTIVATE = "activate"
    DEACTIVATE = "deactivate"
    UNBIND = "unbind"


TRANSITIONS: dict[tuple[FlowState, Move], FlowState] = {
    (FlowState.STANDBY, Move.ACTIVATE): FlowState.ACTIVE,
    (FlowState.ACTIVE, Move.DEACTIVATE): FlowState.STANDBY,
    (FlowState.STANDBY, Move.UNBIND): FlowState.GONE,
    (FlowState.ACTIVE, Move.UNBIND): FlowState.GONE,
}
"""(state, move) → the flow's state after it. Anything else is a bug in the selection."""


@dataclass(frozen=True, slots=True)
class Change:
    """A flow became active (with a new ``epoch``) or inactive (``epoch`` is the one that
    ended). The node tells the flow's consumer, who acknowledges it."""

    flow: int
    active: bool
    epoch: int


@dataclass(frozen=True, slots=True)
class FlowView:
    """One bound flow as inspection shows it; ``epoch`` is the current one while active,
    the last one held (0 if none) on standby."""

    flow: int
    priority: int
    order: int
    active: bool
    epoch: int


@dataclass(frozen=True, slots=True)
class FlowEvent:
    """What the node tells a flow's consumer: ``bound`` (the answer to its bind, with
    ``active`` saying whether it starts active), ``active``, ``inactive``, or ``unbound``
    (an administrator unbound it; it is inactive and gets nothing more)."""

    queue: str
    flow: int
    kind: str
    active: bool
    epoch: int

    def to_json(self) -> dict[str, Any]:
        return {"event": self.kind, "queue": self.queue, "flow": self.flow, "epoch": self.epoch}


@dataclass(frozen=True, slots=True)
class FlowInfo:
    """A bound flow as ``eomsg inspect flows`` shows it."""

    queue: str
    flow: int
    owner: str
    priority: int
    active: bool
    epoch: int
    bound_at: float
    in_flight: int

    def to_json(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "flow": self.flow,
            "owner": self.owner,
            "priority": self.priority,
            "state": "active" if self.active else "standby",
            "epoch": self.epoch,
            "bound_at": self.bound_at,
            "in_flight": self.in_flight,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FlowInfo:
        return cls(
            data["queue"],
            data["flow"],
            data["owner"],
            data["priority"],
            data["state"] == "active",
            data["epoch"],
            data["bound_at"],
            data["in_flight"],
        )


class Epochs:
    """The node-wide source of epochs: strictly increasing and never reused, because the
    node persists a high-water mark ahead of ``last`` before handing any out."""

    __slots__ = ("last",)

    def __init__(self, last: int = 0) -> None:
        self.last = last

    def next(self) -> int:
        self.last += 1
        return self.last


class _Flow:
    __slots__ = ("epoch", "flow", "order", "priority", "state")

    def __init__(self, flow: int, priority: int, order: int) -> None:
        self.flow = flow
        self.priority = priority
        self.order = order
        self.state = FlowState.STANDBY
        self.epoch = 0

    def rank(self) -> tuple[int, int]:
        return (-self.priority, self.order)

    def move(self, move: Move) -> None:
        after = TRANSITIONS.get((self.state, move))
        if after is None:
            raise IllegalMove(f"flow {self.flow}: cannot {move.value} while {self.state.value}")
        self.state = after


class Election:
    """The flows bound to one queue and which of them are active."""

    def __init__(self, max_active: int, immediate: bool, epochs: Epochs) -> None:
        if max_active < 0:
            raise ValueError("max_active must be 0 (no limit) or more")
        self.max_active = max_active
        self.immediate = immediate
        self._epochs = epochs
        self._flows: dict[int, _Flow] = {}
        self._orders = 0

    def __len__(self) -> int:
        return len(self._flows)

    def __contains__(self, flow: int) -> bool:
        return flow in self._flows

    # -- stimuli ---------------------------------------------------------------------------

    def bind(self, flow: int, priority: int = 0) -> list[Change]:
        """Add a standby flow, then select. The flow's own activation, if any, is among
        the changes returned."""
        if flow in self._flows:
            raise ValueError(f"flow {flow} is bound already")
        self._orders += 1
        self._flows[flow] = _Flow(flow, priority, self._orders)
        return self._select()

    def unbind(self, flow: int) -> list[Change]:
        """Remove a flow — unbound by its consumer, disconnected, silent past the
        keep-alive, or unbound by an administrator — then select. If it was active, its
        deactivation comes first in the changes."""
        f = self._flows.pop(flow, None)
        if f is None:
            raise FlowNotFound(f"flow {flow} is not bound to this queue")
        was_active = f.state is FlowState.ACTIVE
        f.move(Move.UNBIND)
        changes = [Change(flow, False, f.epoch)] if was_active else []
        return changes + self._select()

    # -- questions ------------------------------------------------------------------------

    def is_active(self, flow: int) -> bool:
        f = self._flows.get(flow)
        return f is not None and f.state is FlowState.ACTIVE

    def epoch_of(self, flow: int) -> int:
        """The flow's current epoch, or 0 when it is not active."""
        f = self._flows.get(flow)
        return f.epoch if f is not None and f.state is FlowState.ACTIVE else 0

    def active_count(self) -> int:
        return sum(1 for f in self._flows.values() if f.state is FlowState.ACTIVE)

    def live_epochs(self) -> set[int]:
        """Epochs whose deletes are still accepted: those of the active flows."""
        return {f.epoch for f in self._flows.values() if f.state is FlowState.ACTIVE}

    def flows(self) -> list[FlowView]:
        """Every bound flow, best-ranked first."""
        return [
            FlowView(f.flow, f.priority, f.order, f.state is FlowState.ACTIVE, f.epoch)
            for f in sorted(self._flows.values(), key=_Flow.rank)
        ]

    # -- the selection ---------------------------------------------------------------------

    def _select(self) -> list[Change]:
        ranked = sorted(self._flows.values(), key=_Flow.rank)
        limit = self.max_active or len(ranked)
        if self.immediate:
            chosen = ranked[:limit]
        else:
            kept = [f for f in ranked if f.state is FlowState.ACTIVE][:limit]
            free = limit - len(kept)
            kept_ids = {f.flow for f in kept}
            chosen = kept + [f for f in ranked if f.flow not in kept_ids][:free]
        target = {f.flow for f in chosen}
        changes: list[Change] = []
        for f in ranked:
            if f.state is FlowState.ACTIVE and f.flow not in target:
                f.move(Move.DEACTIVATE)
                changes.append(Change(f.flow, False, f.epoch))
        for f in ranked:
            if f.state is FlowState.STANDBY and f.flow in target:
                f.move(Move.ACTIVATE)
                f.epoch = self._epochs.next()
                changes.append(Change(f.flow, True, f.epoch))
        return changes
