"""A node's name among linked nodes, and a link refused for a name or token that does not
fit (issue 35, item 6), through the CLI and real `eomsg serve` processes: a node is named
when it is made (`serve --node-name`, `--init --node-name`), renamed while none of its
links was made, and never after; a refused link says what does not fit — in the
dialler's `link add`, in both nodes' logs and in both nodes' `inspect links`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import eomsg
from tests.conftest import NodeProcess, eventually
from tests.linkcli import Nodes
from tests.test_network import drain


@pytest.fixture
def nodes(eomsg_bin: str, tmp_path: Path, cli_env: dict[str, str]) -> Iterator[Nodes]:
    made = Nodes(eomsg_bin, tmp_path, cli_env)
    yield made
    made.close()


def test_a_node_made_under_another_name_is_refused_naming_both_and_renamed_until_linked(
    nodes: Nodes, tmp_path: Path
) -> None:
    """The issue's steps: b waits for a link from a; a's directory is made by `--init`
    with no name, so it dials as node-…. b refuses it, and both say why — the dialler's
    name and the name the token is for — in their logs and in `inspect links`. a is then
    started as `--node-name a`, which its links (none made yet) allow: the link comes up
    and what a publishes reaches b's queue. Once the link was made, the name holds."""
    b = nodes.start("b", "--node-name", "b")
    token = str(tmp_path / "a.token")
    nodes.run("link", "add", "a", "--token-file", token, "--data", nodes.dir("b"))
    nodes.run("queue", "create", "audit", "--subscribe", "orders/>", "--data", nodes.dir("b"))
    done = nodes.run("--init", "link", "add", "b", b.tcp, "--token-file", token,
                     "--data", nodes.dir("a"))  # fmt: skip
    assert (done.stdout, done.stderr) == (
        "linked to b\n",
        f"warning: no node serves {nodes.dir('a')}: it dials b once `eomsg serve` runs on it\n",
    )
    a = nodes.start("a")
    with eomsg.connect(a.data_dir) as client:
        named = client.node
    assert named.startswith("node-")
    why = (
        f"a node dialled as {named!r} with the token 'b' made for 'a': a link's token is good "
        f"for its own name only (start that node as --node-name a, or link {named!r} on 'b')"
    )
    assert eventually(lambda: nodes.state("a") == [("b", "refused", f"refused by b: {why}")], 120)
    assert nodes.state("b") == [("a", "refused", f"refused: {why}")]
    _, _, a_log = a.stop()
    assert f"WARNING eomsg.link: link to b refused by it: {why}\n" in a_log

    # No link of a was ever made: it may take the name b knows it by.
    a = nodes.start("a", "--node-name", "a")
    assert eventually(lambda: nodes.state("a") == [("b", "up", None)], 120)
    assert nodes.state("b") == [("a", "up", None)]
    nodes.run("publish", "orders/eu/new", '{"order": 3}', "--data", nodes.dir("a"))
    with eomsg.connect(b.data_dir) as client:
        assert drain(client, "audit", 1) == [b'{"order": 3}']
    _, _, b_log = b.stop()
    assert f"WARNING eomsg.link: link from {named}: {why}\n" in b_log

    # Made, the link knows a by its name: another one is refused, saying which links.
    a.stop()
    done = nodes.run("serve", "--data", nodes.dir("a"), "--node-name", "z", code=3)
    assert done.stderr == (
        "Error: this node is named 'a', and its links to b know it by that name: start it as "
        "--node-name a (or remove those links first)\n"
    )


