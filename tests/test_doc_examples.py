"""Every command the user docs show works as written (issue 35, item 14).

- The shell examples of README.md and docs/cli.md (their ``sh`` blocks) run, as the
  conventions of :mod:`tests.docshell` say: a page's sections in order, in one fresh
  directory per page (a reader goes through the page in one directory, so the README's
  node serves the queue its Quick start made), each line's exit code and, where its
  comment shows it (``→ TEXT``), its output checked. The files a page presumes — TLS
  material, the transform module a ``--transform`` names, the ``.venv`` the Quick start
  activates — are made first. A section that runs Spark is slow (a JVM a run).
- A block that cannot run here says why, ``<!-- not run: REASON -->`` on the line above
  its fence; every fence names its language, so no shell example goes unseen.
- The ``eomsg`` command lines in the pages' prose, in the blocks that do not run, and in
  each command's ``--help`` examples are parsed by the CLI's own parser without running:
  in full (every option, its values' types, the arguments) for a concrete command line;
  for a synopsis (``[--max N]``, ``NAME``, ``a | b``) or a mention (``eomsg serve
  --memory-limit``), that each command and option it names exists.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.main
from typer.core import TyperGroup

from eomsg.cli.app import app
from eomsg.cli.common import Globals
from tests.docshell import (
    LANGUAGES,
    SHELL,
    Block,
    Shell,
    Span,
    blocks,
    eomsg_commands,
    make_tls,
    page_lines,
    spans,
    split_comment,
)

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "docs" / "cli.md", ROOT / "docs" / "operations.md"]
ROOT_COMMAND = typer.main.get_command(app)
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*(?:[:=,.][A-Z][A-Z0-9_]*)*,?$")
SYNOPSIS = re.compile(r"[\[\]()|…]")


# -- the blocks that run ------------------------------------------------------------


def sections(page: Path) -> list[str]:
    """The sections of ``page`` with a block that runs, in order."""
    found: list[str] = []
    for block in blocks(page):
        if block.runs and block.section not in found:
            found.append(block.section)
    return found


def make_transforms(directory: Path, lines: list[str]) -> None:
    """The modules a ``--transform MODULE:FUNCTION`` of ``lines`` names, beside the
    page's lines: FUNCTION passes each message's payload on."""
    for line in lines:
        for words in eomsg_commands(line):
            if "--transform" not in words:
                continue
            module, function = words[words.index("--transform") + 1].split(":")
            path = directory.joinpath(*module.split(".")).with_suffix(".py")
            path.parent.mkdir(parents=True, exist_ok=True)
            for package in list(path.relative_to(directory).parents)[:-1]:
                (directory / package / "__init__.py").touch()
            path.write_text(
                f"def {function}(row):\n"
                f"    return {{'payload': row['payload']}}\n\n\n"
                f"{function}.schema = 'payload STRING'\n"
            )


class PageRun:
    """A page's sections run in order in one directory, each at most once; what an
    earlier section left running (its ``&`` nodes) the later ones use."""

    def __init__(self, page: Path, cwd: Path, eomsg_bin: str) -> None:
        self.page = page
        self.shell = Shell(cwd, eomsg_bin)
        self.done: list[str] = []
        self.failed: str | None = None
        lines = list(page_lines(page))
        make_tls(cwd, lines)
        make_transforms(cwd, lines)
        (cwd / ".venv").symlink_to(sys.prefix)  # the Quick start's `source .venv/bin/activate`

    def through(self, section: str) -> None:
        """Run ``section``, and every section before it that has not run."""
        order = sections(self.page)
        for name in order[: order.index(section) + 1]:
            if name in self.done:
                continue
            if self.failed is not None:
                pytest.fail(f"{self.page.name}: {section!r} follows {self.failed!r}, which failed")
            try:
                self.run(name)
            except BaseException:
                self.failed = name
                raise
            self.done.append(name)

    def run(self, section: str) -> None:
        for block in blocks(self.page):
            if block.section == section and block.runs:
                examples = block.examples()
                for i, example in enumerate(examples, 1):
                    self.shell.example(example, last=i == len(examples))
                self.shell.interrupt()  # what a reader ended with Ctrl-C before going on


def needs_spark(page: Path, section: str) -> bool:
    return any(
        "spark-replay" in e.command
        for b in blocks(page)
        if b.section == section and b.runs
        for e in b.examples()
    )


def section_params() -> list[Any]:
    return [
        pytest.param(
            page,
            section,
            id=f"{page.name}:{section}",
            marks=[pytest.mark.slow] if needs_spark(page, section) else [],
        )
        for page in PAGES
        for section in sections(page)
    ]


@pytest.fixture(scope="module")
def page_runs(
    tmp_path_factory: pytest.TempPathFactory, eomsg_bin: str
) -> Iterator[Callable[[Path], PageRun]]:
    """Each page's run, made when a test first needs it; what it left running is stopped
    (and checked) once the module's tests are done."""
    runs: dict[Path, PageRun] = {}

    def run_of(page: Path) -> PageRun:
        if page not in runs:
            runs[page] = PageRun(page, tmp_path_factory.mktemp(page.stem), eomsg_bin)
        return runs[page]

    yield run_of
    for run in runs.values():
        run.shell.close()


