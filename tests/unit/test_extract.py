"""Extracting an env's archive never writes outside the env, whatever the archive holds: real tar archives crafted
member by member with tarfile (and real squashfs images made with mksquashfs), extracted by the code restore and
image unpack use, next to a user's directory that must come through untouched."""

from __future__ import annotations

import io
import os
import shutil
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest

from envbuilder.backup import archive
from envbuilder.core.errors import BackupError

ROOT = os.geteuid() == 0
SQUASHFS = shutil.which("mksquashfs") and shutil.which("unsquashfs")


def _member(tar: tarfile.TarFile, name: str, kind: bytes = tarfile.REGTYPE, **attrs: object) -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = 0o644
    data = attrs.pop("data", b"written through\n")
    for key, value in attrs.items():
        setattr(info, key, value)
    if kind == tarfile.REGTYPE:
        assert isinstance(data, bytes)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    else:
        tar.addfile(info)


def _archive(path: Path, members: list[tuple]) -> Path:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, attrs in members:
            _member(tar, name, kind, **attrs)
    return path


@pytest.fixture
def user(tmp_path):
    """The user's own directory (where a planted link points): a file in it and what else it holds, to compare."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "thesis.tex").write_text("chapter 1")
    return home


def _untouched(home: Path) -> None:
    assert sorted(p.name for p in home.iterdir()) == ["thesis.tex"]
    assert (home / "thesis.tex").read_text() == "chapter 1"


def _unpack(tmp_path: Path, arc: Path) -> Path:
    into = tmp_path / "env"
    archive.unpack(arc, into, archive.Tools.find())
    return into


def _refused(tmp_path: Path, arc: Path, member: str) -> str:
    with pytest.raises(BackupError) as err:
        _unpack(tmp_path, arc)
    assert f"member {member!r}" in err.value.message and str(arc) in err.value.message
    return err.value.message


DIR, FILE, LINK, HARD = tarfile.DIRTYPE, tarfile.REGTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE


def test_a_member_written_through_an_absolute_symlink_before_it_is_refused(tmp_path, user):
    arc = _archive(tmp_path / "a.tar", [("lib", LINK, {"linkname": str(user)}), ("lib/x", FILE, {})])
    assert "goes through 'lib'" in _refused(tmp_path, arc, "lib/x")
    _untouched(user)


def test_a_member_written_through_a_relative_symlink_deeper_in_is_refused(tmp_path, user):
    arc = _archive(
        tmp_path / "a.tar",
        [
            ("sub", DIR, {"mode": 0o755}),
            ("sub/lib", LINK, {"linkname": os.path.relpath(user, tmp_path / "env" / "sub")}),
            ("sub/lib/thesis.tex", FILE, {}),
        ],
    )
    assert "goes through 'sub/lib'" in _refused(tmp_path, arc, "sub/lib/thesis.tex")
    _untouched(user)


def test_a_file_after_a_symlink_of_the_same_name_is_refused(tmp_path, user):
    arc = _archive(
        tmp_path / "a.tar",
        [
            ("bin", DIR, {"mode": 0o755}),
            ("bin/python", LINK, {"linkname": str(user / "thesis.tex")}),
            ("bin/python", FILE, {}),
        ],
    )
    assert "in the archive twice" in _refused(tmp_path, arc, "bin/python")
    _untouched(user)


@pytest.mark.parametrize("name", ["/abs/olute", "../../home/thesis.tex", "lib/../../x", "./x", "a//b"])
def test_a_member_name_that_is_not_a_path_inside_the_env_is_refused(tmp_path, user, name):
    arc = _archive(tmp_path / "a.tar", [("lib", DIR, {}), (name, FILE, {})])
    assert "not a path inside the env" in _refused(tmp_path, arc, name)
    _untouched(user)
    assert not (tmp_path / "x").exists() and not (tmp_path / "env" / "abs").exists()


def test_a_hard_link_to_a_file_outside_or_through_a_symlink_is_refused(tmp_path, user):
    for target in (str(user / "thesis.tex"), "lib/thesis.tex", "../home/thesis.tex"):
        arc = _archive(
            tmp_path / "a.tar", [("lib", LINK, {"linkname": str(user)}), ("h", HARD, {"linkname": target})]
        )
        _refused(tmp_path, arc, "h")
        shutil.rmtree(tmp_path / "env")
        _untouched(user)
        assert os.stat(user / "thesis.tex").st_nlink == 1


def test_a_device_file_or_fifo_in_the_archive_is_refused(tmp_path):
    for kind in (tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE):
        arc = _archive(tmp_path / "a.tar", [("dev", kind, {"devmajor": 1, "devminor": 3})])
        assert "device file or a fifo" in _refused(tmp_path, arc, "dev")
        assert not (tmp_path / "env" / "dev").exists()
        shutil.rmtree(tmp_path / "env")


def test_setuid_setgid_sticky_and_world_write_bits_and_owners_are_not_kept(tmp_path):
    arc = _archive(
        tmp_path / "a.tar",
        [
            ("d", DIR, {"mode": 0o1777}),
            ("d/su", FILE, {"mode": 0o4755, "uid": 4321, "gid": 4321}),
            ("d/sg", FILE, {"mode": 0o2775}),
        ],
    )
    into = _unpack(tmp_path, arc)
    assert stat.S_IMODE((into / "d").stat().st_mode) == 0o775
    assert stat.S_IMODE((into / "d" / "su").stat().st_mode) == 0o755
    assert stat.S_IMODE((into / "d" / "sg").stat().st_mode) == 0o775
    assert (into / "d" / "su").stat().st_uid == os.geteuid()


def test_what_an_env_holds_is_extracted_exactly_links_to_the_base_interpreter_included(tmp_path):
    """Not an attack: a venv's absolute bin/python link, relative links, a hard link, a read-only directory."""
    arc = _archive(
        tmp_path / "a.tar",
        [
            ("bin", DIR, {"mode": 0o755}),
            ("bin/python3.11", LINK, {"linkname": "/usr/bin/python3.11"}),
            ("bin/python", LINK, {"linkname": "python3.11"}),
            ("bin/tool", FILE, {"mode": 0o755, "data": b"#!/bin/sh\n", "mtime": 1_000_000}),
            ("bin/tool2", HARD, {"linkname": "bin/tool"}),
            ("share", DIR, {"mode": 0o555}),
            ("share/data.txt", FILE, {"mode": 0o444, "data": b"row\n"}),
        ],
    )
    arc_zst = tmp_path / "a.tar.zst"
    subprocess.run(["zstd", "-q", str(arc), "-o", str(arc_zst)], check=True)
    into = _unpack(tmp_path, arc_zst)
    assert os.readlink(into / "bin" / "python3.11") == "/usr/bin/python3.11"
    assert os.readlink(into / "bin" / "python") == "python3.11"
    assert (into / "bin" / "tool").read_bytes() == b"#!/bin/sh\n"
    assert (into / "bin" / "tool").stat().st_mtime == 1_000_000
    assert os.path.samefile(into / "bin" / "tool", into / "bin" / "tool2")
    assert stat.S_IMODE((into / "share").stat().st_mode) == 0o555
    assert (into / "share" / "data.txt").read_text() == "row\n"
    (into / "share").chmod(0o755)


