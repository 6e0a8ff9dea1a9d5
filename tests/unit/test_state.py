"""Env records (versioned, atomic, never world-writable) and the mutex that works without flock, with real
processes contending for it."""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import subprocess
import sys
import time

import pytest

from envbuilder.core import settings
from envbuilder.core.errors import StateError
from envbuilder.plan.activation import Activation
from envbuilder.system import fsutil, state


def record(name="vista-venv-cu124", **kw):
    base = {
        "name": name,
        "recipe": name,
        "recipe_digest": "sha256:ab",
        "prefix": "/s/e",
        "created": "2026-11-22T12:00:00Z",
    }
    return state.EnvRecord(**{**base, **kw})


def test_home_prefers_envbuilder_home_then_work_then_the_xdg_data_home(tmp_path):
    assert settings.home({"ENVBUILDER_HOME": "/a", "WORK": "/w", "HOME": "/h"}) == state.Path("/a")
    assert settings.home({"WORK": "/w", "HOME": "/h"}) == state.Path("/w/.envbuilder")
    assert settings.home({"HOME": "/h"}) == state.Path("/h/.local/share/envbuilder")
    assert settings.home({"HOME": "/h", "XDG_DATA_HOME": "/d"}) == state.Path("/d/envbuilder")
    # The XDG spec ignores a relative base directory.
    assert settings.home({"HOME": "/h", "XDG_DATA_HOME": "d"}) == state.Path("/h/.local/share/envbuilder")


def test_record_round_trip(tmp_path):
    rec = record(packages=({"name": "torch", "version": "2.13.0", "sha256": "00"},), tools={"uv": "0.13.9"})
    path = state.save(tmp_path, rec)
    assert state.load(tmp_path, rec.name) == rec
    assert json.loads(path.read_text())["version"] == state.RECORD_VERSION
    assert state.names(tmp_path) == ["vista-venv-cu124"]


def test_a_saved_record_gives_back_the_activation_its_plan_recorded(tmp_path):
    """The record keeps its plan as JSON; the planner reads the activation back out of it (None where the plan
    recorded none, as in records older than activation)."""
    act = Activation(modules=("gcc/13.2.0",), env={"OMP_NUM_THREADS": "8"}, prepend={"PATH": ("/opt/x bin",)})
    state.save(tmp_path, record(plan={"kind": "venv", "activate": act.to_json()}))
    state.save(tmp_path, record("old", plan={"kind": "venv"}))
    assert Activation.of_record(state.load(tmp_path, "vista-venv-cu124").plan) == act
    assert Activation.of_record(state.load(tmp_path, "old").plan) is None


def test_nothing_is_world_writable_even_with_umask_0(tmp_path):
    old = os.umask(0)
    try:
        path = state.save(tmp_path / "h" / "deeper", record())
    finally:
        os.umask(old)
    for p in (path, path.parent, path.parent.parent, path.parent.parent.parent):
        assert not p.stat().st_mode & 0o002, p


def test_an_interrupted_write_leaves_the_old_record(tmp_path):
    state.save(tmp_path, record(prefix="/old"))
    envs = tmp_path / "envs"
    # What a SIGKILL during write_atomic leaves behind: a temp file beside the record.
    (envs / ".vista-venv-cu124.json.tmp-123-456").write_text('{"version": 1, "na')
    assert state.load(tmp_path, "vista-venv-cu124").prefix == "/old"
    assert state.names(tmp_path) == ["vista-venv-cu124"]


