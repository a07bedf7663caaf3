"""A network of nodes in one process, for the link tests (tests/test_links.py,
tests/test_egress.py): frames, routes and acknowledgements carried between nodes by the
test, with faults drawn from a seeded generator — drops, repeats, reorders — and cuts
and restarts; every node's clock is the test's to move."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import msgpack

from eomsg.core.message import Batch, Carried
from eomsg.errors import DiskFull, MemoryFull, QueueFull
from eomsg.node.node import Node, NodeSettings
from eomsg.wire import events as ev
from eomsg.wire import link_events as lev

T = TypeVar("T")


def _through_the_wire(prev: int, batch: Batch) -> tuple[int, tuple[Carried, ...]]:
    """A frame as the peer gets it: packed, unpacked, checked, one by one."""
    body = msgpack.unpackb(msgpack.packb(lev.Transfer(prev, batch).to_wire()), raw=False)
    event = ev.decode_event(body)
    assert isinstance(event, lev.Transfer)
    return event.prev, event.batch.carried()


@dataclass
class Wire:
    """One direction of a connection: frames in flight, and the faults applied to them."""

    frames: list[tuple[int, tuple[Carried, ...]]] = field(default_factory=list)
    acks: list[tuple[int, bool]] = field(default_factory=list)


class Net:
    """Nodes opened on ``tmp``, linked as told; :meth:`run` carries routes, frames and
    acknowledgements until all is quiet, with faults drawn from ``rng``."""

    def __init__(
        self,
        tmp: Path,
        names: str,
        rng: random.Random,
        faults: float = 0.0,
        egress: str = "store",
        compact_every: int = 50_000,
    ) -> None:
        self.tmp, self.rng, self.faults, self.egress = tmp, rng, faults, egress
        self.compact_every = compact_every
        self.now = time.time()  # every node's clock: a test moves it on
        self.nodes: dict[str, Node] = {n: self._open(n) for n in names}
        self.links: set[tuple[str, str]] = set()  # (a, b) with a < b
        self.up: set[tuple[str, str]] = set()
        self.wires: dict[tuple[str, str], Wire] = {}

    def _open(self, name: str) -> Node:
        settings = NodeSettings(tick=None, node_name=name, compact_every=self.compact_every)
        return Node.open(self.tmp / name, settings, clock=lambda: self.now)

    def link(self, a: str, b: str) -> None:
        self.nodes[a].links.add_link(b, None, None)
        self.nodes[b].links.add_link(a, None, None)
        if self.egress != "store":
            self.nodes[a].links.set_link_egress(b, self.egress)
            self.nodes[b].links.set_link_egress(a, self.egress)
        self.links.add((min(a, b), max(a, b)))
        self.connect(a, b)

    def connect(self, a: str, b: str) -> None:
        na, nb = self.nodes[a], self.nodes[b]
        read_by_b = nb.transfer.link_hello(a, na.incarnation)
        read_by_a = na.transfer.link_hello(b, nb.incarnation)
        for x, y, read in ((a, b, read_by_b), (b, a, read_by_a)):
            self.wires[(x, y)] = Wire()
            update = self.nodes[x].transfer.link_connected(y, read, lambda: None)  # a connection
            self.nodes[y].transfer.link_heard(x, update.full, update.moves)
        self.up.add((min(a, b), max(a, b)))

    def cut(self, a: str, b: str) -> None:
        key = (min(a, b), max(a, b))
        if key not in self.up:
            return
        self.up.discard(key)
        for x, y in ((a, b), (b, a)):
            self.wires.pop((x, y), None)
            link = self.nodes[x].links.find(y)
            assert link is not None and link.wake is not None
            wake = link.wake
            self.nodes[x].transfer.link_disconnected(y, wake)

    def restart(self, name: str, while_down: Callable[[Path], None] | None = None) -> None:
        """Close node ``name`` and open it again (``while_down``: done to its data
        directory in between)."""
        for a, b in list(self.up):
            if name in (a, b):
                self.cut(a, b)
        self.nodes[name].close()
        if while_down is not None:
            while_down(self.tmp / name)
        self.nodes[name] = self._open(name)

    def heal(self) -> None:
        for a, b in sorted(self.links - self.up):
            self.connect(a, b)

    def _faulty(self, items: list[T]) -> list[T]:
        out: list[T] = []
        for item in items:
            r = self.rng.random()
            if r < self.faults:
                continue  # dropped
            out.append(item)
            if r < 2 * self.faults:
                out.append(item)  # repeated
        if self.rng.random() < self.faults and len(out) > 1:
            i = self.rng.randrange(len(out) - 1)
            out[i], out[i + 1] = out[i + 1], out[i]  # reordered
        return out

    def step(self) -> bool:
        """One round on every connection; whether anything moved."""
        moved = False
        for (x, y), wire in list(self.wires.items()):
            nx, ny = self.nodes[x], self.nodes[y]
            for u in nx.transfer.link_updates(y):
                ny.transfer.link_heard(x, u.full, u.moves)
                moved = True
            wire.frames.extend(_through_the_wire(prev, b) for prev, b in nx.transfer.link_frames(y))
            frames, wire.frames = self._faulty(wire.frames), []
            for prev, messages in frames:
                with suppress(DiskFull, MemoryFull, QueueFull):  # a link sends them again
                    wire.acks.append(ny.intake.accept_transfer(x, prev, messages).result())
                moved = True
            ack = ny.transfer.link_ack(x)  # held in memory, and settled (or written) since
            if ack is not None:
                wire.acks.append((ack, False))
                moved = True
            acks, wire.acks = self._faulty(wire.acks), []
            for read, gap in acks:
                nx.transfer.link_taken(y, read, gap)
        return moved

    def rounds(self, n: int) -> None:
        """``n`` rounds, each with every timer run out (what :meth:`run` does, for a
        network that cannot go quiet yet)."""
        for _ in range(n):
            self.step()
            self.now += 3600
            for x, y in list(self.wires):
                self.nodes[x].transfer.link_tick(y)

    def run(self) -> None:
        """Until nothing is owed anywhere: quiet rounds fire the resend timers (and let
        the writers commit what the timers wrote: a loaded machine is slow at it)."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if not self.step():
                owed = any(i.pending for n in self.nodes.values() for i in n.links.link_info())
                if not owed and not any(w.frames or w.acks for w in self.wires.values()):
                    return
                self.now += 3600  # every timer runs out: holds end, messages go again
                for x, y in list(self.wires):
                    self.nodes[x].transfer.link_tick(y)
                time.sleep(0.001)
        raise AssertionError("the network never went quiet")

    def drain(self, node: str, queue: str) -> list[tuple[str, str]]:
        """Every message in ``queue`` as (origin, payload), deleted."""
        out: list[tuple[str, str]] = []
        n = self.nodes[node]
        while batch := n.delivery.fetch(queue, 1000):
            out.extend(
                (m.message.headers.get("eomsg-origin", node), m.message.payload.decode())
                for m in batch
            )
            n.delivery.delete(queue, [m.key for m in batch])
        return out

    def close(self) -> None:
        for n in self.nodes.values():
            n.close()


MakeNet = Callable[..., Net]
