"""Where a replay writes, exactly once however often it runs.

Every sink works in two steps. Spark *stages* the output: each task writes its partition
to ``part-NNNNN.parquet`` in the job's staging directory (a temporary name, then an atomic
rename, so a retried or speculative task leaves one whole file) and reports its rows and
the file's SHA-256. Then the driver *commits*, atomically and idempotently:

- ``parquet:DIR`` — the staging directory is renamed to ``DIR`` with a manifest naming
  the job and what made its output; a ``DIR`` whose manifest says exactly this output is
  already committed.
- ``duckdb:PATH:TABLE`` — one transaction replaces the job's rows (tagged with
  ``replay_job``) and its row in the ledger table ``eomsg_replay_ledger``, which says what
  made them; a ledger row saying exactly this output is already committed.
- ``topic:NAME`` — each row is published with the id ``replay:JOB:SEQ``; the node drops
  the ids it already holds, so publishing again adds nothing. A topic keeps no ledger.

What a sink holds for a job (:class:`Output`) names the options and range that made it,
so a job is recorded done only with output of its own run (``core.replay.check_output``).

Staging must be on a file system the driver and every executor share (as Spark's own
file output needs); by default it sits beside the output.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import re
import shutil
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark import TaskContext
from pyspark.sql import DataFrame
from pyspark.sql.pandas.types import to_arrow_schema

from eomsg.client.broker import Broker
from eomsg.core.message import Outgoing
from eomsg.core.replay import JobRecord, Output, digest, replay_id
from eomsg.core.topics import Matcher, validate_topic
from eomsg.errors import InvalidInput, SinkConflict, StorageError, one_line
from eomsg.spark.transform import KEY_COLUMNS

MANIFEST = "_eomsg_job.json"
SCHEMA_FILE = "_schema.parquet"
LEDGER = "eomsg_replay_ledger"
JOB_COLUMN = "replay_job"
PUBLISH_BATCH = 1000
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


@dataclass(frozen=True)
class Staged:
    """What Spark staged: the directory, rows in all, the output digest."""

    path: Path
    rows: int
    digest: str


def stage(df: DataFrame, path: Path) -> Staged:
    """Write ``df`` into ``path`` (emptied first), one Parquet file per partition."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    schema = to_arrow_schema(df.schema)
    pq.write_table(schema.empty_table(), path / SCHEMA_FILE)
    target = str(path)

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        context = TaskContext.get()
        assert context is not None  # Spark runs this in a task
        index = context.partitionId()
        final = os.path.join(target, f"part-{index:05d}.parquet")
        tmp = f"{final}.{uuid.uuid4().hex}.tmp"
        rows, writer = 0, None
        for batch in batches:
            if writer is None:
                writer = pq.ParquetWriter(tmp, batch.schema)
            writer.write_batch(batch)
            rows += batch.num_rows
        sha = ""
        if writer is not None:
            writer.close()
            with open(tmp, "rb") as f:
                sha = hashlib.file_digest(f, "sha256").hexdigest()
            os.replace(tmp, final)
        yield pa.RecordBatch.from_pylist(
            [{"part": index, "rows": rows, "sha": sha}],
            schema=pa.schema([("part", pa.int32()), ("rows", pa.int64()), ("sha", pa.string())]),
        )

    parts = df.mapInArrow(write, "part INT, rows BIGINT, sha STRING").collect()
    summary = [(r["part"], r["rows"], r["sha"]) for r in parts]
    return Staged(path, sum(r for _, r, _ in summary), digest(summary))