def test_killed_writer_never_exposes_a_partial_record(tmp_path):
    # A real process writing a large record is killed at once; the reader sees the old record or the new one.
    state.save(tmp_path, record(prefix="/old"))
    code = (
        "import sys; from envbuilder.system import state;"
        "r = state.EnvRecord('vista-venv-cu124','r','d','/new','t', plan={'x': 'y' * 50_000_000});"
        "state.save(__import__('pathlib').Path(sys.argv[1]), r)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)])
    time.sleep(0.3)
    proc.kill()
    proc.wait()
    assert state.load(tmp_path, "vista-venv-cu124").prefix in ("/old", "/new")


def test_unknown_record_version_and_corrupt_record(tmp_path):
    path = state.record_path(tmp_path, "x")
    path.parent.mkdir(parents=True)
    path.write_text('{"version": 7, "name": "x"}')
    with pytest.raises(StateError, match="format version 7") as info:
        state.load(tmp_path, "x")
    assert info.value.hint == "upgrade envbuilder"
    path.write_text("{")
    with pytest.raises(StateError, match="unreadable"):
        state.load(tmp_path, "x")
    with pytest.raises(StateError, match="no env named 'y'"):
        state.load(tmp_path, "y")


def test_recorded_prefixes_read_each_record_as_load_does_and_leave_out_what_it_would_refuse(tmp_path):
    state.save(tmp_path, record("a", prefix="/s/a"))
    state.save(tmp_path, record("b", prefix="/s/b"))
    envs = state.record_path(tmp_path, "x").parent
    (envs / "corrupt.json").write_text("{")
    (envs / "future.json").write_text('{"version": 99, "prefix": "/s/f"}')
    (envs / "noprefix.json").write_text(json.dumps({"version": state.RECORD_VERSION, "name": "noprefix"}))
    assert state.recorded_prefixes(tmp_path) == {"a": "/s/a", "b": "/s/b"}
    assert {n: state.load(tmp_path, n).prefix for n in ("a", "b")} == state.recorded_prefixes(tmp_path)
    envs.chmod(0o777)  # a home others can write: its records are not read
    try:
        with pytest.raises(StateError, match="envs/"):
            state.load(tmp_path, "a")
        assert state.recorded_prefixes(tmp_path) == {}
    finally:
        envs.chmod(0o755)


@pytest.mark.parametrize("bad", ["", "../etc", "a/b", ".hidden"])
def test_env_names_cannot_escape_the_directory(tmp_path, bad):
    with pytest.raises(StateError):
        state.record_path(tmp_path, bad)


# --- the mutex ------------------------------------------------------------------------------------------------


def _contend(root: str, n: int) -> None:
    counter = state.Path(root) / "counter"
    with state.mutex(state.Path(root), "env", timeout=60):
        value = int(counter.read_text()) if counter.exists() else 0
        time.sleep(0.05)  # widen the race a lost update would need
        counter.write_text(str(value + 1))


@pytest.mark.integration  # a stress test: 4 processes contend
def test_concurrent_processes_are_serialized(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_contend, args=(str(tmp_path), i)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    assert (tmp_path / "counter").read_text() == "4"
    assert not (tmp_path / "locks" / "env.lock").exists()


def test_held_mutex_times_out_naming_the_holder(tmp_path):
    waited = []
    with state.mutex(tmp_path, "env"):
        code = (
            "import sys, pathlib; from envbuilder.system import state\n"
            "try:\n"
            "    with state.mutex(pathlib.Path(sys.argv[1]), 'env', timeout=0.5): pass\n"
            "except Exception as e:\n"
            "    print(type(e).__name__, e.message); sys.exit(9)\n"
        )
        res = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True)
        assert res.returncode == 9
        assert f"locked by process {os.getpid()} on {socket.gethostname()}" in res.stdout
        with pytest.raises(StateError), state.mutex(tmp_path, "env", timeout=0.3, on_wait=waited.append):
            pass
    assert waited and waited[0].pid == os.getpid()


def test_mutex_of_a_dead_process_on_this_host_is_broken(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    mutex_dir = tmp_path / "locks" / "env.lock"
    mutex_dir.mkdir(parents=True)
    (mutex_dir / "owner.json").write_text(
        json.dumps({"pid": dead.pid, "host": socket.gethostname(), "since": time.time()})
    )
    with state.mutex(tmp_path, "env") as mutex:
        assert mutex.owner.pid == os.getpid()


def test_mutex_from_another_host_is_respected_until_old(tmp_path):
    mutex_dir = tmp_path / "locks" / "env.lock"
    mutex_dir.mkdir(parents=True)
    owner = mutex_dir / "owner.json"
    owner.write_text(json.dumps({"pid": 1, "host": "other-node", "since": time.time()}))
    with pytest.raises(StateError, match="other-node"), state.mutex(tmp_path, "env"):
        pass
    owner.write_text(
        json.dumps({"pid": 1, "host": "other-node", "since": time.time() - fsutil.STALE_AFTER_S - 1})
    )
    with state.mutex(tmp_path, "env"):
        pass


def test_release_does_not_remove_someone_elses_mutex(tmp_path):
    mutex = fsutil.Mutex(tmp_path / "x.lock")
    mutex.acquire()
    (tmp_path / "x.lock" / "owner.json").write_text(
        json.dumps({"pid": 1, "host": "elsewhere", "since": time.time()})
    )
    mutex.release()
    assert (tmp_path / "x.lock").exists()


# --- breaking a stale mutex, raced by real processes ----------------------------------------------------------

RACERS = 6
TRIALS = 30


def _break_racer(root: str, barrier, trials: int) -> None:
    """One contender: at each trial, all racers find the same stale mutex at the same moment."""
    base = state.Path(root)
    log = base / f"held-{os.getpid()}.txt"
    for trial in range(trials):
        barrier.wait(60)  # the stale mutex of this trial is in place
        mutex = fsutil.Mutex(base / f"t{trial}" / "env.lock", timeout=60, poll=0.005)
        try:
            mutex.acquire()
            start = time.monotonic()
            time.sleep(0.01)
            end = time.monotonic()
            mutex.release()
            line = f"{trial} {start} {end}\n"
        except Exception as exc:  # a racer that crashed is a failure too: say how, and stay in step
            line = f"{trial} error {type(exc).__name__}: {exc}\n"
        with log.open("a") as fh:
            fh.write(line)
        barrier.wait(60)  # every racer is through before the next trial


def _dead_pid() -> int:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    return dead.pid


def _stale_mutex(path, pid: int) -> None:
    path.mkdir(parents=True)
    (path / "owner.json").write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "since": 1.0}))


