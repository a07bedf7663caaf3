"""Every example a script's ``--help`` shows runs as shown (issue 35, item 13: the
three-node example of ``scripts/chaos.py --help`` failed with "use --producers 3").

A chaos run takes minutes, so its examples run as their plan (``--dry-run``: the options
parsed, the plan checked and its faults drawn — where the example failed); the fuzzer
has no plan to print, so its examples run for real, for a few seconds."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ("chaos.py", "fuzz.py", "bench.py")
SHORT = "3"  # seconds a fuzzing example runs instead of what it shows


def examples(script: str) -> list[list[str]]:
    """The argument lists of the ``python scripts/SCRIPT …`` lines of its --help."""
    shown = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script), "--help"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    ).stdout  # fmt: skip
    found = re.findall(rf"^\s*python scripts/{re.escape(script)}(.*)$", shown, re.MULTILINE)
    return [line.split() for line in found]


EXAMPLES = [(script, args) for script in SCRIPTS for args in examples(script)]


def test_the_scripts_show_examples() -> None:
    """What the test below runs: chaos's examples, the three-node one among them, and the
    fuzzer's (bench.py's --help shows none)."""
    assert {script for script, _ in EXAMPLES} == {"chaos.py", "fuzz.py"}
    assert any("--nodes" in args for script, args in EXAMPLES if script == "chaos.py")


@pytest.mark.parametrize(("script", "args"), EXAMPLES, ids=[" ".join(a) for _, a in EXAMPLES])
def test_each_example_of_a_scripts_help_runs_as_shown(
    script: str, args: list[str], tmp_path: Path
) -> None:
    if script == "chaos.py":
        run = [*args, "--dry-run"]
    else:  # fuzz.py: as shown, for a few seconds
        at = args.index("--seconds")
        run = [*args[: at + 1], SHORT, *args[at + 2 :], "--dir", str(tmp_path / "run")]
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script), *run],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    if script == "chaos.py":
        assert re.fullmatch(r"\d+ faults over [\d.]+ s", done.stdout.splitlines()[-1])
    else:
        found = json.loads(done.stdout)
        # it ran its time (finishing the session under way: a loaded machine overruns)
        assert found["seconds"] >= float(SHORT) and found["crashes"] == 0
