"""Grants and links (issue 35, item 7): what the clients that come through a linked node
may do. A link grants ``@PEER`` what a linked node's clients could always do — every
right on the node, with no admin operation through a link — so a grant to another
principal changes nothing for them; a grant or
revoke naming ``@PEER`` does, and says so; and a denial names what the user ran, never
an operation's name. Through the CLI and real `eomsg serve` processes; and a data
directory from before, opened, keeps what its links' clients could do."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from eomsg.node.node import Node, NodeSettings
from tests.conftest import eventually
from tests.linkcli import Nodes


@pytest.fixture
def nodes(eomsg_bin: str, tmp_path: Path, cli_env: dict[str, str]) -> Iterator[Nodes]:
    made = Nodes(eomsg_bin, tmp_path, cli_env)
    yield made
    made.close()


def test_a_grant_to_another_principal_leaves_a_linked_nodes_clients_as_they_were(
    nodes: Nodes, tmp_path: Path
) -> None:
    b = nodes.start("b", "--node-name", "b")
    nodes.start("a", "--node-name", "a")
    db, da = nodes.dir("b"), nodes.dir("a")
    nodes.run("queue", "create", "audit", "--subscribe", "orders/>", "--data", db)
    nodes.run("link", "add", "a", "--token-file", str(tmp_path / "a.token"), "--data", db)
    nodes.run("link", "add", "b", b.tcp, "--token-file", str(tmp_path / "a.token"), "--data", da)
    assert eventually(lambda: [(x["state"], x["reaches"]) for x in nodes.links("a")] == [
        ("up", ["b"])
    ], 120)  # fmt: skip
    for i in range(2):
        nodes.run("publish", f"orders/{i}", f"m{i}", "--data", da)

    # The step: b's first grant, to another principal. No warning, no change.
    nodes.run("user", "add", "billing", "--token-file", str(tmp_path / "billing.token"),
              "--data", db)  # fmt: skip
    done = nodes.run("grant", "billing", "publish", "--topic", "invoices/>", "--data", db)
    assert (done.stdout, done.stderr) == ("granted billing publish on topic invoices/>\n", "")
    done = nodes.run("consume", "audit", "--via", "b", "--max", "1", "--data", da)
    assert (done.stdout, done.stderr) == ("1 orders/0 m0\n", "")
    # What a's clients may do here: what the link granted @a.
    assert nodes.run("inspect", "grants", "@a", "--json", "--data", db).stdout == (
        '[{"principal": "@a", "right": "admin", "kind": "node", "name": ""}, '
        '{"principal": "@a", "right": "consume", "kind": "node", "name": ""}, '
        '{"principal": "@a", "right": "inspect", "kind": "node", "name": ""}, '
        '{"principal": "@a", "right": "publish", "kind": "node", "name": ""}]\n'
    )

    # A grant naming @a changes what a's clients may do: it says so.
    done = nodes.run("revoke", "@a", "consume", "--node", "--data", db)
    assert (done.stdout, done.stderr) == (
        "revoked @a consume on node\n",
        "warning: the clients that come through node a may do here only what @a still "
        "holds (`eomsg inspect grants @a`)\n",
    )
    done = nodes.run("consume", "audit", "--via", "b", "--max", "1", "--data", da, code=10)
    assert done.stderr == (
        "Error: eomsg consume: @a (clients through node 'a') may not subscribe to queue "
        "audit: it needs consume on queue audit (an administrator grants it: eomsg grant @a "
        "consume --queue audit)\n"
    )
    done = nodes.run("grant", "@a", "consume", "--queue", "audit", "--data", db)
    assert (done.stdout, done.stderr) == (
        "granted @a consume on queue audit\n",
        "warning: every client that comes through node a may now consume on queue audit here "
        "(@a stands for them all, as one)\n",
    )
    done = nodes.run("consume", "audit", "--via", "b", "--max", "1", "--data", da)
    assert done.stdout == "2 orders/1 m1\n"

    # A principal's denial names the command and what it needed, in a user's words.
    token = (tmp_path / "billing.token").read_text().strip()
    done = nodes.run("inspect", "queues", "--broker", b.tcp, "--token", token, code=10)
    assert done.stderr == (
        "Error: eomsg inspect queues: billing may not read the queues' statistics: it needs "
        "inspect on node (an administrator grants it: eomsg grant billing inspect --node)\n"
    )
    done = nodes.run("queue", "purge", "audit", "--yes", "--broker", b.tcp, "--token", token,
                     code=10)  # fmt: skip
    assert done.stderr.startswith("Error: eomsg queue purge: billing may not ")
    assert "queue_config" not in done.stderr and " run " not in done.stderr

    # One who may add links but not look at them: the link is added, and it says so.
    nodes.run("grant", "billing", "admin", "--node", "--data", db)
    done = nodes.run("link", "add", "z", "tcp://127.0.0.1:1", "--token-file",
                     str(tmp_path / "a.token"), "--broker", b.tcp, "--token", token)  # fmt: skip
    assert (done.stdout, done.stderr) == (
        "linked to z\n",
        "warning: whether the link to z is up cannot be seen: billing may not look at the "
        "links: it needs inspect on node (an administrator grants it: eomsg grant billing "
        "inspect --node)\n",
    )


def old_directory(path: Path, *grants: tuple[str, str, str, str]) -> None:
    """A data directory as eomsg left it before a link granted its peer's principal
    anything: a link to p (and ``grants``), none to @p, no mark of the change."""
    with Node.open(path, NodeSettings(tick=None, node_name="n")) as node:
        node.links.add_link("p", None, "a-token")
        node.store.writer.sync()
    conn = duckdb.connect(str(path / "eomsg.duckdb"))
    conn.execute("DELETE FROM grants")
    conn.execute("DELETE FROM node_meta WHERE key = 'link_grants'")
    for grant in grants:
        conn.execute("INSERT INTO grants VALUES (?, ?, ?, ?)", list(grant))
    conn.close()


def test_a_directory_from_before_keeps_what_its_links_clients_could_do(tmp_path: Path) -> None:
    """Before, a linked node's clients could do all but admin while the node had no grant
    at all, and only what @PEER held once it had one: opened now, the first becomes
    @PEER's grants (audited), and the second stays as it was."""
    old_directory(tmp_path / "open")
    with Node.open(tmp_path / "open", NodeSettings(tick=None)) as node:
        assert [str(g) for g in node.access.grants()] == [
            "@p admin on node", "@p consume on node", "@p inspect on node",
            "@p publish on node",
        ]  # fmt: skip
        assert {(e.principal, e.action, e.target, e.detail) for e in node.access.audit()[:4]} == {
            ("owner", "grant", "@p", f"{right} on node (as before: a linked node's clients "
             "while the node had no grant)")
            for right in ("admin", "consume", "inspect", "publish")
        }  # fmt: skip
    with Node.open(tmp_path / "open", NodeSettings(tick=None)) as node:  # once only
        assert len(node.access.grants()) == 4
        node.access.revoke("@p", "inspect", "node")
    with Node.open(tmp_path / "open", NodeSettings(tick=None)) as node:  # taken back: stays so
        assert len(node.access.grants()) == 3

    old_directory(tmp_path / "granted", ("ops", "inspect", "node", ""))
    with Node.open(tmp_path / "granted", NodeSettings(tick=None)) as node:
        assert [str(g) for g in node.access.grants()] == ["ops inspect on node"]
