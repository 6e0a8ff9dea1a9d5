"""Broken disks in words (issue 32, finding 7): a read-only envbuilder home, a read-only or full backup root, a
full or read-only $SCRATCH, each a real tmpfs mount (``tests/sharedfs.py``). Every command that writes there ends
in a disk error (exit 15, family "disk") that names the path, says the cause in words and gives the way out of that
place (ENVBUILDER_HOME, --to / ENVBUILDER_BACKUP_ROOT, --prefix, -o), with no "internal error", no traceback, and
no temporary or partial file left where it wrote."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from helpers import UserWorld, demo_recipe, ok, run_cli_process
from sharedfs import fill, quota_dir, remount, tmpfs
from wheelindex import demo_wheels, mirror_env, serve

from envbuilder.core import settings
from envbuilder.system import fsutil

pytestmark = pytest.mark.integration


#: The words of each cause, as the error says them.
READ_ONLY = "read-only (EROFS)"
FULL = "no space left on the device (ENOSPC)"

#: What the temporary and partial names of envbuilder's writers hold.
LEFTOVER_MARKS = (".tmp-", ".partial-", ".new-", ".broken-")


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    files = tmp_path_factory.mktemp("disk-files")
    demo_wheels(files)
    with serve(files) as idx:
        yield idx


class World(UserWorld):
    """A user's world whose envbuilder home, backup root and $SCRATCH are each a tmpfs of their own, with env
    ``a`` built and backed up while they were all writable."""

    def __init__(self, root: Path, index) -> None:
        self.backups = root / "backups"
        # Pre-flight off: these tests are about the writes themselves meeting a full or read-only disk (a tiny
        # tmpfs that pre-flight, reading a CPU torch env's size, would refuse first: tests/integration/test_preflight.py).
        super().__init__(
            root, mirror_env(index), ENVBUILDER_BACKUP_ROOT=str(self.backups), ENVBUILDER_NO_PREFLIGHT="1"
        )
        self.to = root / "elsewhere"
        self.registry = root / "registry"
        self.tmp = root / "node-tmp"
        self.out = self.scratch / "out"
        for name in ("a", "b"):
            self.write_recipe(name, demo_recipe(name, prefix="${SCRATCH}/envs/{name}"))

    def place(self, name: str) -> Path:
        places = {"home": self.home, "backups": self.backups, "scratch": self.scratch, "to": self.to}
        return {**places, "registry": self.registry, "tmp": self.tmp}[name]


@pytest.fixture
def world(tmp_path, index) -> Iterator[World]:
    w = World(tmp_path, index)
    with contextlib.ExitStack() as mounts:
        sizes = ((w.home, "8m"), (w.backups, "16m"), (w.scratch, "32m"), (w.to, "4m"), (w.registry, "4m"))
        for path, size in (*sizes, (w.tmp, "4m")):
            mounts.enter_context(tmpfs(path, size=size))
        ok(w.cli("create", "a", "--no-validate"))
        ok(w.cli("backup", "a"))
        # 512 KiB that do not compress: an archive of ``a`` cannot fit where a mutex still does.
        (w.scratch / "envs" / "a" / "blob.bin").write_bytes(os.urandom(512 * 1024))
        w.out.mkdir()
        yield w


class Case(NamedTuple):
    #: The place broken: home, backups, scratch, or to (a --to DIR of its own).
    place: str
    #: read-only, full (nothing left), or nearly-full (room for a mutex, not for a backup).
    how: str
    argv: tuple[str, ...]
    #: The path the error names, relative to the place.
    path: str
    words: str
    hint: str
    #: What runs before the place is broken.
    before: tuple[str, ...] = ()


#: This node's directory for image mounts and unpacked images, under $TMPDIR.
NODE_DIR = f"envbuilder-{os.getuid()}"


CASES = {
    # A read-only envbuilder home ($WORK mounted read-only on this node): its mutexes, records and lockfiles.
    "create, home read-only": Case(
        "home", "read-only", ("create", "b", "--no-validate"), "locks", READ_ONLY, "ENVBUILDER_HOME"
    ),
    "restore, home read-only": Case(
        "home", "read-only", ("restore", "a", "--force"), "locks", READ_ONLY, "ENVBUILDER_HOME"
    ),
    "pack, home read-only": Case("home", "read-only", ("pack", "a"), "locks", READ_ONLY, "ENVBUILDER_HOME"),
    "remove, home read-only": Case(
        "home", "read-only", ("remove", "a", "--yes"), "locks", READ_ONLY, "ENVBUILDER_HOME"
    ),
    "lock, home read-only": Case("home", "read-only", ("lock", "b"), "lockfiles", READ_ONLY, "-o FILE"),
    "validate, home read-only": Case(
        "home", "read-only", ("validate", "a", "--cpu"), "envs", READ_ONLY, "ENVBUILDER_HOME"
    ),
    "lock, home full": Case("home", "full", ("lock", "b"), "lockfiles/b.lock.toml", FULL, "-o FILE"),
    "create, home full": Case(
        "home", "full", ("create", "b", "--no-validate"), "locks", FULL, "ENVBUILDER_HOME"
    ),
    # A read-only or full backup root (ENVBUILDER_BACKUP_ROOT), and a read-only --to.
    "backup, root read-only": Case(
        "backups", "read-only", ("backup", "a"), "locks", READ_ONLY, "ENVBUILDER_BACKUP_ROOT"
    ),
    "backup --all, root read-only": Case(
        "backups", "read-only", ("backup", "--all"), "locks", READ_ONLY, "--to DIR"
    ),
    "prune-backups, root read-only": Case(
        "backups", "read-only", ("prune-backups", "--keep", "1"), "locks", READ_ONLY, "--to DIR"
    ),
    "backup, root full": Case("backups", "full", ("backup", "a"), "locks", FULL, "--to DIR"),
    "backup --all, root full": Case("backups", "full", ("backup", "--all"), "locks", FULL, "--to DIR"),
    "prune-backups, root full": Case(
        "backups", "full", ("prune-backups", "--keep", "1"), "locks", FULL, "--to DIR"
    ),
    "archive backup, root nearly full": Case(
        "backups",
        "nearly-full",
        ("backup", "a", "--mode", "archive"),
        "",
        "(ENOSPC); earlier backups are intact",
        "--to DIR",
    ),
    "backup --to read-only": Case(
        "to", "read-only", ("backup", "a", "--to", "{to}"), "locks", READ_ONLY, "--to DIR"
    ),
    # A full or read-only $SCRATCH: the env prefix, an image beside it, a validation's run, -o files there.
    "create, scratch full": Case(
        "scratch", "full", ("create", "b", "--no-validate"), "envs", FULL, "--prefix DIR"
    ),
    "restore, scratch full": Case(
        "scratch", "full", ("restore", "a", "--force"), "envs", FULL, "--prefix DIR"
    ),
    "pack, scratch full": Case("scratch", "full", ("pack", "a"), "envs", FULL, "--to DIR"),
    "validate, scratch full": Case(
        "scratch", "full", ("validate", "a", "--cpu"), "envs/a/envbuilder/validation", FULL, "inside the env"
    ),
    "modulefile -o, scratch full": Case(
        "scratch", "full", ("modulefile", "a", "-o", "{out}"), "out/a.lua", FULL, "-o PATH"
    ),
    "lock -o, scratch full": Case(
        "scratch", "full", ("lock", "b", "-o", "{out}/b.lock.toml"), "out/b.lock.toml", FULL, "-o FILE"
    ),
    "create, scratch read-only": Case(
        "scratch", "read-only", ("create", "b", "--no-validate"), "envs", READ_ONLY, "--prefix DIR"
    ),
    "restore, scratch read-only": Case(
        "scratch", "read-only", ("restore", "a", "--force"), "envs", READ_ONLY, "--prefix DIR"
    ),
    "pack, scratch read-only": Case("scratch", "read-only", ("pack", "a"), "envs", READ_ONLY, "--to DIR"),
    "remove, scratch read-only": Case(
        "scratch", "read-only", ("remove", "a", "--yes"), "envs", READ_ONLY, "mounted read-only here"
    ),
    # A registry publish cannot write, and a node whose $TMPDIR cannot take an image's mount or unpacked copy.
    "publish, registry read-only": Case(
        "registry",
        "read-only",
        ("publish", "b", "--registry", "{registry}"),
        "recipes",
        READ_ONLY,
        "--registry DIR",
    ),
    "publish, registry full": Case(
        "registry", "full", ("publish", "b", "--registry", "{registry}"), "locks", FULL, "--registry DIR"
    ),
    "activate --image, TMPDIR read-only": Case(
        "tmp", "read-only", ("activate", "a", "--image"), NODE_DIR, READ_ONLY, "set TMPDIR", ("pack", "a")
    ),
    "activate --image, TMPDIR full": Case(
        "tmp", "full", ("activate", "a", "--image"), NODE_DIR, FULL, "set TMPDIR", ("pack", "a")
    ),
    "modulefile -o, scratch read-only": Case(
        "scratch", "read-only", ("modulefile", "a", "-o", "{out}"), "out", READ_ONLY, "-o PATH"
    ),
}


def _leftovers(root: Path) -> list[str]:
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if any(mark in p.name for mark in LEFTOVER_MARKS) and p.name.startswith(".")
    )


def _break(w: World, case: Case) -> Path:
    place = w.place(case.place)
    if case.how == "read-only":
        remount(place, read_only=True)
    else:
        fill(place, leave=128 * 1024 if case.how == "nearly-full" else 0)
    return place


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_a_broken_disk_is_a_disk_error_in_words(world, case):
    w = world
    if case.before:
        ok(w.cli(*case.before))
    place = _break(w, case)
    argv = [a.format(to=w.to, out=w.out, registry=w.registry) for a in case.argv]
    res = w.cli(*argv, "--json", **({"TMPDIR": str(w.tmp)} if case.place == "tmp" else {}))
    err = res.stderr
    assert res.returncode == 15, f"exit {res.returncode}\n{err}"
    assert "internal error" not in err and "Traceback" not in err, err
    path = str(place / case.path) if case.path else str(place)
    assert f"error: {path}" in err or f"written to {path}" in err, err
    assert case.words in err and case.hint in err, err
    envelope = json.loads(res.stdout)
    assert envelope["status"] == "error"
    (problem,) = envelope["errors"]
    assert problem["family"] == "disk" and problem["exit_code"] == 15 and problem["path"].startswith(path)
    # Nothing half-written stays behind where it wrote: no temporary or partial name, no half-made validation run.
    assert _leftovers(place) == [], _leftovers(place)
    assert list(place.glob("envs/a/envbuilder/validation/run-*")) == []
    if argv[0] == "restore":
        ok(w.cli("show", "a"))  # the env restore --force would have replaced is still there
        assert (w.scratch / "envs" / "a" / "bin" / "python").exists()


def test_an_over_quota_disk_is_a_disk_error_in_words(world):
    """EDQUOT from a real quota: a btrfs file system on a loop device with a qgroup limit on the backup root's
    subvolume, used up (btrfs-progs; qgroups hold for root too, and need no kernel CONFIG_QUOTA, which this
    kernel lacks)."""
    w = world
    image, mnt = w.root / "quota.img", w.root / "quota"
    with quota_dir(image, mnt, limit="1M", full=True) as quota:
        env = {**w.env, "ENVBUILDER_BACKUP_ROOT": str(quota)}
        run = subprocess.run(
            ["envbuilder", "backup", "a", "--mode", "archive", "--json"],
            capture_output=True,
            text=True,
            env={**env, "PATH": os.environ["PATH"]},
            timeout=300,
        )
        assert run.returncode == 15, run.stderr
        assert "(EDQUOT)" in run.stderr and str(quota) in run.stderr and "--to DIR" in run.stderr
        assert "internal error" not in run.stderr and "Traceback" not in run.stderr
        assert json.loads(run.stdout)["errors"][0]["family"] == "disk"
        assert _leftovers(quota) == []


#: Root as a user is: permission checks apply (setpriv drops the capabilities that let root pass them).
AS_A_USER = (
    "setpriv",
    "--inh-caps=-dac_override,-dac_read_search",
    "--ambient-caps=-dac_override,-dac_read_search",
    "--bounding-set=-dac_override,-dac_read_search",
)


@pytest.mark.parametrize(
    ("place", "argv", "way_out"),
    [
        ("home", ("create", "b", "--no-validate"), "ENVBUILDER_HOME"),
        ("backups", ("backup", "a"), "--to DIR"),
    ],
)
def test_a_directory_without_write_permission_is_a_disk_error_in_words(world, place, argv, way_out):
    """EACCES for real: the place and every directory in it are the user's own but not writable (mode 0555, as a
    frozen project directory is), and the command runs without the capabilities that let root write anyway."""
    w = world
    where = w.place(place)
    dirs = [where, *(d for d in where.rglob("*") if d.is_dir() and not d.is_symlink())]
    for d in dirs:
        d.chmod(0o555)
    try:
        res = subprocess.run(
            [*AS_A_USER, "envbuilder", *argv, "--json"],
            capture_output=True,
            text=True,
            env={**w.env, "PATH": os.environ["PATH"]},
            timeout=300,
        )
    finally:
        for d in dirs:
            d.chmod(0o755)
    assert res.returncode == 15, res.stderr
    assert "permission denied (EACCES)" in res.stderr and str(where) in res.stderr and way_out in res.stderr
    assert "internal error" not in res.stderr and "Traceback" not in res.stderr
    problem = json.loads(res.stdout)["errors"][0]
    assert problem["family"] == "disk" and problem["errno"] == errno.EACCES
    assert _leftovers(where) == []


def test_a_read_only_home_warns_once_and_plan_goes_on(tmp_path, index):
    """plan and recipes list only read: a cache they cannot write (a read-only home) is one warning, not a
    failure, and nothing is written."""
    w = World(tmp_path, index)
    with tmpfs(w.home, size="1m", read_only=True):
        for argv in (("plan", "a"), ("recipes", "list")):
            res = ok(run_cli_process(*argv, env=w.env))  # a process of its own: "once" is once a process
            warned = [line for line in res.stderr.splitlines() if "cannot be written" in line]
            assert len(warned) == 1, res.stderr
            assert (
                str(w.home / "cache") in warned[0]
                and "read-only" in warned[0]
                and "ENVBUILDER_HOME" in warned[0]
            )
            assert list(w.home.iterdir()) == []


@pytest.mark.parametrize("number", sorted(fsutil.DISK_ERRNOS), ids=lambda n: errno.errorcode[n])
def test_every_disk_errno_is_in_words_with_the_way_out_of_its_place(tmp_path, number):
    """Each errno of the family, as the kernel reports it for a file under a place (this one can be had for real
    here only where the kernel has quotas: EDQUOT is shown by the quota test above where it can)."""
    home = tmp_path / "eb-home"
    exc = OSError(number, os.strerror(number), str(home / "locks" / ".x.lock.new-host-1-2" / "owner.json"))
    places = settings.disk_places({"ENVBUILDER_HOME": str(home), "SCRATCH": str(tmp_path / "scratch")})
    err = fsutil.disk_error(exc, places)
    assert err is not None and err.exit_code == 15 and err.family == "disk"
    assert err.path == str(home / "locks")  # the directory the user knows, not a temporary name in it
    assert err.message == f"{home / 'locks'}: {fsutil.DISK_ERRNOS[number]} ({errno.errorcode[number]})"
    assert err.hint and err.hint.endswith(settings.HOME_WAY_OUT)
    assert err.to_json()["errno"] == number


def test_a_killed_writers_temporary_file_is_swept_by_the_next_write(tmp_path, index):
    """A writer killed between its temporary file and the rename leaves ``.NAME.tmp-PID-NS``: the next write of
    NAME removes it once its process is gone (and it is an hour old: another node's pid cannot be checked); a
    live writer's is left alone."""
    w = World(tmp_path, index)
    ok(w.cli("create", "a", "--no-validate"))
    out = tmp_path / "modulefiles"
    out.mkdir()
    gone = subprocess.Popen(["true"])
    gone.wait()
    killed = out / f".a.lua.tmp-{gone.pid}-1"
    recent = out / f".a.lua.tmp-{gone.pid}-2"
    alive = out / f".a.lua.tmp-{os.getpid()}-3"
    for f in (killed, recent, alive):
        f.write_bytes(b"half a modulefile")
    hour_ago = time.time() - 7200
    for f in (killed, alive):
        os.utime(f, (hour_ago, hour_ago))
    ok(w.cli("modulefile", "a", "-o", str(out)))
    assert sorted(p.name for p in out.iterdir()) == sorted(["a.lua", recent.name, alive.name])
