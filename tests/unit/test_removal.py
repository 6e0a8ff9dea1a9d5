"""The one place that decides what envbuilder may delete, and its rm -rf that never follows a symlink: real trees
with real symlinks (to directories and files, at every depth, dangling, a FIFO), a user's data beside them that
must come through untouched."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from envbuilder.core.errors import UnsafePath
from envbuilder.system import removal


def _user_data(root: Path) -> dict[str, str]:
    """A user's directory of precious files (what a link planted in envbuilder's trees points to)."""
    (root / "sub").mkdir(parents=True)
    files = {"data.h5": "h5 bytes", "thesis.tex": "chapter 1", "sub/notes.txt": "notes"}
    for rel, text in files.items():
        (root / rel).write_text(text)
    return files


def _intact(root: Path, files: dict[str, str]) -> None:
    assert {rel: (root / rel).read_text() for rel in files} == files


def test_links_at_every_depth_are_unlinked_and_what_they_point_to_is_kept(tmp_path):
    user = tmp_path / "user"
    files = _user_data(user)
    tree = tmp_path / "tree"
    here = tree
    for depth in range(4):
        (here / "d").mkdir(parents=True)
        (here / f"file{depth}").write_text("ours")
        (here / f"to-dir{depth}").symlink_to(user)
        (here / f"to-file{depth}").symlink_to(user / "thesis.tex")
        (here / f"to-sub{depth}").symlink_to(os.path.relpath(user / "sub", here))
        (here / f"dangling{depth}").symlink_to(tmp_path / "nowhere")
        here = here / "d"
    os.mkfifo(tree / "fifo")
    removal.remove_tree(tree)
    assert not os.path.lexists(tree)
    _intact(user, files)


def test_a_top_path_that_is_a_link_is_unlinked_itself(tmp_path):
    user = tmp_path / "user"
    files = _user_data(user)
    link = tmp_path / "env"
    link.symlink_to(user)
    removal.remove_tree(link)
    assert not os.path.lexists(link)
    _intact(user, files)
    removal.remove_tree(tmp_path / "never-was")  # nothing to do


def test_a_directory_swapped_for_a_link_after_it_was_listed_is_not_followed(tmp_path):
    """A listing said ``x`` was a directory; by the time it is opened, someone has put a link to their data
    there. Opening it without following (O_NOFOLLOW) fails, and only the link goes."""
    user = tmp_path / "user"
    files = _user_data(user)
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "x").symlink_to(user)
    fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    errors: list[OSError] = []
    try:
        removal._remove_entry(fd, "x", True, errors)  # the step after a listing, at the race
    finally:
        os.close(fd)
    assert errors == [] and not os.path.lexists(tree / "x")
    _intact(user, files)


def test_a_discarded_link_is_refused_where_a_directory_is_meant(tmp_path):
    from envbuilder.system import transaction

    user = tmp_path / "user"
    files = _user_data(user)
    link = tmp_path / "env"
    link.symlink_to(user)
    with pytest.raises(UnsafePath, match="is a symlink"):
        transaction.discard(link)
    assert link.is_symlink()
    _intact(user, files)


def test_remove_below_never_passes_a_link_and_never_takes_one_for_an_entry(tmp_path):
    user = tmp_path / "user"
    files = _user_data(user)
    root = tmp_path / "root"
    (root / "store" / "ab").mkdir(parents=True)
    (root / "store" / "zz").symlink_to(user)
    (root / "store" / "ab" / "link.whl.zst").symlink_to(user / "data.h5")
    blob = root / "store" / "ab" / "blob.whl.zst"
    blob.write_text("wheel")
    (root / "store" / "ab" / "dir").mkdir()

    through = removal.remove_below(root, root / "store" / "zz" / "data.h5")
    assert through is not None and f"{root}/store/zz is a symlink" in through
    at_link = removal.remove_below(root, root / "store" / "ab" / "link.whl.zst")
    assert at_link is not None and "is a symlink" in at_link
    assert removal.remove_below(root, root / "store" / "zz") is not None
    a_dir = removal.remove_below(root, root / "store" / "ab" / "dir")
    assert a_dir is not None and "is a directory" in a_dir
    assert removal.remove_below(root, blob, dry_run=True) is None and blob.exists()
    assert removal.remove_below(root, blob) is None and not blob.exists()
    assert removal.remove_below(root, blob) is None  # gone already: nothing to do
    assert removal.remove_below(root, root / "store" / "ab" / "dir", aside=".dir.gone", dirs=True) is None
    assert sorted(p.name for p in (root / "store" / "ab").iterdir()) == ["link.whl.zst"]
    assert (root / "store" / "zz").is_symlink()
    _intact(user, files)


def _env(prefix: Path, name: str, at: str) -> Path:
    (prefix / "envbuilder").mkdir(parents=True)
    (prefix / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (prefix / "envbuilder" / "record.json").write_text(json.dumps({"name": name, "prefix": at}))
    return prefix


def test_an_env_is_the_one_its_own_record_names(tmp_path):
    env = _env(tmp_path / "a", "a", str(tmp_path / "a"))
    assert removal.env_problem(env, "a") is None
    other = removal.env_problem(env, "b")
    assert other is not None and "holds the env 'a', not 'b'" in other
    moved = _env(tmp_path / "moved", "a", str(tmp_path / "a"))
    elsewhere = removal.env_problem(moved, "a")
    assert elsewhere is not None and f"built for {tmp_path / 'a'}" in elsewhere
    # An archive restored under another name and prefix keeps the record it was packed with.
    assert removal.env_problem(moved, "a2", origin=("a", str(tmp_path / "a"))) is None
    data = tmp_path / "data"
    _user_data(data)
    plain = removal.env_problem(data, "a")
    assert plain is not None and "holds no envbuilder/record.json" in plain
    link = tmp_path / "link"
    link.symlink_to(env)
    linked = removal.env_problem(link, "a")
    assert linked is not None and "is a symlink" in linked
    assert not removal.is_env(link) and removal.is_env(env)


def test_a_record_reached_through_a_link_inside_the_prefix_is_no_record(tmp_path):
    env = _env(tmp_path / "a", "a", str(tmp_path / "data"))
    data = tmp_path / "data"
    data.mkdir()
    (data / "envbuilder").symlink_to(env / "envbuilder")  # a copy of a's record, by link
    planted = removal.env_problem(data, "a")
    assert planted is not None and "holds no envbuilder/record.json" in planted
