"""The sans-IO protocol: every event round-trips, byte by byte too; the transition table
is enforced for both roles, the peer's illegal moves apart from our own; random or hostile
bytes either parse or raise RemoteProtocolError; both dispatches handle every event."""

from __future__ import annotations

import ast
import contextlib
import inspect
import os
import struct
import textwrap
import tracemalloc
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eomsg.client.aio import AsyncClient
from eomsg.core.message import (
    Batch,
    Carried,
    Delivered,
    Deliveries,
    Message,
    Outgoing,
    PublishResult,
    message_columns,
)
from eomsg.errors import FrameTooLarge, LocalProtocolError, RemoteProtocolError
from eomsg.server.link import LinkConnection
from eomsg.server.session import Session
from eomsg.wire import events as ev
from eomsg.wire import link_events as lev
from eomsg.wire.codec import Event
from eomsg.wire.protocol import NEED_DATA, PEER_CLOSED, TRANSITIONS, Connection, Role, State

MSG = Message(7, "orders/eu", b"\x00payload", "id-7", 1.5, None, {"k": "v"})
V = ev.PROTOCOL_VERSION

CLIENT_EVENTS: list[Event] = [
    ev.Publish(1, (Outgoing("a/b", b"x", "id", 3.0, {"h": "1"}), Outgoing("a", b""))),
    ev.Fetch(2, "q", 10, 0.5),
    ev.Subscribe(3, "q", 256, priority=-5),
    ev.Cancel(4, 3),
    ev.Cancel(4, 3, seen=((5, 1), (9, 2))),
    ev.Delete(5, "q", ((1, 1), (2, 1), (3, 4)), epoch=9),
    ev.Release(6, "q", ((4, 2),), 1.0, epoch=9),
    ev.Release(6, "q", ((4, 2), (5, 1)), epoch=9, unseen=True),
    ev.FlowAck(3, True, 9),
    ev.Call(7, "stats", {"a": [1, "x", None, {"b": b"\x01"}]}),
    ev.Ping(1),
    ev.Pong(2, 1.5),
]
SERVER_EVENTS: list[Event] = [
    ev.Published(1, (PublishResult(1, "id", False, 2), PublishResult(1, None, True, None))),
    ev.Deliver(2, "q", (Delivered("q", MSG, 2, 99.0, 9),), more=True, epoch=9, now=69.0),
    ev.FlowChanged(3, 12, True, 9),
    ev.Unbound(3, 12, "unbound by an administrator"),
    ev.Deleted(5, (True, False)),
    ev.Result(7, {"x": [1, 2.5]}),
    ev.Error(8, "queue_not_found", "queue 'q' does not exist"),
    ev.Ping(3),
    ev.Pong(4, 2.0),
]


def open_pair() -> tuple[Connection, Connection]:
    client, server = Connection(Role.CLIENT), Connection(Role.SERVER)
    server.receive_data(client.send(ev.Hello(ev.PROTOCOL_VERSION, "test", "tok")))
    assert isinstance(server.next_event(), ev.Hello)
    client.receive_data(server.send(ev.Welcome(ev.PROTOCOL_VERSION, "node", 1 << 20, 5.0, 1024)))
    assert isinstance(client.next_event(), ev.Welcome)
    assert client.state is State.OPEN and server.state is State.OPEN
    return client, server


def events_of(conn: Connection) -> list[Any]:
    out = []
    while (event := conn.next_event()) is not NEED_DATA:
        out.append(event)
        if event is PEER_CLOSED:
            break
    return out


@pytest.mark.parametrize("bytewise", [False, True], ids=["whole", "byte-by-byte"])
def test_every_event_round_trips(bytewise: bool) -> None:
    client, server = open_pair()
    for sender, receiver, batch in (
        (client, server, CLIENT_EVENTS),
        (server, client, SERVER_EVENTS),
    ):
        data = b"".join(sender.send(e) for e in batch)
        got: list[Any] = []
        if bytewise:
            for i in range(len(data)):
                receiver.receive_data(data[i : i + 1])
                got += events_of(receiver)
        else:
            receiver.receive_data(data)
            got = events_of(receiver)
        assert got == batch