def empty(path: Path) -> Staged:
    """A staging directory for a job whose range holds no message."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return Staged(path, 0, digest([]))


def _made(staged: Staged, made: JobRecord) -> Output:
    """What a sink holds once it took ``staged``, the output of the run ``made``."""
    return Output(staged.rows, staged.digest, made.spec, made.lo, made.hi)


def _ledger_row(output: Output) -> dict[str, Any]:
    """What a manifest (beside the job id) and a ledger row say of the output."""
    return {"rows": output.rows, "digest": output.digest, "spec": output.spec,
            "lo": output.lo, "hi": output.hi}  # fmt: skip


def _output(found: dict[str, Any]) -> Output:
    """An Output from a manifest or ledger row (KeyError, TypeError or ValueError if it
    is not one); one without ``spec`` says nothing of what made it."""
    spec = found.get("spec")
    if spec is not None and not isinstance(spec, dict):
        raise TypeError(f"a spec is an object, not {type(spec).__name__}")
    lo, hi = found.get("lo"), found.get("hi")
    return Output(
        int(found["rows"]),
        str(found["digest"]),
        spec,
        None if lo is None else int(lo),
        None if hi is None else int(hi),
    )


def _parts(path: Path) -> list[Path]:
    return sorted(path.glob("part-*.parquet"))


class Sink(ABC):
    """An output a replay commits to exactly once (see the module docstring)."""

    text: str
    ledger = True  # whether committed() can say what the sink holds for a job

    @abstractmethod
    def staging(self, job_id: str, default_dir: Path) -> Path:
        """Where the job's output is staged."""

    @abstractmethod
    def committed(self, job_id: str) -> Output | None:
        """What the sink holds for ``job_id``, or None (always None without a ledger)."""

    def check(self, patterns: tuple[str, ...]) -> None:  # noqa: B027  (most need none)
        """Refuse, before Spark starts, what this sink could only refuse after the run:
        InvalidInput saying why. ``patterns`` is what the job reads (empty: every topic)."""

    @abstractmethod
    def commit(self, staged: Staged, made: JobRecord, *, node: Broker) -> None:
        """Put the staged output of ``made`` (the run: job id, options, range) in place of
        whatever the sink holds for its job, atomically; a no-op if it holds exactly it."""


class ParquetSink(Sink):
    def __init__(self, text: str, path: Path) -> None:
        self.text, self.path = text, path

    def staging(self, job_id: str, default_dir: Path) -> Path:
        return self.path.parent / f".{self.path.name}.eomsg-staging-{job_id}"

    def _manifest(self) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = json.loads((self.path / MANIFEST).read_text())
            return found
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise SinkConflict(f"{self.path / MANIFEST} is unreadable: {one_line(e)}") from e

    def committed(self, job_id: str) -> Output | None:
        manifest = self._manifest()
        if manifest is None or manifest.get("job_id") != job_id:
            return None
        try:
            return _output(manifest)
        except (KeyError, TypeError, ValueError) as e:
            raise SinkConflict(f"{self.path / MANIFEST} is unreadable: {one_line(e)}") from e

    def commit(self, staged: Staged, made: JobRecord, *, node: Broker) -> None:
        job_id = made.job_id
        if self.committed(job_id) == _made(staged, made):
            shutil.rmtree(staged.path, ignore_errors=True)
            return
        if self.path.exists():
            manifest = self._manifest()
            if manifest is None and any(self.path.iterdir()):
                raise SinkConflict(
                    f"{self.path} holds files that are not a replay's output: "
                    "remove it or choose another directory"
                )
            if manifest is not None and manifest.get("job_id") != job_id:
                raise SinkConflict(
                    f"{self.path} holds the output of replay job {manifest.get('job_id')}: "
                    "remove it or choose another directory"
                )
        (staged.path / SCHEMA_FILE).unlink(missing_ok=True)
        manifest_text = json.dumps({"job_id": job_id, **_ledger_row(_made(staged, made))})
        (staged.path / MANIFEST).write_text(manifest_text + "\n")
        trash = self.path.parent / f".{self.path.name}.eomsg-old-{job_id}"
        shutil.rmtree(trash, ignore_errors=True)
        if self.path.exists():
            os.rename(self.path, trash)
        os.rename(staged.path, self.path)
        shutil.rmtree(trash, ignore_errors=True)


