"""What envbuilder may delete or replace, and deleting without ever following a symlink.

envbuilder deletes only what it made. Two questions decide it, both answered here:

- **Is this the env?** A directory is the env a record names when the record envbuilder writes inside every env
  it builds (``envbuilder/record.json``) names the same env at the same prefix (``env_problem``); ``remove``
  deletes nothing else. ``create --force`` and ``restore --force`` replace a directory only when it holds an
  environment (``is_env``), never through a symlink.
- **Is this a stored entry?** Under a root envbuilder keeps (a backup root's ``store/`` and ``envs/``), an entry
  is ours when it is a regular file (or directory) reached from the root without passing a symlink
  (``remove_below``): a symlink planted there is reported and left, never followed nor counted.

Deleting walks as rm -rf implementations do: every directory is opened with ``O_NOFOLLOW | O_DIRECTORY`` relative
to its parent's descriptor, and its entries are unlinked or removed by name in it (``dir_fd``). A symlink met
anywhere is unlinked itself; a directory swapped for a symlink between the listing and its opening fails to open
(``ELOOP``) and is unlinked as the link it now is. No path is ever resolved again below the top.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Optional

from envbuilder.core.errors import UnsafePath

#: The record envbuilder writes inside every env it builds or restores (relative to the prefix).
MARKER = ("envbuilder", "record.json")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
#: A file opened for reading: never through a link, and never blocking on a fifo planted in its place.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
#: What opening a name with O_NOFOLLOW | O_DIRECTORY says of a symlink (ELOOP) or of anything not a directory.
_NOT_A_DIR = (errno.ELOOP, errno.ENOTDIR)


# ---------------------------------------------------------------------------------------------------------------
# Whose is it?


def is_env(path: Path) -> bool:
    """Whether ``path`` itself (not a symlink to one) holds an environment (a venv, a conda env, or an env
    envbuilder recorded inside it, as a user prefix is): only those are replaced by ``--force``."""
    if path.is_symlink():
        return False
    return (
        (path / "pyvenv.cfg").is_file() or (path / "conda-meta").is_dir() or path.joinpath(*MARKER).is_file()
    )


def env_problem(prefix: Path, name: str, origin: Optional[tuple[str, str]] = None) -> Optional[str]:
    """Why ``prefix`` is not the env ``name`` recorded there, in words; None when it is: a directory (not a
    symlink) whose own record (``envbuilder/record.json``, read without following a link) names that env at that
    prefix. ``origin``: the env name and prefix of the backup it was restored from (an archive keeps the record
    it was packed with, relocated only where that was safe)."""
    why = _not_a_directory(prefix)
    if why:
        return why
    marker = f"{prefix}/{'/'.join(MARKER)}"
    try:
        marked = _read_marker(prefix)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, *_NOT_A_DIR):
            return f"{prefix} holds no {'/'.join(MARKER)}: it is not an env envbuilder built"
        return f"{marker} cannot be read ({exc.strerror})"
    except ValueError:
        return f"{marker} is not a record envbuilder wrote"
    return _disagreement(prefix, name, marked, origin)


def _not_a_directory(prefix: Path) -> Optional[str]:
    try:
        info = os.lstat(prefix)
    except FileNotFoundError:
        return f"{prefix} does not exist"
    if stat.S_ISLNK(info.st_mode):
        return f"{prefix} is a symlink (to {prefix.readlink()}), not the env's directory"
    if not stat.S_ISDIR(info.st_mode):
        return f"{prefix} is not a directory"
    return None


def _disagreement(
    prefix: Path, name: str, marked: dict[str, object], origin: Optional[tuple[str, str]]
) -> Optional[str]:
    names, prefixes = {name}, {str(prefix)}
    if origin is not None:
        names.add(origin[0])
        prefixes.add(origin[1])
    if marked.get("name") not in names:
        return f"{prefix} holds the env {marked.get('name')!r}, not {name!r}"
    if marked.get("prefix") not in prefixes:
        return f"{prefix} holds an env built for {marked.get('prefix')}, not for {prefix}"
    return None


def _read_marker(prefix: Path) -> dict[str, object]:
    """The record inside ``prefix``, each step opened without following a symlink."""
    fd = os.open(prefix, _DIR_FLAGS)
    try:
        sub = os.open(MARKER[0], _DIR_FLAGS, dir_fd=fd)
    finally:
        os.close(fd)
    try:
        raw = os.open(MARKER[1], os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), dir_fd=sub)
    finally:
        os.close(sub)
    with os.fdopen(raw, "rb") as fh:
        data = json.loads(fh.read(16 << 20))
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return data


def refuse_link(path: Path, what: str = "a directory envbuilder made") -> None:
    """Raise UnsafePath when ``path`` is a symlink where the caller expects ``what`` itself."""
    if path.is_symlink():
        raise UnsafePath(
            f"{path} is a symlink (to {path.readlink()}), not {what}; left it",
            path=str(path),
            hint="remove the link yourself if it is not needed",
        )


# ---------------------------------------------------------------------------------------------------------------
# Removing


def remove_tree(path: Path, *, ignore_errors: bool = False) -> None:
    """rm -rf ``path`` without following a symlink: a directory with everything in it, anything else (a symlink
    included: the link, never what it points to) unlinked. Missing: nothing to do. With ``ignore_errors`` what
    cannot be removed is left; else the first error is raised once the rest has gone."""
    errors: list[OSError] = []
    try:
        parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return
    except OSError as exc:
        errors.append(exc)
    else:
        try:
            _remove_entry(parent, path.name, None, errors)
        finally:
            os.close(parent)
    if errors and not ignore_errors:
        raise errors[0]


def remove_below(
    root: Path,
    path: Path,
    *,
    aside: Optional[str] = None,
    dirs: bool = False,
    dry_run: bool = False,
) -> Optional[str]:
    """Remove ``path``, an entry of the tree envbuilder keeps at ``root`` (``root`` itself may be a link, the
    user's choice), reached from ``root`` without passing a symlink. None once removed (or gone); else why it
    was left, in words: a symlink on the way or at ``path``, or not a regular file (nor, with ``dirs``, a
    directory). ``aside``: a name in the same directory it is renamed to first (out of listings in one rename).
    ``dry_run``: only say whether it would be removed."""
    parts = path.relative_to(root).parts
    try:
        parent = _open_below(root, parts[:-1])
    except _Left as left:
        return left.why
    try:
        name = parts[-1]
        try:
            info = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return None
        why = _not_ours(path, info, dirs)
        if why or dry_run:
            return why
        if aside is not None:
            os.rename(name, aside, src_dir_fd=parent, dst_dir_fd=parent)
            name = aside
        errors: list[OSError] = []
        _remove_entry(parent, name, stat.S_ISDIR(info.st_mode), errors)
        if errors:
            raise errors[0]
        return None
    finally:
        os.close(parent)


class _Left(Exception):
    """Raised on the way down to an entry: ``why`` it is left (None: it is gone already)."""

    def __init__(self, why: Optional[str]) -> None:
        super().__init__(why)
        self.why = why


def _open_below(root: Path, parts: tuple[str, ...]) -> int:
    """A descriptor of ``root/parts...``, each part opened in the one before without following a link."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise _Left(None) from None
    here = root
    for part in parts:
        here = here / part
        try:
            sub = os.open(part, _DIR_FLAGS, dir_fd=fd)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                raise _Left(None) from None
            if exc.errno in _NOT_A_DIR:
                what = "a symlink" if here.is_symlink() else "not a directory"
                raise _Left(f"{here} is {what}, not a directory of {root}'s own; left it") from None
            raise
        finally:
            os.close(fd)
        fd = sub
    return fd


def open_below(root: Path, rel: str) -> BinaryIO:
    """``root/rel`` opened for reading, reached from ``root`` without passing a symlink and not one itself (a
    file envbuilder wrote in a tree it keeps, never what a link planted there points to). ``rel`` comes from a
    file others may have written: an absolute path or a ``..`` in it is refused. Raises OSError (``ELOOP`` for a
    link on the way or at the end, with the path and why in its message; ENOENT when it is gone)."""
    path = root / rel
    parts = tuple(rel.split("/"))
    if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise OSError(errno.EINVAL, "not a path inside the tree envbuilder keeps", str(path))
    try:
        parent = _open_below(root, parts[:-1])
    except _Left as left:
        raise OSError(errno.ELOOP if left.why else errno.ENOENT, left.why or "missing", str(path)) from None
    try:
        fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "a symlink, not a file envbuilder wrote", str(path)) from None
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    finally:
        os.close(parent)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise OSError(errno.EISDIR if stat.S_ISDIR(info.st_mode) else errno.EINVAL, "not a file", str(path))
    return os.fdopen(fd, "rb")