def test_goodbye_and_end_of_stream_close_the_connection() -> None:
    client, server = open_pair()
    server.receive_data(client.send(ev.Goodbye("done")))
    server.receive_data(b"")
    assert events_of(server) == [ev.Goodbye("done"), PEER_CLOSED]
    assert server.state is State.CLOSED and client.state is State.CLOSED


def test_eof_inside_a_frame_is_an_error() -> None:
    client, server = open_pair()
    data = client.send(ev.Ping(1))
    server.receive_data(data[:-1])
    server.receive_data(b"")
    with pytest.raises(RemoteProtocolError, match="middle of a frame"):
        server.next_event()


@pytest.mark.parametrize(
    ("role", "state_events", "event", "message"),
    [
        (Role.CLIENT, [], ev.Publish(1, ()), "client cannot send Publish in state start"),
        (
            Role.SERVER,
            [],
            ev.Welcome(1, "n", 1024, 1.0, 1),
            "server cannot send Welcome in state start",
        ),
        (
            Role.CLIENT,
            [ev.Hello(1, "c")],
            ev.Hello(1, "c"),
            "client cannot send Hello in state hello-sent",
        ),
        (
            Role.CLIENT,
            [ev.Hello(1, "c")],
            ev.Fetch(1, "q", 1),
            "client cannot send Fetch in state hello-sent",
        ),
    ],
)
def test_illegal_moves_name_event_role_and_state(
    role: Role, state_events: list[Event], event: Event, message: str
) -> None:
    conn = Connection(role)
    for e in state_events:
        conn.send(e)
    before = conn.state
    with pytest.raises(LocalProtocolError, match=message):
        conn.send(event)
    assert conn.state is before  # nothing was sent


def test_server_refuses_requests_before_the_handshake() -> None:
    server = Connection(Role.SERVER)
    server.receive_data(raw_frame(ev.Publish(1, ()).to_wire()))
    with pytest.raises(RemoteProtocolError, match="client cannot send Publish in state start"):
        server.next_event()
    with pytest.raises(RemoteProtocolError):  # stays broken
        server.next_event()


def test_client_may_not_send_server_events() -> None:
    client, _ = open_pair()
    with pytest.raises(LocalProtocolError, match="client cannot send Published in state open"):
        client.send(ev.Published(1, ()))


def test_the_peers_illegal_move_is_remote_and_ours_is_local() -> None:
    client, server = open_pair()
    server.receive_data(raw_frame(ev.Published(1, ()).to_wire()))  # a client answering
    with pytest.raises(RemoteProtocolError, match="client cannot send Published in state open"):
        server.next_event()
    with pytest.raises(LocalProtocolError, match="only the node ends a connection"):
        client.send_fatal(ev.Error(0, "protocol", "no"))
    client.receive_data(b"")
    with pytest.raises(LocalProtocolError, match="after the peer's end of stream"):
        client.receive_data(b"late")


def handled_events(dispatch: Any) -> set[str]:
    """The event classes a dispatch has a handler for: the keys of its table (event
    type → handler), or those its ``match`` has a case for."""
    if isinstance(dispatch, dict):
        return {event.__name__ for event in dispatch}
    tree = ast.parse(textwrap.dedent(inspect.getsource(dispatch)))
    return {
        node.cls.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.MatchClass) and isinstance(node.cls, ast.Attribute)
    }


LINK_STATES = {State.LINK_HELLO_SENT, State.LINK_WELCOMED, State.LINKED}
CLIENT_STATES = set(State) - LINK_STATES


@pytest.mark.parametrize(
    ("dispatch", "senders", "states"),
    [
        (Session._dispatch, {Role.CLIENT}, CLIENT_STATES),
        (AsyncClient._HANDLERS, {Role.SERVER}, CLIENT_STATES),
        (LinkConnection._dispatch, set(Role), LINK_STATES),  # either side of a link
    ],
    ids=["node", "client", "link"],
)
def test_each_dispatch_handles_every_event_its_peer_may_send(
    dispatch: Any, senders: set[Role], states: set[State]
) -> None:
    """Derived from TRANSITIONS, so a new event without a handler fails here, not
    silently on the wire (the dispatches' default branch raises LocalProtocolError)."""
    may_send = {
        event.__name__
        for (role, state, event) in TRANSITIONS
        if role in senders and state in states
    }
    assert handled_events(dispatch) == may_send


