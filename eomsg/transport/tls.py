"""TLS for TCP connections: what a node serves with and what a client (or a node
dialling a linked peer) trusts, turned into :class:`ssl.SSLContext` objects. No socket
is opened here.

A node given a certificate and key speaks TLS (1.2 or newer) on every TCP address it
listens on, and no plain TCP beside it; given a client CA too, it accepts only clients
that present a certificate that CA signed. A client reaches such a node at
``tls://HOST:PORT``: it checks the node's certificate against its CA (the system's when
none is named) and that the certificate names ``HOST``. A token is still needed on top:
TLS says who the node is and keeps the stream private; the token says what the client
may do.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from pathlib import Path

from eomsg.errors import AuthenticationFailed, InvalidConfig

MIN_VERSION = ssl.TLSVersion.TLSv1_2


@dataclass(frozen=True)
class ServerTls:
    """A node's certificate chain and key, and the CA its clients' certificates must
    chain to (None: clients present none)."""

    cert: Path
    key: Path
    client_ca: Path | None = None

    def context(self) -> ssl.SSLContext:
        """The server's context; InvalidConfig naming the file that cannot be used."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = MIN_VERSION
        _load_chain(ctx, self.cert, self.key, "--tls-cert", "--tls-key")
        if self.client_ca is not None:
            _load_ca(ctx, self.client_ca, "--tls-client-ca")
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def as_client(self, ca_pem: str | None) -> ClientTls:
        """What a node presents when it dials a linked peer: its own certificate, so a
        peer that asks for client certificates accepts it; ``ca_pem`` checks the peer."""
        return ClientTls(None, self.cert, self.key, ca_pem)


@dataclass(frozen=True)
class ClientTls:
    """What a client trusts (``ca``, a file, or ``ca_pem``, its text; neither: the
    system's CAs) and the certificate it presents, if the node asks for one."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    ca_pem: str | None = None

    @classmethod
    def from_env(cls, ca: Path | str | None = None) -> ClientTls:
        """``ca`` (else env ``EOMSG_TLS_CA``), and the certificate and key named by env
        ``EOMSG_TLS_CERT`` and ``EOMSG_TLS_KEY``."""
        ca = ca or os.environ.get("EOMSG_TLS_CA") or None
        cert = os.environ.get("EOMSG_TLS_CERT") or None
        key = os.environ.get("EOMSG_TLS_KEY") or None
        return cls(
            None if ca is None else Path(ca),
            None if cert is None else Path(cert),
            None if key is None else Path(key),
        )

    def context(self) -> ssl.SSLContext:
        """The client's context: the node's certificate and host name are checked."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = MIN_VERSION
        if self.ca_pem is not None:
            try:
                ctx.load_verify_locations(cadata=self.ca_pem)
            except (ssl.SSLError, ValueError) as e:
                raise InvalidConfig(f"the peer's CA is not PEM certificates ({e})") from e
        elif self.ca is None:
            ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
        else:
            _load_ca(ctx, self.ca, "the TLS CA (--tls-ca, env EOMSG_TLS_CA)")
        if self.cert is not None:
            _load_chain(ctx, self.cert, self.key, "EOMSG_TLS_CERT", "EOMSG_TLS_KEY")
        elif self.key is not None:
            raise InvalidConfig("a TLS key is named without its certificate (EOMSG_TLS_CERT)")
        return ctx


def _load_chain(
    ctx: ssl.SSLContext, cert: Path, key: Path | None, cert_what: str, key_what: str
) -> None:
    for path, what in ((cert, cert_what), (key, key_what)):
        if path is not None and not path.is_file():
            raise InvalidConfig(f"{what} {path}: no such file")
    try:
        ctx.load_cert_chain(cert, key)
    except ssl.SSLError as e:
        raise InvalidConfig(
            f"{cert_what} {cert} with {key_what} {key}: not a PEM certificate chain and its "
            f"private key ({e.reason or e})"
        ) from e
    except OSError as e:
        raise InvalidConfig(f"{cert_what} {cert}: {e.strerror}") from e


def _load_ca(ctx: ssl.SSLContext, ca: Path, what: str) -> None:
    if not ca.is_file():
        raise InvalidConfig(f"{what} {ca}: no such file")
    try:
        ctx.load_verify_locations(cafile=ca)
    except ssl.SSLError as e:
        raise InvalidConfig(f"{what} {ca}: not PEM certificates ({e.reason or e})") from e
    except OSError as e:
        raise InvalidConfig(f"{what} {ca}: {e.strerror}") from e


def tls_refused(where: object, error: ssl.SSLError) -> AuthenticationFailed:
    """What a TLS handshake that failed with ``error`` says: the node (or this side's
    certificate) was not accepted — never "no node answers", which it did."""
    if isinstance(error, ssl.SSLCertVerificationError):
        why = f"its certificate is not trusted here ({error.verify_message})"
        fix = "give the CA that signed it with --tls-ca or env EOMSG_TLS_CA"
    elif error.reason == "WRONG_VERSION_NUMBER":  # what a plain TCP port answers a hello
        why = "that port does not speak TLS"
        fix = "use tcp://HOST:PORT for it, or the node's TLS port (eomsg node info)"
    else:
        why = f"the TLS handshake failed ({error.reason or error})"
        fix = "check the node's TLS settings and any client certificate (EOMSG_TLS_CERT)"
    return AuthenticationFailed(f"{where}: {why}; {fix}")
