"""The sans-IO protocol: bytes in, events out; events in, bytes out.

A :class:`Connection` knows nothing of sockets or threads, so the asyncio server, the
client and the tests drive the very same object::

    conn.receive_data(data)            # b"" means the peer closed its side
    while (event := conn.next_event()) is not NEED_DATA: ...
    sock.sendall(conn.send(event))

Frames are a 4-byte big-endian body length and a msgpack body. The length is checked
against the frame limit *before* the body is read, so an oversize frame costs nothing
but its header. Decoding is strict: no extension types, bounded lengths, every field
checked (see :mod:`eomsg.wire.events`).

Frame limits: each end says in its handshake (Hello, Welcome; between linked nodes
LinkHello, LinkWelcome) the largest frame it accepts, and that is the limit it holds the
peer to; a frame we send over the peer's limit raises FrameTooLarge and is not sent, so
the layers above split what they send to fit (deliveries, answers, publish batches, a
link's transfers). Until a node has read the client's first frame it accepts no more
than :data:`~eomsg.core.limits.HANDSHAKE_FRAME`: a peer that has not said who it is
cannot make it hold a large frame.

Who may send what, and when, is the table :data:`TRANSITIONS`; a move not in it raises
an error naming the event, the sender's role and the state: :class:`RemoteProtocolError`
when the peer made it (and the connection stays broken: it cannot be trusted again),
:class:`LocalProtocolError` when we tried to (nothing is sent; a bug on our side).
"""

from __future__ import annotations

import enum
import struct
from typing import Final

import msgpack

from eomsg.core.limits import DEFAULT_MAX_FRAME, HANDSHAKE_FRAME
from eomsg.errors import (
    FrameTooLarge,
    InvalidInput,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
)
from eomsg.wire.codec import Event
from eomsg.wire.events import (
    Call,
    Cancel,
    Delete,
    Deleted,
    Deliver,
    Error,
    Fetch,
    FlowAck,
    FlowChanged,
    Goodbye,
    Hello,
    Ping,
    Pong,
    Publish,
    Published,
    Release,
    Result,
    Subscribe,
    Unbound,
    Welcome,
    decode_event,
)
from eomsg.wire.link_events import (
    Channel,
    ChannelClose,
    ChannelPause,
    Interest,
    LinkHello,
    LinkProof,
    LinkWelcome,
    Oversize,
    Taken,
    Transfer,
)

_HEADER = struct.Struct(">I")


class Role(enum.Enum):
    CLIENT = "client"
    SERVER = "server"


class State(enum.Enum):
    START = "start"  # nothing said yet
    HELLO_SENT = "hello-sent"  # the client introduced itself; the node has not answered
    OPEN = "open"
    LINK_HELLO_SENT = "link-hello-sent"  # a node dialled a linked peer: not yet answered
    LINK_WELCOMED = "link-welcomed"  # the peer proved it knows the token: the dialler's turn
    LINKED = "linked"  # a link between two nodes: each side sends as the other
    CLOSED = "closed"  # a Goodbye went either way, the peer hung up, or it broke


class _Sentinel(enum.Enum):
    NEED_DATA = "need-data"
    CLOSED = "closed"


NEED_DATA: Final = _Sentinel.NEED_DATA
"""next_event(): no whole frame buffered yet."""
PEER_CLOSED: Final = _Sentinel.CLOSED
"""next_event(): the peer closed the connection cleanly, between frames."""

_C, _S = Role.CLIENT, Role.SERVER
_REQUESTS = (Publish, Fetch, Subscribe, Cancel, Delete, Release, Call, FlowAck)
_ANSWERS = (Published, Deliver, Deleted, Result, Error, FlowChanged, Unbound)
_LINK = (Interest, Transfer, Oversize, Taken, Channel, ChannelClose, ChannelPause, Ping, Pong)

