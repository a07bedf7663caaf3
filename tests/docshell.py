"""The docs' shell examples, read from their Markdown and run as a user's shell runs them.

What a page holds (:func:`blocks`, :func:`spans`): its fenced blocks, each with its
language (``sh`` and ``bash`` are shell examples; ``python``, ``text``, ``ini`` and
``yaml`` are not run), the section it is in and the reason it is not run, if the line
just above the fence says ``<!-- not run: REASON -->``; and its backticked spans outside
the fences (an inline example is one whose words run ``eomsg``), which the same comment
just before a span exempts from being checked as a command.

How a shell example runs (:class:`Shell`), one line at a time (a ``\\`` continuation
joined), each in ``bash -c`` in the page's directory, with the venv's ``eomsg`` first on
PATH and no ``EOMSG_`` variable:

- A line runs to its end and must exit 0 — or with the code its comment gives as
  ``exit N``; a comment ending ``→ TEXT`` says what it prints: its stdout is exactly that
  line.
- A line that keeps running — ``&`` at its end, or one a user ends with Ctrl-C (a
  ``--follow``, ``eomsg top`` without ``--count``, ``eomsg serve``), which holds the
  terminal and so must be the last of its block — is started as this process's own
  child, at a terminal of its own (a pseudo-terminal, so a live view draws at once), and
  must print a line (``→ TEXT``: that line) before the next line runs. A ``&`` line
  keeps running until :meth:`Shell.close`; one a user ends with Ctrl-C until
  :meth:`Shell.interrupt` (the end of its block). Stopped, it must end as asked (0, or
  128 + the signal); one that ended before must have ended with its ``exit N`` (0
  unless it says).
- What the runner changes: a ``tcp://`` or ``tls://`` ``HOST:PORT`` becomes
  ``127.0.0.1`` and the port the node listening there picked (its ``serve`` line listens
  on port 0; the port is read from the line it prints when ready), and the files a
  page's lines name for TLS (``--tls-cert``, ``--tls-key``, ``--tls-ca``, ``--peer-ca``,
  ``--tls-client-ca``) are made by :func:`make_tls` with a throwaway CA; everything else
  (tokens, data directories) the lines make themselves.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import shlex
import signal
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import trustme

FENCE = re.compile(r"^```(\S*)\s*$")
NOT_RUN = re.compile(r"<!-- not run: (\S[^>]*?) -->")
NOT_RUN_BEFORE = re.compile(NOT_RUN.pattern + r"\s*$")
SHELL = ("sh", "bash")
LANGUAGES = (*SHELL, "python", "text", "ini", "yaml")  # the last two: configuration, not run
ADDRESS = re.compile(r"(?<=(?:tcp|tls)://)([A-Za-z0-9.-]+:\d+)")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Za-z0-9]|\r")
OPERATORS = {"|", "||", "&&", ";", "&"}
REDIRECTS = {">", ">>", "<", ">&", "&>", ">|"}
TLS_FILES = ("--tls-cert", "--tls-key", "--tls-ca", "--peer-ca", "--tls-client-ca")
DEADLINE = 60.0  # seconds a started line has to print its first line, and to stop


def split_comment(line: str) -> tuple[str, str]:
    """``line`` as its command and its comment (the text after a ``#`` that starts a
    word outside quotes), each stripped."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].strip(), line[i + 1 :].strip()
    return line.strip(), ""


