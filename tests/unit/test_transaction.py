"""The one transaction: build beside, swap in, recover after a crash. Crashes are real SIGKILLs of a child process at
each point of a swap; what they leave is then recovered as the next run would."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from envbuilder.core.errors import StateError
from envbuilder.system import proc, state, transaction


def _tree(root: Path, tag: str) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (root / "bin" / "tag").write_text(tag)
    return root


def _tag(final: Path) -> str:
    return (final / "bin" / "tag").read_text()


def _beside(final: Path) -> list[str]:
    return sorted(p.name for p in final.parent.iterdir() if p.name != final.name)


# A child that swaps a new tree in at argv[1] and SIGKILLs itself at the point argv[2] names: building (before the
# swap), aside (the old tree moved aside, the new one not yet renamed), swapped (renamed, the old one not yet
# removed), pending (in place with its marker, before what follows is done).
CHILD = textwrap.dedent(
    """
    import os, pathlib, signal, sys
    from envbuilder.system import removal, transaction

    final, point = pathlib.Path(sys.argv[1]), sys.argv[2]
    die = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
    if point == "aside":  # the partial's rename onto the final path, not the marker's own
        replace = pathlib.Path.replace
        pathlib.Path.replace = lambda p, t: die() if ".partial-" in p.name else replace(p, t)
    if point == "swapped":
        removal.remove_tree = die
    with transaction.Transaction(final) as tx:
        (tx.partial / "bin").mkdir(parents=True)
        (tx.partial / "pyvenv.cfg").write_text("home = /usr/bin\\n")
        (tx.partial / "bin" / "tag").write_text("new")
        if point == "building":
            die()
        tx.swap({"what": "the record"})
    tx.finish({}, lambda: die() if point == "pending" else [])
    """
)


def _killed_at(final: Path, point: str) -> None:
    res = subprocess.run([sys.executable, "-c", CHILD, str(final), point], capture_output=True, text=True)
    assert res.returncode == -signal.SIGKILL, res.stderr


@pytest.mark.parametrize(
    ("point", "after"),
    [("building", "old"), ("aside", "old"), ("swapped", "new"), ("pending", "new")],
)
def test_a_swap_killed_at_each_point_is_recovered(tmp_path, point, after):
    final = _tree(tmp_path / "env", "old")
    _killed_at(final, point)
    assert _beside(final) or (final / transaction.PENDING).exists(), "the kill left nothing to recover"
    transaction.recover(final)
    assert _tag(final) == after
    assert _beside(final) == []
    marker = final / transaction.PENDING
    assert marker.exists() == (after == "new")  # written before the rename
    if after == "new":  # the next run finishes what the marker says, then drops it
        assert json.loads(marker.read_text()) == {"what": "the record"}
        assert transaction.settle(final, lambda: ["done"]) == ["done"]
        assert not (final / "envbuilder").exists()


def test_a_first_build_killed_leaves_only_its_partial(tmp_path):
    final = tmp_path / "deeper" / "env"
    _killed_at(final, "building")
    [left] = _beside(final)
    assert left.startswith(".env.partial-")
    assert transaction.recover(final) == [f"removed {left}, left by an interrupted create"]
    assert not final.exists() and _beside(final) == []


def test_recover_brings_the_old_tree_back_when_the_new_one_never_arrived(tmp_path):
    final = tmp_path / "env"
    _tree(tmp_path / ".env.old-123", "old")
    _tree(tmp_path / ".env.partial-123", "new")
    (tmp_path / ".env.removing-9").mkdir()
    notes = transaction.recover(final)
    assert _tag(final) == "old" and _beside(final) == []
    assert len(notes) == 3 and any("restored the previous env" in n for n in notes)


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_a_failure_removes_the_partial_and_keeps_the_old_tree(tmp_path, error):
    final = _tree(tmp_path / "env", "old")
    with pytest.raises(error), transaction.Transaction(final) as tx:
        _tree(tx.partial, "new")
        raise error
    assert _tag(final) == "old" and _beside(final) == []


class _DropsCtrlC:
    """Sends this process a real SIGINT from ``__del__``: the handler's KeyboardInterrupt is raised inside it,
    where Python prints "Exception ignored" and drops it, as it does in a weakref callback (CI saw that one)."""

    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # the handler runs at the next bytecode of this thread
            pass


def test_a_ctrl_c_python_dropped_still_stops_the_swap(tmp_path, monkeypatch):
    dropped: list[
        type[BaseException]
    ] = []  # what Python reports as "Exception ignored", here instead of stderr
    monkeypatch.setattr(sys, "unraisablehook", lambda info: dropped.append(info.exc_type))
    final = _tree(tmp_path / "env", "old")
    with proc.sigterm_as_interrupt(), pytest.raises(KeyboardInterrupt), transaction.Transaction(final) as tx:
        _tree(tx.partial, "new")
        _DropsCtrlC()  # made and dropped at once: its __del__ runs here
        assert dropped == [KeyboardInterrupt]  # dropped, and the build went on
        tx.swap()
    assert _tag(final) == "old" and _beside(final) == []
    # A block entered inside another (a validation inside a create) forgets nothing the outer one remembered.
    with proc.sigterm_as_interrupt():
        _DropsCtrlC()
        with proc.sigterm_as_interrupt():
            pass
        with pytest.raises(KeyboardInterrupt):
            proc.raise_dropped_interrupt()
    # Outside the command's block, and with no interrupt since, swaps go through.
    with transaction.Transaction(final) as tx:
        _tree(tx.partial, "new")
        tx.swap()
    assert _tag(final) == "new"


def test_a_failure_between_the_renames_puts_the_old_tree_back(tmp_path, monkeypatch):
    final = _tree(tmp_path / "env", "old")
    tx = transaction.Transaction(final)
    with pytest.raises(OSError), tx:
        _tree(tx.partial, "new")
        monkeypatch.setattr(Path, "replace", _refuse)
        tx.swap()
    monkeypatch.undo()
    assert _tag(final) == "old" and _beside(final) == []


def _refuse(self: Path, target: Path) -> None:
    raise OSError("no")


def test_a_swap_replaces_a_tree_and_a_file_whole(tmp_path):
    final = _tree(tmp_path / "env", "old")
    with transaction.Transaction(final) as tx:
        _tree(tx.partial, "new")
        tx.swap()
    assert _tag(final) == "new" and _beside(final) == []
    single = tmp_path / "one" / "file.toml"
    for text in ("first", "second"):
        with transaction.Transaction(single) as tx:
            tx.partial.write_text(text)
            tx.swap()
    assert single.read_text() == "second" and _beside(single) == []


def test_discard_never_leaves_half_a_tree_under_its_name(tmp_path):
    final = _tree(tmp_path / "env", "old")
    transaction.discard(final)
    assert list(tmp_path.iterdir()) == []
    aside = tmp_path / ".partial-pruned-x"
    transaction.discard(_tree(final, "old"), aside)
    assert list(tmp_path.iterdir()) == []


def test_nothing_a_transaction_makes_is_world_writable(tmp_path):
    old = os.umask(0)
    try:
        final = tmp_path / "a" / "b" / "env"
        with transaction.Transaction(final, mode=0o750) as tx:
            assert stat.S_IMODE(tx.partial.stat().st_mode) == 0o750
            tx.swap({"what": "the record"})
        single = tmp_path / "c" / "file"
        with transaction.Transaction(single) as tx:
            tx.partial.write_text("x")
            tx.partial.chmod(0o444)
            tx.swap()
    finally:
        os.umask(old)
    writable = [str(p) for p in tmp_path.rglob("*") if p.lstat().st_mode & stat.S_IWOTH]
    assert writable == []


# ---------------------------------------------------------------------------------------------------------------
# Envs: the pending record, heal, claim


def _record(name: str, prefix: Path) -> state.EnvRecord:
    return state.EnvRecord(name=name, recipe=name, recipe_digest="x", prefix=str(prefix), created="now")


def _swapped_unrecorded(home: Path, final: Path, name: str = "demo") -> transaction.Pending:
    """An env put in place with its pending record, by a run killed before writing it."""
    pending = transaction.Pending("create", "created", _record(name, final))
    with transaction.Transaction(final) as tx:
        _tree(tx.partial, "new")
        tx.swap(pending.to_json())
    return pending


def test_heal_writes_the_record_a_killed_run_left_pending(tmp_path):
    home, final = tmp_path / "home", tmp_path / "env"
    _swapped_unrecorded(home, final)
    assert state.names(home) == []
    healed, notes = transaction.heal(home, "demo", final)
    assert healed is not None and healed.status == "created"
    assert state.load(home, "demo").prefix == str(final)
    assert "an interrupted create had put it in place" in notes[0]
    assert not (final / "envbuilder").exists()
    assert transaction.heal(home, "demo", final) == (None, [])


def test_heal_never_takes_over_another_names_env(tmp_path):
    home, final = tmp_path / "home", tmp_path / "env"
    _swapped_unrecorded(home, final, name="other")
    with pytest.raises(StateError, match="interrupted envbuilder put in place"):
        transaction.heal(home, "demo", final)
    (final / transaction.PENDING).write_text("{")
    with pytest.raises(StateError, match="is unreadable"):
        transaction.heal(home, "demo", final)


def _moved(home: Path, new: Path, moving: Path) -> list[str]:
    """demo's new env built and swapped in at ``new``, its move from ``moving`` finished: the notes."""
    pending = transaction.Pending("create", "moved", _record("demo", new), str(moving))
    with transaction.Transaction(new) as tx:
        _tree(tx.partial, "new")
        tx.swap(pending.to_json())
    return tx.finish({}, lambda: pending.complete(home, new))


