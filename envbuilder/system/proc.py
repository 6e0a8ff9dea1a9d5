"""The one place that starts subprocesses.

argv lists only (never a shell string), a scrubbed environment, a timeout that ends the child and everything it
started, and the tail of stderr kept for the error message.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import logging
import os
import shlex
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Optional, cast

from envbuilder.core.errors import CommandFailed
from envbuilder.core.structs import dataclass

log = logging.getLogger("envbuilder.system.proc")

# Variables that would make a child python (or pip/uv) see the caller's packages or settings instead of its own.
_LEAKY_PREFIXES = ("PIP_", "UV_", "PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "VIRTUAL_ENV", "CONDA_PREFIX")

STDERR_TAIL_LINES = 20
#: fcntl.F_SETPIPE_SZ (Linux), which the fcntl module names only from Python 3.10.
_F_SETPIPE_SZ = 1031
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Result:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


def scrubbed_env(base: Optional[Mapping[str, str]] = None, keep: Sequence[str] = ()) -> dict[str, str]:
    """A copy of ``base`` (default: os.environ) without python/pip/uv leaks, except names listed in ``keep``."""
    src = os.environ if base is None else base
    return {k: v for k, v in src.items() if k in keep or not k.startswith(_LEAKY_PREFIXES)}


#: Held while a child is forked (see _hold_signals).
_HELD = frozenset({signal.SIGINT, signal.SIGTERM})


def _hold_signals() -> set[int | signal.Signals]:
    """Block Ctrl-C and SIGTERM around a fork; returns the mask to put back. Python runs its fork callbacks
    (logging's lock release among them) where a KeyboardInterrupt is printed as "Exception ignored" and dropped,
    so a Ctrl-C landing during the fork was lost and the build went on. Held, it arrives once the caller puts the
    mask back, inside the block that kills the child on an interrupt."""
    return signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)


def _release_signals(mask: set[int | signal.Signals]) -> None:
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _start(
    argv: Sequence[str],
    env: Optional[Mapping[str, str]],
    umask: int,
    parent_death: int = signal.SIGKILL,
    **popen: Any,
) -> tuple[subprocess.Popen[Any], set[int | signal.Signals]]:
    """Start ``argv`` in its own session, tied to this process (``_die_with_parent``), with Ctrl-C and SIGTERM
    held for the fork. Returns the child and the mask that the caller must put back with ``_release_signals``
    inside the block that kills the child on an interrupt."""
    mask = _hold_signals()
    try:
        child = subprocess.Popen(
            argv,
            env=dict(scrubbed_env() if env is None else env),
            start_new_session=True,
            # async-signal-safe: sigmask and prctl calls
            preexec_fn=functools.partial(_die_with_parent, int(parent_death), os.getpid()),  # noqa: PLW1509
            umask=umask,
            **popen,
        )
    except BaseException:
        _release_signals(mask)
        raise
    return child, mask


def _die_with_parent(parent_death: int, parent: int) -> None:
    """In the child, before exec: take Ctrl-C and SIGTERM again (the parent held them for the fork), and get
    ``parent_death`` when envbuilder dies, even by SIGKILL (Linux prctl PR_SET_PDEATHSIG). Otherwise an
    installer in its own session would go on writing into a build directory that the next run has already
    cleared. A launcher gets SIGTERM instead of SIGKILL: that is the signal on which it takes down what it
    started (torchrun its workers, in sessions of their own; srun the step on every node; mpiexec its proxies)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELD)
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, parent_death, 0, 0, 0)
        # The parent may have died between the fork and the prctl (a SIGKILL cannot be held): the child is then
        # already an orphan that no death signal will reach, and would install into a partial that the next run is
        # clearing (seen on CI: a create killed right after `uv venv` left its partial behind the rerun).
        if os.getppid() != parent:
            os.kill(os.getpid(), parent_death)


def _find_prctl() -> Optional[Callable[..., int]]:
    # Looked up once in the parent: the child, between fork and exec, only makes the call.
    try:
        return cast(Callable[..., int], ctypes.CDLL(None).prctl)
    except (OSError, AttributeError):  # not Linux
        return None


_PRCTL = _find_prctl()


