"""The doctor's I/O: records, recipes, locks, library directories, the env's python, backups and index pages,
read before any check runs so that the checks stay pure and can be run on another node's facts."""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Optional

from envbuilder import backup, lockfile
from envbuilder.core import containers, kinds, settings
from envbuilder.core.errors import CommandFailed, EnvbuilderError, StateError
from envbuilder.doctor.container import ImageState
from envbuilder.doctor.findings import ACTION, Finding
from envbuilder.doctor.replan import PythonState
from envbuilder.doctor.report import EnvInputs
from envbuilder.plan import container
from envbuilder.recipe import loader
from envbuilder.recipe.catalog import Catalog, find_lock
from envbuilder.recipe.loader import Recipe
from envbuilder.resolver.indexfacts import IndexFacts
from envbuilder.scale import image
from envbuilder.system import imagehash, proc, purge, state
from envbuilder.system.state import EnvRecord

#: What a python prints of itself (doctor's start of an env's python).
VERSION_CODE = "import sys; print('%d.%d.%d' % sys.version_info[:3])"
#: How long a container env's python may take to start inside its image (the runtime mounts the image first).
IMAGE_PYTHON_TIMEOUT_S = 120


def listdir(path: str) -> list[str]:
    """A directory's entries; nothing for one that is missing or unreadable (a stale LD_LIBRARY_PATH entry)."""
    try:
        return sorted(p.name for p in Path(path).iterdir())
    except OSError:
        return []


def read_records(home: Path, names: Sequence[str], explicit: bool) -> tuple[list[EnvRecord], list[Finding]]:
    """The records to check. A name asked for that is not recorded raises StateError (as `show` does); an
    unreadable record among all of them is a finding, so one bad file does not hide the others."""
    records, findings = [], []
    for name in names:
        try:
            records.append(state.load(home, name))
        except StateError as exc:
            if explicit:
                raise
            findings.append(Finding(ACTION, name, "record", exc.message, exc.hint or ""))
    return records, findings


def env_lib_dirs(record: EnvRecord) -> tuple[str, ...]:
    """Where the env keeps its own CUDA libraries: the wheels' nvidia/*/lib and torch/lib, and a conda env's lib."""
    prefix = Path(record.prefix)
    dirs = []
    for site in sorted(prefix.glob("lib/python*/site-packages")):
        dirs += sorted(str(d) for d in site.glob("nvidia/*/lib") if d.is_dir())
        if (site / "torch" / "lib").is_dir():
            dirs.append(str(site / "torch" / "lib"))
    if kinds.kind_info(record.kind).conda and (prefix / "lib").is_dir():
        dirs.append(str(prefix / "lib"))
    return tuple(dirs)


def _module_env(record: EnvRecord, env: Mapping[str, str]) -> dict[str, str]:
    """``env`` scrubbed, with the changes the env's modules made to it at build time."""
    modules = record.modules or {}
    run_env = proc.scrubbed_env(env)
    run_env.update({str(k): str(v) for k, v in (modules.get("delta_set") or {}).items()})
    for var in modules.get("delta_unset") or []:
        run_env.pop(var, None)
    return run_env


def image_state(record: EnvRecord, env: Mapping[str, str], home: Path) -> Optional[ImageState]:
    """A container env's image file (its sha256 now, read once per change of the file) and its runtime on the
    PATH its modules give; None for other kinds, and for an env whose image is gone (health says so)."""
    if not kinds.kind_info(record.kind).container:
        return None
    tools = record.tools or {}
    runtime = str(tools.get("runtime") or ((record.plan or {}).get("container") or {}).get("runtime") or "")
    path = Path(record.prefix) / str(tools.get("image_file") or "image.sif")
    if not path.is_file():
        return None
    sha, problem = "", ""
    try:
        sha = imagehash.cached_sha256(path, settings.image_hashes_cache(home))
    except OSError as exc:
        problem = exc.strerror or str(exc)
    run_env = _module_env(record, env)
    search = run_env.get("PATH", "")
    program = containers.runtime(runtime).program if runtime in containers.RUNTIMES else runtime
    found = shutil.which(program, path=search) if program else None
    read = ImageState(
        str(path), str(tools.get("image_sha256") or ""), sha, problem, runtime or "?", found or "", search
    )
    if found and sha and sha == read.recorded:  # the python of the image that was built, through its runtime
        return _python_inside(record, read, run_env)
    return read


