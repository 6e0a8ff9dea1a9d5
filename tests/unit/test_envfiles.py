"""The record's sample of an env's least recently read files (envfiles): the purge estimate made from it is the
walk's while the least recently read file is sampled, and never later than the walk's otherwise."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from envbuilder.system import envfiles, purge, state

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
    measured = envfiles.measure(tmp_path, purged=True)
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
    rec = _record(tmp_path, envfiles.measure(tmp_path, purged=True))
    assert state.health(rec).status == "ok"
    files[-1].unlink()  # the least recently read file: what the purge takes first
    health = state.health(rec)
    assert health.status == "damaged" and health.missing == (str(files[-1].relative_to(tmp_path)),)
