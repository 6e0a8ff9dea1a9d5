"""Reading the small text files users name or leave on a search path (recipes, --facts), trusting nothing about
them: only regular files are opened (a FIFO would block, a device would read without end), never more than a
limit, and only as UTF-8 (a leading byte-order mark, which some editors write, is dropped)."""

from __future__ import annotations

import codecs
import errno
import os
import stat
from pathlib import Path

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class UnreadableFile(Exception):
    """Why a file was not read, in words for a message that names the file ("a symlink loop")."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def os_reason(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "a symlink loop"
    return f"cannot read: {exc.strerror or exc}"


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _limit_words(limit: int) -> str:
    return f"{limit // (1024 * 1024)} MiB" if limit % (1024 * 1024) == 0 else f"{limit} bytes"


def read_text(path: Path, limit: int, what: str = "file") -> str:
    """The UTF-8 text of ``path``, or UnreadableFile. ``what`` names the file's role in the size message."""
    try:
        # stat before open: opening a device can have effects of its own (a tape rewinds), so none is opened.
        st = path.stat()
    except OSError as exc:
        raise UnreadableFile(os_reason(exc)) from None
    except ValueError:  # a NUL in the name
        raise UnreadableFile("not a valid file name") from None
    if not stat.S_ISREG(st.st_mode):
        raise UnreadableFile(f"not a regular file ({_kind(st.st_mode)})")
    too_big = f"larger than the {_limit_words(limit)} limit for a {what}"
    if st.st_size > limit:
        raise UnreadableFile(f"{too_big} ({st.st_size} bytes)")
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise UnreadableFile(os_reason(exc)) from None
    try:
        # The file may have been swapped between stat and open: O_NONBLOCK kept a FIFO from blocking, and
        # fstat says what was really opened.
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnreadableFile(f"not a regular file ({_kind(st.st_mode)})")
        data = _read_at_most(fd, limit, too_big)
    except OSError as exc:
        raise UnreadableFile(os_reason(exc)) from None
    finally:
        os.close(fd)
    return _decode(data)


def _read_at_most(fd: int, limit: int, too_big: str) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = os.read(fd, min(1024 * 1024, limit + 1 - total))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:
            raise UnreadableFile(too_big)  # it grew while being read


def _decode(data: bytes) -> str:
    """UTF-8, a leading byte-order mark dropped; where it is not, the error says where."""
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8) :]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise UnreadableFile(
            f"not UTF-8 text: byte 0x{data[exc.start]:02x} (at line {line}, column {column})"
        ) from None


def read_tail(path: Path, limit: int) -> tuple[str, bool]:
    """The last ``limit`` bytes of the regular file ``path`` as text (bytes that are not UTF-8 replaced: a log
    holds what programs wrote), and whether its start was left out; UnreadableFile where it cannot be read."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            raise UnreadableFile(f"not a regular file ({_kind(path.stat().st_mode)})")
        fd = os.open(path, flags)
    except OSError as exc:
        raise UnreadableFile(os_reason(exc)) from None
    except ValueError:
        raise UnreadableFile("not a valid file name") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnreadableFile(f"not a regular file ({_kind(st.st_mode)})")
        cut = st.st_size > limit
        if cut:
            os.lseek(fd, st.st_size - limit, os.SEEK_SET)
        chunks: list[bytes] = []
        left = limit  # a log still being written may grow: what is past the limit is left for the next read
        while left > 0:
            chunk = os.read(fd, min(1024 * 1024, left))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
    except OSError as exc:
        raise UnreadableFile(os_reason(exc)) from None
    finally:
        os.close(fd)
    return data.decode("utf-8", errors="replace"), cut
