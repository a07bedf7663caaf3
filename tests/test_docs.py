"""Every command has help text and a section in docs/cli.md that names each of its options;
every exit code is documented; the docs' links lead somewhere and every seed the code
cites is described. (That the docs' command examples work is tests/test_doc_examples.py.)"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.core import TyperArgument, TyperGroup, TyperOption
from typer.testing import CliRunner

from eomsg.cli.app import app

ROOT = Path(__file__).resolve().parent.parent
CLI_DOC = (ROOT / "docs" / "cli.md").read_text()


def commands() -> list[tuple[str, Any]]:
    root = typer.main.get_command(app)
    assert isinstance(root, TyperGroup)
    found: list[tuple[str, Any]] = []
    for name, cmd in root.commands.items():
        if isinstance(cmd, TyperGroup):
            found += [(f"{name} {sub}", subcmd) for sub, subcmd in cmd.commands.items()]
        else:
            found.append((name, cmd))
    return found


@pytest.mark.parametrize(("name", "command"), commands(), ids=[n for n, _ in commands()])
def test_command_has_help_and_docs(name: str, command: Any) -> None:
    assert command.help, f"eomsg {name} has no help text"
    assert f"## eomsg {name}\n" in CLI_DOC, f"docs/cli.md has no section for eomsg {name}"
    assert any(p.name == "json" for p in command.params), f"eomsg {name} lacks --json"
    result = CliRunner().invoke(app, [*name.split(), "--help"])
    assert result.exit_code == 0 and "Usage:" in result.output
    for param in command.params:
        if isinstance(param, TyperOption | TyperArgument):
            assert param.help, f"eomsg {name} {param.name} has no help text"


GLOBAL = {"--data", "--json", "--broker", "--token", "--tls-ca", "--via", "--init", "--help"}
GLOBAL |= {"--node-name", "--context"}


def section(name: str) -> str:
    """The part of docs/cli.md about ``eomsg name``: from its heading to the next one."""
    start = CLI_DOC.index(f"## eomsg {name}\n")
    end = CLI_DOC.find("\n#", start + 1)
    return CLI_DOC[start : end if end >= 0 else None]


@pytest.mark.parametrize(("name", "command"), commands(), ids=[n for n, _ in commands()])
def test_every_option_is_documented_with_its_command(name: str, command: Any) -> None:
    """Each option of a command is in its section of docs/cli.md; the global ones in the
    table at the top."""
    text = section(name)
    for param in command.params:
        for opt in [*getattr(param, "opts", []), *getattr(param, "secondary_opts", [])]:
            if not opt.startswith("--"):
                continue
            where = CLI_DOC.split("\n## ")[0] if opt in GLOBAL else text
            assert opt in where, f"docs/cli.md does not describe {opt} of eomsg {name}"


def test_exit_codes_are_documented() -> None:
    from eomsg.errors import ExitCode

    for code in ExitCode:
        assert f"| {code.value} | {code.name} |" in CLI_DOC


def test_every_relative_link_in_the_docs_leads_to_a_file() -> None:
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#:\s]+)(?:#[^)]*)?\)", doc.read_text()):
            assert (doc.parent / target).exists(), f"{doc.name} links to missing {target}"


def test_every_seed_the_code_cites_has_a_section_in_the_design_doc() -> None:
    design = (ROOT / "docs" / "design.md").read_text()
    cited = {
        n
        for path in (ROOT / "eomsg").rglob("*.py")
        for n in re.findall(r"\bseeds? (\d{3})\b", path.read_text())
    }
    assert cited  # the pattern still finds the citations
    for n in sorted(cited):
        assert f"\n## Seed {n}:" in design, f"seed {n} is cited but not described"
