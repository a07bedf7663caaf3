"""Settlements are fenced to the delivery they settle (issue 15, items 1, 2, 4 and 5),
through the doors users use — the CLI, the client, raw sockets — on a real node.

- A delete, release or transactional delete names its delivery ``(seq, attempt)`` and
  is refused once that delivery is over (timed out and handed out again), or when it
  is not the caller's (another connection's, or orphaned by a restart).
- A consumer never hands out a delivery it can know is over: one superseded in its
  prefetch buffer, or one whose connection the node may have cut off (a paused process).
- The attempt is the number of times the application was handed the message: what sat
  unseen in a prefetch buffer is given back un-counted.
- Keep-alive loss ends a flow within three heartbeats whatever the socket buffers hold.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import pytest

import eomsg
from eomsg.client.prefetch import FOLD_AT, MARGIN_SHARE, MAX_MARGIN, Prefetch
from eomsg.core.message import Delivered, Message
from eomsg.core.queues import QueueConfig
from eomsg.errors import ExitCode, StaleDelivery, TxnAborted
from eomsg.wire import events as ev
from tests.conftest import NodeProcess, RawClient

HEARTBEAT = 1.0  # the node cuts a client off after 3 silent heartbeats (a loaded
# machine stalls a process for a fraction of a second: shorter ones cut healthy clients)

Serve = Callable[..., NodeProcess]


@pytest.fixture
def node(serve: Serve, data_dir: Path) -> NodeProcess:
    return exclusive_node(serve, data_dir)


def exclusive_node(serve: Serve, data_dir: Path, *args: str) -> NodeProcess:
    """A node with a heartbeat of ``HEARTBEAT``, an exclusive queue ``ex`` and a queue
    ``slow`` whose deliveries time out after 3 s."""
    proc = serve("--heartbeat", str(HEARTBEAT), *args)
    with eomsg.connect(data_dir) as client:
        client.create_queue(QueueConfig("ex", ("ex/>",), max_active=1))
        # Long enough that a loaded machine finishes a step before a delivery times out,
        # short enough for the tests that wait for a redelivery.
        client.create_queue(QueueConfig("slow", ("slow/>",), ack_timeout=3.0))
    return proc


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 60) -> None:
    """Poll until ``predicate`` holds; the bound only stops a hung test."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def attempts_recorded(client: eomsg.Client, seq: int) -> int:
    """The highest attempt the node has durably recorded for ``seq`` (it records each
    before handing the message out)."""
    rows = client.query(f"SELECT coalesce(max(attempt), 0) FROM deliveries WHERE seq = {seq}")[1]
    return int(rows[0][0])


def wait_for_attempt(client: eomsg.Client, seq: int, attempt: int) -> None:
    wait_for(lambda: attempts_recorded(client, seq) >= attempt, f"attempt {attempt} of {seq}")


def stats(client: eomsg.Client, queue: str) -> eomsg.core.queues.QueueStats:
    return next(s for s in client.stats() if s.name == queue)


# -- the prefetch buffer's rules, without a node ------------------------------------------


def _delivered(seq: int, attempt: int, deadline: float) -> Delivered:
    return Delivered("q", Message(seq, "t", b""), attempt, deadline)


def test_a_newer_attempt_supersedes_the_buffered_one() -> None:
    buffer = Prefetch()
    old, new = _delivered(1, 1, 100.0), _delivered(1, 2, 200.0)
    buffer.arrived([old], node_now=90.0, now=0.0)
    buffer.arrived([new], node_now=190.0, now=1.0)
    assert not buffer.claim(old, 1.0)  # superseded: never handed out
    assert buffer.claim(new, 1.0)
    assert buffer.seen() == [(1, 2)]
    buffer.settled((1, 2))
    assert buffer.seen() == []


def test_a_delivery_near_its_deadline_is_given_back_not_handed_out() -> None:
    buffer = Prefetch()
    d = _delivered(1, 1, 30.0)
    buffer.arrived([d], node_now=0.0, now=1000.0)  # 30 s left, on another clock
    by = 1000.0 + 30.0 - MAX_MARGIN
    assert buffer.next_expiry() == by
    assert buffer.expire(by - 0.01) == []
    assert not buffer.claim(d, by)  # too late to be settled in time
    assert buffer.expire(by) == [(1, 1)]  # given back unseen instead
    assert buffer.seen() == []


