"""A history checker for tests of linked nodes: what was published where (each with its
outcome) against what each queue received, reporting every message lost, duplicated or
out of its origin's order.

A message is named by its id; its origin is the node it was published on. ``acked``
holds the ids whose publish was acknowledged: each must reach every queue expected,
exactly once. One whose outcome stayed unknown may arrive or not, but never twice.
Within a queue, the messages of one origin must arrive in the order that origin
published them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field


@dataclass
class Report:
    """What the checker found, by queue: ids lost, ids received more than once, and pairs
    (earlier, later) of one origin received the wrong way round; ids nobody published."""

    lost: dict[str, list[str]] = field(default_factory=dict)
    duplicated: dict[str, list[str]] = field(default_factory=dict)
    reordered: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    unexpected: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.reordered or self.unexpected)

    def counts(self) -> dict[str, int]:
        return {
            kind: sum(map(len, getattr(self, kind).values()))
            for kind in ("lost", "duplicated", "reordered", "unexpected")
        }

    def __str__(self) -> str:
        parts = []
        for kind in ("lost", "duplicated", "reordered", "unexpected"):
            for queue, items in sorted(getattr(self, kind).items()):
                parts.append(f"{queue}: {len(items)} {kind}, e.g. {items[:5]}")
        return "; ".join(parts) or "ok"


def check(
    published: Mapping[str, Sequence[str]],
    acked: Iterable[str],
    received: Mapping[str, Sequence[str]],
) -> Report:
    """``published``: each origin's ids in the order it published them; ``received``:
    each queue's ids in the order it received them (every queue expects every message)."""
    acked = set(acked)
    origin_of = {i: o for o, ids in published.items() for i in ids}
    rank = {i: n for ids in published.values() for n, i in enumerate(ids)}
    report = Report()
    for queue, ids in received.items():
        seen = Counter(ids)
        if lost := [i for i in acked if i not in seen]:
            report.lost[queue] = sorted(lost)
        if twice := [i for i, n in seen.items() if n > 1]:
            report.duplicated[queue] = sorted(twice)
        if unexpected := [i for i in seen if i not in origin_of]:
            report.unexpected[queue] = sorted(unexpected)
        last: dict[str, str] = {}
        wrong = []
        for i in ids:
            origin = origin_of.get(i)
            if origin is None:
                continue
            before = last.get(origin)
            if before is not None and rank[i] < rank[before]:
                wrong.append((before, i))
            last[origin] = i if before is None or rank[i] > rank[before] else before
        if wrong:
            report.reordered[queue] = wrong
    return report
