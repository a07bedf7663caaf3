"""Sequence numbers as people read them: a set written as its runs (``1-3, 7``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

SHOWN = 8  # runs written out; past them, how many more there are


def runs(values: Iterable[int]) -> list[tuple[int, int]]:
    """The runs of consecutive numbers in ``values`` (in order, each once)."""
    out: list[tuple[int, int]] = []
    for v in sorted(set(values)):
        if out and v == out[-1][1] + 1:
            out[-1] = (out[-1][0], v)
        else:
            out.append((v, v))
    return out


def written(values: Iterable[int]) -> str:
    """``1-3, 7`` for [1, 2, 3, 7]; past :data:`SHOWN` runs, how many more there are."""
    return written_runs(runs(values))


def written_runs(found: Sequence[tuple[int, int]]) -> str:
    """Runs (first, last) as :func:`written` writes them."""
    shown = [f"{a}" if a == b else f"{a}-{b}" for a, b in found[:SHOWN]]
    if len(found) > SHOWN:
        shown.append(f"and {len(found) - SHOWN} more runs")
    return ", ".join(shown)