def test_oversize_frame_is_refused_from_its_length_prefix() -> None:
    server = Connection(Role.SERVER, max_frame=1024)
    server.receive_data(struct.pack(">I", 1025))  # no body at all: refused already
    with pytest.raises(FrameTooLarge, match="1025 bytes exceeds the limit of 1024"):
        server.next_event()


def test_sending_past_the_peer_limit_raises_and_changes_nothing() -> None:
    client = Connection(Role.CLIENT)
    client.send(ev.Hello(V, "c"))
    server = Connection(Role.SERVER)
    server.state = State.HELLO_SENT
    client.receive_data(server.send(ev.Welcome(V, "node", 1 << 16, 5.0, 1024)))
    assert isinstance(client.next_event(), ev.Welcome)
    assert client.peer_max_frame == 1 << 16
    with pytest.raises(FrameTooLarge, match="exceeds the peer's frame limit of 65536 bytes"):
        client.send(ev.Publish(1, (Outgoing("t", b"x" * (1 << 16)),)))
    assert client.state is State.OPEN
    client.send(ev.Ping(1))  # still usable


@pytest.mark.parametrize("bytewise", [False, True], ids=["whole", "byte-by-byte"])
def test_each_end_holds_the_other_to_the_limit_its_handshake_said(bytewise: bool) -> None:
    """The hello says the client's frame limit and the welcome the node's: each end
    accepts what it said and sends no more than the other said — a node that accepts
    small frames still sends a client one as large as the client takes."""
    client, server = Connection(Role.CLIENT, 8 << 20), Connection(Role.SERVER, 1 << 20)
    hello = ev.Hello(V, "c", max_frame=8 << 20)
    assert feed(server, client.send(hello), bytewise) == [hello]
    assert (server.max_frame, server.peer_max_frame) == (1 << 20, 8 << 20)
    welcome = ev.Welcome(V, "node", 1 << 20, 5.0, 1024)
    assert feed(client, server.send(welcome), bytewise) == [welcome]
    assert (client.max_frame, client.peer_max_frame) == (8 << 20, 1 << 20)
    big = ev.Result(1, b"x" * (2 << 20))  # over the node's own limit, within the client's
    assert feed(client, server.send(big), bytewise) == [big]
    with pytest.raises(FrameTooLarge, match=r"Publish frame of .* exceeds the peer's frame limit"):
        client.send(ev.Publish(1, (Outgoing("t", b"x" * (1 << 20)),)))
    small = ev.Publish(2, (Outgoing("t", b"x" * 1000),))
    assert feed(server, client.send(small), bytewise) == [small]


def feed(conn: Connection, data: bytes, bytewise: bool) -> list[Any]:
    """The events ``conn`` makes of ``data``, handed to it whole or a byte at a time."""
    if not bytewise:
        conn.receive_data(data)
        return events_of(conn)
    got = []
    for i in range(len(data)):
        conn.receive_data(data[i : i + 1])
        got += events_of(conn)
    return got


def test_a_node_takes_only_a_small_frame_before_the_hello() -> None:
    """Until a client has said hello a node holds it to a hello's size, whatever its
    own limit: one that has not said who it is cannot make it buffer a large frame."""
    server = Connection(Role.SERVER, 64 << 20)
    server.receive_data(struct.pack(">I", (64 << 10) + 1))
    with pytest.raises(
        FrameTooLarge, match="65537 bytes exceeds the limit of 65536 bytes before the hello"
    ):
        server.next_event()
    server = Connection(Role.SERVER, 64 << 20)
    server.receive_data(Connection(Role.CLIENT).send(ev.Hello(V, "c")))
    assert isinstance(server.next_event(), ev.Hello)
    server.receive_data(struct.pack(">I", 32 << 20))  # after it: the node's own limit
    assert server.next_event() is NEED_DATA


