"""The one place that starts subprocesses.

argv lists only (never a shell string), a scrubbed environment, a timeout that kills the whole process group,
and the tail of stderr kept for the error message.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import logging
import os
import shlex
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, Optional, cast

from envbuilder.errors import CommandFailed

log = logging.getLogger("envbuilder.proc")

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
    argv: Sequence[str], env: Optional[Mapping[str, str]], umask: int, **popen: Any
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
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - async-signal-safe: sigmask and prctl calls
            umask=umask,
            **popen,
        )
    except BaseException:
        _release_signals(mask)
        raise
    return child, mask


def _die_with_parent() -> None:
    """In the child, before exec: take Ctrl-C and SIGTERM again (the parent held them for the fork), and be
    killed when envbuilder dies, even by SIGKILL (Linux prctl PR_SET_PDEATHSIG). Otherwise an installer in its
    own session would go on writing into a build directory that the next run has already cleared."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELD)
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _find_prctl() -> Optional[Callable[..., int]]:
    # Looked up once in the parent: the child, between fork and exec, only makes the call.
    try:
        return cast(Callable[..., int], ctypes.CDLL(None).prctl)
    except (OSError, AttributeError):  # not Linux
        return None


_PRCTL = _find_prctl()


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
) -> Result:
    """Run ``argv`` and capture its output.

    ``env`` is used as given (callers build it with :func:`scrubbed_env`); None means a scrubbed os.environ.
    On timeout the whole process group is killed and CommandFailed is raised with returncode 124.
    """
    if isinstance(argv, str):  # defensive: a shell string must never get here
        raise TypeError("proc.run takes an argv list, not a string")
    argv = [os.fspath(a) for a in argv]
    log.debug("+ %s", quote(argv))
    proc, mask = _start(
        argv,
        env,
        umask,
        cwd=cwd,
        stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _release_signals(mask)  # a Ctrl-C held during the fork is raised here, and kills the child below
        out, err = proc.communicate(input=input_text, timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        raise CommandFailed(argv, 124, tail(err) + f"\n(timed out after {timeout:g} s)") from None
    except BaseException:
        _kill_group(proc)
        proc.wait()
        raise
    result = Result(tuple(argv), proc.returncode, out, err)
    if check and proc.returncode != 0:
        raise CommandFailed(argv, proc.returncode, tail(err))
    return result


def describe_status(returncode: int) -> str:
    """``exit status N``, or the signal's name for a negative status (a crash or a kill)."""
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-returncode).name}"
    return f"exit status {returncode}"


def _kill_group(proc: subprocess.Popen[Any]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


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
            _kill_group(child)
            with contextlib.suppress(OSError):
                stdin.close()
            child.wait()
            raise
        code = child.wait()
        if code != 0:
            err.seek(0)
            raise CommandFailed(argv, code, tail(err.read().decode(errors="replace")))


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """A batch scheduler's SIGTERM (time limit, scancel) unwinds like Ctrl-C: the partial build is removed."""

    def raise_interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
