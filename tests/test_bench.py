"""scripts/bench.py keeps working and keeps its output contract (no timing asserted)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "scripts" / "bench.py"


def bench(*args: str, env: dict[str, str] | None = None) -> dict[str, object]:
    """Run scripts/bench.py with ``args`` and ``--json``; its one JSON object."""
    out = subprocess.run(
        [sys.executable, str(BENCH), *args, "--json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env=env,
    ).stdout
    result: dict[str, object] = json.loads(out)
    return result


@pytest.mark.parametrize(
    "scenario", ["embedded-publish", "embedded-publish-batch", "embedded-consume"]
)
def test_bench_prints_one_json_object(scenario: str) -> None:
    result = bench(
        "--scenario", scenario, "--n", "300", "--batch", "100", "--log-size", "200",
        "--rounds", "2",
    )  # fmt: skip
    assert result["scenario"] == scenario and result["n"] == 300
    assert result["seconds"] > 0 and result["msgs_per_s"] > 0  # type: ignore[operator]
    assert len(result["rounds_msgs_per_s"]) == 2 and result["log_size"] == 200  # type: ignore[arg-type]


def test_bench_rejects_bad_arguments() -> None:
    r = subprocess.run(
        [sys.executable, str(BENCH), "--scenario", "embedded-consume", "--n", "0"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 2 and "--n and --batch must be positive" in r.stderr


@pytest.mark.parametrize("scenario", ["publish", "publish-c32", "consume", "e2e", "latency"])
def test_broker_scenarios_print_one_json_object(scenario: str) -> None:
    result = bench("--scenario", scenario, "--n", "64", "--clients", "4", "--rounds", "1")
    assert result["scenario"] == scenario and result["msgs_per_s"] > 0  # type: ignore[operator]
    if scenario == "latency":
        assert 0 < result["p50_ms"] <= result["p99_ms"]  # type: ignore[operator]


@pytest.mark.parametrize("scenario", ["failover-unbind", "failover-kill"])
def test_failover_scenarios_print_one_json_object(scenario: str) -> None:
    result = bench("--scenario", scenario, "--n", "1", "--held", "5")
    timings = result["activate_ms"]
    assert result["scenario"] == scenario and result["held"] == 6
    assert 0 < timings["p50"] <= timings["max"]  # type: ignore[index]


@pytest.mark.parametrize(
    ("scenario", "app"),
    [("embedded-txn", "duckdb"), ("txn", "sqlite"), ("txn", "postgresql"), ("express", "duckdb")],
)
def test_exactly_once_scenarios_check_their_outcome(
    scenario: str, app: str, request: pytest.FixtureRequest
) -> None:
    env = dict(os.environ)
    if app == "postgresql":
        env["EOMSG_BENCH_PG"] = request.getfixturevalue("pg_dsn")
    result = bench(
        "--scenario", scenario, "--n", "200", "--clients", "4", "--app", app, "--rounds", "2",
        "--batch", "50", env=env,
    )  # fmt: skip
    assert result["scenario"] == scenario and result["n"] == 200
    rounds = result["rounds_msgs_per_s" if scenario == "express" else "rounds_tx_per_s"]
    assert result["msgs_per_s"] > 0 and len(rounds) == 2  # type: ignore[operator, arg-type]


def test_wal_scenario_reports_latency_and_the_wal_bound() -> None:
    result = bench("--scenario", "wal", "--n", "2000", "--rounds", "1")
    assert result["scenario"] == "wal" and result["msgs_per_s"] > 0  # type: ignore[operator]
    assert 0 < result["p50_ms"] <= result["p99_ms"] <= result["max_ms"]  # type: ignore[operator]
    assert result["wal_max_mb"] >= 0 and result["checkpoints"] >= 0  # type: ignore[operator]


def test_replay_scenario_prints_rows_per_second_and_startup() -> None:
    from tests.conftest import spark_or_skip

    spark_or_skip()
    result = bench("--scenario", "replay", "--n", "500", "--rounds", "1", "--transform", "rows")
    assert result["scenario"] == "replay" and result["rows_per_s"] > 0  # type: ignore[operator]
    assert result["spark_startup_s"] > 0 and result["job_fixed_s"] > 0  # type: ignore[operator]


def test_the_link_throughput_scenario_reports_medians_of_its_rounds() -> None:
    result = bench("--scenario", "link-throughput", "--n", "300", "--rounds", "2")
    assert result["scenario"] == "link-throughput" and result["rounds"] == 2
    rounds = result["each_round"]
    assert isinstance(rounds, list) and len(rounds) == 2
    for key in ("single_node_publish_per_s", "link_delivered_per_s", "link_vs_single"):
        assert result[key] == pytest.approx(statistics.median(r[key] for r in rounds), abs=1e-3)


def test_the_link_egress_scenario_reports_both_modes() -> None:
    result = bench("--scenario", "link-egress", "--n", "300")
    assert result["scenario"] == "link-egress" and result["n"] == 300
    for mode in ("store", "memory"):
        assert result[f"{mode}_consumed_per_s"] > 0  # type: ignore[operator]
    assert result["store_written_at_b"] == 300  # stored: every message written at b
