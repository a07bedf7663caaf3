"""Text output shows any payload and never sticks a queue (issue 35, item 10); ``inspect
log --follow --limit N`` starts from the last N, as ``tail -n N -f`` (item 11) — through
real ``eomsg`` processes.

``publish`` keeps a payload's bytes exactly (``echo x | eomsg publish t -`` publishes
``x\\n``); the text views — plain ``consume``, ``inspect log``, its ``--follow`` and
``browse`` — show what one line cannot carry escaped (``\\n``, ``\\t``, ``\\x1b``, a byte
that is not UTF-8 as ``\\xNN``), and ``--json`` and ``--raw`` carry it exactly."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import threading
from collections.abc import Callable
from typing import IO, Any

import pytest

from tests.conftest import Cli
from tests.test_cli_output import cells

# (payload as published, as a text view shows it)
PAYLOADS = [
    (b"x\n", "x\\n"),  # echo x | eomsg publish t -
    (b"a\tb", "a\\tb"),
    (b"a\x1b[31mred", "a\\x1b[31mred"),
    (b"two\nlines\r\n", "two\\nlines\\r\\n"),
    (b"p\xce\x01", "p\\xce\\x01"),  # not UTF-8
    (bytes([0, 1, 0xFF, 0x89]) + b"PNG", "\\x00\\x01\\xff\\x89PNG"),  # binary
    ("caf\u00e9 \u202eevil".encode(), "caf\u00e9 \\u202eevil"),
    (b"plain", "plain"),
]


@pytest.mark.slow
def test_plain_consume_shows_every_payload_and_empties_the_queue(cli: Cli) -> None:
    """On main the first of these stopped every plain ``consume q`` with exit 3 (``is not
    one line of text``), the queue stuck behind it."""
    cli("queue", "create", "q", "--subscribe", "t/>")
    cli("queue", "create", "exact", "--subscribe", "t/>")
    for payload, _ in PAYLOADS:
        cli("publish", "t/a", "-", input=payload)
    r = cli("consume", "q")
    assert (r.stdout.decode(), r.stderr) == (
        "".join(f"{seq} t/a {view}\n" for seq, (_, view) in enumerate(PAYLOADS, 1)),
        b"",
    )
    stats = {s["name"]: s for s in json.loads(cli("inspect", "queues", "--json").stdout)}
    assert (stats["q"]["depth"], stats["q"]["deleted"]) == (0, len(PAYLOADS))

    r = cli("consume", "exact", "--json", "--max", "4")  # the bytes, exactly
    assert [json.loads(line)["payload"] for line in r.stdout.splitlines()] == [
        p.decode() for p, _ in PAYLOADS[:4]
    ]
    r = cli("consume", "exact", "--raw", "--delimiter", "\\x1e")
    assert r.stdout == b"".join(p + b"\x1e" for p, _ in PAYLOADS[4:])


def test_the_log_and_browse_show_payloads_as_consume_does(cli: Cli) -> None:
    cli("queue", "create", "q", "--subscribe", "t/>")
    for payload, _ in PAYLOADS:
        cli("publish", "t/a", "-", input=payload)
    log, browse = cli("inspect", "log").stdout, cli("browse", "q").stdout
    for seq, (payload, view) in enumerate(PAYLOADS, 1):
        assert cells(log, str(seq))[-2:] == [str(len(payload)), view]
        assert cells(browse, str(seq))[-2:] == [str(len(payload)), view]
    assert b"\x1b" not in log + browse and "\u202e".encode() not in log + browse


def test_publish_stdin_drops_one_line_end_and_keeps_every_other_byte(cli: Cli) -> None:
    cli("queue", "create", "q", "--subscribe", "t/>")
    r = cli("publish", "t/a", "--stdin", input=b"a\r\nb\r\r\nc\n\n\td \nlast")
    assert r.stdout == b"published 6 messages (seq 1..6), 0 duplicates\n"
    r = cli("consume", "q", "--json")
    assert [json.loads(line)["payload"] for line in r.stdout.splitlines()] == [
        "a", "b\r", "c", "", "\td ", "last",
    ]  # fmt: skip


class Lines:
    """The lines a process writes, read on a thread: each waited for with a deadline."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.got: queue.Queue[bytes] = queue.Queue()
        self.reader = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.reader.start()

    def _read(self, stream: IO[bytes]) -> None:
        for line in stream:
            self.got.put(line)

    def next(self, count: int) -> list[bytes]:
        return [self.got.get(timeout=60) for _ in range(count)]

    def rest(self) -> list[bytes]:
        """What came after the lines taken, once the stream has ended."""
        self.reader.join(60)
        assert not self.reader.is_alive()
        return list(self.got.queue)


def test_follow_starts_from_the_last_limit_messages(
    cli: Cli, serve: Callable[..., Any], eomsg_bin: str, cli_env: dict[str, str]
) -> None:
    """3,082 messages retained on the issue's node; here 60, 40 of them on t/: the
    follower prints the last 5 of those, then each new one — never the first 5 and then
    everything retained."""
    serve()
    lines = b"".join(b"m%d\n" % i for i in range(40))
    cli("publish", "t/x", "--stdin", "--batch", "7", input=lines)  # seqs 1..40
    cli("publish", "u/x", "--stdin", input=b"other\n" * 20)  # 41..60
    assert cli("inspect", "log", "--limit", "2").stdout.count(b" t/x ") == 2  # the first 2

    def follow(*args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [eomsg_bin, "inspect", "log", "--follow", *args], env=cli_env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip

    tail = follow("--limit", "5", "--topic", "t/>")
    bounded = follow("--limit", "5", "--from-seq", "58", "--json")  # only 3 from seq 58
    try:
        assert tail.stdout is not None and bounded.stdout is not None
        seen, seen_json = Lines(tail.stdout), Lines(bounded.stdout)
        assert seen.next(5) == [b"%d t/x m%d\n" % (s, s - 1) for s in range(36, 41)]
        assert [json.loads(line)["seq"] for line in seen_json.next(3)] == [58, 59, 60]
        cli("publish", "t/x", "-", input=b"new\n")
        assert seen.next(1) == [b"61 t/x new\\n\n"]
        assert json.loads(seen_json.next(1)[0])["payload"] == "new\n"
    finally:
        for proc in (tail, bounded):
            proc.send_signal(signal.SIGTERM)
    for proc, lines_of in ((tail, seen), (bounded, seen_json)):
        assert proc.wait(30) == 0
        assert proc.stderr is not None and proc.stderr.read() == b""
        assert lines_of.rest() == []  # nothing printed but the above
