"""TLS on TCP and tokens per link (issue 19, security across machines): real `eomsg serve`
processes with certificates from a throwaway CA (trustme); clients and linked nodes that
trust it get through, and everything else is refused with one line — an untrusted or
misnamed certificate, plain TCP to a TLS port, a missing client certificate, a wrong
link token, and a node that answers a link without knowing its token."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trustme

import eomsg
from eomsg.core.links import link_proof, token_hash
from eomsg.core.message import Batch, Carried
from eomsg.core.queues import QueueConfig
from eomsg.errors import AuthenticationFailed, InvalidConfig, Unavailable
from eomsg.server.link import LinkConnection
from eomsg.server.links import LinkManager
from eomsg.transport.tls import ClientTls, ServerTls
from eomsg.wire import events as ev
from eomsg.wire import link_events as lev
from eomsg.wire.codec import Event
from eomsg.wire.protocol import NEED_DATA, Connection, Role, State
from tests.conftest import NodeProcess, eventually
from tests.test_network import drain


class Pki:
    """A CA, and certificate files made by it (or another CA) in a directory."""

    def __init__(self, tmp: Path) -> None:
        self.dir = tmp / "pki"
        self.dir.mkdir(mode=0o700, parents=True)
        self.ca = trustme.CA()
        self.ca_file = self.dir / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_file))

    def issue(self, name: str, *hosts: str, ca: trustme.CA | None = None) -> tuple[Path, Path]:
        """A certificate for ``hosts`` (default: loopback) and its key, owner-only."""
        cert = (ca or self.ca).issue_cert(*(hosts or ("127.0.0.1", "localhost")))
        cert_file, key_file = self.dir / f"{name}.pem", self.dir / f"{name}.key"
        cert.cert_chain_pems[0].write_to_path(str(cert_file))
        for pem in cert.cert_chain_pems[1:]:
            pem.write_to_path(str(cert_file), append=True)
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(cert.private_key_pem.bytes())
        return cert_file, key_file


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path)


class Nodes:
    def __init__(self, eomsg_bin: str, tmp: Path, env: dict[str, str]) -> None:
        self.eomsg_bin, self.tmp, self.env = eomsg_bin, tmp, env
        self.procs: list[NodeProcess] = []

    def start(self, name: str, *args: str) -> NodeProcess:
        proc = NodeProcess(
            self.eomsg_bin, self.tmp / name, self.env, "--node-name", name, "--heartbeat", "1",
            *args,
        ).start()  # fmt: skip
        self.procs.append(proc)
        return proc

    def run(self, *args: str, code: int = 0, env: dict[str, str] | None = None) -> Run:
        done = subprocess.run(
            [self.eomsg_bin, *args], env={**self.env, **(env or {})}, capture_output=True,
            text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == code, (done.stdout, done.stderr)
        return done


Run = subprocess.CompletedProcess[str]


@pytest.fixture
def nodes(eomsg_bin: str, tmp_path: Path, cli_env: dict[str, str]) -> Iterator[Nodes]:
    made = Nodes(eomsg_bin, tmp_path, cli_env)
    yield made
    for proc in made.procs:
        proc.kill()


def tls_args(pki: Pki, name: str, *more: str) -> tuple[str, ...]:
    cert, key = pki.issue(name)
    return ("--tls-cert", str(cert), "--tls-key", str(key), *more)


# -- contexts ----------------------------------------------------------------------------


def test_files_that_cannot_be_used_are_said_in_one_line(pki: Pki, tmp_path: Path) -> None:
    cert, key = pki.issue("n")
    with pytest.raises(InvalidConfig, match=r"^--tls-cert .*/nope.pem: no such file$"):
        ServerTls(tmp_path / "nope.pem", key).context()
    with pytest.raises(InvalidConfig, match="not a PEM certificate chain and its private key"):
        ServerTls(key, cert).context()
    with pytest.raises(InvalidConfig, match=r"--tls-client-ca .*: not PEM certificates"):
        ServerTls(cert, key, key).context()
    with pytest.raises(InvalidConfig, match="the peer's CA is not PEM certificates"):
        ClientTls(ca_pem="not a certificate").context()
    with pytest.raises(InvalidConfig, match="without its certificate"):
        ClientTls(key=key).context()
    ServerTls(cert, key, pki.ca_file).context()
    ClientTls(pki.ca_file, cert, key).context()


# -- clients -----------------------------------------------------------------------------


def test_a_tls_node_serves_clients_that_trust_it(nodes: Nodes, pki: Pki) -> None:
    node = nodes.start("a", *tls_args(pki, "a"))
    assert node.tcp.startswith("tls://127.0.0.1:")
    with eomsg.connect(node.tcp, token=node.token, tls=ClientTls(pki.ca_file)) as client:
        client.create_queue(eomsg.QueueConfig.create("q", ["t/>"]))
        assert client.publish("t/1", b"over tls").seq == 1
    # The command line: --tls-ca (or env EOMSG_TLS_CA) beside --broker and --token.
    where = ("--broker", node.tcp, "--token", node.token)
    nodes.run("publish", "t/2", "two", *where, "--tls-ca", str(pki.ca_file))
    nodes.run("publish", "t/3", "three", *where, env={"EOMSG_TLS_CA": str(pki.ca_file)})
    out = nodes.run("consume", "q", "--max", "3", "--json", *where, "--tls-ca", str(pki.ca_file))
    assert [json.loads(line)["payload"] for line in out.stdout.splitlines()] == [
        "over tls", "two", "three",
    ]  # fmt: skip


def test_what_does_not_trust_the_node_is_refused_in_one_line(nodes: Nodes, pki: Pki) -> None:
    node = nodes.start("a", *tls_args(pki, "a"))
    port = node.tcp.rsplit(":", 1)[1]
    # No CA given: the system's CAs do not know this one.
    with pytest.raises(AuthenticationFailed, match="its certificate is not trusted here"):
        eomsg.connect(node.tcp, token=node.token, timeout=10)
    # The CA, but a certificate that does not name the host dialled.
    cert, key = pki.issue("elsewhere", "elsewhere.example")
    misnamed = nodes.start("m", "--tls-cert", str(cert), "--tls-key", str(key))
    with pytest.raises(AuthenticationFailed, match=r"not trusted here .*mismatch"):
        eomsg.connect(misnamed.tcp, token=misnamed.token, tls=ClientTls(pki.ca_file))
    # Another CA.
    other = Pki(nodes.tmp / "other")
    with pytest.raises(AuthenticationFailed, match="not trusted"):
        eomsg.connect(node.tcp, token=node.token, tls=ClientTls(other.ca_file))
    # Plain TCP to the TLS port: the node takes no frame from it.
    with pytest.raises(Unavailable) as plain:
        eomsg.connect(f"tcp://127.0.0.1:{port}", token=node.token, timeout=5)
    assert str(plain.value) == (
        f"the node at tcp://127.0.0.1:{port} closed the connection before the handshake (if "
        "it serves TLS, use tls://)"
    )
    # TLS to a plain TCP port: said as such, not as an OpenSSL code.
    plain_node = nodes.start("p")
    plain_port = plain_node.tcp.rsplit(":", 1)[1]
    done = nodes.run("ping", "--broker", f"tls://127.0.0.1:{plain_port}", "--token", "t",
                     "--tls-ca", str(pki.ca_file), code=10)  # fmt: skip
    assert done.stderr == (
        f"Error: the node at tls://127.0.0.1:{plain_port}: that port does not speak TLS; use "
        "tcp://HOST:PORT for it, or the node's TLS port (eomsg node info)\n"
    )
    # TLS settings for an address that is not tls://.
    with pytest.raises(InvalidConfig, match="is not a tls:// address"):
        eomsg.connect(f"tcp://127.0.0.1:{port}", token=node.token, tls=ClientTls(pki.ca_file))
    done = nodes.run("publish", "t", "x", "--broker", node.tcp, "--token", node.token, code=10)
    assert done.stderr.startswith("Error: the node at tls://127.0.0.1:")
    assert "its certificate is not trusted here" in done.stderr
    assert done.stderr.count("\n") == 1
    # The node carries on.
    with eomsg.connect(node.tcp, token=node.token, tls=ClientTls(pki.ca_file)) as client:
        assert client.publish("t", b"still serving").seq == 1


def test_client_certificates_when_the_node_asks_for_them(nodes: Nodes, pki: Pki) -> None:
    node = nodes.start("a", *tls_args(pki, "a", "--tls-client-ca", str(pki.ca_file)))
    cert, key = pki.issue("client")
    with eomsg.connect(node.tcp, token=node.token, tls=ClientTls(pki.ca_file, cert, key)) as c:
        assert c.publish("t", b"with a certificate").seq == 1
    env = {"EOMSG_TLS_CA": str(pki.ca_file), "EOMSG_TLS_CERT": str(cert), "EOMSG_TLS_KEY": str(key)}
    nodes.run("publish", "t", "x", "--broker", node.tcp, "--token", node.token, env=env)
    early = (
        f"the node at {node.tcp} closed the connection before the handshake (if it asks for a "
        "client certificate, give one its CA signed: env EOMSG_TLS_CERT and EOMSG_TLS_KEY)"
    )
    with pytest.raises(Unavailable) as none:  # no certificate
        eomsg.connect(node.tcp, token=node.token, tls=ClientTls(pki.ca_file))
    assert str(none.value) == early
    other = Pki(nodes.tmp / "other")
    ocert, okey = other.issue("client")
    with pytest.raises(Unavailable) as other_ca:  # one another CA signed
        eomsg.connect(node.tcp, token=node.token, tls=ClientTls(pki.ca_file, ocert, okey))
    assert str(other_ca.value) == early
    with eomsg.connect(node.data_dir) as client:  # the Unix socket is the owner's: no TLS
        assert client.publish("t", b"local").seq == 3


def test_serve_checks_its_tls_options_before_taking_the_directory(
    nodes: Nodes, pki: Pki, tmp_path: Path
) -> None:
    cert, key = pki.issue("a")
    d = str(tmp_path / "d")
    done = nodes.run("serve", "--data", d, "--listen", "tls://127.0.0.1:0", code=3)
    assert done.stderr == (
        "Error: --listen tls://127.0.0.1:0: TLS needs the node's certificate (use --tls-cert "
        "and --tls-key)\n"
    )
    done = nodes.run("serve", "--data", d, "--tls-cert", str(cert), code=2)
    assert done.stderr == "Error: TLS needs both --tls-cert and --tls-key\n"
    key.chmod(0o644)
    done = nodes.run("serve", "--data", d, "--tls-cert", str(cert), "--tls-key", str(key), code=3)
    assert "is open to other users: make it owner-only" in done.stderr
    key.chmod(0o600)
    done = nodes.run("serve", "--data", d, "--tls-cert", str(key), "--tls-key", str(key), code=3)
    assert "not a PEM certificate chain" in done.stderr
    assert not (tmp_path / "d").exists()


# -- links -------------------------------------------------------------------------------


def refused_at(address: str) -> str:
    """What the dialler says of a node at ``address`` that does not prove it knows the
    link's token."""
    return (
        f"refused: 'b' at {address} did not prove it knows the token 'a' dials it with: it "
        "accepts no such token from a node named 'a' (a wrong --token-file, 'b' knowing "
        "this node by another name, or not 'b' at that address)"
    )


