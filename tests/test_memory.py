"""A node's memory held to its limit (issue 35, item 15): the dedup window spills its
oldest ids to disk past its share and still recognises every retry; the queues past
theirs hold producers back with a typed, retryable refusal; `eomsg inspect memory`
says where the memory goes. (How flat a node stays over a long run is measured by
`scripts/bench.py --scenario soak`, not here.)"""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from eomsg.core.limits import Limits
from eomsg.core.message import Outgoing
from eomsg.core.queues import QueueConfig
from eomsg.errors import MemoryFull
from eomsg.node.node import Node, NodeSettings
from eomsg.store import store as store_module
from eomsg.store import writer as writer_module
from eomsg.store.writer import Writer

from .conftest import Cli, NodeFactory, NodeProcess


def test_a_node_spills_its_oldest_ids_and_still_knows_every_retry(
    open_node: NodeFactory, data_dir: Path
) -> None:
    node = open_node(dedup_memory=256 << 10)  # a few runs of ids; the rest on disk
    n = 400_000
    first = []
    for lo in range(0, n, 20_000):
        first += node.ingress.publish_batch(
            [Outgoing("t", b"x", id=f"order-{i}") for i in range(lo, lo + 20_000)]
        )
        node.maintenance.maintain()
    use = node.inspection.memory()
    # Its budget, and at most the newest run and the dictionaries besides (FOLD ids each).
    assert use.spilled_ids > 100_000 and use.dedup <= (256 << 10) + 65_536 * (64 + 150)
    assert len(node.dedup) + use.spilled_ids >= n
    again = [Outgoing("t", b"y", id=f"order-{i}") for i in range(0, n, 997)]
    for _ in range(2):  # before and after a restart
        results = node.ingress.publish_batch(again)
        assert all(r.duplicate for r in results)
        assert [r.seq for r in results] == [first[i].seq for i in range(0, n, 997)]
        node.close()
        node = open_node(dedup_memory=256 << 10)
        assert node.inspection.memory().spilled_ids >= use.spilled_ids
    # The log collected: the ids go from memory and disk alike, and may publish anew.
    node.admin.configure("retention", "0")
    node.admin.configure("gc-interval", "0")
    node.maintenance.maintain()
    assert not any(r.duplicate for r in node.ingress.publish_batch(again[:50]))
    assert node.inspection.memory().spilled_ids == 0


def test_the_queues_past_their_share_hold_producers_back(open_node: NodeFactory) -> None:
    node = open_node(queue_memory=64 << 10)  # 8 bytes a message waiting: ~8,000
    node.admin.create_queue(QueueConfig("q", ("t",)))
    published = 0
    with pytest.raises(MemoryFull) as refused:
        for _ in range(100):
            node.ingress.publish_batch([Outgoing("t", b"x") for _ in range(1000)])
            published += 1000
            node.store.writer.sync()  # (what is journaled and not yet in DuckDB counts too)
    assert 7000 <= published <= 9000
    assert refused.value.message.startswith(f"the node's queues hold {published} messages in ")
    assert "over their share of 64.0 KiB" in refused.value.message
    assert "publishing resumes as consumers take messages" in refused.value.message
    while taken := node.delivery.fetch("q", 5000):  # consumers take the queue back under its share
        node.delivery.delete("q", [d.key for d in taken])
    node.store.writer.sync()  # (their deletes journaled count until DuckDB has them)
    node.ingress.publish_batch([Outgoing("t", b"again")])  # and publishing resumes by itself


def test_inspect_memory_says_where_it_goes(
    cli: Cli, serve: object, data_dir: Path, eomsg_bin: str, cli_env: dict[str, str]
) -> None:
    node = NodeProcess(eomsg_bin, data_dir, cli_env, "--memory-limit", "512MiB").start()
    try:
        cli("queue", "create", "q", "--subscribe", "t")
        cli("publish", "t", "--stdin", "--id-prefix", "a-", input=b"x\n" * 1000)
        use = json.loads(cli("inspect", "memory", "--json").stdout)
        assert use["limit"] == 512 << 20 and use["backlog"] == 1000 and use["dedup_ids"] == 1000
        assert use["duckdb"] > 0 and use["rss"] > 0 and use["spilled_ids"] == 0
        text = cli("inspect", "memory").stdout.decode()
        assert "dedup window" in text and "1000 ids; 0 on disk" in text and "512.0 MiB" in text
    finally:
        node.kill()
    refused = cli("serve", "--memory-limit", "10MiB", code=3)
    assert refused.stderr == b"Error: size '10MiB' must be between 256 MiB and 1 TiB\n"


def test_a_damaged_spill_file_is_made_anew_from_the_store(
    open_node: NodeFactory, data_dir: Path
) -> None:
    """It is only an index of what DuckDB holds: unreadable, it is rebuilt, and retries
    of what it held are still recognised."""
    node = open_node(dedup_memory=64 << 10)
    first = node.ingress.publish_batch([Outgoing("t", b"x", id=f"m{i}") for i in range(300_000)])
    node.maintenance.maintain()
    assert node.inspection.memory().spilled_ids > 0
    node.close()
    spill = data_dir / "dedup.sqlite"
    spill.write_bytes(b"not a database" * 1000)
    for suffix in ("-wal", "-shm"):
        Path(f"{spill}{suffix}").unlink(missing_ok=True)
    node = open_node(dedup_memory=64 << 10)
    again = node.ingress.publish_batch(
        [Outgoing("t", b"y", id=f"m{i}") for i in range(0, 300_000, 1009)]
    )
    assert [r.seq for r in again] == [first[i].seq for i in range(0, 300_000, 1009)]
    assert all(r.duplicate for r in again)