def test_a_delivery_with_little_time_left_keeps_a_share_of_it_as_its_margin() -> None:
    buffer = Prefetch()
    soon, later = _delivered(1, 1, 102.0), _delivered(2, 1, 130.0)
    first = buffer.arrived([later, soon], node_now=100.0, now=50.0)  # 2 s and 30 s left
    assert first == buffer.next_expiry() == pytest.approx(50.0 + 2.0 - MARGIN_SHARE * 2.0)
    assert buffer.claim(soon, 51.5)
    assert not buffer.claim(later, 50.0 + 30.0 - MAX_MARGIN)
    assert buffer.expire(50.0 + 30.0 - MAX_MARGIN) == [(2, 1)]


def test_a_newer_attempt_supersedes_the_buffered_one_after_thousands_handed_out() -> None:
    buffer = Prefetch()
    items = [_delivered(s, 1, 100.0) for s in range(1, 3001)]
    buffer.arrived(items, node_now=0.0, now=0.0)
    assert all(buffer.claim(d, 0.0) for d in items if d.seq != 5)
    for seq in (5, 6):  # 6 was handed out: its new attempt is simply new
        buffer.arrived([_delivered(seq, 2, 100.0)], node_now=0.0, now=0.0)
    assert not buffer.claim(items[4], 0.0)  # (5, 1): superseded
    assert buffer.claim(_delivered(5, 2, 100.0), 0.0) and buffer.claim(_delivered(6, 2, 100.0), 0.0)
    assert buffer.next_expiry() == float("inf") and buffer.expire(1000.0) == []


def test_settlements_noted_in_bulk_leave_what_was_seen() -> None:
    buffer = Prefetch()
    items = [_delivered(s, 1, 100.0) for s in range(1, 2 * FOLD_AT + 2)]
    buffer.arrived(items, node_now=0.0, now=0.0)
    assert all(buffer.claim(d, 0.0) for d in items)
    buffer.arrived([_delivered(1, 2, 100.0)], node_now=0.0, now=0.0)  # seen again, newer
    assert buffer.claim(_delivered(1, 2, 100.0), 0.0)
    for d in items:
        buffer.settled(d.key)  # (1, 1) among them: not the attempt seen now
    assert buffer.seen() == [(1, 2)]


def test_a_claim_and_an_expiry_never_both_win() -> None:
    buffer = Prefetch()
    items = [_delivered(s, 1, 10.0) for s in range(1, 2001)]
    buffer.arrived(items, node_now=0.0, now=0.0)
    claimed: list[int] = []

    def claim_all() -> None:
        claimed.extend(d.seq for d in items if buffer.claim(d, 0.0))

    thread = threading.Thread(target=claim_all)
    thread.start()
    expired = [s for s, _ in buffer.expire(100.0)]
    thread.join()
    assert sorted(claimed + expired) == list(range(1, 2001))


# -- item 2: the attempt is the number of times the message was handed out --------------


@pytest.mark.parametrize("max_redeliveries", [1, 3])
@pytest.mark.parametrize("where", ["served", "embedded"])
def test_a_failing_handler_runs_once_per_attempt(
    where: str,
    max_redeliveries: int,
    serve: Serve,
    eomsg_bin: str,
    cli_env: dict[str, str],
    tmp_path: Path,
) -> None:
    """The issue's repro: each `consume --max 1 --exec` run sees the next attempt, and
    the message is dead-lettered only after max-redeliveries + 1 runs of the handler."""
    if where == "served":
        serve()

    def eomsg_cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [eomsg_bin, *args], env=cli_env, capture_output=True, text=True, timeout=60
        )

    create = eomsg_cli(
        "queue", "create", "fq", "--subscribe", "f/>",
        "--max-redeliveries", str(max_redeliveries), "--dead-letter", "fq-dlq",
    )  # fmt: skip
    assert create.returncode == 0, create.stderr
    assert eomsg_cli("publish", "f/x", "hello").returncode == 0
    log = tmp_path / "attempts"
    handler = f'cat >/dev/null; echo "$EOMSG_ATTEMPT" >> {log}; exit 3'
    for attempt in range(1, max_redeliveries + 2):
        run = eomsg_cli("consume", "fq", "--max", "1", "--exec", handler)
        assert run.returncode == ExitCode.HANDLER_FAILED, run.stderr
        assert f"(attempt {attempt})" in run.stderr
    assert log.read_text().split() == [str(a) for a in range(1, max_redeliveries + 2)]
    again = eomsg_cli("consume", "fq", "--max", "1", "--exec", handler)
    assert again.returncode == 0 and log.read_text().count("\n") == max_redeliveries + 1
    dlq = eomsg_cli("consume", "fq-dlq", "--json")
    assert '"payload": "hello"' in dlq.stdout


