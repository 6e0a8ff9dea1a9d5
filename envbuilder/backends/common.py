"""The parts of a build that touch the machine: tools, the uv cache, the build log, running one step.

``create`` (the orchestration) calls these in order; each is small enough to test alone with real tools.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path
from typing import IO, Any, Callable, Optional

from packaging.utils import canonicalize_name

from envbuilder import proc
from envbuilder.errors import BackendError, CommandFailed
from envbuilder.plan import expand
from envbuilder.plan.steps import InstallStep

PAYLOADS = Path(__file__).resolve().parent.parent / "payloads"

#: Characters that the virtualenv/venv activate templates and pip's script shebangs cannot carry safely.
_PLAIN_PATH = re.compile(r"[A-Za-z0-9._/+@%:,=~-]+")

#: errno values a file system gives when it has no working flock (Lustre mounted without -o flock, some NFS).
_NO_FLOCK = {errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK, errno.EINVAL, errno.EBADF}


# ---------------------------------------------------------------------------------------------------------------
# Build log: every command with its output, one file per create.


class BuildLog:
    """Appends every command, its output and its exit status to one file (and keeps the file's path)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: IO[str] = path.open("a", encoding="utf-8")
        path.chmod(0o600)  # commands and their output may name private paths

    def write(self, text: str) -> None:
        self._fh.write(text if text.endswith("\n") else text + "\n")
        self._fh.flush()

    def command(self, argv: Sequence[str], extra_env: Mapping[str, str], result: proc.Result) -> None:
        stamp = time.strftime("%H:%M:%S")
        for key, value in extra_env.items():
            self.write(f"[{stamp}]   {key}={value}")
        self.write(f"[{stamp}] + {proc.quote(argv)}  (exit {result.returncode})")
        for name, text in (("stdout", result.stdout), ("stderr", result.stderr)):
            if text.strip():
                self.write(f"--- {name}\n{text.rstrip()}")

    def close(self) -> None:
        self._fh.close()


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
    timeout: Optional[float] = None,
    cwd: Optional[str] = None,
) -> proc.Result:
    """Run one build command (through proc), log it, raise CommandFailed on a non-zero exit."""
    try:
        result = proc.run(argv, env=env, timeout=timeout, check=False, cwd=cwd, umask=build_umask())
    except FileNotFoundError:
        raise BackendError(
            f"{argv[0]} is not installed or not on PATH", hint="load the module that provides it"
        ) from None
    log.command(argv, extra_env or {}, result)
    if result.returncode != 0:
        raise CommandFailed(list(argv), result.returncode, proc.tail(result.stderr))
    return result


# ---------------------------------------------------------------------------------------------------------------
# Tools


def uv_binary() -> Optional[str]:
    """The uv that came with envbuilder (the ``uv`` PyPI package), else one on PATH."""
    with contextlib.suppress(ImportError, FileNotFoundError):
        from uv import find_uv_bin  # noqa: PLC0415 - optional: only the uv installer needs it

        return str(find_uv_bin())
    return shutil.which("uv")


def virtualenv_available() -> bool:
    return importlib.util.find_spec("virtualenv") is not None


@dataclass(frozen=True)
class InstallerChoice:
    name: str
    reason: str


def choose_installer(wanted: str, prefix: str, source: str) -> InstallerChoice:
    """The installer that will build the env, falling back where the wanted one cannot run here."""
    if wanted == "uv":
        if uv_binary():
            return InstallerChoice("uv", f"uv ({source})")
        wanted, source = "virtualenv", "uv is not installed"
    if wanted == "virtualenv" and not virtualenv_available():
        wanted, source = "pip", f"{source}; virtualenv is not installed"
    if not _PLAIN_PATH.fullmatch(prefix):
        raise BackendError(
            f"the {wanted} installer cannot build at {prefix!r}: its activate script and pip's script headers "
            "would carry the path unquoted",
            hint="use the uv installer (relocatable, quotes every path), or a prefix of letters, digits and ._/-",
        )
    return InstallerChoice(wanted, f"{wanted} ({source})")


def find_python(command: str, env: Mapping[str, str]) -> str:
    """The absolute path of the recipe's python, looked up on the PATH the modules give."""
    if os.sep in command:
        found = command if os.access(command, os.X_OK) else None
    else:
        found = shutil.which(command, path=env.get("PATH", ""))
    if not found:
        raise BackendError(
            f"python command {command!r} was not found on the PATH the recipe's modules give",
            hint="check python.command and modules.load in the recipe (envbuilder recipes show NAME --explain)",
        )
    return found


