"""Tables that fit the width they are shown at: the one place that decides between a table and a stacked list.

A pipe gets 80 columns from rich (or ``$COLUMNS``), and a table squeezed into fewer columns than it needs wraps a
column one letter per line or cuts the very value a user has to type next (a backup ID, a prefix, a recipe name).
So no value is ever wrapped inside a word or cut: a table is shown as a table only where every value fits whole
(free-text columns may wrap between words); otherwise its optional columns are left out, and where even that does
not fit, each row becomes a block (its first value on a line, then ``key: value`` lines) whose lines are never
wrapped. ``--json`` always has every column.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.cells import cell_len
from rich.console import Console, RenderableType
from rich.text import Text

from envbuilder.core.structs import dataclass

#: The space rich puts between two columns of a borderless table (one cell of padding on each side).
_GAP = 2
#: The narrowest a free-text column is squeezed to, whatever its longest word: narrower reads as a word per line.
_MIN_TEXT = 16


@dataclass(frozen=True)
class Column:
    header: str
    #: Free text (a cause, a hint, figures) that may wrap between words; every other value stays whole.
    text: bool = False
    #: Left out where the table would not fit otherwise (the stacked layout and --json keep it).
    optional: bool = False


def render(console: Console, columns: Sequence[Column], rows: Sequence[Sequence[Text]]) -> list[Text]:
    """``rows`` (one Text per column) as lines for ``console``: a table where one fits its width, else stacked."""
    width = console.width
    shown = list(range(len(columns)))
    while True:
        if _needed(columns, rows, shown) <= width:
            return _table_lines(console, columns, rows, shown)
        optional = [i for i in shown if columns[i].optional]
        if not optional:
            return stacked(columns, rows, width)
        shown.remove(optional[-1])


def stacked(columns: Sequence[Column], rows: Sequence[Sequence[Text]], width: int) -> list[Text]:
    """One block per row: its first value alone on a line, then ``  header: value`` lines (empty values left
    out), the values of a block lined up. Free text wraps between words to ``width``; nothing else wraps."""
    indent = max((cell_len(c.header) for c in columns[1:]), default=0) + 4
    lines: list[Text] = []
    for row in rows:
        lines.append(row[0])
        for column, value in zip(columns[1:], row[1:]):
            if not value.plain:
                continue
            first, *rest = _wrapped(value, width - indent) if column.text else value.split("\n")
            lines.append(Text.assemble(Text(f"  {column.header}:".ljust(indent), style="cyan"), first))
            lines.extend(Text.assemble(" " * indent, more) for more in rest)
    return lines


def _wrapped(value: Text, width: int) -> list[Text]:
    """``value`` broken into lines of ``width`` cells at most, between words where it can."""
    return list(value.wrap(Console(width=max(width, _MIN_TEXT)), max(width, _MIN_TEXT), overflow="fold"))


def _widest(value: Text) -> int:
    return max((cell_len(line) for line in value.plain.split("\n")), default=0)


def _longest_word(value: Text) -> int:
    return max((cell_len(word) for word in value.plain.split()), default=0)


def _min_width(column: Column, index: int, rows: Sequence[Sequence[Text]]) -> int:
    """The fewest cells column ``index`` can have with no value cut inside a word."""
    widest = max([cell_len(column.header), *(_widest(row[index]) for row in rows)])
    if not column.text:
        return widest
    words = max([cell_len(column.header), *(_longest_word(row[index]) for row in rows)])
    return min(widest, max(words, _MIN_TEXT))


def _needed(columns: Sequence[Column], rows: Sequence[Sequence[Text]], shown: list[int]) -> int:
    return sum(_min_width(columns[i], i, rows) for i in shown) + _GAP * (len(shown) - 1)


def _table_lines(
    console: Console, columns: Sequence[Column], rows: Sequence[Sequence[Text]], shown: list[int]
) -> list[Text]:
    from rich.table import Table  # noqa: PLC0415 - rich's table layout only where a table is shown

    table = Table(box=None, pad_edge=False, header_style="bold")
    for i in shown:
        col = columns[i]
        if col.text:
            table.add_column(col.header, overflow="fold", min_width=_min_width(col, i, rows))
        else:
            table.add_column(col.header, no_wrap=True, min_width=_min_width(col, i, rows))
    for row in rows:
        table.add_row(*(row[i] for i in shown))
    return _lines(console, table)


def _lines(console: Console, renderable: RenderableType) -> list[Text]:
    """What ``renderable`` shows on ``console``, line by line, with the blanks rich pads cells with dropped."""
    out = []
    for segments in console.render_lines(renderable, console.options, pad=False):
        line = Text()
        for seg in segments:
            if not seg.control:
                line.append(seg.text, seg.style)
        line.rstrip()
        out.append(line)
    return out
