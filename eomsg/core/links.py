"""Links between nodes as configured and as seen: names, settings, and what ``eomsg
inspect links`` shows. The rules of routing and transfer are in :mod:`eomsg.core.routing`
and :mod:`eomsg.core.transfer`; the node keeps links in :mod:`eomsg.node.links`."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from eomsg.core.topics import Matcher, validate_pattern
from eomsg.errors import InvalidConfig

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
EGRESS = ("store", "memory")  # what a node does with a peer's messages for its own queues
DEFAULT_HOLD = 1.0  # seconds a message is held in memory before it is stored
MIN_HOLD, MAX_HOLD = 0.01, 60.0


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
    """A link as configured: the peer's name and, on the side that dials, its address,
    the token the peer accepts (kept in the data directory, which is owner-only; never
    shown by ``inspect links``) and, for ``tls://``, the CA certificates (PEM) that
    signed the peer's certificate (None: the system's). On the side that is dialled,
    ``accepts`` is the SHA-256 of the token the peer must present (None: this node's own
    token). Either side: what this node does with what the peer sends for its own
    queues (``egress``: ``store`` it, or hold it in ``memory`` for up to ``hold``
    seconds; see :mod:`eomsg.node.egress`), and the topics the link may carry either way
    (``topics``: patterns; None: every topic)."""

    peer: str
    address: str | None = None
    token: str | None = None
    accepts: str | None = None
    peer_ca: str | None = None
    egress: str = "store"
    hold: float = DEFAULT_HOLD
    topics: tuple[str, ...] | None = None

    @classmethod
    def make(
        cls, peer: str, address: str | None, token: str | None, peer_ca: str | None
    ) -> LinkConfig:
        """The link :meth:`~eomsg.node.links.Links.add_link` keeps: with an address, it
        dials presenting ``token``; without one, it accepts the peer presenting
        ``token`` (kept hashed) or, with none, this node's own token. InvalidConfig for
        settings that do not go together."""
        check_node_name(peer)
        if address is None:
            if peer_ca is not None:
                raise InvalidConfig(
                    "a CA for the peer's certificate is for the side that dials it: give the "
                    "peer's address too, or leave the CA out"
                )
            return cls(peer, None, None, None if token is None else token_hash(token))
        if token is None:
            raise InvalidConfig(
                f"the node at {address} needs a token to accept the link: its node token "
                "or one it made for this link"
            )
        if peer_ca is not None and not address.startswith("tls://"):
            raise InvalidConfig(
                f"a CA for the peer's certificate needs a tls:// address, not {address}"
            )
        return cls(peer, address, token, None, peer_ca)

    def to_json(self) -> dict[str, Any]:
        """What the store keeps of the link: all but its secrets (:meth:`secrets`)."""
        return {
            "address": self.address,
            "peer_ca": self.peer_ca,
            "egress": self.egress,
            "hold": self.hold,
            "topics": None if self.topics is None else list(self.topics),
        }

    def secrets(self) -> dict[str, Any]:
        """What is kept apart from the store: the token it presents, the key it accepts."""
        return {"token": self.token, "accepts": self.accepts}

    @classmethod
    def from_json(
        cls, peer: str, data: dict[str, Any], secrets: dict[str, Any] | None = None
    ) -> LinkConfig:
        topics = data.get("topics")
        kept = secrets or {}
        return cls(
            peer,
            data.get("address"),
            kept.get("token"),
            kept.get("accepts"),
            data.get("peer_ca"),
            data.get("egress", "store"),
            float(data.get("hold", DEFAULT_HOLD)),
            None if topics is None else tuple(topics),
        )

    def with_topics(self, topics: Sequence[str] | None) -> LinkConfig:
        """This link, carrying only topics matching ``topics`` (None: every topic);
        InvalidPattern for a pattern that is not one."""
        if topics is None:
            return dataclasses.replace(self, topics=None)
        checked = tuple(sorted({validate_pattern(p) for p in topics}))
        return dataclasses.replace(self, topics=checked)

    def carries(self) -> Matcher[bool] | None:
        """A matcher of the topics this link may carry (None: every topic)."""
        if self.topics is None:
            return None
        matcher: Matcher[bool] = Matcher()
        for pattern in self.topics:
            matcher.add(pattern, True)
        return matcher

    def dialling(self) -> tuple[str | None, str | None, str | None]:
        """What dialling the peer depends on (a change of it means dialling anew)."""
        return self.address, self.token, self.peer_ca

    def with_egress(self, egress: str, hold: float) -> LinkConfig:
        """This link, holding or storing what the peer sends for this node's queues;
        InvalidConfig for a mode or a hold it cannot have."""
        if egress not in EGRESS:
            raise InvalidConfig(f"egress {egress!r}: use {' or '.join(EGRESS)}")
        if not MIN_HOLD <= hold <= MAX_HOLD:
            raise InvalidConfig(
                f"--hold must be between {MIN_HOLD * 1000:.0f} ms and {MAX_HOLD:.0f} s"
            )
        return dataclasses.replace(self, egress=egress, hold=hold)


def token_hash(token: str) -> str:
    """The SHA-256 of a link token, as kept by the node that accepts it (hex)."""
    return hashlib.sha256(token.encode()).hexdigest()


def link_proof(key: str, nonce: str, dialler: str, dialled: str, by: str) -> str:
    """How one side of a link answers the other's ``nonce`` to show it knows the link's
    token without sending it (``key``: the token's :func:`token_hash`, which both
    sides hold; ``by``: ``"dialler"`` or ``"dialled"``, so a proof is never good the
    other way round). A node that does not know the token — at a wrong address, or
    dialling with a name not its own — can neither make one nor learn the token."""
    text = f"eomsg-link|{by}|{nonce}|{dialler}|{dialled}".encode()
    return hmac.new(bytes.fromhex(key), text, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class LinkInfo:
    """What ``inspect links`` shows of a link: whether it is up; what it owes the peer
    (``pending``; ``in_flight``: sent and not yet acknowledged; the age of the oldest,
    in seconds); go-backs to resend on its current connection; messages the peer took
    and this node took from it, in total since start and per second over the last
    minute; the peer's sequence taken (``read``); the nodes reached through it; while it
    is down, why the last attempt to connect failed, and whether that was a refusal
    (``refusal``: a name or token that does not fit, a link removed — one side said no,
    rather than could not be reached). A row with ``removed`` is no link: one this node
    removed, whose peer still dials it (and is refused)."""

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
    refused: int = 0  # messages from the peer this node could not take, or to it that fit
    # no frame it takes (both passed over), since start
    unroutable: int = 0  # … for nodes it has no route to (not carried there)
    egress: str = "store"  # what this node does with the peer's messages for its queues
    held: int = 0  # messages from the peer held in memory now (egress memory)
    topics: tuple[str, ...] | None = None  # what the link may carry (None: every topic)
    withheld: int = 0  # messages from the peer, or to carry on, of topics not its own
    refusal: bool = False  # the last attempt was refused, by either side (see ``error``)
    removed: bool = False  # no link: removed here, and the peer still dials (refused)

    @property
    def state(self) -> str:
        """``up``; ``down`` (not connected now); ``refused`` (the last attempt was
        refused, by the peer or by this node); ``removed`` (see the class)."""
        if self.connected:
            return "up"
        if self.removed:
            return "removed"
        return "refused" if self.refusal else "down"

    def to_json(self) -> dict[str, Any]:
        return {
            "peer": self.peer,
            "address": self.address,
            "state": self.state,
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
            "egress": self.egress,
            "held": self.held,
            "topics": None if self.topics is None else list(self.topics),
            "withheld": self.withheld,
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
            d["egress"],
            d["held"],
            None if d["topics"] is None else tuple(d["topics"]),
            d["withheld"],
            d["state"] == "refused",
            d["state"] == "removed",
        )