@pytest.mark.parametrize("bytewise", [False, True], ids=["whole", "byte-by-byte"])
def test_an_answer_may_take_several_frames(bytewise: bool) -> None:
    """A Result that continues says ``more``; only a list may."""
    client, server = open_pair()
    parts = [ev.Result(3, [1, 2], True), ev.Result(3, [b"x"], True), ev.Result(3, [4])]
    assert feed(client, b"".join(server.send(e) for e in parts), bytewise) == parts
    server.state = State.OPEN
    client.receive_data(raw_frame([ev.Result.TYPE, 3, {"a": 1}, True]))
    with pytest.raises(RemoteProtocolError, match="only a list answer may continue"):
        client.next_event()


def test_a_large_frame_costs_no_copy_of_its_payload_on_the_way() -> None:
    """Sending packs a large body once and hands it out as it is (header and body
    apart, no copy to join them); receiving unpacks it where it was read. So a payload
    costs the sender its packed frame (the packer may keep room as large again) and the
    receiver its read buffer and the payload it made — not a copy per step."""
    n = 32 << 20
    client, server = Connection(Role.CLIENT, 64 << 20), Connection(Role.SERVER, 64 << 20)
    assert feed(server, client.send(ev.Hello(V, "c", max_frame=64 << 20)), False) != []
    assert feed(client, server.send(ev.Welcome(V, "n", 64 << 20, 5.0, 1)), False) != []
    m = Message(1, "t", os.urandom(n), None, 1.0, None, {})
    tracemalloc.start()
    try:
        header, body = server.send_parts(ev.Deliver(1, "q", (Delivered("q", m, 1, 2.0),)))
        sent_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        held = tracemalloc.get_traced_memory()[0]
        client.receive_data(header)
        for at in range(0, len(body), 256 << 10):  # as a socket hands it over
            client.receive_data(bytes(body[at : at + (256 << 10)]))
            got = client.next_event()
        received_peak = tracemalloc.get_traced_memory()[1] - held
    finally:
        tracemalloc.stop()
    assert isinstance(got, ev.Deliver) and got.deliveries[0].message == m
    assert sent_peak < 2.5 * n, sent_peak / n
    assert received_peak < 2.5 * n, received_peak / n


def test_a_message_bound_is_never_below_its_size_in_a_frame() -> None:
    """What the senders split by (message_bound, value_bound) is at least what the
    message takes in a frame, however its text is made."""
    text = "é€😀" * 60
    heavy = Message(2**40, text, b"p" * 100, text, 1.5, 2.5, {f"h{i}": text for i in range(50)})
    for m in (MSG, heavy, Message(1, "t", b"", None, 0.0, None, {})):
        row = [*ev.message_to_wire(m), 7, 9.5]
        assert ev.message_bound(m) >= len(msgpack.packb(row, use_bin_type=True))
        wire = ev.message_to_wire(m)
        assert ev.value_bound(wire) >= len(msgpack.packb(wire, use_bin_type=True))
        out = Outgoing(m.topic, m.payload, m.id, 3.5, m.headers)
        assert ev.message_bound(out) >= len(msgpack.packb(ev.outgoing_to_wire(out)))


def raw_frame(body: Any) -> bytes:
    data: bytes = msgpack.packb(body, use_bin_type=True)
    return struct.pack(">I", len(data)) + data


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ({"not": "a list"}, "not an \\[event type"),
        ([], "not an \\[event type"),
        ([99], "unknown event type 99"),
        ([1, V, "c"], "hello has 2 fields, not 5"),
        ([1, "5", "c", None, None, 1 << 20], "version must not be str"),
        ([1, V, 5, None, None, 1 << 20], "client name must not be int"),
        ([1, True, "c", None, None, 1 << 20], "version must not be bool"),
        ([1, V, "c" * 5000, None, None, 1 << 20], "longer than 1024"),
        ([1, V, "c", None, None, "big"], "max frame must not be str"),
        ([1, V, "c", None, None, 1024], "frame limit of 1024 bytes is below the 65536"),
        (
            [1, 4, "c", None],
            "version 4 is not supported; this node speaks version 5 .upgrade the client",
        ),
        ([1, 6, "c", None, None, 1, 2], "version 6 is not supported; .* .upgrade the node"),
    ],
)
def test_malformed_bodies_raise_protocol_errors(body: Any, match: str) -> None:
    server = Connection(Role.SERVER)
    server.receive_data(raw_frame(body))
    with pytest.raises(RemoteProtocolError, match=match):
        server.next_event()


