"""Exclusive and limited queues against a real node (seed 002): every stimulus of the
election — bind, unbind of active and standby flows, disconnect, keep-alive loss,
administrative unbind, higher-priority binds with and without ``immediate`` — and what
each consumer is told, fenced by epochs."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import eomsg
from eomsg.client.broker import BoundConsumer, Broker
from eomsg.client.sync import Client
from eomsg.core.election import FlowEvent
from eomsg.core.queues import QueueConfig
from eomsg.errors import ExitCode, NotActive, StaleEpoch, Unavailable, Unbound
from eomsg.wire import events as ev
from tests.conftest import NodeProcess, RawClient, activity, messages

HEARTBEAT = 1.0  # the node cuts a client off after 3 silent heartbeats (a loaded
# machine stalls a process for a fraction of a second: shorter ones cut healthy clients)
RESEND = 0.3

Serve = Callable[..., NodeProcess]
QUEUES = (
    QueueConfig("ex", ("ex/>",), max_active=1),
    QueueConfig("ex2", ("ex2/>",), max_active=1),
    QueueConfig("late", ("late/>",), max_active=1, immediate=False),
    QueueConfig("lim", ("lim/>",), max_active=2),
)


@pytest.fixture
def node(serve: Serve, data_dir: Path) -> NodeProcess:
    # --verbose: the node logs why it cut a client off (the keep-alive tests read it)
    proc = serve("--heartbeat", str(HEARTBEAT), "--resend", str(RESEND), "--verbose")
    with eomsg.connect(data_dir) as client:
        for config in QUEUES:
            client.create_queue(config)
    return proc


@pytest.fixture
def flow_clients(brokers: Callable[[], Broker]) -> Callable[[], Broker]:
    """Clients of a node with the test queues, embedded or served: the tests taking
    this hold on both backends."""
    with brokers() as admin:
        for config in QUEUES:
            admin.create_queue(config)
    return brokers


@pytest.fixture
def clients(data_dir: Path) -> Callable[[], Client]:
    opened: list[Client] = []

    def connect() -> Client:
        client = eomsg.connect(data_dir)
        opened.append(client)
        return client

    yield connect  # type: ignore[misc]
    for client in opened:
        client.close()


class Recorder:
    """A consumer's activity callbacks, recorded."""

    def __init__(self) -> None:
        self.events: list[FlowEvent] = []
        self.changed = threading.Condition()

    def __call__(self, event: FlowEvent) -> None:
        with self.changed:
            self.events.append(event)
            self.changed.notify_all()

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events]

    def wait(self, kinds: list[str], timeout: float = 10) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: self.kinds() == kinds, timeout), self.kinds()


def bound(
    client: Broker, queue: str, priority: int = 0, **kw: object
) -> tuple[BoundConsumer, Recorder]:
    rec = Recorder()
    consumer = client.consumer(
        queue,
        priority=priority,
        on_active=rec,
        on_inactive=rec,
        **kw,  # type: ignore[arg-type]
    )
    consumer.__enter__()
    return consumer, rec


def take(consumer: BoundConsumer, n: int) -> list[eomsg.Received]:
    out = []
    for msg in consumer:
        out.append(msg)
        if len(out) == n:
            break
    return out


def test_bind_answers_active_or_standby(flow_clients: Callable[[], Broker]) -> None:
    first, rec1 = bound(flow_clients(), "ex")
    second, rec2 = bound(flow_clients(), "ex")
    assert (first.active, second.active) == (True, False)
    rec1.wait(["active"])
    rec2.wait(["inactive"])  # told its state at bind: standby
    flows = flow_clients().flows("ex")
    assert [(f.flow, f.active) for f in flows] == [(first.flow, True), (second.flow, False)]
    with pytest.raises(NotActive, match="exclusive"):
        flow_clients().fetch("ex", 10)  # no reading around the election


