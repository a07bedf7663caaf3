"""The process's cycle collector, tuned for moving messages in volume.

A node allocates a few objects per message and keeps them a while — until the journal
takes them, DuckDB holds them, or the publish returns — so with CPython's defaults they
outlive the young passes, and every few thousand messages a full pass walks every object
of the process: a third of a served node's CPU, and half the time of a batched publish
embedded in an application (docs/benchmarks.md). :func:`settle_collector` moves what is
alive now out of the collector's sight and spaces its young passes.

``eomsg serve`` calls it once the node is open. A node embedded in an application leaves
the application's collector alone: an application that publishes or consumes in volume
calls ``eomsg.settle_collector()`` itself, once its start-up is done (objects alive then
are never collected as cycles, so not in the middle of making and dropping them).
"""

from __future__ import annotations

import gc

GC_YOUNG = 10_000  # allocations between the cycle collector's young passes (CPython: 700)


def settle_collector() -> None:
    """Collect once, freeze what is alive out of the collector's sight (``gc.freeze``),
    and run young passes every :data:`GC_YOUNG` allocations. For the whole process:
    call it once, after start-up."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG, *gc.get_threshold()[1:])
