"""Backups for real: envs of small test wheels built with real uv/pip from a local index, backed up, deleted,
damaged, killed mid-way, corrupted, and restored (the torch env's round trips and interruptions are in
test_backup_torch.py, apart so that xdist can run the two files on different workers)."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from backupworld import SMALL_RECIPE, World, packages
from helpers import ORPHANS_SETTLE_S, REPO, Paused, bash, kill_at, lmod_vars, ok

pytestmark = pytest.mark.integration
SQUASHFS = shutil.which("mksquashfs") and shutil.which("unsquashfs")


@pytest.fixture
def world(tmp_path, backup_index):
    return World(tmp_path, backup_index)


# ---------------------------------------------------------------------------------------------------------------
# Round trips


def test_three_envs_store_only_what_differs(world):
    w = world
    for name, extra in (("a", ()), ("b", ()), ("c", ("ebbig==1.0",))):
        ok(w.cli("create", w.small(name, "ebdemo==1.0", *extra), "--no-validate"))
    sizes = []
    for name in ("a", "b", "c"):
        ok(w.cli("backup", name))
        sizes.append(w.store_bytes())
    assert sizes[1] == sizes[0]  # b holds exactly a's wheels
    big = w.data("backups", "c")[-1]
    assert big["new_bytes"] == sizes[2] - sizes[1]
    assert 1_000_000 < sizes[2] - sizes[1] < 4_500_000  # ebbig's 4 MB of hex text, zstd-compressed
    # Few files: one per distinct wheel, whatever the number of envs.
    assert len(list((w.backups / "store").glob("*/[!.]*"))) == 3  # ebdemo, ebdep, ebbig


def test_archive_round_trip_relocates_pip_scripts(world):
    w = world
    ok(w.cli("create", w.small("arc", "ebtool==1.0", installer="pip"), "--no-validate"))
    made = w.data("backup", "arc", "--mode", "archive")
    assert made["mode"] == "archive"
    header = (w.prefix("arc") / "bin" / "ebtool").read_text().splitlines()[0]
    assert header == f"#!{w.prefix('arc')}/bin/python"  # pip writes absolute headers
    new = w.root / "moved" / "arc"
    data = w.data("restore", "arc", "--prefix", str(new), "--name", "arc2")
    assert "bin/ebtool" in data["relocation"]["rewritten"] and "pyvenv.cfg" not in data["relocation"]["left"]
    run = subprocess.run([str(new / "bin" / "ebtool")], capture_output=True, text=True)
    assert run.stdout.strip() == f"ebtool from {new}", run.stderr
    # At the original prefix, the restore is exact: every entry matches the manifest's hash.
    subprocess.run(["rm", "-rf", str(w.prefix("arc"))], check=True)
    ok(w.cli("restore", "arc"))
    from envbuilder.backup import archive

    manifest = json.loads(next(w.backups.glob("envs/arc/*/manifest.json")).read_text())
    assert archive.hash_tree(w.prefix("arc")) == manifest


@pytest.mark.skipif(
    not SQUASHFS, reason="squashfs-tools (mksquashfs, unsquashfs) is not installed; .ci/run installs it"
)
def test_squashfs_archive_round_trip(world):
    w = world
    ok(w.cli("create", w.small("sq", "ebtool==1.0"), "--no-validate"))
    made = w.data("backup", "sq", "--mode", "archive", "--format", "squashfs")
    assert Path(made["path"], "env.sqfs").is_file()
    subprocess.run(["rm", "-rf", str(w.prefix("sq"))], check=True)
    ok(w.cli("restore", "sq"))
    run = subprocess.run([str(w.prefix("sq") / "bin" / "ebtool")], capture_output=True, text=True)
    assert run.stdout.strip() == f"ebtool from {w.prefix('sq')}"


# ---------------------------------------------------------------------------------------------------------------
# Integrity


def test_a_corrupted_byte_is_found_and_restore_refuses(world):
    w = world
    ok(w.cli("create", w.small("cor", "ebdemo==1.0"), "--no-validate"))
    wheel = w.data("backup", "cor")
    arc = w.data("backup", "cor", "--mode", "archive")
    assert w.data("verify-backup", "cor")["ok"]
    blob = next(w.backups.glob("store/*/[!.]*"))
    raw = bytearray(blob.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    blob.write_bytes(bytes(raw))
    res = w.cli("verify-backup", wheel["id"])
    assert res.returncode == 12 and "sha256" in res.stderr, res.stderr
    subprocess.run(["rm", "-rf", str(w.prefix("cor"))], check=True)
    res = w.cli("restore", "cor", "--backup", wheel["id"])
    assert res.returncode == 12 and "failed verification" in res.stderr
    assert not w.prefix("cor").exists() and list(w.prefix("cor").parent.glob(".cor*")) == []
    listed = {b["id"]: b for b in w.data("backups", "cor")}
    assert listed[wheel["id"]]["verified"]["ok"] is False
    # The archive backup is corrupted the same way, and refused the same way.
    tar = Path(arc["path"]) / "env.tar.zst"
    raw = bytearray(tar.read_bytes())
    raw[-100] ^= 0x40
    tar.write_bytes(bytes(raw))
    res = w.cli("restore", "cor", "--backup", arc["id"])
    assert res.returncode == 12 and "the archive" in res.stderr
    assert not w.prefix("cor").exists()


def test_restore_from_uv_cache_trusts_a_remembered_digest_and_verify_backup_reads_every_byte(world):
    """The trust a stored wheel's hash memo (backup/hashmemo.py) is given, shown by forging one: restore from uv's
    cache checks a stored wheel by the digest remembered beside it while the file is the one hashed (same size,
    times, inode), and hashes it again once that changed; verify-backup reads every byte whatever the memo says."""
    w = world
    ok(w.cli("create", w.small("memo", "ebdemo==1.0"), "--no-validate"))
    made = w.data("backup", "memo")
    bid = made["id"]
    stored = json.loads((Path(made["path"]) / "backup.json").read_text())["wheels"]
    (wheel,) = [x for x in stored if x["name"] == "ebdemo"]
    blob = w.backups / wheel["path"]
    memo = blob.with_name(f".{blob.name}.sha256")
    written = json.loads(memo.read_text())  # the backup hashed what it wrote, and remembered it
    assert written["sha256"] == wheel["sha256"]
    st = blob.stat()
    assert written["identity"] == [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]
    # Damaged bytes of the same size, and a memo that vouches for the file as it now is.
    raw = bytearray(blob.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    blob.write_bytes(bytes(raw))
    st = blob.stat()
    forged = {**written, "identity": [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]}
    memo.write_text(json.dumps(forged))
    subprocess.run(["rm", "-rf", str(w.prefix("memo"))], check=True)
    ok(w.cli("restore", "memo", "--backup", bid))  # the env is the backed-up build, by its RECORD digests
    res = w.cli("verify-backup", bid)
    assert res.returncode == 12 and "sha256" in res.stderr, res.stderr
    # The memo as written by the backup no longer matches the file (its change time moved): hashed, refused.
    memo.write_text(json.dumps(written))
    subprocess.run(["rm", "-rf", str(w.prefix("memo"))], check=True)
    res = w.cli("restore", "memo", "--backup", bid)
    assert res.returncode == 12 and "failed verification" in res.stderr, res.stderr
    assert not w.prefix("memo").exists()


def test_a_changed_file_refuses_a_wheelhouse_backup_but_not_an_archive(world):
    w = world
    ok(w.cli("create", w.small("edit", "ebdemo==1.0"), "--no-validate"))
    init = next(w.prefix("edit").glob("lib/python*/site-packages/ebdemo/__init__.py"))
    init.write_text("VERSION = 'edited'\n")
    res = w.cli("backup", "edit")
    assert (
        res.returncode == 12
        and "differ from what was installed" in res.stderr
        and "--mode archive" in res.stderr
    )
    assert w.data("backups", "edit") == []
    ok(w.cli("backup", "edit", "--mode", "archive"))


# ---------------------------------------------------------------------------------------------------------------
# Interruptions


def _no_partials(w: World) -> None:
    assert list(w.backups.glob("envs/*/.partial-*")) == []
    assert list(w.backups.glob("store/*/.*.tmp-*")) == []


def test_a_full_disk_fails_cleanly(world):
    w = world
    ok(w.cli("create", w.small("full", "ebdemo==1.0", "ebbig==1.0"), "--no-validate"))
    ok(w.cli("backup", "full", "--mode", "archive"))
    first = w.data("backups", "full")

    def small_files() -> (
        None
    ):  # the kernel's file size limit: writes past 1 MB fail (EFBIG), as on a full disk
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1_000_000, 1_000_000))

    for mode in ("wheelhouse", "archive"):
        proc = w.spawn("backup", "full", "--mode", mode, preexec_fn=small_files)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 15, err  # the disk family: the file system said no
        assert "could not be written" in err and "(EFBIG); earlier backups are intact" in err
        assert w.data("backups", "full") == first
        _no_partials(w)
    ok(w.cli("verify-backup", "full"))


def test_concurrent_backups_of_one_env_are_serialized(world):
    w = world
    ok(w.cli("create", w.small("conc", "ebdemo==1.0", "ebbig==1.0"), "--no-validate"))
    procs = [w.spawn("backup", "conc", "--mode", "archive") for _ in range(2)]
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    listed = w.data("backups", "conc")
    assert len(listed) == 2 and len({b["id"] for b in listed}) == 2
    for b in listed:
        ok(w.cli("verify-backup", b["id"]))


def test_killed_archive_backup_and_restore_leave_the_previous_state_and_no_partial(world):
    """SIGKILL in the middle of an archive backup and of its restore (64 MiB that does not compress, so each
    lasts): the earlier backups and the target are as they were; the next run, which breaks the dead process's
    mutexes (the backup root's and the env's), leaves no partial file."""
    w = world
    ok(w.cli("create", w.small("kb", "ebdemo==1.0"), "--no-validate"))
    ok(w.cli("backup", "kb", "--mode", "archive"))
    before = [b["id"] for b in w.data("backups", "kb")]
    site = next(w.prefix("kb").glob("lib/python*/site-packages"))
    (site / "ebdemo" / "ballast.bin").write_bytes(os.urandom(64 * 2**20))
    proc = w.spawn("backup", "kb", "--mode", "archive")
    kill_at(
        proc,
        lambda: any(p.is_dir() for p in w.backups.glob("envs/kb/.partial-*")),
        "the kill point",
        settle=ORPHANS_SETTLE_S,
    )
    assert [b["id"] for b in w.data("backups", "kb")] == before
    made = w.data("backup", "kb", "--mode", "archive", "--wait", "0")
    _no_partials(w)

    target = w.root / "elsewhere" / "kb"
    partial = lambda: list(target.parent.glob(".kb.*"))  # noqa: E731
    proc = w.spawn("restore", made["id"], "--prefix", str(target), "--name", "kb2", "--no-validate")
    kill_at(
        proc,
        lambda: any((p / "pyvenv.cfg").exists() for p in partial()),
        "the kill point",
        settle=ORPHANS_SETTLE_S,
    )
    assert not target.exists() and partial()
    ok(w.cli("restore", made["id"], "--prefix", str(target), "--name", "kb2", "--no-validate", "--wait", "0"))
    assert partial() == [] and (target / "pyvenv.cfg").is_file()
    assert (
        next(target.glob("lib/python*/site-packages")) / "ebdemo" / "ballast.bin"
    ).stat().st_size == 64 * 2**20


def test_remove_during_a_backup_is_refused_and_nothing_is_lost(world):
    """remove and backup of one env take the same mutex: a remove while the backup holds the env refuses, naming
    the process that holds it, and the env is still there. The backup waits at its test hook with its archive
    written (ENVBUILDER_TEST_PAUSE=backup-written), so the remove runs inside it whatever the machine's speed
    (stopping the backup with SIGSTOP instead left it hung in loaded CI runs); it is then killed, and the next
    backup and remove go through."""
    w = world
    ok(w.cli("create", w.small("busy", "ebdemo==1.0", "ebbig==1.0"), "--no-validate"))
    pause = {"ENVBUILDER_TEST_PAUSE": "backup-written"}
    proc = w.spawn(
        "backup", "busy", "--mode", "archive", extra=pause, start_new_session=True, stdout=subprocess.DEVNULL
    )
    with Paused(proc, "backup-written") as paused:
        try:
            paused.wait(timeout=120)
            res = w.cli("remove", "busy", "--yes")
        finally:  # the backup and what it started (tar, zstd)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    assert res.returncode == 9, res.stderr
    assert f"locked by process {proc.pid}" in res.stderr and "busy.lock" in res.stderr
    assert (w.prefix("busy") / "pyvenv.cfg").is_file() and (w.home / "envs" / "busy.json").is_file()
    # The killed backup's mutexes are broken by the next one, which completes and verifies.
    ok(w.cli("backup", "busy", "--mode", "archive"))
    ok(w.cli("verify-backup", "busy"))
    # Once no backup holds it, remove takes the mutex and removes the env.
    ok(w.cli("remove", "busy", "--yes"))
    assert not w.prefix("busy").exists()


# ---------------------------------------------------------------------------------------------------------------
# Upkeep, policy, permissions


def test_prune_keeps_the_newest_and_frees_unused_wheels(world):
    w = world
    ok(w.cli("create", w.small("pr", "ebdemo==1.0", "ebbig==1.0"), "--no-validate"))
    ok(w.cli("backup", "pr"))
    ok(w.cli("create", w.small("pr", "ebdemo==2.0"), "--no-validate", "--force"))
    ok(w.cli("backup", "pr"))
    assert len(list(w.backups.glob("store/*/[!.]*"))) == 4  # ebdemo 1.0 and 2.0, ebdep, ebbig
    dry = w.data("prune-backups", "--keep", "1", "--dry-run")
    assert len(dry["removed"]) == 1 and dry["blobs_removed"] == 2 and len(w.data("backups", "pr")) == 2
    done = w.data("prune-backups", "--keep", "1")
    assert done["removed"] == dry["removed"] and done["bytes_freed"] > 1_000_000
    assert [b["id"] for b in w.data("backups", "pr")] != dry["removed"]
    kept = sorted(w.backups.glob("store/*/[!.]*"))
    assert len(kept) == 2
    # A removed wheel's remembered digest goes with it; the kept ones keep theirs.
    memos = list(w.backups.glob("store/*/.*.sha256"))
    assert {m.name for m in memos} == {f".{b.name}.sha256" for b in kept}
    subprocess.run(["rm", "-rf", str(w.prefix("pr"))], check=True)
    ok(w.cli("restore", "pr", "--no-validate"))
    assert w.python("pr", "import ebdemo; print(ebdemo.VERSION)") == "2.0"


def test_backup_all_and_listing(world):
    w = world
    for name in ("x1", "x2"):
        ok(w.cli("create", w.small(name, "ebdemo==1.0"), "--no-validate"))
    rows = {r["name"]: r for r in w.data("list")}
    assert rows["x1"]["advice"] == "envbuilder backup x1" and rows["x1"]["backup"] is None
    assert 29 < rows["x1"]["purge"]["days_left"] <= 30
    data = w.data("backup", "--all")
    assert sorted(b["env"] for b in data["backups"]) == ["x1", "x2"] and data["failed"] == {}
    rows = {r["name"]: r for r in w.data("list")}
    assert rows["x1"]["advice"] is None and rows["x1"]["backup"].startswith("x1@")
    one = data["backups"][0]
    by_dir = json.loads(ok(w.cli("backups", "--from", one["path"], "--json")).stdout)["data"]
    assert {b["env"] for b in by_dir} == {"x1", "x2"}
    ok(w.cli("verify-backup", "x1", "--from", one["path"]))
    res = w.cli("restore", "x11")
    assert res.returncode == 12 and "no backup of 'x11'" in res.stderr and "did you mean 'x1'" in res.stderr


def test_purge_days_and_touch_follow_the_site_policy(world):
    w = world
    ok(w.cli("create", w.small("old", "ebdemo==1.0"), "--no-validate"))
    # Its own uv cache: uv hardlinks from the cache, and envs sharing inodes share access times too.
    cache = str(w.root / "uv-cache-2")
    ok(w.cli("create", w.small("ok2", "ebdemo==1.0", touch="true"), "--no-validate", UV_CACHE_DIR=cache))
    eight_days = time.time() - 8 * 86400
    for name in ("old", "ok2"):
        target = next(w.prefix(name).glob("lib/python*/site-packages/ebdemo/__init__.py"))
        os.utime(target, (eight_days, target.stat().st_mtime))
    rows = {r["name"]: r for r in w.data("list")}
    assert 21.5 < rows["old"]["purge"]["days_left"] < 22.5
    assert rows["old"]["purge"]["oldest"].endswith("ebdemo/__init__.py")
    res = w.cli("touch", "old")
    assert res.returncode == 2 and "will not refresh" in res.stderr and "envbuilder backup old" in res.stderr
    ok(w.cli("touch", "ok2"))
    rows = {r["name"]: r for r in w.data("list")}
    assert rows["ok2"]["purge"]["days_left"] > 29.9
    assert rows["old"]["purge"]["days_left"] < 22.5  # refused: nothing was touched


@pytest.mark.parametrize(("env_mode", "file_mode"), [(0o700, 0o600), (0o755, 0o644)])
def test_a_backup_is_no_more_readable_than_its_env(world, env_mode, file_mode):
    w = world
    ok(w.cli("create", w.small("perm", "ebdemo==1.0"), "--no-validate"))
    w.prefix("perm").chmod(env_mode)
    for mode in ("wheelhouse", "archive"):
        made = w.data("backup", "perm", "--mode", mode)
        for f in Path(made["path"]).iterdir():
            assert f.stat().st_mode & 0o777 == file_mode, f
        assert Path(made["path"]).stat().st_mode & 0o007 == (env_mode & 0o005)
    for blob in w.backups.glob("store/*/[!.]*"):
        assert blob.stat().st_mode & 0o777 == file_mode


LMOD_INIT = Path("/usr/share/lmod/lmod/init/bash")


@pytest.mark.skipif(not LMOD_INIT.is_file(), reason="Lmod not installed (.ci/run installs it)")
def test_restore_loads_the_recipes_modules_under_real_lmod(world):
    w = world
    modules = REPO / "tests" / "data" / "modules" / "site"
    text = SMALL_RECIPE.format(name="mods", installer="uv", packages=packages("ebdemo==1.0"), touch="false")
    text = text.replace(
        "[python]",
        f'[modules]\nsystem = "lmod"\nuse = ["{modules}"]\nload = ["gcc/13.2.0"]\n\n'
        '[activate]\nmodules = ["gcc/13.2.0"]\nenv = { OMP_NUM_THREADS = "8" }\n\n[python]',
    )
    (w.recipes / "mods.toml").write_text(text)
    w.env.update(lmod_vars())
    ok(w.cli("create", "mods", "--no-validate"))
    ok(w.cli("backup", "mods"))
    subprocess.run(["rm", "-rf", str(w.prefix("mods"))], check=True)
    data = w.data("restore", "mods", "--no-validate")
    # The restore ran with the recipe's modules loaded (its own delta, recorded), and activate loads them again.
    assert data["env"]["modules"]["delta_set"]["GCC_VERSION"] == "13.2.0"
    script = (
        f"source {LMOD_INIT}; source {w.prefix('mods')}/bin/activate; "
        "echo GCC=$GCC_VERSION OMP=$OMP_NUM_THREADS; python -c 'import ebdemo'; deactivate; "
        "echo AFTER=${GCC_VERSION:-unset}"
    )
    run = ok(bash(script, w.env))
    assert "GCC=13.2.0 OMP=8" in run.stdout and "AFTER=unset" in run.stdout


def test_a_new_backup_replaces_a_corrupt_stored_wheel_from_the_env(world):
    # verify-backup says "back it up again": that backup must not reuse the damaged blob and call itself verified.
    w = world
    ok(w.cli("create", w.small("heal", "ebdemo==1.0", "ebbig==1.0"), "--no-validate"))
    first = w.data("backup", "heal")
    big = next(
        x
        for x in json.loads(Path(first["path"], "backup.json").read_text())["wheels"]
        if x["name"] == "ebbig"
    )
    blob = w.backups / big["path"]
    raw = bytearray(blob.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    blob.write_bytes(bytes(raw))
    res = w.cli("verify-backup", first["id"])
    assert res.returncode == 12 and "back the env up again" in res.stderr, res.stderr
    again = ok(w.cli("backup", "heal", "--json"))
    second = json.loads(again.stdout)["data"]
    assert any("ebbig" in n and "damaged" in n for n in second["notes"]), second["notes"]
    ok(w.cli("verify-backup", second["id"]))
    # Packing is deterministic: the blob written again is the one the first backup recorded, so it verifies too.
    ok(w.cli("verify-backup", first["id"]))
    subprocess.run(["rm", "-rf", str(w.prefix("heal"))], check=True)
    ok(w.cli("restore", "heal", "--no-validate"))
    assert (
        len(
            w.python(
                "heal", "import ebbig, os; print(open(os.path.join(ebbig.__path__[0], 'blob.txt')).read())"
            )
        )
        == 4_000_000
    )


def test_a_stored_wheel_truncated_or_missing_is_written_again(world):
    w = world
    ok(w.cli("create", w.small("trunc", "ebdemo==1.0"), "--no-validate"))
    first = w.data("backup", "trunc")
    blobs = sorted(w.backups.glob("store/*/[!.]*"))
    blobs[0].write_bytes(blobs[0].read_bytes()[:10])
    blobs[1].unlink()
    second = w.data("backup", "trunc")
    ok(w.cli("verify-backup", second["id"]))
    ok(w.cli("verify-backup", first["id"]))


def test_restore_force_removes_the_old_env_after_the_swap_and_a_killed_removal_is_swept(world):
    """As create --force (issue 36): the env that a restore --force replaces is removed after the new one is in
    place, while the command goes on; a removal killed mid-way leaves an aside that the next run sweeps."""
    from envbuilder.system import transaction

    w = world
    ok(w.cli("create", w.small("rf", "ebdemo==1.0"), "--no-validate"))
    ok(w.cli("backup", "rf"))
    prefix = w.prefix("rf")
    (prefix / "marker").write_text("old env")
    proc = w.spawn(
        "restore",
        "rf",
        "--force",
        "--no-validate",
        extra={transaction.PAUSE_VAR: "removing-old"},
        stdout=subprocess.DEVNULL,
    )
    with Paused(proc, "removing-old") as paused:
        paused.wait(timeout=120)
        # In place and recorded (its pending marker gone), the old env aside, its removal under way.
        assert (prefix / "bin" / "python").exists() and not (prefix / transaction.PENDING).exists()
        (aside,) = prefix.parent.glob(".rf.old-*")
        assert (aside / "marker").read_text() == "old env" and not (prefix / "marker").exists()
        err = paused.stop(signal.SIGKILL)
    assert f"{transaction.PAUSE_VAR}: paused removing-old" in err
    again = w.data("restore", "rf", "--force", "--no-validate")
    assert any(f"removed {aside.name}, the env a finished --force replaced" in n for n in again["notes"])
    assert not list(prefix.parent.glob(".rf.*"))


def test_uv_writes_the_bytecode_of_a_restore_as_of_a_create_where_told(world):
    """A restore by uv follows create's rule for bytecode at install (ENVBUILDER_COMPILE_BYTECODE decides here,
    where 8 CPUs would): every module of the restored packages compiled, the build log saying why; the digests
    still equal the backup's (bytecode is not part of a package's digest)."""
    w = world
    made = w.data("create", w.small("pyc", "ebdemo==1.0"), "--no-validate")
    # A create that imports nothing after its install leaves the bytecode to the first import, as raw uv does.
    said = "bytecode at install: no (nothing imports the env in this command; its first import writes it)"
    assert said in Path(made["log"]).read_text()
    ok(w.cli("backup", "pyc"))
    new = w.root / "again" / "pyc"
    data = w.data("restore", "pyc", "--prefix", str(new), "--name", "pyc2", ENVBUILDER_COMPILE_BYTECODE="1")
    site = next(new.glob("lib/python3*/site-packages"))
    assert list((site / "ebdemo" / "__pycache__").glob("__init__.*.pyc"))  # nothing imported it
    assert "bytecode at install: yes (ENVBUILDER_COMPILE_BYTECODE=1)" in Path(data["log"]).read_text()
