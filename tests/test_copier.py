"""The copier test, as Kafka's transactions test runs it: 20,000 messages copied from
queue ``a`` into the application's database and onward to ``b`` by ``scripts/copier.py``
(one eomsg transaction per 10 messages), while the copier and the node are SIGKILLed again and
again. Output equals input: every message once in the table and once in ``b``, in the
order of ``a``."""

from __future__ import annotations

import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest

import eomsg
from tests.conftest import NodeProcess, queue_depth, running_until_depth

pytestmark = pytest.mark.slow

COPIER = Path(__file__).parent.parent / "scripts" / "copier.py"
N = 20_000
KILLS = 12  # alternately the copier and the node


def start_copier(data_dir: Path, app: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(COPIER), "--broker", str(data_dir), "--app", str(app),
         "--batch", "10", "--idle", "1"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_copier_under_repeated_sigkills(
    serve: Callable[..., NodeProcess], data_dir: Path, cli_env: dict[str, str], tmp_path: Path
) -> None:
    rng = random.Random(20_000)
    app = tmp_path / "app.duckdb"
    payloads = [f"m{i:05d}".encode() for i in range(N)]
    node = serve()
    with eomsg.connect(data_dir) as client:
        client.create_queue(eomsg.QueueConfig("a", subscriptions=("a",)))
        client.create_queue(eomsg.QueueConfig("b", subscriptions=("b",)))
        for i in range(0, N, 5000):
            client.publish_batch([eomsg.Outgoing("a", p) for p in payloads[i : i + 5000]])

    left_at_kills: list[int] = []  # messages of a not yet copied, after each kill
    for round_ in range(KILLS):
        # Each kill lands mid-stream: 12 of at most 1,200 messages leave a with work.
        left = queue_depth(data_dir, "a") - rng.randint(400, 1200)
        copier = running_until_depth(
            lambda: start_copier(data_dir, app, cli_env), data_dir, "a", left
        )
        if round_ % 2:
            node.kill()  # SIGKILL: the copier loses its node mid-stream
            node = serve()
        else:
            copier.kill()
        copier.communicate(timeout=60)
        left_at_kills.append(queue_depth(data_dir, "a"))
    for _ in range(20):
        copier = start_copier(data_dir, app, cli_env)
        _, err = copier.communicate(timeout=300)
        assert copier.returncode == 0, err
        with eomsg.connect(data_dir) as client:
            if queue_depth(data_dir, "a") == 0 and not client.txns():
                break
    else:
        pytest.fail("the copier never finished")
    assert all(left_at_kills), left_at_kills  # each kill came while copying
    assert left_at_kills == sorted(left_at_kills, reverse=True)

    with duckdb.connect(str(app)) as db:
        rows = db.execute("SELECT count(*), count(DISTINCT src_seq) FROM copied").fetchone()
        table = {bytes(r[0]) for r in db.execute("SELECT payload FROM copied").fetchall()}
    assert rows == (N, N) and table == set(payloads)
    with eomsg.connect(data_dir) as client:
        copies = []
        while batch := client.fetch("b", 5000):
            copies.extend(batch)
        assert [d.message.payload for d in copies] == payloads  # once each, in a's order
        srcs = [int(d.message.headers["src"]) for d in copies]
        assert srcs == sorted(srcs)
        stats = {s.name: s for s in client.stats()}
        assert stats["a"].deleted == N and stats["a"].depth == 0
