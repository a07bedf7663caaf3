"""A removed link stays removed (issue 35, item 8), through the CLI and real `eomsg serve`
processes: c dials b with b's own token — which may make a link on b — and b removes it.
c is refused from then on, whatever it presents, across restarts of either node, until b
adds the link again; it hears why, and backs off rather than hammering b; `inspect links`
says so on both sides, and the audit log holds no link made again behind b's back."""

from __future__ import annotations

import itertools
import json
import re
import socket
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from tests.conftest import NodeProcess, eventually
from tests.linkcli import Nodes

REMOVED = "'b' removed its link to 'c' (on 'b', `eomsg link add c` makes it again)"
REFUSED_AT = re.compile(
    r"^(\S+ \S+) WARNING eomsg\.link: link from c: " + re.escape(REMOVED) + "$", re.M
)


@pytest.fixture
def nodes(eomsg_bin: str, tmp_path: Path, cli_env: dict[str, str]) -> Iterator[Nodes]:
    made = Nodes(eomsg_bin, tmp_path, cli_env)
    yield made
    made.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def serve_b(nodes: Nodes, port: int) -> NodeProcess:
    """b, on the same port each time (c's link names it)."""
    proc = NodeProcess(nodes.eomsg_bin, nodes.tmp / "b", nodes.env, "--node-name", "b")
    proc.cmd[proc.cmd.index("tcp://127.0.0.1:0")] = f"tcp://127.0.0.1:{port}"
    nodes.procs.append(proc.start())
    return proc


def refused_dials(nodes: Nodes) -> int:
    """How many of c's dials b refused since it started, as its `inspect links` says (0
    if it shows no removed link to c)."""
    for x in nodes.links("b"):
        if (x["peer"], x["state"]) == ("c", "removed"):
            said = re.fullmatch(r"c still dials this node: refused (\d+) times? since it started",
                                x["error"])  # fmt: skip
            assert said is not None, x
            return int(said[1])
    return 0


def test_a_removed_link_stays_removed_until_it_is_added_again(nodes: Nodes, tmp_path: Path) -> None:
    port = free_port()
    b = serve_b(nodes, port)
    c = nodes.start("c", "--node-name", "c")
    token = nodes.token_file("b.token", b.token)  # b's own: it makes the link on b
    nodes.run("link", "add", "b", b.tcp, "--token-file", token, "--data", nodes.dir("c"))
    assert eventually(lambda: nodes.state("b") == [("c", "up", None)], 120)

    assert nodes.run("link", "remove", "c", "--data", nodes.dir("b")).stdout == (
        "removed link to c\n"
    )
    # c hears why, and b shows the link as removed with c still dialling — twice, so
    # the time between two refusals can be seen in b's log.
    assert eventually(
        lambda: nodes.state("c") == [("b", "refused", f"refused by b: {REMOVED}")], 120
    )
    assert eventually(lambda: refused_dials(nodes) >= 2, 120)
    assert [(x["peer"], x["state"], x["address"]) for x in nodes.links("b")] == [
        ("c", "removed", None)
    ]
    shown = nodes.run("link", "list", "--data", nodes.dir("b")).stdout
    assert re.search(r"│ c +│ - +│ removed \(c still dials this node: refused \d+ times", shown)

    # Across restarts of both: still removed (c, restarted, dials at once and is refused).
    _, _, b_log = b.stop()
    c.stop()
    b = serve_b(nodes, port)
    c = nodes.start("c", "--node-name", "c")
    assert eventually(lambda: refused_dials(nodes) >= 1, 120)
    assert eventually(
        lambda: nodes.state("c") == [("b", "refused", f"refused by b: {REMOVED}")], 120
    )
    audit = json.loads(nodes.run("inspect", "audit", "--json", "--data", nodes.dir("b")).stdout)
    assert [e["action"] for e in audit if e["target"] == "c"] == ["remove-link", "add-link"]

    # Not hammered: after a refusal c waits (at least 2.5 s, growing), never the 0.1 s
    # of a cut link. b's log says when it refused each dial.
    times = [datetime.fromisoformat(t.replace(",", ".")) for t in REFUSED_AT.findall(b_log)]
    assert len(times) >= 2, b_log
    gaps = [(later - earlier).total_seconds() for earlier, later in itertools.pairwise(times)]
    assert min(gaps) >= 2.4, gaps

    # Added again on b: c's next dial makes the link, and it is up on both sides.
    assert nodes.run("link", "add", "c", "--data", nodes.dir("b")).stdout == "linked to c\n"
    assert eventually(lambda: nodes.state("c") == [("b", "up", None)], 120)
    assert nodes.state("b") == [("c", "up", None)]
