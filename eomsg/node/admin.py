"""Administration: queues (create, delete, subscribe, unsubscribe, purge, their configs)
and the node's saved settings. Not a seed of its own: it sets up what the seeds run on —
a queue's subscriptions are the routes of seed 004, its cursor that of seed 003.

:class:`Admin` is a component of the node (``node.admin``) owning no state of its own: the
queues it makes, changes and drops are the node's registry (:mod:`eomsg.node.state`:
``install``, ``reconfigure_queue``, ``uninstall``), and what it needs of the node is its
:class:`Kernel` protocol. Under the lock discipline of :mod:`eomsg.node.state`: a change
takes ``admin_lock``, waits for its commit, and only then changes the in-memory state under
``lock``. A purge is a settlement like any other: recorded and queued under ``lock``
alone.
"""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from typing import Protocol

from eomsg.core.access import OWNER
from eomsg.core.queues import REFUSE, QueueConfig
from eomsg.errors import InvalidConfig, QueueExists, QueueNotEmpty
from eomsg.node.settings import SETTINGS, apply_saved
from eomsg.node.state import AuditRow, QueueState, Shared, to_us
from eomsg.store.store import Store
from eomsg.store.writer import RowBatch


class Kernel(Shared, Protocol):
    """What administration needs of the rest of the node (:class:`~eomsg.node.state.NodeState`)."""

    admin_lock: threading.Lock

    def install(self, queue_id: int, config: QueueConfig) -> QueueState: ...
    def reconfigure_queue(self, q: QueueState, config: QueueConfig) -> None: ...
    def uninstall(self, q: QueueState) -> None: ...


