"""``eomsg serve``: run the node daemon on a data directory."""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Annotated

import typer

from eomsg.cli.common import (
    DEFAULT_DATA,
    DataOption,
    JsonOption,
    before_the_name,
    check_owner_only,
    handles_errors,
)
from eomsg.cli.output import print_json, say
from eomsg.core.limits import MAX_FRAME, MIN_FRAME, parse_size
from eomsg.errors import UsageError
from eomsg.transport.address import Address, parse_address, token_path
from eomsg.transport.tls import ServerTls

if TYPE_CHECKING:
    from eomsg.node.node import NodeSettings


@handles_errors
def serve(
    listen: Annotated[
        list[str] | None,
        typer.Option(
            "--listen",
            help="Also listen on tcp://HOST:PORT or tls://HOST:PORT (repeatable; port 0 picks "
            "one). The Unix socket DIR/eomsg.sock is always on.",
        ),
    ] = None,
    tls_cert: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="The node's certificate chain (PEM): every TCP address then speaks TLS only "
            "(clients use tls://HOST:PORT).",
        ),
    ] = None,
    tls_key: Annotated[
        Path | None,
        typer.Option(metavar="FILE", help="The private key of --tls-cert (PEM, owner-only)."),
    ] = None,
    tls_client_ca: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="Accept only TCP clients (and linked nodes) presenting a certificate this "
            "CA signed.",
        ),
    ] = None,
    allow_remote: Annotated[
        bool,
        typer.Option(
            "--allow-remote",
            help="Allow --listen on a non-loopback address (clients need the token).",
        ),
    ] = False,
    metrics: Annotated[
        str | None,
        typer.Option(
            metavar="URL",
            help="Serve Prometheus metrics over HTTP at tcp://HOST:PORT (port 0 picks one; "
            "loopback unless --allow-remote); a scrape presents a token as "
            "'Authorization: Bearer TOKEN'. Off unless given.",
        ),
    ] = None,
    max_frame: Annotated[
        str | None,
        typer.Option(
            metavar="SIZE",
            help="Largest frame accepted from a client or a linked node, e.g. 64MiB; it must "
            "carry max-payload (eomsg config) and 1 MiB more. Default: that, at least 4MiB.",
        ),
    ] = None,
    memory_limit: Annotated[
        str | None,
        typer.Option(
            metavar="SIZE",
            help="The node's memory, e.g. 2GiB (at least 256MiB), shared between DuckDB's "
            "buffers, the dedup window (its oldest ids go to disk past its share) and the "
            "queues (past theirs, publishes wait): see `eomsg inspect memory`. Default: 1GiB.",
        ),
    ] = None,
    max_connections: Annotated[
        int, typer.Option(min=1, help="Connections served at once; more are refused.")
    ] = 1024,
    heartbeat: Annotated[
        float,
        typer.Option(min=0.1, help="Seconds between pings; a client silent for 3 is cut off."),
    ] = 10.0,
    handshake_timeout: Annotated[
        float,
        typer.Option(min=0.1, help="Seconds a new connection has to say hello."),
    ] = 5.0,
    resend: Annotated[
        float,
        typer.Option(
            min=0.01, help="Seconds before an unacknowledged active/inactive notice is resent."
        ),
    ] = 1.0,
    node_name: Annotated[
        str | None,
        typer.Option(
            envvar="EOMSG_NODE_NAME",
            callback=before_the_name,
            help="This node's name among linked nodes (env EOMSG_NODE_NAME; default: the one "
            "it keeps, else node-<random>); once a link was made, the node keeps its name.",
        ),
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log connections.")] = False,
    data: DataOption = DEFAULT_DATA,
    json: JsonOption = False,
) -> None:
    """Serve the data directory to clients until SIGTERM or Ctrl-C.

    \b
    Examples:
      eomsg serve --data ./eomsg-data &
      eomsg serve --listen tcp://127.0.0.1:7420   # TCP clients need DIR/eomsg.token
      eomsg serve --listen tcp://0.0.0.0:7501 --allow-remote --tls-cert a.pem --tls-key a.key
      eomsg serve --metrics tcp://127.0.0.1:9464  # Prometheus scrapes /metrics with the token
    """
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from eomsg.node.node import Node
    from eomsg.server.server import ServerSettings
    from eomsg.server.server import serve as run_server

    frame = None if max_frame is None else parse_size(max_frame, low=MIN_FRAME, high=MAX_FRAME)
    settings = ServerSettings(
        listen=tuple(parse_address(a) for a in listen or ()),
        allow_remote=allow_remote,
        tls=_tls(tls_cert, tls_key, tls_client_ca),
        max_connections=max_connections,
        heartbeat=heartbeat,
        handshake_timeout=handshake_timeout,
        resend=resend,
        metrics=None if metrics is None else parse_address(metrics),
    )
    settings.check()  # before taking the data directory
    node_settings = _node_settings(node_name, frame, memory_limit)

    def ready(addresses: list[Address], scraped: Address | None) -> None:
        _say_ready(data, node.node_name, addresses, scraped, json)

    os.umask(0o077)  # the daemon writes only its data directory: every file owner-only
    # On a full disk it waits for room, as it does when its store fails later on.
    with _without_pandas():
        opened = Node.open_when_room(data, node_settings)
        assert opened is not None  # (it waits until it opens, or a signal ends the process)
        with opened as node:
            run_server(data, node, settings, ready, reopen=lambda: Node.open(data, node_settings))
    if json:
        print_json({"event": "stopped", "pid": os.getpid()})
    else:
        say("stopped")


