"""Shared fixtures: a controllable clock, nodes on temporary data directories, the
``eomsg`` executable for subprocess tests, and a real PostgreSQL server."""

from __future__ import annotations

import json
import os
import queue
import select
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pytest
from psycopg import sql

import eomsg
from eomsg.client.broker import Broker
from eomsg.embedded import LocalClient
from eomsg.node.node import Node, NodeSettings
from eomsg.store.recovery import PendingRow, UnreadRun
from eomsg.store.store import Store
from eomsg.wire import events as ev
from eomsg.wire.codec import Event
from eomsg.wire.protocol import NEED_DATA, PEER_CLOSED, Connection, Role
from scripts.pgcluster import Cluster, server_bin


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C reaches the processes the tests start: a shell runs a command it put in
    the background (``bash scripts/test.sh &``) with SIGINT ignored, and an ignored
    signal stays ignored in every child — the tests that stop a command with SIGINT, as
    a user's Ctrl-C does, would wait for it in vain."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # The user's own contexts (eomsg context use) must not send the tests' commands to
    # one of their nodes: every test, and every process it starts, sees an empty config.
    os.environ["XDG_CONFIG_HOME"] = str(config.rootpath / ".pytest_cache" / "config")
    os.environ.pop("EOMSG_CONTEXT", None)
    # Spark's JVMs here run jobs of a few hundred rows, each in a JVM of its own (every
    # `eomsg spark-replay` the tests run): compiled by C1 alone, such a start and job
    # take about a quarter less CPU (C2 pays off on longer work than a test's). Read by
    # every spark-submit the tests start, the shared session's included.
    os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1")


