"""What the command line shows, through real ``eomsg`` processes: every string that came
from a user or a message literally (never rich markup, emoji codes or terminal controls),
and no message lost to an output format that cannot carry it."""

from __future__ import annotations

import io
import json
import re

from hypothesis import example, given, settings
from hypothesis import strategies as st
from rich.console import Console

from eomsg.cli import output
from eomsg.cli.output import shown, table
from tests.conftest import Cli

HOSTILE = ["[/]", "[bold red]alarm[/bold red]", ":x:", "a\x1b[31mred", "tab\there", "r\u202eev"]


def cells(table: bytes, first: str) -> list[str]:
    """The cells of the table row whose first cell is ``first``."""
    for line in table.decode().splitlines():
        parts = [c.strip() for c in re.split("[│┃]", line)[1:-1]]
        if parts and parts[0] == first:
            return parts
    raise AssertionError(f"no row {first!r} in\n{table.decode()}")


def test_user_data_is_shown_literally_in_every_table(cli: Cli) -> None:
    cli("queue", "create", "q", "--subscribe", "t/>")
    assert cli("queue", "subscribe", "q", "t/[/]").stdout == b"subscribed q to t/[/]\n"
    for i, payload in enumerate(HOSTILE):
        cli("publish", f"t/{i}", payload)
    cli("publish", "t/:x:", "[/]")
    log = cli("inspect", "log", "--limit", "100").stdout
    for i, payload in enumerate(HOSTILE):
        assert cells(log, str(i + 1))[2:] == [
            f"t/{i}",
            "-",
            str(len(payload.encode())),
            shown(payload),
        ]
    assert cells(log, "7")[2] == "t/:x:"
    assert b"\x1b" not in log and "\u202e".encode() not in log
    assert cells(cli("queue", "list").stdout, "q")[1] == "t/> t/[/]"
    assert cells(cli("inspect", "queues").stdout, "q")[1:3] == ["t/> t/[/]", "7"]
    sql = cli("inspect", "sql", 'SELECT topic AS "[/]", payload FROM messages WHERE seq = 2')
    assert cells(sql.stdout, "[/]") == ["[/]", "payload"]
    assert cells(sql.stdout, "t/1") == ["t/1", "[bold red]alarm[/bold red]"]


def test_errors_show_what_the_user_typed_literally(cli: Cli) -> None:
    cli("queue", "create", "q")
    r = cli("queue", "purge", "no:x:q", code=4)
    assert r.stderr == (
        b"Error: queue 'no:x:q' does not exist; create it with `eomsg queue create no:x:q`\n"
    )
    r = cli("queue", "create", "bad[/]name", code=3)
    assert r.stderr.startswith(b"Error: queue name 'bad[/]name'")


def test_a_payload_the_format_cannot_write_is_given_back_uncounted(cli: Cli) -> None:
    """Raw payloads separated by a delimiter that one of them holds: it is refused every
    time, given back and never counted toward the dead-letter queue (a text line takes
    any payload: tests/test_text_views.py)."""
    cli("queue", "create", "q", "-s", "t/>", "--max-redeliveries", "1", "--dead-letter", "dlq")
    cli("publish", "t/a", "first")
    cli("publish", "t/b", "-", input=b"p\x00\x01")
    cli("publish", "t/c", "-", input=b"two\nlines")
    for _ in range(3):  # refused every time, and never counted toward the dead-letter queue
        r = cli("consume", "q", "--raw", "--delimiter", "\\0", code=3)
        assert r.stdout in (b"first\x00", b"")
        assert r.stderr == (
            b"Error: message 2 on q holds the delimiter '\\x00': given back, not deleted "
            b"(use another --delimiter, or --json)\n"
        )
    r = cli("consume", "q", "--json", "--max", "1")
    assert [
        (m["seq"], m["payload"], m["attempt"]) for m in map(json.loads, r.stdout.splitlines())
    ] == [(2, "p\x00\x01", 1)]
    assert cli("consume", "q").stdout == b"3 t/c two\\nlines\n"
    stats = {s["name"]: s for s in json.loads(cli("inspect", "queues", "--json").stdout)}
    assert (stats["q"]["depth"], stats["dlq"]["depth"]) == (0, 0)