def test_extension_types_and_timestamps_are_refused() -> None:
    for value in (msgpack.ExtType(5, b"x"), msgpack.Timestamp(1, 0)):
        server = Connection(Role.SERVER)
        server.receive_data(raw_frame([1, V, value, None, None, 1 << 20]))
        with pytest.raises(RemoteProtocolError, match=r"extension type|must not be"):
            server.next_event()


def test_deep_nesting_is_refused() -> None:
    _, server = open_pair()
    deep: Any = 1
    for _ in range(20):
        deep = [deep]
    server.receive_data(raw_frame([ev.Call.TYPE, 1, "x", {"a": deep}]))
    with pytest.raises(RemoteProtocolError, match="nest deeper"):
        server.next_event()


def test_bad_publish_items_are_refused() -> None:
    _, server = open_pair()
    server.receive_data(
        raw_frame([ev.Publish.TYPE, 1, [["t", "text not bytes", None, None, None]]])
    )
    with pytest.raises(RemoteProtocolError, match="payload must not be str"):
        server.next_event()


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=256), st.sampled_from([Role.CLIENT, Role.SERVER]))
def test_random_bytes_parse_or_raise_protocol_error(data: bytes, role: Role) -> None:
    conn = Connection(role, max_frame=1 << 16)
    conn.receive_data(data)
    conn.receive_data(b"")
    with contextlib.suppress(RemoteProtocolError, FrameTooLarge):
        events_of(conn)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=max(ev.EVENT_TYPES) + 1),
            st.lists(
                st.one_of(
                    st.none(),
                    st.booleans(),
                    st.integers(min_value=-(2**63), max_value=2**64 - 1),
                    st.floats(allow_nan=False),
                    st.text(max_size=8),
                    st.binary(max_size=8),
                    st.lists(st.integers(min_value=0, max_value=99), max_size=3),
                    st.lists(  # the shape of delivery keys: [seqs, attempts]
                        st.lists(st.integers(min_value=-1, max_value=99), max_size=3),
                        max_size=3,
                    ),
                ),
                max_size=6,
            ),
        ),
        max_size=4,
    )
)
def test_well_framed_random_bodies_parse_or_raise_protocol_error(
    frames: list[tuple[int, list[Any]]],
) -> None:
    """msgpack that frames fine but holds nonsense exercises every field check."""
    _, server = open_pair()
    server.receive_data(b"".join(raw_frame([t, *fields]) for t, fields in frames))
    with contextlib.suppress(RemoteProtocolError, FrameTooLarge):
        events_of(server)


def test_a_transfer_carries_where_each_message_came_from_as_fields() -> None:
    """Provenance travels as fields, not as headers — a column only when some message
    came from further away; every value is checked."""
    sent = lev.Transfer(
        4,
        Batch.of(
            [
                Carried(5, "t/x", b"p", None, None, {}, ("b",), "a", "5"),
                Carried(6, "t/y", b"", "id", 2.5, {"h": "v"}, ("b", "c"), "z", "91"),
            ]
        ),
    )
    body = msgpack.unpackb(msgpack.packb(sent.to_wire(), use_bin_type=True), raw=False)
    assert ev.decode_event(body) == sent
    assert body[2] == "a" and body[9] == [None, ["z", "91"]]
    body[9][1][0] = 7  # an origin that is not text
    with pytest.raises(RemoteProtocolError, match="origin"):
        ev.decode_event(body)
    body[3:] = [[[5, "t/x", b"p", None, None, {}, ["b"], "a", "5"]]]  # version 3's shape
    with pytest.raises(RemoteProtocolError, match="transfer"):
        ev.decode_event(body)


