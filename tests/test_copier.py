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
from tests.conftest import NodeProcess

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

    killed = {"copier": 0, "node": 0}
    left_at_kills: list[int] = []  # messages of a not yet copied, after each kill
    for round_ in range(KILLS + 20):
        copier = start_copier(data_dir, app, cli_env)
        if round_ < KILLS:
            try:
                copier.wait(rng.uniform(1.0, 2.5))
            except subprocess.TimeoutExpired:
                if round_ % 2:
                    node.kill()  # SIGKILL: the copier loses its node mid-stream
                    killed["node"] += 1
                    node = serve()
                else:
                    copier.kill()
                    killed["copier"] += 1
            copier.communicate(timeout=60)
            with eomsg.connect(data_dir) as client:
                left_at_kills.append({st.name: st.depth for st in client.stats()}["a"])
            continue
        _, err = copier.communicate(timeout=300)
        assert copier.returncode == 0, err
        with eomsg.connect(data_dir) as client:
            if {s.name: s.depth for s in client.stats()}["a"] == 0 and not client.txns():
                break
    else:
        pytest.fail("the copier never finished")
    assert killed == {"copier": KILLS // 2, "node": KILLS // 2}
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
