"""Human output. Everything for people goes to stderr through rich; stdout is kept for --json and data.

No value is ever read as rich markup or as an emoji code: a prefix like ``/scratch/a[x]b`` or a recipe path holding
``[/y]`` would otherwise be shown wrong or make rich raise after the work is done. So the helpers here build
:class:`rich.text.Text` objects, whose strings are taken literally, and the styling is set beside them (not
written into them); tables get their cells through :func:`cells`. (``rich.markup.escape`` is not enough: it
mangles a trailing backslash, and leaves ``:smile:`` to the emoji replacement.)
"""

from __future__ import annotations

import os
import sys
from typing import Optional, TextIO, Union

from rich.console import Console
from rich.text import Text

#: A table cell or a message part: a plain string (shown literally) or a styled Text.
Cell = Union[str, Text, None]


def make_console(stream: Optional[TextIO] = None) -> Console:
    # rich honours NO_COLOR itself; a non-tty stream gets plain text.
    return Console(
        file=stream or sys.stderr,
        highlight=False,
        soft_wrap=True,
        no_color="NO_COLOR" in os.environ,
    )


def plain(value: Cell, style: str = "") -> Text:
    """``value`` as text shown exactly as it is (no markup, no emoji codes), in ``style``."""
    if isinstance(value, Text):
        return value
    return Text("" if value is None else str(value), style=style)


def cells(*values: Cell) -> list[Text]:
    """A table row whose strings are shown literally: ``table.add_row(*cells(name, prefix))``."""
    return [plain(v) for v in values]


class Out:
    """A small facade so command code never formats colours itself, and never has a value read as markup."""

    def __init__(self, console: Optional[Console] = None) -> None:
        self.console = console or make_console()

    def show(self, *parts: Cell) -> None:
        """One line assembled from literal strings and styled Text parts."""
        self.console.print(Text.assemble(*(plain(p) for p in parts)))

    def heading(self, text: str) -> None:
        self.show(plain(text, "bold"))

    def line(self, text: str = "") -> None:
        self.show(text)

    def field(self, name: str, value: str) -> None:
        self.show("  ", plain(name, "cyan"), ": ", value)

    def step(self, text: str, detail: str = "") -> None:
        """A progress line: ``  → text  (detail)``."""
        self.show(
            "  ", plain("→", "cyan"), " ", text, *(("  ", plain(f"({detail})", "dim")) if detail else ())
        )

    def warn(self, text: str) -> None:
        self.show(plain("warning:", "yellow"), " ", text)

    def error(self, text: str, hint: Optional[str] = None) -> None:
        self.show(plain("error:", "bold red"), " ", text)
        if hint:
            self.show(plain("hint:", "green"), " ", hint)