def test_a_node_is_named_at_init(nodes: Nodes, tmp_path: Path) -> None:
    """`--init --node-name a` makes the directory with that name: `serve` without a name
    serves it as a, and its link comes up. A running node's name is not changed by a
    client: another name given to a command through it is refused."""
    b = nodes.start("b", "--node-name", "b")
    token = nodes.token_file("b.token", b.token)
    done = nodes.run("--init", "--node-name", "a", "link", "add", "b", b.tcp, "--token-file",
                     token, "--data", nodes.dir("a"))  # fmt: skip
    assert done.stdout == "linked to b\n"
    nodes.start("a")
    with eomsg.connect(tmp_path / "a") as client:
        assert client.node == "a"
    assert eventually(lambda: nodes.state("a") == [("b", "up", None)], 120)
    done = nodes.run("queue", "list", "--node-name", "x", "--data", nodes.dir("a"), code=3)
    assert done.stderr == (
        f"Error: the node serving {nodes.dir('a')} is named 'a', not 'x' (a running node is "
        "named by `eomsg serve --node-name`)\n"
    )
    nodes.run("queue", "list", "--node-name", "a", "--data", nodes.dir("a"))
    # serve takes the name as every command does: before its name, or from the environment.
    c = NodeProcess(nodes.eomsg_bin, tmp_path / "c", {**nodes.env, "EOMSG_NODE_NAME": "c"})
    nodes.procs.append(c.start())
    with eomsg.connect(tmp_path / "c") as client:
        assert client.node == "c"
    d = NodeProcess(nodes.eomsg_bin, tmp_path / "d", nodes.env)
    d.cmd[1:1] = ["--node-name", "d"]  # eomsg --node-name d serve …
    nodes.procs.append(d.start())
    with eomsg.connect(tmp_path / "d") as client:
        assert client.node == "d"


def test_a_wrong_token_is_named_on_both_sides(nodes: Nodes, tmp_path: Path) -> None:
    """a dials b under the right name with a token b does not accept: `link add` fails
    saying so (exit 10), a's `inspect links` says it, and so does b — in its log and in
    its `inspect links` for the link it waits on — from what a said as it left."""
    b = nodes.start("b", "--node-name", "b")
    nodes.start("a", "--node-name", "a")
    nodes.run("link", "add", "a", "--token-file", str(tmp_path / "a.token"),
              "--data", nodes.dir("b"))  # fmt: skip
    wrong = nodes.token_file("wrong.token", "not-the-token")
    done = nodes.run("link", "add", "b", b.tcp, "--token-file", wrong, "--wait", "120s",
                     "--data", nodes.dir("a"), code=10)  # fmt: skip
    why = (
        f"'b' at {b.tcp} did not prove it knows the token 'a' dials it with: it accepts no "
        "such token from a node named 'a' (a wrong --token-file, 'b' knowing this node by "
        "another name, or not 'b' at that address)"
    )
    assert (done.stdout, done.stderr) == (
        "linked to b\n",
        f"Error: the link to b is refused: {why} (the link is kept and dialled again now and "
        "then: fix that, or `eomsg link remove b`)\n",
    )
    assert nodes.state("a") == [("b", "refused", f"refused: {why}")]
    said = f"'a' gave up the link after this node's welcome, saying: {why}"
    assert eventually(lambda: nodes.state("b") == [("a", "refused", f"refused: {said}")], 120)
    _, _, b_log = b.stop()
    assert f"WARNING eomsg.link: link from a: {said}\n" in b_log
    assert "no proof came" not in b_log


def test_a_wrong_address_is_named_on_both_sides(nodes: Nodes) -> None:
    """a dials 'x' at b's address: the node there is b. a says so (exit 10), and b's log
    says which node dialled it as what."""
    b = nodes.start("b", "--node-name", "b")
    a = nodes.start("a", "--node-name", "a")
    token = nodes.token_file("b.token", b.token)
    done = nodes.run("link", "add", "x", b.tcp, "--token-file", token, "--wait", "120s",
                     "--data", nodes.dir("a"), code=10)  # fmt: skip
    why = (
        f"'a' dialled 'x' at {b.tcp}, and the node there is 'b': check the address of 'a''s "
        "link to 'x'"
    )
    assert done.stderr == (
        f"Error: the link to x is refused: {why} (the link is kept and dialled again now and "
        "then: fix that, or `eomsg link remove x`)\n"
    )
    assert nodes.state("a") == [("x", "refused", f"refused: {why}")]
    nodes.run("link", "remove", "x", "--data", nodes.dir("a"))
    _, _, b_log = b.stop()
    said = (
        f"'a' gave up the link after this node's welcome, saying: {why} (this node has no "
        "link to 'a')"
    )
    assert f"WARNING eomsg.link: link from a: {said}\n" in b_log
    a.stop()