def _python_inside(record: EnvRecord, read: ImageState, run_env: Mapping[str, str]) -> ImageState:
    """``read`` with what the python a container env's programs run said when started inside its image."""
    box = (record.plan or {}).get("container") or {}
    python = container.box_python(box)
    argv = [*container.exec_prefix(box, read.path, gpu=False), python, "-c", VERSION_CODE]
    argv[0] = read.runtime_path
    try:
        res = proc.run(argv, env=run_env, timeout=IMAGE_PYTHON_TIMEOUT_S, check=False)
    except (OSError, CommandFailed) as exc:
        return replace(read, python=python, python_ok=False, python_said=str(exc).strip()[-300:])
    if res.returncode != 0:
        said = proc.tail(res.stderr or res.stdout, 3).strip() or proc.describe_status(res.returncode)
        return replace(read, python=python, python_ok=False, python_said=said)
    return replace(read, python=python, python_ok=True, python_said=res.stdout.strip().splitlines()[-1])


def python_state(record: EnvRecord, env: Mapping[str, str]) -> PythonState:
    """Whether the interpreter the env was built from still exists, and whether the env's python starts (with
    the environment its modules gave the build)."""
    tools = record.tools or {}
    base = str(tools.get("python_path") or "")
    python = str(Path(record.prefix) / "bin" / "python") if kinds.kind_info(record.kind).own_python else base
    exists = bool(base) and Path(base).exists()
    if not Path(record.prefix).is_dir() or (base and not exists):
        return PythonState(base, exists, python)
    run_env = _module_env(record, env)
    argv = [python, "-c", VERSION_CODE]
    try:
        res = proc.run(argv, env=run_env, timeout=60, check=False)
    except (OSError, CommandFailed) as exc:
        return PythonState(base, exists, python, False, str(exc).strip()[-300:])
    if res.returncode != 0:
        said = proc.tail(res.stderr or res.stdout, 3).strip() or proc.describe_status(res.returncode)
        return PythonState(base, exists, python, False, said)
    return PythonState(base, exists, python, True, res.stdout.strip())


def load_recipe(record: EnvRecord, catalog: Catalog) -> tuple[Optional[Recipe], Optional[EnvbuilderError]]:
    """The recipe the env was built from (its published version where it came from a registry)."""
    version = str((record.plan or {}).get("recipe_version") or "")
    ref = f"{record.recipe}@{version}" if version else record.recipe
    try:
        return loader.load(ref, catalog), None
    except EnvbuilderError as exc:
        return None, exc


def gather(
    record: EnvRecord, catalog: Catalog, env: Mapping[str, str], backup_root: Path, home: Path
) -> EnvInputs:
    recipe, recipe_error = load_recipe(record, catalog)
    container = kinds.kind_info(record.kind).container
    fresh = image.freshness(record)
    lock: Optional[lockfile.Lock] = None
    lock_error: Optional[EnvbuilderError] = None
    if recipe is not None:
        try:
            lock = find_lock(recipe, catalog, env)
        except EnvbuilderError as exc:
            lock_error = exc
    return EnvInputs(
        record=record,
        recipe=recipe,
        recipe_error=recipe_error,
        # A container env's python is the image's, run through its runtime: its own checks stand for this one.
        python=PythonState("", False, "") if container else python_state(record, env),
        container=image_state(record, env, home) if container else None,
        health=state.health(record),
        purge=purge.status(record),
        backups=tuple(b.id for b in backup.backups(backup_root, record.name) if not b.error),
        lib_dirs=env_lib_dirs(record),
        lock=lock,
        lock_error=lock_error,
        image=(fresh.status, fresh.detail),
    )


def read_indexes(
    torch_urls: Sequence[str],
    lock_urls: Mapping[str, Sequence[str]],
    env: Mapping[str, str],
    home: Path,
    *,
    offline: bool,
    refresh: bool,
) -> dict[str, IndexFacts]:
    """One read per project (each reads its pages in parallel, through the mirrors, cached a day)."""
    from envbuilder.resolver import indexread  # noqa: PLC0415 - urllib and threads only when an index is read

    wanted: dict[str, list[str]] = {"torch": list(torch_urls)}
    for project, urls in lock_urls.items():
        wanted.setdefault(project, []).extend(urls)
    return {
        project: indexread.read(
            list(dict.fromkeys(urls)), env, home=home, refresh=refresh, offline=offline, project=project
        )
        for project, urls in wanted.items()
    }