@pytest.mark.parametrize(("page", "section"), section_params())
def test_the_section_runs_as_written(
    page_runs: Callable[[Path], PageRun], page: Path, section: str
) -> None:
    page_runs(page).through(section)


# -- what the pages are made of --------------------------------------------------------


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_block_says_its_language_and_every_exception_why(page: Path) -> None:
    found = blocks(page)
    for block in found:
        assert block.language in LANGUAGES, (
            f"{page.name}:{block.lineno}: a fence names its language, one of {LANGUAGES}"
        )
        if block.not_run is not None:
            assert block.language in SHELL, f"{page.name}:{block.lineno}: only shell runs"
    marked = [b for b in found if b.not_run] + [s for s in spans(page) if s.not_run]
    assert len(marked) == page.read_text().count("<!-- not run:"), (
        f"{page.name}: a `<!-- not run: … -->` stands just above a fence or before a span"
    )


def test_the_readme_names_its_two_setup_commands() -> None:
    """They are not run here (they make the venv this test runs in, and run every test),
    so what they are is checked instead: the scripts exist, CI runs the second."""
    readme = ROOT / "README.md"
    (setup,) = [b for b in blocks(readme) if b.section.startswith("Set-up")]
    assert setup.not_run
    assert [e.command for e in setup.examples()] == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    assert (ROOT / "scripts" / "demo.sh").is_file() and (ROOT / "scripts" / "test.sh").is_file()
    assert "scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


# -- command lines that are parsed, not run ------------------------------------------


def _options(command: Any) -> set[str]:
    names = {"--help", "-h"}
    for param in command.params:
        names.update(getattr(param, "opts", []), getattr(param, "secondary_opts", []))
    return {n for n in names if n.startswith("-")}


def _takes_value(command: Any, option: str) -> bool:
    for param in command.params:
        if option in getattr(param, "opts", []):
            return not getattr(param, "is_flag", False) and not getattr(param, "count", False)
    return False


def command_of(words: list[str]) -> tuple[Any, int]:
    """The command ``words`` name (the root's options and their values before it), and
    where what follows its name starts; AssertionError for an option or a command that
    does not exist."""
    command: Any = ROOT_COMMAND
    i = 0
    while i < len(words) and isinstance(command, TyperGroup):
        word = words[i]
        if PLACEHOLDER.match(word):  # a value a synopsis names
            i += 1
        elif word.startswith("-"):
            assert word in _options(ROOT_COMMAND), f"eomsg has no option {word}"
            i += 2 if _takes_value(ROOT_COMMAND, word) else 1
        else:
            assert word in command.commands, f"no command {word!r} in eomsg {command.name}"
            command, i = command.commands[word], i + 1
    return command, i


