"""The fault proxy the network tests rely on does what it says, frame by frame."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator

import pytest

from eomsg.chaos.proxy import FaultProxy
from tests.conftest import eventually


class Sink:
    """A loopback server that keeps the frames each connection sends it."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.frames: list[bytes] = []
        self.closed = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.server.accept()
        with conn:
            data = b""
            while chunk := conn.recv(65536):
                data += chunk
        while data:
            (n,) = struct.unpack_from(">I", data)
            self.frames.append(data[4 : 4 + n])
            data = data[4 + n :]
        self.closed.set()


@pytest.fixture
def sink() -> Iterator[Sink]:
    s = Sink()
    yield s
    s.server.close()


def send(port: int, frames: list[bytes]) -> None:
    with socket.create_connection(("127.0.0.1", port)) as c:
        for f in frames:
            c.sendall(struct.pack(">I", len(f)) + f)
            c.sendall(b"")  # frames may arrive split or together: the proxy reframes


FRAMES = [f"frame {i}".encode() for i in range(6)]


@pytest.mark.parametrize(
    ("faults", "want"),
    [
        ({}, FRAMES),
        ({"drop": 1.0}, []),
        ({"duplicate": 1.0}, [f for f in FRAMES for _ in (0, 1)]),
        ({"reorder": 1.0}, [FRAMES[i] for i in (1, 0, 3, 2, 5, 4)]),
    ],
)
def test_frames_are_dropped_duplicated_or_reordered(
    sink: Sink, faults: dict[str, float], want: list[bytes]
) -> None:
    with FaultProxy(sink.port, **faults) as proxy:
        send(proxy.port, FRAMES)
        assert sink.closed.wait(10)
    assert sink.frames == want


def test_a_cut_closes_connections_and_refuses_new_ones_until_restored(sink: Sink) -> None:
    with FaultProxy(sink.port) as proxy:
        c = socket.create_connection(("127.0.0.1", proxy.port))
        c.sendall(struct.pack(">I", 2) + b"hi")
        assert eventually(lambda: proxy.counts["connections"] == 1)
        proxy.cut()
        assert closed(c)  # under it, at once
        assert sink.closed.wait(10) and sink.frames in ([], [b"hi"])
        assert closed(socket.create_connection(("127.0.0.1", proxy.port)))
        proxy.restore()
        send(proxy.port, [b"again"])
        assert eventually(lambda: proxy.counts["connections"] == 2) and proxy.counts["cut"] == 1


def closed(c: socket.socket) -> bool:
    """Whether the peer closed or reset ``c`` (waiting up to 10 s to hear it)."""
    c.settimeout(10)
    try:
        return c.recv(1) == b""
    except ConnectionResetError:
        return True
    finally:
        c.close()


def test_a_lost_reply_cuts_the_client_off_after_its_request_landed() -> None:
    """The request reaches upstream; upstream's answer never reaches the client."""
    server = socket.create_server(("127.0.0.1", 0))
    got: list[bytes] = []

    def answer() -> None:
        conn, _ = server.accept()
        with conn:
            (n,) = struct.unpack(">I", conn.recv(4))
            got.append(conn.recv(n))
            conn.sendall(struct.pack(">I", 2) + b"ok")

    threading.Thread(target=answer, daemon=True).start()
    with FaultProxy(server.getsockname()[1], lose_reply=1.0) as proxy:
        c = socket.create_connection(("127.0.0.1", proxy.port))
        c.sendall(struct.pack(">I", 7) + b"publish")
        assert closed(c)  # cut, with nothing of the answer
        assert got == [b"publish"] and proxy.counts["replies lost"] == 1
    server.close()