TRANSITIONS: dict[tuple[Role, State, type[Event]], State] = {
    (_C, State.START, Hello): State.HELLO_SENT,
    (_S, State.HELLO_SENT, Welcome): State.OPEN,
    (_S, State.START, Error): State.CLOSED,  # e.g. the handshake timed out
    (_S, State.HELLO_SENT, Error): State.CLOSED,  # refused: version, token, limits
    **{(_C, State.OPEN, e): State.OPEN for e in (*_REQUESTS, Ping, Pong)},
    **{(_S, State.OPEN, e): State.OPEN for e in (*_ANSWERS, Ping, Pong)},
    (_C, State.START, LinkHello): State.LINK_HELLO_SENT,
    (_S, State.LINK_HELLO_SENT, LinkWelcome): State.LINK_WELCOMED,
    (_S, State.LINK_HELLO_SENT, Error): State.CLOSED,
    (_C, State.LINK_WELCOMED, LinkProof): State.LINKED,
    (_S, State.LINK_WELCOMED, Error): State.CLOSED,  # the dialler's proof refused
    (_S, State.LINKED, Error): State.CLOSED,  # … said after the dialler went on
    **{(r, State.LINKED, e): State.LINKED for r in Role for e in _LINK},
    **{
        (r, s, Goodbye): State.CLOSED
        for r in Role
        for s in (
            State.HELLO_SENT,
            State.OPEN,
            State.LINK_HELLO_SENT,
            State.LINK_WELCOMED,
            State.LINKED,
        )
    },
}
"""(sender, state, event) → the state after it. Anything else is a protocol error."""


def _reject_ext(code: int, data: bytes) -> object:
    raise RemoteProtocolError(f"malformed frame: msgpack extension type {code} is not allowed")


