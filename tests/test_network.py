"""Linked nodes in real processes (server/link.py over node/links.py): `eomsg serve` on
each data directory, linked over loopback TCP with the peer's token; messages published
on one node land in the queues of the others, once, in order, through cuts and kills."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import eomsg
from eomsg.core.queues import QueueConfig
from tests.conftest import NodeProcess, eventually


class Network:
    """Nodes named by letters, each `eomsg serve` on its own data directory."""

    def __init__(self, eomsg_bin: str, tmp: Path, env: dict[str, str]) -> None:
        self.eomsg_bin, self.tmp, self.env = eomsg_bin, tmp, env
        self.procs: dict[str, NodeProcess] = {}

    def start(self, name: str) -> NodeProcess:
        proc = NodeProcess(
            self.eomsg_bin, self.tmp / name, self.env, "--node-name", name, "--heartbeat", "1"
        ).start()
        self.procs[name] = proc
        return proc

    def client(self, name: str) -> eomsg.Client:
        return eomsg.connect(self.tmp / name)

    def link(self, a: str, b: str) -> None:
        """``a`` dials ``b`` with ``b``'s token."""
        with self.client(a) as c:
            c.add_link(b, self.procs[b].tcp, self.procs[b].token)

    def up(self, a: str, b: str) -> bool:
        with self.client(a) as c:
            return any(i.peer == b and i.connected for i in c.link_info())

    def close(self) -> None:
        for proc in self.procs.values():
            proc.kill()


@pytest.fixture
def network(eomsg_bin: str, tmp_path: Path, cli_env: dict[str, str]) -> Iterator[Network]:
    net = Network(eomsg_bin, tmp_path, cli_env)
    yield net
    net.close()


def drain(client: eomsg.Client, queue: str, want: int, timeout: float = 60) -> list[bytes]:
    got: list[bytes] = []

    def more() -> bool:
        batch = client.fetch(queue, 1000)
        if batch:
            got.extend(m.message.payload for m in batch)
            client.delete(queue, [m.key for m in batch])
        return len(got) >= want

    assert eventually(more, timeout), f"{len(got)} of {want} arrived"
    return got


def test_a_chain_of_three_processes_carries_each_message_once(network: Network) -> None:
    for name in "abc":
        network.start(name)
    network.link("a", "b")
    network.link("b", "c")
    assert eventually(lambda: network.up("a", "b") and network.up("c", "b"))
    with network.client("c") as c:
        c.create_queue(QueueConfig("audit", subscriptions=("orders/>",)))
    with network.client("a") as a:
        # The queue's interest travels c → b → a after it is made, apart from the nodes
        # a reaches: a message published before it arrives stays in a's log (none of
        # the 200 may). Until then a probe is routed nowhere; the first routed is the
        # first message audit gets.
        assert eventually(lambda: a.publish("orders/probe", b"probe").queues == 1)
        for i in range(200):
            a.publish(f"orders/eu/{i}", f"m{i}".encode())
    with network.client("c") as c:
        assert drain(c, "audit", 201) == [b"probe"] + [f"m{i}".encode() for i in range(200)]


