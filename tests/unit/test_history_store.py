"""The validation history store (validate.history): one private file per run, safe under writers in other
processes at once, bounded, and blind to symlinks."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pwd
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import DATA
from rich.console import Console
from sharedfs import give_to, other_user

from envbuilder.core.errors import StateError
from envbuilder.core.facts import HostFacts
from envbuilder.recipe.catalog import Catalog, Layer
from envbuilder.recipe.loader import load
from envbuilder.system import state
from envbuilder.system.console import Out
from envbuilder.validate import history, session
from envbuilder.validate.report import Report, Row

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


def test_the_site_store_keeps_runs_of_published_recipes_per_user_readable_by_the_admin(tmp_path):
    site = tmp_path / "site-history"
    site.mkdir()
    site.chmod(0o1777)  # as an admin sets it up: every user makes a directory of their own in it
    record = {"version": 1, "env": "e", "recipe": "pytorch-gpu", "recipe_version": "2.0"}
    path = history.append_shared(site, record, user="alice")
    assert path.parent == site / "alice" / "pytorch-gpu" / "e"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert stat.S_IMODE((site / "alice").stat().st_mode) == 0o755
    assert [r["recipe_version"] for r in history.read_dir(path.parent)] == ["2.0"]


def test_a_site_store_directory_of_another_user_or_a_link_is_refused(tmp_path):
    user = other_user()
    site = tmp_path / "site-history"
    site.mkdir()
    site.chmod(0o1777)
    record = {"version": 1, "env": "e", "recipe": "pytorch-gpu", "recipe_version": "2.0"}
    # Someone made "alice" first, to read or swap what she writes: hers must be her own.
    (site / "alice").mkdir()
    give_to(site / "alice", user, 0o755)
    with pytest.raises(StateError, match="belongs to another user"):
        history.append_shared(site, record, user="alice")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (site / "bob").symlink_to(elsewhere)
    with pytest.raises(StateError, match="is a symlink"):
        history.append_shared(site, record, user="bob")
    assert list(elsewhere.iterdir()) == []


def _report(busbw: float) -> Report:
    row = Row("nccl", "pass", (0, 1), {"busbw": {"value": busbw, "unit": "GB/s"}}, per_rank={0: {}, 1: {}})
    return Report("e", "torchrun", "cpu", 2, 1, (), (row,), 1.0, 0, "here", "", partition="p")


def test_a_run_of_a_published_recipe_goes_to_the_site_store_too(tmp_path):
    home, site = tmp_path / "home", tmp_path / "site"
    site.mkdir()
    recipe = load("vcpu", Catalog([Layer("test", DATA / "validate-recipes")]))
    stderr = io.StringIO()
    out = Out(Console(file=stderr, width=500, no_color=True))
    published = state.EnvRecord("e", "vcpu", "", "/p", "", plan={"recipe_version": "1.2"})
    local = dataclasses.replace(published, plan={})
    for _ in range(3):
        session.keep_history(
            home, published, recipe=recipe, facts=HostFacts(), result=_report(300), out=out, site=site
        )
    session.keep_history(
        home, local, recipe=recipe, facts=HostFacts(), result=_report(300), out=out, site=site
    )
    result = session.keep_history(home, local, recipe=recipe, facts=HostFacts(), result=_report(100), out=out)
    assert len(history.runs(home, "e")) == 5
    user = pwd.getpwuid(os.geteuid()).pw_name
    shared = history.read_dir(site / user / "vcpu" / "e")
    assert [r["recipe_version"] for r in shared] == ["1.2"] * 3  # the local recipe's runs stay private
    (alarm,) = result.drift
    assert alarm["figure"] == "nccl.busbw" and alarm["changes"] == []
    assert stderr.getvalue().splitlines() == [f"warning: drift: {alarm['text']}"]
