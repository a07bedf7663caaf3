"""The README's "A network of nodes", run as written (issue 35, item 6): its commands, in
its order, from a directory where neither data directory exists yet, on two real nodes
on loopback. What the test changes is only what a test must: the address (loopback, the
port the node picked), and the TLS material, made here by a throwaway CA."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from tests.conftest import eventually

README = Path(__file__).parent.parent / "README.md"
ADDRESS = "10.0.0.2:7501"  # where the README's b listens


def walkthrough() -> list[str]:
    """The commands of the README's network section, one per line (continuations
    joined), comments and all: a shell runs them."""
    text = README.read_text()
    section = text[text.index("## A network of nodes") :]
    start = section.index("```sh\n") + len("```sh\n")
    block = section[start : section.index("\n```", start)]
    return block.replace("\\\n", " ").splitlines()


class Shell:
    """Runs the README's lines with bash in ``cwd``, as a user's shell would, without
    any EOMSG_ variable (so no --init anywhere but where a line says it)."""

    def __init__(self, cwd: Path, eomsg_bin: str) -> None:
        self.cwd = cwd
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("EOMSG_")}
        self.env["PATH"] = f"{Path(eomsg_bin).parent}{os.pathsep}{self.env.get('PATH', '')}"
        self.background: list[subprocess.Popen[str]] = []
        self.address = ADDRESS

    def line(self, line: str) -> str:
        return line.replace(ADDRESS, self.address)

    def run(self, line: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            ["bash", "-c", self.line(line)], cwd=self.cwd, env=self.env, capture_output=True,
            text=True, timeout=180, check=False,
        )  # fmt: skip
        assert done.returncode == 0, (line, done.stdout, done.stderr)
        return done

    def start(self, line: str) -> tuple[subprocess.Popen[str], str]:
        """A line that runs in the background (``&``, or one that follows): started as
        this test's child (its comment and ``&`` taken off), with the first line it
        printed."""
        words = shlex.split(self.line(line), comments=True)
        command = shlex.join(words[:-1] if words[-1] == "&" else words)
        proc = subprocess.Popen(
            ["bash", "-c", f"exec {command}"], cwd=self.cwd, env=self.env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        self.background.append(proc)
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first, (line, proc.wait(30), proc.stderr.read() if proc.stderr else "")
        return proc, first

    def close(self) -> None:
        for proc in self.background:
            if proc.poll() is None:
                proc.terminate()
                proc.communicate(timeout=60)
            assert proc.returncode is not None


@pytest.fixture
def shell(tmp_path: Path, eomsg_bin: str) -> Iterator[Shell]:
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    cert = ca.issue_cert("127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "b.pem"))
    fd = os.open(tmp_path / "b.key", os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(cert.private_key_pem.bytes())
    made = Shell(tmp_path, eomsg_bin)
    yield made
    made.close()


def test_the_readme_network_walkthrough_works_as_written(shell: Shell, tmp_path: Path) -> None:
    (serve_b, create, allow_a, serve_a, link, publish, consume, egress, links, remote) = (
        walkthrough()
    )
    # b listens where the test may: loopback, on the port it picks (then named as such).
    shell.address = "127.0.0.1:0"
    node_b, ready = shell.start(serve_b)
    port = re.search(r"tls://127\.0\.0\.1:(\d+)", ready)
    assert port is not None, ready
    shell.address = f"127.0.0.1:{port[1]}"
    assert ready.startswith(f"eomsg node b (pid {node_b.pid}) ")

    assert shell.run(create).stdout == "created queue audit\n"
    made = shell.run(allow_a)
    assert made.stdout == (
        "linked to a\na dials this node with the token now in a.token (give it a copy)\n"
    )
    node_a, ready = shell.start(serve_a)
    assert ready.startswith(f"eomsg node a (pid {node_a.pid}) ")  # the test's child: stopped
    done = shell.run(link)
    assert (done.stdout, done.stderr) == ("linked to b (up)\n", "")
    done = shell.run(publish)
    assert (done.stdout, done.stderr) == ("published seq 1\n", "")

    consumer, got = shell.start(consume)
    assert got == '1 orders/eu/new {"order": 3}\n'

    def deleted() -> bool:  # the consumer's delete, sent after it printed, has landed
        (audit,) = json.loads(shell.run("eomsg inspect queues --json --data b").stdout)
        return (audit["depth"], audit["deleted"]) == (0, 1)

    assert eventually(deleted)
    consumer.terminate()
    consumer.communicate(timeout=60)

    assert shell.run(egress).stdout == "link to a: egress memory, hold 1s\n"
    table = shell.run(links).stdout
    assert re.search(rf"│ b +│ tls://127\.0\.0\.1:{port[1]} +│ up +│ 0 +│ b +│", table), table
    queues = shell.run(remote).stdout
    assert re.search(r"│ audit +│ orders/> +│ 0 +│ 0 +│ 1 +│", queues), queues

    # Seen from b: a's one message taken, the link as set.
    shown = json.loads(shell.run("eomsg inspect links --json --data b").stdout)
    assert [(x["peer"], x["state"], x["received"], x["egress"]) for x in shown] == [
        ("a", "up", 1, "memory")
    ]