def test_a_link_over_tls_with_a_token_of_its_own(nodes: Nodes, pki: Pki, tmp_path: Path) -> None:
    """b accepts a with a token made for that link alone; both ask for client
    certificates; a dials b over TLS, checking b's certificate against the CA."""
    client_ca = ("--tls-client-ca", str(pki.ca_file))
    a = nodes.start("a", *tls_args(pki, "a", *client_ca))
    b = nodes.start("b", *tls_args(pki, "b", *client_ca))
    token = tmp_path / "a-b.token"
    made = nodes.run("link", "add", "a", "--token-file", str(token), "--data", str(b.data_dir))
    assert made.stdout == (
        f"linked to a\na dials this node with the token now in {token} (give it a copy)\n"
    )
    assert oct(token.stat().st_mode & 0o777) == "0o600"
    assert token.read_text().strip() != b.token
    nodes.run(
        "link", "add", "b", b.tcp, "--token-file", str(token), "--peer-ca", str(pki.ca_file),
        "--data", str(a.data_dir),
    )  # fmt: skip
    nodes.run("queue", "create", "audit", "--subscribe", "orders/>", "--data", str(b.data_dir))

    def reaches() -> bool:
        shown = nodes.run("inspect", "links", "--json", "--data", str(a.data_dir)).stdout
        links = json.loads(shown)
        return [(x["peer"], x["state"], x["reaches"]) for x in links] == [("b", "up", ["b"])]

    assert eventually(reaches)
    for i in range(20):
        nodes.run("publish", f"orders/{i}", f"m{i}", "--data", str(a.data_dir))
    with eomsg.connect(b.data_dir) as client:
        assert drain(client, "audit", 20) == [f"m{i}".encode() for i in range(20)]
    # The link's token is no client token: b's clients need b's own.
    tls = ClientTls(pki.ca_file, *pki.issue("client"))
    with pytest.raises(AuthenticationFailed, match="wrong or missing token"):
        eomsg.connect(b.tcp, token=token.read_text().strip(), tls=tls)
    with eomsg.connect(b.tcp, token=b.token, tls=tls) as client:
        assert [q.name for q in client.stats()] == ["audit"]
    # Idempotent with the same token file; the file is reused, never replaced.
    again = nodes.run("link", "add", "a", "--token-file", str(token), "--data", str(b.data_dir))
    assert again.stdout == "exists: link to a\n"