def _not_ours(path: Path, info: os.stat_result, dirs: bool) -> Optional[str]:
    """Why the entry ``info`` describes is not one to remove (None: it is)."""
    mode = info.st_mode
    if stat.S_ISREG(mode) or (dirs and stat.S_ISDIR(mode)):
        return None
    if stat.S_ISLNK(mode):
        return f"{path} is a symlink, not an entry envbuilder wrote; left it"
    what = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
    return f"{path} is {what}, not an entry envbuilder wrote; left it"


def _remove_entry(parent: int, name: str, was_dir: Optional[bool], errors: list[OSError]) -> None:
    """Remove ``name`` in the directory open at ``parent``, depth first without recursion (a tree of any depth;
    one descriptor held per level). ``was_dir``: what a listing said it was (None: not listed). Only a name
    that opens as a directory without following a link is walked into; anything else is unlinked itself."""
    if was_dir is False:
        _unlink(parent, name, errors)
        return
    top = _open_child(parent, name, errors)
    if top is None:
        return
    stack: list[tuple[int, str, list[str]]] = [(top, name, _listing(top, errors))]
    while stack:
        fd, here, pending = stack[-1]
        if pending:
            child = pending.pop()
            sub = _open_child(fd, child, errors)
            if sub is not None:
                stack.append((sub, child, _listing(sub, errors)))
            continue
        stack.pop()
        os.close(fd)
        with _collected(errors):
            os.rmdir(here, dir_fd=stack[-1][0] if stack else parent)


