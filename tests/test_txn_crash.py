"""Seed 000 under crashes: a real node (``eomsg serve``) and a real copier process
(``scripts/copier.py``: queue ``a`` → table ``copied`` + topic ``b``, one transaction per
message), killed with SIGKILL by a failpoint at each step of two-phase commit, in each
role, with the application's table in DuckDB (commit-markable) and in PostgreSQL (which
prepares) — and the PostgreSQL server itself crashed mid-copy. After recovery (``eomsg
recover``, then the copier again) the application table and the queues must agree:
every message copied exactly once, nothing left in doubt."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import psycopg
import pytest

import eomsg
from scripts.pgcluster import Cluster, server_bin
from tests.conftest import NodeProcess, missing_service, queue_depth, wait_stopped

pytestmark = pytest.mark.slow

COPIER = Path(__file__).parent.parent / "scripts" / "copier.py"
N = 4
PAYLOADS = {f"m{i}".encode() for i in range(1, N + 1)}

# (role, failpoint): the process that dies, and where. "@2": in the second transaction,
# so one transaction has completed cleanly before the crash. The "resource" points run in
# the coordinator's process, where it speaks to the application's database.
CASES = [
    ("coordinator", "coordinator.before_prepare"),
    ("coordinator", "coordinator.after_prepare"),
    ("coordinator", "coordinator.after_decision"),
    ("coordinator", "coordinator.before_forget"),
    ("resource", "resource.before_commit"),
    ("resource", "resource.after_commit"),
    ("node", "txn.prepare.before_commit"),
    ("node", "txn.prepare.after_commit"),
    ("node", "txn.commit.before_commit"),
    ("node", "txn.commit.after_commit"),
]
# Only a database that prepares has these steps: PREPARE TRANSACTION, COMMIT PREPARED.
PREPARE_CASES = [
    ("resource", "resource.before_prepare"),
    ("resource", "resource.after_prepare"),
    ("resource", "resource.before_finish"),
    ("resource", "resource.after_finish"),
]
MATRIX = [("duckdb", *c) for c in CASES] + [("postgresql", *c) for c in CASES + PREPARE_CASES]


class App:
    """The copier's application database: how the copier is told, and what it holds."""

    def __init__(self, args: list[str], read: Callable[[], list[bytes]]) -> None:
        self.args = args
        self.read = read


@pytest.fixture(params=["duckdb", "postgresql"])
def app(request: pytest.FixtureRequest, tmp_path: Path) -> App:
    return _app(request.param, tmp_path, request)


