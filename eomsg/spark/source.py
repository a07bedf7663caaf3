"""The ``eomsg`` Spark data source: the retained log as a batch or streaming DataFrame.

    eomsg.spark.register(spark)
    spark.read.format("eomsg").option("data", "./eomsg-data").option("topic", "orders/>").load()
    spark.readStream.format("eomsg").option("broker", "tcp://host:7420").load()

Each partition is a half-open sequence range, read in seq order. Where it is read from is
decided once, when the query is planned, and travels with the partition: the data
directory's file (opened read-only, when no node holds it) or a node (``broker``, or the
node serving ``data``), which answers with Arrow batches over the wire — the way for
executors on other hosts. Below the last committed seq the log never changes, so a task
read again gives the same rows: with a sink idempotent per batch, exactly once.

Options: ``data`` or ``broker`` (and ``token`` for TCP, else env EOMSG_TOKEN; ``tlsCa``
for ``tls://``, else env EOMSG_TLS_CA or the system's CAs); ``topic``
(patterns, comma-separated) or ``queue`` (its subscriptions); ``fromSeq``, ``toSeq``
(inclusive); ``since``, ``until`` (ISO time, or a duration ago); ``partitions`` or
``rowsPerPartition`` (default 100000 seqs). Streaming only: ``startingSeq`` (``earliest``,
``latest`` or a seq) and ``maxRowsPerTrigger``.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from eomsg.core.replay import Selection, check_retained, parse_time, split
from eomsg.errors import InvalidInput, Unavailable
from eomsg.transport.address import socket_path

if TYPE_CHECKING:
    import pyarrow as pa

    from eomsg.client.sync import Client
    from eomsg.store.logread import FileLog

# The client and the store (with pyarrow, DuckDB, asyncio: ≈ 0.4 s) are imported where a
# log is opened, not here: Spark starts a Python process of its own to look the source
# up and another for its schema, each importing this module and needing neither.

NAME = "eomsg"
SCHEMA = (
    "seq BIGINT, topic STRING, id STRING, published_at TIMESTAMP_NTZ, "
    "expires_at TIMESTAMP_NTZ, headers STRING, payload BINARY"
)
ROWS_PER_PARTITION = 100_000


class LogAccess(Protocol):
    """What planning and reading need of a log, from a file or from a node."""

    def log_bounds(self, sel: Selection) -> tuple[int, int] | None: ...

    def log_horizon(self) -> tuple[int, int | None]: ...

    def queue_patterns(self, queue: str) -> tuple[str, ...]: ...

    def batches(self, sel: Selection, lo: int, hi: int) -> Iterator[pa.RecordBatch]: ...


class _FileAccess:
    def __init__(self, log: FileLog) -> None:
        self.log = log

    def log_bounds(self, sel: Selection) -> tuple[int, int] | None:
        return self.log.bounds(sel)

    def log_horizon(self) -> tuple[int, int | None]:
        return self.log.horizon()

    def queue_patterns(self, queue: str) -> tuple[str, ...]:
        return self.log.queue_patterns(queue)

    def batches(self, sel: Selection, lo: int, hi: int) -> Iterator[pa.RecordBatch]:
        yield from self.log.batches(sel, lo, hi)


class _NodeAccess:
    def __init__(self, client: Client) -> None:
        self.client = client

    def log_bounds(self, sel: Selection) -> tuple[int, int] | None:
        return self.client.log_bounds(sel)

    def log_horizon(self) -> tuple[int, int | None]:
        return self.client.log_horizon()

    def queue_patterns(self, queue: str) -> tuple[str, ...]:
        return self.client.queue_config(queue).subscriptions

    def batches(self, sel: Selection, lo: int, hi: int) -> Iterator[pa.RecordBatch]:
        from eomsg.store.schema import arrow_schema

        while lo < hi:
            table, lo = self.client.read_log(sel, lo, hi)
            yield from table.cast(arrow_schema("messages")).to_batches()


@dataclass(frozen=True)
class Route:
    """Where the log is read from: a data directory's file, or a node's address."""

    data: str | None = None
    broker: str | None = None
    token: str | None = None
    tls_ca: str | None = None

    @classmethod
    def choose(
        cls, data: str | None, broker: str | None, token: str | None, tls_ca: str | None = None
    ) -> Route:
        """The node at ``broker``; else the node serving ``data`` if one answers; else
        ``data``'s file."""
        if broker:
            return cls(
                broker=broker,
                token=token or os.environ.get("EOMSG_TOKEN"),
                tls_ca=tls_ca or os.environ.get("EOMSG_TLS_CA"),
            )
        if not data:
            raise InvalidInput("the eomsg source needs option data (a directory) or broker")
        if socket_path(Path(data)).exists():
            from eomsg.client.sync import connect

            with contextlib.suppress(Unavailable), connect(data, name="eomsg-spark"):
                return cls(broker=f"unix://{socket_path(Path(data)).resolve()}")
        return cls(data=str(Path(data).resolve()))

    @contextlib.contextmanager
    def open(self) -> Iterator[LogAccess]:
        if self.broker is not None:
            from eomsg.client.sync import connect
            from eomsg.transport.tls import ClientTls

            tls = ClientTls.from_env(self.tls_ca) if self.broker.startswith("tls://") else None
            with connect(self.broker, token=self.token, name="eomsg-spark", tls=tls) as client:
                yield _NodeAccess(client)
        else:
            assert self.data is not None
            from eomsg.store.logread import FileLog

            # A command holding the directory for a moment (eomsg inspect) is waited for.
            with FileLog(self.data, wait=READ_WAIT) as log:
                yield _FileAccess(log)

    def describe(self) -> str:
        return f"node {self.broker}" if self.broker else f"file {self.data}"


