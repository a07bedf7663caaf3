"""A damaged or growing store (issue 15, items 9 and 10), by the CLI as an operator meets
it: a write a crash cut off is reported and dropped; a truncated or bit-flipped WAL and a
damaged block are refused loudly (exit 13) and `eomsg salvage` keeps everything still
readable, reporting what was lost, whole even if killed mid-swap; the WAL stays bounded;
`eomsg compact` gives space back, atomically."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from eomsg.core.queues import QueueConfig
from eomsg.errors import ExitCode
from eomsg.node.node import Node, NodeSettings
from eomsg.store import spill, wal

WAL = "eomsg.duckdb.wal"

# Publish N messages with ids m{F}..m{F+N-1} (one DuckDB commit each: applied from the
# journal at once), then die without a checkpoint.
CRASHING_PUBLISHER = textwrap.dedent(
    """
    import os, signal, sys
    from eomsg.core.queues import QueueConfig
    from eomsg.node.node import Node, NodeSettings
    node = Node.open(sys.argv[1], NodeSettings(tick=None, apply_delay=0))
    first = int(sys.argv[4])
    if not first:
        node.admin.create_queue(QueueConfig("q", ("t/>",)))
    for i in range(first, first + int(sys.argv[2])):
        node.ingress.publish("t/x", os.urandom(int(sys.argv[3])), id=f"m{i}")
        node.store.writer.sync()
    node.store.writer.close()  # every mark written
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def crashed_store(data: Path, n: int = 400, size: int = 200, first: int = 0) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CRASHING_PUBLISHER, str(data), str(n), str(size), str(first)]
    )
    assert done.returncode == -signal.SIGKILL
    assert (data / WAL).stat().st_size > 0