def test_unbinding_the_active_flow_hands_its_messages_to_the_next_in_order(
    flow_clients: Callable[[], Broker],
) -> None:
    producer = flow_clients()
    for i in range(5):
        producer.publish("ex/a", f"m{i}".encode())
    first, _ = bound(flow_clients(), "ex")
    held = take(first, 5)  # received, not deleted
    second, rec2 = bound(flow_clients(), "ex")
    first.close()  # explicit unbind of the active flow
    rec2.wait(["inactive", "active"])
    got = take(second, 5)
    assert [m.payload for m in got] == [f"m{i}".encode() for i in range(5)]
    assert all(m.attempt == 2 and m.epoch > held[0].epoch for m in got)
    for m in got:
        m.delete()
    second.flush()
    assert producer.stats()[0].depth == 0


def test_unbinding_a_standby_flow_changes_nothing(flow_clients: Callable[[], Broker]) -> None:
    first, rec1 = bound(flow_clients(), "ex")
    second, _ = bound(flow_clients(), "ex")
    epoch = first.epoch
    rec1.wait(["active"])
    second.close()
    # The node's election, as it stands once the unbind is answered (it decides under
    # its lock, before answering): the same flow active in the same epoch.
    (flow,) = flow_clients().flows("ex")
    assert (flow.flow, flow.active, flow.epoch) == (first.flow, True, epoch)
    assert (first.active, first.epoch, rec1.kinds()) == (True, epoch, ["active"])


def test_a_consumer_that_disconnects_is_replaced(
    node: NodeProcess, data_dir: Path, clients: Callable[[], Client]
) -> None:
    raw = RawClient(data_dir)
    raw.hello()
    raw.answer_pings()  # alive until it says otherwise, however slow the test
    raw.send(ev.Subscribe(1, "ex", 10, 0))
    result = raw.next()
    assert isinstance(result, ev.Result) and result.value["active"] is True
    _second, rec2 = bound(clients(), "ex")
    raw.close()
    rec2.wait(["inactive", "active"])


def test_bad_binds_are_refused_and_the_connection_carries_on(
    node: NodeProcess, data_dir: Path, clients: Callable[[], Client]
) -> None:
    raw = RawClient(data_dir)
    raw.hello()
    raw.answer_pings()  # alive until it says otherwise, however slow the test
    raw.send(ev.Subscribe(1, "ex", 10, 2**40))
    error = raw.next()
    assert isinstance(error, ev.Error) and error.code == "invalid_config"
    raw.send(ev.Subscribe(2, "nope", 10, 0))
    error = raw.next()
    assert isinstance(error, ev.Error) and error.code == "queue_not_found"
    raw.send(ev.Delete(3, "ex", ((1, 1),), epoch=999))
    error = raw.next()
    assert isinstance(error, ev.Error) and error.code == "stale_epoch"
    raw.send(ev.FlowAck(42, True, 1))  # acknowledging nothing: ignored
    raw.send(ev.Subscribe(4, "ex", 10, 0))
    result = raw.next()
    assert isinstance(result, ev.Result) and result.value["active"] is True
    assert [f.flow for f in clients().flows("ex")] == [result.value["flow"]]
    raw.close()


def test_keep_alive_loss_unbinds_a_silent_consumer(
    node: NodeProcess, data_dir: Path, clients: Callable[[], Client]
) -> None:
    raw = RawClient(data_dir)
    raw.hello()
    raw.answer_pings()  # alive until it says otherwise, however slow the test
    raw.send(ev.Subscribe(1, "ex", 10, 0))
    assert isinstance(raw.next(), ev.Result)
    _second, rec2 = bound(clients(), "ex")
    raw.stop_answering()  # from now on the raw client never answers a ping
    rec2.wait(["inactive", "active"], timeout=60)
    raw.close()
    # Unbound by the keep-alive, once three heartbeats of silence had passed on the node's
    # clock — and not much later (its watchdog looks at least every heartbeat; the rest
    # is its loop's lateness on a loaded machine, not the test's scheduling):
    _, _, log = node.stop()
    (silent,) = re.findall(r"cutting off .*: no word from the client for ([0-9.]+) s", log)
    assert 3 * HEARTBEAT <= float(silent) < 3 * HEARTBEAT + 5.0, log


