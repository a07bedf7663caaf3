"""Queue configuration: what a queue subscribes to and how it treats failed deliveries."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from eomsg.core.topics import validate_pattern
from eomsg.errors import InvalidConfig, InvalidQueueName

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")
DEFAULT_ACK_TIMEOUT = 30.0
DEFAULT_MAX_REDELIVERIES_WITH_DLQ = 5
MAX_ACTIVE_LIMIT = 10_000
REFUSE = "refuse"  # overflow: a publish that would take the queue past its limit is refused
DEAD_LETTER_OLDEST = "dead-letter-oldest"  # overflow: the oldest waiting make room
OVERFLOWS = (REFUSE, DEAD_LETTER_OLDEST)
MAX_MESSAGES_LIMIT = 2**40
MAX_BYTES_LIMIT = 2**50  # 1 PiB


def queue_kind(max_active: int) -> str:
    """``exclusive`` (1 active consumer), ``limited`` (N) or ``shared`` (0: no limit)."""
    if max_active == 1:
        return "exclusive"
    return "limited" if max_active > 1 else "shared"


def validate_queue_name(name: str) -> str:
    """Return ``name`` if it is 1-128 of ``A-Z a-z 0-9 _ . -``, starting alphanumeric."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidQueueName(
            f"queue name {name!r} is not valid: use 1-128 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit"
        )
    return name