def python_info(python: str, env: Mapping[str, str], log: BuildLog) -> dict[str, Any]:
    """What an interpreter says about itself: version, prefix, base prefix, site-packages."""
    code = (
        "import json, site, sys; print(json.dumps({'version': '%d.%d.%d' % sys.version_info[:3], "
        "'prefix': sys.prefix, 'base_prefix': sys.base_prefix, 'site_packages': site.getsitepackages()}))"
    )
    res = run_logged([python, "-c", code], env, log)
    data: dict[str, Any] = json.loads(res.stdout)
    return data


def parent_site_pth(env_site: Path, parent: Mapping[str, Any]) -> Optional[Path]:
    """When the base python is itself a venv, --system-site-packages reaches its *base*, not the venv: a .pth
    adds the parent venv's site-packages after the env's own (so the env's packages still win)."""
    if parent["prefix"] == parent["base_prefix"]:
        return None
    pth = env_site / "_envbuilder_parent_env.pth"
    pth.write_text("".join(f"{p}\n" for p in parent["site_packages"]), encoding="utf-8")
    return pth


# ---------------------------------------------------------------------------------------------------------------
# uv cache: where, which link mode, and whether flock works there


@dataclass(frozen=True)
class UvSettings:
    cache_dir: Optional[str]
    link_mode: str
    reasons: tuple[str, ...]

    def env(self) -> dict[str, str]:
        out = {"UV_LINK_MODE": self.link_mode, "UV_PYTHON_DOWNLOADS": "never", "UV_NO_CONFIG": "1"}
        if self.cache_dir:
            out["UV_CACHE_DIR"] = self.cache_dir
        return out


def flock_works(directory: Path) -> bool:
    """Whether flock works in ``directory`` (uv locks its cache with it)."""
    directory.mkdir(parents=True, exist_ok=True)
    probe = directory / ".envbuilder-flock-probe"
    try:
        with probe.open("a", encoding="utf-8") as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
    except OSError as exc:
        if exc.errno in _NO_FLOCK:
            return False
        raise
    return True


def _device(path: Path) -> Optional[int]:
    for candidate in (path, *path.parents):
        with contextlib.suppress(OSError):
            return candidate.stat().st_dev
    return None


def uv_settings(
    prefix: Path,
    env: Mapping[str, str],
    flock_probe: Callable[[Path], bool] = flock_works,
) -> UvSettings:
    """Choose the uv cache and link mode for an env at ``prefix``, deliberately, and say why."""
    reasons: list[str] = []
    if env.get("UV_CACHE_DIR"):
        cache = Path(env["UV_CACHE_DIR"])
        reasons.append(f"uv cache {cache} (UV_CACHE_DIR)")
    elif env.get("ENVBUILDER_UV_CACHE"):
        cache = Path(env["ENVBUILDER_UV_CACHE"])
        reasons.append(f"uv cache {cache} (ENVBUILDER_UV_CACHE)")
    elif env.get("SCRATCH"):
        # Beside the envs: same file system, so uv can hardlink instead of copying gigabytes of CUDA libraries,
        # and the cache does not eat the small $HOME quota.
        cache = Path(env["SCRATCH"]) / "envbuilder" / "uv-cache"
        reasons.append(f"uv cache {cache} (on $SCRATCH, beside the envs)")
    else:
        cache = Path(env.get("HOME") or Path.home()) / ".cache" / "uv"
        reasons.append(f"uv cache {cache} (uv's default; $SCRATCH is unset)")
    if not flock_probe(cache):
        local = Path(env.get("TMPDIR") or tempfile.gettempdir()) / f"envbuilder-uv-cache-{os.getuid()}"
        reasons.append(
            f"flock does not work in {cache} (Lustre or NFS without locking): using {local} on a local disk instead"
        )
        cache = local
        local.mkdir(mode=0o700, parents=True, exist_ok=True)
    if env.get("UV_LINK_MODE"):
        mode = env["UV_LINK_MODE"]
        reasons.append(f"link mode {mode} (UV_LINK_MODE)")
    elif _device(cache) == _device(prefix.parent):
        mode = "hardlink"
        reasons.append("link mode hardlink: cache and env share a file system (no copies, no extra space)")
    else:
        mode = "copy"
        reasons.append("link mode copy: cache and env are on different file systems (hardlinks cannot cross)")
    return UvSettings(str(cache), mode, tuple(reasons))


