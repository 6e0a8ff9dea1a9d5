"""uv's settings for a build: its cache (``settings.uv_cache``, moved to a local disk where flock fails, since uv
locks its cache with it), the link mode that cache allows, and no downloaded pythons or stray uv.toml."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Callable, Optional

from envbuilder.core import settings
from envbuilder.core.structs import dataclass

#: errno values a file system gives when it has no working flock (Lustre mounted without -o flock, some NFS).
_NO_FLOCK = {errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK, errno.EINVAL, errno.EBADF}


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
    cache, why = settings.uv_cache(env)
    reasons = [why]
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
