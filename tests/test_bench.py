"""scripts/bench.py keeps working and keeps its output contract (no timing asserted)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from scripts.bench_soak import MIB, Phase, Sample, summarize

BENCH = Path(__file__).resolve().parent.parent / "scripts" / "bench.py"


def bench(*args: str, env: dict[str, str] | None = None) -> dict[str, object]:
    """Run scripts/bench.py with ``args`` and ``--json``; its one JSON object."""
    out = subprocess.run(
        [sys.executable, str(BENCH), *args, "--json"],
        capture_output=True,
        text=True,
        check=True,
        # A guard against a hang, not a measure: the replay scenario (a JVM, a Spark job)
        # took over 120 s on this 2-core machine while other work loaded it.
        timeout=600,
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


def test_the_cli_scenario_times_each_command_served_and_embedded(eomsg_bin: str) -> None:
    result = bench("--scenario", "cli", "--n", "1", "--baseline", eomsg_bin)
    commands = ["version", "help", "publish", "inspect queues"]
    for name in [*commands, "publish embedded", "inspect queues embedded"]:
        assert result[f"{name} ms"] > 0 and result[f"{name} baseline ms"] > 0  # type: ignore[operator]
    assert all(result[f"{name} loaded"] == [] for name in commands)  # through the node
    assert "duckdb" in result["inspect queues embedded loaded"]  # type: ignore[operator]
    for floor in ("python", "import typer", "import duckdb pyarrow"):  # beside them, the floor
        assert result[f"{floor} ms"] > 0  # type: ignore[operator]


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


@pytest.mark.spark
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


def _phase_samples(
    name: str, times: range, rss: Callable[[float], float], rate: int = 10_000, depth: int = 5
) -> list[Sample]:
    return [Sample(t=t, phase=name, rss_mib=rss(t), published=rate * t, depth=depth) for t in times]


def test_the_soak_summary_is_taken_after_warm_up() -> None:
    """A 30-minute phase at 10,000/s: warm after 2 minutes (not 20 %); the RSS climbs
    until then and stays within 400-440 MiB after; samples of other phases are left out."""
    steady = [400.0, 440.0, 420.0, 410.0]
    samples = _phase_samples("start", range(0, 5), lambda t: 1000.0)
    samples += _phase_samples(
        "soak", range(5, 1805, 5), lambda t: 200 + t if t < 125 else steady[(t // 5) % 4]
    )
    phase = Phase("soak", 5.0, 1805.0, (50_000, 18_050_000), (50_000, 18_050_000))
    summary = summarize(samples, phase, per_second=10_000)
    assert summary["warmup_end_s"] == 125.0
    assert summary["publish_rate"] == 10_000.0 and summary["consume_rate"] == 10_000.0
    assert summary["samples"] == 360 and summary["steady_samples"] == 336
    assert summary["rss_start_mib"] == 205.0 and summary["rss_max_mib"] == 440.0
    assert summary["max_depth"] == 5 and summary["kept_up"] is True
    s = summary["steady"]
    assert (s["rss_min_mib"], s["rss_median_mib"], s["rss_max_mib"]) == (400.0, 415.0, 440.0)
    assert s["spread"] == round(40 / 415, 4) and s["flat"] is True
    assert s["slope_mib_per_min"] == pytest.approx(0.0, abs=0.05)  # a repeating pattern


def test_a_growing_rss_is_measured_per_minute_and_per_message() -> None:
    """20 MiB a minute at 10,000 messages a second is 20 MiB per 600,000 messages, and
    not flat; a short phase is warm after its first 20 %; a queue deeper than a second's
    worth of messages did not keep up; without a rate, nobody asks."""
    samples = _phase_samples("soak", range(0, 301, 5), lambda t: 100 + 20 * t / 60, depth=12_000)
    phase = Phase("soak", 0.0, 300.0, (0, 3_000_000), (0, 2_988_000))
    summary = summarize(samples, phase, per_second=10_000)
    assert summary["warmup_end_s"] == 60.0 and summary["kept_up"] is False
    assert summary["consume_rate"] == 9960.0
    assert summary["rss_growth_bytes_per_message"] == pytest.approx(100 * MIB / 3_000_000, abs=0.1)
    s = summary["steady"]
    assert s["slope_mib_per_min"] == pytest.approx(20.0)
    assert s["bytes_per_message"] == pytest.approx(20 * MIB / 600_000, abs=0.1)
    assert (s["rss_min_mib"], s["rss_max_mib"], s["flat"]) == (120.0, 200.0, False)
    assert "kept_up" not in summarize(samples, phase)


def test_a_phase_without_samples_after_warm_up_has_no_steady_figures() -> None:
    phase = Phase("drain", 10.0, 10.5, (100, 100), (0, 100))
    summary = summarize(_phase_samples("drain", range(10, 11), lambda t: 50.0, rate=0), phase)
    assert summary["steady_samples"] == 0 and "steady" not in summary
    assert summary["rss_growth_bytes_per_message"] is None and summary["consumed"] == 100


def test_the_soak_scenario_keeps_the_queue_empty_and_samples_the_node() -> None:
    result = bench("--scenario", "soak", "--seconds", "2", "--rate", "200", "--sample", "1")
    assert result["scenario"] == "soak" and result["error"] is None and result["node_exit"] == 0
    assert result["failed"] == 0 and result["published"] == result["consumed"] > 0
    assert list(result["phases"]) == ["soak", "drain"]  # type: ignore[arg-type]
    samples = result["samples"]
    assert isinstance(samples, list) and samples[-1]["depth"] == 0
    assert {s["phase"] for s in samples} == {"soak", "drain"}
    assert all(s["rss_mib"] > 0 and set(s["disk_mib"]) >= {"duckdb", "wal", "journal"}
               for s in samples)  # fmt: skip


def test_the_backlog_scenario_publishes_n_and_drains_them() -> None:
    result = bench(
        "--scenario", "soak-backlog", "--n", "3000", "--batch", "500", "--drain", "--sample", "1",
    )  # fmt: skip
    assert result["published"] == result["consumed"] == 3000 and result["node_exit"] == 0
    phases = result["phases"]
    assert isinstance(phases, dict) and list(phases) == ["backlog", "drain"]
    assert phases["backlog"]["published"] == 3000 and phases["drain"]["consumed"] == 3000


def test_a_node_that_dies_is_reported_with_its_exit_code_and_stderr() -> None:
    r = subprocess.run(
        [sys.executable, str(BENCH), "--scenario", "soak", "--seconds", "1",
         "--serve-arg=--no-such-option", "--json"],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert r.returncode == 1, r.stderr
    assert "bench: the node exited with code 2; its stderr ends:" in r.stderr
    assert "No such option: --no-such-option" in r.stderr
    result = json.loads(r.stdout)
    assert result["node_exit"] == 2 and result["samples"] == [] and result["phases"] == {}
    assert result["serve_command"][-1] == "--no-such-option"


def test_the_soak_options_are_checked_before_anything_runs() -> None:
    r = subprocess.run(
        [sys.executable, str(BENCH), "--scenario", "soak", "--drain"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert r.returncode == 2 and "--drain applies to soak-backlog only" in r.stderr