carried_messages = st.lists(
    st.builds(
        Carried,
        st.integers(1, 2**40),
        st.text(max_size=8),
        st.binary(max_size=8),
        st.none() | st.text(max_size=8),
        st.none() | st.floats(0.001, 1e6),
        st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2),
        st.sampled_from([("b",), ("b", "c"), ("c",)]),
        st.sampled_from(["a", "z"]),
        st.sampled_from(["1", "77"]),
    ),
    min_size=1,
    max_size=40,
)


@given(carried_messages)
def test_a_transfer_s_columns_give_back_its_messages(messages: list[Carried]) -> None:
    """Whatever mix of messages a frame holds — times to live, headers, routes and
    origins alike or not — the peer gets each one back as it was, and a frame cut in two
    (for a peer's frame limit) gives the same messages in the same order."""
    batch = Batch.of(messages)
    body = msgpack.unpackb(msgpack.packb(lev.Transfer(0, batch).to_wire()), raw=False)
    event = ev.decode_event(body)
    assert isinstance(event, lev.Transfer)
    assert event.batch.carried() == tuple(messages)
    first, rest = batch.split()
    assert first.carried() + rest.carried() == tuple(messages)


@pytest.mark.parametrize(
    ("column", "value", "says"),
    [
        (3, [], "no message"),
        (3, [5, "6"], "seq"),
        (4, ["t/x"], "1 topics for 2 messages"),
        (5, [b"p", "p"], "payload"),
        (6, [None, 6], "id"),
        (7, [None, "1"], "ttl"),
        (8, [{"h": 1}, None], "header value"),
        (9, [None, ["z"]], "source"),
        (10, [], "no route"),
        (10, [None], "targets"),
        (10, [["b", 7]], "targets"),
        (11, [0, 1], "route index"),
        (11, [0], "1 route indexes for 2"),
    ],
)
def test_a_malformed_transfer_column_is_a_protocol_error(
    column: int, value: object, says: str
) -> None:
    sent = lev.Transfer(
        4,
        Batch.of(
            [
                Carried(5, "t/x", b"p", None, None, {}, ("b",), "a", "5"),
                Carried(6, "t/y", b"q", None, None, {}, ("b",), "a", "6"),
            ]
        ),
    )
    body = msgpack.unpackb(msgpack.packb(sent.to_wire()), raw=False)
    body[column] = value
    with pytest.raises(RemoteProtocolError, match=says):
        ev.decode_event(body)


def test_a_link_handshake_of_another_version_says_so() -> None:
    """The handshake's shape changes with the link protocol's version: a node of another
    version is told that, not that its frame is malformed."""
    old = [lev.LinkHello.TYPE, 1, "a", "inc", "token", "", 0, 1 << 20, "n"]
    with pytest.raises(RemoteProtocolError, match=r"link protocol version 1 is not supported"):
        ev.decode_event(old)


def _decoded(decode: Any) -> tuple[str, Any]:
    """What decoding gives: its value, or its error's message (an unpacking ValueError
    is what decode_event turns into a RemoteProtocolError)."""
    try:
        return "value", decode()
    except (RemoteProtocolError, ValueError) as e:
        return "error", str(e)


_TEXT = st.text(max_size=4) | st.just("t" * 1025)
_FIELD = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False),
    _TEXT,
    st.binary(max_size=4),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3) | st.integers(), _TEXT | st.integers(), max_size=2),
)
_ROW = st.tuples(
    st.integers(min_value=0, max_value=2**63),
    st.text(max_size=6),
    st.binary(max_size=6),
    st.none() | st.text(max_size=6),
    st.floats(allow_nan=False) | st.integers(min_value=0, max_value=9),
    st.none() | st.floats(allow_nan=False),
    st.none() | st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2),
    st.integers(min_value=1, max_value=9),
    st.floats(allow_nan=False),
).map(list)