class DuckDBSink(Sink):
    def __init__(self, text: str, path: Path, table: str) -> None:
        self.text, self.path, self.table = text, path, table

    def staging(self, job_id: str, default_dir: Path) -> Path:
        return self.path.parent / f".{self.path.name}.eomsg-staging-{job_id}"

    def _connect(self) -> duckdb.DuckDBPyConnection:
        try:
            return duckdb.connect(str(self.path))
        except duckdb.Error as e:
            raise StorageError(f"cannot open {self.path}: {one_line(e)}") from e

    def check(self, patterns: tuple[str, ...]) -> None:
        """An existing table must take the replay's rows: seq, id, topic and the job
        column, which its commit writes by name."""
        if not self.path.exists():
            return
        with self._connect() as conn:
            found = {
                name
                for (name,) in conn.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_name = ?",
                    [self.table],
                ).fetchall()
            }
        missing = [c for c in (*KEY_COLUMNS, JOB_COLUMN) if found and c not in found]
        if missing:
            raise InvalidInput(
                f"sink {self.text!r}: table {self.table} lacks {', '.join(missing)}, which a "
                "replay writes; name another table (it is created) or add them"
            )

    def committed(self, job_id: str) -> Output | None:
        if not self.path.exists():
            return None
        with self._connect() as conn:
            return self._held(conn, job_id)

    def _held(self, conn: duckdb.DuckDBPyConnection, job_id: str) -> Output | None:
        """The ledger's row of ``job_id`` (a ledger from before it said what made the
        output has no spec, lo or hi columns: such output is no run's); SinkConflict if
        the row cannot be read as one."""
        try:
            cursor = conn.execute(f"SELECT * FROM {LEDGER} WHERE job_id = ?", [job_id])
        except duckdb.CatalogException:
            return None
        row = cursor.fetchone()
        if row is None:
            return None
        found = dict(zip([d[0] for d in cursor.description or ()], row, strict=True))
        try:
            if isinstance(found.get("spec"), str):
                found["spec"] = json.loads(found["spec"])
            return _output(found)
        except (KeyError, TypeError, ValueError) as e:
            raise SinkConflict(
                f"{self.path}: {LEDGER}'s row of job {job_id} is unreadable: {one_line(e)}"
            ) from e

    def commit(self, staged: Staged, made: JobRecord, *, node: Broker) -> None:
        job_id, output = made.job_id, _made(staged, made)
        parts = [str(p) for p in _parts(staged.path)]
        with self._connect() as conn:
            conn.execute("BEGIN TRANSACTION")
            try:
                conn.execute(
                    f"""CREATE TABLE IF NOT EXISTS {LEDGER} (
                           job_id VARCHAR PRIMARY KEY, table_name VARCHAR NOT NULL,
                           rows BIGINT NOT NULL, digest VARCHAR NOT NULL,
                           committed_at TIMESTAMP NOT NULL,
                           spec VARCHAR, lo BIGINT, hi BIGINT)"""
                )
                for column, kind in (("spec", "VARCHAR"), ("lo", "BIGINT"), ("hi", "BIGINT")):
                    conn.execute(f"ALTER TABLE {LEDGER} ADD COLUMN IF NOT EXISTS {column} {kind}")
                if self._held(conn, job_id) == output:
                    conn.execute("ROLLBACK")
                    shutil.rmtree(staged.path, ignore_errors=True)
                    return
                if (staged.path / SCHEMA_FILE).exists():
                    conn.execute(
                        f"""CREATE TABLE IF NOT EXISTS {self.table} AS
                            SELECT *, ''::VARCHAR AS {JOB_COLUMN} FROM read_parquet(?) LIMIT 0""",
                        [str(staged.path / SCHEMA_FILE)],
                    )
                    conn.execute(f"DELETE FROM {self.table} WHERE {JOB_COLUMN} = ?", [job_id])
                if parts:
                    conn.execute(
                        f"""INSERT INTO {self.table} BY NAME
                            SELECT *, ?::VARCHAR AS {JOB_COLUMN} FROM read_parquet(?)""",
                        [job_id, parts],
                    )
                row = _ledger_row(output)
                conn.execute(
                    f"""INSERT OR REPLACE INTO {LEDGER}
                            (job_id, table_name, rows, digest, committed_at, spec, lo, hi)
                        VALUES (?, ?, ?, ?, now()::TIMESTAMP, ?, ?, ?)""",
                    [
                        job_id,
                        self.table,
                        row["rows"],
                        row["digest"],
                        json.dumps(row["spec"]),
                        row["lo"],
                        row["hi"],
                    ],
                )
                conn.execute("COMMIT")
            except duckdb.Error as e:
                with contextlib.suppress(duckdb.Error):  # none left after a failed COMMIT
                    conn.execute("ROLLBACK")
                raise SinkConflict(f"cannot write {self.path}:{self.table}: {one_line(e)}") from e
        shutil.rmtree(staged.path, ignore_errors=True)