def test_the_issue_walkthrough_through_the_cli(
    network: Network, eomsg_bin: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    network.start("a")
    b = network.start("b")
    token = tmp_path / "b.token"
    token.write_text(b.token)
    token.chmod(0o600)

    def run(*args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([eomsg_bin, *args], env=cli_env, capture_output=True, text=True,
                              timeout=120, check=False)  # fmt: skip
        assert done.returncode == code, done.stderr
        return done

    da, db = str(tmp_path / "a"), str(tmp_path / "b")
    added = run("link", "add", "b", b.tcp, "--token-file", str(token), "--wait", "120s",
                "--data", da)  # fmt: skip
    assert added.stdout == "linked to b (up)\n"
    assert eventually(lambda: network.up("a", "b") and network.up("b", "a"))
    run("queue", "create", "audit", "--subscribe", "orders/>", "--data", db)
    with network.client("a") as client:
        assert eventually(lambda: client.link_info()[0].reaches == ("b",))
    run("publish", "orders/eu/new", '{"id": 1}', "--data", da)
    with network.client("b") as client:
        assert drain(client, "audit", 1) == [b'{"id": 1}']
    links = json.loads(run("inspect", "links", "--json", "--data", da).stdout)
    assert [(x["peer"], x["state"], x["pending"], x["taken"]) for x in links] == [("b", "up", 0, 1)]
    peers = json.loads(run("link", "list", "--json", "--data", db).stdout)
    assert [(x["peer"], x["address"], x["received"]) for x in peers] == [("a", None, 1)]
    assert (
        "Error: no link to 'c'; see `eomsg link list`"
        in run("link", "remove", "c", "--data", da, code=4).stderr
    )
    assert run("link", "remove", "b", "--data", da).stdout == "removed link to b\n"
    assert eventually(lambda: not network.up("b", "a"))


def test_a_wrong_token_is_refused_and_changes_nothing(network: Network, tmp_path: Path) -> None:
    network.start("a")
    b = network.start("b")
    token = tmp_path / "wrong.token"
    token.write_text("not-the-token")
    with network.client("a") as client:
        client.add_link("b", b.tcp, token.read_text())
        assert eventually(lambda: (client.link_info()[0].error or "").startswith("refused"))
        (info,) = client.link_info()
        assert not info.connected
        assert info.error == (
            f"refused: 'b' at {b.tcp} did not prove it knows the token 'a' dials it with: it "
            "accepts no such token from a node named 'a' (a wrong --token-file, 'b' knowing "
            "this node by another name, or not 'b' at that address)"
        )
        assert info.state == "refused"
    with network.client("b") as client:
        assert client.link_info() == []


def test_a_killed_after_collecting_what_b_took_owes_none_of_it(network: Network) -> None:
    """How far b took a's messages is written with a's next write, not with a disk flush
    of its own (and before a compacts or collects its log). a SIGKILLed after b took them
    and its log dropped them: on reconnecting b says how far it holds, so a owes none of
    them — nothing comes twice, and what a publishes after its restart comes."""
    network.start("a")
    network.start("b")
    network.link("a", "b")
    assert eventually(lambda: network.up("a", "b"))
    with network.client("b") as b:
        b.create_queue(QueueConfig("q", subscriptions=("t/>",)))
    with network.client("a") as a:
        a.configure("retention", "0")
        a.configure("gc-interval", "0")  # collected at every tick (a second)
        assert eventually(lambda: any("b" in i.reaches for i in a.link_info()))
        last = [a.publish("t/x", str(i).encode()).seq for i in range(50)][-1]
    with network.client("b") as b:
        assert drain(b, "q", 50) == [str(i).encode() for i in range(50)]
    with network.client("a") as a:
        assert eventually(lambda: a.log_horizon()[0] > last)  # b took them: collected
    network.procs["a"].kill()
    network.start("a")
    with network.client("a") as a:
        assert eventually(lambda: network.up("a", "b"))
        assert a.link_info()[0].pending == 0
        a.publish("t/x", b"after")
        a.publish("t/x", b"marker")  # the link keeps a's order: what a sends comes before
    with network.client("b") as b:
        assert drain(b, "q", 2) == [b"after", b"marker"]  # nothing came twice


def test_a_full_queue_is_said_once_in_the_log_not_at_every_resend(network: Network) -> None:
    """While a full queue refuses what a link brings, the peer sends it again every few
    seconds, over one connection or the next: the node says so once, not at each (the
    link's note of what it said is the node's, not the connection's)."""
    network.start("a")
    b = network.start("b")
    network.link("a", "b")
    assert eventually(lambda: network.up("a", "b") and network.up("b", "a"))
    with network.client("b") as client:
        client.create_queue(QueueConfig.create("audit", ("orders/>",), max_messages=10))
    with network.client("a") as a:
        assert eventually(lambda: any("b" in i.reaches for i in a.link_info()))
        for i in range(30):
            a.publish("orders/eu", f"m{i}".encode())
        assert eventually(lambda: sum(i.resends for i in a.link_info()) >= 4)
    code, _, err = b.stop()
    said = [line for line in err.splitlines() if "messages not taken now" in line]
    assert code == 0 and len(said) == 1, said
    assert "queue 'audit' is full" in said[0]


@pytest.mark.parametrize(
    "limit", [{"max_messages": 10}, {"max_bytes": 30}], ids=["max-messages", "max-bytes"]
)
def test_a_full_queue_holds_its_messages_at_the_sending_node(
    network: Network, limit: dict[str, int]
) -> None:
    """Queue limits meet links, in real processes: what a full queue that refuses cannot
    take (10 messages of 3 bytes) waits at the node that sends it (owed there, not lost,
    not taken twice) and arrives, in order, once its consumer made room."""
    for name in "ab":
        network.start(name)
    network.link("a", "b")
    assert eventually(lambda: network.up("a", "b") and network.up("b", "a"))
    with network.client("b") as b:
        b.create_queue(QueueConfig.create("audit", ("orders/>",), **limit))
    with network.client("a") as a:
        assert eventually(lambda: any("b" in i.reaches for i in a.link_info()))
        for i in range(30):
            a.publish("orders/eu", f"m{i:02d}".encode())
        assert eventually(lambda: [i.pending for i in a.link_info()] == [20])
    with network.client("b") as b:
        assert eventually(lambda: {s.name: s.depth for s in b.stats()} == {"audit": 10})
        assert drain(b, "audit", 30) == [f"m{i:02d}".encode() for i in range(30)]
        assert {s.name: s.depth for s in b.stats()} == {"audit": 0}
    with network.client("a") as a:
        assert eventually(lambda: [i.pending for i in a.link_info()] == [0])