def test_a_link_token_is_for_its_peer_alone(nodes: Nodes, pki: Pki, tmp_path: Path) -> None:
    """c holds the token b made for a: presenting it as c is refused — both sides say
    which name the token is for — and b learns of no link to c."""
    b = nodes.start("b")
    c = nodes.start("c")
    token = tmp_path / "a-b.token"
    nodes.run("link", "add", "a", "--token-file", str(token), "--data", str(b.data_dir))
    done = nodes.run("link", "add", "b", b.tcp, "--token-file", str(token), "--wait", "120s",
                     "--data", str(c.data_dir), code=10)  # fmt: skip
    why = (
        "a node dialled as 'c' with the token 'b' made for 'a': a link's token is good for "
        "its own name only (start that node as --node-name a, or link 'c' on 'b')"
    )
    assert (done.stdout, done.stderr) == (
        "linked to b\n",
        f"Error: the link to b is refused by b: {why} (the link is kept and dialled again now "
        "and then: fix that, or `eomsg link remove b`)\n",
    )
    (link,) = json.loads(nodes.run("link", "list", "--json", "--data", str(c.data_dir)).stdout)
    assert (link["state"], link["error"]) == ("refused", f"refused by b: {why}")
    peers = json.loads(nodes.run("link", "list", "--json", "--data", str(b.data_dir)).stdout)
    assert [(x["peer"], x["state"], x["error"]) for x in peers] == [
        ("a", "refused", f"refused: {why}")
    ]