@dataclass(frozen=True)
class QueueConfig:
    """A queue's settings. Immutable; build a new one to change it.

    ``max_redeliveries`` counts deliveries after the first: with 5, a message is handed
    out at most 6 times, then moved to ``dead_letter`` (never dropped silently).
    ``ack_timeout`` is how long a delivered message stays in flight before it is
    redelivered. ``max_active`` bounds the consumers receiving at once (seed 002: 1 makes
    an exclusive queue, N a limited one, 0 no limit); ``immediate`` lets a newly bound
    consumer of higher priority depose an active one at once instead of waiting for a
    free slot.

    ``max_messages`` bounds the messages the queue holds, in flight included (None: no
    bound); ``overflow`` says what a publish that would pass it does: ``refuse`` (the
    publish is refused whole, QueueFull, and nothing of it stored) or
    ``dead-letter-oldest`` (the oldest messages waiting — not in flight — move to
    ``dead_letter`` to make room; never dropped silently, so it needs one).
    ``max_bytes`` bounds the payload bytes it holds the same way, with the same
    ``overflow``; a queue may have both, and a publish must fit both.
    """

    name: str
    subscriptions: tuple[str, ...] = ()
    max_redeliveries: int | None = None
    dead_letter: str | None = None
    ack_timeout: float = DEFAULT_ACK_TIMEOUT
    max_active: int = 0
    immediate: bool = True
    max_messages: int | None = None
    overflow: str = REFUSE
    max_bytes: int | None = None

    @property
    def limited(self) -> bool:
        """Whether it has a max-messages or a max-bytes."""
        return self.max_messages is not None or self.max_bytes is not None

    @property
    def kind(self) -> str:
        return queue_kind(self.max_active)

    def __post_init__(self) -> None:
        validate_queue_name(self.name)
        for pattern in self.subscriptions:
            validate_pattern(pattern)
        if len(set(self.subscriptions)) != len(self.subscriptions):
            raise InvalidConfig(f"queue {self.name!r}: a subscription is listed twice")
        if self.max_redeliveries is not None and self.max_redeliveries < 0:
            raise InvalidConfig(f"queue {self.name!r}: --max-redeliveries must be 0 or more")
        if self.dead_letter is not None:
            validate_queue_name(self.dead_letter)
            if self.dead_letter == self.name:
                raise InvalidConfig(f"queue {self.name!r} cannot be its own dead-letter queue")
        if self.max_redeliveries is not None and self.dead_letter is None:
            raise InvalidConfig(
                f"queue {self.name!r}: --max-redeliveries needs --dead-letter QUEUE, so that "
                "a message past its limit goes somewhere instead of being lost"
            )
        if not 0 < self.ack_timeout <= 7 * 86400:
            raise InvalidConfig(f"queue {self.name!r}: --ack-timeout must be between 0 and 7 days")
        if type(self.max_active) is not int or not 0 <= self.max_active <= MAX_ACTIVE_LIMIT:
            raise InvalidConfig(
                f"queue {self.name!r}: --max-active must be between 0 (no limit) and "
                f"{MAX_ACTIVE_LIMIT}"
            )
        if self.max_messages is not None and (
            type(self.max_messages) is not int or not 1 <= self.max_messages <= MAX_MESSAGES_LIMIT
        ):
            raise InvalidConfig(
                f"queue {self.name!r}: --max-messages must be between 1 and {MAX_MESSAGES_LIMIT}"
            )
        if self.max_bytes is not None and (
            type(self.max_bytes) is not int or not 1 <= self.max_bytes <= MAX_BYTES_LIMIT
        ):
            raise InvalidConfig(
                f"queue {self.name!r}: --max-bytes must be between 1 byte and 1 PiB"
            )
        if self.overflow not in OVERFLOWS:
            raise InvalidConfig(
                f"queue {self.name!r}: --overflow is {' or '.join(OVERFLOWS)}, "
                f"not {self.overflow!r}"
            )
        if self.overflow == DEAD_LETTER_OLDEST and self.dead_letter is None:
            raise InvalidConfig(
                f"queue {self.name!r}: --overflow {DEAD_LETTER_OLDEST} needs a dead-letter "
                "queue (queue create --dead-letter QUEUE), so that the messages making room "
                "go somewhere instead of being lost"
            )

    def over(self, depth: int, adding: int) -> int:
        """How many messages past ``max_messages`` the queue would hold with ``adding``
        more than its ``depth`` (0: they fit, or there is no limit)."""
        if self.max_messages is None:
            return 0
        return max(0, depth + adding - self.max_messages)

    def over_bytes(self, held: int, adding: int) -> int:
        """How many payload bytes past ``max_bytes`` the queue would hold with ``adding``
        bytes more than the ``held`` it holds (0: they fit, or there is no limit)."""
        if self.max_bytes is None:
            return 0
        return max(0, held + adding - self.max_bytes)

    @classmethod
    def create(
        cls,
        name: str,
        subscriptions: tuple[str, ...] | list[str] = (),
        *,
        max_redeliveries: int | None = None,
        dead_letter: str | None = None,
        ack_timeout: float = DEFAULT_ACK_TIMEOUT,
        max_active: int = 0,
        immediate: bool = True,
        max_messages: int | None = None,
        overflow: str = REFUSE,
        max_bytes: int | None = None,
    ) -> QueueConfig:
        """Build a config, defaulting ``max_redeliveries`` when only a DLQ is given."""
        if dead_letter is not None and max_redeliveries is None:
            max_redeliveries = DEFAULT_MAX_REDELIVERIES_WITH_DLQ
        return cls(
            name,
            tuple(subscriptions),
            max_redeliveries,
            dead_letter,
            ack_timeout,
            max_active,
            immediate,
            max_messages,
            overflow,
            max_bytes,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "subscriptions": list(self.subscriptions),
            "max_redeliveries": self.max_redeliveries,
            "dead_letter": self.dead_letter,
            "ack_timeout": self.ack_timeout,
            "max_active": self.max_active,
            "immediate": self.immediate,
            "max_messages": self.max_messages,
            "overflow": self.overflow,
            "max_bytes": self.max_bytes,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> QueueConfig:
        return cls(
            data["name"],
            tuple(data.get("subscriptions", ())),
            data.get("max_redeliveries"),
            data.get("dead_letter"),
            float(data.get("ack_timeout", DEFAULT_ACK_TIMEOUT)),
            int(data.get("max_active", 0)),
            bool(data.get("immediate", True)),
            data.get("max_messages"),
            str(data.get("overflow", REFUSE)),
            data.get("max_bytes"),
        )


@dataclass(frozen=True, slots=True)
class QueueStats:
    """A queue as ``inspect queues`` shows it."""

    name: str
    subscriptions: tuple[str, ...]
    depth: int
    in_flight: int
    deleted: int
    expired: int
    dead_lettered: int
    purged: int
    oldest_age: float | None
    dead_letter: str | None
    max_redeliveries: int | None
    max_active: int = 0
    flows: int = 0  # consumers bound
    active: int = 0  # of them active
    bytes: int = 0  # payload bytes of the messages it holds
    in_rate: float | None = None  # messages in per second lately (None: not known yet)
    out_rate: float | None = None  # messages deleted per second lately
    max_messages: int | None = None  # its limit (None: none)
    overflow: str = REFUSE  # what a publish past it does
    overflowed: int = 0  # messages its overflow refused or dead-lettered since the node opened
    max_bytes: int | None = None  # its limit of payload bytes (None: none)

    @property
    def kind(self) -> str:
        return queue_kind(self.max_active)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "subscriptions": list(self.subscriptions),
            "depth": self.depth,
            "in_flight": self.in_flight,
            "deleted": self.deleted,
            "expired": self.expired,
            "dead_lettered": self.dead_lettered,
            "purged": self.purged,
            "oldest_age": self.oldest_age,
            "dead_letter": self.dead_letter,
            "max_redeliveries": self.max_redeliveries,
            "max_active": self.max_active,
            "flows": self.flows,
            "active": self.active,
            "bytes": self.bytes,
            "in_rate": self.in_rate,
            "out_rate": self.out_rate,
            "max_messages": self.max_messages,
            "overflow": self.overflow,
            "overflowed": self.overflowed,
            "max_bytes": self.max_bytes,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> QueueStats:
        return cls(**{**data, "subscriptions": tuple(data["subscriptions"])})
