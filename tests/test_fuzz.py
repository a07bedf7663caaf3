"""Fuzzing a real node (eomsg.chaos.fuzz, scripts/fuzz.py), CI-sized: sessions past a
valid hello sending every request with hostile values, wrong bodies, flipped and random
bytes — no crash, no hang, no internal error, nothing written outside the data
directory. And the fuzzer itself: it can draw every request and every operation's
arguments, and reads what a handler raised from a node's log."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from eomsg.chaos.fuzz import REQUESTS, Frames, Values, _raised, fuzz
from eomsg.core.operations import OPERATIONS

ROOT = Path(__file__).resolve().parent.parent


def test_every_request_and_every_operation_is_drawn(tmp_path: Path) -> None:
    frames = Frames(Values(random.Random(3), tmp_path))
    kinds = {frames.next()[0] for _ in range(6000)}
    calls = {k.removeprefix("call ") for k in kinds if k.startswith("call ")}
    assert calls == set(OPERATIONS)
    shaped = {k for k in kinds if not k.startswith("call ") and "(" not in k} - {"flipped bytes"}
    assert shaped == {c.__name__ for c in REQUESTS[:8]} - {"Call"} | {"random bytes"}
    assert {f"{c.__name__} (wrong values)" for c in REQUESTS} <= kinds


def test_the_same_seed_draws_the_same_frames(tmp_path: Path) -> None:
    def draw(seed: int) -> list[tuple[str, bytes]]:
        frames = Frames(Values(random.Random(seed), tmp_path))
        return [frames.next() for _ in range(300)]

    assert draw(4) == draw(4) != draw(5)


def test_what_a_handler_raised_is_read_from_the_node_s_log(tmp_path: Path) -> None:
    log = tmp_path / "node.log"
    log.write_text(
        "2026-11-26 ERROR eomsg.server: session unix: request 3 failed\n"
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1, in run\n'
        "    json.dumps(spec)\n"
        "TypeError: Object of type bytes is not JSON serializable\n"
        "2026-11-26 INFO eomsg.server: closing unix\n"
    )
    assert _raised(log) == ["TypeError: Object of type bytes is not JSON serializable"]


@pytest.mark.chaos
@pytest.mark.slow
def test_a_fuzzed_node_neither_dies_nor_hangs_nor_fails_inside(tmp_path: Path) -> None:
    found = fuzz(tmp_path / "run", 20.0, seed=1)
    assert found.sessions > 20 and sum(found.frames.values()) > 200
    assert not found.failed, json.dumps(
        {**found.to_json(), "internal": found.internal, "raised": found.tracebacks}
    )


def test_fuzz_script_refuses_a_used_dir_and_no_time(tmp_path: Path) -> None:
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("")
    script = [sys.executable, str(ROOT / "scripts" / "fuzz.py")]
    used = subprocess.run(
        [*script, "--dir", str(tmp_path / "used")], capture_output=True, text=True
    )
    assert (used.returncode, used.stdout) == (
        2,
        f"Error: {tmp_path / 'used'} is not empty: a run starts afresh (use a new --dir)\n",
    )
    none = subprocess.run([*script, "--seconds", "0"], capture_output=True, text=True)
    assert (none.returncode, none.stdout) == (
        2,
        "Error: --seconds must be above 0 (use --seconds 600 for ten minutes)\n",
    )
