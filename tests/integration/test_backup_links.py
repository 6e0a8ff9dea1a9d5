"""A backup root is walked and read without following a symlink, and an archive restored from it never writes
outside the env (issue 32: symlinks planted in every tree envbuilder walks). Real envs of small test wheels, real
backups, symlinks planted where another process writing the root would put them, and real archives forged with
tarfile and zstd, their backup.json rewritten to match as anyone who can write the root can."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from backupworld import World
from helpers import ok, refused
from wheelindex import demo_wheels, serve

from envbuilder import backup
from envbuilder.backup import wheelhouse

pytestmark = pytest.mark.integration
EXIT_BACKUP = 12


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    d = tmp_path_factory.mktemp("backup-links-files")
    demo_wheels(d)
    with serve(d) as idx:
        yield idx


@pytest.fixture
def world(tmp_path, index):
    w = World(tmp_path, index)
    ok(w.cli("create", w.small("p", "ebdemo==1.0"), "--no-validate"))
    return w


def _mine(w: World) -> Path:
    """The user's own directory, where a planted link points."""
    mine = w.root / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("chapter 1")
    return mine


def _ids(w: World) -> list[str]:
    return [b["id"] for b in w.data("backups")]


# ---------------------------------------------------------------------------------------------------------------
# Listing and reading


def test_a_symlinked_env_directory_is_neither_listed_nor_restored(world):
    w = world
    made = w.data("backup", "p")
    mine = _mine(w)
    shutil.copytree(made["path"], mine / Path(made["path"]).name)  # backup-shaped, but not in the root
    (w.backups / "envs" / "ghost").symlink_to(mine)
    res = ok(w.cli("backups"))
    assert f"{w.backups}/envs/ghost is a symlink (to {mine})" in res.stderr and "ghost@" not in res.stdout
    assert _ids(w) == [made["id"]]
    refused(w.cli("restore", "ghost"), EXIT_BACKUP, "envs/ghost is a symlink")
    refused(w.cli("verify-backup", "ghost"), EXIT_BACKUP, "envs/ghost is a symlink")
    assert not (w.scratch / "envs" / "ghost").exists()


def test_a_symlinked_backup_directory_is_skipped_and_restore_takes_the_real_backup(world):
    w = world
    made = w.data("backup", "p")
    mine = _mine(w)
    shutil.copytree(made["path"], mine / "copy")
    planted = (
        w.backups / "envs" / "p" / "20991231T000000Z"
    )  # newer than any real one: the one restore would take
    planted.symlink_to(mine / "copy")
    res = ok(w.cli("backups", "p"))
    assert f"{planted} is a symlink (to {mine / 'copy'}), not a backup envbuilder wrote" in res.stderr
    assert _ids(w) == [made["id"]]
    shutil.rmtree(w.prefix("p"))
    assert w.data("restore", "p", "--no-validate")["backup"] == made["id"]


def _move_out(path: Path, mine: Path) -> None:
    """``path`` moved to the user's directory and a symlink to it left in its place."""
    moved = mine / path.name
    shutil.move(str(path), moved)
    path.symlink_to(moved)


def test_files_of_a_backup_that_are_symlinks_are_not_read(world):
    w = world
    arc = w.data("backup", "p", "--mode", "archive")
    wheels = w.data("backup", "p")
    mine = _mine(w)
    # The archive: its manifest and env.tar.zst live elsewhere, reached through links (same bytes).
    for name in ("manifest.json", "env.tar.zst"):
        _move_out(Path(arc["path"], name), mine)
    res = w.cli("verify-backup", arc["id"])
    refused(res, EXIT_BACKUP, "a symlink, not a file envbuilder wrote")
    assert "manifest.json is missing or changed" in res.stderr
    # A stored wheel reached through a link: verify and restore refuse it.
    blob = next(p for p in (w.backups / "store").glob("*/[!.]*") if p.is_file())
    (mine / "store").mkdir()
    _move_out(blob, mine / "store")
    refused(w.cli("verify-backup", wheels["id"]), EXIT_BACKUP, "a symlink, not a file envbuilder wrote")
    shutil.rmtree(w.prefix("p"))
    refused(w.cli("restore", "p", "--backup", wheels["id"]), EXIT_BACKUP, "a symlink")
    assert not w.prefix("p").exists()
    # backup.json itself a link: the backup is listed as broken, never read through it.
    _move_out(Path(wheels["path"], "backup.json"), mine / "store")
    listed = {b["id"]: b for b in w.data("backups")}
    assert "a symlink, not a file envbuilder wrote" in listed[wheels["id"]]["error"]


# ---------------------------------------------------------------------------------------------------------------
# Restoring a forged archive


