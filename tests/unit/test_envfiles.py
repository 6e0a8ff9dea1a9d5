"""The record's sample of an env's least recently read files (envfiles): the purge estimate made from it is the
walk's while the least recently read file is sampled, and never later than the walk's otherwise."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from envbuilder.system import envfiles, envwalk, progress, purge, state

HOUR = 3600.0


def _env(prefix: Path, n: int, now: float) -> list[Path]:
    """``n`` files, the i-th last read i+1 days ago (so the last one is the least recently read)."""
    files = []
    for i in range(n):
        path = prefix / f"d{i % 5}" / f"f{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
        os.utime(path, (now - (i + 1) * 86400, now))
        files.append(path)
    return files


def _record(prefix: Path, files: dict) -> state.EnvRecord:
    fs = {"name": "scratch", "purge_days": 60}
    return state.EnvRecord(
        "e", "e", "d", str(prefix), "now", plan={"kind": "user-prefix", "filesystem": fs}, files=files
    )


def test_the_sampled_purge_estimate_matches_the_walk_or_is_earlier(tmp_path):
    now = time.time()
    files = _env(tmp_path, envfiles.SAMPLE + 8, now)
    measured = envwalk.measure(tmp_path, purged=True)
    assert len(measured["oldest"]) == envfiles.SAMPLE
    sampled = _record(tmp_path, measured)
    walked = _record(tmp_path, {})  # a record without measured files: the walk

    def days(rec: state.EnvRecord) -> float:
        status = purge.status(rec, now=now)
        assert status is not None and status.days_left is not None
        return status.days_left

    assert days(sampled) == pytest.approx(days(walked)) == pytest.approx(60 - len(files))
    # The sampled files are read: the least recently read file is now the first outside the sample.
    for path in files[-envfiles.SAMPLE :]:
        os.utime(path, (now, now))
    assert days(sampled) == pytest.approx(days(walked))
    # That one is read too: the estimate stays at its old time (earlier than the walk's, the safe side).
    os.utime(files[-envfiles.SAMPLE - 1], (now, now))
    assert days(sampled) < days(walked) - 0.9


def test_a_sampled_file_gone_is_damage(tmp_path):
    now = time.time()
    files = _env(tmp_path, 30, now)
    rec = _record(tmp_path, envwalk.measure(tmp_path, purged=True))
    assert state.health(rec).status == "ok"
    files[-1].unlink()  # the least recently read file: what the purge takes first
    health = state.health(rec)
    assert health.status == "damaged" and health.missing == (str(files[-1].relative_to(tmp_path)),)


def _python_walk(root: Path) -> tuple[int, int, list[tuple[float, str]]]:
    """What a plain lstat of every entry gives: blocks in bytes, inodes with the root, and the atimes of what is
    neither a directory nor a symlink."""
    size, count, times = 0, 1, []
    for top, dirs, names in os.walk(root):
        for name in dirs + names:
            path = Path(top, name)
            st = path.lstat()
            size += st.st_blocks * 512
            count += 1
            if not path.is_symlink() and not path.is_dir():
                times.append((st.st_atime, str(path.relative_to(root))))
    return size, count, sorted(times)


def test_the_walk_measures_what_lstat_sees_and_finds_what_anyone_may_write(tmp_path):
    """One find walks the env for its record and for the world-write sweep: its figures are those of an lstat of
    every entry, a name that is not UTF-8 included; symlinks are counted but neither sampled nor swept."""
    now = time.time()
    files = _env(tmp_path, envfiles.SAMPLE + 4, now)
    (tmp_path / "lib").mkdir()
    odd = Path(os.fsdecode(bytes(tmp_path) + b"/lib/caf\xe9.py"))
    odd.write_bytes(b"x" * 5000)
    os.utime(odd, (now - 100 * 86400, now))  # the least recently read
    (tmp_path / "open").mkdir(mode=0o777)
    (tmp_path / "open").chmod(0o777)
    (tmp_path / "open" / "lock").write_text("")
    (tmp_path / "open" / "lock").chmod(0o666)
    (tmp_path / "link").symlink_to(files[0])
    os.link(odd, tmp_path / "lib" / "hard.py")  # one file, two names
    size, count, times = _python_walk(tmp_path)
    measured = envwalk.measure(tmp_path, purged=True)
    assert (measured["bytes"], measured["count"]) == (size, count)
    assert measured["oldest"][0] == [os.path.relpath(odd, tmp_path), times[0][0]]
    assert [rel for rel, _ in measured["oldest"]] == [rel for _, rel in times[: envfiles.SAMPLE]]
    assert measured["next"] == times[envfiles.SAMPLE][0]
    tmp_path.chmod(0o777)
    with envwalk.walking(tmp_path, sizes=True) as held:
        pass
    assert sorted(held.walk.writable) == ["", "open", "open/lock"]  # "": the prefix itself
    assert held.walk.size == progress.sum_sizes([tmp_path]) >= 5000  # what a restore's progress line shows
