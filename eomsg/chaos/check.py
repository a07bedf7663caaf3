"""The checker: a whole history (:mod:`eomsg.chaos.history`) against what eomsg
promises, every violation found and named.

- **lost**: a message acknowledged to its publisher that some queue it was for never
  had applied; **duplicated**: one applied twice from a queue (an unknown outcome may
  be applied once or not at all, never twice); **unexpected**: one applied that was never
  published, or whose publish was refused, or from a queue it was not for.
- **queue order**: an ordered queue handed one flow its first deliveries out of
  sequence; **origin order**: from an ordered queue, an application applied a
  message after one that its origin node had been sent only once the first was
  acknowledged (real-time order, per origin node: across nodes no order is promised).
- **stale attempt**: a delete accepted for a delivery after the same message had been
  delivered again; **stale epoch**: on an exclusive queue, a delete accepted from a flow
  after the queue had announced a newer epoch active; **overlapping flows**: one accepted
  from a flow after a delete of a newer flow of that queue had been accepted.
- **in doubt**: a transaction still prepared once the run has healed; **transaction
  outcome**: one whose client was told committed that is not, or told refused that is.

"After" and "before" are real time: one operation precedes another when it completed
before the other was invoked, so nothing is called a violation that concurrency allows.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from eomsg.chaos.history import (
    Activity,
    Applied,
    Event,
    Outcome,
    Published,
    QueueDeclared,
    Received,
    Resolved,
    Settled,
    Transacted,
)

VIOLATIONS = (
    "lost",
    "duplicated",
    "unexpected",
    "queue_order",
    "origin_order",
    "stale_attempt",
    "stale_epoch",
    "overlapping_flows",
    "in_doubt",
    "txn_outcome",
)


@dataclass
class Report:
    """Every violation found, by kind, each said in one line; and what was checked."""

    found: dict[str, list[str]] = field(default_factory=lambda: {k: [] for k in VIOLATIONS})
    checked: Counter[str] = field(default_factory=Counter)

    @property
    def ok(self) -> bool:
        return not any(self.found.values())

    def counts(self) -> dict[str, int]:
        return {kind: len(items) for kind, items in self.found.items()}

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "violations": self.counts(), "checked": dict(self.checked)}

    def __str__(self) -> str:
        parts = [
            f"{len(items)} {kind.replace('_', ' ')}, e.g. {'; '.join(items[:3])}"
            for kind, items in self.found.items()
            if items
        ]
        return "\n".join(parts) or "ok"


@dataclass
class _Publish:
    """Every publish of one id, merged: a retry of an unknown outcome is the same
    message (its id deduplicates it)."""

    node: str
    expect: frozenset[str]
    outcome: Outcome
    invoked: float
    completed: float  # the first acknowledgement; infinity if none came

    def merge(self, p: Published) -> None:
        if p.outcome is Outcome.OK or self.outcome is Outcome.OK:
            self.outcome = Outcome.OK
        elif p.outcome is Outcome.UNKNOWN:
            self.outcome = Outcome.UNKNOWN
        self.invoked = min(self.invoked, p.invoked)
        if p.outcome is Outcome.OK:
            self.completed = min(self.completed, p.completed)


def check(events: Iterable[Event]) -> Report:
    """Check a whole history: every event of the run, healed and drained."""
    report = Report()
    ordered: set[str] = set()
    exclusive: set[str] = set()
    published: dict[str, _Publish] = {}
    applied: dict[tuple[str, str], list[str]] = defaultdict(list)  # (queue, app) -> ids
    received: list[Received] = []
    settled: list[Settled] = []
    activity: list[Activity] = []
    told: dict[str, list[Outcome]] = defaultdict(list)  # txid -> what its client was told
    resolved: list[Resolved] = []
    for e in events:
        match e:
            case QueueDeclared():
                if e.ordered:
                    ordered.add(e.queue)
                if e.exclusive:
                    exclusive.add(e.queue)
                report.checked["queues"] += 1
            case Published():
                known = published.get(e.id)
                if known is None:
                    done = e.completed if e.outcome is Outcome.OK else math.inf
                    published[e.id] = _Publish(
                        e.node, frozenset(e.expect), e.outcome, e.invoked, done
                    )
                else:
                    known.merge(e)
                report.checked["publishes"] += 1
            case Applied():
                applied[e.queue, e.app].append(e.id)
                report.checked["applied"] += 1
            case Received():
                received.append(e)
            case Settled():
                settled.append(e)
            case Activity():
                activity.append(e)
            case Transacted():
                told[e.txid].append(e.outcome)
            case Resolved():
                resolved.append(e)
    report.checked.update(receives=len(received), settles=len(settled), transactions=len(resolved))
    _delivery(report, published, applied)
    _origin_order(report, published, applied, ordered)
    _queue_order(report, received, ordered)
    _fencing(report, received, settled, activity, exclusive)
    _transactions(report, told, resolved)
    return report


def _delivery(
    report: Report, published: dict[str, _Publish], applied: dict[tuple[str, str], list[str]]
) -> None:
    by_queue: dict[str, Counter[str]] = defaultdict(Counter)
    for (queue, _), ids in applied.items():
        by_queue[queue].update(ids)
    queues = set(by_queue) | {q for p in published.values() for q in p.expect}
    for queue in sorted(queues):
        seen = by_queue[queue]
        for msg_id, p in published.items():
            if p.outcome is Outcome.OK and queue in p.expect and not seen[msg_id]:
                report.found["lost"].append(f"{msg_id} never applied from {queue}")
        for msg_id, n in seen.items():
            why = _unexpected(published.get(msg_id), queue)
            if why is not None:
                report.found["unexpected"].append(f"{msg_id} applied from {queue}: {why}")
            elif n > 1:
                report.found["duplicated"].append(f"{msg_id} applied {n} times from {queue}")


def _unexpected(p: _Publish | None, queue: str) -> str | None:
    """Why a message applied from ``queue`` should not be there, if it should not."""
    if p is None:
        return "never published"
    if p.outcome is Outcome.FAILED:
        return "its publish was refused"
    return None if queue in p.expect else "not its queue"


def _origin_order(
    report: Report,
    published: dict[str, _Publish],
    applied: dict[tuple[str, str], list[str]],
    ordered: set[str],
) -> None:
    for (queue, app), ids in applied.items():
        if queue not in ordered:
            continue
        latest: dict[str, tuple[float, str]] = {}  # origin -> (latest invocation, its id)
        for msg_id in ids:
            p = published.get(msg_id)
            if p is None:
                continue
            before = latest.get(p.node)
            if before is not None and p.completed < before[0]:
                report.found["origin_order"].append(
                    f"{app} applied {msg_id} from {queue} after {before[1]}, "
                    "which was sent only once it was acknowledged"
                )
            if before is None or p.invoked > before[0]:
                latest[p.node] = (p.invoked, msg_id)


def _queue_order(report: Report, received: list[Received], ordered: set[str]) -> None:
    last: dict[tuple[str, str, int], int] = {}
    for r in received:
        if r.queue not in ordered or r.attempt != 1:
            continue
        flow = (r.queue, r.consumer, r.epoch)
        before = last.get(flow)
        if before is not None and r.seq < before:
            report.found["queue_order"].append(
                f"{r.consumer} got {r.queue}'s {r.seq} after {before} in epoch {r.epoch}"
            )
        last[flow] = max(r.seq, before or 0)


class _Latest:
    """The highest value among events up to a time: when the newer one was known."""

    def __init__(self, points: Iterable[tuple[float, int]]) -> None:
        self._times: list[float] = []
        self._highest: list[int] = []
        for at, value in sorted(points):
            self._times.append(at)
            self._highest.append(max(value, self._highest[-1] if self._highest else value))

    def before(self, t: float) -> int:
        """The highest value of the events strictly before ``t`` (-1 if none)."""
        i = bisect.bisect_left(self._times, t)
        return self._highest[i - 1] if i else -1


def _fencing(
    report: Report,
    received: list[Received],
    settled: list[Settled],
    activity: list[Activity],
    exclusive: set[str],
) -> None:
    attempts: dict[tuple[str, int], _Latest] = {}
    by_message: dict[tuple[str, int], list[tuple[float, int]]] = defaultdict(list)
    for r in received:
        by_message[r.queue, r.seq].append((r.at, r.attempt))
    for key, points in by_message.items():
        attempts[key] = _Latest(points)
    epochs: dict[str, _Latest] = {}
    accepted: dict[str, _Latest] = {}
    for queue in exclusive:
        epochs[queue] = _Latest((a.at, a.epoch) for a in activity if a.queue == queue and a.active)
        accepted[queue] = _Latest(
            (s.completed, s.epoch)
            for s in settled
            if s.queue == queue and s.outcome is Outcome.OK and s.epoch
        )
    for s in settled:
        if s.outcome is not Outcome.OK:
            continue
        latest = attempts.get((s.queue, s.seq))
        if latest is not None and latest.before(s.invoked) > s.attempt:
            report.found["stale_attempt"].append(
                f"{s.queue}'s {s.seq} deleted as attempt {s.attempt} after attempt "
                f"{latest.before(s.invoked)} was delivered"
            )
        if s.queue not in exclusive or not s.epoch:
            continue
        newer = epochs[s.queue].before(s.invoked)
        if newer > s.epoch:
            report.found["stale_epoch"].append(
                f"{s.queue}'s {s.seq} deleted in epoch {s.epoch} after epoch {newer} was active"
            )
        newer = accepted[s.queue].before(s.invoked)
        if newer > s.epoch:
            report.found["overlapping_flows"].append(
                f"{s.queue}'s {s.seq} deleted in epoch {s.epoch} after a delete in epoch "
                f"{newer} was accepted"
            )


def _transactions(report: Report, told: dict[str, list[Outcome]], resolved: list[Resolved]) -> None:
    for t in resolved:
        outcomes = told.get(t.txid, [])
        if t.state == "prepared":
            report.found["in_doubt"].append(f"{t.txid} is still in doubt")
        elif Outcome.OK in outcomes and t.state != "committed":
            report.found["txn_outcome"].append(f"{t.txid} was acknowledged but is {t.state}")
        elif Outcome.FAILED in outcomes and t.state == "committed":
            report.found["txn_outcome"].append(f"{t.txid} was refused but is committed")
