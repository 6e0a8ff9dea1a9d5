"""Build beside, swap in, recover after a crash: how envbuilder puts a whole directory (an env, a backup) or a
published file in place. One file written in one go is ``fsutil.write_atomic``.

A :class:`Transaction` gives a partial path beside the final one, ``.NAME.partial-PID``, and the caller builds
there, holding the mutex that guards ``NAME``. ``swap`` puts it in place with one rename; an existing directory
(which a rename cannot replace) is moved aside to ``.NAME.old-PID`` first and removed once the new one is in
place. Any failure or interrupt before the swap removes the partial and puts an old directory back.

What must still happen once a directory is in place (an env's record) is written inside it before the swap, as a
*pending marker*; ``finish`` does it and removes the marker. A run killed between the two leaves a complete
directory with its marker, and the next run finishes it (``settle``, through ``heal`` for envs). ``recover``
undoes what a killed run left beside ``NAME``: partials are removed, an old directory comes back if the new one
never arrived and is removed if it did, and one being discarded (``.NAME.removing-PID``) is removed.

The second half applies this to envs: their pending marker (the record, and the env a move replaces), ``heal``,
and ``claim`` (one env per name, one name per env).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Callable, Optional

from envbuilder.core.errors import StateError
from envbuilder.core.structs import dataclass
from envbuilder.system import fsutil, proc, removal, state

PARTIAL = ".partial-"
OLD = ".old-"
REMOVING = ".removing-"
#: Written inside a directory before its swap, removed once what follows the swap is done: "this is complete, and
#: what follows its swap (an env's record) may not have happened yet".
PENDING = "envbuilder/pending.json"
#: Test hook, read in one place (``pause``): ``after-rename`` stops a transaction for an hour right after its
#: swap and before what follows it (create's, restore's and pack's record), ``pack-recorded`` a pack between
#: its record and its rename, ``removing-old`` the removal of the directory a swap replaced (``Later``), so
#: tests can kill them in that window.
PAUSE_VAR = "ENVBUILDER_TEST_PAUSE"


def _beside(final: Path, what: str) -> Path:
    """``.NAME<what>PID`` beside ``final``: this process's partial, old or doomed copy of it."""
    return final.parent / f".{final.name}{what}{os.getpid()}"


def partial_of(final: Path) -> Path:
    """Where this process builds ``final`` (what a progress watcher measures)."""
    return _beside(final, PARTIAL)


def _siblings(final: Path, what: str) -> list[Path]:
    if not final.parent.is_dir():
        return []
    return sorted(final.parent.glob(f".{glob.escape(final.name)}{what}*"))


def delete(path: Path) -> None:
    """Remove what a transaction left: a directory tree, or a file (a symlink itself, never what it points to)."""
    removal.remove_tree(path, ignore_errors=True)


def discard(path: Path, aside: Optional[Path] = None, ignore_errors: bool = False) -> None:
    """Remove the directory ``path``: out of the way in one rename (to ``aside``, by default ``.NAME.removing-PID``),
    then deleted, so an interrupt never leaves half of it under its own name; ``recover`` removes the rest. A
    symlink at ``path`` is refused (UnsafePath): the caller meant a directory, never what a link points to."""
    removal.refuse_link(path)
    doomed = aside or _beside(path, REMOVING)
    path.rename(doomed)
    removal.remove_tree(doomed, ignore_errors=ignore_errors)


def recover(final: Path) -> list[str]:
    """Undo what an interrupted transaction left beside ``final`` (call with its mutex held): partial builds are
    removed; an old directory moved aside comes back if the new one never arrived, and is removed if it did."""
    notes = []
    for partial in _siblings(final, PARTIAL):
        delete(partial)
        notes.append(f"removed {partial.name}, left by an interrupted create")
    for doomed in _siblings(final, REMOVING):
        delete(doomed)
        notes.append(f"removed {doomed.name}, which an interrupted envbuilder was deleting")
    for old in _siblings(final, OLD):
        if not final.exists():
            old.rename(final)
            notes.append(f"restored the previous env from {old.name} (an interrupted --force left it aside)")
        else:
            delete(old)
            notes.append(f"removed {old.name}, the env a finished --force replaced")
    return notes


