"""The one error tree. Every foreseeable failure is an EnvbuilderError subclass with its own exit code.

Only the CLI catches these (one red line, one ``hint:`` line); library code raises and never exits.
The exit codes are part of the public contract and are listed in the README.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, Optional

# Exit codes shared with the CLI. 1 is reserved for unexpected internal errors, 2 for usage errors
# (argparse's own convention), 130 for Ctrl-C, 141 for output whose reader left (as a shell reports SIGPIPE).
EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_PIPE = 141


def did_you_mean(word: str, choices: Iterable[str], n: int = 1, cutoff: float = 0.6) -> Optional[str]:
    """The "did you mean" hint every error family uses, or None when nothing is close."""
    import difflib  # noqa: PLC0415 - only a slip needs it, not every start

    close = difflib.get_close_matches(word, list(choices), n=n, cutoff=cutoff)
    return "did you mean " + " or ".join(repr(c) for c in close) + "?" if close else None


class EnvbuilderError(Exception):
    """Base of every foreseeable failure."""

    exit_code: ClassVar[int] = EXIT_INTERNAL
    family: ClassVar[str] = "error"

    def __init__(self, message: str, *, hint: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        #: What the command had done when it failed (a partial result): ``data`` of the ``--json`` envelope.
        self.data: Optional[Mapping[str, Any]] = None

    def to_json(self) -> dict[str, Any]:
        return {
            "type": type(self).__name__,
            "family": self.family,
            "exit_code": self.exit_code,
            "message": self.message,
            "hint": self.hint,
        }


class UsageError(EnvbuilderError):
    """The command line itself is wrong (unknown option value, conflicting flags)."""

    exit_code = EXIT_USAGE
    family = "usage"


class RecipeError(EnvbuilderError):
    """A recipe file is missing, unreadable, or does not match the schema."""

    exit_code = 3
    family = "recipe"

    def __init__(
        self,
        message: str,
        *,
        file: Optional[str] = None,
        key: Optional[str] = None,
        hint: Optional[str] = None,
    ) -> None:
        where = ""
        if file and key:
            where = f"{file}: {key}: "
        elif file:
            where = f"{file}: "
        elif key:
            where = f"{key}: "
        super().__init__(where + message, hint=hint)
        self.file = file
        self.key = key

    def to_json(self) -> dict[str, Any]:
        data = super().to_json()
        data.update(file=self.file, key=self.key)
        return data


class RecipeNotFound(RecipeError):
    """No recipe of that name on the search path."""


class ResolverError(EnvbuilderError):
    """A wheel-index gate failed: this torch/CUDA combination cannot work on the target machine."""

    exit_code = 4
    family = "resolver"

    def __init__(self, message: str, *, gate: str, hint: Optional[str] = None) -> None:
        super().__init__(message, hint=hint)
        self.gate = gate

    def to_json(self) -> dict[str, Any]:
        data = super().to_json()
        data["gate"] = self.gate
        return data


class ResolverErrors(ResolverError):
    """Several gates failed at once; reported together so the user fixes them in one go."""

    def __init__(self, errors: Sequence[ResolverError]) -> None:
        first = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        super().__init__(first.message + more, gate=first.gate, hint=first.hint)
        self.errors = list(errors)


class HostProbeError(EnvbuilderError):
    """Host facts could not be read (a --facts file that is not valid JSON, say)."""

    exit_code = 5
    family = "host"


class ModuleSystemError(EnvbuilderError):
    """The module system refused a load (unknown module, conflict, missing prerequisite)."""

    exit_code = 6
    family = "modules"


class BackendError(EnvbuilderError):
    """An environment backend (venv, conda, user-prefix) could not build the environment."""

    exit_code = 7
    family = "backend"


class ValidationFailed(EnvbuilderError):
    """The environment was built but a validation check failed."""

    exit_code = 8
    family = "validation"


class StateError(EnvbuilderError):
    """Env records, a mutex held by another envbuilder, or an existing target prefix stand in the way."""

    exit_code = 9
    family = "state"


class EnvNotFound(StateError):
    """No env of that name is recorded."""


class UnsafePath(StateError):
    """A directory envbuilder would use, create under, or tell a user to source from can be written by someone
    else (another user's, or group- or world-writable without the sticky bit): ssh's StrictModes, for envs."""

    def __init__(self, message: str, *, path: str, hint: Optional[str] = None) -> None:
        super().__init__(message, hint=hint)
        self.path = path

    def to_json(self) -> dict[str, Any]:
        data = super().to_json()
        data["path"] = self.path
        return data


class PublishError(EnvbuilderError):
    """Publishing or verifying a registry recipe failed."""

    exit_code = 10
    family = "publish"


class BackupError(EnvbuilderError):
    """A backup could not be written, verified or restored (corrupt, missing, no space, refused)."""

    exit_code = 12
    family = "backup"


class LockError(EnvbuilderError):
    """A lockfile is unreadable, stale for its recipe, lacks the target platform, or could not be resolved."""

    exit_code = 13
    family = "lock"


class DoctorFindings(EnvbuilderError):
    """``envbuilder doctor`` found something that needs action (warnings alone exit 0)."""

    exit_code = 14
    family = "doctor"


class ImpactBreaks(EnvbuilderError):
    """``envbuilder impact`` found a recipe or a shared env that the planned change breaks."""

    exit_code = 16
    family = "impact"


class DiskError(EnvbuilderError):
    """The file system said no: read-only, full, over quota, missing, or not permitted. Carries the path, the
    errno in words and what to do (another ``--to``, ``ENVBUILDER_HOME``, ``ENVBUILDER_BACKUP_ROOT``, free space)."""

    exit_code = 15
    family = "disk"

    def __init__(
        self, message: str, *, path: str, errno: Optional[int] = None, hint: Optional[str] = None
    ) -> None:
        super().__init__(message, hint=hint)
        self.path = path
        self.errno = errno

    def to_json(self) -> dict[str, Any]:
        data = super().to_json()
        data.update(path=self.path, errno=self.errno)
        return data


class CommandFailed(EnvbuilderError):
    """An external command exited non-zero; carries its argv, status and the tail of its stderr."""

    exit_code = 11
    family = "command"

    def __init__(
        self,
        argv: Sequence[str],
        returncode: int,
        stderr_tail: str = "",
        *,
        hint: Optional[str] = None,
    ) -> None:
        shown = " ".join(shlex.quote(a) for a in argv)
        message = f"command failed with exit status {returncode}: {shown}"
        if stderr_tail.strip():
            message += "\n" + stderr_tail.rstrip()
        super().__init__(message, hint=hint)
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr_tail = stderr_tail

    def to_json(self) -> dict[str, Any]:
        data = super().to_json()
        data.update(argv=self.argv, returncode=self.returncode)
        return data


class NetworkError(CommandFailed):
    """An installer (uv, pip, conda) could not reach an index or channel: the URL, the cause in words, and the way
    out (a mirror or wheelhouse through ENVBUILDER_INDEX_MIRROR, a backup) in the hint. Exit 11, as any command that
    failed; its stderr tail stays in the record and the build log."""

    def __init__(
        self,
        argv: Sequence[str],
        returncode: int,
        stderr_tail: str,
        *,
        url: str,
        cause: str,
        said: str = "",
        hint: Optional[str] = None,
    ) -> None:
        super().__init__(argv, returncode, stderr_tail, hint=hint)
        program = argv[0].rsplit("/", 1)[-1] if argv else "the installer"
        self.message = f"{program} could not reach {url}: {cause}" + (
            f" ({program} said: {said})" if said else ""
        )
        self.args = (self.message,)
        self.url = url
        self.cause = cause

    def to_json(self) -> dict[str, Any]:
        data = super().to_json()
        data.update(url=self.url, cause=self.cause)
        return data


#: Every family, for the README table and its test.
FAMILIES: tuple[type[EnvbuilderError], ...] = (
    UsageError,
    RecipeError,
    ResolverError,
    HostProbeError,
    ModuleSystemError,
    BackendError,
    ValidationFailed,
    StateError,
    PublishError,
    CommandFailed,
    BackupError,
    LockError,
    DoctorFindings,
    DiskError,
)
