"""Count the tests that run against an embedded node and against a served one.

A test runs *embedded* when it opens a node in its own process (the ``open_node`` or
``node`` fixtures of tests/conftest.py, or the ``embedded`` parameter of a fixture
parametrised over both backends) and *served* when it starts ``eomsg serve`` (the
``serve`` fixture, or the ``served`` parameter). A parametrised test counts once per
backend it runs on. Tests that start a node some other way (a CLI subprocess on a data
directory, say) are counted as neither.

    python scripts/count_backends.py            # prints one JSON object
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
BOTH = ("brokers", "participant", "where")  # parameters naming the backend


def backend(item: Any) -> str | None:
    params = getattr(getattr(item, "callspec", None), "params", {})
    for fixture in BOTH:
        if params.get(fixture) in ("embedded", "served"):
            return str(params[fixture])
    names = set(getattr(item, "fixturenames", ()))
    if "serve" in names:
        return "served"
    if "open_node" in names:
        return "embedded"
    return None


class Counting:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def pytest_collection_modifyitems(self, items: list[Any]) -> None:
        for item in items:
            self.counts[backend(item) or "neither"] += 1
            self.counts["total"] += 1


def main() -> int:
    counting = Counting()
    code = pytest.main(
        ["--collect-only", "-q", "-p", "no:cacheprovider", str(ROOT / "tests")],
        plugins=[counting],
    )
    print(json.dumps(dict(sorted(counting.counts.items()))), file=sys.__stdout__)
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
