"""A fault-injection run (eomsg.chaos.run, scripts/chaos.py), CI-sized: real node,
producer and consumer processes SIGKILLed and paused, the node's wall clock moved an hour,
at times drawn from a seed, then
healed, drained and checked whole — no violation; and its plan is the same for the same
seed, printed by --dry-run without running anything."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from eomsg.chaos.powerloss import build
from eomsg.chaos.run import FAILPOINTS, QUEUES, Plan, consumer_names, run, schedule
from eomsg.chaos.workers import PARENT
from eomsg.errors import EomsgError
from tests.conftest import eventually, missing_service

ROOT = Path(__file__).resolve().parent.parent


def test_the_faults_of_a_plan_are_the_same_for_the_same_seed() -> None:
    plan = Plan(seed=5, node_kills=3, consumer_kills=2, producer_kills=1, consumer_pauses=1)
    faults = schedule(plan)
    assert faults == schedule(plan)
    assert faults != schedule(Plan(seed=6, node_kills=3, consumer_kills=2, producer_kills=1))
    kinds = sorted(f.kind for f in faults)
    assert kinds == ["consumer_kill"] * 2 + ["consumer_pause"] + ["node_kill"] * 3 + [
        "producer_kill"
    ]
    consumers = [f.target for f in faults if f.kind.startswith("consumer")]
    assert all(0 <= target < len(consumer_names(plan)) for target in consumers)


def test_a_run_crashes_at_every_named_step_of_the_node_and_the_coordinator() -> None:
    """Every failpoint of the node, its store and the transaction coordinator is one a
    run may crash at (those of offline tools — salvage, compact, Spark — are not)."""
    offline = {"salvage.swap", "compact.before_swap", "replay.staged", "replay.committed"}
    named = set()
    for path in (ROOT / "eomsg").rglob("*.py"):
        named |= set(re.findall(r'failpoint\("([a-z._]+)"\)', path.read_text()))
    assert named - offline == set(FAILPOINTS)
    assert len(set(FAILPOINTS)) == len(FAILPOINTS)
    steps = {f.failpoint for f in schedule(Plan(seed=1, failpoint_crashes=200))}
    assert {step for step, _ in steps} == set(FAILPOINTS)  # each drawn, given enough


def test_dry_run_prints_the_faults_and_runs_nothing(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "chaos.py"), "--seed", "5", "--node-kills", "1",
         "--consumer-kills", "0", "--producer-kills", "0", "--consumer-pauses", "0",
         "--dry-run", "--dir", str(tmp_path / "run")],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    [fault, total] = out.stdout.splitlines()
    assert fault.startswith("after ") and fault.endswith(" s: node_kill 0")
    assert total.startswith("1 faults over ")
    assert not (tmp_path / "run").exists()


@pytest.mark.chaos
@pytest.mark.slow
def test_a_run_with_every_fault_finds_no_violation(tmp_path: Path, pg_dsn: str) -> None:
    """Every kind of fault; consumers apply into SQLite (q, s), DuckDB (d) and
    PostgreSQL (t, preparing)."""
    plan = Plan(
        postgres=pg_dsn,
        seed=11,
        producers=2,
        messages=400,
        node_kills=3,
        consumer_kills=3,
        producer_kills=2,
        consumer_pauses=1,
        clock_jumps=4,
        failpoint_crashes=3,
        disk_fulls=2,
        lose_reply=0.01,
    )
    try:
        outcome = run(plan, tmp_path)
    except EomsgError as e:
        if "cannot mount" not in e.message:
            raise
        missing_service(e.message)  # the disk it fills is a tmpfs of its own
    assert outcome.report.ok, str(outcome.report)
    lost_replies = outcome.faults.pop("reply_lost")
    # A step the node or consumer did not reach within its wait is counted apart.
    crashes = outcome.faults.pop("failpoint_crash", 0) + outcome.faults.pop("failpoint_missed", 0)
    assert crashes == 3
    assert outcome.faults == {
        "node_kill": 3, "consumer_kill": 3, "producer_kill": 2, "consumer_pause": 1,
        "clock_jump": 4, "disk_full": 2,
    }  # fmt: skip
    assert lost_replies  # 1 frame in 100 from the node to a client: there are thousands
    checked = outcome.report.checked
    assert checked["applied"] == 2 * len(QUEUES) * 400  # every message, into each queue's database
    assert checked["receives"] >= checked["applied"] and checked["transactions"]


@pytest.mark.chaos
@pytest.mark.slow
def test_a_run_through_power_losses_finds_no_violation(tmp_path: Path) -> None:
    """The node killed with what it wrote and did not fsync dropped (eomsg.chaos.powerloss),
    between consumers killed: every acknowledged message is still applied once."""
    try:
        build(tmp_path)
    except EomsgError as e:
        missing_service(e.message)
    plan = Plan(
        seed=12, producers=2, messages=300, node_kills=0, consumer_kills=2,
        producer_kills=0, consumer_pauses=0, power_losses=4,
    )  # fmt: skip
    outcome = run(plan, tmp_path)
    assert outcome.report.ok, str(outcome.report)
    assert outcome.faults["power_loss"] == 4
    assert outcome.report.checked["applied"] == 2 * len(QUEUES) * 300


def test_a_run_into_a_directory_already_used_is_refused(tmp_path: Path) -> None:
    (tmp_path / "p0.jsonl").write_text("")
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "chaos.py"), "--dir", str(tmp_path)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stdout == f"Error: {tmp_path} is not empty: a run starts afresh (use a new --dir)\n"


def test_a_worker_ends_when_the_run_that_started_it_is_gone(tmp_path: Path) -> None:
    """A run killed without cleaning up leaves no consumer reconnecting for ever."""
    starter = (
        "import os, subprocess, sys;"
        "p = subprocess.Popen([sys.executable, '-m', 'eomsg.chaos.workers', 'consume',"
        f" 'tcp://127.0.0.1:1', '{tmp_path / 'c.jsonl'}', 'c', 'q', '{tmp_path / 'c.sqlite'}'],"
        f" stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,"
        f" env={{**os.environ, '{PARENT}': str(os.getpid())}}); print(p.pid)"
    )  # it exits at once, before the worker has even started
    out = subprocess.run([sys.executable, "-c", starter], capture_output=True, text=True)
    pid = int(out.stdout)
    assert eventually(lambda: not _alive(pid), 20)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone too: it only waits to be reaped by init
    with contextlib.suppress(FileNotFoundError):
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    return False
