"""``eomsg serve``: the node daemon. It owns the data directory (DuckDB lets one process
hold the file) and serves it on ``DIR/eomsg.sock`` and, when asked, on TCP.

Security baseline: the Unix socket is the owner's alone (mode 0600); TCP needs the token
kept in ``DIR/eomsg.token`` (created on first start, mode 0600, compared in constant
time) and listens on loopback unless ``allow_remote`` says otherwise. Given a
certificate (``tls``), every TCP address speaks TLS and nothing else
(:mod:`eomsg.transport.tls`). Connections, frame size, in-flight bytes and the handshake's
duration (the TLS handshake's included) are all bounded.

Shutdown (SIGTERM, SIGINT, or :meth:`Server.stop`): stop accepting, let every session
answer what it has in flight and say goodbye, then close the node, which runs a last
maintenance pass and checkpoints.

A store that fails (a commit the disk could not take) stops taking writes, and its
in-memory state can no longer be trusted: the server tells every client why and drops
it, closes the node, and opens it again — rebuilt from what the disk holds — as soon as
it can (the disk has room for a checkpoint), retrying with backoff and saying what it
waits for. Meanwhile a client that connects is told the same reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import secrets
import signal
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from eomsg.errors import (
    DataDirDamaged,
    DataDirError,
    DataDirLocked,
    EomsgError,
    InvalidConfig,
    StorageError,
    one_line,
)
from eomsg.node.collector import settle_collector
from eomsg.node.node import Node, room_to_open
from eomsg.server.links import LinkManager
from eomsg.server.session import Session
from eomsg.transport.address import Address, socket_path, token_path, unix_address
from eomsg.transport.tls import ServerTls
from eomsg.wire.events import PROTOCOL_VERSION

if TYPE_CHECKING:  # imported when served: prometheus_client costs every embedded command
    from eomsg.server.metrics import Metrics

T = TypeVar("T")
log = logging.getLogger("eomsg.server")


@dataclass(frozen=True)
class ServerSettings:
    """Limits and timings of the daemon. ``listen`` adds TCP addresses to the socket;
    with ``tls`` they all speak TLS. (The largest frame a client or a linked node may
    send is the node's :attr:`~eomsg.node.settings.NodeSettings.frame_limit` as it
    connects.)"""

    listen: tuple[Address, ...] = ()
    allow_remote: bool = False
    tls: ServerTls | None = None
    max_connections: int = 1024
    max_inflight_bytes: int = 64 << 20  # unacknowledged publish bytes per connection
    max_total_inflight_bytes: int = 512 << 20  # ... and over all connections
    handshake_timeout: float = 5.0
    heartbeat: float = 10.0
    poll: float = 1.0  # how often idle consumers look for redeliveries that came due
    resend: float = 1.0  # how often an unacknowledged flow-active/inactive is sent again
    drain_timeout: float = 30.0
    metrics: Address | None = None  # serve Prometheus metrics here (HTTP)

    def check(self) -> None:
        """InvalidConfig for settings that contradict the security baseline or each other."""
        if self.metrics is not None:
            from eomsg.server.metrics import check_address

            check_address(self.metrics, self.allow_remote)
        for address in self.listen:
            if address.is_unix:
                raise InvalidConfig(
                    f"--listen {address}: the Unix socket is always DIR/eomsg.sock; "
                    "give tcp://HOST:PORT"
                )
            if address.is_tls and self.tls is None:
                raise InvalidConfig(
                    f"--listen {address}: TLS needs the node's certificate (use --tls-cert "
                    "and --tls-key)"
                )
            if not address.is_loopback and not self.allow_remote:
                raise InvalidConfig(
                    f"--listen {address} is not a loopback address; add --allow-remote to "
                    "accept other machines (they must present the token)"
                )
        if self.max_connections < 1:
            raise InvalidConfig("--max-connections must be at least 1")
        if not 0.01 <= self.resend <= 3600:
            raise InvalidConfig("--resend must be between 10 ms and 1 hour")
        if self.tls is not None:
            self.tls.context()  # a file that cannot be used is said before serving


def load_token(data_dir: Path) -> str:
    """The node's TCP token, created (mode 0600) on first use — durably and whole: written
    under another name and synced, then renamed into place and the directory synced, so
    neither a crash nor a power loss leaves the file empty or half written. Called by the
    node holding the data directory's lock: no one else creates it meanwhile."""
    path = token_path(data_dir)
    if not path.exists():
        fresh = path.with_name(path.name + ".new")
        fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(fresh, path)
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    token = path.read_text().strip()
    if not token:
        raise DataDirError(f"{path} is empty; delete it to make a new token")
    return token


