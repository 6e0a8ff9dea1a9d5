"""Human output, through rich, on two streams. A command's result (a plan, a table, a report, ``show``) goes to
stdout through :attr:`Out.result`, so it can be piped, grepped and redirected; progress, warnings, errors and hints
go to stderr through :class:`Out` itself. With ``--json`` the JSON document is all there is on stdout. Each
stream is coloured only where it is a terminal, and never under ``NO_COLOR``.

No value is ever read as rich markup or as an emoji code: a prefix like ``/scratch/a[x]b`` or a recipe path holding
``[/y]`` would otherwise be shown wrong or make rich raise after the work is done. So the helpers here build
:class:`rich.text.Text` objects, whose strings are taken literally, and the styling is set beside them (not
written into them); tables get their cells through :func:`cells`. (``rich.markup.escape`` is not enough: it
mangles a trailing backslash, and leaves ``:smile:`` to the emoji replacement.)
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Optional, TextIO, Union

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

    from envbuilder.system import tables

#: A table cell or a message part: a plain string (shown literally) or a styled Text.
Cell = Union[str, "Text", None]


@functools.cache
def _console_class() -> type[Console]:
    """rich's console, but a reader that left (``envbuilder list | head``) is the BrokenPipeError the CLI turns into
    its quiet exit (141), not rich's own exit with status 1. Made at the first output: rich is some 70% of the
    CLI's imports, and ``--help``, ``--version``, completion scripts and ``--json`` results never need it."""
    from rich.console import Console  # noqa: PLC0415 - imported on first output (see above)

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError

    return _Console


def make_console(stream: Optional[TextIO] = None) -> Console:
    # rich honours NO_COLOR itself; a non-tty stream gets plain text.
    return _console_class()(
        file=stream or sys.stderr,
        highlight=False,
        soft_wrap=True,
        no_color="NO_COLOR" in os.environ,
    )


def plain(value: Cell, style: str = "") -> Text:
    """``value`` as text shown exactly as it is (no markup, no emoji codes), in ``style``."""
    from rich.text import Text  # noqa: PLC0415 - imported on first output

    if isinstance(value, Text):
        return value
    return Text("" if value is None else str(value), style=style)


def cells(*values: Cell) -> list[Text]:
    """A table row whose strings are shown literally: ``table.add_row(*cells(name, prefix))``."""
    return [plain(v) for v in values]


class Lines:
    """Lines on one console, assembled so that no value is read as markup. Without a console given, one is made
    on ``stream`` (the stream current when these lines were made: stderr by default) at the first use."""

    def __init__(self, console: Optional[Console] = None, stream: Optional[TextIO] = None) -> None:
        self._console = console
        self._stream = stream or sys.stderr

    @property
    def console(self) -> Console:
        if self._console is None:
            self._console = make_console(self._stream)
        return self._console

    def show(self, *parts: Cell) -> None:
        """One line assembled from literal strings and styled Text parts."""
        from rich.text import Text  # noqa: PLC0415 - imported on first output

        self.console.print(Text.assemble(*(plain(p) for p in parts)))

    def heading(self, text: str) -> None:
        self.show(plain(text, "bold"))

    def line(self, text: str = "") -> None:
        self.show(text)

    def field(self, name: str, value: str, *, prose: bool = False) -> None:
        """``  name: value``. ``prose``: a sentence, wrapped to the console's width under its first line (commands,
        paths and URLs are never given as prose: they stay whole on one line, to be copied)."""
        if not prose:
            self.show("  ", plain(name, "cyan"), ": ", value)
            return
        import textwrap  # noqa: PLC0415 - only prose fields need it

        indent = len(name) + 4
        lines = textwrap.wrap(value, width=max(self.console.width - indent, 30), break_on_hyphens=False) or [
            ""
        ]
        self.show("  ", plain(name, "cyan"), ": ", lines[0])
        for more in lines[1:]:
            self.show(" " * indent + more)


class Results(Lines):
    """The command's result, on stdout."""

    def table(self, columns: Sequence[tables.Column], rows: Iterable[Sequence[Cell]]) -> None:
        """A table that fits the console's width, or its rows stacked where it would not (``tables``)."""
        from envbuilder.system import tables  # noqa: PLC0415 - it imports rich: only a table needs it

        for line in tables.render(self.console, columns, [cells(*row) for row in rows]):
            self.console.print(line)


class Out(Lines):
    """A small facade so command code never formats colours itself, and never has a value read as markup: its
    own lines (progress, warnings, errors, hints) go to stderr, the command's result to stdout
    (``out.result.line(...)``, ``out.result.table(...)``)."""

    def __init__(self, console: Optional[Console] = None, results: Optional[Console] = None) -> None:
        super().__init__(console)
        self.result = Results(results, sys.stdout)
        #: -q: only warnings, errors and the result (stdout) are shown.
        self.quiet = False

    def show(self, *parts: Cell) -> None:
        if not self.quiet:
            super().show(*parts)

    def warn(self, text: str) -> None:
        super().show(plain("warning:", "yellow"), " ", text)

    def error(self, text: str, hint: Optional[str] = None) -> None:
        super().show(plain("error:", "bold red"), " ", text)
        if hint:
            super().show(plain("hint:", "green"), " ", hint)
