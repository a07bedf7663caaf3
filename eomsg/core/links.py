"""Links between nodes as configured and as seen: names, settings, and what ``eomsg
inspect links`` shows. The rules of routing and transfer are in :mod:`eomsg.core.routing`
and :mod:`eomsg.core.transfer`; the node keeps links in :mod:`eomsg.node.links`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from eomsg.errors import InvalidConfig

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def check_node_name(name: str) -> str:
    """``name`` if it can name a node (letters, digits, ``.``, ``_``, ``-``; at most 63
    characters, starting with a letter or digit), else InvalidConfig."""
    if not NAME.fullmatch(name):
        raise InvalidConfig(
            f"node name {name!r}: use letters, digits, '.', '_' and '-' (at most 63, "
            "starting with a letter or digit)"
        )
    return name


@dataclass(frozen=True)
class LinkConfig:
    """A link as configured: the peer's name and, on the side that dials, its address
    and the token the peer accepts (kept in the data directory, which is owner-only;
    never shown by ``inspect links``)."""

    peer: str
    address: str | None = None
    token: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"address": self.address, "token": self.token}

    @classmethod
    def from_json(cls, peer: str, data: dict[str, Any]) -> LinkConfig:
        return cls(peer, data.get("address"), data.get("token"))


@dataclass(frozen=True)
class LinkInfo:
    """What ``inspect links`` shows of a link: whether it is up; what it owes the peer
    (``pending``; ``in_flight``: sent and not yet acknowledged; the age of the oldest,
    in seconds); go-backs to resend on its current connection; messages the peer took
    and this node took from it, in total since start and per second over the last
    minute; the peer's sequence taken (``read``); the nodes reached through it; while it
    is down, why the last attempt to connect failed."""

    peer: str
    address: str | None
    connected: bool
    pending: int
    in_flight: int
    oldest_age: float | None
    resends: int
    taken: int
    received: int
    read: int
    reaches: tuple[str, ...]
    out_rate: float | None = None
    in_rate: float | None = None
    error: str | None = None  # why the last attempt to connect failed, while it is down
    refused: int = 0  # messages from the peer this node could not take, since start
    unroutable: int = 0  # … for nodes it has no route to (not carried there)

    def to_json(self) -> dict[str, Any]:
        return {
            "peer": self.peer,
            "address": self.address,
            "state": "up" if self.connected else "down",
            "pending": self.pending,
            "in_flight": self.in_flight,
            "oldest_age": self.oldest_age,
            "resends": self.resends,
            "taken": self.taken,
            "received": self.received,
            "read": self.read,
            "reaches": list(self.reaches),
            "out_rate": self.out_rate,
            "in_rate": self.in_rate,
            "error": self.error,
            "refused": self.refused,
            "unroutable": self.unroutable,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LinkInfo:
        return cls(
            d["peer"],
            d["address"],
            d["state"] == "up",
            d["pending"],
            d["in_flight"],
            d["oldest_age"],
            d["resends"],
            d["taken"],
            d["received"],
            d["read"],
            tuple(d["reaches"]),
            d["out_rate"],
            d["in_rate"],
            d["error"],
            d["refused"],
            d["unroutable"],
        )
