"""Text output shows any payload and never sticks a queue (issue 35, item 10) — through
real ``eomsg`` processes.

``publish`` keeps a payload's bytes exactly (``echo x | eomsg publish t -`` publishes
``x\\n``); the text views — plain ``consume``, ``inspect log``, its ``--follow`` and
``browse`` — show what one line cannot carry escaped (``\\n``, ``\\t``, ``\\x1b``, a byte
that is not UTF-8 as ``\\xNN``), and ``--json`` and ``--raw`` carry it exactly."""

from __future__ import annotations

import json

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