def segments(command: str) -> list[list[str]]:
    """The simple commands of a shell line (split at ``|``, ``&&``, ``;``, ``&``), each
    as its words, redirections and their targets left out."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    found: list[list[str]] = [[]]
    redirected = False
    for word in lexer:
        if word in OPERATORS:
            found.append([])
        elif word in REDIRECTS:
            redirected = True
        elif redirected:
            redirected = False
        else:
            found[-1].append(word)
    return [words for words in found if words]


def eomsg_commands(command: str) -> list[list[str]]:
    """The ``eomsg`` commands of a shell line, as their words after ``eomsg``."""
    return [words[1:] for words in segments(command) if words[0] == "eomsg"]


def _named(words: list[str]) -> list[str]:
    """The words of a command that are not options (its command's name first, unless a
    global option's value comes before it)."""
    return [w for w in words if not w.startswith("-")]


@dataclass(frozen=True)
class Example:
    """One line of a shell block (its continuations joined)."""

    text: str
    lineno: int

    @property
    def command(self) -> str:
        return split_comment(self.text)[0]

    @property
    def comment(self) -> str:
        return split_comment(self.text)[1]

    @property
    def shows(self) -> str | None:
        """What the docs say it prints (its comment's ``→ TEXT``, the end of the
        comment), if they do."""
        return self.comment.split("→", 1)[1].strip() if "→" in self.comment else None

    @property
    def exit_code(self) -> int:
        """The exit code its comment gives (``exit N``), else 0."""
        said = re.search(r"\bexit (\d+)\b", self.comment)
        return 0 if said is None else int(said[1])

    @property
    def background(self) -> bool:
        return self.command.endswith("&") and not self.command.endswith("&&")

    @property
    def interactive(self) -> bool:
        """Whether it runs until a user's Ctrl-C: a follower, a live view, a node."""
        for words in eomsg_commands(self.command):
            named = _named(words)
            if "--follow" in words or "-f" in words or named[:1] == ["serve"]:
                return True
            if named[:1] == ["top"] and not {"--count", "-n"} & set(words):
                return True
        return False


@dataclass(frozen=True)
class Block:
    """A fenced block of a page."""

    page: str
    section: str  # its ``## `` heading
    language: str
    lineno: int  # of its opening fence
    text: str
    not_run: str | None  # why it is not run, if the docs say

    @property
    def runs(self) -> bool:
        return self.language in SHELL and self.not_run is None

    def examples(self) -> list[Example]:
        found: list[Example] = []
        joined, start = "", 0
        for n, raw in enumerate(self.text.splitlines(), self.lineno + 1):
            if not joined:
                start = n
            if raw.endswith("\\"):
                joined += raw[:-1] + " "
                continue
            joined += raw
            if joined.strip():
                found.append(Example(joined.strip(), start))
            joined = ""
        return found


@dataclass(frozen=True)
class Span:
    """A backticked span outside the fences, with the ``eomsg`` commands it runs."""

    page: str
    lineno: int
    text: str
    not_run: str | None

    @property
    def commands(self) -> list[list[str]]:
        try:
            return eomsg_commands(self.text)
        except ValueError:  # not shell words at all (an unmatched quote): not an example
            return []


def blocks(path: Path) -> list[Block]:
    """Every fenced block of the Markdown page ``path``, in order."""
    found: list[Block] = []
    section, fence, body, previous = "", None, [], ""
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if fence is not None:
            if line.startswith("```"):
                language, start, reason = fence
                text = "\n".join(body)
                found.append(Block(path.name, section, language, start, text, reason))
                fence, body = None, []
            else:
                body.append(line)
            continue
        if line.startswith("## "):
            section = line[3:].strip()
        if (opening := FENCE.match(line)) is not None:
            reason = NOT_RUN.search(previous)
            fence = (opening[1], n, None if reason is None else reason[1])
        previous = line
    return found


def spans(path: Path) -> list[Span]:
    """Every backticked span of the page ``path`` outside its fences (a span may go on
    over a line end), with what a ``<!-- not run: … -->`` just before it says."""
    text = path.read_text()
    prose = re.sub(r"^```.*?^```", lambda m: "\n" * m[0].count("\n"), text, flags=re.M | re.S)
    found = []
    for m in re.finditer(r"(?<!`)`([^`]+)`(?!`)", prose):
        reason = NOT_RUN_BEFORE.search(prose, max(0, m.start() - 300), m.start())
        lineno = prose.count("\n", 0, m.start()) + 1
        span_text = " ".join(m[1].split())
        found.append(Span(path.name, lineno, span_text, None if reason is None else reason[1]))
    return found


def make_tls(directory: Path, lines: list[str]) -> None:
    """The TLS files ``lines`` name, made in ``directory`` by one throwaway CA: the CA
    for ``--tls-ca``, ``--peer-ca`` and ``--tls-client-ca``, and for each ``--tls-cert``
    with the ``--tls-key`` of its line a certificate for 127.0.0.1 and its key
    (owner-only)."""
    ca = trustme.CA()
    for line in lines:
        words = shlex.split(split_comment(line)[0])
        named = {w: words[i + 1] for i, w in enumerate(words[:-1]) if w in TLS_FILES}
        for option in ("--tls-ca", "--peer-ca", "--tls-client-ca"):
            if option in named:
                ca.cert_pem.write_to_path(str(directory / named[option]))
        if "--tls-cert" in named and "--tls-key" in named:
            cert = ca.issue_cert("127.0.0.1", "localhost")
            cert.cert_chain_pems[0].write_to_path(str(directory / named["--tls-cert"]))
            fd = os.open(directory / named["--tls-key"], os.O_WRONLY | os.O_CREAT, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(cert.private_key_pem.bytes())


class Started:
    """A line that keeps running, as this process's child at a terminal of its own: what
    it shows there (stdout and stderr, terminal controls taken out) read as it comes."""

    def __init__(self, example: Example, command: str, cwd: Path, env: dict[str, str]) -> None:
        self.example = example
        master, terminal = pty.openpty()
        fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 160, 0, 0))
        self.proc = subprocess.Popen(
            ["bash", "-c", f"exec {command}"], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
            stdout=terminal, stderr=terminal,
        )  # fmt: skip
        os.close(terminal)
        self._master = master
        self._shown = bytearray()
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.stopped_by: int | None = None  # the signal that stopped it, if one did

    def _read(self) -> None:
        try:
            while chunk := os.read(self._master, 65536):
                with self._changed:
                    self._shown += chunk
                    self._changed.notify_all()
        except OSError:  # EIO: every holder of the terminal has closed it
            pass
        finally:
            os.close(self._master)
            with self._changed:
                self._changed.notify_all()

    @property
    def output(self) -> str:
        """What it showed so far, as lines of text."""
        with self._changed:
            shown = bytes(self._shown)
        return ANSI.sub("", shown.decode(errors="replace"))

    @property
    def lines(self) -> list[str]:
        return [line for line in self.output.split("\n")[:-1] if line.strip()]

    def first_line(self) -> str:
        """The first line it showed, waited for; AssertionError if it ended or took more
        than a minute without one."""
        deadline = time.monotonic() + DEADLINE
        with self._changed:
            while not self.lines:
                left = deadline - time.monotonic()
                if left <= 0 or not self._reader.is_alive():
                    break
                self._changed.wait(min(left, 1.0))
        shown = self.lines
        assert shown, (self.example.text, "printed nothing", self.proc.poll(), self.output)
        return shown[0]

    def stop(self, signum: int) -> int:
        """Its exit code, once it ended — sent ``signum`` first if it still runs (and
        killed, failing, if that has not ended it within a minute)."""
        if self.proc.poll() is None:
            self.stopped_by = signum
            self.proc.send_signal(signum)
        try:
            code = self.proc.wait(DEADLINE)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError((self.example.text, "did not stop", self.output[-2000:])) from None
        finally:
            self._reader.join(DEADLINE)
        return code

    def check_ended(self) -> None:
        """It ended as asked when stopped (0, or 128 + the signal), or as its line says."""
        code = self.proc.returncode
        if self.stopped_by is not None:
            assert code in (0, 128 + self.stopped_by, -self.stopped_by), (
                self.example.text, code, self.output[-2000:])  # fmt: skip
        else:
            assert code == self.example.exit_code, (self.example.text, code, self.output[-2000:])


