"""Human output. Everything for people goes to stderr through rich; stdout is kept for --json and data."""

from __future__ import annotations

import os
import sys
from typing import Optional, TextIO

from rich.console import Console
from rich.markup import escape


def make_console(stream: Optional[TextIO] = None) -> Console:
    # rich honours NO_COLOR itself; a non-tty stream gets plain text.
    return Console(
        file=stream or sys.stderr,
        highlight=False,
        soft_wrap=True,
        no_color="NO_COLOR" in os.environ,
    )


class Out:
    """A small facade so command code never formats colours itself."""

    def __init__(self, console: Optional[Console] = None) -> None:
        self.console = console or make_console()

    def heading(self, text: str) -> None:
        self.console.print(f"[bold]{escape(text)}[/bold]")

    def line(self, text: str = "") -> None:
        self.console.print(escape(text))

    def field(self, name: str, value: str) -> None:
        self.console.print(f"  [cyan]{escape(name)}[/cyan]: {escape(value)}")

    def warn(self, text: str) -> None:
        self.console.print(f"[yellow]warning:[/yellow] {escape(text)}")

    def error(self, text: str, hint: Optional[str] = None) -> None:
        self.console.print(f"[bold red]error:[/bold red] {escape(text)}")
        if hint:
            self.console.print(f"[green]hint:[/green] {escape(hint)}")