def test_an_archive_in_a_backup_root_that_is_a_symlink_is_not_read(tmp_path, user):
    real = _archive(user / "planted.tar", [("x", FILE, {})])
    link = tmp_path / "root" / "envs" / "p" / "20260101T000000Z" / "env.tar"
    link.parent.mkdir(parents=True)
    link.symlink_to(real)
    with pytest.raises(BackupError, match=r"cannot read .*a symlink, not a file envbuilder wrote"):
        archive.unpack(link, tmp_path / "env", archive.Tools.find(), root=tmp_path / "root")
    assert not (tmp_path / "env").exists()


def _squashfs(tmp_path: Path, fill) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    fill(src)
    image = tmp_path / "env.sqfs"
    subprocess.run(["mksquashfs", str(src), str(image), "-quiet", "-no-progress"], check=True)
    return image


@pytest.mark.skipif(not SQUASHFS, reason="squashfs-tools (mksquashfs, unsquashfs) is not installed")
@pytest.mark.skipif(not ROOT, reason="making a device file and a file of another owner needs root")
def test_a_squashfs_image_with_a_device_file_is_refused_and_bits_and_owners_are_dropped(tmp_path):
    def hostile(src: Path) -> None:
        os.mknod(src / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))

    with pytest.raises(BackupError, match="device file or a fifo"):
        archive.unpack(_squashfs(tmp_path, hostile), tmp_path / "env", archive.Tools.find())

    def odd(src: Path) -> None:
        (src / "su").write_text("#!/bin/sh\n")
        (src / "su").chmod(0o4777)
        os.chown(src / "su", 4321, 4321)
        (src / "lib").symlink_to("/usr/lib")

    shutil.rmtree(tmp_path / "src")
    (tmp_path / "env.sqfs").unlink()
    into = tmp_path / "env2"
    archive.unpack(_squashfs(tmp_path, odd), into, archive.Tools.find())
    assert stat.S_IMODE((into / "su").stat().st_mode) == 0o775
    assert (into / "su").stat().st_uid == 0
    assert os.readlink(into / "lib") == "/usr/lib"
