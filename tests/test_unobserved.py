"""No task or future dies unobserved (issue 35, items 4 and 5): a failure reaches the
request or the connection it belongs to, and the log — never asyncio's "Task exception
was never retrieved" or "Future exception was never retrieved" on someone's stderr."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from eomsg.node.node import Node
from eomsg.server.server import Server, ServerSettings
from tests.conftest import NodeProcess

Serve = Callable[..., NodeProcess]

# The application: four threads on the synchronous client, each using it its own way,
# each printing what ended it; then what the interpreter says at exit goes to stderr.
PRODUCERS = textwrap.dedent(
    """
    import gc, sys, threading, time
    import eomsg
    from eomsg.core.message import Outgoing
    from eomsg.core.queues import QueueConfig
    from eomsg.errors import EomsgError

    target = sys.argv[1]
    with eomsg.connect(target) as admin:
        admin.create_queue(QueueConfig("q", ("t",)))
        admin.publish("t", b"first")

    def one_by_one(c):
        while True:
            c.publish("t", b"one")

    def pipelined(c):
        acks = []
        while True:
            acks.append(c.publish_async("t", b"async"))
            if len(acks) % 1000 == 0:
                time.sleep(0.01)

    def batches(c):
        while True:  # each batch takes several frames
            c.publish_batch([Outgoing("t", b"b" * 100) for _ in range(150_000)])

    def consuming(c):
        with c.consumer("q", prefetch=10) as consumer:
            for message in consumer:
                message.delete()

    def run(work, client):
        try:
            work(client)
        except EomsgError as e:
            with said:  # (print writes the text and its newline apart: threads interleave)
                print(f"{work.__name__}: {e}", flush=True)
        client.close()

    said = threading.Lock()
    works = (one_by_one, pipelined, batches, consuming)
    threads = [threading.Thread(target=run, args=(w, eomsg.connect(target))) for w in works]
    for t in threads:
        t.start()
    print("ready", flush=True)
    for t in threads:
        t.join()
    gc.collect()
    """
)


def test_clients_of_a_node_that_stops_answering_fail_and_print_nothing_else(
    serve: Serve, data_dir: Path
) -> None:
    """The node stops answering (SIGSTOP): every client's keep-alive finds out within
    three heartbeats, each call then raises why — and nothing more is printed (before:
    "Future exception was never retrieved … did not answer a ping in time", once per
    ping and batch frame left waiting)."""
    node = serve("--heartbeat", "0.5")
    assert node.proc is not None
    app = subprocess.Popen(
        [sys.executable, "-c", PRODUCERS, str(data_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert app.stdout is not None
        assert app.stdout.readline() == "ready\n"
        node.proc.send_signal(signal.SIGSTOP)
        out, err = app.communicate(timeout=120)
    finally:
        node.proc.send_signal(signal.SIGCONT)
        app.kill()
    why = f"the node at unix://{data_dir / 'eomsg.sock'} did not answer a ping in time"
    assert sorted(out.splitlines()) == [
        f"{work}: {why}" for work in ("batches", "consuming", "one_by_one", "pipelined")
    ]
    assert err == ""
    assert app.returncode == 0


def test_a_server_task_that_fails_is_logged_and_told_to_its_owner(
    data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Whatever the server runs as a task and fails is logged with its traceback and
    handed to whom it belongs (a session ends its connection with the reason); asyncio
    has nothing left to complain about."""
    complaints: list[dict[str, Any]] = []
    told: list[BaseException] = []

    async def fails() -> None:
        await asyncio.sleep(0)
        raise RuntimeError("a bug")

    async def main(node: Node) -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _, c: complaints.append(c))
        server = Server(node, data_dir, ServerSettings())
        task = server.spawn(fails(), on_error=told.append)
        await asyncio.wait([task])
        del task
        gc.collect()  # a task whose failure nobody retrieved would be complained of now
        await server.stop()

    with caplog.at_level(logging.ERROR, "eomsg.server"), Node.open(data_dir) as node:
        asyncio.run(main(node))
    assert [str(e) for e in told] == ["a bug"]
    assert [r.getMessage() for r in caplog.records] == [
        "test_a_server_task_that_fails_is_logged_and_told_to_its_owner.<locals>.fails failed: a bug"
    ]
    assert caplog.records[0].exc_info is not None
    assert complaints == []
