"""The README's "A network of nodes", run as written (issue 35, item 6): its commands, in
its order, from a directory where neither data directory exists yet, on two real nodes
on loopback — with what tests/test_doc_examples.py checks of every example (exit codes,
the outputs the comments show) and more: what each node then says of the link and the
queue. The runner (:mod:`tests.docshell`) changes only what a test must: the address
(loopback, the port the node picked), and the TLS material, made by a throwaway CA."""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import eventually
from tests.docshell import Shell, blocks, make_tls

README = Path(__file__).parent.parent / "README.md"
ADDRESS = "10.0.0.2:7501"  # where the README's b listens


def walkthrough() -> list[str]:
    """The commands of the README's network section, one per line (continuations
    joined), comments and all: a shell runs them."""
    (block,) = [b for b in blocks(README) if b.section == "A network of nodes" and b.runs]
    return [example.text for example in block.examples()]


@pytest.fixture
def shell(tmp_path: Path, eomsg_bin: str) -> Iterator[Shell]:
    make_tls(tmp_path, walkthrough())
    made = Shell(tmp_path, eomsg_bin)
    yield made
    made.close()


def test_the_readme_network_walkthrough_works_as_written(shell: Shell, tmp_path: Path) -> None:
    (serve_b, create, allow_a, serve_a, link, publish, consume, egress, links, remote) = (
        walkthrough()
    )
    # b listens where the test may: loopback, on the port it picks (then named as such).
    node_b = shell.start(serve_b)
    port = shell.addresses[ADDRESS].removeprefix("127.0.0.1:")
    assert node_b.first_line().startswith(f"eomsg node b (pid {node_b.proc.pid}) ")
    assert f"tls://127.0.0.1:{port}" in node_b.first_line()

    assert shell.run(create).stdout == "created queue audit\n"
    made = shell.run(allow_a)
    assert made.stdout == (
        "linked to a\na dials this node with the token now in a.token (give it a copy)\n"
    )
    node_a = shell.start(serve_a)
    assert node_a.first_line().startswith(f"eomsg node a (pid {node_a.proc.pid}) ")
    done = shell.run(link)
    assert (done.stdout, done.stderr) == ("linked to b (up)\n", "")
    done = shell.run(publish)
    assert (done.stdout, done.stderr) == ("published seq 1\n", "")

    consumer = shell.start(consume)
    assert consumer.first_line() == '1 orders/eu/new {"order": 3}'

    def deleted() -> bool:  # the consumer's delete, sent after it printed, has landed
        (audit,) = json.loads(shell.run("eomsg inspect queues --json --data b").stdout)
        return (audit["depth"], audit["deleted"]) == (0, 1)

    assert eventually(deleted)
    assert consumer.stop(signal.SIGINT) == 130  # as Ctrl-C ends it

    assert shell.run(egress).stdout == "link to a: egress memory, hold 1s\n"
    table = shell.run(links).stdout
    assert re.search(rf"│ b +│ tls://127\.0\.0\.1:{port} +│ up +│ 0 +│ b +│", table), table
    queues = shell.run(remote).stdout
    assert re.search(r"│ audit +│ orders/> +│ 0 +│ 0 +│ 1 +│", queues), queues

    # Seen from b: a's one message taken, the link as set.
    shown = json.loads(shell.run("eomsg inspect links --json --data b").stdout)
    assert [(x["peer"], x["state"], x["received"], x["egress"]) for x in shown] == [
        ("a", "up", 1, "memory")
    ]
