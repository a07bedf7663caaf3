"""A fault-injection run (eomsg.chaos.run, scripts/chaos.py), CI-sized: real node,
producer and consumer processes SIGKILLed and paused, the node's wall clock moved an hour,
at times drawn from a seed — on one node, and on three linked through fault proxies —
then healed, drained and checked whole: no violation; and its plan is the same for the
same seed, printed by --dry-run without running anything."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from eomsg.chaos.plan import (
    FAILPOINTS,
    NODE_FAILPOINTS,
    QUEUES,
    Plan,
    consumer_names,
    schedule,
)
from eomsg.chaos.powerloss import build
from eomsg.chaos.run import Result, run
from eomsg.chaos.workers import PARENT
from eomsg.errors import EomsgError
from tests.conftest import missing_service

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


def test_a_network_plan_places_each_fault_at_one_of_its_nodes_or_links() -> None:
    """In a run of several nodes, a node's fault strikes one of them and a link cut one
    of the topology's links; a consumer's failpoint, a consumer's or producer's kill and
    a full disk (the one all the nodes keep their data on) name no node. A run of one
    node places its faults as before: nowhere named."""
    plan = Plan(seed=4, nodes=3, producers=3, node_kills=20, power_losses=20, clock_jumps=20,
                failpoint_crashes=30, link_cuts=12, disk_fulls=2)  # fmt: skip
    assert plan.links == [("a", "b"), ("b", "c"), ("c", "a")]
    faults = schedule(plan)
    assert faults == schedule(plan)
    at = {kind: {f.at for f in faults if f.kind == kind} for kind in {f.kind for f in faults}}
    assert at["node_kill"] == at["power_loss"] == at["clock_jump"] == {"a", "b", "c"}
    assert at["link_cut"] == {"a-b", "b-c", "c-a"}
    assert {f.target for f in faults if f.kind == "link_cut"} == {0, 1}  # short and long
    for f in (f for f in faults if f.kind == "failpoint_crash"):
        step = f.failpoint[0]
        assert (f.at is None) == (step not in NODE_FAILPOINTS)
        if step.startswith(("txn.", "delete.")):  # steps only the queues' node passes
            assert f.at == "a"
    at_a_step = {f.at for f in faults if f.kind == "failpoint_crash" and f.at is not None}
    assert at_a_step == {"a", "b", "c"}
    assert at["consumer_kill"] == at["disk_full"] == {None}
    one = Plan(seed=4, node_kills=12, power_losses=6, failpoint_crashes=30)
    assert {f.at for f in schedule(one)} == {None}
    assert Plan(nodes=3, producers=3, topology="chain").links == [("a", "b"), ("b", "c")]
    assert Plan(nodes=4, producers=4, topology="fan-out").links == [
        ("a", "b"),
        ("a", "c"),
        ("a", "d"),
    ]
    assert Plan(nodes=2, topology="ring").links == [("a", "b")]  # not the same link twice
    assert Plan().node_names == ["node"] and Plan(nodes=3, producers=3).node_names == [
        "a",
        "b",
        "c",
    ]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--link-cuts", "1"], "link cuts need a run of several nodes (use --nodes)"),
        (["--nodes", "0"], "a run has 1 to 8 nodes, not 0"),
        (["--nodes", "9"], "a run has 1 to 8 nodes, not 9"),
        (
            ["--nodes", "3", "--producers", "2"],
            "a run of 3 nodes publishes on each: use --producers 3 or more",
        ),
        (
            ["--nodes", "2", "--consumers", "1"],
            "in a run of several nodes each queue's second consumer reaches it through "
            "another node: use --consumers 2 or more",
        ),
        (
            ["--link-faults", "0.5"],
            "--link-faults is a share of the frames from 0 to 0.25, not 0.5",
        ),
    ],
)
def test_a_plan_that_cannot_run_is_a_usage_error(args: list[str], said: str) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "chaos.py"), *args, "--dry-run"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert (out.returncode, out.stdout) == (2, f"Error: {said}\n")


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
    outcome = run_filling_a_disk(plan, tmp_path)
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


@pytest.mark.chaos
@pytest.mark.slow
def test_a_run_of_three_linked_nodes_with_every_fault_finds_no_violation(
    tmp_path: Path, pg_dsn: str
) -> None:
    """Three nodes in a ring, each link through a proxy dropping, duplicating and
    reordering 10 % of its frames each; producers on every node; the consumers on a,
    and a queue on b and c drained at the end. Each node killed, one losing power, links
    cut, clocks moved, a node or consumer crashed at a named step, the disk filled: every
    message reaches every queue once, in its origin's order."""
    plan = Plan(
        postgres=pg_dsn, seed=21, nodes=3, producers=3, messages=200, node_kills=3,
        power_losses=1, clock_jumps=2, failpoint_crashes=2, disk_fulls=1, link_cuts=4,
        consumer_kills=2, producer_kills=1, consumer_pauses=1, lose_reply=0.01,
    )  # fmt: skip
    killed = {f.at for f in schedule(plan) if f.kind in ("node_kill", "power_loss")}
    assert killed == {"a", "b", "c"}  # the seed kills each node
    outcome = run_filling_a_disk(plan, tmp_path)
    assert outcome.report.ok, str(outcome.report)
    faults = outcome.faults
    assert faults["link_cut"] == 4 and faults["node_kill"] == 3 and faults["power_loss"] == 1
    assert faults["frames_dropped"] and faults["frames_duplicated"] and faults["frames_reordered"]
    queues = len(QUEUES) + 2  # a's, and n-b and n-c
    assert outcome.report.checked["applied"] == queues * 3 * 200


