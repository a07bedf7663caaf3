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

from eomsg.chaos.fuzz import REQUESTS, Frames, Values, _frame, _internal, _raised, fuzz
from eomsg.core.operations import OPERATIONS
from eomsg.wire import events as ev

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


def test_what_the_node_answered_changes_values_not_which_frames_follow(tmp_path: Path) -> None:
    """The seqs a node handed out feed later frames; how many came by the time one is
    drawn depends on timing — the kinds of frame drawn must not."""
    quiet, told = Values(random.Random(4), tmp_path), Values(random.Random(4), tmp_path)
    told.seen["seq"].extend([40, 41, 42])
    a, b = Frames(quiet), Frames(told)
    assert [a.next()[0] for _ in range(300)] == [b.next()[0] for _ in range(300)]


def test_an_internal_error_is_blamed_on_the_frame_whose_rid_it_names() -> None:
    first, second = _frame([ev.Fetch.TYPE, 7, "q", 1, 0.0]), _frame([ev.Fetch.TYPE, 8, "q", 1])
    answers = [ev.Error(7, "error", "internal error: boom")]
    (said,) = _internal(answers, [("Fetch", first), ("Fetch", second)])
    assert said.startswith("Fetch (rid 7): internal error: boom after ") and repr(first) in said
    assert repr(second) not in said
    # A rid sent twice in a session: both frames are named, either may be the one.
    call = _frame([ev.Call.TYPE, 7, "audit", {}])
    (said,) = _internal(answers, [("Fetch", first), ("call audit", call)])
    assert said.startswith("Fetch or call audit (rid 7): ") and repr(call) in said


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
    found = fuzz(tmp_path / "run", 900.0, seed=1, sessions=300)  # sessions, not seconds
    assert found.sessions == 300 and sum(found.frames.values()) > 1000
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
