"""Prometheus metrics of a served node (``eomsg serve --metrics tcp://127.0.0.1:9464``).

What a scrape reads is taken from the node when it asks — the queues as ``inspect
queues`` shows them, memory, links, disk, sessions — so nothing is counted twice and
nothing costs the hot path; only the acknowledgement latencies are observed as they
happen (once per request, not per message). The names and labels follow Prometheus's
conventions: ``eomsg_queue_messages{queue="orders"}``, counters ending ``_total``, base
units (seconds, bytes).

The endpoint is HTTP, served by ``prometheus_client``'s own WSGI application on a thread
of its own (a scrape's reads of the store never hold the event loop). A scrape presents
a token as ``Authorization: Bearer TOKEN``, as every TCP client does: the node's own
(``DIR/eomsg.token``) or that of a principal granted ``inspect`` on the node. It listens
on loopback unless ``--allow-remote``.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, Counter, Histogram, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from eomsg.core import access
from eomsg.core.queues import QueueStats
from eomsg.errors import EomsgError, InvalidConfig, NotAllowed
from eomsg.transport.address import Address

if TYPE_CHECKING:
    from eomsg.node.node import Node
    from eomsg.server.server import Server

log = logging.getLogger("eomsg.metrics")

# Acknowledgement latency, from the request's arrival to its answer: a publish waits for
# the journal's group commit (about a millisecond on a quiet disk), a delete likewise.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


def check_address(address: Address, allow_remote: bool) -> None:
    """InvalidConfig unless ``address`` is one the metrics may be served on."""
    if address.scheme != "tcp":
        raise InvalidConfig(f"--metrics {address}: give tcp://HOST:PORT (plain HTTP)")
    if not address.is_loopback and not allow_remote:
        raise InvalidConfig(
            f"--metrics {address} is not a loopback address; add --allow-remote to let "
            "other machines scrape it (they must present a token)"
        )


class Metrics:
    """The registry of one daemon, its endpoint, and the latencies sessions observe."""

    def __init__(self, server: Server) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.publish_latency = Histogram(
            "eomsg_publish_ack_seconds",
            "Time from a publish request's arrival to its acknowledgement (durable).",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.delete_latency = Histogram(
            "eomsg_delete_ack_seconds",
            "Time from a delete request's arrival to its acknowledgement (durable).",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.link_connects = Counter(
            "eomsg_link_connects",
            "Times each link connected since the node started (reconnects: this less one).",
            ["peer"],
            registry=self.registry,
        )
        self.registry.register(NodeCollector(server))
        self._server = server
        self._http: ThreadingWSGIServer | None = None
        self._thread: threading.Thread | None = None
        self.address: Address | None = None

    def start(self, address: Address) -> Address:
        """Serve the endpoint on ``address`` (port 0 picks one); returns where."""
        app = _authorised(make_wsgi_app(self.registry), self._server, address.is_loopback)
        host = address.host or "127.0.0.1"
        try:
            http = make_server(
                host,
                address.port or 0,
                app,
                _Endpoint6 if ":" in host else _Endpoint,
                handler_class=_QuietHandler,
            )
        except OSError as e:
            raise InvalidConfig(f"cannot serve --metrics on {address}: {e.strerror}") from e
        http.daemon_threads = True
        self._http = http
        self._thread = threading.Thread(
            target=http.serve_forever, name="eomsg-metrics", daemon=True
        )
        self._thread.start()
        self.address = Address("tcp", host=address.host, port=http.server_port)
        return self.address

    def stop(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None


def _authorised(
    app: Callable[..., Iterable[bytes]], server: Server, loopback: bool
) -> Callable[..., Any]:
    """``app``, answering only a request whose bearer token may inspect the node. Off
    loopback the node's own token is refused: plain HTTP would carry it, and it is good
    for everything on the node — a principal granted ``inspect`` scrapes there."""

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        header = environ.get("HTTP_AUTHORIZATION", "")
        scheme, _, token = header.partition(" ")
        refusal = _refusal(server, token.strip() if scheme.lower() == "bearer" else "", loopback)
        if refusal is not None:
            status, why = refusal
            start_response(
                status,
                [("Content-Type", "text/plain; charset=utf-8"), ("WWW-Authenticate", "Bearer")],
            )
            return [why.encode() + b"\n"]
        return app(environ, start_response)

    return guarded


def _refusal(server: Server, token: str, loopback: bool) -> tuple[str, str] | None:
    """None if ``token`` may read the metrics; else the HTTP status and why not."""
    if not token:
        return "401 Unauthorized", (
            "a token is needed: Authorization: Bearer TOKEN (the node's eomsg.token, or a "
            "principal's granted inspect on the node)"
        )
    if hmac.compare_digest(token.encode(), server.token.encode()):
        if loopback:
            return None
        return "403 Forbidden", (
            "the node's own token is not taken over plain HTTP off loopback: scrape with a "
            "principal's (eomsg user add prom; eomsg grant prom inspect --node)"
        )
    node = server.node
    principal = node.access.principal_of(token)
    if principal is None:
        return "401 Unauthorized", "wrong token"
    try:
        node.access.policy.check(principal, access.operation_needs("stats", {}), "read the metrics")
    except NotAllowed as e:
        return "403 Forbidden", e.message
    return None


MAX_SCRAPES = 8  # connections served at once; more are answered 503 and closed
REQUEST_DEADLINE = 30.0  # seconds a connection may take, however it trickles


class _Endpoint(ThreadingWSGIServer):
    """prometheus_client's threaded server, held to :data:`MAX_SCRAPES` connections at
    once, each cut off after :data:`REQUEST_DEADLINE` seconds: a client that opens many
    or sends slowly costs a few threads, never the node's file descriptors."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._slots = threading.BoundedSemaphore(MAX_SCRAPES)
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            with contextlib.suppress(OSError):
                request.sendall(
                    b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\n"
                    b"Connection: close\r\n\r\n"
                )
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        deadline = threading.Timer(REQUEST_DEADLINE, _cut, (request,))
        deadline.daemon = True
        deadline.start()
        try:
            super().process_request_thread(request, client_address)
        finally:
            deadline.cancel()
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("metrics: a request from %s failed", client_address, exc_info=True)