def _payload(row: dict[str, Any]) -> bytes:
    """A row as a message payload: its ``payload`` column if it has one, else JSON."""
    if "payload" in row:
        value = row["payload"]
        if isinstance(value, bytes):
            return value
        if isinstance(value, str):
            return value.encode()
        row = {"payload": value}
    return json.dumps(row, default=_json_default, ensure_ascii=False).encode()


def _json_default(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


class TopicSink(Sink):
    ledger = False

    def __init__(self, text: str, topic: str) -> None:
        self.text, self.topic = text, topic

    def staging(self, job_id: str, default_dir: Path) -> Path:
        return default_dir / f"replay-staging-{job_id}"

    def check(self, patterns: tuple[str, ...]) -> None:
        """The output topic must lie outside what the job reads: else a run again would
        replay its own earlier output, and each run add to the next."""
        matcher: Matcher[int] = Matcher()
        for pattern in patterns:
            matcher.add(pattern, 0)
        if not patterns or matcher.match(self.topic):
            read = ", ".join(patterns) if patterns else "every topic"
            raise InvalidInput(
                f"sink {self.text!r}: the job reads {read}, which takes in {self.topic}, so "
                "a run again would replay its own output; publish to a topic it does not read"
            )

    def committed(self, job_id: str) -> Output | None:
        return None  # the node's dedup makes publishing again harmless

    def commit(self, staged: Staged, made: JobRecord, *, node: Broker) -> None:
        job_id = made.job_id
        ordinals: dict[int, int] = {}
        futures = []
        for part in _parts(staged.path):
            for batch in pq.ParquetFile(part).iter_batches(PUBLISH_BATCH):
                out = []
                for row in batch.to_pylist():
                    seq, topic = row.pop("seq"), row.pop("topic")
                    row.pop("id")
                    ordinal = ordinals.get(seq, 0)
                    ordinals[seq] = ordinal + 1
                    headers = {
                        "eomsg-replay-job": job_id,
                        "eomsg-source-seq": str(seq),
                        "eomsg-source-topic": topic,
                    }
                    out.append(
                        Outgoing(
                            self.topic,
                            _payload(row),
                            replay_id(job_id, seq, ordinal),
                            None,
                            headers,
                        )
                    )
                futures.append(node.publish_batch_async(out))
                if len(futures) >= 16:
                    futures.pop(0).result()
        for f in futures:
            f.result()
        shutil.rmtree(staged.path, ignore_errors=True)


def parse_sink(text: str) -> Sink:
    """The sink ``text`` names: ``parquet:DIR``, ``duckdb:PATH:TABLE`` or ``topic:NAME``."""
    kind, sep, rest = text.partition(":")
    if sep and rest:
        if kind == "parquet":
            return ParquetSink(text, Path(rest).absolute())
        if kind == "duckdb":
            path, sep, table = rest.rpartition(":")
            if not sep or not path or not _IDENT.fullmatch(table):
                raise InvalidInput(f"sink {text!r}: use duckdb:PATH:TABLE (TABLE a plain name)")
            if table == LEDGER:
                raise InvalidInput(f"sink {text!r}: {LEDGER} is the ledger's table")
            return DuckDBSink(text, Path(path).absolute(), table)
        if kind == "topic":
            return TopicSink(text, validate_topic(rest))
    raise InvalidInput(f"sink {text!r}: use parquet:DIR, duckdb:PATH:TABLE or topic:NAME")
