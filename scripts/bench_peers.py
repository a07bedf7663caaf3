"""``scripts/bench.py --peers``: eomsg side by side with Redis and RabbitMQ, on loopback,
each through its standard Python client with durable settings, on the same workload:

1. publish ``n`` messages of ``payload`` bytes (distinct: a counter, then random hex),
   at most ``WINDOW`` (256) unacknowledged at a time;
2. consume them all, acknowledging (deleting) them in batches of ``BATCH`` (256);
3. publish ``latency_n`` messages one at a time, each waiting for its acknowledgement:
   the p50 and p99 of those waits.

Every message published (the latency phase's too, drained untimed afterwards) must come
back exactly once: the multiset of payloads consumed is compared with the one published,
and the run fails loudly otherwise.

- Redis (``redis-server``, ``--appendonly yes --appendfsync always --save ''``), redis-py
  with hiredis: XADD to a stream, pipelined 256 at a time; a consumer group read with
  XREADGROUP COUNT 256, each batch's XACK and XDEL in one pipeline; single XADD calls.
- RabbitMQ (``rabbitmq-server``): a durable quorum queue; pika's SelectConnection publishes
  persistent messages with publisher confirms, 256 unconfirmed at a time; a
  BlockingConnection consumes with manual acks (prefetch 512, ``basic_ack(multiple=True)``
  every 256) and publishes one message at a time with confirms.
- eomsg: ``python -m eomsg serve`` on a temporary data directory, the client on its Unix
  socket (``connect(window=256)``): ``publish_async`` with an id on every message; a
  consumer with prefetch 256 deleting each message (the client batches deletes per loop
  turn); ``publish`` one at a time.

Each server is started here as a child process on a free loopback port (eomsg: its Unix
socket) in a temporary directory of its own, alone on the machine while it is measured,
and stopped by its process id afterwards (SIGTERM, then SIGKILL after ``STOP_TIMEOUT``),
on errors too; the directory is removed. ``rounds`` rounds run interleaved (redis,
rabbitmq, eomsg, redis, ...); each round is reported, and the median of each figure.
Every wait is bounded: a phase that makes no progress for ``IDLE_TIMEOUT`` seconds fails,
and a watchdog kills a server whose measurement outlives its deadline.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

SYSTEMS = ("redis", "rabbitmq", "eomsg")
PEERS = ("redis", "rabbitmq")
FIGURES = ("publish_msgs_per_s", "consume_msgs_per_s", "p50_ms", "p99_ms")
WINDOW = 256  # messages published and not yet acknowledged, at most
BATCH = 256  # messages acknowledged (deleted) together
RABBIT_PREFETCH = 2 * BATCH  # so deliveries keep coming while a batch's ack is on its way
TOPIC = "bench/orders/eu"  # eomsg
QUEUE = "bench"  # eomsg and RabbitMQ
STREAM = "bench"  # Redis
GROUP = "bench"  # Redis consumer group
HOST = "127.0.0.1"
START_TIMEOUT = 120.0  # seconds for a server to accept clients
STOP_TIMEOUT = 60.0  # seconds between SIGTERM and SIGKILL
IDLE_TIMEOUT = 30.0  # seconds a phase may wait without any progress
REDIS_SERVER = "/usr/bin/redis-server"
RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"  # not /usr/sbin's su wrapper
EPMD = "/usr/bin/epmd"
RABBIT_NODE = "eomsgbench@localhost"
MODULES = ("redis", "hiredis", "pika")
PEERS_SH = Path(__file__).resolve().parent / "peers.sh"


class BenchError(RuntimeError):
    """A server that would not start, a phase that stalled, or messages lost or
    duplicated."""


# -- installation ------------------------------------------------------------------------------


def missing() -> list[str]:
    """What --peers needs and this machine lacks: server programs and client modules."""
    programs = [p for p in (REDIS_SERVER, RABBITMQ_SERVER, EPMD) if not os.access(p, os.X_OK)]
    modules = [m for m in MODULES if importlib.util.find_spec(m) is None]
    return programs + modules


def ensure_installed() -> None:
    """Run ``bash scripts/peers.sh`` when a server program or a client module is missing
    (saying so on stderr); SystemExit if something is still missing after it."""
    lacking = missing()
    if not lacking:
        return
    print(f"bench: --peers needs {', '.join(lacking)}; running bash {PEERS_SH}", file=sys.stderr)
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(PEERS_SH)], env=env, stdout=sys.stderr, check=False)
    importlib.invalidate_caches()
    lacking = missing()
    if done.returncode != 0 or lacking:
        raise SystemExit(
            f"bench: scripts/peers.sh exited with {done.returncode}; still missing: "
            f"{', '.join(lacking) or 'nothing'}"
        )


# -- processes ---------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port on loopback that nothing listens on (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


class Server:
    """A server process started here in a session of its own (so that SIGKILL can reach
    the programs a wrapper script starts, by the session's process group, whose id is
    this process's), its output in files of ``logs``."""

    def __init__(
        self, name: str, argv: list[str], logs: Path, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.out = logs / f"{name}.out"
        self.err = logs / f"{name}.err"
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.proc = subprocess.Popen(
                argv,
                cwd=logs,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )

    def tail(self, lines: int = 15) -> str:
        """The last lines of the server's output, for an error message."""
        text = []
        for path in (self.out, self.err):
            with contextlib.suppress(OSError):
                text += path.read_text(errors="replace").splitlines()[-lines:]
        return "\n".join(text)

    def wait_until(
        self, ready: Callable[[], bool], what: str, timeout: float, every: float
    ) -> None:
        """Poll ``ready`` every ``every`` seconds until it is true; BenchError if the
        process exits first or ``timeout`` seconds pass."""
        deadline = time.monotonic() + timeout
        while not ready():
            if self.proc.poll() is not None:
                raise BenchError(
                    f"{self.name} exited with {self.proc.returncode} before {what}; its "
                    f"output ends:\n{self.tail()}"
                )
            if time.monotonic() > deadline:
                raise BenchError(
                    f"{self.name}: no {what} after {timeout:.0f} s; its output ends:\n{self.tail()}"
                )
            time.sleep(every)

    def kill(self) -> None:
        """SIGKILL the process's group (it and whatever it started), at once."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM, then SIGKILL to its process group if it has not exited after
        ``timeout`` seconds."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
                return
            except subprocess.TimeoutExpired:
                print(
                    f"bench: {self.name} ignored SIGTERM for {timeout:.0f} s; SIGKILL",
                    file=sys.stderr,
                )
        self.kill()
        # what the group's leader started may outlive it; the leader itself is reaped here
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


class Watchdog:
    """Kill ``servers`` if the measurement is still running after ``seconds``: every
    client call then fails on its connection, so no wait outlives the deadline."""

    def __init__(self, seconds: float, servers: list[Server]) -> None:
        self.fired = False
        self.seconds = seconds
        self._servers = servers
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        """On the timer's thread: SIGKILL every server of the measurement."""
        self.fired = True
        names = ", ".join(s.name for s in self._servers)
        print(
            f"bench: watchdog: {names} still measuring after {self.seconds:.0f} s; SIGKILL",
            file=sys.stderr,
        )
        for server in self._servers:
            server.kill()

    def __enter__(self) -> Watchdog:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: Any
    ) -> None:
        """Cancel the timer; an error after the watchdog fired is told as its doing."""
        self._timer.cancel()
        if self.fired and isinstance(error, Exception) and not isinstance(error, BenchError):
            names = ", ".join(s.name for s in self._servers)
            raise BenchError(
                f"{names}: killed by the watchdog after {self.seconds:.0f} s, then: {error!r}"
            ) from error


def _deadline(n: int, latency_n: int) -> float:
    """Seconds a whole system's run (start-up included) may take: generous, but finite."""
    return START_TIMEOUT + 300.0 + n / 200 + latency_n / 20


# -- workload ----------------------------------------------------------------------------------


def payloads(n: int, size: int, tag: str) -> list[bytes]:
    """``n`` distinct payloads of ``size`` bytes: ``tag`` and a counter, then random hex."""
    random_hex = os.urandom(n * size // 2 + 1).hex()
    out = []
    for i in range(n):
        head = f"{tag}{i:09d}-"
        if len(head) > size:
            raise BenchError(f"--payload must be at least {len(head)} bytes")
        out.append((head + random_hex[i * size : (i + 1) * size - len(head)]).encode())
    return out


def verify(system: str, phase: str, published: list[bytes], consumed: list[bytes]) -> None:
    """BenchError unless ``consumed`` holds each published payload exactly once."""
    if len(consumed) == len(published) and Counter(consumed) == Counter(published):
        return
    got, sent = Counter(consumed), Counter(published)
    lost = sum((sent - got).values())
    extra = sum((got - sent).values())
    raise BenchError(
        f"{system} {phase}: NOT EXACTLY ONCE: published {len(published)}, consumed "
        f"{len(consumed)}: {lost} missing, {extra} duplicated or unknown"
    )


def _quantiles(latencies: list[float]) -> tuple[float, float, float]:
    """p50, p99 and max in ms (the same indexing as scripts/bench_broker.py)."""
    ordered = sorted(latencies)
    return (
        round(ordered[len(ordered) // 2] * 1e3, 3),
        round(ordered[int(len(ordered) * 0.99)] * 1e3, 3),
        round(ordered[-1] * 1e3, 3),
    )


def _figures(n: int, publish_s: float, consume_s: float, latencies: list[float]) -> dict[str, Any]:
    """A system's figures from the seconds its two bulk phases took and its latencies."""
    p50, p99, worst = _quantiles(latencies)
    return {
        "publish_msgs_per_s": round(n / publish_s, 1),
        "consume_msgs_per_s": round(n / consume_s, 1),
        "p50_ms": p50,
        "p99_ms": p99,
        "max_ms": worst,
        "publish_s": round(publish_s, 4),
        "consume_s": round(consume_s, 4),
    }


# -- Redis -------------------------------------------------------------------------------------


def _redis_publish(r: Any, batch: list[bytes]) -> float:
    """Seconds to XADD ``batch``: pipelines of WINDOW commands, each executed (every reply
    read: appended and fsynced) before the next is sent."""
    t0 = time.perf_counter()
    for i in range(0, len(batch), WINDOW):
        pipe = r.pipeline(transaction=False)
        for p in batch[i : i + WINDOW]:
            pipe.xadd(STREAM, {"p": p})
        pipe.execute()
    return time.perf_counter() - t0


def _redis_consume(r: Any, n: int) -> tuple[list[bytes], float]:
    """Seconds to read ``n`` entries through the consumer group, COUNT BATCH a call, each
    batch's XACK and XDEL sent in one pipeline (and answered) before the next read."""
    got: list[bytes] = []
    t0 = time.perf_counter()
    while len(got) < n:
        reply = r.xreadgroup(GROUP, "c1", {STREAM: ">"}, count=BATCH, block=int(IDLE_TIMEOUT * 1e3))
        if not reply:
            raise BenchError(f"redis: no entry for {IDLE_TIMEOUT:.0f} s after {len(got)} of {n}")
        ids = []
        for _stream, entries in reply:
            for entry_id, fields in entries:
                ids.append(entry_id)
                got.append(fields[b"p"])
        pipe = r.pipeline(transaction=False)
        pipe.xack(STREAM, GROUP, *ids)
        pipe.xdel(STREAM, *ids)
        acked, deleted = pipe.execute()
        if acked != len(ids) or deleted != len(ids):
            raise BenchError(f"redis: {len(ids)} entries read, {acked} acked, {deleted} deleted")
    return got, time.perf_counter() - t0


def run_redis(n: int, latency_n: int, size: int, tmp: Path) -> dict[str, Any]:
    """Publish, consume+ack and single-publish latency on a Redis stream (see the module's
    docstring); the figures and Redis's version."""
    import redis
    import redis.utils

    if not redis.utils.HIREDIS_AVAILABLE:
        raise BenchError("redis-py does not find hiredis; pip install 'redis[hiredis]'")
    bulk, single = payloads(n, size, "p"), payloads(latency_n, size, "l")
    port = free_port()
    argv = [
        REDIS_SERVER,
        "--port", str(port),
        "--bind", HOST,
        "--dir", str(tmp),
        "--appendonly", "yes",
        "--appendfsync", "always",
        "--save", "",
        "--daemonize", "no",
        "--protected-mode", "yes",
        "--logfile", "",
    ]  # fmt: skip
    server = Server("redis", argv, tmp)
    try:
        with Watchdog(_deadline(n, latency_n), [server]):
            r = redis.Redis(
                host=HOST, port=port, socket_timeout=IDLE_TIMEOUT * 2, socket_connect_timeout=5
            )

            def ready() -> bool:
                try:
                    return bool(r.ping())
                except (redis.ConnectionError, redis.BusyLoadingError):
                    return False

            server.wait_until(ready, "answer to PING", START_TIMEOUT, 0.05)
            info = r.info("server")
            config = r.config_get("appendonly", "appendfsync")
            if config != {"appendonly": "yes", "appendfsync": "always"}:
                raise BenchError(f"redis: not durable as asked: {config}")
            r.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
            publish_s = _redis_publish(r, bulk)
            got, consume_s = _redis_consume(r, n)
            verify("redis", "publish/consume", bulk, got)
            latencies = []
            for p in single:
                t = time.perf_counter()
                r.xadd(STREAM, {"p": p})
                latencies.append(time.perf_counter() - t)
            got, _ = _redis_consume(r, latency_n)
            verify("redis", "latency", single, got)
            left, pending = r.xlen(STREAM), r.xpending(STREAM, GROUP)["pending"]
            if left or pending:
                raise BenchError(f"redis: {left} entries left in the stream, {pending} pending")
            r.close()
    finally:
        server.stop()
    result = _figures(n, publish_s, consume_s, latencies)
    result["version"] = (
        f"redis-server {info['redis_version']}, redis-py {redis.__version__} (hiredis)"
    )
    return result


# -- RabbitMQ ----------------------------------------------------------------------------------


def _rabbit_params(port: int) -> Any:
    """pika's parameters for the node on HOST:``port`` (guest, allowed on loopback), with
    bounded connect, socket and blocked-connection waits."""
    import pika

    return pika.ConnectionParameters(
        host=HOST,
        port=port,
        credentials=pika.PlainCredentials("guest", "guest"),
        connection_attempts=1,
        socket_timeout=10,
        blocked_connection_timeout=IDLE_TIMEOUT,
    )


class RabbitPublisher:
    """Publish persistent messages to QUEUE through pika's SelectConnection with publisher
    confirms, keeping at most WINDOW unconfirmed: the next is sent as confirms come in."""

    def __init__(self, port: int, batch: list[bytes], deadline: float) -> None:
        import pika

        self._pika = pika
        self._params = _rabbit_params(port)
        self._batch = batch
        self._deadline = deadline
        self._props = pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent)
        self._channel: Any = None
        self._conn: Any = None
        self._outstanding: deque[int] = deque()  # delivery tags sent, oldest first
        self._confirmed_early: set[int] = set()  # single confirms that overtook older ones
        self._sent = 0
        self._confirmed = 0
        self._t0 = 0.0
        self._t1 = 0.0
        self._error: str | None = None

    def run(self) -> float:
        """Seconds from the channel's confirm mode to the last confirm."""
        self._conn = self._pika.SelectConnection(
            self._params,
            on_open_callback=self._on_open,
            on_open_error_callback=self._on_open_error,
            on_close_callback=self._on_closed,
        )
        self._conn.ioloop.call_later(self._deadline, self._on_deadline)
        self._conn.ioloop.start()
        if self._error is not None:
            raise BenchError(f"rabbitmq publish: {self._error}")
        return self._t1 - self._t0

    def _fail(self, error: str) -> None:
        if self._error is None:
            self._error = error
        if self._conn.is_closing or self._conn.is_closed:
            self._conn.ioloop.stop()
        else:
            self._conn.close()  # _on_closed stops the loop

    def _on_open(self, conn: Any) -> None:
        conn.channel(on_open_callback=self._on_channel)

    def _on_open_error(self, conn: Any, error: Exception) -> None:
        self._error = f"cannot connect: {error!r}"
        conn.ioloop.stop()

    def _on_closed(self, conn: Any, reason: Exception) -> None:
        if self._confirmed < len(self._batch) and self._error is None:
            self._error = f"connection closed: {reason!r}"
        conn.ioloop.stop()

    def _on_deadline(self) -> None:
        if self._confirmed < len(self._batch):
            self._fail(
                f"{self._confirmed} of {len(self._batch)} confirmed after {self._deadline:.0f} s"
            )

    def _on_channel(self, channel: Any) -> None:
        self._channel = channel
        channel.add_on_close_callback(self._on_channel_closed)
        channel.confirm_delivery(ack_nack_callback=self._on_confirm, callback=self._on_confirm_mode)

    def _on_channel_closed(self, channel: Any, reason: Exception) -> None:
        if self._confirmed < len(self._batch):
            self._fail(f"channel closed: {reason!r}")

    def _on_confirm_mode(self, frame: Any) -> None:
        """The channel confirms: the clock starts, and the first WINDOW messages go out."""
        self._t0 = time.perf_counter()
        self._fill()

    def _fill(self) -> None:
        """Publish until WINDOW messages are unconfirmed or all are sent."""
        batch, channel = self._batch, self._channel
        while (
            self._sent < len(batch) and len(self._outstanding) - len(self._confirmed_early) < WINDOW
        ):
            channel.basic_publish("", QUEUE, batch[self._sent], self._props)
            self._sent += 1  # delivery tags count the channel's publishes from 1
            self._outstanding.append(self._sent)

    def _on_confirm(self, frame: Any) -> None:
        """Count a Basic.Ack (of one tag, or of every tag up to it with ``multiple``), then
        refill the window; the clock stops at the last. A Basic.Nack fails the run."""
        method = frame.method
        if not isinstance(method, self._pika.spec.Basic.Ack):
            self._fail(f"the broker refused message {method.delivery_tag}: {method.NAME}")
            return
        tag, outstanding = method.delivery_tag, self._outstanding
        before = len(outstanding) - len(self._confirmed_early)
        if method.multiple:
            while outstanding and outstanding[0] <= tag:
                self._confirmed_early.discard(outstanding.popleft())
        elif outstanding and outstanding[0] == tag:
            outstanding.popleft()
        else:
            self._confirmed_early.add(tag)
        while outstanding and outstanding[0] in self._confirmed_early:
            self._confirmed_early.discard(outstanding.popleft())
        self._confirmed += before - (len(outstanding) - len(self._confirmed_early))
        if self._confirmed == len(self._batch):
            self._t1 = time.perf_counter()
            self._conn.close()
        else:
            self._fill()


def _rabbit_consume(port: int, n: int) -> tuple[list[bytes], float]:
    """Seconds to receive ``n`` messages from QUEUE (prefetch RABBIT_PREFETCH) and ack them,
    ``basic_ack(multiple=True)`` every BATCH; ends with the consumer's cancel, a round trip
    that the acks before it precede."""
    import pika

    conn = pika.BlockingConnection(_rabbit_params(port))
    try:
        channel = conn.channel()
        channel.basic_qos(prefetch_count=RABBIT_PREFETCH)
        got: list[bytes] = []
        unacked = 0
        t0 = time.perf_counter()
        for method, _props, body in channel.consume(QUEUE, inactivity_timeout=IDLE_TIMEOUT):
            if method is None:
                raise BenchError(
                    f"rabbitmq: no message for {IDLE_TIMEOUT:.0f} s after {len(got)} of {n}"
                )
            got.append(body)
            unacked += 1
            if unacked == BATCH or len(got) == n:
                channel.basic_ack(method.delivery_tag, multiple=True)
                unacked = 0
            if len(got) == n:
                break
        requeued = channel.cancel()
        seconds = time.perf_counter() - t0
        if requeued:
            raise BenchError(f"rabbitmq: {requeued} messages beyond the {n} expected")
        return got, seconds
    finally:
        conn.close()


def run_rabbitmq(n: int, latency_n: int, size: int, tmp: Path) -> dict[str, Any]:
    """Publish, consume+ack and single-publish latency on a RabbitMQ quorum queue (see the
    module's docstring); the figures and RabbitMQ's version. The node runs in ``tmp``
    (its HOME, cookie, Mnesia and logs) with an epmd of its own on a free port."""
    import pika

    bulk, single = payloads(n, size, "p"), payloads(latency_n, size, "l")
    home = tmp / "home"
    home.mkdir()
    cookie = home / ".erlang.cookie"
    cookie.write_text(os.urandom(16).hex())
    cookie.chmod(0o400)
    port, dist_port, epmd_port = free_port(), free_port(), free_port()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "HOME": str(home),
        "ERL_EPMD_PORT": str(epmd_port),
        "ERL_EPMD_ADDRESS": HOST,
        "RABBITMQ_NODENAME": RABBIT_NODE,
        "RABBITMQ_NODE_IP_ADDRESS": HOST,
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(dist_port),
        "RABBITMQ_MNESIA_BASE": str(tmp / "mnesia"),
        "RABBITMQ_LOG_BASE": str(tmp / "log"),
        "RABBITMQ_CONFIG_FILE": str(tmp / "rabbitmq"),  # none: the defaults
        "RABBITMQ_ADVANCED_CONFIG_FILE": str(tmp / "advanced.config"),
        "RABBITMQ_CONF_ENV_FILE": str(tmp / "rabbitmq-env.conf"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(tmp / "enabled_plugins"),  # none
        # Erlang distribution on loopback only.
        "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
    }
    servers: list[Server] = []
    try:
        with Watchdog(_deadline(n, latency_n), servers):
            # An epmd of our own, a child we stop, rather than the daemon that the node would
            # otherwise start on the machine's port 4369 and leave behind.
            epmd = Server("epmd", [EPMD, "-port", str(epmd_port), "-address", HOST], tmp, env)
            servers.append(epmd)
            epmd.wait_until(lambda: _listening(epmd_port), "epmd listening", 10, 0.05)
            server = Server("rabbitmq", [RABBITMQ_SERVER], tmp, env)
            servers.insert(0, server)  # stopped before its epmd

            def ready() -> bool:
                if not _listening(port):
                    return False
                try:
                    pika.BlockingConnection(_rabbit_params(port)).close()
                    return True
                except pika.exceptions.AMQPError:
                    return False

            server.wait_until(ready, "AMQP listener", START_TIMEOUT, 0.25)
            conn = pika.BlockingConnection(_rabbit_params(port))
            version = conn._impl.server_properties.get("version", b"?")  # the broker's greeting
            channel = conn.channel()
            channel.queue_declare(QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
            conn.close()
            publish_s = RabbitPublisher(port, bulk, IDLE_TIMEOUT + n / 200).run()
            got, consume_s = _rabbit_consume(port, n)
            verify("rabbitmq", "publish/consume", bulk, got)
            conn = pika.BlockingConnection(_rabbit_params(port))
            channel = conn.channel()
            channel.confirm_delivery()  # basic_publish now waits for the confirm
            props = pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent)
            latencies = []
            for p in single:
                t = time.perf_counter()
                channel.basic_publish("", QUEUE, p, props, mandatory=True)
                latencies.append(time.perf_counter() - t)
            conn.close()
            got, _ = _rabbit_consume(port, latency_n)
            verify("rabbitmq", "latency", single, got)
            conn = pika.BlockingConnection(_rabbit_params(port))
            left = conn.channel().queue_declare(QUEUE, passive=True).method.message_count
            conn.close()
            if left:
                raise BenchError(f"rabbitmq: {left} messages left in the queue")
    finally:
        for s in servers:
            s.stop()
    result = _figures(n, publish_s, consume_s, latencies)
    if isinstance(version, bytes):
        version = version.decode()
    result["version"] = f"rabbitmq-server {version}, pika {pika.__version__}"
    result["prefetch"] = RABBIT_PREFETCH
    return result


def _listening(port: int) -> bool:
    """Whether something accepts TCP connections on HOST:``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1)
        return s.connect_ex((HOST, port)) == 0


# -- eomsg -------------------------------------------------------------------------------------


def _eomsg_publish(client: Any, batch: list[bytes], tag: str) -> float:
    """Seconds to publish ``batch`` with ``publish_async``, an id on each, at most WINDOW
    unacknowledged: before the next is sent past the window, the oldest's ack is awaited
    (bounded; the client's own window=WINDOW would block the same way, unbounded)."""
    pending: deque[Any] = deque()
    t0 = time.perf_counter()
    for i, p in enumerate(batch):
        if len(pending) == WINDOW:
            pending.popleft().result(timeout=IDLE_TIMEOUT)
        pending.append(client.publish_async(TOPIC, p, id=f"{tag}{i}"))
    for ack in pending:
        ack.result(timeout=IDLE_TIMEOUT)
    return time.perf_counter() - t0


def _eomsg_consume(client: Any, n: int) -> tuple[list[bytes], float, float]:
    """Seconds to receive ``n`` messages from the queue (prefetch BATCH) and delete each,
    the consumer's bind included; ends when the consumer's exit has seen every deletion
    durable. Also the seconds the bind alone took (``with client.consumer(...)``)."""
    got: list[bytes] = []
    deletes = []
    t0 = time.perf_counter()
    with client.consumer(QUEUE, prefetch=BATCH, idle_timeout=IDLE_TIMEOUT) as consumer:
        bound = time.perf_counter() - t0
        for msg in consumer:
            got.append(msg.payload)
            deletes.append(msg.delete())
            if len(got) == n:
                break
    seconds = time.perf_counter() - t0
    if len(got) < n:
        raise BenchError(f"eomsg: no message for {IDLE_TIMEOUT:.0f} s after {len(got)} of {n}")
    refused = sum(
        1 for d in deletes if d.exception(timeout=IDLE_TIMEOUT) is not None or not d.result()
    )
    if refused:
        raise BenchError(f"eomsg: {refused} of {n} deletions failed")
    return got, seconds, bound


def run_eomsg(n: int, latency_n: int, size: int, tmp: Path) -> dict[str, Any]:
    """Publish, consume+delete and single-publish latency through a node process (see the
    module's docstring); the figures and eomsg's version."""
    import eomsg
    from eomsg.core.queues import QueueConfig

    bulk, single = payloads(n, size, "p"), payloads(latency_n, size, "l")
    data = tmp / "data"
    argv = [sys.executable, "-m", "eomsg", "serve", "--data", str(data), "--json"]
    server = Server("eomsg", argv, tmp)

    def ready() -> bool:
        for line in server.out.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                if json.loads(line).get("event") == "ready":
                    return True
        return False

    try:
        with Watchdog(_deadline(n, latency_n), [server]):
            server.wait_until(ready, "ready event", START_TIMEOUT, 0.05)
            with eomsg.connect(data, window=WINDOW) as client:
                client.create_queue(QueueConfig.create(QUEUE, ["bench/>"]))
                publish_s = _eomsg_publish(client, bulk, "m")
                got, consume_s, bind_s = _eomsg_consume(client, n)
                verify("eomsg", "publish/consume", bulk, got)
                latencies = []
                for i, p in enumerate(single):
                    t = time.perf_counter()
                    # client.publish(...), which is this without the bound
                    client.publish_async(TOPIC, p, id=f"l{i}").result(timeout=IDLE_TIMEOUT)
                    latencies.append(time.perf_counter() - t)
                got, _, _ = _eomsg_consume(client, latency_n)
                verify("eomsg", "latency", single, got)
                stats = {s.name: s for s in client.stats()}[QUEUE]
                if stats.depth or stats.in_flight:
                    raise BenchError(
                        f"eomsg: {stats.depth} left in the queue, {stats.in_flight} in flight"
                    )
    finally:
        server.stop()
    result = _figures(n, publish_s, consume_s, latencies)
    result["consumer_bind_ms"] = round(bind_s * 1e3, 1)  # part of consume_s
    result["version"] = f"eomsg {importlib.metadata.version('eomsg')}{_git_head()}"
    return result


def _git_head() -> str:
    """`` (git abc1234)`` for the checkout this script is in, ``+dirty`` if the package's
    files differ from that commit (what ran is the work tree), or nothing."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()

    with contextlib.suppress(OSError, subprocess.SubprocessError):
        head = git("rev-parse", "--short", "HEAD")
        dirty = "+dirty" if git("status", "--porcelain", "--", "eomsg") else ""
        return f" (git {head}{dirty})"
    return ""


RUNNERS: dict[str, Callable[[int, int, int, Path], dict[str, Any]]] = {
    "redis": run_redis,
    "rabbitmq": run_rabbitmq,
    "eomsg": run_eomsg,
}


# -- the side by side --------------------------------------------------------------------------


def run(n: int, latency_n: int, rounds: int, size: int = 256) -> dict[str, Any]:
    """``rounds`` rounds of every system in turn (redis, rabbitmq, eomsg, redis, ...),
    each on a fresh server in a fresh temporary directory: every round's figures, the
    median of each figure per system, and the ratios eomsg / peer of those medians."""
    if n < 1 or latency_n < 1 or rounds < 1:
        raise BenchError("--n, --latency-n and --rounds must be positive")
    results: list[dict[str, dict[str, Any]]] = []
    versions: dict[str, str] = {}
    load_before = os.getloadavg()
    for r in range(rounds):
        round_results: dict[str, dict[str, Any]] = {}
        for system in SYSTEMS:
            print(f"bench: round {r + 1}/{rounds}: {system} (n={n})", file=sys.stderr)
            with tempfile.TemporaryDirectory(prefix=f"eomsg-peers-{system}-") as tmp:
                figures = RUNNERS[system](n, latency_n, size, Path(tmp))
            versions[system] = figures.pop("version")
            round_results[system] = figures
            print(f"bench:   {_line(system, figures)}", file=sys.stderr)
        results.append(round_results)
    median = {
        system: {
            f: round(statistics.median(rr[system][f] for rr in results), 3)
            for f in (*FIGURES, "max_ms")
        }
        for system in SYSTEMS
    }
    ratios = {
        f"eomsg/{peer}": {
            f: round(median["eomsg"][f] / median[peer][f], 3) if median[peer][f] else None
            for f in FIGURES
        }
        for peer in PEERS
    }
    return {
        "scenario": "peers",
        "n": n,
        "latency_n": latency_n,
        "payload_bytes": size,
        "window": WINDOW,
        "ack_batch": BATCH,
        "prefetch": {"redis": BATCH, "rabbitmq": RABBIT_PREFETCH, "eomsg": BATCH},
        "transport": {"redis": "tcp loopback", "rabbitmq": "tcp loopback", "eomsg": "unix socket"},
        "durability": {
            "redis": "appendonly yes, appendfsync always, save ''",
            "rabbitmq": "durable quorum queue, persistent messages, publisher confirms",
            "eomsg": "default (acknowledged once durable), an id on every message",
        },
        "rounds": results,
        "median": median,
        "ratios": ratios,
        "ratio_meaning": "eomsg's figure divided by the peer's: above 1 is faster for "
        "msgs/s, slower for ms",
        "versions": versions,
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
    }


def _line(system: str, f: dict[str, Any]) -> str:
    """One system's figures on a line."""
    return (
        f"{system:<9} publish {f['publish_msgs_per_s']:>10,.0f} msgs/s   consume+ack "
        f"{f['consume_msgs_per_s']:>10,.0f} msgs/s   latency p50 {f['p50_ms']:>7.3f} ms  "
        f"p99 {f['p99_ms']:>7.3f} ms"
    )


def text(result: dict[str, Any]) -> str:
    """The result as lines: every round's (when more than one), the medians, the ratios."""
    lines = [
        f"peers: n={result['n']} x {result['payload_bytes']} B, window {result['window']}, "
        f"acks by {result['ack_batch']}, latency over {result['latency_n']} single publishes; "
        f"load avg before {result['load_avg_before'][0]}"
    ]
    rounds = result["rounds"]
    if len(rounds) > 1:
        for i, rr in enumerate(rounds):
            lines += [f"round {i + 1}  {_line(system, rr[system])}" for system in SYSTEMS]
        lines += [f"median   {_line(system, result['median'][system])}" for system in SYSTEMS]
    else:
        lines += [_line(system, result["median"][system]) for system in SYSTEMS]
    for pair, ratio in result["ratios"].items():
        lines.append(
            f"{pair:<15} publish {ratio['publish_msgs_per_s']}x  consume+ack "
            f"{ratio['consume_msgs_per_s']}x  p50 {ratio['p50_ms']}x  p99 {ratio['p99_ms']}x"
        )
    return "\n".join(lines)