def test_a_take_reads_a_bounded_number_of_payload_bytes(open_node: NodeFactory) -> None:
    """A prefetch of many large messages is not read into memory at once: a take holds
    about 16 MiB of payloads, whatever the window asks for (before and after a
    restart, when the queue's message size is known from the store)."""
    node = open_node(limits=Limits(max_payload=8 << 20))
    node.admin.create_queue(QueueConfig("q", ("t",)))
    node.ingress.publish_batch([Outgoing("t", bytes(4 << 20)) for _ in range(12)])
    assert len(node.delivery.fetch("q", 12)) == 4
    node.close()
    node = open_node(limits=Limits(max_payload=8 << 20))
    assert len(node.delivery.fetch("q", 12)) == 4  # the ones above came back, redelivered


class _NoMemory:
    """A DuckDB cursor of a moment when the buffers are full (a reader of a large
    payload beside the writer's checkpoint of another): its first read fails as
    DuckDB's does; the next is read, noting whether the writer was held meanwhile."""

    def __init__(self, cursor: duckdb.DuckDBPyConnection, writer: Writer) -> None:
        self.cursor, self.writer = cursor, writer
        self.reads: list[bool] = []

    def execute(self, sql: str, params: object = ()) -> duckdb.DuckDBPyConnection:
        self.reads.append(self.writer._quiet.locked())
        if len(self.reads) == 1:
            raise duckdb.OutOfMemoryException("Out of Memory Error: failed to pin block")
        return self.cursor.execute(sql, params)


def test_a_read_duckdb_has_no_memory_for_runs_again_with_the_writer_held(
    open_node: NodeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under the node's lock too (requeue reads payloads under it): the read waits for
    no work of the journal's thread, which needs that lock."""
    node = open_node()
    node.admin.create_queue(QueueConfig("q", ("t",)))
    node.store.writer.sync()
    full = _NoMemory(node.store.reads.reader(), node.store.writer)
    monkeypatch.setattr(node.store.reads, "reader", lambda: full)
    with node.lock:
        assert [config.name for _, config in node.store.load_queues()] == ["q"]
    assert full.reads == [False, True]


def test_an_apply_duckdb_has_no_memory_for_waits_and_loses_nothing(
    open_node: NodeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = open_node()
    node.admin.create_queue(QueueConfig("q", ("t",)))
    failures = iter([True, True, True])
    insert = writer_module.insert_rows

    def short_of_memory(conn: duckdb.DuckDBPyConnection, batch: object, lsn: int) -> None:
        insert(conn, batch, lsn)  # type: ignore[arg-type]
        if next(failures, False):
            raise duckdb.OutOfMemoryException("Out of Memory Error: failed to allocate")

    monkeypatch.setattr(writer_module, "insert_rows", short_of_memory)
    monkeypatch.setattr(writer_module, "APPLY_MEMORY_WAIT", 0.01)
    node.ingress.publish_batch([Outgoing("t", b"kept")])
    node.store.writer.sync()
    assert next(failures, None) is None and not node.store.writer.failed
    assert node.store.query("SELECT seq, payload FROM messages")[1] == [(1, b"kept")]
    assert [d.message.payload for d in node.delivery.fetch("q", 10)] == [b"kept"]


def test_an_open_that_fails_past_the_store_lets_go_of_it(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The spill file cannot be made (a full disk): the open fails, and lets go of the
    directory's lock and files, so that the next open in the same process (serve
    waiting for room) can succeed."""
    Node.open(data_dir, NodeSettings(tick=None)).close()

    def full(_: Path) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store_module, "SpilledIds", full)
    with pytest.raises(OSError):
        Node.open(data_dir, NodeSettings(tick=None))
    monkeypatch.undo()
    with Node.open(data_dir, NodeSettings(tick=None)) as node:
        assert node.inspection.memory().spilled_ids == 0


def test_settle_collector_freezes_what_is_alive_and_spaces_young_passes() -> None:
    """For the whole process, so in a process of its own."""
    code = (
        "import gc, eomsg\n"
        "from eomsg.node.collector import GC_YOUNG\n"
        "assert gc.get_freeze_count() == 0\n"
        "eomsg.settle_collector()\n"
        "assert gc.get_freeze_count() > 1000, gc.get_freeze_count()\n"
        "assert gc.get_threshold()[0] == GC_YOUNG\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_consumer_draining_a_backlog_leaves_nothing_waiting_on_the_server(
    data_dir: Path,
) -> None:
    """A subscription and fetches that keep finding messages — no publish meanwhile to
    wake the queue's waiters — leave none of their waits behind on the server: what
    each round took to wait on, and did not, is let go (it was kept, one a take, for
    as long as the queue got nothing new)."""
    import asyncio

    from eomsg.client.aio import connect_async
    from eomsg.server.server import Server, ServerSettings

    async def main(node: Node) -> int:
        server = Server(node, data_dir, ServerSettings())
        await server.start()
        try:
            client = await connect_async(data_dir)
            got = 0
            async with client.consumer("q", prefetch=4) as consumer:
                async for msg in consumer:
                    await msg.delete()
                    got += 1
                    if got == 1200:
                        break
            while await client.fetch("q", 3):  # the rest, three at a time
                got += 3
            assert got == 1500
            await client.close()
            return sum(len(w) for w in server._waiters.values())
        finally:
            await server.stop()

    with Node.open(data_dir) as node:
        node.admin.create_queue(QueueConfig.create("q", ["t"]))
        node.ingress.publish_batch([Outgoing("t", b"x") for _ in range(1500)])
        waiting = asyncio.run(main(node))
    assert waiting <= 65  # (past 64 the done ones are dropped)