def test_a_link_to_a_node_that_does_not_know_its_token_takes_nothing(
    nodes: Nodes, tmp_path: Path
) -> None:
    """Something listening where b should be answers the hello as b, without knowing the
    link's token: a does not start the link, so nothing it owes is taken as held — and
    the token never reached it."""
    a = nodes.start("a")
    fake = FakeNode("b")
    try:
        token = tmp_path / "t"
        token.write_text("the-token\n")
        token.chmod(0o600)
        nodes.run("queue", "create", "q", "--subscribe", "x", "--data", str(a.data_dir))
        nodes.run("link", "add", "b", fake.address, "--token-file", str(token), "--wait",
                  "120s", "--data", str(a.data_dir), code=10)  # fmt: skip
        shown = nodes.run("link", "list", "--json", "--data", str(a.data_dir)).stdout
        (link,) = json.loads(shown)
        assert link["error"] == refused_at(fake.address)
        assert fake.hellos  # and nothing of the token travelled in them:
        assert b"the-token" not in fake.heard
        assert not fake.after_welcome  # a sent nothing past its hello: not even its proof
    finally:
        fake.close()


class FakeNode:
    """A TCP listener that answers a link hello as node ``name`` with a proof made with
    the wrong key, and records what it hears."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.hellos: list[lev.LinkHello] = []
        self.after_welcome: list[Event] = []
        self.heard = b""
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"tcp://127.0.0.1:{self.sock.getsockname()[1]}"
        self.sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            with conn:
                self._talk(conn)

    def _talk(self, conn: socket.socket) -> None:
        proto = Connection(Role.SERVER)
        conn.settimeout(0.5)
        welcomed = False
        while not self._stop.is_set():
            try:
                data = conn.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            proto.receive_data(data)
            self.heard += data
            if not data:
                return
            while (event := proto.next_event()) is not NEED_DATA:
                if isinstance(event, lev.LinkHello) and not welcomed:
                    self.hellos.append(event)
                    proof = link_proof("00" * 32, event.nonce, event.node, self.name, "dialled")
                    welcome = lev.LinkWelcome(
                        lev.LINK_VERSION, self.name, "fake", 0, 1 << 22, 1.0, (proof,), "n"
                    )
                    conn.sendall(proto.send(welcome))
                    welcomed = True
                elif isinstance(event, Event) and not isinstance(event, ev.Goodbye):
                    self.after_welcome.append(event)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


def test_link_add_says_what_is_wrong_in_one_line(nodes: Nodes, pki: Pki, tmp_path: Path) -> None:
    a = nodes.start("a")
    d = ("--data", str(a.data_dir))
    token = tmp_path / "t"
    token.write_text("x\n")
    token.chmod(0o600)
    done = nodes.run("link", "add", "b", "tls://127.0.0.1:1", "--token-file", str(token),
                     "--peer-ca", str(token), *d, code=3)  # fmt: skip
    assert done.stderr.startswith("Error: the peer's CA is not PEM certificates")
    done = nodes.run("link", "add", "b", "tcp://127.0.0.1:1", "--token-file", str(token),
                     "--peer-ca", str(pki.ca_file), *d, code=2)  # fmt: skip
    assert done.stderr == "Error: --peer-ca is for a tls:// address, not tcp://127.0.0.1:1\n"
    done = nodes.run("link", "add", "b", "--peer-ca", str(pki.ca_file), *d, code=2)
    assert done.stderr == (
        "Error: --peer-ca is for the side that dials: give the other node's ADDRESS\n"
    )
    token.chmod(0o644)
    done = nodes.run("link", "add", "b", "--token-file", str(token), *d, code=3)
    assert "is open to other users" in done.stderr
    assert json.loads(nodes.run("link", "list", "--json", *d).stdout) == []


class FakeTransport:
    """Where a link connection under test writes; it never reads."""

    def __init__(self) -> None:
        self.out: list[bytes] = []
        self.closing = False
        self.protocol: object = None

    def write(self, data: bytes) -> None:
        self.out.append(data)

    def close(self) -> None:
        self.closing = True

    abort = close

    def is_closing(self) -> bool:
        return self.closing

    def set_protocol(self, protocol: object) -> None:
        self.protocol = protocol

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default


def fake_server(node: object, loop: asyncio.AbstractEventLoop) -> SimpleNamespace:
    settings = SimpleNamespace(max_frame=1 << 20, heartbeat=5.0, handshake_timeout=5.0, tls=None)
    server = SimpleNamespace(
        node=node, loop=loop, settings=settings, token="the-node-token", node_name="a"
    )
    server.links = LinkManager(server)  # type: ignore[arg-type]
    server.spawn = loop.create_task
    return server


async def until(condition: Callable[[], bool], bound: float = 30.0) -> None:
    """Let the loop run until ``condition()`` holds (``bound``: a hung test's limit)."""
    deadline = time.monotonic() + bound
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0)