class _Endpoint6(_Endpoint):
    address_family = socket.AF_INET6


def _cut(request: socket.socket) -> None:
    with contextlib.suppress(OSError):
        request.shutdown(socket.SHUT_RDWR)


class _QuietHandler(WSGIRequestHandler):
    """A request handler that logs through ``logging`` at debug, not to stderr, and
    gives up on a client silent for :attr:`timeout` seconds (each holds a thread)."""

    timeout = 10.0

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("metrics: " + format, *args)


class NodeCollector(Collector):
    """The node's state, read at each scrape."""

    def __init__(self, server: Server) -> None:
        self.server = server

    def collect(self) -> Iterator[Metric]:
        server = self.server
        node = server.node
        serving = GaugeMetricFamily(
            "eomsg_node_serving", "1 while the node serves; 0 while its store is reopened."
        )
        sessions = GaugeMetricFamily("eomsg_sessions", "Client and link connections open.")
        sessions.add_metric([], len(server.sessions))
        try:
            yield from _node(node)
        except EomsgError:  # closed, or its store failed and is being reopened
            serving.add_metric([], 0)
        else:
            serving.add_metric([], 1)
        yield serving
        yield sessions


def _node(node: Node) -> Iterator[Metric]:
    info = node.node_info()
    meta = GaugeMetricFamily(
        "eomsg_node_info", "The node's name and version (always 1).", labels=["node", "version"]
    )
    meta.add_metric([info.name, info.version], 1)
    yield meta
    yield _gauge(
        "eomsg_node_start_time_seconds", "When the node opened its store.", info.started_at
    )
    yield _gauge("eomsg_disk_free_bytes", "Free on the data directory's disk.", info.disk_free)
    yield _gauge(
        "eomsg_disk_reserve_bytes",
        "Below this free, the node refuses publishes (0: never).",
        info.disk_reserve,
    )
    yield _gauge(
        "eomsg_transactions_in_doubt",
        "Prepared transactions whose coordinator is gone (eomsg recover).",
        info.in_doubt,
    )
    use = node.inspection.memory()
    yield _gauge("eomsg_resident_memory_bytes", "The node process's resident memory.", use.rss)
    yield _gauge("eomsg_memory_limit_bytes", "The node's memory limit.", use.limit)
    yield _gauge("eomsg_duckdb_memory_bytes", "DuckDB's buffers.", use.duckdb)
    yield _gauge("eomsg_dedup_memory_bytes", "The dedup window in memory.", use.dedup)
    yield _gauge("eomsg_dedup_ids", "Publish ids the dedup window holds in memory.", use.dedup_ids)
    yield _gauge("eomsg_dedup_spilled_ids", "Publish ids kept on disk.", use.spilled_ids)
    yield _gauge("eomsg_apply_lag_bytes", "Journaled, not yet applied to DuckDB.", use.journaled)
    yield _gauge(
        "eomsg_journal_bytes", "The journal's segment files.", node.inspection.journal_bytes()
    )
    yield from _queues(node.inspection.stats(), node.inspection.deliveries())
    yield from _links(node.links.link_info())


