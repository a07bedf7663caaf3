"""``eomsg serve --metrics``: a real node scraped over HTTP, its text parsed with
``prometheus_client.parser``, what it says held against ``eomsg inspect queues --json``
(issue 36, item 1); who may scrape; where it may listen."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import Cli, NodeProcess, eventually
from tests.linkcli import Nodes

METRICS = ("--metrics", "tcp://127.0.0.1:0")


def scrape(url: str, token: str | None) -> tuple[int, str]:
    """The HTTP status and body of one scrape."""
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape: (name, sorted labels) → value."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_a_scrape_agrees_with_inspect_queues(cli: Cli, serve: Callable[..., NodeProcess]) -> None:
    cli("queue", "create", "orders", "--subscribe", "orders/>")
    cli("queue", "create", "audit", "--subscribe", "orders/eu/>")
    node = serve(*METRICS)
    assert node.metrics is not None and node.metrics.startswith("http://127.0.0.1:")
    cli("publish", "orders/eu/new", "--stdin", input=b"".join(b"%d\n" % i for i in range(50)))
    cli("publish", "orders/us/new", "--stdin", input=b"".join(b"%d\n" % i for i in range(30)))
    cli("consume", "orders", "--max", "20", "--json")
    status, text = scrape(node.metrics, node.token)
    assert status == 200
    got = samples(text)
    queues = json.loads(cli("inspect", "queues", "--json").stdout)
    for q in queues:
        name = (("queue", q["name"]),)
        assert got["eomsg_queue_messages", name] == q["depth"]
        assert got["eomsg_queue_in_flight_messages", name] == q["in_flight"]
        assert got["eomsg_queue_deleted_total", name] == q["deleted"]
        assert got["eomsg_queue_bytes", name] == q["bytes"]
    orders, audit = (("queue", "orders"),), (("queue", "audit"),)
    assert got["eomsg_queue_published_total", orders] == 50 + 30
    assert got["eomsg_queue_published_total", audit] == 50
    assert got["eomsg_queue_deleted_total", orders] == 20
    assert got["eomsg_queue_delivered_total", orders] >= 20
    assert got["eomsg_queue_oldest_message_age_seconds", orders] >= 0
    assert got["eomsg_publish_ack_seconds_count", ()] >= 2  # a request each, at least
    assert got["eomsg_delete_ack_seconds_count", ()] >= 1
    assert got["eomsg_node_serving", ()] == 1
    assert got["eomsg_disk_free_bytes", ()] > 0
    assert got["eomsg_journal_bytes", ()] > 0
    info = json.loads(cli("node", "info", "--json").stdout)
    assert got["eomsg_node_info", (("node", info["name"]), ("version", info["version"]))] == 1
    cli("consume", "audit", "--max", "50", "--json")
    again = samples(scrape(node.metrics, node.token)[1])
    assert again["eomsg_queue_messages", audit] == 0
    assert ("eomsg_queue_oldest_message_age_seconds", audit) not in again  # empty: absent


def test_only_a_token_that_may_inspect_the_node_scrapes(
    cli: Cli, serve: Callable[..., NodeProcess]
) -> None:
    node = serve(*METRICS)
    assert node.metrics is not None
    status, why = scrape(node.metrics, None)
    assert status == 401 and "Authorization: Bearer TOKEN" in why
    assert scrape(node.metrics, "not-a-token")[0] == 401
    token = json.loads(cli("user", "add", "prom", "--json").stdout)["token"]
    status, why = scrape(node.metrics, token)
    assert status == 403 and "prom" in why
    cli("grant", "prom", "inspect", "--node")
    status, text = scrape(node.metrics, token)
    assert status == 200 and "eomsg_node_serving 1.0" in text
    cli("revoke", "prom", "inspect", "--node")
    assert scrape(node.metrics, token)[0] == 403


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--metrics", "tcp://0.0.0.0:0"), "not a loopback address; add --allow-remote"),
        (("--metrics", "unix:///tmp/m.sock"), "give tcp://HOST:PORT"),
        (("--metrics", "nonsense"), "must start with unix://, tcp:// or tls://"),
    ],
)
def test_metrics_listen_where_the_rules_allow(
    cli: Cli, data_dir: Path, args: tuple[str, ...], message: str
) -> None:
    done = cli("serve", *args, code=3)
    assert done.stderr.startswith(b"Error: ") and message.encode() in done.stderr
    assert not (data_dir / "eomsg.sock").exists()


def test_without_metrics_nothing_listens(serve: Callable[..., NodeProcess]) -> None:
    assert serve().metrics is None


def test_links_are_scraped_with_their_state_and_connects(
    eomsg_bin: str, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    nodes = Nodes(eomsg_bin, tmp_path, cli_env)
    try:
        b = nodes.start("b", "--node-name", "b")
        token = str(tmp_path / "a.token")
        nodes.run("link", "add", "a", "--token-file", token, "--data", nodes.dir("b"))
        nodes.run("--init", "--node-name", "a", "link", "add", "b", b.tcp, "--token-file",
                  token, "--data", nodes.dir("a"))  # fmt: skip
        a = nodes.start("a", "--node-name", "a", *METRICS)
        assert a.metrics is not None
        assert eventually(lambda: nodes.state("a") == [("b", "up", None)], 120)
        got = samples(scrape(a.metrics, a.token)[1])
        peer = (("peer", "b"),)
        assert got["eomsg_link_up", peer] == 1
        assert got["eomsg_link_connects_total", peer] == 1
        assert got["eomsg_link_pending_messages", peer] == 0
        b.stop()
        assert eventually(lambda: nodes.state("a")[0][1] == "down", 120)
        assert samples(scrape(a.metrics, a.token)[1])["eomsg_link_up", peer] == 0
        nodes.start("b", "--node-name", "b", "--listen", b.tcp)  # where a dials it
        assert eventually(lambda: nodes.state("a")[0][1] == "up", 120)
        again = samples(scrape(a.metrics, a.token)[1])
        assert (again["eomsg_link_up", peer], again["eomsg_link_connects_total", peer]) == (1, 2)
    finally:
        nodes.close()


def test_a_flood_of_slow_connections_costs_the_node_nothing(
    cli: Cli, serve: Callable[..., NodeProcess]
) -> None:
    """Connections that trickle a request are held to a few at a time (the rest answered
    503 and closed): the node keeps serving its clients, and scrapes come back once the
    flood is gone."""
    from eomsg.server.metrics import MAX_SCRAPES

    node = serve(*METRICS)
    assert node.metrics is not None
    port = int(node.metrics.split(":")[2].split("/")[0])
    slow = []
    try:
        for _ in range(MAX_SCRAPES + 4):
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # and never the end
            slow.append(s)
        assert eventually(lambda: scrape(node.metrics or "", node.token)[0] == 503, 60)
        assert cli("ping").returncode == 0
        cli("queue", "create", "q", "--subscribe", "q/>")
    finally:
        for s in slow:
            s.close()
    assert eventually(lambda: scrape(node.metrics or "", node.token)[0] == 200, 60)


def test_off_loopback_the_nodes_own_token_is_refused(
    cli: Cli, serve: Callable[..., NodeProcess]
) -> None:
    node = serve("--metrics", "tcp://0.0.0.0:0", "--allow-remote")
    assert node.metrics is not None
    url = node.metrics.replace("0.0.0.0", "127.0.0.1")
    status, why = scrape(url, node.token)
    assert status == 403 and "not taken over plain HTTP off loopback" in why
    token = json.loads(cli("user", "add", "prom", "--json").stdout)["token"]
    cli("grant", "prom", "inspect", "--node")
    assert scrape(url, token)[0] == 200