def check_names(words: list[str]) -> None:
    """Each command and option ``words`` (a synopsis or a mention) name exists."""
    command, i = command_of(words)
    for word in words[i:]:
        option = word.split("=")[0]
        if option.startswith("-") and len(option) > 1 and not option[1:].isdigit():
            assert option in _options(command), f"eomsg {command.name} has no option {option}"


def parse(words: list[str]) -> None:
    """Parse ``eomsg WORDS`` as the CLI would, without running the command: a usage
    error (an unknown option, a missing or extra argument, a value of the wrong type)
    raises."""
    saved = {name: getattr(Globals, name) for name in Globals.__annotations__}
    try:
        ctx = ROOT_COMMAND.make_context("eomsg", list(words))
        command: Any = ROOT_COMMAND
        while isinstance(command, TyperGroup):
            rest = [*ctx._protected_args, *ctx.args]
            name, command, rest = command.resolve_command(ctx, rest)
            assert command is not None and name is not None
            ctx = command.make_context(name, rest, parent=ctx)
    finally:
        for name, value in saved.items():
            setattr(Globals, name, value)


def check_command_line(text: str, words: list[str]) -> None:
    """``eomsg WORDS`` (in ``text``) parses in full — or, for a synopsis (a word with
    ``[]()…``, a placeholder in capitals) or a mention (the name of a command that needs
    more, or a command's name and one option's without its value), names only what
    exists."""
    command, i = command_of(words)
    after = words[i:]
    synopsis = any(
        PLACEHOLDER.match(w) or (SYNOPSIS.search(w) and not re.search(r"\s", w)) for w in words
    )
    required = any(getattr(p, "required", False) for p in command.params)
    mention = (not after and required) or (len(after) == 1 and _takes_value(command, after[0]))
    if synopsis:  # the whole text: alternatives (`a | b`) split it into shell commands
        names = SYNOPSIS.sub(" ", text).split()
        check_names([w.rstrip(",") for w in names[names.index("eomsg") + 1 :]])
        return
    if mention or isinstance(command, TyperGroup):
        check_names(words)
        return
    try:
        parse(words)
    except typer.TyperException as e:  # click's usage errors
        pytest.fail(f"`{text}`: {' '.join(e.format_message().split())}")


def inline_examples() -> list[Any]:
    found = []
    for page in PAGES:
        for span in spans(page):
            if span.commands and span.not_run is None:
                found.append(pytest.param(span, id=f"{page.name}:{span.lineno}:{span.text[:40]}"))
    return found


@pytest.mark.parametrize("span", inline_examples())
def test_an_inline_example_parses(span: Span) -> None:
    for words in span.commands:
        check_command_line(span.text, words)


def unrun_blocks() -> list[Any]:
    return [
        pytest.param(b, id=f"{b.page}:{b.lineno}")
        for page in PAGES
        for b in blocks(page)
        if b.language in SHELL and not b.runs
    ]


@pytest.mark.parametrize("block", unrun_blocks())
def test_a_block_that_does_not_run_parses(block: Block) -> None:
    for example in block.examples():
        for words in eomsg_commands(example.command):
            check_command_line(example.command, words)


def help_examples() -> list[Any]:
    found = []

    def walk(group: TyperGroup, path: str) -> None:
        for name, command in group.commands.items():
            if isinstance(command, TyperGroup):
                walk(command, f"{path} {name}")
                continue
            text = command.help or ""
            lines = text.split("Examples:", 1)[1].splitlines() if "Examples:" in text else []
            for line in (x.strip() for x in lines):
                if line.startswith("eomsg "):
                    found.append(pytest.param(line, id=f"{path} {name}: {line[6:40]}"))

    walk(ROOT_COMMAND, "eomsg")
    return found


def test_the_help_examples_are_found() -> None:
    assert len(help_examples()) > 30  # the pattern still finds them


@pytest.mark.parametrize("line", help_examples())
def test_a_help_example_parses(line: str) -> None:
    for words in eomsg_commands(split_comment(line)[0]):
        check_command_line(line, words)
