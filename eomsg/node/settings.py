"""A node's tunables, and those a data directory can save (``eomsg config set``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from eomsg.core import memory
from eomsg.core.durations import parse_duration
from eomsg.core.limits import Limits, check_frame, default_frame, parse_size
from eomsg.store.journal import SEGMENT_BYTES
from eomsg.store.store import WAL_LIMIT
from eomsg.store.writer import APPLY_DELAY

DEFAULT_DISK_RESERVE = 128 << 20


@dataclass(frozen=True)
class NodeSettings:
    """Tunables of a node. ``retention`` keeps fully consumed messages in the log for
    replay; ``compact_every`` settled records trigger a compaction of the hot tables;
    below ``disk_reserve`` bytes free on its disk the node refuses publishes (0: never),
    so that a checkpoint and a restart always find room; ``wal_limit`` bounds the WAL,
    ``journal_segment`` the journal's files; ``apply_delay`` is how long a write
    journaled alone waits for others before DuckDB gets it (0: at once); ``node_name``
    names it to the nodes it is linked to; ``max_frame`` is ``serve --max-frame``, the
    largest frame its server accepts, which must carry ``limits.max_payload`` (None:
    :attr:`frame_limit` follows it); ``memory_limit`` holds its memory, shared between
    its parts as :mod:`eomsg.core.memory` says (``dedup_memory`` and ``queue_memory``
    set a part's bytes instead of its share)."""

    limits: Limits = field(default_factory=Limits)
    retention: float = 86400.0
    compact_every: int = 50_000
    gc_interval: float = 60.0
    tick: float | None = 1.0  # maintenance period in seconds; None: only on demand
    disk_reserve: int = DEFAULT_DISK_RESERVE
    wal_limit: int = WAL_LIMIT  # the WAL is checkpointed when it grows past this
    journal_segment: int = SEGMENT_BYTES  # a journal segment ends past this size
    apply_delay: float = APPLY_DELAY  # seconds a journaled write waits to go to DuckDB
    node_name: str | None = None  # its name among linked nodes (None: the one it keeps)
    max_frame: int | None = None  # serve --max-frame; None: follows max-payload
    memory_limit: int = memory.DEFAULT_LIMIT  # serve --memory-limit (eomsg.core.memory)
    dedup_memory: int | None = None  # the dedup window's bytes (None: its share)
    queue_memory: int | None = None  # the queues' bytes (None: their share)

    @property
    def dedup_budget(self) -> int:
        """The bytes the dedup window may take in memory before it spills to disk."""
        if self.dedup_memory is not None:
            return self.dedup_memory
        return memory.dedup_limit(self.memory_limit)

    @property
    def queue_budget(self) -> int:
        """The bytes the queues may take before publishes are refused (MemoryFull)."""
        if self.queue_memory is not None:
            return self.queue_memory
        return memory.queues_limit(self.memory_limit)

    @property
    def frame_limit(self) -> int:
        """The largest frame the node's server accepts from a client: ``max_frame``, or
        what ``max-payload`` needs (:func:`~eomsg.core.limits.default_frame`)."""
        if self.max_frame is not None:
            return self.max_frame
        return default_frame(self.limits.max_payload)


# Settings a data directory can save (``eomsg config set``): name -> (parse to the
# canonical text, apply to NodeSettings).
SETTINGS: dict[str, tuple[Callable[[str], str], Callable[[NodeSettings, str], NodeSettings]]] = {
    "retention": (
        lambda v: f"{parse_duration(v, allow_zero=True):g}",
        lambda s, v: replace(s, retention=float(v)),
    ),
    "gc-interval": (
        lambda v: f"{parse_duration(v, allow_zero=True):g}",
        lambda s, v: replace(s, gc_interval=float(v)),
    ),
    "max-payload": (
        lambda v: str(parse_size(v)),
        lambda s, v: replace(s, limits=replace(s.limits, max_payload=int(v))),
    ),
    "disk-reserve": (
        lambda v: str(parse_size(v, low=0, high=1 << 50)),
        lambda s, v: replace(s, disk_reserve=int(v)),
    ),
}


def apply_saved(settings: NodeSettings, saved: dict[str, str]) -> NodeSettings:
    """``settings`` with the ``saved`` ones applied; InvalidConfig if they cannot work
    together: a ``max-payload`` that frames of ``max_frame`` cannot carry (refused when
    a node opens with such a ``--max-frame``, and when it is set on a node that has
    one)."""
    for name, value in saved.items():
        if name in SETTINGS:
            settings = SETTINGS[name][1](settings, value)
    if settings.max_frame is not None:
        check_frame(settings.max_frame, settings.limits.max_payload)
    return settings
