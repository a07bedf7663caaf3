"""A fault proxy: a TCP relay on loopback that cuts the byte streams into eomsg frames
(a 4-byte big-endian length, then the body) and, frame by frame and direction by
direction, drops, duplicates, reorders or delays them; or loses a reply — a frame from
the node is not passed on and the connection is cut, so the request it answers has
landed and its client cannot know it (``lose_reply``); or cuts every connection and
refuses new ones until restored.

It runs its own event loop on a thread, so a test drives it from plain code::

    with FaultProxy(upstream_port, drop=0.1, duplicate=0.1, reorder=0.1, seed=7) as proxy:
        connect to proxy.port …
        proxy.cut(); …; proxy.restore()

What it did is counted in ``proxy.counts`` (connections relayed; frames passed, dropped,
duplicated, reordered; replies lost; cuts), so a test can show the faults really happened.
``upstream`` may be changed while it runs (a node restarted on another port): new
connections go there.
"""

from __future__ import annotations

import asyncio
import random
import struct
import threading
from collections import Counter
from types import TracebackType

_HEADER = struct.Struct(">I")


class FaultProxy:
    """Relays 127.0.0.1:``port`` to 127.0.0.1:``upstream`` with frame faults (each a
    probability per frame, drawn from one seeded generator; ``lose_reply`` only for
    frames from upstream)."""

    def __init__(
        self,
        upstream: int,
        *,
        drop: float = 0.0,
        duplicate: float = 0.0,
        reorder: float = 0.0,
        delay: float = 0.0,
        lose_reply: float = 0.0,
        seed: int = 0,
    ) -> None:
        self.upstream = upstream
        self.drop, self.duplicate, self.reorder, self.delay = drop, duplicate, reorder, delay
        self.lose_reply = lose_reply
        self.counts: Counter[str] = Counter()
        self._rng = random.Random(seed)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._open = True
        self.port = 0

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._call(self._close_all)
        if self._server is not None:
            self._call(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def faults(self, **rates: float) -> None:
        """Change the fault rates (``drop=…``, ``duplicate=…``, ``reorder=…``, ``delay=…``,
        ``lose_reply=…``)."""
        for name, value in rates.items():
            if name not in ("drop", "duplicate", "reorder", "delay", "lose_reply"):
                raise TypeError(f"no fault {name!r}")
            setattr(self, name, value)

    def cut(self) -> None:
        """Close every connection at once (no frame in flight gets through) and refuse new
        ones until :meth:`restore`."""
        self._open = False
        self._call(self._close_all)

    def restore(self) -> None:
        """Accept connections again."""
        self._open = True

    # -- on the proxy's loop ------------------------------------------------------------------

    def _call(self, fn: object) -> None:
        async def run() -> None:
            fn()  # type: ignore[operator]

        asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    def _close_all(self) -> None:
        for w in list(self._writers):
            w.transport.abort()
        if self._writers:
            self.counts["cut"] += 1
        self._writers.clear()

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._open:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        except OSError:
            writer.transport.abort()
            return
        if not self._open:  # cut while connecting
            for w in (writer, up_writer):
                w.transport.abort()
            return
        self._writers |= {writer, up_writer}
        self.counts["connections"] += 1
        await asyncio.gather(
            self._relay(reader, up_writer),
            self._relay(up_reader, writer, replies=True),
            return_exceptions=True,
        )
        for w in (writer, up_writer):
            w.transport.abort()
            self._writers.discard(w)

    async def _relay(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, replies: bool = False
    ) -> None:
        """Frames from ``reader`` to ``writer``, faults applied; until either side ends.
        ``replies``: these frames come from upstream (a reply may be lost)."""
        held: bytes | None = None  # a frame kept back, to go after the next one
        while True:
            try:
                header = await reader.readexactly(_HEADER.size)
                frame = header + await reader.readexactly(_HEADER.unpack(header)[0])
            except (asyncio.IncompleteReadError, ConnectionError):
                writer.transport.abort()
                return
            if replies and self.lose_reply and self._rng.random() < self.lose_reply:
                self.counts["replies lost"] += 1
                writer.transport.abort()  # the client's end: it never hears this reply
                return
            roll = self._rng.random()
            if roll < self.drop:
                self.counts["dropped"] += 1
                continue
            out = [frame]
            if roll < self.drop + self.duplicate:
                out.append(frame)
                self.counts["duplicated"] += 1
            if held is None and self._rng.random() < self.reorder:
                held = b"".join(out)
                self.counts["reordered"] += 1
                continue
            if held is not None:
                out.append(held)
                held = None
            if self.delay:
                await asyncio.sleep(self._rng.uniform(0, self.delay))
            self.counts["passed"] += 1
            writer.write(b"".join(out))
            try:
                await writer.drain()
            except ConnectionError:
                return