@pytest.mark.integration  # a stress test: 6 processes race, 30 rounds
def test_racing_breakers_of_a_stale_mutex_never_both_hold_it(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(RACERS + 1)
    procs = [ctx.Process(target=_break_racer, args=(str(tmp_path), barrier, TRIALS)) for _ in range(RACERS)]
    for p in procs:
        p.start()
    dead = _dead_pid()
    try:
        for trial in range(TRIALS):
            _stale_mutex(tmp_path / f"t{trial}" / "env.lock", dead)
            barrier.wait(60)
            barrier.wait(60)
    finally:
        for p in procs:
            p.join(60)
            if p.exitcode is None:
                p.kill()
    assert [p.exitcode for p in procs] == [0] * RACERS
    held: dict[int, list[tuple[float, float]]] = {}
    errors = []
    for log in tmp_path.glob("held-*.txt"):
        for line in log.read_text().splitlines():
            trial, start, end = line.split(" ", 2)
            if start == "error":
                errors.append(line)
                continue
            held.setdefault(int(trial), []).append((float(start), float(end)))
    overlaps = []
    for trial, spans in sorted(held.items()):
        spans.sort()
        overlaps += [trial for a, b in zip(spans, spans[1:]) if b[0] < a[1]]
    # Two holders at once (overlapping spans), or a racer that crashed because another broke its fresh mutex.
    assert (overlaps, errors) == ([], [])
    assert sum(len(s) for s in held.values()) == RACERS * TRIALS
    # Nothing is left beside the mutexes: no broken one, no temp directory.
    assert sorted(p.name for p in tmp_path.glob("t*/*")) == []


def test_a_breaker_that_died_mid_way_is_taken_over(tmp_path):
    mutex_dir = tmp_path / "locks" / "env.lock"
    dead = _dead_pid()
    _stale_mutex(mutex_dir, dead)
    (mutex_dir / "breaker-0").symlink_to(json.dumps([dead, socket.gethostname(), time.time()]))
    with state.mutex(tmp_path, "env", timeout=5) as mutex:
        assert mutex.owner.pid == os.getpid()
    assert list((tmp_path / "locks").iterdir()) == []


def test_a_live_breaker_is_left_to_finish(tmp_path, monkeypatch):
    # The grace a breaker at work gets, shortened from 5 s for the test: still longer than the timeout asked for.
    monkeypatch.setattr(fsutil, "BREAK_GRACE_S", 1.0)
    mutex_dir = tmp_path / "locks" / "env.lock"
    _stale_mutex(mutex_dir, _dead_pid())
    (mutex_dir / "breaker-0").symlink_to(json.dumps([os.getpid(), socket.gethostname(), time.time()]))
    start = time.monotonic()
    with pytest.raises(StateError, match="locked by"), state.mutex(tmp_path, "env", timeout=0.3):
        pass
    assert time.monotonic() - start >= 1.0  # the breaker got its grace, past the timeout
    assert (mutex_dir / "breaker-0").is_symlink()


def test_a_late_breaker_never_takes_the_mutex_that_replaced_the_stale_one(tmp_path):
    # The breaker judged generation 0 stale; before it acts, generation 0 is broken and a live mutex is taken.
    path = tmp_path / "env.lock"
    _stale_mutex(path, _dead_pid())
    late = fsutil.Mutex(path)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        first = fsutil.Mutex(path, timeout=5)
        first.acquire()  # breaks generation 0 and holds generation 1
        assert late._break(fd) is True  # "try again": it did nothing else
    finally:
        os.close(fd)
    assert json.loads((path / "owner.json").read_text())["pid"] == os.getpid()
    with pytest.raises(StateError, match="locked by"):
        fsutil.Mutex(path, timeout=0.2).acquire()
    first.release()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_mutex_without_owner_file_is_stale_only_when_old(tmp_path):
    path = tmp_path / "env.lock"
    path.mkdir()  # an older envbuilder between its mkdir and its owner file
    with pytest.raises(StateError, match="another process"):
        fsutil.Mutex(path, timeout=0.2).acquire()
    old = time.time() - 60
    os.utime(path, (old, old))
    with fsutil.Mutex(path, timeout=1) as mutex:
        assert mutex.owner.pid == os.getpid()


def test_leftovers_of_a_killed_taker_are_swept(tmp_path):
    dead = _dead_pid()
    host = socket.gethostname()
    for what in ("new", "broken"):
        (tmp_path / f".env.lock.{what}-{host}-{dead}-123").mkdir()
    live = tmp_path / f".env.lock.new-{host}-{os.getpid()}-456"
    live.mkdir()  # this process is alive: not swept
    with fsutil.Mutex(tmp_path / "env.lock"):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == [live.name]
