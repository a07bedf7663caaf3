"""Reading the retained log's messages: whole, as rows, or one column of a few.

A message the writer journaled and DuckDB does not hold yet is in the writer's overlay;
a message leaves the overlay only after DuckDB committed it, so a read that looks there
first, then in DuckDB, never misses one and need not wait for the writer. The latest
messages DuckDB holds are kept in memory a while longer (:mod:`eomsg.store.recent`), and
a read of a dense run from DuckDB reads ahead into the same place: a consumer that keeps
up, or drains a backlog a take at a time, rarely queries. A read of a range of the log
(:func:`log`) waits instead (:meth:`Reads.sync`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from itertools import repeat
from operator import itemgetter, truediv
from typing import Any

from eomsg.core.columns import Columns
from eomsg.core.message import Message, MessageColumns
from eomsg.store.reads import Reads
from eomsg.store.recent import AHEAD_BYTES, AHEAD_ROWS, ROW_COST

US = 1_000_000  # times cross the store's boundary as integer microseconds since the epoch

_COLUMNS = "seq, topic, id, epoch_us(published_at), epoch_us(expires_at), headers, payload"
# A ``messages`` row as the writer's overlay and :func:`fetch_rows` give it: seq,
# topic, id, published and expires (µs), headers (JSON text or None), payload.
MessageRow = tuple[int, str, str | None, int, int | None, str | None, bytes]


def message(row: Sequence[Any]) -> Message:
    """The :class:`Message` of one ``messages`` row (:data:`MessageRow`)."""
    seq, topic, msg_id, published_us, expires_us, headers, payload = row
    return Message(
        seq=seq,
        topic=topic,
        payload=bytes(payload),
        id=msg_id,
        published_at=published_us / US,
        expires_at=None if expires_us is None else expires_us / US,
        headers=json.loads(headers) if headers else {},
    )


def columns_of(rows: Sequence[Sequence[Any]]) -> MessageColumns:
    """The messages of ``messages`` rows as columns (:data:`MessageColumns`), the
    values :func:`message` makes: a consumer's take reads every message through here."""
    n = len(rows)
    if not n:
        return (), (), (), (), (), None, None
    seqs, topics, ids, published, expires, headers, payloads = zip(*rows, strict=True)
    if set(map(type, payloads)) != {bytes}:
        payloads = tuple(map(bytes, payloads))
    times = list(map(truediv, published, repeat(US)))
    ends = None if expires.count(None) == n else [None if e is None else e / US for e in expires]
    maps = None if not any(headers) else [json.loads(h) if h else {} for h in headers]
    return seqs, topics, payloads, ids, times, ends, maps


_MESSAGES = Columns(Message)


def messages_of(rows: Sequence[Sequence[Any]]) -> list[Message]:
    """The :class:`Message` of each ``messages`` row, as :func:`message` makes it, a
    column at a time."""
    n = len(rows)
    seqs, topics, payloads, ids, times, ends, maps = columns_of(rows)
    return _MESSAGES.make(
        n,
        seqs,
        topics,
        payloads,
        ids,
        times,
        repeat(None) if ends is None else ends,
        [{} for _ in range(n)] if maps is None else maps,
    )


def fetch_rows(
    reads: Reads, seqs: Sequence[int], *, memory_only: bool = False
) -> list[MessageRow | None] | None:
    """The ``messages`` rows of these sequence numbers (ascending), in their order,
    None for one not in the log: those DuckDB does not hold yet from the writer's
    overlay, the rest from DuckDB. ``memory_only``: None rather than read DuckDB (for a
    caller that must not block)."""
    overlay, recent = reads.writer.overlay.get, reads.writer.recent.get
    rows: list[Any] = [overlay(seq) or recent(seq) for seq in seqs]
    if None not in rows:  # the usual case: a consumer or link reads what was just written
        return rows
    if memory_only:
        return None
    rest = [seq for seq, row in zip(seqs, rows, strict=True) if row is None]
    low, high = rest[0], rest[-1]
    if high - low < 4 * len(rest):  # dense, the usual case: a range scan, and ahead
        read = reads.rows(f"SELECT {_COLUMNS} FROM messages WHERE seq BETWEEN ? AND ?", [low, high])
        _read_ahead(reads, high, read)
    else:
        read = reads.rows(
            f"""SELECT {_COLUMNS} FROM messages
                WHERE seq BETWEEN ? AND ? AND seq IN (SELECT unnest(?::BIGINT[]))""",
            [low, high, rest],
        )
    found = {row[0]: row for row in read}
    return [found.get(seq) if row is None else row for seq, row in zip(seqs, rows, strict=True)]


