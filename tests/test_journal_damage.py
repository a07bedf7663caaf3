"""A damaged journal is refused and reported, never a shorter one served (issue 35, item
1): cut short or flipped anywhere — inside a record, at a record's edge, below and above
what DuckDB applied, a whole segment gone — an open either refuses (exit 13, one line
naming the file, the last good record and what may be lost) or finds every acknowledged
write; `eomsg salvage` keeps what is readable and names what it could not keep."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest

from eomsg.embedded import LocalClient
from eomsg.errors import DataDirDamaged, ExitCode
from eomsg.node.node import NodeSettings
from eomsg.store import journal
from eomsg.store.journal import HEADER, SEGMENT_HEADER, read_segment
from eomsg.store.writer import applied_lsn

from .conftest import Cli, NodeProcess


def test_a_journal_cut_short_after_a_kill_is_refused_and_salvage_names_the_loss(
    cli: Cli, serve: Callable[..., NodeProcess], data_dir: Path
) -> None:
    """The outside tester's steps: 2,000 acknowledged publishes through `eomsg serve`,
    300 confirmed deletes, SIGKILL, `truncate -s 1000` of the journal's segments."""
    cli("queue", "create", "q", "--subscribe", "t/>")
    node = serve()
    lines = b"".join(b"m%d\n" % i for i in range(2000))
    assert (
        b"published 2000 messages (seq 1..2000)"
        in cli("publish", "t/x", "--stdin", input=lines).stdout
    )
    consumed = cli("consume", "q", "--max", "300", "--json").stdout.splitlines()
    assert len(consumed) == 300
    node.kill()
    segments = journal.segments(data_dir / journal.DIR_NAME)
    assert segments
    for _, path in segments:
        os.truncate(path, 1000)

    for command in (("inspect", "queues"), ("serve",)):
        refused = cli(*command, code=ExitCode.DAMAGED)
        err = refused.stderr.decode()
        assert err.count("\n") == 1 and err.startswith(f"Error: {data_dir} is damaged: ")
        assert f"its journal is damaged ({segments[-1][1].name}: " in err
        assert "cut short, 1000 of its 8388608 bytes there" in err
        assert "the last good record is " in err and "(DuckDB holds up to " in err
        assert "are lost: messages published after seq " in err or "are lost: " in err
        assert f"run `eomsg salvage --data {data_dir}`" in err
    assert cli("inspect", "queues", code=ExitCode.DAMAGED).stdout == b""  # changed nothing

    plan = json.loads(cli("salvage", "--dry-run", "--json").stdout)
    assert "cut short" in plan["damage"] and plan["journal_loss"].startswith("acknowledged")
    done = cli("salvage").stdout.decode()
    assert "lost       acknowledged writes in records from " in done
    kept = json.loads(cli("inspect", "sql", "SELECT payload FROM messages", "--json").stdout)
    # What is kept is a prefix of what was acknowledged; the rest was named lost above.
    top = len(kept)
    if top < 2000:
        assert f"messages published after seq {top}" in done, done
    queues = json.loads(cli("inspect", "queues", "--json").stdout)
    assert queues[0]["depth"] + queues[0]["deleted"] == top


# -- every cut and flip of a crashed node's journal ---------------------------------------

WRITER = textwrap.dedent(
    """
    import os, signal, sys
    from eomsg.core.queues import QueueConfig
    from eomsg.embedded import LocalClient
    from eomsg.errors import QueueExists
    from eomsg.node.node import NodeSettings

    data, start, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    delay, crash = float(sys.argv[4]), sys.argv[5] == "crash"
    settings = NodeSettings(tick=None, journal_segment=1024, apply_delay=delay)
    client = LocalClient.open(data, settings)
    try:
        client.create_queue(QueueConfig.create("q", ["t/>"]))
    except QueueExists:
        pass
    for i in range(start, start + count):
        client.publish("t/x", b"m%d" % i + os.urandom(40), id=f"m{i}")
        print(i, flush=True)  # acknowledged
        if i % 4 == 0:
            for d in client.fetch("q", 2):
                client.delete("q", [d.key])
                print("deleted", d.message.id, flush=True)
    if crash:
        os.kill(os.getpid(), signal.SIGKILL)
    client.close()
    """
)