def test_an_administrator_unbinds_a_flow(
    node: NodeProcess,
    clients: Callable[[], Client],
    eomsg_bin: str,
    cli_env: dict[str, str],
) -> None:
    first, rec1 = bound(clients(), "ex")
    _second, rec2 = bound(clients(), "ex")
    r = subprocess.run(
        [eomsg_bin, "queue", "unbind", "ex", str(first.flow)],
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (r.returncode, r.stdout) == (
        0,
        f"unbound flow {first.flow} from ex (0 messages go to the next consumer)\n",
    )
    rec1.wait(["active", "inactive"])
    rec2.wait(["inactive", "active"])
    with pytest.raises(Unbound, match="unbound by an administrator"):
        take(first, 1)
    r = subprocess.run(
        [eomsg_bin, "queue", "unbind", "ex", str(first.flow)],
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == ExitCode.NOT_FOUND
    assert (
        r.stderr
        == f"Error: no flow {first.flow} is bound to queue 'ex'; see `eomsg inspect flows ex`\n"
    )


def test_a_higher_priority_newcomer_takes_over_at_once_when_immediate(
    flow_clients: Callable[[], Broker],
) -> None:
    _low, rec_low = bound(flow_clients(), "ex", priority=1)
    _high, rec_high = bound(flow_clients(), "ex", priority=5)
    rec_low.wait(["active", "inactive"])
    rec_high.wait(["active"])
    assert rec_high.events[0].epoch > rec_low.events[0].epoch


def test_without_immediate_a_higher_priority_newcomer_waits(
    flow_clients: Callable[[], Broker],
) -> None:
    low, _rec_low = bound(flow_clients(), "late", priority=1)
    high, rec_high = bound(flow_clients(), "late", priority=5)
    mid, rec_mid = bound(flow_clients(), "late", priority=3)
    # The election as the node holds it once the binds are answered: low still active.
    flows = {f.flow: f.active for f in flow_clients().flows("late")}
    assert flows == {low.flow: True, high.flow: False, mid.flow: False}
    assert (low.active, high.active, mid.active) == (True, False, False)
    low.close()
    rec_high.wait(["inactive", "active"])  # the best of those waiting
    rec_mid.wait(["inactive"])


def test_a_limited_queue_spreads_messages_over_its_active_flows(
    flow_clients: Callable[[], Broker],
) -> None:
    consumers = [bound(flow_clients(), "lim", prefetch=10)[0] for _ in range(3)]
    assert [c.active for c in consumers] == [True, True, False]
    producer = flow_clients()
    n = 400
    for i in range(n):
        producer.publish_async("lim/x", str(i).encode())
    producer.publish("lim/x", b"last")
    got: list[list[int]] = [[], [], []]

    def drain(i: int) -> None:
        consumer = consumers[i]
        consumer.idle_timeout = 2
        for msg in consumer:
            got[i].append(msg.seq)
            msg.delete()
            time.sleep(0.001)  # a consumer that takes time, as real ones do

    threads = [threading.Thread(target=drain, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got[2] == []  # on standby: nothing
    assert sorted(got[0] + got[1]) == list(range(1, n + 2))  # each once
    assert min(len(got[0]), len(got[1])) > n // 5, (len(got[0]), len(got[1]))


def test_one_client_is_active_on_one_queue_and_standby_on_another(
    flow_clients: Callable[[], Broker],
) -> None:
    other = flow_clients()
    holder, _ = bound(other, "ex2")
    mine = flow_clients()
    on_ex, rec_ex = bound(mine, "ex")
    on_ex2, rec_ex2 = bound(mine, "ex2")
    assert (on_ex.active, on_ex2.active) == (True, False)
    holder.close()
    rec_ex2.wait(["inactive", "active"])
    # each consumer's callbacks run on a thread of its own: ex's may come after ex2's
    rec_ex.wait(["active"])
    assert on_ex.active


def test_a_change_is_resent_until_acknowledged(
    node: NodeProcess, data_dir: Path, clients: Callable[[], Client]
) -> None:
    first, _ = bound(clients(), "ex")
    raw = RawClient(data_dir)
    raw.hello()
    raw.answer_pings()  # alive until it says otherwise, however slow the test
    raw.send(ev.Subscribe(7, "ex", 10, 0))
    result = raw.next()
    assert isinstance(result, ev.Result) and result.value["active"] is False
    first.close()

    def changes_until(reply_to: int | None, count: int = 0) -> list[ev.FlowChanged]:
        """The indications that arrive before ``count`` of them, or before the reply to
        request ``reply_to`` (the node answers a connection's requests in order)."""
        seen: list[ev.FlowChanged] = []
        while len(seen) < count or reply_to is not None:
            event = raw.next()
            if isinstance(event, ev.FlowChanged):
                seen.append(event)
            elif isinstance(event, ev.Error) and event.rid == reply_to:
                break
        return seen

    resent = changes_until(None, 3)  # the same indication, again and again
    assert len(set(resent)) == 1 and resent[0].active and resent[0].rid == 7
    raw.send(ev.FlowAck(7, True, resent[0].epoch))
    raw.send(ev.Subscribe(8, "nope", 10, 0))  # answered once the ack was taken
    changes_until(8)  # one may have crossed the ack
    # A control, from now on: a change left unacknowledged on another queue, resent
    # twice — so the node's resend timers have run for two periods since the ack.
    holder, _ = bound(clients(), "ex2")
    control = RawClient(data_dir)
    control.hello()
    control.answer_pings()
    control.send(ev.Subscribe(1, "ex2", 10, 0))
    standby = control.next()
    assert isinstance(standby, ev.Result) and standby.value["active"] is False
    holder.close()
    resent = 0
    while resent < 3:
        resent += isinstance(control.next(), ev.FlowChanged)
    raw.send(ev.Subscribe(9, "nope", 10, 0))
    assert changes_until(9) == []  # none since: the ack stopped them
    raw.close()
    control.close()


def test_a_deposed_consumer_cannot_delete(flow_clients: Callable[[], Broker]) -> None:
    producer = flow_clients()
    for i in range(3):
        producer.publish("ex/a", f"m{i}".encode())
    low, rec_low = bound(flow_clients(), "ex", priority=1)
    held = take(low, 3)
    high, _ = bound(flow_clients(), "ex", priority=5)
    rec_low.wait(["active", "inactive"])
    with pytest.raises(StaleEpoch, match="no longer active"):
        held[0].delete().result(10)
    got = take(high, 3)
    assert [m.seq for m in got] == [m.seq for m in held]
    assert all(m.delete().result(10) for m in got)
    with pytest.raises(StaleEpoch):  # settled since, and the epoch is over all the same
        flow_clients().delete("ex", [held[1].delivered.key], epoch=held[1].epoch)


def test_the_application_hears_of_a_lost_connection_at_once(
    node: NodeProcess, data_dir: Path
) -> None:
    client = eomsg.connect(data_dir)
    consumer, rec = bound(client, "ex")
    node.kill()
    rec.wait(["active", "inactive"])
    assert not consumer.active
    with pytest.raises(Unavailable):
        take(consumer, 1)
    client.close()


def test_a_queue_as_an_election(flow_clients: Callable[[], Broker]) -> None:
    with flow_clients().elect("scheduler", priority=5) as leader:
        assert leader.wait_active(5)
        follower = flow_clients().elect("scheduler", priority=9)  # not immediate: waits
        with follower:
            assert not follower.wait_active(0.5)
            leader.close()
            assert follower.wait_active(5)
    config = flow_clients().queue_config("scheduler")
    assert (config.max_active, config.immediate) == (1, False)


def test_consume_prints_each_change_of_activity(
    node: NodeProcess,
    clients: Callable[[], Client],
    eomsg_bin: str,
    cli_env: dict[str, str],
) -> None:
    first, _ = bound(clients(), "late")
    follower = subprocess.Popen(
        [eomsg_bin, "consume", "late", "--follow", "--json", "--priority", "1"],
        env=cli_env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert follower.stdout is not None
    try:
        standby = json.loads(follower.stdout.readline())
        assert standby == {
            "event": "inactive",
            "queue": "late",
            "flow": standby["flow"],
            "epoch": 0,
        }
        clients().publish("late/a", b"hello")
        first.close()  # gives back "hello", undeleted
        active = json.loads(follower.stdout.readline())
        assert active["event"] == "active" and active["flow"] == standby["flow"]
        assert json.loads(follower.stdout.readline())["payload"] == "hello"
        r = subprocess.run(
            [eomsg_bin, "inspect", "flows", "late", "--json"],
            env=cli_env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        (flow,) = json.loads(r.stdout)
        assert (flow["flow"], flow["state"], flow["epoch"], flow["priority"]) == (
            standby["flow"],
            "active",
            active["epoch"],
            1,
        )
    finally:
        follower.terminate()
        follower.wait(10)


def test_consume_without_follow_on_standby_stops_at_once(
    node: NodeProcess, clients: Callable[[], Client], eomsg_bin: str, cli_env: dict[str, str]
) -> None:
    bound(clients(), "ex")
    clients().publish("ex/a", b"for the active one")
    r = subprocess.run(
        [eomsg_bin, "consume", "ex"], env=cli_env, capture_output=True, text=True, timeout=30
    )
    flow = int(r.stderr.split()[2])
    assert (r.returncode, r.stdout, r.stderr) == (
        ExitCode.CONFLICT,  # not the exit 0 of an empty queue: this one is not its turn
        "",
        f"standby: flow {flow} on ex\n"
        f"Error: flow {flow} on ex is on standby: another consumer is active (use --follow "
        "to wait for its turn)\n",
    )
    r = subprocess.run(
        [eomsg_bin, "consume", "ex", "--json"],
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == ExitCode.CONFLICT
    assert [a["event"] for a in activity(r.stdout)] == ["inactive"] and messages(r.stdout) == []


def test_top_shows_queues_and_their_consumers(
    node: NodeProcess, clients: Callable[[], Client], eomsg_bin: str, cli_env: dict[str, str]
) -> None:
    first, _ = bound(clients(), "ex")
    bound(clients(), "ex")
    producer = clients()
    for _ in range(50):
        producer.publish_async("ex/a", b"x")
    producer.publish("ex/a", b"x")

    def top(*args: str) -> str:
        r = subprocess.run(
            [eomsg_bin, "top", "-n", "1", "--interval", "0.5", *args],
            env={**cli_env, "COLUMNS": "200"},
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert r.returncode == 0, r.stderr
        return r.stdout

    frame = json.loads(top("--json"))
    ex = next(q for q in frame["queues"] if q["name"] == "ex")
    assert (ex["max_active"], ex["flows"], ex["active"]) == (1, 2, 1)
    assert [(f["queue"], f["state"]) for f in frame["flows"]] == [
        ("ex", "active"),
        ("ex", "standby"),
    ]
    assert frame["flows"][0]["flow"] == first.flow
    text = top()
    assert "exclusive" in text and "1 active, 1 standby" in text and "standby" in text


CONSUMER = textwrap.dedent(
    """
    import os, sys, eomsg
    log = open(sys.argv[2], "a", buffering=1)
    with eomsg.connect(sys.argv[1]) as client:
        with client.consumer("ex", prefetch=16) as consumer:
            print("ready", flush=True)
            for msg in consumer:
                log.write(f"take {msg.seq}\\n")
                ok = msg.delete().result()
                log.write(f"{'ok' if ok else 'dup'} {msg.seq}\\n")
                os.fsync(log.fileno())
    """
)


@pytest.mark.slow
def test_failover_after_sigkill_of_the_active_consumer(
    node: NodeProcess,
    data_dir: Path,
    tmp_path: Path,
    eomsg_bin: str,
    cli_env: dict[str, str],
) -> None:
    """The active consumer process is SIGKILLed mid-stream: the standby is active within
    the keep-alive timeout (plus slack for a loaded machine), no message is deleted by
    both, none is lost."""
    n = 3000
    log_a = tmp_path / "a.log"
    a = subprocess.Popen(
        [sys.executable, "-c", CONSUMER, str(data_dir), str(log_a)],
        env=cli_env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert a.stdout is not None and a.stdout.readline() == "ready\n"
    b = subprocess.Popen(
        [eomsg_bin, "consume", "ex", "--follow", "--json"],
        env=cli_env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert b.stdout is not None
    assert json.loads(b.stdout.readline())["event"] == "inactive"
    try:
        with eomsg.connect(data_dir) as producer:
            for i in range(n):
                producer.publish_async("ex/load", str(i).encode())
                if i == n // 3:
                    while log_a.read_text().count("ok") < 200:
                        time.sleep(0.01)
                    a.send_signal(signal.SIGKILL)
                    killed = time.monotonic()
                    line = json.loads(b.stdout.readline())
                    failover = time.monotonic() - killed
                    assert line["event"] == "active"
            producer.publish("ex/load", b"end")
        got_b: list[int] = []
        while True:
            m = json.loads(b.stdout.readline())
            got_b.append(m["seq"])
            if m["payload"] == "end":
                break
        b.terminate()  # deletes what it printed, then exits
        assert b.wait(60) == 128 + signal.SIGTERM  # a hang, not a slow machine, fails it
    finally:
        b.terminate()
        b.wait(10)
        a.wait(10)
    assert failover <= 3 * HEARTBEAT + 5.0, failover  # the keep-alive, + a busy machine
    lines = log_a.read_text().splitlines()
    ok_a = {int(x.split()[1]) for x in lines if x.startswith("ok ")}
    taken_a = {int(x.split()[1]) for x in lines if x.startswith("take ")}
    undecided = taken_a - ok_a - {int(x.split()[1]) for x in lines if x.startswith("dup ")}
    assert not ok_a & set(got_b)  # no message processed by both flows
    assert len(got_b) == len(set(got_b))
    # none lost: every message went to one of them; an undecided one (killed while its
    # delete was in flight) was deleted by A exactly when B never received it
    assert ok_a | set(got_b) | undecided == set(range(1, n + 2))
    assert len(undecided) <= 1
    with eomsg.connect(data_dir) as client:
        stats = next(s for s in client.stats() if s.name == "ex")
        assert (stats.depth, stats.deleted) == (0, n + 1)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_the_kernel_hands_to_another_thread_still_stops_consume(
    node: NodeProcess, eomsg_bin: str, cli_env: dict[str, str], signum: int
) -> None:
    """A signal sent to the process may be taken by any of its threads that does not
    block it; Python runs its handler on the main thread only, and a main thread asleep
    in a lock never runs it. `consume --follow` waiting for messages must stop all the
    same: here the signal goes to another thread (the client's loop) on purpose."""
    proc = subprocess.Popen(
        [eomsg_bin, "consume", "ex", "--follow", "--json"],
        env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline())["event"] == "active"  # bound, and idle
        others = [int(t.name) for t in Path(f"/proc/{proc.pid}/task").iterdir()]
        others.remove(proc.pid)  # the main thread's id is the process's
        assert others  # the client's loop thread
        os.kill(others[0], signum)  # kill(2) with a thread's id: that thread gets it first
        assert proc.wait(30) == 128 + signum
    finally:
        proc.kill()
        proc.wait()
