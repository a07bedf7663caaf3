"""What the command line writes, and the one rule it keeps: every string that came from a
user or a message is data, shown literally.

Rich would otherwise read ``[/]`` as markup (and raise), ``:x:`` as an emoji and
``[bold red]`` as a style; a terminal would act on an escape sequence, a carriage return
or a bidirectional override inside a payload. So the consoles here interpret nothing
(no markup, no emoji, no highlighting), every table cell and line goes through
:func:`shown`, and styles come only from this code, as :class:`rich.text.Text`."""

from __future__ import annotations

import functools
import json
import re
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # rich is loaded when a table or a bar is drawn, not to say one line
    from rich.console import Console, RenderableType
    from rich.table import Table
    from rich.text import Text

# What a terminal acts on instead of showing: C0 and C1 controls, DEL, line and paragraph
# separators, and the bidirectional marks, embeddings, overrides and isolates.
_ACTED_ON = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(char) or (
        f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"
    )


def shown(text: str) -> str:
    """``text`` as it is, except the characters a terminal would act on rather than show,
    which are written as Python escapes (``\\x1b``, ``\\n``, ``\\u202e``): so one value is
    one line, and what is on the screen is what is in the store."""
    return _ACTED_ON.sub(_escape, text)


def shown_payload(payload: bytes) -> str:
    """A payload as one line of text for people: its UTF-8 text shown literally, except
    what :func:`shown` escapes (a newline as ``\\n``, a tab as ``\\t``, ESC as
    ``\\x1b``), and each byte that is not UTF-8 as ``\\xNN`` — any payload, binary
    included, so a text view never refuses one. A backslash is shown as it is: a view,
    not an encoding (``--json`` and ``--raw`` carry the bytes exactly)."""
    return shown(payload.decode("utf-8", "backslashreplace"))


def say(text: str, *, err: bool = False) -> None:
    """One line on stdout (or stderr), shown literally."""
    (sys.stderr if err else sys.stdout).write(shown(text) + "\n")


def print_json(obj: Any, *, err: bool = False) -> None:
    """One JSON document on one line of stdout (stderr with ``err``)."""
    (sys.stderr if err else sys.stdout).write(json.dumps(obj, ensure_ascii=False) + "\n")


@functools.cache
def console(*, err: bool = False) -> Console:
    """The rich console of stdout (or stderr): it interprets nothing — no markup, no
    emoji, no highlighting. Piped output is not squeezed into 80 columns: a table is
    read whole or parsed."""
    from rich.console import Console

    sys.stdout.flush()  # what say() wrote goes first
    wide = None if (sys.stderr if err else sys.stdout).isatty() else 200
    return Console(
        stderr=err, markup=False, emoji=False, highlight=False, soft_wrap=True, width=wide
    )


def show(renderable: RenderableType) -> None:
    """Draw a table (or any rich renderable) on stdout."""
    console().print(renderable)


def table(*headers: str, **kwargs: Any) -> Table:
    """A rich table whose headers and string cells are shown literally (they may come
    from a user's query or a message); cells given as :func:`styled` keep their style."""
    return _literal_table()(*headers, **kwargs)


@functools.cache
def _literal_table() -> type[Table]:
    from rich.table import Table

    class LiteralTable(Table):
        def __init__(self, *headers: str, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            for h in headers:  # a column at least one cell wide: one whose text takes no
                # cell (a lone combining mark, an emoji modifier) would be dropped whole
                self.add_column(shown(h), min_width=1)

        def add_row(self, *cells: Any, **kwargs: Any) -> None:
            super().add_row(*(shown(c) if isinstance(c, str) else c for c in cells), **kwargs)

    return LiteralTable


def styled(text: str, style: str) -> Text:
    """A word of this program's own, in a style (never for user data)."""
    from rich.text import Text

    return Text(text, style=style)
