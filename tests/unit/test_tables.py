"""The one fit-or-stack rule for tables (envbuilder.system.tables), on rich consoles of a given width."""

from __future__ import annotations

import io

from rich.console import Console
from rich.text import Text

from envbuilder.system.tables import Column, render

COLUMNS = (Column("id"), Column("size"), Column("created", optional=True), Column("note", text=True))
ROW = ["env-with-a-long-name@20261123T174000Z", "12 MiB", "2026-11-23T17:40:00+00:00", "a few words of text"]


def lines_at(width: int, rows: list[list[str]] = [ROW]) -> list[str]:  # noqa: B006 - never changed
    console = Console(file=io.StringIO(), width=width, no_color=True)
    return [line.plain for line in render(console, COLUMNS, [[Text(v) for v in row] for row in rows])]


def test_a_wide_console_gets_the_whole_table():
    header, row = lines_at(200)
    assert header.split() == ["id", "size", "created", "note"]
    assert row.split() == [ROW[0], "12", "MiB", ROW[2], *ROW[3].split()]
    assert not header.endswith(" ") and not row.endswith(" ")  # no padding left after the last value


def test_optional_columns_go_first_where_that_makes_it_fit():
    header, row = lines_at(80)
    assert header.split() == ["id", "size", "note"]
    assert ROW[0] in row and ROW[2] not in row


def test_free_text_wraps_between_words_and_nothing_else_wraps():
    lines = lines_at(64)
    assert lines[0].split() == ["id", "size", "note"]
    assert ROW[0] in lines[1]
    assert (
        " ".join(" ".join(line.split()[3:] if i == 0 else line.split()) for i, line in enumerate(lines[1:]))
        == (ROW[3])
    )
    assert max(len(line) for line in lines) <= 64


def test_too_narrow_for_any_table_stacks_each_row_with_every_column():
    lines = lines_at(50, [ROW, ["other@1", "1 MiB", "-", ""]])
    assert lines == [
        ROW[0],
        "  size:    12 MiB",
        f"  created: {ROW[2]}",
        f"  note:    {ROW[3]}",
        "other@1",
        "  size:    1 MiB",
        "  created: -",
    ]


def test_stacked_free_text_wraps_to_the_width_and_values_stay_whole():
    long_note = "word " * 30
    lines = lines_at(40, [[ROW[0], "12 MiB", ROW[2], long_note.strip()]])
    assert lines[0] == ROW[0]  # wider than 40 is never cut
    assert all(len(line) <= 40 for line in lines[1:])
    assert " ".join(w for line in lines[3:] for w in line.split() if w != "note:") == long_note.strip()
