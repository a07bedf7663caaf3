"""The layers of docs/architecture.md are the imports of the code: the table there is read
and every import of every module checked against it, so the page cannot drift and a
package cannot reach one it should not."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "eomsg"

# What "may not import" names in the table, as the standard modules it stands for.
FORBIDDEN = {
    "any I/O, clock or thread module": {
        "asyncio", "duckdb", "io", "os", "pathlib", "random", "selectors",
        "shutil", "socket", "subprocess", "sys", "tempfile", "threading", "time",
    },
    "sockets, threads, asyncio": {"asyncio", "selectors", "socket", "threading"},
}  # fmt: skip


def rules() -> dict[str, tuple[set[str], set[str]]]:
    """package → (the eomsg packages it may import, the modules it may not)."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    table = doc.split("<!-- imports -->")[1].split("<!-- /imports -->")[0]
    out: dict[str, tuple[set[str], set[str]]] = {}
    for line in table.strip().splitlines()[2:]:
        package, may, may_not = (cell.strip() for cell in line.strip("|").split("|"))
        allowed = set(re.findall(r"`(\w+)`", may))
        if may == "every package":
            allowed = {"*"}
        out[package.strip("`")] = (allowed, FORBIDDEN[may_not] if may_not else set())
    return out


def top_packages() -> set[str]:
    return {p.stem for p in PACKAGE.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth (lazy imports in functions too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def test_the_table_names_every_package() -> None:
    packages = top_packages() - {"__init__", "__main__", "errors"}
    assert set(rules()) == packages


@pytest.mark.parametrize("package", sorted(rules()))
def test_a_package_imports_only_what_the_architecture_allows(package: str) -> None:
    allowed, forbidden = rules()[package]
    base = PACKAGE / package
    files = sorted(base.rglob("*.py")) if base.is_dir() else [base.with_suffix(".py")]
    wrong = []
    for path in files:
        for module in imports(path):
            parts = module.split(".")
            if parts[0] == "eomsg" and len(parts) > 1:
                target = parts[1]
                if not ({target, "*"} & (allowed | {package, "errors"})):
                    wrong.append(f"{path.relative_to(ROOT)} imports eomsg.{target}")
            elif parts[0] in forbidden:
                wrong.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not wrong, "; ".join(wrong)


def test_nothing_imports_the_cli() -> None:
    wrong = [
        str(path.relative_to(ROOT))
        for path in PACKAGE.rglob("*.py")
        if path.parent.name != "cli" and path.name != "__main__.py"
        for module in imports(path)
        if module == "eomsg.cli" or module.startswith("eomsg.cli.")
    ]
    assert not wrong


def declared(extra: str | None = None) -> set[str]:
    """The distributions pyproject.toml requires (or adds with ``extra``), normalised."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = project["optional-dependencies"][extra] if extra else project["dependencies"]
    return {_normal(re.match(r"[A-Za-z0-9_.-]+", r)[0]) for r in reqs}  # type: ignore[index]


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_module_eomsg_imports_is_declared() -> None:
    """A clean ``pip install eomsg`` must run every command: a module imported anywhere
    but in ``eomsg/spark`` comes from a declared dependency (numpy once came only with
    the Spark extra, and ``eomsg serve`` failed on a clean install), and ``eomsg/spark``
    may add the ``spark`` extra."""
    owners = importlib.metadata.packages_distributions()
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        may = declared() | (declared("spark") if path.parent.name == "spark" else set())
        for module in imports(path):
            top = module.split(".")[0]
            if top in sys.stdlib_module_names or top == "eomsg":
                continue
            dists = {_normal(d) for d in owners.get(top, [top])}
            if not dists & may:
                wrong.append(f"{path.relative_to(ROOT)} imports {module} ({', '.join(dists)})")
    assert not wrong, "not declared in pyproject.toml: " + "; ".join(sorted(wrong))