class Transaction:
    """Build ``final`` at ``partial`` beside it, then ``swap`` it in (see the module docstring). Used as a context
    manager: leaving the block by any exception (Ctrl-C and SIGTERM included) before the swap removes the partial.
    With ``mode``, entering makes the partial a directory of exactly that mode (else the builder makes it)."""

    def __init__(
        self,
        final: Path,
        partial: Optional[Path] = None,
        mode: Optional[int] = None,
        later: Optional[Later] = None,
    ) -> None:
        self.final = final
        self.partial = partial or partial_of(final)
        self.mode = mode
        self.swapped = False
        self._old: Optional[Path] = None
        #: Where the directory a swap replaced is removed, after ``finish`` (None: in ``swap`` itself).
        self.later = later

    def __enter__(self) -> Transaction:
        fsutil.mkdirs(self.final.parent)
        if self.mode is not None:
            self.partial.mkdir(mode=self.mode)
            self.partial.chmod(self.mode)  # mkdir's mode is filtered by the umask
        return self

    def __exit__(
        self,
        kind: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        if kind is None or self.swapped:
            return
        delete(self.partial)
        if self._old is not None and not os.path.lexists(self.final):
            self._old.rename(self.final)  # stopped between the two renames: the old one comes back

    def swap(self, pending: Optional[Mapping[str, Any]] = None) -> None:
        """Put the partial at ``final``. ``pending``: what is still to do once it is there, written inside it
        first as its marker (``finish`` does it). A Ctrl-C that Python dropped on the way here stops it first."""
        proc.raise_dropped_interrupt()
        if pending is not None:
            fsutil.write_atomic(self.partial / PENDING, (json.dumps(pending, indent=1) + "\n").encode())
        if self.partial.is_dir() and os.path.lexists(self.final):
            self._old = _beside(self.final, OLD)
            self.final.rename(self._old)
        self.partial.replace(self.final)
        self.swapped = True
        fsutil.fsync_dir(self.final.parent)
        if self._old is not None and self.later is None:
            removal.remove_tree(self._old, ignore_errors=True)

    def finish(self, env: Mapping[str, str], complete: Callable[[], list[str]]) -> list[str]:
        """After the swap: ``complete`` does what the marker said is pending, then the marker goes; then the
        directory the swap replaced starts going, in the background of what the command does next (``later``)."""
        pause(env, "after-rename")
        notes = settle(self.final, complete)
        if self._old is not None and self.later is not None:
            self.later.remove(self._old, env)
        return notes


class Later:
    """Old directories removed while the command goes on (an env's smoke check or validation), each in a thread
    of its own, all joined when the ``with`` block ends: nothing is left running when the command exits.

    Only an aside that a swap has replaced comes here (``.NAME.old-PID``, the new directory already in place).
    Leaving the block by an error waits for them too; an interrupt (Ctrl-C, SIGTERM as one) does not: the threads
    are daemons that end with the process, and what they left of the aside is removed by the next run's
    ``recover`` (as after a kill)."""

    def __init__(self) -> None:
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> Later:
        return self

    def __exit__(
        self,
        kind: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        if kind is None or issubclass(kind, Exception):
            self.join()

    def remove(self, old: Path, env: Mapping[str, str]) -> None:
        def work() -> None:
            pause(env, "removing-old")
            removal.remove_tree(old, ignore_errors=True)

        thread = threading.Thread(target=work, name=f"remove {old.name}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def join(self) -> None:
        while self._threads:
            self._threads.pop().join()


def settle(final: Path, complete: Callable[[], list[str]]) -> list[str]:
    """Do what is pending at ``final`` (``complete``), then remove its marker; complete's notes."""
    notes = complete()
    with contextlib.suppress(FileNotFoundError):
        (final / PENDING).unlink()
    with contextlib.suppress(OSError):  # made for the marker alone (an archive of an env without one)
        (final / PENDING).parent.rmdir()
    return notes


def pause(env: Mapping[str, str], point: str) -> None:
    """The test hook (PAUSE_VAR): the only place it is read."""
    if env.get(PAUSE_VAR) == point:
        print(f"{PAUSE_VAR}: paused {point} (pid {os.getpid()})", file=sys.stderr, flush=True)
        time.sleep(3600)


# ---------------------------------------------------------------------------------------------------------------
# Envs: the window between the rename and the record


@dataclass(frozen=True)
class Pending:
    """What an envbuilder that renames an env into place still has to do once it is there: write ``record`` and,
    for a move, remove the name's env at ``replaces``. Written inside the env before the rename."""

    command: str  # create | restore
    status: str  # the result's status: created | replaced | moved | restored
    record: state.EnvRecord
    replaces: Optional[str] = None
    backup: Optional[str] = None  # restore: the backup's id

    def to_json(self) -> dict[str, Any]:
        return {
            "version": 1,
            "command": self.command,
            "status": self.status,
            "replaces": self.replaces,
            "backup": self.backup,
            "record": self.record.to_json(),
        }

    def complete(self, home: Path, final: Path) -> list[str]:
        """The record written; for a move, the name's env at its old prefix removed."""
        state.save(home, self.record)
        if not self.replaces:
            return []
        return _remove_moved(home, self.record.name, Path(self.replaces), final)


def _read_pending(final: Path) -> Optional[Pending]:
    path = final / PENDING
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        record = state.EnvRecord.from_json(data["record"])
        return Pending(
            str(data["command"]),
            str(data["status"]),
            record,
            data.get("replaces"),
            data.get("backup"),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StateError(
            f"{path} is unreadable ({exc}): an interrupted envbuilder left {final} without a record",
            hint=f"remove {final} (or pass --force to build it again)",
        ) from None


def heal(home: Path, name: str, final: Path) -> tuple[Optional[Pending], list[str]]:
    """Finish what a run killed between the rename and the record left at ``final`` (call with the mutex of
    ``name`` held): the env is complete, so its record is written now. The Pending it finished, if any."""
    pending = _read_pending(final)
    if pending is None:
        return None, []
    rec = pending.record
    if rec.name != name:
        raise StateError(
            f"{final} is the env {rec.name!r}, which an interrupted envbuilder put in place without recording it",
            hint=f"run the command that built {rec.name} again: it finishes the record",
        )
    if Path(rec.prefix) != final:
        raise StateError(
            f"{final} holds an env built for {rec.prefix} (moved since?) that an interrupted envbuilder never "
            "recorded",
            hint=f"move it back to {rec.prefix}, or remove it",
        )
    notes = [
        f"finished the record of {name} at {final}: an interrupted {pending.command} had put it in place"
    ]
    return pending, notes + settle(final, lambda: pending.complete(home, final))


# ---------------------------------------------------------------------------------------------------------------
# One env per name


def claim(home: Path, name: str, final: Path, force: bool) -> Optional[Path]:
    """Check that ``name`` may have its env at ``final`` (mutex of ``name`` held): never where another name's env
    is recorded, and not beside the name's own env elsewhere unless ``force`` (a move). The prefix whose env a
    move removes once the new one is in place and recorded, if any."""
    for other, prefix in state.recorded_prefixes(home).items():
        if other == name:
            continue
        if Path(prefix) == final:
            gone = "" if final.exists() else " (gone now)"
            raise StateError(
                f"{final} is where the env {other!r} is recorded{gone}; {name} cannot take its place",
                hint=f"choose another --prefix, or `envbuilder remove {other}` first",
            )
    try:
        mine = state.load(home, name)
    except StateError:
        return None
    old = Path(mine.prefix)
    if old == final or not old.exists():
        return None
    if not force:
        raise StateError(
            f"{name} already has an env at {old}; another at {final} would leave that one without a record",
            hint=f"--name OTHER makes a second env from the recipe; --force moves {name} to {final} (the env at "
            f"{old} is removed once the new one is in place); or `envbuilder remove {name}` first",
        )
    return old


def _remove_moved(home: Path, name: str, old: Path, new: Path) -> list[str]:
    """Remove the env a move left at ``old``, unless it is no longer that env."""
    if old == new or not old.exists():
        return []
    if not removal.is_env(old):
        return [f"left {old} alone: it is no longer an environment (or a symlink to one)"]
    for other, prefix in state.recorded_prefixes(home).items():
        if other != name and Path(prefix) == old:
            return [f"left {old} alone: it is the env {other} now"]
    discard(old, ignore_errors=True)
    return [f"moved {name} from {old} to {new}; removed the env at {old}"]
