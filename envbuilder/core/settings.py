"""Where envbuilder keeps things, decided in one place: its home and what lives in it (env records, mutexes, build
logs, lockfiles, the index cache, the torch arch lists read, pinned trust settings), where backups go, where the site config and the user's
recipes are found, and the package caches builds use (uv's, conda's). Pure: every answer comes from the
environment mapping the caller passes."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def home(env: Mapping[str, str]) -> Path:
    """Where records live: $ENVBUILDER_HOME, else $WORK/.envbuilder (not purged), else the XDG data home's
    ``envbuilder`` (``$XDG_DATA_HOME``, default ~/.local/share). An existing ~/.envbuilder (the home before the XDG
    one) is kept, so that nobody's records vanish: the CLI names it as the home's default
    (``core.config.resolve``'s ``legacy_home``, passed on as ENVBUILDER_HOME), since this function reads no disk."""
    if env.get("ENVBUILDER_HOME"):
        return Path(env["ENVBUILDER_HOME"])
    if env.get("WORK"):
        return Path(env["WORK"]) / ".envbuilder"
    return data_home(env)


def user_home(env: Mapping[str, str]) -> Path:
    return Path(env.get("HOME") or Path.home())


def _xdg(env: Mapping[str, str], var: str, default: str) -> Path:
    """An XDG base directory: the variable where it holds an absolute path (the spec ignores a relative one)."""
    given = env.get(var, "")
    return Path(given) if given.startswith("/") else user_home(env) / default


def data_home(env: Mapping[str, str]) -> Path:
    """envbuilder's directory in the XDG data home: $XDG_DATA_HOME/envbuilder, default ~/.local/share/envbuilder."""
    return _xdg(env, "XDG_DATA_HOME", ".local/share") / "envbuilder"


def legacy_home(env: Mapping[str, str]) -> Path:
    """The home before the XDG one, still used where it exists: ~/.envbuilder."""
    return user_home(env) / ".envbuilder"


def user_config(env: Mapping[str, str]) -> Path:
    """The user's config file: $XDG_CONFIG_HOME/envbuilder/config.toml, default ~/.config/envbuilder/config.toml."""
    return _xdg(env, "XDG_CONFIG_HOME", ".config") / "envbuilder" / "config.toml"


def records_dir(home: Path) -> Path:
    """One JSON record per env."""
    return home / "envs"


def mutex_dir(home: Path) -> Path:
    """The per-name mutexes (``fsutil.Mutex`` directories)."""
    return home / "locks"


def logs_dir(home: Path) -> Path:
    """Build logs."""
    return home / "logs"


def lockfiles_dir(home: Path) -> Path:
    """Where ``envbuilder lock NAME`` writes by default (beside the records: $WORK is not purged)."""
    return home / "lockfiles"


def index_cache_dir(home: Path) -> Path:
    """The wheel index pages read for plans, kept a day."""
    return home / "cache" / "index"


def torch_builds_cache(home: Path) -> Path:
    """The compiled GPU arch list of each torch wheel already read, one file per wheel content
    (backends/torcharch.py)."""
    return home / "cache" / "torch-builds"


def tool_versions_cache(home: Path) -> Path:
    """The installer versions learned from their programs (backends/toolversion.py)."""
    return home / "cache" / "tools.json"


def image_hashes_cache(home: Path) -> Path:
    """The sha256 of each container env's image file already read, kept with the file's identity and times
    (system/imagehash.py): doctor reads a multi-GB image once, not on every run."""
    return home / "cache" / "image-hashes.json"


def catalog_cache(home: Path) -> Path:
    """What the recipe catalog's scans learned from each file, so unchanged files are not parsed again."""
    return home / "cache" / "catalog.json"


def pythons_dir(home: Path) -> Path:
    """The uv-managed CPythons that envs with ``python.source = "managed"`` are made from (uv's install dir)."""
    return home / "pythons"


def trust_dir(home: Path) -> Path:
    """Registries' trust settings, pinned on first use (outside any registry, so its writers cannot change them)."""
    return home / "trust"


#: Where backups go instead of the default (``backup_root``).
BACKUP_ROOT_VAR = "ENVBUILDER_BACKUP_ROOT"


def backup_root(env: Mapping[str, str]) -> tuple[Path, str]:
    """Where backups go, and why: $ENVBUILDER_BACKUP_ROOT, else $WORK/envbuilder/backups (not purged), else
    the envbuilder home's ``backups`` (with $WORK unset, that is in $HOME: small, but not purged)."""
    if env.get(BACKUP_ROOT_VAR):
        return Path(env[BACKUP_ROOT_VAR]), BACKUP_ROOT_VAR
    if env.get("WORK"):
        return Path(env["WORK"]) / "envbuilder" / "backups", "$WORK"
    return home(env) / "backups", "$WORK is unset: the envbuilder home"


#: The user's recipe directories, colon-separated, searched before the site's and the built-in ones.
RECIPE_PATH_VAR = "ENVBUILDER_RECIPE_PATH"
#: A site config file to read instead of ``SITE_CONFIG``.
CONFIG_VAR = "ENVBUILDER_CONFIG"
#: The site config admins install (registries and their trust settings).
SITE_CONFIG = Path("/etc/envbuilder/config.toml")


#: The conda package cache the embedded engine uses (create sets it; a user may too).
CONDA_CACHE_VAR = "ENVBUILDER_CONDA_PKGS"

COMPILE_VAR = "ENVBUILDER_COMPILE_BYTECODE"
#: From how many usable CPUs uv compiles every module's bytecode as it installs.
COMPILE_MIN_CPUS = 8


def compiles_at_install(env: Mapping[str, str], cpus: int, imports_next: bool) -> tuple[bool, str]:
    """Whether uv writes all the bytecode while it installs, and why. On many CPUs that costs about a second (uv
    compiles in parallel; 1.4 s for a CUDA torch on 16 CPUs), where each process that imports torch otherwise
    compiles what it loads, one module after another: the smoke check or the validation's ranks (torch and
    torch._dynamo, some seconds each) that follow in the same command (``imports_next``). A command that imports
    nothing after (``--no-validate``) leaves it, as raw uv does, to the first import. On a few CPUs compiling all
    of torch costs more than it saves (pip compiles at install whatever the CPUs). ``ENVBUILDER_COMPILE_BYTECODE``
    1 or 0 decides instead."""
    given = env.get(COMPILE_VAR, "")
    if given in ("0", "1"):
        return given == "1", f"bytecode at install: {'yes' if given == '1' else 'no'} ({COMPILE_VAR}={given})"
    if not imports_next:
        return (
            False,
            "bytecode at install: no (nothing imports the env in this command; its first import writes it)",
        )
    yes = cpus >= COMPILE_MIN_CPUS
    return yes, (
        f"bytecode at install: {'yes' if yes else 'no'} ({cpus} usable CPUs; "
        f"{'at least' if yes else 'fewer than'} {COMPILE_MIN_CPUS})"
    )


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


#: What to do instead when the file system of each place says no (the hints of ``disk_places``).
BACKUP_WAY_OUT = f"back up elsewhere with --to DIR, or set {BACKUP_ROOT_VAR}"
HOME_WAY_OUT = "set ENVBUILDER_HOME to a writable directory with space (records, locks, caches)"
PREFIX_WAY_OUT = "build elsewhere with --prefix DIR"


def disk_places(env: Mapping[str, str]) -> tuple[tuple[Path, str], ...]:
    """Where envbuilder writes by default, each with the way out when its file system says no (read-only, full,
    over quota): the hint of a disk error under it (``fsutil.disk_error``)."""
    backups, _why = backup_root(env)
    places = [
        (backups, BACKUP_WAY_OUT),
        (home(env), HOME_WAY_OUT),
    ]
    if env.get("SCRATCH"):
        places.append((Path(env["SCRATCH"]), PREFIX_WAY_OUT))
    return tuple(places)
