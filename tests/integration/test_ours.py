"""envbuilder deletes and overwrites only what it made (issue 32, findings 1 and 2): real envs of small test wheels,
real backups, and symlinks and records planted where a hostile neighbour, a purge or a slip would put them. A
user's files beside them must come through every command untouched."""

from __future__ import annotations

import json
import os
import pty
import select
import shutil
import subprocess
from pathlib import Path

import pytest
from backupworld import SMALL_RECIPE, packages
from helpers import UserWorld, ok, refused
from wheelindex import demo_wheels, mirror_env, serve

pytestmark = pytest.mark.integration

PRECIOUS = {"data.h5": "results of a month", "thesis.tex": "chapter 1", "sub/notes.txt": "notes"}


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    d = tmp_path_factory.mktemp("ours-files")
    demo_wheels(d)
    with serve(d) as idx:
        yield idx


class World(UserWorld):
    def __init__(self, root: Path, index) -> None:
        self.work = root / "work"
        super().__init__(root, mirror_env(index), WORK=str(self.work))
        self.backups = self.work / "envbuilder" / "backups"

    def build(self, name: str, *specs: str) -> Path:
        text = SMALL_RECIPE.format(
            name=name, installer="uv", packages=packages(*(specs or ("ebdemo==1.0",))), touch="false"
        )
        self.write_recipe(name, text)
        ok(self.cli("create", name, "--no-validate"))
        return self.prefix(name)

    def prefix(self, name: str) -> Path:
        return self.scratch / "envs" / name

    def user_data(self, where: str = "mine") -> Path:
        """A directory of the user's precious files (what a planted link or record points to)."""
        root = self.root / where
        for rel, text in PRECIOUS.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        return root

    def records(self) -> list[str]:
        return [r["name"] for r in self.data("list")]


def intact(root: Path) -> None:
    assert {rel: (root / rel).read_text() for rel in PRECIOUS} == PRECIOUS


@pytest.fixture
def world(tmp_path, index):
    return World(tmp_path, index)


# ---------------------------------------------------------------------------------------------------------------
# Finding 1: prune-backups and a symlink in the backup root


def test_prune_leaves_a_symlinked_store_directory_and_the_files_it_points_to(world):
    w = world
    w.build("p")
    ok(w.cli("backup", "p"))
    mine = w.user_data()
    (w.backups / "store" / "zz").symlink_to(mine)
    res = w.cli("prune-backups", "--keep", "1")
    intact(mine)  # before: data.h5 and thesis.tex were deleted as "stored wheels"
    ok(res)
    assert "removed 0 backup(s) and 0 stored wheel(s)" in res.stdout
    assert f"warning: {w.backups}/store/zz is a symlink" in res.stderr
    assert (w.backups / "store" / "zz").is_symlink()
    dry = w.data("prune-backups", "--keep", "1", "--dry-run")
    assert dry["blobs_removed"] == 0 and any("store/zz is a symlink" in why for why in dry["left"])
    ok(w.cli("verify-backup", "p"))  # the store's own wheels are all there


def test_prune_leaves_a_symlinked_file_in_the_store_and_does_not_count_it(world):
    w = world
    w.build("p")
    ok(w.cli("backup", "p"))
    mine = w.user_data()
    [sub] = [d for d in (w.backups / "store").iterdir() if d.is_dir()][:1]
    link = sub / ("0" * 64 + ".whl.zst")
    link.symlink_to(mine / "data.h5")
    done = w.data("prune-backups", "--keep", "1")
    assert done["blobs_removed"] == 0 and done["bytes_freed"] == 0
    assert done["left"] == [f"{link} is a symlink, not an entry envbuilder wrote; left it"]
    assert link.is_symlink()
    intact(mine)


def test_prune_never_deletes_backups_reached_through_a_symlinked_env_directory(world):
    w = world
    w.build("p")
    ok(w.cli("backup", "p"))
    mine = w.user_data()
    # Two "backups" of an env whose directory is a link to the user's: the older would be pruned.
    for stamp in ("20200101T000000Z", "20210101T000000Z"):
        (mine / stamp).mkdir()
        (mine / stamp / "backup.json").write_text("{}")
        (mine / stamp / "results.csv").write_text("1,2,3")
    (w.backups / "envs" / "ghost").symlink_to(mine)
    done = w.data("prune-backups", "--keep", "1")
    assert done["removed"] == [] and any("envs/ghost is a symlink" in why for why in done["left"])
    intact(mine)
    assert (mine / "20200101T000000Z" / "results.csv").read_text() == "1,2,3"


# ---------------------------------------------------------------------------------------------------------------
# Finding 2: remove and a record whose prefix is not its env


def test_remove_keeps_a_data_directory_the_record_names_and_drops_the_record(world):
    w = world
    prefix = w.build("r")
    # Purged, and the path reused for data: the record still names it.
    subprocess.run(["rm", "-rf", str(prefix)], check=True)
    w.user_data(str(prefix.relative_to(w.root)))
    res = ok(w.cli("remove", "r", "--yes"))
    intact(prefix)
    assert f"left {prefix} in place: {prefix} holds no envbuilder/record.json" in res.stderr
    assert "only the record of r was removed" in res.stderr
    assert "removed the record of r" in res.stdout
    assert w.records() == []


