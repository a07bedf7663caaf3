"""A clean install: the wheel ``pip wheel .`` builds, installed without extras into a
virtual environment of its own (nothing of this one's: no PySpark, no pandas, no dev
tools), runs a node and every kind of command against it. ``eomsg serve`` once failed on
a clean install because a module it imported came only with the Spark extra."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.conftest import NodeProcess

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def run(*cmd: str | Path, env: dict[str, str] | None = None) -> str:
    """``cmd``'s output; it must succeed. Run outside the clone, whose ``eomsg`` package
    would otherwise come first on the path."""
    done = subprocess.run(
        [str(c) for c in cmd], env=env, capture_output=True, text=True, timeout=900, cwd="/"
    )
    assert done.returncode == 0, f"{cmd}: {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``bin`` directory of a new virtual environment holding the wheel alone."""
    base = tmp_path_factory.mktemp("install")
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", base / "dist", ROOT)
    (wheel,) = (base / "dist").glob("eomsg-*.whl")
    venv.create(base / "venv", with_pip=True)
    bin_dir = base / "venv" / "bin"
    run(bin_dir / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel)
    return bin_dir


def test_the_wheel_alone_serves_publishes_consumes_and_inspects(
    clean: Path, tmp_path: Path
) -> None:
    python = clean / "python"
    absent = (
        "import importlib.util as u; "
        "print([m for m in ('pyspark', 'pandas', 'pytest') if u.find_spec(m)])"
    )
    assert run(python, "-c", absent).strip() == "[]"  # nothing but what eomsg declares
    where = "import eomsg; print(eomsg.__file__)"
    assert str(clean.parent) in run(python, "-c", where)  # the installed copy, not the clone

    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("EOMSG_")}
    env |= {"EOMSG_DATA": str(data), "PYTHONPATH": ""}
    eomsg = clean / "eomsg"
    assert run(eomsg, "--version", env=env).startswith("eomsg ")
    run(eomsg, "--init", "queue", "create", "q", "--subscribe", "q/>", env=env)  # embedded
    node = NodeProcess(str(eomsg), data, env).start()
    try:
        assert "published seq 1" in run(eomsg, "publish", "q/a", "hello", env=env)
        got = [
            json.loads(x)
            for x in run(eomsg, "consume", "q", "--max", "1", "--json", env=env).splitlines()
        ]
        assert [m["payload"] for m in got if "event" not in m] == ["hello"]
        (queue,) = json.loads(run(eomsg, "inspect", "queues", "--json", env=env))
        assert (queue["name"], queue["depth"], queue["deleted"]) == ("q", 0, 1)
        assert "q/a" in run(eomsg, "inspect", "log", env=env)
    finally:
        code, _, err = node.stop()
    assert code == 0, err
    assert json.loads(run(eomsg, "inspect", "queues", "--json", env=env))[0]["deleted"] == 1
