"""The validation history store (validate.history): one private file per run, safe under writers in other
processes at once, bounded, and blind to symlinks."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from envbuilder.core.errors import StateError
from envbuilder.validate import history

#: One writer: appends COUNT records of env "e" tagged with its name, keeping at most KEEP.
WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from envbuilder.validate import history
    home, who, count, keep = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    sys.stdin.readline()  # both writers start together
    for i in range(count):
        history.append(home, {"version": 1, "env": "e", "who": who, "i": i}, keep=keep)
    """
)


def _writers(home: Path, count: int, keep: int) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(home), who, str(count), str(keep)],
            stdin=subprocess.PIPE,
            text=True,
        )
        for who in ("a", "b")
    ]
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.close()
    for p in procs:
        assert p.wait(timeout=300) == 0


def test_two_writers_at_once_lose_nothing_and_keep_the_bound(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    _writers(home, 60, keep=200)
    runs = history.runs(home, "e")
    assert sorted((r["who"], r["i"]) for r in runs) == sorted((w, i) for w in "ab" for i in range(60))
    # Each writer's records come back in the order it wrote them (the names sort by time).
    assert [r["i"] for r in runs if r["who"] == "a"] == list(range(60))
    # Past the bound: both writers prune while the other writes; exactly the bound is left, the newest of each.
    _writers(home, 60, keep=100)
    runs = history.runs(home, "e")
    assert len(runs) == 100
    assert {("a", 59), ("b", 59)} <= {(r["who"], r["i"]) for r in runs}
    assert not [p.name for p in (home / "history" / "e").iterdir() if p.name.startswith(".")]  # no temp left


def test_the_store_is_private(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    old = os.umask(0o022)
    try:
        path = history.append(home, {"version": 1, "env": "e"})
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE((home / "history").stat().st_mode) == 0o700


def test_a_linked_store_is_refused_and_nothing_written_through_it(tmp_path):
    home = tmp_path / "home"
    (home / "history").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (home / "history" / "e").symlink_to(elsewhere)
    with pytest.raises(StateError, match="is a symlink"):
        history.append(home, {"version": 1, "env": "e"})
    with pytest.raises(StateError, match="is a symlink"):
        history.runs(home, "e")
    assert list(elsewhere.iterdir()) == []


def test_a_link_among_the_runs_is_neither_read_nor_pruned_through(tmp_path):
    home = tmp_path / "home"
    first = history.append(home, {"version": 1, "env": "e", "n": 0})
    target = tmp_path / "precious.json"
    target.write_text(json.dumps({"version": 1, "env": "e", "n": "link"}))
    link = first.with_name("19990101T000000.000000Z-h-1.json")  # named as the oldest run
    link.symlink_to(target)
    history.append(home, {"version": 1, "env": "e", "n": 1}, keep=1)
    assert [r["n"] for r in history.runs(home, "e")] == [1]
    assert target.exists() and link.is_symlink()  # not ours to remove, and never followed


def test_foreign_and_torn_files_are_skipped(tmp_path):
    home = tmp_path / "home"
    path = history.append(home, {"version": 1, "env": "e", "n": 0})
    path.with_name("20000101T000000.000000Z-h-2.json").write_text('{"version": 1, "env"')
    path.with_name("notes.txt").write_text("mine")
    assert [r["n"] for r in history.runs(home, "e")] == [0]
    with pytest.raises(StateError, match="invalid env name"):
        history.runs(home, "../x")
