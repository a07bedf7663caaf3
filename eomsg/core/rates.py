"""Messages in and out per second, per queue, over the last minute: what ``inspect
queues`` shows beside the counts (as ``rabbitmqctl list_queues`` and ``nats stream info``
do). Pure: the node's ticker notes the queues' running totals, with the time, and a rate
is the change since the oldest note within the window."""

from __future__ import annotations

from collections import deque

WINDOW = 60.0  # seconds a rate looks back over
EVERY = 1.0  # seconds between two notes kept

Totals = dict[str, tuple[int, int]]  # queue -> (messages arrived, messages deleted), ever


class Rates:
    """Running totals noted over time, and the rates they give."""

    def __init__(self) -> None:
        self._notes: deque[tuple[float, Totals]] = deque()

    def note(self, now: float, totals: Totals) -> None:
        """Keep ``totals`` as of ``now`` (at most one note per EVERY seconds), and drop
        those older than the window."""
        if self._notes and now - self._notes[-1][0] < EVERY:
            return
        self._notes.append((now, totals))
        while len(self._notes) > 1 and now - self._notes[1][0] >= WINDOW:
            self._notes.popleft()

    def rates(self, now: float, totals: Totals) -> dict[str, tuple[float, float]]:
        """In and out per second for each queue in ``totals``, since the oldest note
        that has it (at most a window ago, at least EVERY seconds ago). A queue that a
        note within that span lacks did not exist then: its totals were nothing, so its
        rate runs from the latest such note — what passed through it before it was
        first noted counts (a queue made and filled within a tick showed 0.0 for a
        minute). None for a queue no note in the span has or lacks."""
        found: dict[str, tuple[float, float]] = {}
        made_after: dict[str, float] = {}  # queue -> the latest note from before it was
        for then, old in self._notes:  # oldest first
            span = now - then
            if not EVERY <= span <= WINDOW + EVERY:
                continue
            for name, (arrived, deleted) in totals.items():
                before = old.get(name)
                if before is None:
                    made_after[name] = then
                elif name not in found and name not in made_after:
                    found[name] = (
                        max(0, arrived - before[0]) / span,
                        max(0, deleted - before[1]) / span,
                    )
        for name, then in made_after.items():
            arrived, deleted = totals[name]
            found[name] = (arrived / (now - then), deleted / (now - then))
        return found