@dataclass(frozen=True)
class Stop:
    """How :func:`run` ends a child early, besides its timeout. ``watch`` is called every ``WATCH_S`` while the
    child runs; a text it returns stops the run as a timeout does, that text in the error. ``grace``: seconds
    between SIGTERM and the kill (:func:`end_tree`). ``parent_death``: the signal the child gets when envbuilder
    dies (see ``_die_with_parent``). ``on_line``: each line of output as it arrives (``"stdout"`` or
    ``"stderr"``, the line with its newline), called from reader threads while the child runs: a build log that
    fills as the installer works, not after it exits. ``watch`` may equally sample progress and return None."""

    watch: Optional[Callable[[], Optional[str]]] = None
    grace: float = 0.0
    parent_death: int = signal.SIGKILL
    on_line: Optional[Callable[[str, str], None]] = None


def quote(argv: Sequence[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


def run(
    argv: Sequence[str],
    *,
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[str] = None,
    timeout: Optional[float] = None,
    check: bool = True,
    input_text: Optional[str] = None,
    umask: int = -1,
    stop: Optional[Stop] = None,
) -> Result:
    """Run ``argv`` and capture its output.

    ``stop.on_line`` gets each line of output as it arrives; the result holds the whole output all the same.

    ``env`` is used as given (callers build it with :func:`scrubbed_env`); None means a scrubbed os.environ.
    On timeout the child and everything it started are ended (:func:`end_tree`, SIGTERM and ``stop.grace``
    seconds first when that is set) and CommandFailed is raised with returncode 124; ``stop.watch`` can stop
    the run the same way. An interrupt (Ctrl-C, or SIGTERM under :func:`sigterm_as_interrupt`) kills the whole
    tree at once.
    """
    if isinstance(argv, str):  # defensive: a shell string must never get here
        raise TypeError("proc.run takes an argv list, not a string")
    argv = [os.fspath(a) for a in argv]
    log.debug("+ %s", quote(argv))
    stop = stop or Stop()
    watch = stop.watch
    proc, mask = _start(
        argv,
        env,
        umask,
        stop.parent_death,
        cwd=cwd,
        stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = None if timeout is None else time.monotonic() + timeout
    talk = proc.communicate if stop.on_line is None else _Pump(proc, stop.on_line).communicate
    try:
        _release_signals(mask)  # a Ctrl-C held during the fork is raised here, and kills the child below
        while True:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            step = left if watch is None else (WATCH_S if left is None else min(left, WATCH_S))
            try:
                out, err = talk(input=input_text, timeout=step)
                break
            except subprocess.TimeoutExpired:
                input_text = None  # sent on the first call; communicate refuses it again
                why = watch() if watch is not None else None
                if why is None and (deadline is None or time.monotonic() < deadline):
                    continue
                end_tree(proc, stop.grace)
                out, err = talk()
                raise CommandFailed(
                    argv, 124, tail(err) + f"\n({why or f'timed out after {timeout:g} s'})"
                ) from None
    except CommandFailed:
        raise
    except BaseException:
        end_tree(proc)
        proc.wait()
        raise
    result = Result(tuple(argv), proc.returncode, out, err)
    if check and proc.returncode != 0:
        raise CommandFailed(argv, proc.returncode, tail(err))
    return result


class Background:
    """A command started now whose result is collected later (:func:`background`), so that it overlaps work
    this process does meanwhile. Its output is captured whole (meant for short commands with small output)."""

    def __init__(self, child: subprocess.Popen[str], argv: tuple[str, ...]) -> None:
        self.child = child
        self.argv = argv

    def result(self, timeout: Optional[float] = None, check: bool = True) -> Result:
        """Wait for it (CommandFailed 124 and the tree ended on ``timeout``); its Result."""
        try:
            out, err = self.child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            end_tree(self.child)
            self.child.communicate()
            raise CommandFailed(list(self.argv), 124, f"timed out after {timeout:g} s") from None
        if check and self.child.returncode != 0:
            raise CommandFailed(list(self.argv), self.child.returncode, tail(err))
        return Result(self.argv, self.child.returncode, out, err)


@contextlib.contextmanager
def background(
    argv: Sequence[str],
    *,
    env: Optional[Mapping[str, str]] = None,
    umask: int = -1,
    errors: str = "strict",
) -> Iterator[Background]:
    """Start ``argv`` (as :func:`run` does: own session, tied to this process) and hand it back to be collected
    with ``.result()``; leaving the block any other way (an error, Ctrl-C) ends it and all it started. ``errors``:
    how output that is not text in the locale's encoding is decoded (``surrogateescape`` for file names)."""
    argv = tuple(os.fspath(a) for a in argv)
    log.debug("+ %s &", quote(argv))
    child, mask = _start(
        argv,
        env,
        umask,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors=errors,
    )
    try:
        _release_signals(mask)
        yield Background(child, argv)
    finally:
        if child.returncode is None:
            end_tree(child)
            child.communicate()


#: How often proc.run calls its ``watch``.
WATCH_S = 0.5


class _Pump:
    """A child's stdout and stderr read line by line as they come, each line handed to ``on_line``: the
    streaming twin of ``Popen.communicate`` (same call, same TimeoutExpired, same pair of texts at the end)."""

    def __init__(self, child: subprocess.Popen[str], on_line: Callable[[str, str], None]) -> None:
        self.child = child
        self.on_line = on_line
        self.texts: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self.readers = [
            threading.Thread(target=self._read, args=(name, stream), daemon=True)
            for name, stream in (("stdout", child.stdout), ("stderr", child.stderr))
        ]
        #: What ``on_line`` raised first (a full disk under the build log), raised once the child is done.
        self.failed: Optional[Exception] = None
        for reader in self.readers:
            reader.start()
        self.fed = False

    def _read(self, name: str, stream: Optional[IO[str]]) -> None:
        if stream is None:
            return
        with stream:
            for line in stream:
                self.texts[name].append(line)
                if self.failed is None:
                    try:
                        self.on_line(name, line)
                    except Exception as exc:  # kept, and raised by communicate
                        # The pipe is still drained: a child blocked on a full pipe would never end.
                        self.failed = exc

    def communicate(self, input: Optional[str] = None, timeout: Optional[float] = None) -> tuple[str, str]:
        if not self.fed:
            self.fed = True
            self._feed(input)
        # The texts are complete once the pipes close, which the child's end does (a grandchild may hold them
        # longer, and counts against the timeout). The readers are joined first: a thread join wakes the moment
        # they finish, where Popen.wait(timeout) polls with sleeps growing to 50 ms, a delay on every command.
        deadline = None if timeout is None else time.monotonic() + timeout
        for reader in self.readers:
            reader.join(None if deadline is None else max(deadline - time.monotonic(), 0.0))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.child.args, timeout or 0.0)
        self.child.wait(None if deadline is None else max(deadline - time.monotonic(), 0.0))
        if self.failed is not None:
            raise self.failed
        return "".join(self.texts["stdout"]), "".join(self.texts["stderr"])

    def _feed(self, text: Optional[str]) -> None:
        stdin = self.child.stdin
        if stdin is None:
            return
        with contextlib.suppress(BrokenPipeError), stdin:
            stdin.write(text or "")


def passthrough(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Optional[str] = None,
    grace: float = 5.0,
    parent_death: int = signal.SIGTERM,
) -> int:
    """Run ``argv`` with this process's stdin, stdout and stderr (the user's program under its launcher) and
    return its exit status, a signal as 128 + its number the way shells report it. Ctrl-C or SIGTERM (under
    :func:`sigterm_as_interrupt`) ends the whole tree, SIGTERM first and ``grace`` seconds to go; if envbuilder
    itself dies, the child gets ``parent_death``."""
    argv = [os.fspath(a) for a in argv]
    log.debug("+ %s", quote(argv))
    child, mask = _start(argv, env, -1, parent_death, cwd=cwd)
    try:
        _release_signals(mask)
        code = child.wait()
    except BaseException:
        end_tree(child, grace)
        child.wait()
        raise
    return 128 - code if code < 0 else code


def describe_status(returncode: int) -> str:
    """``exit status N``, or the signal's name for a negative status (a crash or a kill)."""
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-returncode).name}"
    return f"exit status {returncode}"