def test_released_then_left_a_message_counts_one_attempt(node: NodeProcess, data_dir: Path) -> None:
    """release() then leaving the `with` block: the redelivery that reached the buffer
    meanwhile was never handed out, so the next consumer sees attempt 2, not 3."""
    with eomsg.connect(data_dir) as client:
        client.publish("slow/a", b"x")
        with client.consumer("slow", prefetch=10) as consumer:
            msg = next(iter(consumer))
            assert msg.attempt == 1
            msg.release().result()
            wait_for_attempt(client, msg.seq, 2)
        with client.consumer("slow", prefetch=10) as consumer:
            again = next(iter(consumer))
            assert (again.seq, again.attempt) == (msg.seq, 2)
            again.delete().result()


def test_a_consumer_gives_back_what_it_never_handed_out_uncounted(
    node: NodeProcess, data_dir: Path
) -> None:
    with eomsg.connect(data_dir) as client:
        for i in range(20):
            client.publish("slow/a", str(i).encode())
        with client.consumer("slow", prefetch=20) as consumer:
            first = next(iter(consumer))
            wait_for(lambda: stats(client, "slow").in_flight == 20, "the prefetch to fill")
            first.delete().result()
        with client.consumer("slow", prefetch=20, until_empty=True) as consumer:
            rest = []
            for msg in consumer:
                rest.append((msg.seq, msg.attempt))
                msg.delete()
        assert rest == [(seq, 1) for seq in range(first.seq + 1, first.seq + 20)]


# -- item 1: a delivery that is over is never applied --------------------------------------


def test_a_late_delete_of_a_redelivered_message_is_refused(
    node: NodeProcess, data_dir: Path
) -> None:
    with eomsg.connect(data_dir) as a, eomsg.connect(data_dir) as b:
        a.publish("slow/a", b"x")
        (first,) = a.fetch("slow", 1)
        (second,) = b.fetch("slow", 1, wait=30)  # after A's ack timeout ran out
        assert (second.seq, second.attempt) == (first.seq, 2)
        with pytest.raises(StaleDelivery, match="handed out again"):
            a.delete("slow", [first.key])
        with pytest.raises(StaleDelivery, match="not held by this consumer"):
            a.delete("slow", [second.key])  # the current delivery, but B's
        assert stats(a, "slow").deleted == 0
        assert b.delete("slow", [second.key]) == [True]


@pytest.mark.parametrize("with_app", [True, False], ids=["2pc-duckdb", "node-only"])
def test_a_transaction_on_a_redelivered_message_aborts_cleanly(
    with_app: bool, node: NodeProcess, data_dir: Path, tmp_path: Path
) -> None:
    app = duckdb.connect(str(tmp_path / "app.duckdb"))
    app.execute("CREATE TABLE applied (seq BIGINT PRIMARY KEY)")
    resources = [eomsg.DuckDBResource(app)] if with_app else []
    with eomsg.connect(data_dir) as a, eomsg.connect(data_dir) as b:
        a.publish("slow/a", b"x")
        (first,) = a.fetch("slow", 1)
        (second,) = b.fetch("slow", 1, wait=30)
        with pytest.raises(TxnAborted) as aborted, a.transaction(resources=resources) as tx:
            if with_app:
                tx.resource(app).execute("INSERT INTO applied VALUES (?)", [first.seq])
            tx.publish("slow/copied", b"x")
            tx.delete(first)
        assert isinstance(aborted.value.__cause__, StaleDelivery)
        assert app.execute("SELECT count(*) FROM applied").fetchone() == (0,)
        assert a.txns() == []
        assert b.delete("slow", [second.key]) == [True]  # B's delivery stood throughout
        assert stats(a, "slow").depth == 0  # nothing was published either


