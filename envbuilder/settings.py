"""Where envbuilder keeps things, decided in one place: its home (records, locks, caches, logs) and the package
caches builds use (uv's, conda's)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def home(env: Mapping[str, str]) -> Path:
    """Where records live: $ENVBUILDER_HOME, else $WORK/.envbuilder (not purged), else ~/.envbuilder."""
    if env.get("ENVBUILDER_HOME"):
        return Path(env["ENVBUILDER_HOME"])
    if env.get("WORK"):
        return Path(env["WORK"]) / ".envbuilder"
    return Path(env.get("HOME") or Path.home()) / ".envbuilder"


#: The conda package cache the embedded engine uses (create sets it; a user may too).
CONDA_CACHE_VAR = "ENVBUILDER_CONDA_PKGS"


def uv_cache(env: Mapping[str, str]) -> tuple[Path, str]:
    """Where uv caches packages for a build, and why there (the uv settings move it where flock fails)."""
    for var in ("UV_CACHE_DIR", "ENVBUILDER_UV_CACHE"):
        if env.get(var):
            return Path(env[var]), f"uv cache {Path(env[var])} ({var})"
    if env.get("SCRATCH"):
        # Beside the envs: same file system, so uv can hardlink instead of copying gigabytes of CUDA libraries,
        # and the cache does not eat the small $HOME quota.
        cache = Path(env["SCRATCH"]) / "envbuilder" / "uv-cache"
        return cache, f"uv cache {cache} (on $SCRATCH, beside the envs)"
    cache = Path(env.get("HOME") or Path.home()) / ".cache" / "uv"
    return cache, f"uv cache {cache} (uv's default; $SCRATCH is unset)"


def conda_cache(env: Mapping[str, str]) -> Path:
    """Where conda packages are cached: beside the envs on $SCRATCH (hardlinks, no $HOME quota), else ~/.cache."""
    if env.get(CONDA_CACHE_VAR):
        return Path(env[CONDA_CACHE_VAR])
    if env.get("SCRATCH"):
        return Path(env["SCRATCH"]) / "envbuilder" / "conda-pkgs"
    return Path(env.get("HOME") or Path.home()) / ".cache" / "envbuilder" / "conda-pkgs"
