"""The publish dedup window (seed 001) against a model: ids published since open (in
dictionaries) and ids the store held at open (sorted columns) answer alike, through
expiry, garbage collection, restarts and ids whose hashes collide."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import duckdb
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from eomsg.core import dedup as dedup_module
from eomsg.core import idruns as idruns_module
from eomsg.core.dedup import DedupWindow
from eomsg.core.idhash import id_hash
from eomsg.core.idruns import HashBitmap, RetainedIds, hashes_of
from eomsg.core.message import Outgoing
from eomsg.errors import StorageError
from eomsg.node import dedup as node_dedup_module
from eomsg.node.dedup import Deduplication
from eomsg.store import salvage
from eomsg.store import spill as spill_module
from eomsg.store.files import DB_NAME
from eomsg.store.spill import SpilledIds
from tests.conftest import FakeClock, NodeFactory

# "plumless" and "buckeroo" share a CRC-32: a match on the hash alone would confuse them.
IDS = ("plumless", "buckeroo", "a", "b", "c", "ü-é", "x" * 300)


@given(
    st.lists(st.integers(0, 2**32 - 1), max_size=40),
    st.lists(st.integers(0, 2**32 - 1), max_size=40),
    st.integers(1, 6),
)
def test_a_filter_never_rules_out_a_hash_it_was_given(
    marked: list[int], others: list[int], probes: int
) -> None:
    f = HashBitmap(64, probes)
    f.mark(np.array(marked, np.uint32))
    asked = np.array(marked + others, np.uint32)
    answers = f.maybe(asked)
    assert all(answers[: len(marked)])
    one_by_one = [a for k in range(0, len(asked), 8) for a in f.maybe(asked[k : k + 8])]
    assert one_by_one == answers  # a few at a time, as many as arrays: the same answers


def test_more_probes_rule_out_more_new_hashes() -> None:
    """At twelve bits an id — the spill's filter with eleven million ids — four probes
    let 0.6 % of new hashes through where one let 8 % (each one a query per partition)."""
    rng = np.random.default_rng(35)
    marked = rng.integers(0, 2**32, 43_690, dtype=np.uint64).astype(np.uint32)
    new = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    passed = {}
    for probes in (1, 4):
        f = HashBitmap(1 << 16, probes)  # 2^19 bits: 12 an id
        f.mark(marked)
        passed[probes] = np.mean(f.maybe(new))
    assert 0.06 < passed[1] < 0.10
    assert 0.002 < passed[4] < 0.012
    with pytest.raises(ValueError, match="1 to 6 probes, not 7"):
        HashBitmap(64, 7)


def test_colliding_ids_are_told_apart() -> None:
    assert id_hash("plumless") == id_hash("buckeroo")
    w = DedupWindow(RetainedIds.of(["plumless"], [1], [None]))
    assert w.lookup_many(["buckeroo", "plumless"], 0.0) == {"plumless": 1}


class Window(RuleBasedStateMachine):
    """Every rule keeps a model: id -> (seq, expiry or None), and the GC horizon."""

    def __init__(self) -> None:
        super().__init__()
        self.window = DedupWindow()
        self.model: dict[str, tuple[int, float | None]] = {}
        self.now = 1000.0
        self.seq = 1
        self.horizon = 0

    def live(self, msg_id: str) -> int | None:
        entry = self.model.get(msg_id)
        if entry is None:
            return None
        seq, expires = entry
        if expires is None:
            return seq if seq >= self.horizon else None
        return seq if expires > self.now else None

    @rule(
        ids=st.lists(st.sampled_from(IDS), min_size=1, max_size=4), ttl=st.none() | st.floats(1, 50)
    )
    def publish(self, ids: list[str], ttl: float | None) -> None:
        """What ingress does: look the batch up, publish the ids not found."""
        found = self.window.lookup_many(ids, self.now)
        assert found == {i: s for i in ids if (s := self.live(i)) is not None}
        expires = None if ttl is None else self.now + ttl
        fresh = list(dict.fromkeys(i for i in ids if i not in found))
        seqs = list(range(self.seq, self.seq + len(fresh)))
        self.seq += len(fresh)
        self.window.remember_many(fresh, seqs, [expires] * len(fresh))
        for i, s in zip(fresh, seqs, strict=True):
            self.model[i] = (s, expires)

    @rule(dt=st.floats(0, 30))
    def advance(self, dt: float) -> None:
        self.now += dt

    @rule()
    def expire(self) -> None:
        self.window.expire(self.now)

    @rule(back=st.integers(0, 5))
    def collect_garbage(self, back: int) -> None:
        self.horizon = max(self.horizon, self.seq - back)
        self.window.forget_below(self.horizon)

    @rule()
    def restart(self) -> None:
        """What the store keeps (GC deleted the rest) and loads (what can still live)."""
        kept = [(i, s, e) for i, (s, e) in self.model.items() if self.live(i) is not None]
        ids, seqs, expires = (list(c) for c in zip(*kept, strict=True)) if kept else ([], [], [])
        self.window = DedupWindow(RetainedIds.of(ids, seqs, expires))

    @invariant()
    def answers_as_the_model(self) -> None:
        for msg_id in IDS:
            assert self.window.lookup(msg_id, self.now) == self.live(msg_id), msg_id


TestWindow = Window.TestCase
TestWindow.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)


# Runs, merges and partitions of a few ids; merged runs of several chunks.
TINY = (
    (dedup_module, "FOLD", 2),
    (dedup_module, "LARGEST_MERGE", 8),
    (idruns_module, "MERGE_SLICE", 3),
    (spill_module, "PART_ROWS", 3),
)


class Spilling(Window):
    """The same model, the window folding (tiny runs here) and spilling its oldest runs
    to disk (:mod:`eomsg.store.spill`) as a node's does past its budget — into tiny
    partitions, dropped as they die — through restarts that reopen the spill file and
    read back what it does not cover."""

    def __init__(self) -> None:
        super().__init__()
        self.saved = [(module, name, getattr(module, name)) for module, name, _ in TINY]
        for module, name, value in TINY:
            setattr(module, name, value)
        self.dir = Path(tempfile.mkdtemp())
        self.spill = SpilledIds(self.dir)
        self.spill.start_filter(4096)  # the smallest: 32,768 bits, so hashes collide
        self.lock = threading.Lock()
        self.window = Deduplication(DedupWindow(), self.spill, 0, self.lock)  # type: ignore[assignment]

    def teardown(self) -> None:
        for module, name, value in self.saved:
            setattr(module, name, value)
        self.spill.close()
        shutil.rmtree(self.dir)

    @rule()
    def expire(self) -> None:
        self.window.collect(self.horizon, self.now)  # type: ignore[attr-defined]

    @rule(back=st.integers(0, 5))
    def collect_garbage(self, back: int) -> None:
        self.horizon = max(self.horizon, self.seq - back)
        self.window.collect(self.horizon, self.now)  # type: ignore[attr-defined]

    @rule()
    def spill_over(self) -> None:
        self.window.spill_over()  # type: ignore[attr-defined]  # a budget of 0: all runs but one

    @rule()
    def fill_filter(self) -> None:
        self.window.fill_filter()  # type: ignore[attr-defined]

    @rule()
    def restart(self) -> None:
        """What a node's open does: the spill file as it is, the live ids it does not
        cover read back into memory."""
        self.spill.close()
        self.spill = SpilledIds(self.dir)
        self.spill.start_filter(4096)  # (it answers once filled: every lookup goes to SQLite)
        kept = [
            (i, s, e)
            for i, (s, e) in self.model.items()
            if self.live(i) is not None and s >= self.spill.covered
        ]
        ids, seqs, expires = (list(c) for c in zip(*kept, strict=True)) if kept else ([], [], [])
        window = DedupWindow(spilled=len(self.spill) > 0)
        window.add_run(RetainedIds.of(ids, seqs, expires))
        window.forget_below(self.horizon)
        self.window = Deduplication(window, self.spill, 0, self.lock)  # type: ignore[assignment]

    @invariant()
    def answers_as_the_model(self) -> None:
        for msg_id in IDS:
            found = self.window.lookup_many([msg_id], self.now).get(msg_id)
            assert found == self.live(msg_id), msg_id


TestSpilling = Spilling.TestCase
TestSpilling.settings = settings(max_examples=100, stateful_step_count=50, deadline=None)


def back_to_schema_4(db: duckdb.DuckDBPyConnection) -> None:
    """Undo migrations 5 (the ids' hash), 6 (principals, grants, audit), 7 (route
    runs: none here) and 8 (delivery runs: none here)."""
    db.execute("ALTER TABLE publish_ids DROP COLUMN h")
    db.execute("ALTER TABLE txn_log DROP COLUMN principal")
    for table in ("principals", "grants", "audit", "route_runs", "delivery_runs"):
        db.execute(f"DROP TABLE {table}")
    db.execute("DELETE FROM schema_migrations WHERE version >= 5")


def test_a_store_from_before_the_hash_is_migrated(open_node: NodeFactory, data_dir: Path) -> None:
    """A data directory whose publish ids have no hash yet (schema 4) gets them at open,
    and a retry of what it holds is still recognised."""
    node = open_node()
    first = node.ingress.publish_batch(
        [Outgoing("orders/a", b"x", id=f"id-{i}") for i in range(100)]
    )
    node.close()
    with duckdb.connect(str(data_dir / DB_NAME)) as db:
        back_to_schema_4(db)
    node = open_node()
    again = node.ingress.publish_batch(
        [Outgoing("orders/a", b"x", id=f"id-{i}") for i in range(100)]
    )
    assert [r.seq for r in again] == [r.seq for r in first] and all(r.duplicate for r in again)
    rows = node.store.reads.rows("SELECT count(*) FROM publish_ids WHERE h IS NULL")
    assert rows == [(0,)]


def test_a_store_from_before_the_hash_is_salvaged_with_its_ids(
    open_node: NodeFactory, data_dir: Path
) -> None:
    """Salvage copies a damaged schema-4 store into a schema-5 one: the ids come across,
    hashed, and a retry of a message it kept is still recognised — one of a message it
    lost (the damaged block's) is taken anew."""
    node = open_node()
    n = 2000
    first = node.ingress.publish_batch(  # random payloads: many blocks, one of them damaged below
        [Outgoing("orders/a", os.urandom(4096), id=f"id-{i}") for i in range(n)]
    )
    node.close()
    with duckdb.connect(str(data_dir / DB_NAME)) as db:
        back_to_schema_4(db)
        db.execute("CHECKPOINT")
    db_file = data_dir / DB_NAME
    data = bytearray(db_file.read_bytes())
    data[12288 + 262144 * (len(data) // 262144 // 2) + 1000] ^= 0x01  # a block of payloads
    db_file.write_bytes(bytes(data))
    done = salvage.execute(salvage.plan(data_dir))
    assert "publish_ids" not in done.lost_rows and done.tables["publish_ids"] == n
    node = open_node()
    held = {seq for (seq,) in node.store.query("SELECT seq FROM messages")[1]}
    assert 0 < len(held) < n
    again = node.ingress.publish_batch([Outgoing("orders/a", b"x", id=f"id-{i}") for i in range(n)])
    assert [r.duplicate for r in again] == [r.seq in held for r in first]
    assert all(a.seq == f.seq for a, f in zip(again, first, strict=True) if f.seq in held)


MERGE_MEMORY = """
import numpy as np, pyarrow as pa
from eomsg.core.idruns import RetainedIds, hashes_of
runs = []
for r in range(4):  # four runs of 2^18 ids, each in chunks as DuckDB hands them over
    ids = [f"{r}-{i:012d}-{'x' * 24}" for i in range(1 << 18)]
    run = RetainedIds.of(ids, range(r << 18, (r + 1) << 18), [None] * len(ids))
    runs.append(RetainedIds(run.hashes, run.seqs, run.expires,
                            pa.chunked_array(run.ids.chunk(0).slice(k, 65536)
                                             for k in range(0, 1 << 18, 65536))))
    del ids, run
held = pa.total_allocated_bytes()  # the runs' ids
merged = RetainedIds.merged(runs)
result = pa.total_allocated_bytes() - held
spilled = [merged.ids_at(np.arange(k, min(k + 50_000, len(merged)))) for k in (0, 500_000)]
print(held, result, pa.default_memory_pool().max_memory())
assert sorted(merged.ids.to_pylist()) == sorted(i for r in runs for i in r.ids.to_pylist())
assert (hashes_of(merged.ids.to_pylist()) == merged.hashes).all()
assert spilled[1].to_pylist() == merged.ids.to_pylist()[500_000:550_000]
"""


@pytest.mark.parametrize("few", [None, 0, 7], ids=["rows", "runs", "rows-then-runs"])
def test_a_reopened_node_knows_its_ids_whether_read_as_rows_or_as_runs(
    open_node: NodeFactory, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, few: int | None
) -> None:
    """Up to FEW_IDS live ids are read back into the window's dictionaries at open, more
    as runs: either way a retry after a restart is a duplicate of its first seq while
    its message can live, and new once its time to live has run out."""
    if few is not None:
        monkeypatch.setattr(node_dedup_module, "FEW_IDS", few)
    node = open_node()
    ttls = [None, 5.0, 60.0, None, 5.0, None, 3600.0, None, 60.0, None, None, 5.0]
    first = node.ingress.publish_batch(
        [Outgoing("orders/a", b"x", id=f"id-{i}", ttl=ttl) for i, ttl in enumerate(ttls)]
    )
    node.close()
    clock.advance(10)  # those of 5 s are dead; the rest live
    node = open_node()
    again = node.ingress.publish_batch(
        [Outgoing("orders/a", b"y", id=f"id-{i}") for i in range(len(ttls) + 2)]
    )
    for i, result in enumerate(again):
        if i < len(ttls) and ttls[i] != 5.0:
            assert result.duplicate and result.seq == first[i].seq, i
        else:
            assert not result.duplicate and result.seq > first[-1].seq, i


def test_a_merge_holds_no_copy_of_all_the_runs_ids_in_one() -> None:
    """Merging four runs holds the runs, the merged run and a slice: Arrow's take over a
    chunked array would first copy every chunk into one (half as much again at its peak,
    in the node's RSS at every merge); nor does spilling a few rows copy the run."""
    out = subprocess.run(
        [sys.executable, "-c", MERGE_MEMORY], capture_output=True, text=True, check=True
    ).stdout
    held, result, peak = map(int, out.split())
    assert result == pytest.approx(held, rel=0.05)
    assert peak < 2 * held + held // 4, (held, peak)  # a take over the chunks: 3 * held


def test_a_run_spilled_again_is_counted_once(tmp_path: Path) -> None:
    """The window merged or swept its oldest run while it was being written: the next
    spill writes those ids again (idempotent), and the count of ids on disk stays true."""
    spill = SpilledIds(tmp_path)
    try:
        first = RetainedIds.of(["a", "b"], [1, 2], [None, None])
        spill.add(first)
        spill.add(RetainedIds.merged([first, RetainedIds.of(["c"], [3], [None])]))
        assert len(spill) == 3 and spill.covered == 4
    finally:
        spill.close()
    again = SpilledIds(tmp_path)
    try:
        assert len(again) == 3
    finally:
        again.close()


def test_the_spills_filter_spares_new_ids_the_disk_and_answers_once_filled(
    tmp_path: Path,
) -> None:
    """Ids looked up that were never spilled mostly cost no SQLite query; after an open
    every lookup queries until the filter has read the file, and then again few do —
    and a spilled id is found all along."""
    spill = SpilledIds(tmp_path)
    spill.start_filter(4096)  # 32,768 bits for 1,000 ids: about 3 % false "maybe"s
    spill.add(RetainedIds.of([f"old-{i}" for i in range(1000)], range(1, 1001), [None] * 1000))
    for opened in ("made", "reopened"):
        queries: list[str] = []
        spill._reader.set_trace_callback(queries.append)
        assert all(not spill.find([f"new-{i}"], 0.0, 0) for i in range(200))
        assert spill.find(["old-7"], 0.0, 0) == {"old-7": 8}
        selects = sum(q.startswith("SELECT id") for q in queries)
        assert selects <= 30, (opened, selects)
        spill.close()
        spill = SpilledIds(tmp_path)
        spill.start_filter(4096)
        queries = []
        spill._reader.set_trace_callback(queries.append)
        assert not spill.find(["new-0"], 0.0, 0) and spill.find(["old-7"], 0.0, 0)
        assert sum(q.startswith("SELECT id") for q in queries) == 2  # not filled: SQLite
        assert spill.fill_filter()  # one chunk holds them all
    spill.close()


def test_a_spill_filter_filled_past_its_probes_is_read_anew_with_fewer(tmp_path: Path) -> None:
    """Four probes an id rule out the most while a filter holds few ids for its bits;
    once it is full enough that fewer do, it is read anew with fewer (the old one
    answering meanwhile), and a spilled id is found all along."""
    spill = SpilledIds(tmp_path)
    spill.start_filter(4096)  # 32,768 bits, made with the first run (numpy not yet needed)
    assert spill._filter is None and spill.filter_bytes == 4096
    ids = [f"old-{i}" for i in range(20_000)]  # 1.6 bits an id: one probe does best
    spill.add(RetainedIds.of(ids, range(1, 20_001), [None] * 20_000))
    assert spill._filter is not None and spill._filter.probes == 4  # made with four
    assert spill.filter_bytes == 2 * 4096  # the four-probe one and the one-probe filling
    assert spill._filling is not None and spill._filling.probes == 1
    assert spill.find(["old-7"], 0.0, 0) == {"old-7": 8}  # the old filter answers
    while not spill.fill_filter():
        pass
    assert spill._filter.probes == 1 and spill._filling is None
    assert spill.find(ids[::997], 0.0, 0) == {i: int(i[4:]) + 1 for i in ids[::997]}
    new = hashes_of([f"new-{i}" for i in range(10_000)])
    four = HashBitmap(4096, 4)
    four.mark(hashes_of(ids))
    assert np.mean(spill._filter.maybe(new)) < np.mean(four.maybe(new)) - 0.1  # 52 % vs 68 %
    spill.close()


def test_spilled_ids_fill_partitions_that_go_whole_once_dead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs go into partitions of about PART_ROWS ids, by seq; each is looked up, newest
    first; garbage collection drops a partition only once every id in it is dead (one
    with a time to live still running stays), and the filter is then read anew from
    what is left — the old one answering meanwhile — and lets fewer lookups through."""
    monkeypatch.setattr(spill_module, "PART_ROWS", 1000)
    spill = SpilledIds(tmp_path)
    spill.start_filter(4096)
    for r in range(5):
        seqs = range(1 + 1000 * r, 1001 + 1000 * r)
        ttl = [2000.0 if r == 1 and s == 1500 else None for s in seqs]  # one in run 2
        spill.add(RetainedIds.of([f"id-{s}" for s in seqs], seqs, ttl))
    assert spill.partitions == 5 and len(spill) == 5000 and spill.covered == 5001
    assert spill.find(["id-1", "id-1500", "id-4999", "id-0"], 1000.0, 0) == {
        "id-1": 1,
        "id-1500": 1500,
        "id-4999": 4999,
    }
    # Below the horizon: partition 1 goes; partition 2 stays for its id with a ttl.
    assert spill.forget_below(2600, 1000.0) == 1000
    assert spill.partitions == 4 and len(spill) == 4000
    tables = {n for (n,) in spill._db.execute("SELECT name FROM sqlite_master")}
    assert "part_1" not in tables and {"part_2", "part_5"} <= tables
    assert spill.find(["id-1500", "id-1501", "id-2700"], 1000.0, 2600) == {
        "id-1500": 1500,
        "id-2700": 2700,
    }
    assert spill.filter_bytes == 2 * 4096  # the old one answers while the new one fills
    while not spill.fill_filter():
        pass
    assert spill.filter_bytes == 4096
    assert spill.forget_below(2600, 2000.0) == 1000  # its ttl ran out: partition 2 goes
    spill.close()
    again = SpilledIds(tmp_path)  # what was dropped stays dropped
    try:
        assert again.partitions == 3 and len(again) == 3000 and again.covered == 5001
        assert again.find(["id-1500", "id-3000"], 2000.0, 2600) == {"id-3000": 3000}
    finally:
        again.close()


def test_a_spill_file_an_older_eomsg_wrote_is_made_anew(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One table of every id (before partitions): not read, emptied; the node's open
    then loads every live id from the store."""
    with sqlite3.connect(tmp_path / spill_module.NAME) as db:
        db.execute("CREATE TABLE ids (seq INTEGER PRIMARY KEY, h INTEGER, id TEXT, expires REAL)")
        db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)")
        db.execute("INSERT INTO ids VALUES (1, 5, 'a', NULL)")
        db.execute("INSERT INTO meta VALUES ('covered', 2)")
    spill = SpilledIds(tmp_path)
    try:
        assert len(spill) == 0 and spill.covered == 0 and spill.find(["a"], 0.0, 0) == {}
        assert "written by an older eomsg" in caplog.text
    finally:
        spill.close()


def test_most_new_ids_are_searched_for_in_no_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bitmap of the runs' hashes rules out most ids never published, so a lookup of
    one does not search every run (what made the in-memory window a third of a busy
    node's time) — and an id a run holds is found all along."""
    window = DedupWindow()
    for r in range(4):
        seqs = range(1 + 1000 * r, 1001 + 1000 * r)
        window.add_run(RetainedIds.of([f"id-{s}" for s in seqs], seqs, [None] * 1000))
    searched = 0
    find = RetainedIds.find

    def counted(run: RetainedIds, *args: object, **kwargs: object) -> dict[str, int]:
        nonlocal searched
        searched += 1
        return find(run, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(RetainedIds, "find", counted)
    assert not any(window.lookup(f"new-{i}", 0.0) for i in range(1000))
    assert searched < 400  # without the filter: 4,000 (4 runs for each id)
    assert [window.lookup(f"id-{s}", 0.0) for s in (1, 1999, 4000)] == [1, 1999, 4000]
    assert window.lookup_many([f"id-{s}" for s in range(1, 4001, 7)] + ["new"], 0.0) == {
        f"id-{s}": s for s in range(1, 4001, 7)
    }


def test_a_spill_is_a_few_statements_not_a_step_a_row(tmp_path: Path) -> None:
    """Python's sqlite3 lets go of the GIL at each step: a row a step, the spilling
    thread won it back from a busy event loop a row at a time (65,536 rows took 136 s
    beside a busy thread). A run goes in as a JSON array a chunk, and a filter reads
    hashes the same way."""
    spill = SpilledIds(tmp_path)
    try:
        n = 3 * spill_module.CHUNK
        statements: list[str] = []
        spill._db.set_trace_callback(statements.append)
        spill.add(RetainedIds.of([f"id-{i}" for i in range(n)], range(1, n + 1), [None] * n))
        assert len(spill) == n and len(statements) <= 12, len(statements)
        spill.close()
        spill = SpilledIds(tmp_path)
        spill.start_filter(1 << 20)
        statements = []
        spill._reader.set_trace_callback(statements.append)  # type: ignore[union-attr]
        while not spill.fill_filter():
            pass
        assert len(statements) <= 5, len(statements)
        assert spill.find(["id-7", "new"], 0.0, 0) == {"id-7": 8}
    finally:
        spill.close()


def test_a_spill_file_missing_a_partition_is_made_anew_and_a_failure_is_a_storage_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A partition ``parts`` lists but the file lacks: at open the file is made anew (the
    node then reads every live id from the store); while open, what SQLite raises reaches
    the caller as a StorageError naming the file — the node's maintenance logs it and
    tries again — never as SQLite's own exception."""
    spill = SpilledIds(tmp_path)
    spill.add(RetainedIds.of(["a", "b"], [1, 2], [None, None]))
    with sqlite3.connect(tmp_path / spill_module.NAME) as db:
        db.execute("DROP TABLE part_1")
    with pytest.raises(StorageError, match=r"the dedup spill .* failed: no such table"):
        spill.find(["a"], 0.0, 0)
    with pytest.raises(StorageError, match="no such table"):
        spill.add(RetainedIds.of(["c"], [3], [None]))
    spill.close()
    again = SpilledIds(tmp_path)
    try:
        assert len(again) == 0 and again.covered == 0
        assert "part_1, listed in parts, is missing" in caplog.text
    finally:
        again.close()
