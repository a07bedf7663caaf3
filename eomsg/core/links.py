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
    and the file holding the token the peer accepts."""

    peer: str
    address: str | None = None
    token_file: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"address": self.address, "token_file": self.token_file}

    @classmethod
    def from_json(cls, peer: str, data: dict[str, Any]) -> LinkConfig:
        return cls(peer, data.get("address"), data.get("token_file"))


@dataclass(frozen=True)
class LinkInfo:
    """What ``inspect links`` shows of a link."""

    peer: str
    address: str | None
    connected: bool
    pending: int  # messages owed to the peer
    in_flight: int
    oldest: int | None  # the lowest seq owed
    resends: int
    taken: int
    received: int
    read: int  # the peer's sequence taken from it
    reaches: tuple[str, ...]  # nodes reached through it

    def to_json(self) -> dict[str, Any]:
        return {
            "peer": self.peer,
            "address": self.address,
            "state": "up" if self.connected else "down",
            "pending": self.pending,
            "in_flight": self.in_flight,
            "oldest_seq": self.oldest,
            "resends": self.resends,
            "taken": self.taken,
            "received": self.received,
            "read": self.read,
            "reaches": list(self.reaches),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LinkInfo:
        return cls(
            d["peer"],
            d["address"],
            d["state"] == "up",
            d["pending"],
            d["in_flight"],
            d["oldest_seq"],
            d["resends"],
            d["taken"],
            d["received"],
            d["read"],
            tuple(d["reaches"]),
        )