@pytest.hookimpl(tryfirst=True)  # before xdist names each test after its group
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order and group the tests for several workers (``scripts/test.sh`` runs two a core,
    ``--dist loadgroup``): the longest (marked ``slow`` or ``spark``) are handed out first,
    since a long test begun last keeps one worker busy after the others ran out of work;
    and the tests of a module that share a module-scoped fixture (a Spark cluster, a page
    of the docs run in one shell, a built wheel) form one group, which one worker runs in
    order — handed out one by one, they would make that fixture again on each worker and
    again each time its tests were interleaved with others. The order within a module is
    kept (a stable sort)."""
    for item in items:
        if _module_fixtures(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    items.sort(key=lambda item: not any(item.get_closest_marker(m) for m in ("slow", "spark")))


def _module_fixtures(item: pytest.Item) -> list[str]:
    """The module-scoped fixtures ``item`` uses (tests/*.py's own, not the session's)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    return [
        name
        for name, defs in info.name2fixturedefs.items()
        if any(d.scope == "module" for d in defs)
    ]


class FakeClock:
    """Wall-clock seconds that move only when a test says so."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def pending_rows(store: Store) -> list[PendingRow]:
    """What recovery reads as pending, a row each (one of an :class:`UnreadRun` with no
    attempt), in queue then seq order."""
    rows: list[PendingRow] = []
    for item in store.load_pending():
        if isinstance(item, UnreadRun):
            rows.extend(
                PendingRow(item.queue_id, seq, expires, None, None, None)
                for seq, expires in zip(item.seqs, item.expires_us, strict=True)
            )
        else:
            rows.append(item)
    return sorted(rows, key=lambda r: (r.queue_id, r.seq))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


NodeFactory = Callable[..., Node]


@pytest.fixture
def open_node(data_dir: Path, clock: FakeClock) -> Iterator[NodeFactory]:
    """Open nodes on ``data_dir`` with the fake clock; all are closed at teardown."""
    opened: list[Node] = []

    def factory(**settings: object) -> Node:
        node = Node.open(data_dir, NodeSettings(**{"tick": None, **settings}), clock)  # type: ignore[arg-type]
        opened.append(node)
        return node

    yield factory
    for node in opened:
        node.close()


@pytest.fixture
def node(open_node: NodeFactory) -> Node:
    return open_node()


@pytest.fixture(scope="session")
def eomsg_bin() -> str:
    """The installed ``eomsg`` console script next to this interpreter."""
    candidate = Path(sys.executable).with_name("eomsg")
    found = str(candidate) if candidate.exists() else shutil.which("eomsg")
    if found is None:
        pytest.fail("the eomsg console script is not installed (pip install -e .)")
    return found


@pytest.fixture
def cli_env(data_dir: Path) -> dict[str, str]:
    """Environment for subprocess runs of ``eomsg`` against ``data_dir``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EOMSG_")}
    env["EOMSG_DATA"] = str(data_dir)
    env["EOMSG_INIT"] = "1"  # create it as needed (tests/test_cli_habits.py shows without)
    return env


Cli = Callable[..., "subprocess.CompletedProcess[bytes]"]


@pytest.fixture
def cli(eomsg_bin: str, cli_env: dict[str, str]) -> Cli:
    """Run ``eomsg ARGS…`` as a real process on ``data_dir``: ``cli(*args, input=b"…",
    code=N)`` asserts its exit code (0 unless told) and returns it, output as bytes."""

    def run(
        *args: str | bytes,
        input: bytes | None = None,
        code: int = 0,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[bytes]:
        done = subprocess.run(
            [eomsg_bin, *args],
            input=input,
            capture_output=True,
            timeout=120,
            env={**cli_env, **(env or {})},
            check=False,
        )
        assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
        return done

    return run


class NodeProcess:
    """``eomsg serve`` on a data directory, in a real process of its own."""

    def __init__(self, eomsg_bin: str, data_dir: Path, env: dict[str, str], *args: str) -> None:
        self.cmd = [
            eomsg_bin, "serve", "--data", str(data_dir), "--listen", "tcp://127.0.0.1:0",
            "--json", *args,
        ]  # fmt: skip
        self.data_dir = data_dir
        self.env = env
        self.proc: subprocess.Popen[str] | None = None
        self.tcp = ""

    def start(self) -> NodeProcess:
        self.proc = subprocess.Popen(
            self.cmd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(10)
            assert self.proc.stderr is not None
            pytest.fail(f"eomsg serve did not start: {self.proc.stderr.read()}")
        ready = json.loads(line)
        assert ready["event"] == "ready"
        self.tcp = ready["listen"][1]
        self.metrics: str | None = ready.get("metrics")  # its URL, with --metrics
        return self

    @property
    def token(self) -> str:
        return (self.data_dir / "eomsg.token").read_text().strip()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> tuple[int, str, str]:
        """Signal the node and wait: exit code, rest of stdout, stderr."""
        assert self.proc is not None
        self.proc.send_signal(sig)
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out, err

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def serve(
    eomsg_bin: str, data_dir: Path, cli_env: dict[str, str]
) -> Iterator[Callable[..., NodeProcess]]:
    """Start ``eomsg serve`` processes on ``data_dir``; any still running are killed."""
    started: list[NodeProcess] = []

    def start(*args: str) -> NodeProcess:
        node = NodeProcess(eomsg_bin, data_dir, cli_env, *args).start()
        started.append(node)
        return node

    yield start
    for node in started:
        node.kill()


@pytest.fixture(params=["embedded", "served"])
def brokers(
    request: pytest.FixtureRequest, data_dir: Path, serve: Callable[..., NodeProcess]
) -> Iterator[Callable[[], Broker]]:
    """Make clients of one node — embedded in this process (a ``LocalClient`` each, a
    holder of its own as a connection is) or served by ``eomsg serve`` in a process
    of its own (a ``Client`` each): a test taking this runs once on each backend."""
    opened: list[Broker] = []
    node: Node | None = None
    if request.param == "served":
        serve()
    else:
        node = Node.open(data_dir, NodeSettings())

    def make() -> Broker:
        client: Broker = eomsg.connect(data_dir) if node is None else LocalClient(node)
        opened.append(client)
        return client

    yield make
    for client in opened:
        client.close()
    if node is not None:
        node.close()


@pytest.fixture
def broker(brokers: Callable[[], Broker]) -> Broker:
    """One client of a node, embedded or served (see :func:`brokers`)."""
    return brokers()


def eventually(condition: Callable[[], bool], timeout: float = 30.0) -> bool:
    """Whether ``condition`` holds within ``timeout`` seconds (looked at every 10 ms): for
    what happens on another thread or in another process, never a measure of how fast."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def queue_depth(data_dir: Path, queue: str) -> int:
    """Messages of ``queue`` on the node serving ``data_dir`` not yet deleted."""
    with eomsg.connect(data_dir) as client:
        return {st.name: st.depth for st in client.stats()}[queue]


def wait_stopped(proc: subprocess.Popen[Any], timeout: float = 120) -> None:
    """Until ``proc`` has stopped itself at a ``stop`` failpoint (or fail if it ended)."""
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{proc.pid}/stat").read_text().split(") ")[1][0] != "T":
        assert proc.poll() is None, f"the process ended ({proc.returncode}) before its failpoint"
        assert time.monotonic() < deadline, "the process never reached its failpoint"
        time.sleep(0.02)


def running_until_depth(
    start: Callable[[], subprocess.Popen[Any]],
    data_dir: Path,
    queue: str,
    depth: int,
    timeout: float = 120.0,
) -> subprocess.Popen[Any]:
    """A consumer process (``start()``), still running once ``queue`` is down to
    ``depth`` messages: for killing it mid-stream after a measured amount of progress,
    never after a guessed time (how far a consumer gets in a second depends on the
    machine). One that stops of itself (idle on a loaded machine) is started again; one
    that fails, or makes no progress in ``timeout`` seconds, fails the test."""
    proc = start()
    deadline = time.monotonic() + timeout
    while queue_depth(data_dir, queue) > depth:
        if proc.poll() is not None:
            assert proc.returncode == 0, proc.communicate()[1]
            proc = start()
        assert time.monotonic() < deadline, f"no progress on {queue} in {timeout} s"
        time.sleep(0.02)
    return proc


def messages(out: str | bytes) -> list[dict[str, Any]]:
    """The message lines of ``eomsg consume --json`` output (without activity events)."""
    lines = [json.loads(x) for x in (out.decode() if isinstance(out, bytes) else out).splitlines()]
    return [x for x in lines if "event" not in x]


def activity(out: str | bytes) -> list[dict[str, Any]]:
    """The activity lines of ``eomsg consume --json`` output."""
    lines = [json.loads(x) for x in (out.decode() if isinstance(out, bytes) else out).splitlines()]
    return [x for x in lines if "event" in x]


class RawClient:
    """A hand-driven connection, to send what a well-behaved client never would."""

    def __init__(self, data_dir: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(str(data_dir / "eomsg.sock"))
        self.conn = Connection(Role.CLIENT)
        self._conn_lock = threading.Lock()  # the Connection is shared with the answerer
        self._received: queue.Queue[Event | BaseException | None] = queue.Queue()
        self._answering = threading.Event()
        self._answerer: threading.Thread | None = None

    def hello(self) -> Event | None:
        self.send(ev.Hello(ev.PROTOCOL_VERSION, "raw"))
        return self.next()

    def send(self, event: Event) -> None:
        with self._conn_lock:
            self.sock.sendall(self.conn.send(event))

    def next(self) -> Event | None:
        """The next event, or None when the node closed the connection."""
        if self._answerer is not None or not self._received.empty():
            item = self._received.get(timeout=10)
            if isinstance(item, BaseException):
                raise item
            return item
        return self._read()

    def _read(self) -> Event | None:
        while True:
            event = self.conn.next_event()
            if event is PEER_CLOSED:
                return None
            if event is not NEED_DATA:
                assert isinstance(event, Event)
                return event
            self.conn.receive_data(self.sock.recv(65536))

    def answer_pings(self) -> None:
        """Answer the node's pings from a thread of its own until :meth:`stop_answering`,
        as a live client would however slowly the test goes on (the node cuts a client
        off after three silent heartbeats); :meth:`next` gives the other events."""
        self._answering.set()
        self._answerer = threading.Thread(target=self._answer, daemon=True)
        self._answerer.start()

    def stop_answering(self) -> None:
        """From now on the node hears nothing from this client."""
        self._answering.clear()
        if self._answerer is not None:
            self._answerer.join(10)
            assert not self._answerer.is_alive(), "the ping answerer did not stop"
            self._answerer = None

    def _answer(self) -> None:
        """Read until told to stop, looking every 50 ms (select: the socket's timeout is
        the main thread's too); what the thread meets, even an error, goes to next()."""
        try:
            while self._answering.is_set():
                with self._conn_lock:
                    event = self.conn.next_event()
                if event is NEED_DATA:
                    if select.select([self.sock], [], [], 0.05)[0]:
                        data = self.sock.recv(65536)
                        with self._conn_lock:
                            self.conn.receive_data(data)
                    continue
                if event is PEER_CLOSED:
                    self._received.put(None)
                    return
                if isinstance(event, ev.Ping):
                    self.send(ev.Pong(event.nonce, time.time()))
                    continue
                assert isinstance(event, Event)
                self._received.put(event)
        except BaseException as e:  # reported by next(), in the test's thread
            self._received.put(e)

    def close(self) -> None:
        self.stop_answering()
        self.sock.close()


# -- PostgreSQL -----------------------------------------------------------------------


def missing_service(why: str) -> None:
    """Skip the test for want of a service; under ``CI=true`` that fails the run instead,
    since CI installs and starts every service the tests need."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{why} (CI must have it)")
    pytest.skip(why)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """The DSN of a PostgreSQL server that can prepare transactions: ``EOMSG_TEST_PG``
    if set, else a throwaway cluster for this test session (scripts/pgcluster.py)."""
    dsn = os.environ.get("EOMSG_TEST_PG")
    if dsn:
        yield dsn
        return
    if server_bin() is None:
        missing_service("no PostgreSQL server installed: run scripts/postgres.sh")
    cluster = Cluster()
    try:
        yield cluster.start()
    finally:
        cluster.stop()


@pytest.fixture
def pg_dsn(pg_server: str) -> Iterator[str]:
    """A new, empty database on that server; dropped after the test, with whatever
    transactions it still holds prepared."""
    name = f"t_{os.urandom(6).hex()}"
    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = psycopg.conninfo.make_conninfo(pg_server, dbname=name)
    yield dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        gids = conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"
        ).fetchall()
        for (gid,) in gids:
            conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(gid))
    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


APP_KINDS = ["duckdb", "sqlite", "postgresql"]


def connect_app(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    """A new connection to an application database of ``kind`` (PostgreSQL: a fresh
    database, in autocommit mode, as eomsg needs it)."""
    if kind == "duckdb":
        return duckdb.connect(str(tmp_path / "app.duckdb"))
    if kind == "sqlite":
        return sqlite3.connect(str(tmp_path / "app.sqlite"), isolation_level=None)
    return psycopg.connect(request.getfixturevalue("pg_dsn"), autocommit=True)


def q(conn: Any, text: str) -> str:
    """``text`` with its ``?`` parameters in the connection's own style."""
    return text.replace("?", "%s") if isinstance(conn, psycopg.Connection) else text


# -- Spark ----------------------------------------------------------------------------


def spark_or_skip() -> None:
    """Skip (fail under CI) when PySpark or Java 17+ is missing."""
    try:
        import pyspark  # noqa: F401

        from eomsg.spark.session import java_version

        java_version()
    except Exception as e:  # ImportError or SparkUnavailable
        missing_service(f"Spark cannot run here: {e}")


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """One Spark session on local[2] for the whole test module (start-up costs ~5 s)."""
    spark_or_skip()
    from eomsg.spark.session import start

    session = start("local[2]", {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"})
    yield session
    session.stop()


@pytest.fixture
def net(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """Make in-process networks of nodes (tests/linknet.py) on ``tmp_path``, closed at
    the end: ``net("abc", seed=0, faults=0.0, egress="store", compact_every=50_000)``."""
    import random

    from tests.linknet import Net

    nets: list[Net] = []

    def make(
        names: str,
        seed: int = 0,
        faults: float = 0.0,
        egress: str = "store",
        compact_every: int = 50_000,
    ) -> Net:
        nets.append(Net(tmp_path, names, random.Random(seed), faults, egress, compact_every))
        return nets[-1]

    yield make
    for n in nets:
        n.close()