def end_tree(child: subprocess.Popen[Any], grace: float = 0.0) -> None:
    """End ``child`` and every process it started, wherever they went: torchrun starts each worker in a
    session of its own and MPI launchers put proxies and ranks in groups of their own, so killing the child's
    process group alone left the ranks running (holding the GPUs) for as long as their own timeouts.

    With ``grace``, the tree gets SIGTERM first (the ranks record where they were, launchers take down their
    remote parts) and that long to go. Then whatever is left is stopped (SIGSTOP: nothing forks while the tree
    is collected) and killed. Processes are told apart by their start time, so a recycled pid is never hit.
    Ctrl-C and SIGTERM are held meanwhile: a second Ctrl-C must not cut the cleanup short."""
    mask = _hold_signals()
    try:
        table = _processes()
        if table is None:  # no /proc (not Linux): the child's group is all that can be found
            _signal_group(child.pid, signal.SIGKILL)
            return
        known = _tree({child.pid: table[child.pid][1]} if child.pid in table else {}, table)
        if grace > 0 and known:
            _signal_each(known, signal.SIGTERM)
            _signal_group(child.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while known and time.monotonic() < deadline:
                time.sleep(0.1)
                child.poll()  # reaped, the child no longer counts as alive
                known = _tree(known, _processes() or {})
        stopped: dict[int, int] = {}
        for _ in range(100):
            table = _processes() or {}
            members = _tree({**_alive(known, table), **_alive(stopped, table)}, table)
            new = {pid: start for pid, start in members.items() if pid not in stopped}
            if not new:
                break
            _signal_each(new, signal.SIGSTOP)
            stopped.update(new)
        _signal_each(stopped, signal.SIGKILL)
        _signal_group(child.pid, signal.SIGKILL)
    finally:
        _release_signals(mask)


def _processes() -> Optional[dict[int, tuple[int, int]]]:
    """pid -> (parent pid, start time) of every live process (zombies left out); None without /proc."""
    try:
        names = [entry.name for entry in Path("/proc").iterdir()]
    except OSError:
        return None
    table = {}
    for name in names:
        if name.isdigit():
            stat = _stat(int(name))
            if stat is not None and stat[0] not in "ZX":
                table[int(name)] = (stat[1], stat[2])
    return table


def start_time(pid: int) -> Optional[int]:
    """When process ``pid`` started (clock ticks since boot): with the pid, it names one process for good."""
    stat = _stat(pid)
    return stat[2] if stat is not None and stat[0] not in "ZX" else None


def _stat(pid: int) -> Optional[tuple[str, int, int]]:
    """(state, parent pid, start time) from /proc/PID/stat; None when it is gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The command name is in parentheses and may hold any byte: the fields start after the last ")".
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return fields[0].decode(), int(fields[1]), int(fields[19])
    except (IndexError, ValueError):
        return None


def _alive(procs: Mapping[int, int], table: Mapping[int, tuple[int, int]]) -> dict[int, int]:
    """Those of ``procs`` (pid -> start time) that still run, and are still the same process."""
    return {pid: start for pid, start in procs.items() if pid in table and table[pid][1] == start}


def _tree(roots: Mapping[int, int], table: Mapping[int, tuple[int, int]]) -> dict[int, int]:
    """``roots`` and all their live descendants, pid -> start time."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _start) in table.items():
        children.setdefault(ppid, []).append(pid)
    found = dict(_alive(roots, table))
    todo = list(found)
    while todo:
        for kid in children.get(todo.pop(), ()):
            if kid not in found:
                found[kid] = table[kid][1]
                todo.append(kid)
    return found


def _signal_each(procs: Mapping[int, int], signum: int) -> None:
    for pid in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def tail(text: str, lines: int = STDERR_TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


@contextlib.contextmanager
def feeding(
    argv: Sequence[str], *, env: Optional[Mapping[str, str]] = None, umask: int = -1
) -> Iterator[IO[bytes]]:
    """Run ``argv`` with its stdin a pipe the block writes to (a compressor fed a stream). On leaving the block
    stdin is closed and the command waited for; a non-zero exit raises CommandFailed. If the block fails, the
    command's process group is killed first, so no half-written output is left being written."""
    argv = [os.fspath(a) for a in argv]
    log.debug("+ %s |", quote(argv))
    with tempfile.TemporaryFile() as err:
        child, mask = _start(argv, env, umask, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err)
        stdin = cast(IO[bytes], child.stdin)  # stdin=PIPE always gives one
        try:
            _release_signals(mask)
            with contextlib.suppress(OSError):
                # A 1 MiB pipe instead of 64 KiB: a compressor fed gigabytes spends less time switching.
                fcntl.fcntl(stdin.fileno(), _F_SETPIPE_SZ, 1 << 20)
            yield stdin
            stdin.close()
        except BrokenPipeError:
            # The command ended before reading everything: its own stderr says why (disk full, say).
            with contextlib.suppress(OSError):
                stdin.close()
            code = child.wait()
            err.seek(0)
            raise CommandFailed(argv, code or 1, tail(err.read().decode(errors="replace"))) from None
        except BaseException:
            end_tree(child)
            with contextlib.suppress(OSError):
                stdin.close()
            child.wait()
            raise
        code = child.wait()
        if code != 0:
            err.seek(0)
            raise CommandFailed(argv, code, tail(err.read().decode(errors="replace")))


@contextlib.contextmanager
def reading(
    argv: Sequence[str], stdin: IO[bytes], *, env: Optional[Mapping[str, str]] = None
) -> Iterator[IO[bytes]]:
    """Run ``argv`` on ``stdin`` with its stdout a pipe the block reads (a decompressor's stream). On leaving the
    block the rest of the output is read and the command waited for; a non-zero exit raises CommandFailed. If the
    block fails, the command's process group is killed first."""
    argv = [os.fspath(a) for a in argv]
    log.debug("+ %s <", quote(argv))
    with tempfile.TemporaryFile() as err:
        # Read through a 1 MiB buffer from a 1 MiB pipe: tarfile's stream reads 10 KiB at a time.
        child, mask = _start(argv, env, -1, stdin=stdin, stdout=subprocess.PIPE, stderr=err, bufsize=1 << 20)
        stdout = cast(IO[bytes], child.stdout)  # stdout=PIPE always gives one
        try:
            _release_signals(mask)
            with contextlib.suppress(OSError):
                fcntl.fcntl(stdout.fileno(), _F_SETPIPE_SZ, 1 << 20)
            yield stdout
            while stdout.read(1 << 20):  # what the block left (a tar's padding): no SIGPIPE for the command
                pass
        except BaseException:
            end_tree(child)
            stdout.close()
            child.wait()
            raise
        stdout.close()
        code = child.wait()
        if code != 0:
            err.seek(0)
            raise CommandFailed(argv, code, tail(err.read().decode(errors="replace")))


#: The interrupts (Ctrl-C, SIGTERM) that arrived under :func:`sigterm_as_interrupt`.
_ARRIVED: list[int] = []


def _interrupt(signum: int, frame: object) -> None:
    _ARRIVED.append(signum)
    raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """A batch scheduler's SIGTERM (time limit, scancel) unwinds like Ctrl-C: the partial build is removed. Both
    are also remembered, for :func:`raise_dropped_interrupt` (Ctrl-C only where Python's own handler has it).
    Re-entrant: a block inside another (a validation inside a create) keeps the outer one's handlers and what
    they remembered."""
    if signal.getsignal(signal.SIGTERM) is _interrupt:
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    ctrl_c = signal.getsignal(signal.SIGINT)
    if ctrl_c is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupt)
    _ARRIVED.clear()
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if ctrl_c is signal.default_int_handler:
            signal.signal(signal.SIGINT, ctrl_c)
        _ARRIVED.clear()


def raise_dropped_interrupt() -> None:
    """Raise again an interrupt that Python dropped: a KeyboardInterrupt raised while a weakref callback, a
    ``__del__`` or a fork hook runs is printed as "Exception ignored" and lost, and a create went on to succeed
    after its Ctrl-C (seen in CI). Called where a build is about to be put in place (``Transaction.swap``), which
    only a run that no interrupt has unwound reaches."""
    if _ARRIVED:
        raise KeyboardInterrupt