class Connection:
    """One end of a connection, as ``our_role``. ``max_frame`` bounds the frames we
    accept — what our handshake frame (Hello, Welcome, LinkHello, LinkWelcome) says, once
    we sent it; the frames we send are bounded by :attr:`peer_max_frame`, what the
    peer's said (until then the default)."""

    def __init__(self, our_role: Role, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.our_role = our_role
        self.their_role = Role.SERVER if our_role is Role.CLIENT else Role.CLIENT
        self.max_frame = max_frame
        self.peer_max_frame = DEFAULT_MAX_FRAME
        self.state = State.START
        self._buffer = bytearray()
        self._pos = 0
        self._eof = False
        self._broken: ProtocolError | None = None

    # -- receiving ----------------------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        """Feed bytes read from the peer; ``b""`` says the peer closed its side."""
        if data:
            if self._eof:
                raise LocalProtocolError("data fed after the peer's end of stream")
            self._buffer += data
        else:
            self._eof = True

    def next_event(self) -> Event | _Sentinel:
        """The next whole event, NEED_DATA, or PEER_CLOSED. Raises RemoteProtocolError
        or FrameTooLarge (and stays broken) if the peer sent something it must not."""
        if self._broken is not None:
            raise self._broken
        try:
            return self._next_event()
        except ProtocolError as e:
            self._broken = e
            self.state = State.CLOSED
            raise

    @property
    def buffered(self) -> int:
        """Bytes received but not yet turned into events."""
        return len(self._buffer) - self._pos

    def hand_over(self) -> bytes:
        """The bytes received but not yet turned into events, taken: the connection
        goes on elsewhere (a tunnel relays it as bytes), and this one is closed."""
        rest = bytes(self._buffer[self._pos :])
        self._buffer.clear()
        self._pos = 0
        self.state = State.CLOSED
        return rest

    @property
    def receive_limit(self) -> int:
        """The largest frame we take now: :attr:`max_frame`, but only
        :data:`~eomsg.core.limits.HANDSHAKE_FRAME` while a node waits for the first."""
        if self.our_role is Role.SERVER and self.state is State.START:
            return min(self.max_frame, HANDSHAKE_FRAME)
        return self.max_frame

    def _next_event(self) -> Event | _Sentinel:
        buffer, pos = self._buffer, self._pos
        available = len(buffer) - pos
        if available >= 4:
            (size,) = _HEADER.unpack_from(buffer, pos)
            limit = self.receive_limit
            if size > limit:
                before = " before the hello" if limit < self.max_frame else ""
                raise FrameTooLarge(
                    f"frame of {size} bytes exceeds the limit of {limit} bytes{before}"
                )
            if available >= 4 + size:
                # Unpacked in place: a large payload is copied once, into its bytes.
                with memoryview(buffer) as view, view[pos + 4 : pos + 4 + size] as body:
                    unpacked = self._unpack(body)
                self._pos = pos + 4 + size
                if self._pos == len(buffer):
                    buffer.clear()  # frees a large frame's room at once
                    self._pos = 0
                elif self._pos > 65536 and self._pos * 2 > len(buffer):
                    del buffer[: self._pos]
                    self._pos = 0
                event = decode_event(unpacked)
                self._transition(self.their_role, event)
                return event
        if self._eof:
            if available:
                raise RemoteProtocolError("the peer closed the connection in the middle of a frame")
            self.state = State.CLOSED
            return PEER_CLOSED
        return NEED_DATA

    def _unpack(self, body: memoryview) -> object:
        limit = self.max_frame
        try:
            return msgpack.unpackb(
                body,
                raw=False,
                strict_map_key=True,
                ext_hook=_reject_ext,
                timestamp=0,
                max_str_len=limit,
                max_bin_len=limit,
                max_array_len=limit,
                max_map_len=limit,
            )
        except ProtocolError:
            raise
        except (ValueError, msgpack.UnpackException, TypeError) as e:
            # ExtraData, FormatError, StackError (nesting), bad UTF-8 and too-long
            # lengths are all ValueError subclasses.
            raise RemoteProtocolError(f"malformed frame: {e}") from e

    # -- sending ------------------------------------------------------------------------

    def send(self, event: Event) -> bytes:
        """The bytes that carry ``event`` to the peer. Raises LocalProtocolError if we may
        not send it now, FrameTooLarge if it exceeds the peer's limit, InvalidInput if
        a value has no msgpack form (an integer beyond 64 bits); each changes nothing."""
        header, body = self.send_parts(event)
        return header + body

    def send_parts(self, event: Event) -> tuple[bytes, bytes | memoryview]:
        """:meth:`send`'s bytes as the frame's header and its body, to be written in
        that order (``transport.writelines``): a large body is not copied to be put
        behind its header."""
        data = _packed(event)
        if len(data) > self.peer_max_frame:
            raise FrameTooLarge(
                f"{type(event).__name__} frame of {len(data)} bytes exceeds the peer's frame "
                f"limit of {self.peer_max_frame} bytes"
            )
        self._transition(self.our_role, event)
        return _HEADER.pack(len(data)), data

    def send_fatal(self, event: Error) -> bytes:
        """The node's last word, allowed in any state (even after the peer broke the
        protocol): a connection-level Error. The connection is closed after it."""
        if self.our_role is not Role.SERVER or event.rid != 0:
            raise LocalProtocolError("only the node ends a connection with an error, with rid 0")
        self.state = State.CLOSED
        data = _packed(event)
        return _HEADER.pack(len(data)) + data

    def send_failed(self) -> None:
        """The socket layer could not deliver what we sent: nothing more can be said."""
        self.state = State.CLOSED

    def _transition(self, sender: Role, event: Event) -> None:
        new = TRANSITIONS.get((sender, self.state, type(event)))
        if new is None:
            kind = LocalProtocolError if sender is self.our_role else RemoteProtocolError
            raise kind(
                f"{sender.value} cannot send {type(event).__name__} in state {self.state.value}"
            )
        if isinstance(event, (Hello, Welcome, LinkHello, LinkWelcome)):
            if sender is self.our_role:
                self.max_frame = event.max_frame  # what we say is what we hold them to
            else:
                self.peer_max_frame = event.max_frame
        self.state = new


_LARGE = 1 << 20  # a frame body from this size on is handed out where it was packed


def _packed(event: Event) -> bytes | memoryview:
    """``event``'s frame body; InvalidInput if a value cannot travel (msgpack carries
    integers of 64 bits), so the caller's mistake is its own error, not the connection's.
    A large body is the packer's own buffer (no copy of a large payload is made to hand
    it out); a small one is copied out, so nothing pins the packer's buffer."""
    packer = msgpack.Packer(autoreset=False, use_bin_type=True)
    try:
        packer.pack(event.to_wire())
    except (OverflowError, ValueError, TypeError) as e:
        raise InvalidInput(f"{type(event).__name__}: a value cannot be sent: {e}") from e
    body = packer.getbuffer()
    return body if len(body) >= _LARGE else bytes(body)