class Server:
    """The asyncio side of the daemon, over an open node. Use :func:`serve`. ``reopen``
    opens the node again after its store failed (None: stop serving instead)."""

    def __init__(
        self,
        node: Node,
        data_dir: Path,
        settings: ServerSettings,
        reopen: Callable[[], Node] | None = None,
        looking_only: str | None = None,
    ) -> None:
        settings.check()
        self.node = node
        # Lent by a command that holds the directory: only what changes nothing is
        # served, and the rest refused as DataDirLocked with this message.
        self.looking_only = looking_only
        self.reopen = reopen
        self._down: str | None = None  # why the node is not serving now, while it is not
        self._room_wanted = False  # it waits for disk space: the reason is read afresh
        self.failure: EomsgError | None = None  # why it stopped serving for good
        self.data_dir = data_dir
        self.settings = settings
        self.loop = asyncio.get_running_loop()
        self.token = load_token(data_dir)
        self.links = LinkManager(self)
        self.addresses: list[Address] = []
        self.metrics: Metrics | None = None
        if settings.metrics is not None:
            from eomsg.server.metrics import Metrics

            self.metrics = Metrics(self)
        self.sessions: set[Session] = set()
        self.inflight_bytes = 0
        self._servers: list[asyncio.AbstractServer] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="eomsg-pool")
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._wakes_pending: set[str] = set()
        self._stop_requested = asyncio.Event()
        self._stopping = False
        self._attach(node)

    @property
    def down(self) -> str | None:
        """Why the node is not serving now (None: it is). While it waits for disk space,
        the free space it names is read now, not when the wait began."""
        if self._down is not None and self._room_wanted:
            return self._room_reason(*room_to_open(self.data_dir))
        return self._down

    def _room_reason(self, free: int, need: int) -> str:
        return (
            f"waiting for disk space to reopen the store: {free / (1 << 20):.1f} MiB free on the "
            f"disk holding {self.data_dir}, {need / (1 << 20):.1f} MiB needed (free some; the node "
            "resumes by itself)"
        )

    @property
    def node_name(self) -> str:
        return self.node.node_name

    def _attach(self, node: Node) -> None:
        node.served_on([str(a) for a in self.addresses], PROTOCOL_VERSION)
        node.add_listener(self._on_ready)
        node.add_failure_listener(self._failure_heard)
        node.links.add_links_listener(self._links_changed)

    def _links_changed(self) -> None:
        """Node listener (any thread): a link was added or removed."""
        with contextlib.suppress(RuntimeError):  # loop closed at exit
            self.loop.call_soon_threadsafe(self.links.reconcile)

    def _failure_heard(self, cause: BaseException) -> None:
        """Store failure listener, on one of the writer's threads: hand it to the loop."""
        with contextlib.suppress(RuntimeError):  # loop closed: the process is exiting
            self.loop.call_soon_threadsafe(self._store_failed, cause)

    def _store_failed(self, cause: BaseException) -> None:
        if self._down is not None or self._stopping:
            return
        self._down = (
            f"the node's store failed ({one_line(cause)}) and is being reopened; "
            "connect again shortly"
        )
        self.spawn(self._recover())

    async def _recover(self) -> None:
        """Drop every client (telling it why), close the failed node, then open it again
        once that can work: the disk has room for its WAL's checkpoint."""
        assert self._down is not None
        log.error("%s", self._down)
        for session in list(self.sessions):
            session.dismiss(StorageError(self._down))
        self.links.stop()
        try:
            await self.blocking(self.node.close)
        except Exception:  # a failed store closes as far as it can; the disk holds the rest
            log.exception("closing the failed node")
        if self.reopen is None:
            self.request_stop()
            return
        wait, said = 0.5, ""
        while not self._stopping:
            free, need = await self.blocking(room_to_open, self.data_dir)
            self._room_wanted = free < need
            if free >= need:
                try:
                    node = await self.blocking(self.reopen)
                except (DataDirLocked, DataDirDamaged) as e:  # not for waiting out
                    log.error("cannot reopen the store: %s; stopping", e)
                    self.failure = e
                    self.request_stop()
                    return
                except Exception as e:  # a full disk, a file it cannot reach yet, ...
                    why = f"cannot reopen the store yet ({one_line(e)})"
                else:
                    self.node = node
                    self._attach(node)
                    self._down = None
                    self.links.reconcile()
                    log.warning("the store was reopened; serving again")
                    return
            else:
                why = self._room_reason(free, need)
            if why != said:
                log.warning("%s", why)
                said = why
                self._down = why
            await asyncio.sleep(wait)
            wait = min(wait * 2, 5.0)

    async def start(self) -> None:
        """Listen on the data directory's socket and every ``listen`` address."""
        sock = socket_path(self.data_dir)
        address = unix_address(sock)
        # We hold the data directory's lock, so a socket file left there is stale.
        with contextlib.suppress(FileNotFoundError):
            sock.unlink()
        old_umask = os.umask(0o177)
        try:
            server = await self.loop.create_unix_server(
                lambda: Session(self, needs_token=False), str(sock)
            )
        finally:
            os.umask(old_umask)
        self._servers.append(server)
        self.addresses.append(address)
        tls = None if self.settings.tls is None else self.settings.tls.context()
        for address in self.settings.listen:
            try:
                server = await self.loop.create_server(
                    lambda: Session(self, needs_token=True),
                    address.host,
                    address.port,
                    ssl=tls,
                    ssl_handshake_timeout=None if tls is None else self.settings.handshake_timeout,
                )
            except OSError as e:
                raise InvalidConfig(f"cannot listen on {address}: {e.strerror}") from e
            self._servers.append(server)
            port = server.sockets[0].getsockname()[1]
            scheme = "tcp" if tls is None else "tls"
            self.addresses.append(Address(scheme, host=address.host, port=port))
        self.node.served_on([str(a) for a in self.addresses], PROTOCOL_VERSION)
        if self.metrics is not None and self.settings.metrics is not None:
            self.metrics.start(self.settings.metrics)
        self.links.reconcile()

    def request_stop(self) -> None:
        """Ask :func:`serve` to shut down (safe from a signal handler)."""
        self._stop_requested.set()

    async def stop_requested(self) -> None:
        await self._stop_requested.wait()

    async def stop(self) -> None:
        """Graceful shutdown; see the module docstring. Call once."""
        self._stopping = True
        self.links.stop()
        if self.metrics is not None:
            await self.blocking(self.metrics.stop)
        for server in self._servers:
            server.close()
        sessions = list(self.sessions)
        drained = asyncio.gather(*(s.drain("the node is shutting down") for s in sessions))
        try:
            await asyncio.wait_for(drained, self.settings.drain_timeout)
        except TimeoutError:
            log.warning("sessions did not drain within %g s", self.settings.drain_timeout)
        for s in list(self.sessions):
            if s.transport is not None:
                s.transport.abort()
        for server in self._servers:
            await server.wait_closed()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=self.settings.poll * 2)
        self._pool.shutdown(wait=True)
        with contextlib.suppress(FileNotFoundError):
            socket_path(self.data_dir).unlink()

    # -- sessions ------------------------------------------------------------------------

    def admit(self, session: Session) -> bool:
        if self._stopping or len(self.sessions) >= self.settings.max_connections:
            return False
        self.sessions.add(session)
        return True

    def forget(self, session: Session) -> None:
        self.sessions.discard(session)

    def over_limit(self, session: Session, *, resume: bool = False) -> bool:
        """Whether ``session`` must stop reading: its own or everyone's unacknowledged
        bytes are over the limit (under half of it, once paused, to resume)."""
        s = self.settings
        factor = 0.5 if resume else 1.0
        return (
            session.backpressure.inflight_bytes > s.max_inflight_bytes * factor
            or self.inflight_bytes > s.max_total_inflight_bytes * factor
        )

    def spawn(
        self,
        coro: Coroutine[Any, Any, T],
        on_error: Callable[[BaseException], None] | None = None,
    ) -> asyncio.Task[T]:
        """Run ``coro`` as a task the server keeps a reference to until it ends. No
        task dies unobserved: an exception that ends one is logged, with its traceback,
        and handed to ``on_error`` (the session it belongs to tells its client)."""
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(functools.partial(self._ended, on_error=on_error))
        return task

    def _ended(
        self, task: asyncio.Task[Any], on_error: Callable[[BaseException], None] | None
    ) -> None:
        self._tasks.discard(task)
        if task.cancelled() or (error := task.exception()) is None:
            return
        what = getattr(task.get_coro(), "__qualname__", task.get_name())
        log.error("%s failed: %s", what, one_line(error), exc_info=error)
        if on_error is not None:
            on_error(error)

    async def blocking(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a call that may block (on a commit or a read) on the server's pool."""
        return await self.loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    # -- readiness -----------------------------------------------------------------------

    def ready_waiter(self, queue: str) -> asyncio.Future[None]:
        """A future resolved the next time messages become ready in ``queue``. Take it
        *before* looking at the queue, so nothing that arrives meanwhile is missed."""
        future: asyncio.Future[None] = self.loop.create_future()
        waiters = self._waiters.setdefault(queue, [])
        if len(waiters) > 64:  # consumers that timed out waiting leave cancelled ones
            waiters[:] = [f for f in waiters if not f.done()]
        waiters.append(future)
        return future

    def _on_ready(self, queue: str) -> None:
        """Node listener, on any thread: wake the queue's waiters on the loop, once per
        burst (a wake already scheduled covers later arrivals)."""
        if queue in self._wakes_pending:
            return
        self._wakes_pending.add(queue)
        with contextlib.suppress(RuntimeError):  # loop closed at exit
            self.loop.call_soon_threadsafe(self._wake, queue)

    def _wake(self, queue: str) -> None:
        self._wakes_pending.discard(queue)
        for future in self._waiters.pop(queue, ()):
            if not future.done():
                future.set_result(None)


def serve(
    data_dir: Path,
    node: Node,
    settings: ServerSettings,
    on_ready: Callable[[list[Address], Address | None], None] = lambda addresses, metrics: None,
    reopen: Callable[[], Node] | None = None,
) -> None:
    """Serve ``node`` until SIGTERM or SIGINT, then shut down gracefully. The caller
    opened the node (holding the data directory) and closes it afterwards; a node that
    ``reopen`` opened after a store failure is closed here."""
    server: Server | None = None
    settle_collector()

    async def main() -> None:
        nonlocal server
        server = Server(node, data_dir, settings, reopen)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, server.request_stop)
        try:
            await server.start()
            on_ready(server.addresses, None if server.metrics is None else server.metrics.address)
            await server.stop_requested()
        finally:
            await server.stop()

    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(main())
    finally:
        if server is not None and server.node is not node:
            server.node.close()
    if server is not None and server.failure is not None:
        raise server.failure


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