def cli(eomsg_bin: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([eomsg_bin, *args], env=env, capture_output=True, text=True, timeout=120)


def ids(eomsg_bin: str, env: dict[str, str]) -> list[str]:
    out = cli(eomsg_bin, env, "inspect", "sql", "SELECT id FROM messages ORDER BY seq", "--json")
    assert out.returncode == 0, out.stderr
    return [row["id"] for row in json.loads(out.stdout)]


def test_a_write_cut_off_by_a_crash_is_reported_and_dropped(
    eomsg_bin: str, cli_env: dict[str, str], data_dir: Path
) -> None:
    crashed_store(data_dir)
    with open(data_dir / WAL, "ab") as f:  # half a record: the next, never acknowledged write
        f.write(struct.pack("<QQ", 4096, 12345) + b"\x64\x00\x1a" + b"\x00" * 100)
    r = cli(eomsg_bin, cli_env, "inspect", "queues", "--json")
    assert r.returncode == 0, r.stderr
    assert "ends with 119 bytes of a write that a crash or power cut interrupted" in r.stderr
    assert json.loads(r.stdout)[0]["depth"] == 400
    assert ids(eomsg_bin, cli_env) == [f"m{i}" for i in range(400)]


@pytest.mark.parametrize(
    "damage", ["truncated", "bit flip", "length flip", "wal deleted", "old store restored"]
)
def test_lost_acknowledged_writes_are_refused_then_salvaged(
    damage: str, eomsg_bin: str, cli_env: dict[str, str], data_dir: Path
) -> None:
    path = data_dir / WAL
    if damage == "old store restored":  # the store and its WAL replaced by an older copy
        crashed_store(data_dir, n=100)
        older = {name: (data_dir / name).read_bytes() for name in ("eomsg.duckdb", WAL)}
        crashed_store(data_dir, n=300, first=100)
        for name, content in older.items():
            (data_dir / name).write_bytes(content)
    else:
        crashed_store(data_dir)
        data = bytearray(path.read_bytes())
        scan = wal.scan(path)
        assert scan is not None and scan.commits > 400
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "bit flip":
        data[len(data) // 2] ^= 0x10
        path.write_bytes(bytes(data))
    elif damage == "length flip":  # DuckDB alone would drop everything after it, silently
        offset = _record_at_middle(bytes(data))
        data[offset + 7] ^= 0x40
        path.write_bytes(bytes(data))
    elif damage == "wal deleted":
        path.unlink()
    r = cli(eomsg_bin, cli_env, "publish", "t/x", "more")
    assert r.returncode == ExitCode.DAMAGED, r.stderr
    assert r.stderr.startswith(f"Error: {data_dir} is damaged: ") and r.stderr.count("\n") == 1
    assert f"run `eomsg salvage --data {data_dir}`" in r.stderr

    dry = cli(eomsg_bin, cli_env, "salvage", "--dry-run", "--json")
    assert dry.returncode == 0 and json.loads(dry.stdout)["damage"]
    assert cli(eomsg_bin, cli_env, "publish", "t/x", "more").returncode == ExitCode.DAMAGED
    done = cli(eomsg_bin, cli_env, "salvage", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    kept = ids(eomsg_bin, cli_env)
    # In order, once each, and every one missing named: an older copy of the store lacks
    # what its journal no longer held (records DuckDB had applied since it was copied).
    gaps = {seq for lo, hi in report["log_gaps"] for seq in range(lo, hi + 1)}
    held = len(kept) + len(gaps)
    assert kept == [f"m{seq - 1}" for seq in range(1, held + 1) if seq not in gaps]
    assert not gaps or damage == "old store restored"
    # (The journal's segment keeps what DuckDB applied of it: salvage may put back all.)
    assert held <= 400
    assert report["acknowledged_seq"] >= 399 and report["last_seq"] == held
    assert Path(report["backup"]).is_dir()  # the damaged files, kept
    assert cli(eomsg_bin, cli_env, "publish", "t/x", "after").returncode == 0
    again = cli(eomsg_bin, cli_env, "salvage")
    assert (again.returncode, again.stdout) == (
        0,
        f"{data_dir} is not damaged: nothing to salvage\n",
    )


def _record_at_middle(data: bytes) -> int:
    """The offset of a record near the middle of a WAL's bytes."""
    version, pos = wal._header(data)
    assert version == wal.VERSION
    while pos < len(data) // 2:
        (size,) = struct.unpack_from("<Q", data, pos)
        pos += 16 + size
    return pos


def test_a_damaged_block_is_refused_and_salvage_keeps_the_other_rows(
    eomsg_bin: str, cli_env: dict[str, str], data_dir: Path
) -> None:
    with Node.open(data_dir, NodeSettings(tick=None)) as node:
        node.ingress.publish_batch(
            [eomsg_outgoing(i, os.urandom(4096)) for i in range(2000)]  # payloads: many blocks
        )
    db = data_dir / "eomsg.duckdb"
    data = bytearray(db.read_bytes())
    block = 12288 + 262144 * (len(data) // 262144 // 2)  # a block of payloads, mid-file
    data[block + 1000] ^= 0x01
    db.write_bytes(bytes(data))
    r = cli(eomsg_bin, cli_env, "inspect", "sql", "SELECT sum(octet_length(payload)) FROM messages")
    assert r.returncode == ExitCode.DAMAGED, r.stderr
    done = cli(eomsg_bin, cli_env, "salvage", "--json")
    assert done.returncode == 0, done.stderr
    # The dedup window's spill file may know ids of the lost messages: it goes, and the
    # next open knows the ids the store kept — a retry of a lost message is taken anew.
    assert not (data_dir / spill.NAME).exists()
    report = json.loads(done.stdout)
    lost = report["lost_rows"].get("messages", 0)
    assert 0 < lost < 2000 and report["tables"]["messages"] == 2000 - lost
    assert (
        cli(eomsg_bin, cli_env, "inspect", "sql", "SELECT count(*) FROM messages").returncode == 0
    )
    kept = set(ids(eomsg_bin, cli_env))
    with Node.open(data_dir, NodeSettings(tick=None)) as node:
        again = node.ingress.publish_batch([eomsg_outgoing(i, b"again") for i in range(2000)])
    assert [r.duplicate for r in again] == [f"m{i}" in kept for i in range(2000)]


def eomsg_outgoing(i: int, payload: bytes) -> object:
    from eomsg.core.message import Outgoing

    return Outgoing("t/x", payload, f"m{i}")


def test_a_salvage_killed_mid_swap_is_finished_by_the_next(
    eomsg_bin: str, cli_env: dict[str, str], data_dir: Path
) -> None:
    crashed_store(data_dir)
    path = data_dir / WAL
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    killed = subprocess.run(
        [eomsg_bin, "salvage"],
        env={**cli_env, "EOMSG_FAILPOINTS": "salvage.swap=crash"},
        capture_output=True,
        text=True,
    )
    assert killed.returncode == -signal.SIGKILL
    r = cli(eomsg_bin, cli_env, "inspect", "queues")
    assert r.returncode == ExitCode.DAMAGED and "a salvage of it was interrupted" in r.stderr
    assert cli(eomsg_bin, cli_env, "salvage").returncode == 0
    kept = ids(eomsg_bin, cli_env)
    assert 0 < len(kept) <= 400 and kept == [f"m{i}" for i in range(len(kept))]


def test_the_wal_stays_within_its_bound(data_dir: Path) -> None:
    """The node checkpoints as soon as its WAL outgrows the bound, whatever holds
    DuckDB's own automatic checkpoint back (here: a reader with a transaction open)."""
    limit = 1 << 20
    with Node.open(data_dir, NodeSettings(tick=None, wal_limit=limit)) as node:
        reader = node.store.reads.cursor()
        reader.execute("BEGIN TRANSACTION READ ONLY")
        reader.execute("SELECT count(*) FROM messages").fetchall()
        largest = 0
        for _ in range(100):
            node.ingress.publish_batch([eomsg_outgoing(0, os.urandom(1024)) for _ in range(100)])
            largest = max(
                largest, (data_dir / WAL).stat().st_size if (data_dir / WAL).exists() else 0
            )
        reader.execute("COMMIT")
    assert largest < limit + (1 << 20), largest  # the bound plus one batch at most


@pytest.mark.slow
def test_compact_gives_space_back_and_a_killed_compaction_changes_nothing(
    eomsg_bin: str, cli_env: dict[str, str], data_dir: Path
) -> None:
    with Node.open(data_dir, NodeSettings(tick=None)) as node:
        node.admin.create_queue(QueueConfig("q1", ("elsewhere/>",)))
        node.ingress.publish_batch([eomsg_outgoing(i, os.urandom(2048)) for i in range(5000)])
    for setting in (("retention", "0"), ("gc-interval", "0"), ("retention", "7d")):
        assert cli(eomsg_bin, cli_env, "config", "set", *setting).returncode == 0  # collects
    assert cli(eomsg_bin, cli_env, "publish", "t/keep", "kept", "--id", "keep").returncode == 0
    before = (data_dir / "eomsg.duckdb").stat().st_size
    killed = subprocess.run(
        [eomsg_bin, "compact"],
        env={**cli_env, "EOMSG_FAILPOINTS": "compact.before_swap=crash"},
        capture_output=True,
    )
    assert killed.returncode == -signal.SIGKILL
    assert (data_dir / "eomsg.duckdb").stat().st_size == before  # the old store, whole
    assert ids(eomsg_bin, cli_env) == ["keep"]
    assert not list(data_dir.glob("eomsg.duckdb.compact*"))  # the half copy is gone
    done = cli(eomsg_bin, cli_env, "compact", "--json")
    assert done.returncode == 0, done.stderr
    sizes = json.loads(done.stdout)
    assert sizes["after"] < before / 4 and sizes["freed"] == sizes["before"] - sizes["after"]
    assert ids(eomsg_bin, cli_env) == ["keep"]
    r = cli(eomsg_bin, cli_env, "publish", "t/keep", "again", "--id", "keep")
    assert "duplicate of seq" in r.stdout  # its publish id survived the copy
    assert cli(eomsg_bin, cli_env, "queue", "create", "q2", "-s", "t/>").returncode == 0
    queues = cli(eomsg_bin, cli_env, "inspect", "sql", "SELECT queue_id FROM queues", "--json")
    assert len({q["queue_id"] for q in json.loads(queues.stdout)}) == 2  # the id sequence went on


def test_compact_and_salvage_need_the_node_stopped(
    serve: object, eomsg_bin: str, cli_env: dict[str, str]
) -> None:
    serve()  # type: ignore[operator]
    for command in ("compact", "salvage"):
        r = cli(eomsg_bin, cli_env, command)
        assert r.returncode == ExitCode.DATA_DIR
        assert r.stderr.startswith("Error: data directory ") and "stop it first" in r.stderr


def test_a_publish_past_the_wal_bound_checkpoints_and_says_nothing(
    eomsg_bin: str, cli_env: dict[str, str], data_dir: Path, tmp_path: Path
) -> None:
    """Issue 35, item 12: each big embedded publish printed DuckDB's "Cannot CHECKPOINT:
    there are other write transactions active" (a result the open left unread kept its
    transaction open, and blocked every checkpoint: the WAL grew past its bound)."""
    assert cli(eomsg_bin, cli_env, "config", "set", "max-payload", "32MiB").returncode == 0
    assert cli(eomsg_bin, cli_env, "queue", "create", "bigq", "-s", "big").returncode == 0
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(20 << 20))  # past the WAL's 16 MiB bound
    for _ in range(2):
        with open(big, "rb") as f:
            done = subprocess.run(
                [eomsg_bin, "publish", "big", "-"], env=cli_env, stdin=f, capture_output=True,
                text=True, timeout=120,
            )  # fmt: skip
        assert (done.returncode, done.stderr) == (0, ""), done.stderr
    with Node.open(data_dir, NodeSettings(tick=None)) as node:
        node.ingress.publish("big", os.urandom(20 << 20))
        node.store.writer.sync()
        wal = data_dir / WAL  # checkpointed behind the commit
        assert not wal.exists() or wal.stat().st_size < 16 << 20


def test_a_store_file_cut_short_is_damage_and_its_open_changes_nothing(
    eomsg_bin: str, cli_env: dict[str, str], data_dir: Path
) -> None:
    """Issue 35, item 2: DuckDB's "could not read enough bytes" was exit 6 (a data
    directory error) rather than 13, and a failed open folded the WAL into the store, so
    the next open said something else."""
    with Node.open(data_dir, NodeSettings(tick=None)) as node:  # blocks in the file
        node.admin.create_queue(QueueConfig("held", ("t/>",)))
        node.ingress.publish_batch([eomsg_outgoing(i, os.urandom(300)) for i in range(4500)])
    crashed_store(data_dir, n=50)  # and a WAL beside it
    store = data_dir / "eomsg.duckdb"
    os.truncate(store, 200_000)  # into its first blocks
    before = {p.name: p.read_bytes() for p in data_dir.iterdir() if p.is_file()}
    first = cli(eomsg_bin, cli_env, "inspect", "queues")
    assert first.returncode == ExitCode.DAMAGED, first.stderr
    assert "could not read enough bytes" in first.stderr.lower()
    after = {p.name: p.read_bytes() for p in data_dir.iterdir() if p.is_file()}
    assert [n for n in before if before[n] != after.get(n) and n != "eomsg.lock"] == []
    assert cli(eomsg_bin, cli_env, "inspect", "queues").stderr == first.stderr


def test_salvage_finds_the_rows_of_a_damaged_block_whatever_the_row_groups_size(
    tmp_path: Path,
) -> None:
    """A file eomsg wrote before it gave its row group size holds DuckDB's row groups of
    122,880 rows, then the node's of 16,384: the rows a damaged block held are found
    from the sizes of the row groups before it, not from either size."""
    import duckdb

    from eomsg.store import integrity, salvage
    from eomsg.store.opening import ROW_GROUP_ROWS

    path = tmp_path / "mixed.duckdb"
    rows_of = "SELECT range, repeat(md5(range::VARCHAR), 4) FROM range({}, {})"
    with duckdb.connect(str(path)) as db:  # as an older eomsg wrote it
        db.execute("CREATE TABLE t (a BIGINT, p VARCHAR)")
        db.execute("INSERT INTO t " + rows_of.format(0, 130000))
    with duckdb.connect() as db:  # as the node writes it now
        db.execute(f"ATTACH '{path}' AS m (ROW_GROUP_SIZE {ROW_GROUP_ROWS})")
        db.execute("INSERT INTO m.t " + rows_of.format(130000, 170000))
        db.execute("CHECKPOINT m")
        sizes = db.execute(
            "SELECT row_group_id, max(start + count) FROM pragma_storage_info('m.t') "
            "GROUP BY ALL ORDER BY 1"
        ).fetchall()
        # A block of the payloads of row group 2, which starts at row 139,264.
        block, start, count = db.execute(
            "SELECT block_id, start, count FROM pragma_storage_info('m.t') "
            "WHERE row_group_id = 2 AND column_name = 'p' AND block_id >= 0 LIMIT 1"
        ).fetchone() or (0, 0, 0)
    assert [n for _, n in sizes] == [122_880, 16_384, 16_384, 14_352]
    data = bytearray(path.read_bytes())
    location = integrity.HEADERS + int(block) * salvage.BLOCK
    data[location + 100] ^= 0xFF
    path.write_bytes(bytes(data))
    with duckdb.connect(str(path), read_only=True) as db:
        found, rows = salvage._first_bad_block(db)
    assert found == location
    assert salvage._merged(rows) == [("t", 139_264 + start, 139_264 + start + count)]
