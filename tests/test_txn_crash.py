"""Seed 000 under crashes: a real node (``eomsg serve``) and a real copier process
(``scripts/copier.py``: queue ``a`` → table ``copied`` + topic ``b``, one transaction per
message), killed with SIGKILL by a failpoint at each step of two-phase commit, in each
role. After recovery (``eomsg recover``, then the copier again) the application table
and the queues must agree: every message copied exactly once, nothing left in doubt."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest

import eomsg
from tests.conftest import NodeProcess

pytestmark = pytest.mark.slow

COPIER = Path(__file__).parent.parent / "scripts" / "copier.py"
N = 4
PAYLOADS = {f"m{i}".encode() for i in range(1, N + 1)}

# (role, failpoint): the process that dies, and where. "@2": in the second transaction,
# so one transaction has completed cleanly before the crash.
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


def copier(
    data_dir: Path, app: Path, env: dict[str, str], failpoints: str = ""
) -> subprocess.CompletedProcess[str]:
    run_env = dict(env)
    if failpoints:
        run_env["EOMSG_FAILPOINTS"] = failpoints
    return subprocess.run(
        [
            sys.executable,
            str(COPIER),
            "--broker",
            str(data_dir),
            "--app",
            str(app),
            "--idle",
            "0.5",
        ],
        env=run_env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def recover(eomsg_bin: str, env: dict[str, str]) -> tuple[int, list[dict[str, object]]]:
    done = subprocess.run(
        [eomsg_bin, "recover", "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    return done.returncode, json.loads(done.stdout) if done.stdout.strip() else []


def check_agreement(data_dir: Path, app: Path) -> None:
    """Every message of ``a`` is in the table once and in ``b`` once; nothing else."""
    with duckdb.connect(str(app)) as db:
        rows = [bytes(r[0]) for r in db.execute("SELECT payload FROM copied").fetchall()]
    assert sorted(rows) == sorted(PAYLOADS), rows
    with eomsg.connect(data_dir) as client:
        copies = client.fetch("b", 100)
        assert sorted(d.message.payload for d in copies) == sorted(PAYLOADS)
        stats = {s.name: s for s in client.stats()}
        assert stats["a"].depth == 0 and stats["a"].deleted == N
        assert client.txns() == []


@pytest.fixture
def setup(
    serve: Callable[..., NodeProcess], data_dir: Path, cli_env: dict[str, str]
) -> Callable[[str], NodeProcess]:
    def start(node_failpoints: str = "") -> NodeProcess:
        if node_failpoints:
            cli_env["EOMSG_FAILPOINTS"] = node_failpoints
        node = serve()
        cli_env.pop("EOMSG_FAILPOINTS", None)
        with eomsg.connect(data_dir) as client:
            # A short ack timeout: after a node crash, what was in flight to the dead
            # copier comes back once it runs out.
            client.create_queue(eomsg.QueueConfig("a", subscriptions=("a",), ack_timeout=1.0))
            client.create_queue(eomsg.QueueConfig("b", subscriptions=("b",)))
            client.publish_batch([eomsg.Outgoing("a", p) for p in sorted(PAYLOADS)])
        return node

    return start


@pytest.mark.parametrize(("role", "point"), CASES, ids=[p for _, p in CASES])
def test_crash_at_each_step_then_recover(
    role: str,
    point: str,
    setup: Callable[[str], NodeProcess],
    serve: Callable[..., NodeProcess],
    eomsg_bin: str,
    data_dir: Path,
    cli_env: dict[str, str],
    tmp_path: Path,
) -> None:
    app = tmp_path / "app.duckdb"
    node = setup(f"{point}=crash@2" if role == "node" else "")
    crashed = copier(data_dir, app, cli_env, "" if role == "node" else f"{point}=crash@2")
    assert crashed.returncode != 0, crashed.stdout  # someone died mid-transaction
    if role == "node":
        assert node.proc is not None and node.proc.wait(10) == -9
        node = serve()
    else:
        assert crashed.returncode == -9
    code, steps = recover(eomsg_bin, cli_env)
    assert code == 0, steps
    assert all(s["done"] for s in steps)
    finished = copier(data_dir, app, cli_env)
    assert finished.returncode == 0, finished.stderr
    check_agreement(data_dir, app)


def test_node_crash_while_recovery_aborts(
    setup: Callable[[str], NodeProcess],
    serve: Callable[..., NodeProcess],
    eomsg_bin: str,
    data_dir: Path,
    cli_env: dict[str, str],
    tmp_path: Path,
) -> None:
    """The coordinator dies before deciding; the node dies while recovery aborts; a
    second recovery finishes the abort."""
    app = tmp_path / "app.duckdb"
    node = setup("txn.abort.before_commit=crash")
    crashed = copier(data_dir, app, cli_env, "coordinator.after_prepare=crash@2")
    assert crashed.returncode == -9
    code, _ = recover(eomsg_bin, cli_env)
    assert code != 0
    assert node.proc is not None and node.proc.wait(10) == -9
    serve()
    with eomsg.connect(data_dir) as client:
        (doubt,) = client.txns()
        assert not doubt.connected and doubt.deletes == 1 and doubt.publishes == 1
    code, steps = recover(eomsg_bin, cli_env)
    assert code == 0 and [s["verdict"] for s in steps] == ["abort"]
    assert copier(data_dir, app, cli_env).returncode == 0
    check_agreement(data_dir, app)


def test_recover_waits_for_a_locked_database_unless_told(
    setup: Callable[[str], NodeProcess],
    eomsg_bin: str,
    data_dir: Path,
    cli_env: dict[str, str],
    tmp_path: Path,
) -> None:
    """An outcome that cannot be read is a person's decision: recover lists it (exit 12),
    and aborts it only with --abort-older-than."""
    app = tmp_path / "app.duckdb"
    setup("")
    assert copier(data_dir, app, cli_env, "coordinator.after_prepare=crash@2").returncode == -9
    holder = subprocess.Popen(  # the application is back and holds its database
        [sys.executable, "-c", f"import duckdb,time; c=duckdb.connect({str(app)!r}); "
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
    assert copier(data_dir, app, cli_env).returncode == 0
    check_agreement(data_dir, app)


def test_inspect_txns_lists_in_doubt(
    setup: Callable[[str], NodeProcess],
    eomsg_bin: str,
    data_dir: Path,
    cli_env: dict[str, str],
    tmp_path: Path,
) -> None:
    app = tmp_path / "app.duckdb"
    setup("")
    assert copier(data_dir, app, cli_env, "coordinator.after_prepare=crash@1").returncode == -9
    out = subprocess.run(
        [eomsg_bin, "inspect", "txns", "--json"], env=cli_env, capture_output=True, text=True
    )
    (t,) = json.loads(out.stdout)
    assert t["state"] == "prepared" and t["connected"] is False
    assert t["coordinator"] == f"duckdb:{app.resolve()}#eomsg_txns"
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
