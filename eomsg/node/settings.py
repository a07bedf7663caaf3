"""A node's tunables, and those a data directory can save (``eomsg config set``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from eomsg.core.durations import parse_duration
from eomsg.core.limits import Limits, parse_size
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
    names it to the nodes it is linked to."""

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
    for name, value in saved.items():
        if name in SETTINGS:
            settings = SETTINGS[name][1](settings, value)
    return settings