def _app(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> App:
    if kind == "duckdb":
        path = tmp_path / "app.duckdb"

        def read_duckdb() -> list[bytes]:
            with duckdb.connect(str(path)) as db:
                return [bytes(r[0]) for r in db.execute("SELECT payload FROM copied").fetchall()]

        return App(["--app", str(path)], read_duckdb)
    dsn: str = request.getfixturevalue("pg_dsn")

    def read_pg() -> list[bytes]:
        with psycopg.connect(dsn) as db:
            return [bytes(r[0]) for r in db.execute("SELECT payload FROM copied").fetchall()]

    return App(["--pg", dsn], read_pg)


def copier(
    data_dir: Path, app: App, env: dict[str, str], failpoints: str = ""
) -> subprocess.CompletedProcess[str]:
    run_env = dict(env)
    if failpoints:
        run_env["EOMSG_FAILPOINTS"] = failpoints
    return subprocess.run(
        [sys.executable, str(COPIER), "--broker", str(data_dir), *app.args, "--idle", "0.5"],
        env=run_env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def coordinator_gone(data_dir: Path, timeout: float = 60.0) -> None:
    """Until the node has seen the killed copier's session end, so that what it left
    prepared is in doubt (the node learns of a dead peer when its socket closes, a
    moment after the kill — longer on a loaded machine)."""
    deadline = time.monotonic() + timeout
    with eomsg.connect(data_dir) as client:
        while any(t.connected for t in client.txns()):
            assert time.monotonic() < deadline, "the node never saw the copier's session end"
            time.sleep(0.02)


def finish(data_dir: Path, app: App, env: dict[str, str], runs: int = 10) -> None:
    """Run the copier until queue ``a`` is empty. A run stops after half a second with
    nothing to copy, and on a loaded machine the node may be that slow to hand back
    what a dead copier held: a run that ends early is run again (each must succeed)."""
    for _ in range(runs):
        done = copier(data_dir, app, env)
        assert done.returncode == 0, done.stderr
        if queue_depth(data_dir, "a") == 0:
            return
    with eomsg.connect(data_dir) as client:
        raise AssertionError(f"{runs} runs left messages behind: {client.stats()} {client.txns()}")


def recover(eomsg_bin: str, env: dict[str, str], *args: str) -> tuple[int, list[dict[str, object]]]:
    done = subprocess.run(
        [eomsg_bin, "recover", "--json", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, json.loads(done.stdout) if done.stdout.strip() else []


def check_agreement(data_dir: Path, app: App, payloads: set[bytes] = PAYLOADS) -> None:
    """Every message of ``a`` is in the table once and in ``b`` once; nothing else."""
    rows = app.read()
    assert sorted(rows) == sorted(payloads), rows
    with eomsg.connect(data_dir) as client:
        copies = client.fetch("b", len(payloads) + 1)
        assert sorted(d.message.payload for d in copies) == sorted(payloads)
        stats = {s.name: s for s in client.stats()}
        assert stats["a"].depth == 0 and stats["a"].deleted == len(payloads)
        assert client.txns() == []


@pytest.fixture
def setup(
    serve: Callable[..., NodeProcess], data_dir: Path, cli_env: dict[str, str]
) -> Callable[..., NodeProcess]:
    def start(node_failpoints: str = "", payloads: set[bytes] = PAYLOADS) -> NodeProcess:
        if node_failpoints:
            cli_env["EOMSG_FAILPOINTS"] = node_failpoints
        node = serve()
        cli_env.pop("EOMSG_FAILPOINTS", None)
        with eomsg.connect(data_dir) as client:
            # A short ack timeout: after a node crash, what was in flight to the dead
            # copier comes back once it runs out.
            client.create_queue(eomsg.QueueConfig("a", subscriptions=("a",), ack_timeout=1.0))
            client.create_queue(eomsg.QueueConfig("b", subscriptions=("b",)))
            client.publish_batch([eomsg.Outgoing("a", p) for p in sorted(payloads)])
        return node

    return start


@pytest.mark.parametrize(("kind", "role", "point"), MATRIX, ids=[f"{k}-{p}" for k, _, p in MATRIX])
def test_crash_at_each_step_then_recover(
    kind: str,
    role: str,
    point: str,
    setup: Callable[..., NodeProcess],
    serve: Callable[..., NodeProcess],
    eomsg_bin: str,
    data_dir: Path,
    cli_env: dict[str, str],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    app = _app(kind, tmp_path, request)
    node = setup(f"{point}=crash@2" if role == "node" else "")
    crashed = copier(data_dir, app, cli_env, "" if role == "node" else f"{point}=crash@2")
    assert crashed.returncode != 0, crashed.stdout  # someone died mid-transaction
    if role == "node":
        assert node.proc is not None and node.proc.wait(10) == -9
        node = serve()
    else:
        assert crashed.returncode == -9
    coordinator_gone(data_dir)
    code, steps = recover(eomsg_bin, cli_env)
    assert code == 0, steps
    assert all(s["done"] for s in steps), steps
    finish(data_dir, app, cli_env)
    check_agreement(data_dir, app)


def test_node_crash_while_recovery_aborts(
    setup: Callable[..., NodeProcess],
    serve: Callable[..., NodeProcess],
    eomsg_bin: str,
    data_dir: Path,
    cli_env: dict[str, str],
    app: App,
) -> None:
    """The coordinator dies before deciding; the node dies while recovery aborts; a
    second recovery finishes the abort."""
    node = setup("txn.abort.before_commit=crash")
    crashed = copier(data_dir, app, cli_env, "coordinator.after_prepare=crash@2")
    assert crashed.returncode == -9
    coordinator_gone(data_dir)
    code, _ = recover(eomsg_bin, cli_env)
    assert code != 0
    assert node.proc is not None and node.proc.wait(10) == -9
    serve()
    with eomsg.connect(data_dir) as client:
        (doubt,) = client.txns()
        assert not doubt.connected and doubt.deletes == 1 and doubt.publishes == 1
    code, steps = recover(eomsg_bin, cli_env)
    assert code == 0 and [s["verdict"] for s in steps] == ["abort"]
    finish(data_dir, app, cli_env)
    check_agreement(data_dir, app)


def test_recover_waits_for_a_locked_database_unless_told(
    setup: Callable[..., NodeProcess],
    eomsg_bin: str,
    data_dir: Path,
    cli_env: dict[str, str],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """An outcome that cannot be read is a person's decision: recover lists it (exit 12),
    and aborts it only with --abort-older-than."""
    path = tmp_path / "app.duckdb"
    app = _app("duckdb", tmp_path, request)
    setup("")
    assert copier(data_dir, app, cli_env, "coordinator.after_prepare=crash@2").returncode == -9
    coordinator_gone(data_dir)
    holder = subprocess.Popen(  # the application is back and holds its database
        [sys.executable, "-c", f"import duckdb,time; c=duckdb.connect({str(path)!r}); "
         "print('ok', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ok"
        done = subprocess.run(
            [eomsg_bin, "recover"], env=cli_env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 12, done
        assert "left in doubt" in done.stderr and "cannot read duckdb:" in done.stderr
        assert "--abort-older-than" in done.stderr
        code, steps = recover(eomsg_bin, cli_env)
        assert code == 12 and [s["verdict"] for s in steps] == ["wait"]
        forced = subprocess.run(
            [eomsg_bin, "recover", "--abort-older-than", "0s"],
            env=cli_env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert forced.returncode == 0, forced.stderr
        assert "aborted by your decision" in forced.stdout
    finally:
        holder.kill()
        holder.wait()
    finish(data_dir, app, cli_env)
    check_agreement(data_dir, app)


def test_inspect_txns_lists_in_doubt(
    setup: Callable[..., NodeProcess],
    eomsg_bin: str,
    data_dir: Path,
    cli_env: dict[str, str],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    app = _app("duckdb", tmp_path, request)
    setup("")
    assert copier(data_dir, app, cli_env, "coordinator.after_prepare=crash@1").returncode == -9
    coordinator_gone(data_dir)
    out = subprocess.run(
        [eomsg_bin, "inspect", "txns", "--json"], env=cli_env, capture_output=True, text=True
    )
    (t,) = json.loads(out.stdout)
    assert t["state"] == "prepared" and t["connected"] is False
    assert t["coordinator"] == f"duckdb:{(tmp_path / 'app.duckdb').resolve()}#eomsg_txns"
    assert (t["publishes"], t["deletes"]) == (1, 1)
    table = subprocess.run(
        [eomsg_bin, "inspect", "txns"], env=cli_env, capture_output=True, text=True
    ).stdout
    assert "in doubt" in table and t["txid"] in table
    dry = subprocess.run(
        [eomsg_bin, "recover", "--dry-run"], env=cli_env, capture_output=True, text=True
    )
    assert dry.returncode == 0
    assert f"{t['txid']}: would be aborted (no COMMIT recorded" in dry.stdout
    assert [
        x["txid"]
        for x in json.loads(
            subprocess.run(
                [eomsg_bin, "inspect", "txns", "--json"],
                env=cli_env,
                capture_output=True,
                text=True,
            ).stdout
        )
    ] == [t["txid"]]  # the dry run changed nothing
    bad = subprocess.run(
        [eomsg_bin, "recover", "--abort-older-than", "soon"],
        env=cli_env, capture_output=True, text=True,
    )  # fmt: skip
    assert bad.returncode == 3 and bad.stderr.startswith("Error: ")


@pytest.fixture
def own_server() -> Iterator[Cluster]:
    """A PostgreSQL server of this test's own, to crash."""
    if server_bin() is None:
        missing_service("no PostgreSQL server installed: run scripts/postgres.sh")
    cluster = Cluster()
    cluster.start()
    yield cluster
    cluster.stop()


def test_postgres_server_crashes_mid_copy(
    own_server: Cluster,
    setup: Callable[..., NodeProcess],
    eomsg_bin: str,
    data_dir: Path,
    cli_env: dict[str, str],
) -> None:
    """The resource itself dies: the PostgreSQL server is crashed (no checkpoint, as a
    power cut would) three times while the copier works, each time with a transaction
    prepared in PostgreSQL and on the node and not yet decided (the copier paused right
    there), and the copier dies of it. While the server is down, recovery cannot read
    the outcome and says so; once it is back (its prepared transactions restored from its
    WAL), recovery settles everything and the copier finishes: every message copied
    exactly once."""
    dsn = own_server.dsn
    payloads = {f"m{i:04}".encode() for i in range(1, 401)}
    setup("", payloads)

    def read() -> list[bytes]:
        with psycopg.connect(dsn) as db:
            return [bytes(r[0]) for r in db.execute("SELECT payload FROM copied").fetchall()]

    app = App(["--pg", dsn], read)
    command = [sys.executable, str(COPIER), "--broker", str(data_dir), *app.args, "--idle", "1"]
    env = {**cli_env, "EOMSG_FAILPOINTS": "resource.after_prepare=stop@60"}
    for _ in range(3):
        before = len(read()) if _ else 0
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
        wait_stopped(proc)  # prepared in both, undecided: the 60th transaction of this run
        own_server.crash()
        proc.send_signal(signal.SIGCONT)
        assert proc.wait(60) != 0  # it died of its database, mid-transaction
        code, steps = recover(eomsg_bin, cli_env)
        assert code == 12 and [s["verdict"] for s in steps] == ["wait"], steps
        assert "cannot read postgresql:" in str(steps[0]["reason"])
        own_server.start()
        code, steps = recover(eomsg_bin, cli_env, "--app", f"postgresql:{dsn}")
        assert code == 0 and steps and all(s["done"] for s in steps), steps
        assert len(read()) == before + 59  # the undecided one rolled back everywhere
    finish(data_dir, app, cli_env)
    check_agreement(data_dir, app, payloads)
    with psycopg.connect(dsn) as db:
        assert db.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone() == (0,)