def run_filling_a_disk(plan: Plan, tmp_path: Path) -> Result:
    """``run(plan)``, skipped where the run cannot mount the disk it fills (a tmpfs of
    its own: root, or sudo -n) — failed under CI=true."""
    try:
        return run(plan, tmp_path)
    except EomsgError as e:
        if "cannot mount" not in e.message:
            raise
        missing_service(e.message)
        raise


def test_a_run_into_a_directory_already_used_is_refused(tmp_path: Path) -> None:
    (tmp_path / "p0.jsonl").write_text("")
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "chaos.py"), "--dir", str(tmp_path)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stdout == f"Error: {tmp_path} is not empty: a run starts afresh (use a new --dir)\n"


def test_a_worker_ends_when_the_run_that_started_it_is_gone(tmp_path: Path) -> None:
    """A run killed without cleaning up leaves no consumer reconnecting for ever: the
    worker kills itself (SIGKILL, from its watch of the run) — it neither crashed nor ran
    on. This process adopts the orphan (a subreaper), so its end is seen, not inferred."""
    starter = (
        "import os, subprocess, sys;"
        "p = subprocess.Popen([sys.executable, '-m', 'eomsg.chaos.workers', 'consume',"
        f" 'tcp://127.0.0.1:1', '{tmp_path / 'c.jsonl'}', 'c', 'q', '{tmp_path / 'c.sqlite'}'],"
        f" stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,"
        f" env={{**os.environ, '{PARENT}': str(os.getpid())}}); print(p.pid)"
    )  # it exits at once, before the worker has even started
    with adopting_orphans():
        out = subprocess.run([sys.executable, "-c", starter], capture_output=True, text=True)
        pid = int(out.stdout)
        deadline = time.monotonic() + 60  # a bound for a failing run, not a wait
        try:
            while (ended := os.waitpid(pid, os.WNOHANG))[0] == 0:
                assert time.monotonic() < deadline, "the orphaned worker runs on"
                time.sleep(0.05)
        finally:  # a worker that ran on is not left reconnecting for ever
            with contextlib.suppress(ProcessLookupError, ChildProcessError):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
    status = ended[1]
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status


@contextlib.contextmanager
def adopting_orphans() -> Iterator[None]:
    """This process as the subreaper of its descendants (Linux ``prctl``): a process
    whose parent ends becomes its child, to be waited for."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    try:
        yield
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


PR_SET_CHILD_SUBREAPER = 36