def _write(
    data: Path, start: int, count: int, delay: float, crash: bool
) -> tuple[set[str], set[str]]:
    done = subprocess.run(
        [sys.executable, "-c", WRITER, str(data), str(start), str(count), str(delay),
         "crash" if crash else "close"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == (-signal.SIGKILL if crash else 0), done.stderr[-2000:]
    acked, deleted = set(), set()
    for line in done.stdout.splitlines():
        if line.startswith("deleted"):
            deleted.add(line.split()[1])
        else:
            acked.add(f"m{line}")
    return acked, deleted


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, set[str], set[str]]:
    """A data directory whose node was killed: its journal holds records DuckDB applied
    (the first run closed cleanly: they stay in the segment kept) and records it did not
    (the second run's, applied never: its applier waits an hour), over sealed segments."""
    data = tmp_path_factory.mktemp("crashed") / "data"
    acked, deleted = _write(data, 0, 12, 0.0, crash=False)
    more, gone = _write(data, 100, 24, 3600.0, crash=True)
    return data, acked | more, deleted | gone


def _offsets(path: Path, first: int) -> list[int]:
    """Where to cut or flip a segment: its header, each record's edges and middle (and
    those of a seal), the unused rest just past the last."""
    segment = read_segment(path, first)
    found = [0, 7, SEGMENT_HEADER.size - 1]
    pos = SEGMENT_HEADER.size
    data = path.read_bytes()
    while pos < segment.end:
        length = HEADER.unpack_from(data, pos)[2]
        end = pos + HEADER.size + length
        found += [pos, pos + 10, pos + HEADER.size + length // 2, end - 1]
        pos = end
    return sorted({*found, segment.end, segment.end + 1})


def _opens_intact(data: Path, acked: set[str], deleted: set[str]) -> str:
    """ "refused" or "intact" for the damaged copy ``data``; anything else fails."""
    try:
        client = LocalClient.open(data, NodeSettings(tick=None), create=False)
    except DataDirDamaged as e:
        assert "its journal is damaged" in e.message or "is damaged" in e.message
        return "refused"
    with client:
        stored = {m.id for m in client.node.inspection.log(limit=100_000)}
        assert acked <= stored, f"acknowledged and lost: {sorted(acked - stored)[:5]}"
        again = set()
        while taken := client.fetch("q", 500):
            again |= {d.message.id for d in taken}
            client.delete("q", [d.key for d in taken])
        assert not again & deleted, f"deleted and delivered again: {sorted(again & deleted)}"
    return "intact"


@pytest.mark.slow
def test_every_cut_and_flip_is_refused_or_intact(
    crashed: tuple[Path, set[str], set[str]], tmp_path: Path
) -> None:
    data, acked, deleted = crashed
    files = journal.segments(data / journal.DIR_NAME)
    assert len(files) >= 3 and any(read_segment(p, f).sealed for f, p in files)
    with duckdb.connect(str(data / "eomsg.duckdb"), read_only=True) as db:
        applied = applied_lsn(db)
    # DuckDB holds the first records of the first segment (those of the run that closed
    # cleanly): damage below the applied point and above it. Every segment holds records
    # DuckDB lacks (the others are deleted as soon as it holds them).
    assert files[0][0] <= applied < read_segment(files[0][1], files[0][0]).last_lsn
    outcomes: dict[str, int] = {}
    for n, (first, path) in enumerate(files):
        size = path.stat().st_size
        segment = read_segment(path, first)
        seal = segment.end - HEADER.size if segment.sealed else size
        for offset in _offsets(path, first):
            for how in ("cut", "flip"):
                if offset >= size:
                    continue
                copy = tmp_path / f"{n}-{offset}-{how}"
                shutil.copytree(data, copy)
                target = copy / journal.DIR_NAME / path.name
                if how == "cut":
                    os.truncate(target, offset)
                else:
                    bad = bytearray(target.read_bytes())
                    bad[offset] ^= 0x04
                    target.write_bytes(bytes(bad))
                verdict = f"{how} {_opens_intact(copy, acked, deleted)}"
                if verdict == "cut intact" and offset >= seal:
                    verdict = "seal cut intact"  # its successor says where records go on
                outcomes[verdict] = outcomes.get(verdict, 0) + 1
                shutil.rmtree(copy)
        copy = tmp_path / f"{n}-gone"
        shutil.copytree(data, copy)
        (copy / journal.DIR_NAME / path.name).unlink()
        verdict = f"gone {_opens_intact(copy, acked, deleted)}"
        outcomes[verdict] = outcomes.get(verdict, 0) + 1
        shutil.rmtree(copy)
    # A segment cut or gone refuses the open, wherever (each holds what DuckDB lacks); a
    # flip is refused, or harmless where DuckDB holds the record or in the unused rest.
    assert {"cut intact", "gone intact"}.isdisjoint(outcomes), outcomes
    assert outcomes["flip refused"] and outcomes["flip intact"], outcomes


def test_a_failed_open_changes_nothing(
    crashed: tuple[Path, set[str], set[str]], tmp_path: Path
) -> None:
    """Refused for its journal, an open leaves every file as it found it (DuckDB's WAL
    is not folded into the store as the connection closes), so the next open says the
    same."""
    data, _, _ = crashed
    copy = tmp_path / "copy"
    shutil.copytree(data, copy)
    (_, last), *_ = reversed(journal.segments(copy / journal.DIR_NAME))
    os.truncate(last, 100)
    before = {p.name: p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    with pytest.raises(DataDirDamaged) as first:
        LocalClient.open(copy, create=False)
    after = {p.name: p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    assert before.keys() == after.keys()
    assert [n for n in before if before[n] != after[n] and n != "eomsg.lock"] == []
    with pytest.raises(DataDirDamaged) as second:
        LocalClient.open(copy, create=False)
    assert second.value.message == first.value.message