def test_the_consumer_never_hands_out_a_superseded_delivery(
    node: NodeProcess, data_dir: Path
) -> None:
    """The application stalls past the ack timeout while the rest of the prefetch waits:
    the message it held is handed out again, its late delete is refused, and it never
    gets an attempt older than one it already had; in the end each message is deleted
    exactly once."""
    with eomsg.connect(data_dir) as client, eomsg.connect(data_dir) as observer:
        for i in range(3):
            client.publish("slow/a", str(i).encode())
        seen: list[tuple[int, int]] = []
        deleted: set[int] = set()
        with client.consumer("slow", prefetch=10) as consumer:
            for msg in consumer:
                seen.append((msg.seq, msg.attempt))
                if len(seen) == 1:  # stall until the node has handed it out again
                    wait_for_attempt(observer, msg.seq, 2)
                    with pytest.raises(StaleDelivery):
                        msg.delete().result(30)
                    continue
                assert msg.delete().result(30) is True  # only the stalled one is refused
                deleted.add(msg.seq)
                if len(deleted) == 3:
                    break
        stalled = seen[0][0]
        assert [a for s, a in seen if s == stalled] == [1, 2]  # the newer one, once
        for seq in deleted - {stalled}:  # handed out once each: never a superseded copy
            assert [s for s, _ in seen].count(seq) == 1, seen
        assert stats(observer, "slow").deleted == 3


PAUSABLE = textwrap.dedent(
    """
    import sys
    import eomsg

    try:
        with eomsg.connect(sys.argv[1]) as client:
            with client.consumer("ex", prefetch=100) as consumer:
                print("ready", flush=True)
                for msg in consumer:  # every message it is handed, printed
                    print("got", msg.seq, flush=True)
                    sys.stdin.readline()  # the test says when to take the next
                    try:
                        msg.delete().result()
                    except eomsg.errors.EomsgError as e:
                        print("refused", msg.seq, type(e).__name__, flush=True)
    except eomsg.errors.EomsgError as e:  # cut off
        print("ended", type(e).__name__, flush=True)
    """
)


