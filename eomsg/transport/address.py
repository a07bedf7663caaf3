"""Where a node listens: ``unix://PATH``, ``tcp://HOST:PORT`` or ``tls://HOST:PORT`` (TCP
under TLS), and the files a data directory keeps for its running node. Pure parsing;
nothing here opens a socket."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from eomsg.core.text import is_text
from eomsg.errors import InvalidInput

SOCKET_NAME = "eomsg.sock"
TOKEN_NAME = "eomsg.token"
MAX_UNIX_PATH = 107  # sun_path holds 108 bytes with the terminating NUL


@dataclass(frozen=True, slots=True)
class Address:
    """A Unix socket (``path``) or a TCP endpoint (``host``, ``port``), plain or under
    TLS (scheme ``tls``)."""

    scheme: str
    path: str = ""
    host: str = ""
    port: int = 0

    def __str__(self) -> str:
        if self.scheme == "unix":
            return f"unix://{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    @property
    def is_unix(self) -> bool:
        return self.scheme == "unix"

    @property
    def is_tls(self) -> bool:
        return self.scheme == "tls"

    def with_scheme(self, scheme: str) -> Address:
        """The same endpoint, plain (``tcp``) or under TLS (``tls``)."""
        return Address(scheme, self.path, self.host, self.port)

    @property
    def is_loopback(self) -> bool:
        """True for a Unix socket and for TCP on localhost or a loopback address."""
        if self.is_unix or self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:  # a host name: it may resolve anywhere
            return False


def socket_path(data_dir: Path) -> Path:
    """The Unix socket a node serving ``data_dir`` listens on."""
    return data_dir / SOCKET_NAME


def token_path(data_dir: Path) -> Path:
    """The file holding the token TCP clients of ``data_dir``'s node must present."""
    return data_dir / TOKEN_NAME


def unix_address(path: Path) -> Address:
    text = str(path.absolute())
    if len(text.encode()) > MAX_UNIX_PATH:
        raise InvalidInput(
            f"the socket path {text} is longer than {MAX_UNIX_PATH} bytes, which Unix "
            "sockets cannot hold; use a shorter --data path"
        )
    return Address("unix", path=text)


def parse_address(text: str) -> Address:
    """``unix://PATH``, ``tcp://HOST:PORT`` or ``tls://HOST:PORT`` (IPv6 hosts in
    brackets); InvalidInput for anything else, a host no resolver could take included."""
    if not is_text(text):
        raise InvalidInput(f"address {text!r} is not UTF-8 text")
    if text.startswith("unix://"):
        rest = text[len("unix://") :]
        if not rest:
            raise InvalidInput(f"address {text!r} names no socket path")
        return unix_address(Path(rest))
    scheme = text.split("://", 1)[0]
    if "://" not in text or scheme not in ("tcp", "tls"):
        raise InvalidInput(f"address {text!r} must start with unix://, tcp:// or tls://")
    try:
        parts = urlsplit(text)
        host, port = parts.hostname, parts.port
    except ValueError as e:
        raise InvalidInput(f"address {text!r} is malformed: {e}") from e
    if not host or port is None or parts.path or parts.query or parts.username:
        raise InvalidInput(f"address {text!r} must be {scheme}://HOST:PORT")
    try:
        host.encode("idna")  # what the resolver is handed: a label over 63 octets fails here
    except UnicodeError as e:
        raise InvalidInput(f"address {text!r}: host {host!r} is not a valid name ({e})") from e
    return Address(scheme, host=host, port=port)