def _read_ahead(reads: Reads, high: int, read: list[Any]) -> None:
    """Keep in memory (:mod:`eomsg.store.recent`) the messages past ``high`` that the
    reader of the dense run ``read`` will likely ask for next: as many seqs as
    :data:`AHEAD_BYTES` holds of messages the size of those (:data:`AHEAD_ROWS` at most),
    when that is more than it read — so a queue of large payloads reads no further
    than it asks."""
    if not read:
        return
    size = sum(map(len, map(itemgetter(-1), read))) / len(read) + ROW_COST
    ahead = min(AHEAD_ROWS, int(AHEAD_BYTES // size))
    if ahead > len(read):
        reads.writer.recent.add(
            reads.rows(
                f"SELECT {_COLUMNS} FROM messages WHERE seq BETWEEN ? AND ?",
                [high + 1, high + ahead],
            )
        )


def log(
    reads: Reads,
    topic_regex: str | None,
    from_seq: int,
    limit: int,
    *,
    newest: bool = False,
    to_seq: int | None = None,
    until_us: int | None = None,
) -> list[Message]:
    """Retained messages from ``from_seq`` on (to ``to_seq``; published before
    ``until_us``, microseconds since the epoch), optionally filtered by a topic
    regex, oldest first: the first ``limit``, or with ``newest`` the last."""
    reads.sync()  # every acknowledged write, not only what DuckDB holds
    where = "seq >= ?"
    params: list[Any] = [from_seq]
    if to_seq is not None:
        where += " AND seq <= ?"
        params.append(to_seq)
    if until_us is not None:
        where += " AND published_at < make_timestamp(?)"
        params.append(until_us)
    if topic_regex is not None:
        where += " AND regexp_full_match(topic, ?)"
        params.append(topic_regex)
    rows = reads.rows(
        f"""SELECT {_COLUMNS} FROM messages WHERE {where}
            ORDER BY seq {"DESC" if newest else ""} LIMIT ?""",
        [*params, limit],
    )
    return [message(r) for r in (reversed(rows) if newest else rows)]


def _fresh(reads: Reads, seqs: Sequence[int]) -> tuple[dict[int, Any], list[int]]:
    """The ``messages`` rows of ``seqs`` still in the writer's overlay (DuckDB may not
    hold them yet), by seq, and the seqs to read from DuckDB."""
    overlay, recent = reads.writer.overlay.get, reads.writer.recent.get
    fresh: dict[int, Any] = {}
    rest = []
    for seq in seqs:
        row = overlay(seq) or recent(seq)
        if row is None:
            rest.append(seq)
        else:
            fresh[seq] = row
    return fresh, rest


def _column(reads: Reads, seqs: Sequence[int], index: int, column: str) -> dict[int, Any]:
    """One timestamp column of ``messages`` (``index`` in its rows) for ``seqs``, in
    microseconds: from the writer's overlay, else DuckDB."""
    fresh, rest = _fresh(reads, seqs)
    found = {seq: row[index] for seq, row in fresh.items()}
    if rest:
        found.update(
            reads.rows(
                f"SELECT seq, epoch_us({column}) FROM messages "
                "WHERE seq IN (SELECT unnest(?::BIGINT[]))",
                [rest],
            )
        )
    return found


def expiries(reads: Reads, seqs: Sequence[int]) -> dict[int, float]:
    """Expiry times of the messages among ``seqs`` that have one, by seq."""
    found = _column(reads, seqs, 4, "expires_at")
    return {seq: us / US for seq, us in found.items() if us is not None}


def published_at(reads: Reads, seqs: Sequence[int]) -> dict[int, float]:
    """Publish times of a few messages, by seq."""
    return {seq: us / US for seq, us in _column(reads, seqs, 3, "published_at").items()}


def payload_sizes_of(reads: Reads, seqs: Sequence[int]) -> dict[int, int]:
    """Payload bytes of the messages among ``seqs`` still in the log, by seq: from the
    writer's overlay, else DuckDB."""
    fresh, rest = _fresh(reads, seqs)
    found = {seq: len(row[6]) for seq, row in fresh.items()}
    if rest:
        found.update(
            reads.rows(
                "SELECT seq, octet_length(payload) FROM messages "
                "WHERE seq IN (SELECT unnest(?::BIGINT[]))",
                [rest],
            )
        )
    return found
