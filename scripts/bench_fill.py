"""Filling and draining a queue as the command line does, shared by the embedded
scenarios of scripts/bench.py and scripts/bench_scale.py."""

from __future__ import annotations

from collections.abc import Iterable

from eomsg.client.broker import Broker
from eomsg.core.message import Outgoing


def publish_all(broker: Broker, batches: Iterable[list[Outgoing]]) -> None:
    """Publish as ``eomsg publish --stdin`` does: the next batch is prepared while the
    previous one commits; each is acknowledged only after its commit."""
    previous = None
    for messages in batches:
        future = broker.publish_batch_async(messages)
        if previous is not None:
            previous.result()
        previous = future
    if previous is not None:
        previous.result()


def drain(broker: Broker, batch: int, queue: str = "bench") -> int:
    """Consume as ``eomsg consume`` does: each batch's deletion commits together with
    the next fetch. Returns how many messages were taken."""
    count = 0
    pending = []
    while taken := broker.fetch(queue, batch):
        pending.append(broker.delete_async(queue, [d.key for d in taken]))
        count += len(taken)
    for deleted in pending:
        deleted.result()
    return count