def test_remove_keeps_another_envs_directory_a_planted_record_names(world):
    w = world
    a = w.build("a")
    w.build("b")
    record = w.home / "envs" / "b.json"
    data = json.loads(record.read_text())
    data["prefix"] = str(a)
    record.write_text(json.dumps(data))
    res = w.cli("remove", "b", "--yes", "--json")
    ok(res)
    out = json.loads(res.stdout)["data"]
    assert out["removed"] is True and f"{a} holds the env 'a', not 'b'" in out["prefix_left"]
    assert f"left {a} in place" in res.stderr
    assert w.records() == ["a"]
    assert w.data("show", "a")["health"]["status"] == "ok"


def test_remove_with_a_record_whose_prefix_is_a_symlink_to_an_env(world):
    w = world
    prefix = w.build("s")
    real = w.root / "real-env"
    prefix.rename(real)
    prefix.symlink_to(real)
    res = ok(w.cli("remove", "s", "--yes"))
    assert f"{prefix} is a symlink (to {real})" in res.stderr
    assert prefix.is_symlink() and (real / "bin" / "python").exists()
    assert (real / "envbuilder" / "record.json").is_file()
    assert w.records() == []


def test_remove_deletes_the_env_but_never_what_a_symlink_inside_it_points_to(world):
    w = world
    prefix = w.build("d")
    mine = w.user_data()
    (prefix / "data").symlink_to(mine)
    (prefix / "lib" / "thesis.tex").symlink_to(mine / "thesis.tex")
    ok(w.cli("remove", "d", "--yes"))
    assert not os.path.lexists(prefix)
    intact(mine)


def test_remove_of_an_archive_restored_under_another_name_deletes_it(world):
    """Its record inside is the archived one (name and prefix of the env backed up): its record in the home says
    where it came from, and the two agree."""
    w = world
    w.build("o")
    ok(w.cli("backup", "o", "--mode", "archive"))
    other = w.root / "elsewhere" / "o2"
    ok(w.cli("restore", "o", "--name", "o2", "--prefix", str(other), "--no-validate"))
    res = ok(w.cli("remove", "o2", "--yes"))
    assert "warning" not in res.stderr, res.stderr
    assert not os.path.lexists(other)
    assert w.records() == ["o"]


# ---------------------------------------------------------------------------------------------------------------
# --force replaces envs only


def test_restore_force_still_refuses_a_directory_that_is_not_an_env(world):
    w = world
    prefix = w.build("f")
    ok(w.cli("backup", "f"))
    subprocess.run(["rm", "-rf", str(prefix)], check=True)
    w.user_data(str(prefix.relative_to(w.root)))
    refused(w.cli("restore", "f", "--force", "--no-validate"), 9, "is not an environment")
    intact(prefix)
    other = w.user_data("other")
    link = w.root / "link-to-data"
    link.symlink_to(other)
    res = w.cli("restore", "f", "--force", "--prefix", str(link), "--name", "f2", "--no-validate")
    refused(res, 9, "is not an environment")
    intact(other)


def test_create_force_still_refuses_a_directory_that_is_not_an_env(world):
    w = world
    prefix = w.build("c")
    subprocess.run(["rm", "-rf", str(prefix)], check=True)
    w.user_data(str(prefix.relative_to(w.root)))
    refused(w.cli("create", "c", "--force", "--no-validate"), 9, "is not an environment")
    intact(prefix)


def test_remove_refuses_when_the_record_moved_while_it_asked(world):
    """The record is read before the question; a create --force or restore that re-points it before the answer
    must not have its env's record dropped (or its new prefix judged by the old): remove re-reads it under the
    env's mutex and stops (exit 9) with both directories and the record in place."""
    w = world
    old = w.build("m")
    moved = w.root / "elsewhere" / "m"
    shutil.copytree(old, moved, symlinks=True)
    # The question is asked on a terminal only: a pty stands in for the user's (the prompt goes to stdout).
    controller, terminal = pty.openpty()
    try:
        proc = w.spawn("remove", "m", stdin=terminal)
        assert proc.stdout is not None
        asked = b""
        while b"[y/N]" not in asked:
            ready, _, _ = select.select([proc.stdout], [], [], 120)
            assert ready, (asked, proc.poll())
            asked += os.read(proc.stdout.fileno(), 4096)
        record = w.home / "envs" / "m.json"
        data = json.loads(record.read_text())
        data["prefix"] = str(moved)
        record.write_text(json.dumps(data))
        os.write(controller, b"y\n")
        _, err = proc.communicate(timeout=120)
    finally:
        os.close(controller)
        os.close(terminal)
    assert proc.returncode == 9, err
    assert f"m moved from {old} to {moved} while remove waited; nothing was removed" in err
    assert (old / "envbuilder" / "record.json").is_file() and (moved / "envbuilder" / "record.json").is_file()
    assert json.loads(record.read_text())["prefix"] == str(moved)
