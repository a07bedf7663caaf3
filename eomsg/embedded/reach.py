"""The node of a data directory as the ``eomsg`` command finds it: served, else embedded."""

from __future__ import annotations

import contextlib
from pathlib import Path

from eomsg.client.broker import Broker
from eomsg.client.sync import connect
from eomsg.embedded.local import LocalClient
from eomsg.errors import Unavailable
from eomsg.node.node import NodeSettings
from eomsg.transport.address import socket_path


def open_dir(
    data_dir: Path | str,
    *,
    create: bool = False,
    name: str | None = None,
    settings: NodeSettings | None = None,
) -> Broker:
    """A broker for the node of ``data_dir``: a client of the node serving it when one
    does (``eomsg serve``), else the directory opened in this process (made only with
    ``create``) — what every ``eomsg`` command does. Embedded, this process holds the
    directory until the broker is closed, and no node can start on it meanwhile: a
    program that runs for long should connect to a node (:func:`eomsg.connect`)."""
    if socket_path(Path(data_dir)).exists():
        with contextlib.suppress(Unavailable):  # a socket left by a node that died
            return connect(data_dir, name=name)
    return LocalClient.open(data_dir, settings, create=create, name=name)
