"""The node's timers ignore a jump of the wall clock (issue 20: "clock jumps — the node's
wall clock moved ±1 h under load"). A real node runs on a wall clock the test moves
(eomsg.chaos.clock: a shim offsets every read of CLOCK_REALTIME; the monotonic clocks run
on): an hour back does not hold an unacknowledged message or a delayed release for an
hour, an hour ahead does not time out every delivery in flight at once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import eomsg
from eomsg.chaos.clock import HOUR, WallClock
from eomsg.core.queues import QueueConfig
from tests.conftest import NodeProcess

pytestmark = pytest.mark.chaos


@pytest.fixture
def clock(tmp_path: Path) -> WallClock:
    return WallClock(tmp_path)


@pytest.fixture
def node(
    eomsg_bin: str, data_dir: Path, cli_env: dict[str, str], clock: WallClock
) -> Iterator[NodeProcess]:
    started = NodeProcess(eomsg_bin, data_dir, clock.env(cli_env)).start()
    yield started
    started.kill()


def fetched_within(client: eomsg.Client, queue: str, seconds: float) -> list[bytes]:
    """What ``queue`` gives within ``seconds`` of waiting (fetch waits for it)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = client.fetch(queue, 10, wait=min(5.0, deadline - time.monotonic()))
        if got:
            return [d.message.payload for d in got]
    return []


def test_the_node_runs_on_the_moved_clock(node: NodeProcess, clock: WallClock) -> None:
    """The shim works: the node's process reads the moved clock (here through DuckDB)."""
    with eomsg.connect(node.data_dir) as c:
        clock.jump(-HOUR)
        ((then,),) = c.query("SELECT epoch(now())")[1]
    assert 3000 < time.time() - then < 4200


@pytest.mark.parametrize("jump", [-HOUR, HOUR], ids=["back", "ahead"])
def test_ack_deadlines_and_delays_follow_the_monotonic_clock(
    node: NodeProcess, clock: WallClock, jump: int
) -> None:
    with eomsg.connect(node.data_dir) as owner, eomsg.connect(node.data_dir) as other:
        owner.create_queue(QueueConfig.create("short", ("s",), ack_timeout=2.0))
        owner.create_queue(QueueConfig.create("long", ("l",), ack_timeout=600.0))
        owner.create_queue(QueueConfig.create("control", ("c",), ack_timeout=2.0))
        owner.publish("s", b"unacked")
        owner.publish("l", b"held")
        owner.publish("l", b"delayed")
        held = owner.fetch("short", 1) + owner.fetch("long", 2)
        assert [d.message.payload for d in held] == [b"unacked", b"held", b"delayed"]
        owner.release("long", [held[2].key], delay=3.0)
        clock.jump(jump)
        # A control, in flight from after the jump, on a queue of its own: once it has
        # timed out and come back, the node's ticks have run on the moved clock.
        owner.publish("c", b"control")
        assert [d.message.payload for d in owner.fetch("control", 1)] == [b"control"]
        assert fetched_within(other, "control", 60) == [b"control"]
        # Within 600 s of monotonic time the delivery is still the holder's: not handed
        # to another consumer (a wall-clock deadline would have passed an hour ahead).
        early = [d.message.payload for d in other.fetch("long", 10)]
        assert b"held" not in early
        assert owner.delete("long", [held[1].key]) == [True]
        # The unacknowledged one comes back after its 2 s and the delayed one after its
        # 3 s — not an hour later (a wall-clock deadline an hour back).
        assert fetched_within(other, "short", 60) == [b"unacked"]
        assert b"delayed" in early or fetched_within(other, "long", 60) == [b"delayed"]


def test_a_clock_set_back_across_a_restart_holds_nothing_given_back(
    node: NodeProcess, clock: WallClock
) -> None:
    """Given back — at once (a consumer that went away) and with a 3 s delay — then the
    clock is set back an hour and the node killed: the restarted node reads the due
    times it recorded on the clock before the jump, and hands both out within their
    delay, not an hour later (a chaos run's queue stood still for its whole drain)."""
    with eomsg.connect(node.data_dir) as c:
        c.create_queue(QueueConfig.create("q", ("q",), ack_timeout=600.0))
        c.publish("q", b"now")
        c.publish("q", b"delayed")
        held = c.fetch("q", 2)
        assert [d.message.payload for d in held] == [b"now", b"delayed"]
        c.release("q", [held[0].key])
        c.release("q", [held[1].key], delay=3.0)
    clock.jump(-HOUR)
    node.kill()
    node.start()
    with eomsg.connect(node.data_dir) as c:
        assert fetched_within(c, "q", 60) == [b"now"]
        assert fetched_within(c, "q", 60) == [b"delayed"]