def _members(tar_zst: Path) -> Iterator[tuple[tarfile.TarInfo, bytes]]:
    raw = subprocess.run(["zstd", "-dc", str(tar_zst)], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        for info in tar:
            f = tar.extractfile(info) if info.isreg() else None
            yield info, f.read() if f else b""


def _forge(made: dict, extra: list[tuple[tarfile.TarInfo, bytes]]) -> None:
    """The backup's archive with ``extra`` members appended, and its backup.json rewritten to match it."""
    path = Path(made["path"])
    arc = path / "env.tar.zst"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in [*_members(arc), *extra]:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    subprocess.run(["zstd", "-q", "-f", "-o", str(arc)], input=buf.getvalue(), check=True)
    data = json.loads((path / "backup.json").read_text())
    data["archive"].update(sha256=wheelhouse.file_sha256(arc), size=arc.stat().st_size)
    data["checksum"] = backup.checksum(data)
    (path / "backup.json").write_text(json.dumps(data))


def _info(name: str, kind: bytes, linkname: str = "", size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size, info.mode = kind, linkname, size, 0o644
    return info


def _restore_refused(w: World, made: dict, text: str) -> None:
    assert w.data("verify-backup", made["id"])["ok"]  # forged to match: only extraction can tell
    shutil.rmtree(w.prefix("p"))
    refused(w.cli("restore", "p", "--no-validate"), EXIT_BACKUP, text)
    assert not w.prefix("p").exists() and list(w.prefix("p").parent.glob(".p*")) == []


def test_an_archive_member_written_through_a_symlink_member_is_refused(world):
    w = world
    made = w.data("backup", "p", "--mode", "archive")
    mine = _mine(w)
    _forge(
        made,
        [
            (_info("out", tarfile.SYMTYPE, str(mine)), b""),
            (_info("out/thesis.tex", tarfile.REGTYPE, size=3), b"hi\n"),
        ],
    )
    _restore_refused(w, made, "member 'out/thesis.tex' goes through 'out', which is a symlink or a file")
    assert [p.name for p in mine.iterdir()] == ["thesis.tex"] and (
        mine / "thesis.tex"
    ).read_text() == "chapter 1"


def test_an_archive_with_a_device_file_is_refused(world):
    w = world
    made = w.data("backup", "p", "--mode", "archive")
    dev = _info("bin/null", tarfile.CHRTYPE)
    dev.devmajor, dev.devminor = 1, 3
    _forge(made, [(dev, b"")])
    _restore_refused(w, made, "member 'bin/null' is a device file or a fifo")


# ---------------------------------------------------------------------------------------------------------------
# Writing


EXIT_STATE = 9


def test_a_backup_is_never_written_through_a_symlinked_env_or_store_directory(world):
    w = world
    first = w.data("backup", "p")
    mine = _mine(w)
    blob_dir = next((w.backups / "store").iterdir())
    # The env's directory of backups a link to the user's: refused, nothing written there.
    env_dir = w.backups / "envs" / "p"
    env_dir.rename(w.root / "p-backups")
    env_dir.symlink_to(mine)
    refused(w.cli("backup", "p"), EXIT_STATE, f"{env_dir} is a symlink (to {mine})")
    env_dir.unlink()
    (w.root / "p-backups").rename(env_dir)
    # A directory of the store a link to the user's: the wheel stored there is not written through it.
    shutil.rmtree(blob_dir)
    blob_dir.symlink_to(mine)
    refused(w.cli("backup", "p"), EXIT_STATE, f"{blob_dir} is a symlink (to {mine})")
    assert [p.name for p in mine.iterdir()] == ["thesis.tex"]
    assert _ids(w) == [first["id"]]


def test_a_stored_wheel_that_is_a_symlink_is_stored_again_and_what_it_points_to_is_left(world):
    w = world
    w.data("backup", "p")
    mine = _mine(w)
    blobs = sorted(p for p in (w.backups / "store").glob("*/[!.]*") if p.is_file())
    for blob in blobs:  # the same bytes, kept private by their owner, reached through a link
        moved = mine / blob.name
        shutil.move(str(blob), moved)
        moved.chmod(0o600)
        blob.symlink_to(moved)
    (w.prefix("p")).chmod(0o755)  # the env is readable by all: its backup's files would be made so too
    made = w.data("backup", "p")
    assert all(not b.is_symlink() and b.is_file() for b in blobs)  # links replaced by stored wheels
    assert all(
        (mine / b.name).stat().st_mode & 0o777 == 0o600 for b in blobs
    )  # never chmod'ed through a link
    assert w.data("verify-backup", made["id"])["ok"]