def forged(seq: int) -> Batch:
    return Batch.of([Carried(seq, "t/x", b"forged", None, None, {}, ("a",), "c", str(seq))])


def test_nothing_a_peer_sends_before_proving_itself_is_taken(net: Any) -> None:
    """Frames pipelined behind a handshake that fails — a welcome without the token's
    proof (dialling side), a wrong proof (dialled side) — are dropped with it."""
    a = net("a").nodes["a"]
    a.admin.create_queue(QueueConfig("q", subscriptions=("t/>",)))
    loop = asyncio.new_event_loop()
    try:
        server = fake_server(a, loop)
        # Dialling side: the welcome's proof is made with a key it does not know.
        a.links.add_link("b", "tcp://127.0.0.1:9", "the-real-token")
        dialler = LinkConnection(server, "b", Connection(Role.CLIENT, 1 << 20))  # type: ignore[arg-type]
        dialler.key, dialler.nonce = token_hash("the-real-token"), "n1"
        dialler.connection_made(FakeTransport())  # type: ignore[arg-type]
        dialler.send(lev.LinkHello(lev.LINK_VERSION, "a", a.incarnation, "", 0, 1 << 20, "n1"))
        impostor = Connection(Role.SERVER, 1 << 20)
        impostor.receive_data(b"".join(dialler.transport.out))  # type: ignore[union-attr]
        impostor.next_event()
        bogus = link_proof(token_hash("guessed"), "n1", "a", "b", "dialled")
        data = impostor.send(
            lev.LinkWelcome(lev.LINK_VERSION, "b", "i" * 16, 0, 1 << 20, 5.0, (bogus,), "n2")
        )
        impostor.state = State.LINKED  # it sends on as if linked (the rules forbid it)
        dialler.data_received(data + impostor.send(lev.Transfer(0, forged(1))))
        assert dialler.ending and not dialler.linked
        assert a.links.link_info()[0].received == 0  # the frame behind it: not taken
        # Dialled side: a node says it is c (a link a knows), proves nothing, and sends a
        # frame behind its proof.
        a.links.add_link("c", None, None)
        c = Connection(Role.CLIENT, 1 << 20)
        hello = lev.LinkHello(lev.LINK_VERSION, "c", "c" * 16, "", 0, 1 << 20, "n3")
        session_conn = Connection(Role.SERVER, 1 << 20)
        session_conn.receive_data(c.send(hello))
        assert session_conn.next_event() == hello
        transport = FakeTransport()
        session = SimpleNamespace(conn=session_conn, transport=transport)
        loop.run_until_complete(server.links.accept(session, hello))
        accepted = transport.protocol
        assert isinstance(accepted, LinkConnection)
        c.receive_data(b"".join(transport.out))
        assert isinstance(c.next_event(), lev.LinkWelcome)
        # A proof that is not even hex (text the decoder takes) is refused the same way.
        accepted.data_received(c.send(lev.LinkProof("é" * 64)) + c.send(lev.Transfer(0, forged(1))))
        loop.run_until_complete(until(lambda: accepted.ending))  # its refusal, however run
        assert not accepted.linked
        assert [(i.peer, i.received) for i in a.links.link_info()] == [("b", 0), ("c", 0)]
        refusal = Connection(Role.CLIENT, 1 << 20)
        refusal.state = State.LINKED
        refusal.receive_data(b"".join(transport.out[1:]))
        error = refusal.next_event()
        assert isinstance(error, ev.Error) and error.code == "authentication_failed"
    finally:
        loop.close()


def test_link_set_checks_everything_before_it_sets_anything(nodes: Nodes) -> None:
    a = nodes.start("a")
    d = ("--data", str(a.data_dir))
    nodes.run("link", "add", "b", *d)
    done = nodes.run("link", "set", "b", "--egress", "memory", "--topic", "t/>/x", *d, code=3)
    assert done.stderr.startswith("Error: pattern 't/>/x'")
    done = nodes.run("link", "set", "b", "--hold", "2s", *d, code=2)
    assert done.stderr == "Error: --hold is for --egress memory (give it too)\n"
    (link,) = json.loads(nodes.run("inspect", "links", "--json", *d).stdout)
    assert (link["egress"], link["topics"]) == ("store", None)
    done = nodes.run("link", "set", "b", "--egress", "memory", "--topic", "t/>", *d)
    assert done.stdout == "link to b: egress memory, hold 1s; topics t/>\n"