class Shell:
    """Runs a page's lines with bash in ``cwd``, as a user's shell would, without any
    EOMSG_ variable (so no --init anywhere but where a line says it), the venv's
    ``eomsg`` first on PATH."""

    def __init__(self, cwd: Path, eomsg_bin: str) -> None:
        self.cwd = cwd
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("EOMSG_")}
        self.env["PATH"] = f"{Path(eomsg_bin).parent}{os.pathsep}{self.env.get('PATH', '')}"
        self.addresses: dict[str, str] = {}  # as written -> where it is here
        self.started: list[Started] = []

    def line(self, text: str) -> str:
        """``text`` with the addresses substituted; AssertionError for one no node of the
        page listens at (yet)."""

        def here(m: re.Match[str]) -> str:
            assert m[1] in self.addresses, f"{text}: no node listens at {m[1]} before it"
            return self.addresses[m[1]]

        return ADDRESS.sub(here, text)

    def run(self, text: str) -> subprocess.CompletedProcess[str]:
        """Run the line ``text`` to its end (exit 0, or its ``exit N``; its ``→ TEXT``)."""
        example = Example(text, 0)
        done = subprocess.run(
            ["bash", "-c", self.line(text)], cwd=self.cwd, env=self.env, capture_output=True,
            text=True, timeout=600, check=False, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert done.returncode == example.exit_code, (text, done.stdout, done.stderr)
        if example.shows is not None:
            assert done.stdout == example.shows + "\n", (text, done.stdout, done.stderr)
        return done

    def start(self, text: str) -> Started:
        """Start a line that keeps running (its comment and ``&`` taken off), wait for its
        first line (``→ TEXT``: that line), and learn the ports of the addresses a
        ``serve`` line listens at."""
        example = Example(text, 0)
        serves = any(w[:1] == ["serve"] for w in map(_named, eomsg_commands(example.command)))
        found = [m[1] for m in ADDRESS.finditer(example.command)] if serves else []
        listens = [address for address in found if address not in self.addresses]
        self.addresses.update({address: "127.0.0.1:0" for address in listens})
        words = shlex.split(self.line(example.command))
        command = shlex.join(words[:-1] if words[-1] == "&" else words)
        assert len(segments(command)) == 1, f"{text}: a line that keeps running is one command"
        started = Started(example, command, self.cwd, self.env)
        self.started.append(started)
        first = started.first_line()
        if example.shows is not None:
            assert first == example.shows, (text, started.output)
        ports = re.findall(r"(?:tcp|tls)://127\.0\.0\.1:(\d+)", first)
        assert len(ports) == len(listens), (text, first)
        for address, port in zip(listens, ports, strict=True):
            self.addresses[address] = f"127.0.0.1:{port}"
        return started

    def example(self, example: Example, *, last: bool) -> None:
        """Run one line of a block by the conventions above: one a user ends with Ctrl-C
        holds their terminal, so only the last line of a block may (the lines after it
        would wait for it): another ends with ``&``."""
        if example.interactive and not example.background:
            assert last, f"line {example.lineno}: `{example.command}` keeps running: add `&`"
        if example.background or example.interactive:
            self.start(example.text)
        else:
            self.run(example.text)

    def interrupt(self) -> None:
        """End, as Ctrl-C does, the lines a user ends with it (not those started with
        ``&``), and check how each ended."""
        for started in reversed(self.started):
            if not started.example.background:
                started.stop(signal.SIGINT)
                started.check_ended()
        self.started = [s for s in self.started if s.example.background]

    def close(self) -> None:
        """Stop everything still running, newest first — a ``&`` line with SIGTERM, as
        ``kill %1``, another with SIGINT, as Ctrl-C — and check how each ended."""
        running, self.started = self.started, []
        failures: list[AssertionError] = []
        for started in reversed(running):
            try:
                started.stop(signal.SIGTERM if started.example.background else signal.SIGINT)
            except AssertionError as e:  # the others are stopped all the same
                failures.append(e)
        for started in running:
            started.check_ended()
        if failures:
            raise failures[0]


def page_lines(path: Path) -> Iterator[str]:
    """Every line of the shell examples of ``path`` that runs."""
    for block in blocks(path):
        if block.runs:
            yield from (example.text for example in block.examples())