def test_a_consumer_paused_past_the_keep_alive_hands_out_nothing_it_held(
    node: NodeProcess, data_dir: Path, cli_env: dict[str, str]
) -> None:
    """SIGSTOP the active consumer while its buffer holds messages; the standby takes
    over and deletes them all; SIGCONT: the paused consumer must not hand out any of
    the messages it still buffered (the node cut it off: it asks before handing out)."""
    with eomsg.connect(data_dir) as producer:
        for i in range(50):
            producer.publish("ex/a", str(i).encode())
    paused = subprocess.Popen(
        [sys.executable, "-c", PAUSABLE, str(data_dir)],
        env=cli_env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert paused.stdin is not None and paused.stdout is not None
    try:
        assert paused.stdout.readline() == "ready\n"
        first = paused.stdout.readline().split()
        assert first[0] == "got"
        with eomsg.connect(data_dir) as watcher:
            wait_for(lambda: stats(watcher, "ex").in_flight == 50, "the buffer to fill")
            paused.send_signal(signal.SIGSTOP)  # while its application waits on stdin
            standby_got = []
            with watcher.consumer("ex", prefetch=100, idle_timeout=60) as standby:
                for msg in standby:  # it starts on standby; active once A is cut off
                    standby_got.append(msg.seq)
                    msg.delete().result()
                    if len(standby_got) == 50:
                        break
            # the message in A's hand included: A never deleted it
            assert sorted(standby_got) == list(range(1, 51))
        paused.send_signal(signal.SIGCONT)
        paused.stdin.write("\n")
        paused.stdin.flush()
        rest = paused.stdout.read().split("\n")
        assert paused.wait(30) == 0
    finally:
        paused.kill()
        paused.wait()
    # its delete of the message in hand was refused; it handed out nothing more
    assert rest[0] == f"refused {first[1]} Unavailable" or rest[0].startswith(
        f"refused {first[1]} Stale"
    )
    assert not any(line.startswith("got") for line in rest), rest
    assert any(line.startswith("ended") for line in rest), rest


# -- item 4: keep-alive loss ends a flow whatever the buffers hold -------------------------


@pytest.mark.parametrize("how", ["raw-never-reads", "sigstop"])
def test_a_stalled_consumer_loses_its_flow_within_three_heartbeats(
    how: str, serve: Serve, data_dir: Path, cli_env: dict[str, str]
) -> None:
    """An active consumer with a huge prefetch stops reading while the node has much
    unsent data for it; the node cuts it off for keep-alive loss (three heartbeats
    silent, or its socket not drained as long: a graceful close would wait for buffers
    the stalled client never drains) and the standby takes over and gets every message.
    The node's log says why it cut the client off, as measured on its own clock."""
    node = exclusive_node(serve, data_dir, "--verbose")  # --verbose: it logs cut-offs
    payload = b"p" * 65536
    with eomsg.connect(data_dir) as producer:
        producer.publish_batch([eomsg.Outgoing("ex/a", payload) for _ in range(1000)])
    stalled: RawClient | subprocess.Popen[str]
    if how == "raw-never-reads":
        raw = RawClient(data_dir)
        raw.hello()
        raw.send(ev.Subscribe(1, "ex", 100_000, 0))
        while not isinstance(raw.next(), ev.Deliver):  # active, holding messages
            pass
        stalled = raw  # it never reads again, never answers a ping
    else:
        proc = subprocess.Popen(
            [sys.executable, "-c", PAUSABLE, str(data_dir)],
            env=cli_env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        assert proc.stdout.readline().startswith("got")
        proc.send_signal(signal.SIGSTOP)
        stalled = proc
    try:
        # Both hold messages already (a Deliver, a "got"): waiting for the node to say
        # so here could start after it had cut the stalled flow off, and wait forever.
        with eomsg.connect(data_dir) as watcher:
            active = threading.Event()
            started = time.monotonic()
            got = 0
            with watcher.consumer(
                "ex", prefetch=100, idle_timeout=60, on_active=lambda e: active.set()
            ) as standby:
                assert active.wait(60), "the standby never became active"
                took_over = time.monotonic() - started
                for msg in standby:
                    got += 1
                    msg.delete()
                    if got == 1000:
                        break
            assert stats(watcher, "ex").depth == 0
    finally:
        if isinstance(stalled, RawClient):
            stalled.close()
        else:
            stalled.send_signal(signal.SIGCONT)
            stalled.kill()
            stalled.wait()
    print(f"{how}: the standby took over {took_over:.2f} s after the stall was noticed")
    _, _, log = node.stop()
    (cut,) = re.findall(
        r"cutting off .*: (?:no word from the client|the client has read nothing) for ([0-9.]+) s",
        log,
    )
    # After three heartbeats on the node's clock, and not much later (the watchdog looks
    # at least every heartbeat; the rest is a loaded loop's lateness): before the fix the
    # node never cut it off at all.
    assert 3 * HEARTBEAT <= float(cut) < 3 * HEARTBEAT + 5.0, log


# -- item 5: only the holder settles a delivery --------------------------------------------


@pytest.fixture
def held_by_a(node: NodeProcess, data_dir: Path) -> Iterator[tuple[eomsg.Client, list[Delivered]]]:
    """Consumer A, active on the exclusive queue, holding 5 messages."""
    client = eomsg.connect(data_dir)
    for i in range(5):
        client.publish("ex/a", str(i).encode())
    consumer = client.consumer("ex", prefetch=5)
    consumer.__enter__()
    held = []
    for msg in consumer:
        held.append(msg.delivered)
        if len(held) == 5:
            break
    yield client, held
    consumer.close()
    client.close()


def test_another_client_naming_a_live_epoch_cannot_settle(
    held_by_a: tuple[eomsg.Client, list[Delivered]], data_dir: Path
) -> None:
    _, held = held_by_a
    with eomsg.connect(data_dir) as other:
        for d in held:
            with pytest.raises(StaleDelivery, match="not held by this consumer"):
                other.delete("ex", [d.key], epoch=d.epoch)
            with pytest.raises(StaleDelivery):
                other.release("ex", [d.key], epoch=d.epoch)
        assert stats(other, "ex").depth == 5 and stats(other, "ex").deleted == 0


def test_after_a_restart_no_delete_settles_what_was_in_flight(
    held_by_a: tuple[eomsg.Client, list[Delivered]],
    node: NodeProcess,
    serve: Serve,
    data_dir: Path,
) -> None:
    """The issue's repro: with A holding 5, SIGKILL the node and restart it; with no
    consumer bound, `delete(Q, [...])` (epoch 0, the default) must settle none."""
    _, held = held_by_a
    node.kill()
    serve("--heartbeat", str(HEARTBEAT))
    with eomsg.connect(data_dir) as other:
        for d in held:
            with pytest.raises(StaleDelivery):
                other.delete("ex", [d.key])
            with pytest.raises(StaleDelivery):
                other.delete("ex", [d.key], epoch=d.epoch)
        s = stats(other, "ex")
        assert (s.depth, s.deleted) == (5, 0)
        again = []
        with other.consumer("ex", idle_timeout=60) as consumer:  # delivered again, in order
            for msg in consumer:
                again.append((msg.seq, msg.attempt))
                msg.delete()
                if len(again) == len(held):
                    break
        assert again == [(d.seq, 2) for d in held]