class Admin:
    """Queue and node administration."""

    def __init__(self, kernel: Kernel) -> None:
        self._kernel = kernel

    def create_queue(self, config: QueueConfig, *, by: str = OWNER) -> bool:
        """Create ``config.name`` (and its dead-letter queue, if missing). Idempotent:
        False if an identical queue exists; QueueExists if it differs."""
        with self._kernel.admin_lock:
            existing = self._kernel.queues.get(config.name)
            if existing is not None:
                if existing.config == config:
                    return False
                raise QueueExists(
                    f"queue {config.name!r} already exists with other settings; delete it "
                    "first, or change it with `eomsg queue subscribe` or `eomsg queue limit`"
                )
            if config.dead_letter and config.dead_letter not in self._kernel.queues:
                self._create(QueueConfig(config.dead_letter), by)
            self._create(config, by)
            return True

    def _create(self, config: QueueConfig, by: str) -> None:
        self._kernel.check_open()
        job = Store.create_queue_job(config, to_us(self._kernel.clock()))
        said = json.dumps(config.to_json(), separators=(",", ":"))
        entry = self._kernel.audit_entry(by, "create-queue", config.name, said)
        queue_id = self._kernel.store.writer.run(Store.audited(job, entry)).result()
        with self._kernel.lock:
            self._kernel.install(queue_id, config)

    def delete_queue(self, name: str, *, force: bool = False, by: str = OWNER) -> int:
        """Delete a queue and its records; returns how many messages it still held.
        Refuses a non-empty queue unless ``force``, and a queue another dead-letters to.
        Consumers still bound to it are told they were unbound."""
        with self._kernel.admin_lock:
            q = self._kernel.queue(name)
            users = [
                u.config.name for u in self._kernel.queues.values() if u.config.dead_letter == name
            ]
            if users:
                raise QueueNotEmpty(
                    f"queue {name!r} is the dead-letter queue of {', '.join(users)}; "
                    "delete those first"
                )
            depth = q.cursor.depth
            if depth and not force:
                raise QueueNotEmpty(
                    f"queue {name!r} holds {depth} messages; purge it or use --force"
                )
            self._kernel.check_open()
            entry = self._kernel.audit_entry(
                by, "delete-queue", name, f"{depth} messages" if depth else ""
            )
            self._kernel.store.writer.run(Store.audited(Store.drop_queue_job(q.id), entry)).result()
            with self._kernel.lock:
                self._kernel.uninstall(q)
            return depth

    def subscribe(self, name: str, pattern: str, *, by: str = OWNER) -> bool:
        """Route messages published from now on to topics matching ``pattern`` into the
        queue. Idempotent: False if it was subscribed already."""
        with self._kernel.admin_lock:
            q = self._kernel.queue(name)
            if pattern in q.config.subscriptions:
                return False
            config = replace(q.config, subscriptions=(*q.config.subscriptions, pattern))
            self._update(q, config, self._kernel.audit_entry(by, "subscribe", name, pattern))
            return True

    def unsubscribe(self, name: str, pattern: str, *, by: str = OWNER) -> bool:
        """Stop routing ``pattern`` to the queue. Idempotent: False if not subscribed."""
        with self._kernel.admin_lock:
            q = self._kernel.queue(name)
            if pattern not in q.config.subscriptions:
                return False
            subs = tuple(p for p in q.config.subscriptions if p != pattern)
            entry = self._kernel.audit_entry(by, "unsubscribe", name, pattern)
            self._update(q, replace(q.config, subscriptions=subs), entry)
            return True

    def limit_queue(
        self,
        name: str,
        max_messages: int | None = None,
        overflow: str = REFUSE,
        max_bytes: int | None = None,
        *,
        by: str = OWNER,
    ) -> QueueConfig:
        """Set the queue's max-messages and max-bytes (None: no limit) and overflow
        policy; returns its settings. A queue already past a new limit keeps what it
        holds: the next publish is refused, or makes room by dead-lettering the oldest
        waiting. InvalidConfig for a limit below 1, an unknown policy, or
        dead-letter-oldest without a dead-letter queue. Idempotent.

        A max-bytes set where there was none reads the size of every message the queue
        holds (once, from the log): from then on each one's size is kept in memory
        while the queue has the limit (about 100 bytes a message)."""
        with self._kernel.admin_lock:
            q = self._kernel.queue(name)
            config = replace(
                q.config, max_messages=max_messages, overflow=overflow, max_bytes=max_bytes
            )
            if config != q.config:
                said = ", ".join(
                    f"{what} {'none' if limit is None else limit}"
                    for what, limit in (("max-messages", max_messages), ("max-bytes", max_bytes))
                )
                entry = self._kernel.audit_entry(by, "limit-queue", name, f"{said}, {overflow}")
                if max_bytes is not None and q.staged_sizes is None:
                    with self._kernel.lock:  # from now on what is staged for it is sized...
                        q.staged_sizes, q.incoming_bytes = {}, 0
                self._update(q, config, entry)  # ...and all staged before, durable
            return config

    def _update(self, q: QueueState, config: QueueConfig, entry: AuditRow) -> None:
        self._kernel.check_open()
        self._kernel.store.writer.run(
            Store.audited(Store.update_queue_job(q.id, config), entry)
        ).result()
        sizes: dict[int, int] = {}
        if config.max_bytes is not None and not q.cursor.sized:
            # Read while publishers go on (0.24 s for 10^6 messages, not a pause of the
            # node); what came in meanwhile is read under the lock below.
            sizes = self._kernel.store.queue_payload_sizes(q.id)
        with self._kernel.lock:
            self._kernel.reconfigure_queue(q, config)
            if config.max_bytes is None:
                q.staged_sizes, q.incoming_bytes = None, 0
                q.cursor.track_sizes(None)
            elif not q.cursor.sized:  # what it holds, read once
                pending = q.cursor.pending()
                sizes |= self._kernel.egress.payload_sizes([s for s in pending if s not in sizes])
                q.cursor.track_sizes(sizes)

    def purge(self, name: str, *, by: str = OWNER) -> int:
        """Settle every message in the queue as purged; returns how many."""
        now = self._kernel.clock()
        with self._kernel.lock:
            self._kernel.check_open()
            q = self._kernel.queue(name)
            settlements = q.cursor.purge()
            batch = RowBatch()
            self._kernel.record_settlements(batch, q, settlements, now)
            batch.add(
                "audit",
                *self._kernel.audit_entry(by, "purge", name, f"{len(settlements)} messages"),
            )
            future = self._kernel.queue_write(batch)
        self._kernel.await_commit(future)
        return len(settlements)

    def queue_config(self, name: str) -> QueueConfig:
        with self._kernel.lock:
            return self._kernel.queue(name).config

    def queue_names(self) -> list[str]:
        with self._kernel.lock:
            return sorted(self._kernel.queues)

    # -- settings -----------------------------------------------------------------------

    def configure(self, name: str, value: str, *, by: str = OWNER) -> str:
        """Save a node setting in the data directory and apply it now; returns its value
        in canonical form. ``retention`` and ``gc-interval`` are durations, ``max-payload``
        a size."""
        if name not in SETTINGS:
            raise InvalidConfig(f"unknown setting {name!r}; known: {', '.join(SETTINGS)}")
        canonical = SETTINGS[name][0](value)
        with self._kernel.admin_lock:
            self._kernel.check_open()
            settings = apply_saved(self._kernel.settings, {name: canonical})  # refused: unsaved
            job = Store.save_setting_job(name, canonical)
            entry = self._kernel.audit_entry(by, "configure", name, canonical)
            self._kernel.store.writer.run(Store.audited(job, entry)).result()
            self._kernel.settings = settings
        return canonical

    def saved_settings(self) -> dict[str, str]:
        """Every setting and its value, saved or default, in canonical form."""
        s = self._kernel.settings
        return {
            "retention": f"{s.retention:g}",
            "gc-interval": f"{s.gc_interval:g}",
            "max-payload": str(s.limits.max_payload),
            "disk-reserve": str(s.disk_reserve),
        }