READ_WAIT = 30.0  # seconds a task waits for a data directory another command holds


class LogPartition(InputPartition):
    """One task's share: ``sel`` within ``[lo, hi)``, read through ``route``."""

    def __init__(self, index: int, route: Route, sel: Selection, lo: int, hi: int) -> None:
        super().__init__(index)
        self.route, self.sel, self.lo, self.hi = route, sel, lo, hi


def read_partition(part: LogPartition) -> Iterator[pa.RecordBatch]:
    with part.route.open() as access:
        yield from access.batches(part.sel, part.lo, part.hi)


def _int(options: Mapping[str, str], name: str) -> int | None:
    text = options.get(name)
    if text is None or text == "":
        return None
    try:
        return int(text)
    except ValueError:
        raise InvalidInput(f"option {name} must be an integer, not {text!r}") from None


@dataclass(frozen=True)
class SourceOptions:
    """The data source's options, checked once on the driver."""

    route: Route
    sel: Selection
    partitions: int | None
    rows_per_partition: int
    starting_seq: str
    max_rows_per_trigger: int | None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        route = Route.choose(
            options.get("data"), options.get("broker"), options.get("token"), options.get("tlsCa")
        )
        topic, queue = options.get("topic"), options.get("queue")
        if topic and queue:
            raise InvalidInput("give option topic or queue, not both")
        if queue:
            with route.open() as access:
                patterns = access.queue_patterns(queue)
        else:
            patterns = tuple(p.strip() for p in (topic or "").split(",") if p.strip())
        now = time.time()
        since, until = options.get("since"), options.get("until")
        sel = Selection(
            patterns,
            _int(options, "fromSeq") or 1,
            _int(options, "toSeq"),
            None if not since else int(parse_time(since, now) * 1_000_000),
            None if not until else int(parse_time(until, now) * 1_000_000),
        )
        rows = _int(options, "rowsPerPartition") or ROWS_PER_PARTITION
        parts = _int(options, "partitions")
        max_rows = _int(options, "maxRowsPerTrigger")
        if rows < 1 or (parts is not None and parts < 1):
            raise InvalidInput("options partitions and rowsPerPartition must be 1 or more")
        if max_rows is not None and max_rows < 1:
            raise InvalidInput("option maxRowsPerTrigger must be 1 or more")
        return cls(route, sel, parts, rows, options.get("startingSeq", "earliest"), max_rows)

    def split(self, lo: int, hi: int) -> list[LogPartition]:
        count = self.partitions or math.ceil((hi - lo) / self.rows_per_partition)
        return [
            LogPartition(i, self.route, self.sel, r.lo, r.hi)
            for i, r in enumerate(split(lo, hi, count))
        ]


class EomsgDataSource(DataSource):
    """``format("eomsg")``: see the module docstring for its options."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        return BatchReader(SourceOptions.parse(self.options))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return StreamReader(SourceOptions.parse(self.options))


class BatchReader(DataSourceReader):
    """The messages of the selection, as they are when the query is planned."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def partitions(self) -> list[LogPartition]:
        with self.opts.route.open() as access:
            found = access.log_bounds(self.opts.sel)
            check_retained("the query", self.opts.sel, 0, 0, access.log_horizon())
        if found is None:
            return []
        return self.opts.split(found[0], found[1] + 1)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, LogPartition)
        return read_partition(partition)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of new messages. The offset ``{"seq": n}`` is the next seq to read;
    a batch is the committed range ``[start, end)``, so a batch replayed from the
    checkpoint reads exactly the rows it read before."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._until: int | None = None  # the end fixed by Trigger.AvailableNow

    def _next_seq(self) -> int:
        with self.opts.route.open() as access:
            found = access.log_bounds(Selection())
        return 1 if found is None else found[1] + 1

    def initialOffset(self) -> dict[str, int]:
        start = self.opts.starting_seq
        if start == "earliest":  # from fromSeq, or else the first the log still holds
            first = self.opts.sel.from_seq
            if first <= 1:
                with self.opts.route.open() as access:
                    first = access.log_horizon()[0]
            return {"seq": first}
        if start == "latest":
            return {"seq": self._next_seq()}
        try:
            return {"seq": max(1, int(start))}
        except ValueError:
            raise InvalidInput(
                f"option startingSeq must be earliest, latest or a seq, not {start!r}"
            ) from None

    def prepareForTriggerAvailableNow(self) -> None:
        self._until = self._next_seq()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_rows_per_trigger is not None:
            return ReadMaxRows(self.opts.max_rows_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        # A range of n seqs holds at most n selected rows, so capping the width by the
        # row limit respects it.
        end = self._until if self._until is not None else self._next_seq()
        if isinstance(limit, ReadMaxRows):
            end = min(end, start["seq"] + limit.max_rows)
        return {"seq": max(start["seq"], end)}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[LogPartition]:
        """The batch ``[start, end)``; LogCollected if part of it was collected while the
        stream was stopped (its messages are gone: the stream cannot stay exactly-once)."""
        if end["seq"] > start["seq"]:
            with self.opts.route.open() as access:
                horizon = access.log_horizon()
            check_retained(
                "this stream's next batch", Selection(), start["seq"], end["seq"], horizon
            )
        return self.opts.split(start["seq"], end["seq"])

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, LogPartition)
        return read_partition(partition)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to release: the log is read, never consumed."""


def register(spark: Any) -> None:
    """Make ``format("eomsg")`` known to ``spark``. Idempotent."""
    spark.dataSource.register(EomsgDataSource)


__all__ = ["NAME", "SCHEMA", "EomsgDataSource", "LogPartition", "Route", "register"]