# ---------------------------------------------------------------------------------------------------------------
# Steps


def rebase(argv: Sequence[str], old: str, new: str) -> list[str]:
    """``argv`` with the path ``old`` (and anything under it) moved to ``new``; other arguments untouched."""
    out = []
    for arg in argv:
        if arg == old:
            out.append(new)
        elif arg.startswith(old + "/"):
            out.append(new + arg[len(old) :])
        else:
            out.append(arg)
    return out


def step_argv(step: InstallStep, python: str, uv: Optional[str], prefix: str, build: str) -> list[str]:
    """The argv that runs ``step`` in the build directory with the resolved tools."""
    argv = list(step.argv)
    if step.site_python:
        at = argv.index("--python") + 1 if "--python" in argv else 0
        argv[at] = python
    argv = rebase(argv, prefix, build)
    if argv[0] == "uv" and uv:
        argv[0] = uv
    elif argv[0] == "virtualenv":
        argv[:1] = [sys.executable, "-m", "virtualenv"]
    return argv


def step_env(step: InstallStep, env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """The step's variables with ${VAR} expanded from the build environment; (full env, the step's own)."""
    own: dict[str, str] = {}
    for key, raw in step.env.items():
        value, missing = expand(raw, {**env, **own}, "")
        if missing:
            raise BackendError(
                f"build variable {key}={raw!r} needs {', '.join('$' + m for m in missing)}, which the recipe's "
                "modules do not set",
                hint="add the module that sets it to the package's build_modules or to modules.load",
            )
        own[key] = value
    return {**env, **own}, own


def relocate_scripts(build: Path, final: Path) -> list[str]:
    """After a virtualenv/pip build beside the prefix: rewrite the build path to the final one in the files
    that carry it (activate scripts, script headers, pyvenv.cfg). Paths are plain (choose_installer checks)."""
    old, new = str(build), str(final)
    changed = []
    candidates = [build / "pyvenv.cfg", *sorted((build / "bin").iterdir())]
    for path in candidates:
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        if old.encode() not in data or b"\0" in data[:4096]:
            continue
        path.write_bytes(data.replace(old.encode(), new.encode()))
        changed.append(path.name)
    return changed


def inventory(prefix: Path) -> list[dict[str, Any]]:
    """The distributions installed in the env (read from its dist-info directories): name, version, installer,
    the sha256 of the RECORD file (a fingerprint of exactly what was installed) and the bytes RECORD lists."""
    found: dict[str, dict[str, Any]] = {}
    for info in sorted(prefix.glob("lib/python*/site-packages/*.dist-info")):
        meta = HeaderParser().parsestr(read_text(info / "METADATA"))
        name = meta.get("Name")
        if not name:
            continue
        record = read_text(info / "RECORD")
        size = 0
        for line in record.splitlines():
            last = line.rsplit(",", 1)[-1]
            size += int(last) if last.isdigit() else 0
        found[canonicalize_name(name)] = {
            "name": name,
            "version": meta.get("Version", "?"),
            "installer": read_text(info / "INSTALLER").strip() or None,
            "in_env": True,
            "record_sha256": hashlib.sha256(record.encode()).hexdigest() if record else None,
            "size": size,
        }
    return sorted(found.values(), key=lambda d: str(d["name"]).lower())


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


@contextlib.contextmanager
def removing_on_failure(path: Path) -> Iterator[None]:
    """Remove ``path`` if the block fails in any way (Ctrl-C and SIGTERM included)."""
    try:
        yield
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise


def drop_world_write(root: Path) -> list[str]:
    """Remove the world-write bit everywhere under ``root`` (uv sets its venv ``.lock`` to 0666 itself). ``find`` does
    the walk: a torch env holds some 17,000 files, and find is six times faster than a Python walk."""
    res = proc.run(["find", str(root), "-perm", "-0002", "!", "-type", "l", "-print0"])
    fixed = []
    for name in filter(None, res.stdout.split("\0")):
        path = Path(name)
        path.chmod(path.stat().st_mode & 0o7775)
        fixed.append(str(path.relative_to(root)))
    return fixed
