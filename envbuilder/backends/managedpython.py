"""The uv-managed CPython of an env whose recipe says ``python.source = "managed"``: found in the envbuilder
home's ``pythons`` directory, else installed there by ``uv python install`` first. uv is told to look nowhere
else (only managed Pythons, that directory, no config file, no shims on PATH) and to download from where the
mirror rules send it (``resolver.mirror.python_downloads``). Offline (ENVBUILDER_OFFLINE) with no Python mirror,
nothing is downloaded: the python must be there already. create and restore both ask :func:`interpreter`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Callable, Optional

from envbuilder.backends import installers, network
from envbuilder.backends.buildlog import BuildLog, run_logged
from envbuilder.core import settings
from envbuilder.core.errors import BackendError, CommandFailed
from envbuilder.core.records import RecordedPython
from envbuilder.plan import interpreter as planned
from envbuilder.resolver import indexread, mirror
from envbuilder.system import proc

#: The versions a recipe's python.version may hold (its schema's pattern).
_VERSION = re.compile(r"\d+\.\d+(\.\d+)?")


def interpreter(
    recorded: RecordedPython, env: Mapping[str, str], log: BuildLog, say: Callable[[str], None]
) -> Optional[str]:
    """The path of the managed CPython a plan (or a record) asks for, installed first where missing; None where
    the plan's python is the site's. ``env``: the environment envbuilder runs in (its settings)."""
    if recorded.get("origin") != planned.MANAGED:
        return None
    version = _version(recorded, env)
    where = settings.pythons_dir(settings.home(env))
    downloads = mirror.python_downloads(env)
    offline = indexread.offline_reason(env)
    uv_env = _uv_env(env, where, downloads, offline_only=bool(offline and not downloads.mirror))
    uv = _uv()
    found = _find(uv, version, uv_env, log)
    if found:
        log.write(f"managed python: CPython {version} found in {where}: {found}")
        return found
    if offline and not downloads.mirror:
        raise BackendError(
            f"CPython {version} is not installed in {where}, and {offline} forbids downloading it",
            hint=f"set {mirror.PYTHON_VAR} (setting python_mirror) to a mirror of python-build-standalone's "
            f"releases this node can reach (a URL or a directory), or unset {indexread.OFFLINE_VAR}",
        )
    say(f"installing CPython {version} (uv-managed) into {where}, from {downloads.shown}")
    log.write(f"managed python: CPython {version} is not in {where}; downloading from {downloads.shown}")
    _install(uv, version, uv_env, log, downloads)
    found = _find(uv, version, uv_env, log)
    if not found:
        raise BackendError(
            f"uv installed CPython {version} into {where}, but cannot find it there",
            hint=f"see the build log; `uv python list` with UV_PYTHON_INSTALL_DIR={where} shows what is there",
        )
    return found


def _version(recorded: RecordedPython, env: Mapping[str, str]) -> str:
    """The version asked for, where it is a version (a record is JSON anyone may edit: uv gets a version or
    nothing) and the site allows managed Pythons."""
    version = (recorded.get("managed") or {}).get("version") or recorded.get("version") or ""
    if not _VERSION.fullmatch(version):
        raise BackendError(
            f"the env's record asks for a managed CPython of version {version!r}, which is not X.Y or X.Y.Z",
            hint="rebuild the env from its recipe: envbuilder create NAME --force",
        )
    if not planned.allowed(env):
        raise BackendError(
            f"the env's python is a uv-managed CPython {version}, which this site does not allow "
            f"(managed_python is off: {planned.ALLOW_VAR}={env.get(planned.ALLOW_VAR)})",
            hint="build it from the site's python instead (drop python.source from its recipe)",
        )
    return version


def _uv() -> str:
    uv = installers.uv_binary()
    if uv is None:
        raise BackendError(
            "a managed python is installed by uv, which is not here",
            hint="pip install uv (or load its module)",
        )
    return uv


def _uv_env(
    env: Mapping[str, str], where: Path, downloads: mirror.PythonDownloads, *, offline_only: bool
) -> dict[str, str]:
    """uv's settings: this directory's managed Pythons only, downloads only when asked, from the mirror."""
    out = proc.scrubbed_env(env)
    out.update(
        {
            "UV_PYTHON_INSTALL_DIR": str(where),
            "UV_PYTHON_PREFERENCE": "only-managed",
            "UV_PYTHON_DOWNLOADS": "manual",
            "UV_PYTHON_INSTALL_BIN": "0",
            "UV_PYTHON_INSTALL_REGISTRY": "0",
            "UV_NO_CONFIG": "1",
        }
    )
    if downloads.mirror:
        out["UV_PYTHON_INSTALL_MIRROR"] = downloads.mirror
    listing = env.get(planned.DOWNLOADS_JSON_VAR, "").strip()
    if listing:
        out["UV_PYTHON_DOWNLOADS_JSON_URL"] = listing
    if offline_only:
        out["UV_OFFLINE"] = "1"
    return out


def _find(uv: str, version: str, env: Mapping[str, str], log: BuildLog) -> Optional[str]:
    """The installed managed CPython ``version``'s interpreter (uv's minor-version link, which a patch upgrade
    keeps), or None where none is."""
    try:
        res = run_logged([uv, "python", "find", "--no-project", version], env, log)
    except CommandFailed:
        return None
    path = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""
    where = Path(env["UV_PYTHON_INSTALL_DIR"]).resolve()
    return path if path and where in Path(path).resolve().parents else None


def _install(
    uv: str, version: str, env: Mapping[str, str], log: BuildLog, downloads: mirror.PythonDownloads
) -> None:
    try:
        run_logged([uv, "python", "install", "--no-bin", version], env, log)
    except CommandFailed as exc:
        upstream = downloads.mirror or mirror.PYTHON_UPSTREAMS[0]
        failed = network.network_error(exc, [upstream])
        if failed is not None:
            failed.hint = (
                f"this node cannot download Pythons from {upstream}: set {mirror.PYTHON_VAR} (setting "
                "python_mirror) to a mirror of python-build-standalone's releases it can reach (a URL, or a "
                "directory holding <release>/<file>), or install the python where it can and copy "
                f"{env['UV_PYTHON_INSTALL_DIR']} here"
            )
            raise failed from None
        raise