def _open_child(parent: int, name: str, errors: list[OSError]) -> Optional[int]:
    """A descriptor of the directory ``name`` in ``parent``, opened without following a link; None where
    ``name`` is gone, failed, or is no directory (a file, or a link, perhaps swapped in since it was listed as a
    directory: then the name itself is unlinked, and what it points to is never touched)."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in _NOT_A_DIR:
            _unlink(parent, name, errors)
        else:
            errors.append(exc)
        return None


def _listing(fd: int, errors: list[OSError]) -> list[str]:
    """Unlink what the directory open at ``fd`` holds but directories; the names of those (to walk into)."""
    dirs: list[str] = []
    others: list[str] = []
    try:
        with os.scandir(fd) as entries:
            for entry in entries:
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                except OSError:
                    is_dir = True  # unknown: opening it without following a link tells
                (dirs if is_dir else others).append(entry.name)
    except OSError as exc:
        errors.append(exc)
    for name in others:
        _unlink(fd, name, errors)
    return dirs


def _unlink(parent: int, name: str, errors: list[OSError]) -> None:
    with _collected(errors):
        os.unlink(name, dir_fd=parent)


@contextlib.contextmanager
def _collected(errors: list[OSError]) -> Iterator[None]:
    """What fails is kept in ``errors`` (the removal goes on); a name already gone is no failure."""
    try:
        yield
    except FileNotFoundError:
        pass
    except OSError as exc:
        errors.append(exc)