def _node_settings(
    node_name: str | None, frame: int | None, memory_limit: str | None
) -> NodeSettings:
    """The node's settings from the options, each checked before the data directory is
    taken (the node itself refuses a ``frame`` that cannot carry its max-payload); and
    Arrow set to give back the memory it frees."""
    import pyarrow as pa

    from eomsg.core import memory
    from eomsg.core.links import check_node_name
    from eomsg.node.node import NodeSettings

    node_settings = NodeSettings(node_name=node_name, max_frame=frame)
    if memory_limit is not None:
        limit = parse_size(memory_limit, low=memory.LOWEST, high=1 << 40)
        node_settings = replace(node_settings, memory_limit=limit)
    # Arrow's own allocator keeps what it freed for later: the system's gives it back, so
    # a node's resident memory follows what it holds.
    pa.set_memory_pool(pa.system_memory_pool())
    if node_name is not None:
        check_node_name(node_name)  # before taking the data directory
    return node_settings


class _NoPandas(importlib.abc.MetaPathFinder):
    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError("the node daemon holds no pandas objects", name=name)
        return None


@contextlib.contextmanager
def _without_pandas() -> Iterator[None]:
    """While the daemon serves, pandas cannot be imported. pyarrow, on its first
    conversion of a list or numpy array, imports pandas when it is installed (the
    ``spark`` extra installs it) to ask whether the value is a pandas object: 0.6 s on
    the GIL once a process, in a node's recovery or its first batch of publishes. The
    daemon holds none. (Where pandas is imported already, pyarrow goes on using it.)"""
    finder = _NoPandas()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


def _say_ready(
    data: Path, name: str, addresses: list[Address], scraped: Address | None, json: bool
) -> None:
    """The node ``name`` serves ``data`` on ``addresses`` (and its metrics at ``scraped``,
    if any): one JSON event, or lines saying where clients reach it."""
    where = [str(a) for a in addresses]
    at = None if scraped is None else f"http://{str(scraped).removeprefix('tcp://')}/metrics"
    if json:
        print_json(
            {"event": "ready", "pid": os.getpid(), "data": str(data), "listen": where,
             "node": name, **({"metrics": at} if at else {})}
        )  # fmt: skip
    else:
        say(f"eomsg node {name} (pid {os.getpid()}) serving {data} on {', '.join(where)}")
        if len(addresses) > 1:
            say(f"TCP clients need the token in {token_path(data)}")
        if at is not None:
            say(f"metrics at {at} (Authorization: Bearer TOKEN)")


def _tls(cert: Path | None, key: Path | None, client_ca: Path | None) -> ServerTls | None:
    """The node's TLS settings: both of --tls-cert and --tls-key, or neither."""
    if cert is None and key is None:
        if client_ca is not None:
            raise UsageError("--tls-client-ca needs the node's own --tls-cert and --tls-key")
        return None
    if cert is None or key is None:
        raise UsageError("TLS needs both --tls-cert and --tls-key")
    check_owner_only(key, "--tls-key")
    return ServerTls(
        cert.absolute(), key.absolute(), None if client_ca is None else client_ca.absolute()
    )