@st.composite
def _delivery_rows(draw: st.DrawFn) -> Any:
    """Rows as a node sends them, some with a field replaced by anything, some cut or
    grown, now and then not a row at all."""
    rows: list[Any] = draw(st.lists(_ROW, max_size=6))
    for row in rows:
        if draw(st.integers(0, 3)) == 0:
            row[draw(st.integers(0, 8))] = draw(_FIELD)
        if draw(st.integers(0, 15)) == 0:
            del row[draw(st.integers(0, 8)) :]
        if draw(st.integers(0, 15)) == 0:
            row.append(draw(_FIELD))
    if rows and draw(st.integers(0, 15)) == 0:
        rows[draw(st.integers(0, len(rows) - 1))] = draw(_FIELD)
    return rows


@settings(max_examples=500, deadline=None)
@given(_delivery_rows(), st.text(max_size=4), st.integers(min_value=0, max_value=9))
def test_a_deliver_frame_decodes_a_column_at_a_time_as_row_by_row(
    rows: list[Any], queue: str, epoch: int
) -> None:
    """The column-at-a-time decoding of a Deliver frame's rows gives the values decoding
    each row by itself gives — or the same error."""
    fast = _decoded(lambda: ev._deliveries(queue, epoch, rows))
    slow = _decoded(lambda: tuple(map(ev._delivered(queue, epoch), rows)))
    assert fast == slow
    if fast[0] == "value":
        for d in fast[1]:
            assert type(d) is Delivered and type(d.message) is Message
        headers = [d.message.headers for d in fast[1]]
        assert len({id(h) for h in headers}) == len(headers)  # none shared with another


def test_the_rows_a_node_sends_are_decoded_a_column_at_a_time() -> None:
    """What a node's Deliver frame holds takes the column path (the one that matters
    for speed), and comes back as it was sent."""
    text = "é€😀" * 3
    sent = tuple(
        Delivered("q", m, attempt, 99.5, 4)
        for attempt, m in enumerate(
            [MSG, Message(8, text, b"", None, 2.5, 9.5, {}), Message(2**62, "t", b"p", text)],
            start=1,
        )
    )
    _, _, _, rows, *_ = msgpack.unpackb(
        msgpack.packb(ev.Deliver(1, "q", sent, epoch=4).to_wire(), use_bin_type=True)
    )
    assert ev._plainly_typed(rows) is not None
    assert ev._deliveries("q", 4, rows) == sent


_MESSAGE = st.builds(
    Message,
    st.integers(min_value=1, max_value=2**63 - 1),
    st.text(min_size=1, max_size=6),
    st.binary(max_size=6),
    st.none() | st.text(max_size=6),
    st.floats(min_value=0, max_value=2e9),
    st.none() | st.floats(min_value=0, max_value=2e9),
    st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2),
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(_MESSAGE, st.integers(1, 9), st.floats(0, 2e9)), max_size=6),
    st.integers(min_value=0, max_value=9),
    st.data(),
)
def test_a_take_as_columns_is_its_deliveries_one_by_one(
    taken: list[tuple[Message, int, float]], epoch: int, data: st.DataObject
) -> None:
    """The columns a node hands out (Deliveries) read as the Delivered values they
    hold, slice as those do, are bounded as each message is, and go into a Deliver
    frame that a client decodes as it would the same deliveries made one by one."""
    one_by_one = tuple(Delivered("q", m, a, d, epoch) for m, a, d in taken)
    columns = Deliveries(
        "q",
        epoch,
        message_columns([m for m, _, _ in taken]),
        [a for _, a, _ in taken],
        [d for _, _, d in taken],
    )
    assert tuple(columns) == one_by_one and len(columns) == len(one_by_one)
    assert columns.keys() == [d.key for d in one_by_one]
    start = data.draw(st.integers(0, len(taken)))
    end = data.draw(st.integers(start, len(taken)))
    assert tuple(columns[start:end]) == one_by_one[start:end]
    if taken:
        at = data.draw(st.integers(0, len(taken) - 1))
        assert columns[at] == one_by_one[at]
    bounds = [ev.message_bound(m) for m, _, _ in taken]
    assert ev.delivery_bounds(columns) == bounds
    assert ev.deliveries_bound(columns) == sum(bounds)
    client, server = open_pair()
    got = feed(client, server.send(ev.Deliver(3, "q", columns, True, epoch, 5.0)), False)
    assert got == [ev.Deliver(3, "q", one_by_one, True, epoch, 5.0)]