# Per queue: (family, name, help, value from its QueueStats and its deliveries; None: absent).
QUEUE_METRICS: list[tuple[type[Any], str, str, Callable[[QueueStats, int], float | None]]] = [
    (GaugeMetricFamily, "eomsg_queue_messages", "Messages not yet deleted (in flight too).",
     lambda s, _: s.depth),
    (GaugeMetricFamily, "eomsg_queue_in_flight_messages", "Delivered, not yet settled.",
     lambda s, _: s.in_flight),
    (GaugeMetricFamily, "eomsg_queue_bytes", "Payload bytes of the messages it holds.",
     lambda s, _: s.bytes),
    (GaugeMetricFamily, "eomsg_queue_oldest_message_age_seconds",
     "Age of its oldest message not yet deleted (absent when empty).",
     lambda s, _: s.oldest_age),
    (GaugeMetricFamily, "eomsg_queue_consumers", "Consumers bound.", lambda s, _: s.flows),
    (GaugeMetricFamily, "eomsg_queue_active_consumers", "Consumers bound and active.",
     lambda s, _: s.active),
    (CounterMetricFamily, "eomsg_queue_published", "Messages that entered the queue.",
     lambda s, _: s.depth + s.deleted + s.expired + s.dead_lettered + s.purged),
    (CounterMetricFamily, "eomsg_queue_delivered",
     "Deliveries, redeliveries included, since the node started.", lambda _, d: d),
    (CounterMetricFamily, "eomsg_queue_deleted", "Messages consumed and deleted.",
     lambda s, _: s.deleted),
    (CounterMetricFamily, "eomsg_queue_expired", "Messages past their time to live.",
     lambda s, _: s.expired),
    (CounterMetricFamily, "eomsg_queue_dead_lettered", "Messages moved to the dead-letter queue.",
     lambda s, _: s.dead_lettered),
    (CounterMetricFamily, "eomsg_queue_purged", "Messages purged.", lambda s, _: s.purged),
    (GaugeMetricFamily, "eomsg_queue_max_messages",
     "Most messages the queue holds (absent when it has no limit).",
     lambda s, _: s.max_messages),
    (GaugeMetricFamily, "eomsg_queue_max_bytes",
     "Most payload bytes the queue holds (absent when it has no such limit).",
     lambda s, _: s.max_bytes),
    (CounterMetricFamily, "eomsg_queue_overflowed",
     "Messages its max-messages or max-bytes refused or dead-lettered to make room, since "
     "the node started.",
     lambda s, _: s.overflowed),
]  # fmt: skip


def _queues(stats: list[QueueStats], delivered: dict[str, int]) -> Iterator[Metric]:
    for family, name, documentation, value in QUEUE_METRICS:
        metric = family(name, documentation, labels=["queue"])
        for s in stats:
            v = value(s, delivered.get(s.name, 0))
            if v is not None:
                metric.add_metric([s.name], v)
        yield metric


def _links(links: list[Any]) -> Iterator[Metric]:
    up = GaugeMetricFamily("eomsg_link_up", "1 while the link is connected.", labels=["peer"])
    owed = GaugeMetricFamily(
        "eomsg_link_pending_messages", "Messages the link owes its peer.", labels=["peer"]
    )
    lag = GaugeMetricFamily(
        "eomsg_link_lag_seconds",
        "Age of the oldest message the link owes (absent when it owes none).",
        labels=["peer"],
    )
    taken = CounterMetricFamily(
        "eomsg_link_sent_messages", "Messages the peer took from this node.", labels=["peer"]
    )
    received = CounterMetricFamily(
        "eomsg_link_received_messages", "Messages this node took from the peer.", labels=["peer"]
    )
    for i in links:
        if i.removed:  # no link: one removed here that its peer still dials
            continue
        label = [i.peer]
        up.add_metric(label, 1 if i.connected else 0)
        owed.add_metric(label, i.pending)
        if i.oldest_age is not None:
            lag.add_metric(label, i.oldest_age)
        taken.add_metric(label, i.taken)
        received.add_metric(label, i.received)
    yield from (up, owed, lag, taken, received)


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)