def test_a_move_removes_the_old_env_once_the_new_one_is_recorded(tmp_path):
    home, old, new = tmp_path / "home", _tree(tmp_path / "old", "old"), tmp_path / "new"
    state.save(home, _record("demo", old))
    with pytest.raises(StateError, match="already has an env at"):
        transaction.claim(home, "demo", new, force=False)
    moving = transaction.claim(home, "demo", new, force=True)
    assert moving == old
    notes = _moved(home, new, moving)
    assert notes == [f"moved demo from {old} to {new}; removed the env at {old}"]
    assert not old.exists() and list(tmp_path.glob(".old.*")) == []
    assert state.load(home, "demo").prefix == str(new)
    with pytest.raises(StateError, match="is where the env 'demo' is recorded"):
        transaction.claim(home, "other", new, force=True)


def test_a_move_leaves_the_old_place_alone_once_another_env_is_recorded_there(tmp_path):
    """Between a move's claim and its end, another name's env took the old place (`create other --prefix OLD
    --force` of someone else's session): the move removes nothing there, and says why."""
    home, old, new = tmp_path / "home", _tree(tmp_path / "old", "old"), tmp_path / "new"
    state.save(home, _record("demo", old))
    moving = transaction.claim(home, "demo", new, force=True)
    state.save(home, _record("other", old))  # the old place is the other env's now
    notes = _moved(home, new, moving)
    assert notes == [f"left {old} alone: it is the env other now"]
    assert _tag(old) == "old"