def test_raw_output_carries_any_payload_whole(cli: Cli) -> None:
    cli("queue", "create", "q", "--subscribe", "t/>")
    payloads = [b"p\xce\x01", b"two\nlines", b"", bytes(range(256)).replace(b"\x00", b"")]
    for p in payloads:
        cli("publish", "t/x", "-", input=p)
    cli("publish", "t/x", "-", input=b"holds\x00nul")
    r = cli("consume", "q", "--raw", "--delimiter", "\\0", code=3)
    assert r.stdout == b"".join(p + b"\x00" for p in payloads)
    assert r.stderr == (
        b"Error: message 5 on q holds the delimiter '\\x00': given back, not deleted "
        b"(use another --delimiter, or --json)\n"
    )
    r = cli("consume", "q", "--raw", "--delimiter", "", "--max", "1")
    assert r.stdout == b"holds\x00nul"
    r = cli("consume", "q", "--raw", "--delimiter", "", code=2)
    assert r.stderr == b"Error: an empty --delimiter cannot separate payloads (use --max 1)\n"
    r = cli("consume", "q", "--raw", "--into", "duckdb:x.duckdb:t", code=2)
    assert r.stderr == (
        b"Error: --raw writes payloads to stdout: it does not combine with --json, --into "
        b"or --exec\n"
    )
    r = cli("consume", "q", "--raw", "--json", code=2)  # said as --json asks
    assert json.loads(r.stderr) == {
        "error": "usage",
        "message": "--raw writes payloads to stdout: it does not combine with --json, --into "
        "or --exec",
        "exit_code": 2,
    }


def test_prefetched_messages_never_shown_do_not_count_as_attempts(cli: Cli) -> None:
    """Each embedded run takes a batch ahead and shows one: what it never showed goes
    back un-counted, across the store's reopenings, so none reaches the dead-letter queue."""
    cli("queue", "create", "q", "-s", "t/>", "--max-redeliveries", "1", "--dead-letter", "dlq")
    cli("publish", "t/x", "--stdin", input=b"".join(b"%d\n" % i for i in range(1, 11)))
    for i in range(1, 6):
        assert cli("consume", "q", "--max", "1").stdout == f"{i} t/x {i}\n".encode()
    stats = {s["name"]: s for s in json.loads(cli("inspect", "queues", "--json").stdout)}
    assert (stats["q"]["depth"], stats["q"]["dead_lettered"], stats["dlq"]["depth"]) == (5, 0, 0)
    r = cli("consume", "q", "--json")
    assert [(m["seq"], m["attempt"]) for m in map(json.loads, r.stdout.splitlines())] == [
        (s, 1) for s in range(6, 11)
    ]


_CONTROL = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40), st.text(max_size=40))
@example(header="\U0001f3fb", text="\u0301")  # no cell wide: once dropped whole by rich
def test_the_renderers_never_raise_and_show_any_text_literally(header: str, text: str) -> None:
    out = io.StringIO()
    console = Console(file=out, width=4000, markup=False, emoji=False, highlight=False)
    grid = table(header, "n")
    grid.add_row(text, "1")
    console.print(grid)
    console.print(shown(text))
    assert shown(text) in out.getvalue() and shown(header) in out.getvalue()
    assert not _CONTROL.search(shown(text))  # nothing a terminal would act on
    if not _CONTROL.search(text):
        assert shown(text) == text  # and everything else exactly as it came


def test_the_command_line_consoles_interpret_nothing() -> None:
    """No markup taken out, no emoji put in, nothing highlighted: what a console renders
    is the text as given, unstyled (rich's default console does all three to it)."""
    text = "[bold]x[/bold] :smile: 42 True http://a.b [red]"
    for console in (output.console(), output.console(err=True)):
        rendered = console.render_str(text)
        assert (rendered.plain, rendered.spans) == (text, [])
