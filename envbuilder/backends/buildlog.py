"""The build log (every command with its output, one file per create or restore), and running one build command:
through proc, under a umask without world write, logged. Nothing a build leaves is world-writable."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Optional

from envbuilder.backends import network
from envbuilder.core import settings
from envbuilder.core.errors import BackendError, CommandFailed
from envbuilder.system import envwalk, proc

#: How the log marks a command's output lines, by stream.
_MARKS = {"stdout": "out", "stderr": "err"}


class BuildLog:
    """Appends every command, its output and its exit status to one file (and keeps the file's path)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: IO[str] = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()
        path.chmod(0o600)  # commands and their output may name private paths

    def write(self, text: str) -> None:
        with self._lock:  # streamed output comes from two reader threads (proc.Stop.on_line)
            self._fh.write(text if text.endswith("\n") else text + "\n")
            self._fh.flush()

    def started(self, argv: Sequence[str], extra_env: Mapping[str, str]) -> None:
        """A command about to run: its own variables and argv; its output follows as it comes (``output``)."""
        stamp = time.strftime("%H:%M:%S")
        for key, value in extra_env.items():
            self.write(f"[{stamp}]   {key}={value}")
        self.write(f"[{stamp}] + {proc.quote(argv)}")

    def output(self, stream: str, line: str) -> None:
        """One line of a running command's output, as it arrives (``out|`` stdout, ``err|`` stderr)."""
        self.write(f"[{time.strftime('%H:%M:%S')}] {_MARKS.get(stream, stream)}| {line.rstrip()}")

    def ended(self, returncode: int, seconds: float) -> None:
        self.write(f"[{time.strftime('%H:%M:%S')}] (exit {returncode}, {seconds:.1f} s)")

    def command(
        self,
        argv: Sequence[str],
        extra_env: Mapping[str, str],
        result: proc.Result,
        seconds: Optional[float] = None,
    ) -> None:
        """A command that ran to its end, its output after it (``seconds``: how long it took, where timed)."""
        stamp = time.strftime("%H:%M:%S")
        for key, value in extra_env.items():
            self.write(f"[{stamp}]   {key}={value}")
        took = f", {seconds:.1f} s" if seconds is not None else ""
        self.write(f"[{stamp}] + {proc.quote(argv)}  (exit {result.returncode}{took})")
        for name, text in (("stdout", result.stdout), ("stderr", result.stderr)):
            if text.strip():
                self.write(f"--- {name}\n{text.rstrip()}")

    def close(self) -> None:
        self._fh.close()


def open_log(home: Path, name: str) -> BuildLog:
    """A new log for one run on the env ``name``, under ``home``/logs."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return BuildLog(settings.logs_dir(home) / f"{name}-{stamp}-{os.getpid()}.log")


def build_umask() -> int:
    """The caller's umask with world-write always masked: nothing a build creates is world-writable, whatever
    the user's umask (group sharing with 002 stays as the user set it)."""
    current = os.umask(0o022)
    os.umask(current)
    return current | 0o002


def run_logged(
    argv: Sequence[str],
    env: Mapping[str, str],
    log: BuildLog,
    extra_env: Optional[Mapping[str, str]] = None,
    *,
    timeout: Optional[float] = None,
    cwd: Optional[str] = None,
    watch: Optional[Callable[[], Optional[str]]] = None,
    on_line: Optional[Callable[[str, str], None]] = None,
) -> proc.Result:
    """Run one build command (through proc), its output logged line by line as it comes; raise CommandFailed on
    a non-zero exit. ``watch`` is sampled while it runs, and ``on_line`` gets each line after the log
    (``proc.Stop``)."""
    log.started(argv, extra_env or {})
    began = time.monotonic()

    def each_line(stream: str, line: str) -> None:
        log.output(stream, line)
        if on_line is not None:
            on_line(stream, line)

    stop = proc.Stop(watch=watch, on_line=each_line)
    try:
        result = proc.run(
            argv, env=env, timeout=timeout, check=False, cwd=cwd, umask=build_umask(), stop=stop
        )
    except FileNotFoundError:
        log.write("(not found)")
        raise BackendError(
            f"{argv[0]} is not installed or not on PATH", hint="load the module that provides it"
        ) from None
    except CommandFailed as exc:  # stopped: its timeout
        log.ended(exc.returncode, time.monotonic() - began)
        raise
    log.ended(result.returncode, time.monotonic() - began)
    if result.returncode != 0:
        failed = CommandFailed(list(argv), result.returncode, proc.tail(result.stderr))
        raise network.network_error(failed) or failed
    return result


class Swept:
    """What :func:`world_write_swept` found, once its block is left: the entries it fixed (relative paths) and
    the walk itself (``walk``: the env's measure for its record, from the same lstat of every entry)."""

    def __init__(self, walking: envwalk.Walking) -> None:
        self.walking = walking
        self.fixed: list[str] = []

    @property
    def walk(self) -> envwalk.Walk:
        return self.walking.walk


@contextlib.contextmanager
def world_write_swept(root: Path, *, atimes: bool = False, sizes: bool = False) -> Iterator[Swept]:
    """Remove the world-write bit everywhere under ``root`` (``root`` included), walking the tree while the block
    runs (find, on another core: :func:`envwalk.walking`, which also takes the ``atimes`` and ``sizes`` asked
    for); what was fixed is in ``.fixed`` once the block is left. Children ran under build_umask, and this
    catches what a tool chmods itself (uv sets its venv ``.lock`` to 0666); an entry find cannot read fails
    the sweep (CommandFailed). The block must not create files without an explicit mode (it may be walked past);
    its reads overlap the walk."""
    with envwalk.walking(root, atimes=atimes, sizes=sizes, check=True) as walking:
        swept = Swept(walking)
        yield swept
    for rel in walking.walk.writable:
        path = root / rel
        path.chmod(path.stat().st_mode & 0o7775)
        swept.fixed.append(rel or ".")
