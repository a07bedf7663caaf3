"""A data directory lent by the command that holds it. The store takes one process at a
time, so a command that runs in-process — a long ``eomsg consume``, ``eomsg top``, a
replay between its steps — holds the directory; while it does, it serves the
directory's socket for operations that change nothing (``inspect``, ``browse``, ``queue
list``, ``config show``), so other commands can look instead of being turned away.
Anything else is refused as DataDirLocked, naming the holder — unless the holder is a
view that changes nothing itself (``eomsg top``): it lends the directory whole, and
writers go through it as through ``eomsg serve``, so that looking never stops them.

Lending starts once the command has held the directory for LEND_AFTER seconds (a quick
command never pays for it; a view lends at once) and stops, its socket removed, before
the command lets the directory go; what is connected then is told the node is shutting
down."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from eomsg.node.node import Node

LEND_AFTER = 0.5  # seconds a command holds the directory before it lends it
log = logging.getLogger("eomsg.server")


@contextlib.contextmanager
def lending(
    data_dir: Path, node: Node, refusal: str | None, *, after: float = LEND_AFTER
) -> Iterator[None]:
    """Lend ``data_dir`` (held by this process, ``node`` open on it) ``after`` seconds
    into the block — for looking, what would change it refused as
    DataDirLocked(``refusal``), or with ``refusal`` None for everything; stop lending,
    and wait for that, before it ends."""
    lender = _Lender(data_dir, node, refusal)
    timer = threading.Timer(after, lender.start)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        lender.stop()


class _Lender:
    """The socket's server, on a thread and an event loop of its own."""

    def __init__(self, data_dir: Path, node: Node, refusal: str | None) -> None:
        self.data_dir = data_dir
        self.node = node
        self.refusal = refusal
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        with self._lock:
            if self._done.is_set():
                return
            self._thread = threading.Thread(target=self._run, name="eomsg-lend", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        with self._lock:
            self._done.set()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        # Here, not at the top: a quick command, done before it lends, never loads
        # asyncio and the server (≈ 60 ms).
        import asyncio

        from eomsg.server.server import Server, ServerSettings

        async def main() -> None:

            server = Server(self.node, self.data_dir, ServerSettings(), looking_only=self.refusal)
            try:
                await server.start()
                while not self._done.is_set():
                    await asyncio.sleep(0.05)
            finally:
                await server.stop()

        try:
            asyncio.run(main())
        except Exception:  # the command goes on; others are turned away as before
            log.warning("cannot lend %s for looking", self.data_dir, exc_info=True)
