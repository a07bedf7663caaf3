"""Shared fixtures: a controllable clock, nodes on temporary data directories, and the
``eomsg`` executable for subprocess tests."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from eomsg.node.node import Node, NodeSettings


class FakeClock:
    """Wall-clock seconds that move only when a test says so."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


NodeFactory = Callable[..., Node]


@pytest.fixture
def open_node(data_dir: Path, clock: FakeClock) -> Iterator[NodeFactory]:
    """Open nodes on ``data_dir`` with the fake clock; all are closed at teardown."""
    opened: list[Node] = []

    def factory(**settings: object) -> Node:
        node = Node.open(data_dir, NodeSettings(**{"tick": None, **settings}), clock)  # type: ignore[arg-type]
        opened.append(node)
        return node

    yield factory
    for node in opened:
        node.close()


@pytest.fixture
def node(open_node: NodeFactory) -> Node:
    return open_node()


@pytest.fixture(scope="session")
def eomsg_bin() -> str:
    """The installed ``eomsg`` console script next to this interpreter."""
    candidate = Path(sys.executable).with_name("eomsg")
    found = str(candidate) if candidate.exists() else shutil.which("eomsg")
    if found is None:
        pytest.fail("the eomsg console script is not installed (pip install -e .)")
    return found


@pytest.fixture
def cli_env(data_dir: Path) -> dict[str, str]:
    """Environment for subprocess runs of ``eomsg`` against ``data_dir``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EOMSG_")}
    env["EOMSG_DATA"] = str(data_dir)
    return env
