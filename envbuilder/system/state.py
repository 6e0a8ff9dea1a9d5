"""Env records: what was built where, and whether it is still whole. Records live outside $SCRATCH (they must
survive the purge), are written atomically, and one env is changed by one process at a time (``mutex``, a
``fsutil.Mutex`` per env name)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import asdict, field
from pathlib import Path
from typing import Any, Callable, Optional, cast

from envbuilder.core import kinds, settings
from envbuilder.core.errors import EnvNotFound, StateError, did_you_mean
from envbuilder.core.records import RecordedPlan
from envbuilder.core.structs import dataclass
from envbuilder.system import envfiles, strictmodes
from envbuilder.system.fsutil import Mutex, Owner, write_atomic
from envbuilder.system.textfile import UnreadableFile, read_text

RECORD_VERSION = 1
#: A shared record is readable by the site (its admin's ``envbuilder impact --records DIR``).
SHARED_MODE = 0o644
#: Bound on a shared record read from a directory others write.
MAX_SHARED = 4 * 1024 * 1024


def _no_plan() -> RecordedPlan:
    return {}  # every key of a recorded plan is optional


@dataclass(frozen=True)
class EnvRecord:
    name: str
    recipe: str
    recipe_digest: str
    prefix: str
    created: str
    #: The plan the env was built from, as ``plan --json`` prints it.
    plan: RecordedPlan = field(default_factory=_no_plan)
    facts: Mapping[str, Any] = field(default_factory=dict)
    packages: tuple[Mapping[str, Any], ...] = ()
    tools: Mapping[str, str] = field(default_factory=dict)
    validation: Optional[Mapping[str, Any]] = None
    modules: Mapping[str, Any] = field(default_factory=dict)
    #: Set by restore: the backup the env came from.
    origin: Mapping[str, Any] = field(default_factory=dict)
    #: Set by pack: the env's squashfs image (path, sha256, and the packages and mtime it was built from).
    image: Mapping[str, Any] = field(default_factory=dict)
    #: What create (restore, touch) measured of the env's files, for the checks that read records (envfiles).
    files: Mapping[str, Any] = field(default_factory=dict)
    #: The recipe's resolved values the env was built from (``recipe.edits``: what a later create says changed);
    #: empty in records written before they were kept.
    recipe_values: Mapping[str, Any] = field(default_factory=dict)
    version: int = RECORD_VERSION

    @property
    def kind(self) -> str:
        """The env kind its plan built (a record without one is a venv's)."""
        return self.plan.get("kind", "venv")

    @property
    def torch(self) -> Optional[str]:
        """The torch version the env holds, as its record lists it (None where it lists none)."""
        return next((str(p["version"]) for p in self.packages if p.get("name") == "torch"), None)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["packages"] = list(self.packages)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EnvRecord:
        """The record ``to_json`` gave (keys this release does not know are dropped)."""
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        fields["packages"] = tuple(fields.get("packages", ()))
        fields.setdefault("recipe_digest", "")  # a record written by hand or by a tool: nothing to compare
        return cls(**fields)

    def dumps(self) -> bytes:
        """The record as its files hold it (the home's, and the copy inside the env)."""
        return (json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n").encode()


def record_path(root: Path, name: str) -> Path:
    if not name or "/" in name or name.startswith("."):
        raise StateError(f"invalid env name {name!r}", hint="names are recipe names: letters, digits, . _ -")
    return settings.records_dir(root) / f"{name}.json"


def save(root: Path, record: EnvRecord) -> Path:
    path = record_path(root, record.name)
    strictmodes.home(root)
    write_atomic(path, record.dumps())
    return path


def load(root: Path, name: str) -> EnvRecord:
    return EnvRecord.from_json(_read(root, name))


def recorded_prefixes(root: Path) -> dict[str, str]:
    """Where each recorded env is, by name: the records read as :func:`load` reads them (the home checked once),
    without making whole records of them (a create checks every other name's prefix before it claims one).
    Records that cannot be read, or name no prefix, are left out; so are all of them in a home that is not safe
    to read, as :func:`load` would refuse each."""
    try:
        strictmodes.home(root)
    except StateError:
        return {}
    found = {}
    for name in names(root):
        with contextlib.suppress(StateError):  # unreadable, of another format, or removed meanwhile
            prefix = _read(root, name, checked=True).get("prefix")
            if isinstance(prefix, str):
                found[name] = prefix
    return found


def _read(root: Path, name: str, checked: bool = False) -> dict[str, Any]:
    path = record_path(root, name)
    if not checked:
        strictmodes.home(root)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        close = did_you_mean(name, names(root))
        raise EnvNotFound(
            f"no env named {name!r} is recorded in {root}",
            hint=f"{close} `envbuilder list` shows them all" if close else "envbuilder list",
        ) from None
    except (OSError, json.JSONDecodeError) as exc:
        raise StateError(
            f"the record {path} is unreadable: {exc}", hint="remove it and create the env again"
        ) from None
    version = data.get("version") if isinstance(data, dict) else None
    if version != RECORD_VERSION:
        raise StateError(
            f"the record {path} has format version {version!r}; this envbuilder reads {RECORD_VERSION}",
            hint="upgrade envbuilder" if isinstance(version, int) and version > RECORD_VERSION else None,
        )
    return cast(dict[str, Any], data)


def names(root: Path) -> list[str]:
    """Recorded env names (temp files of interrupted writes are not records)."""
    envs = settings.records_dir(root)
    if not envs.is_dir():
        return []
    return sorted(p.stem for p in envs.glob("*.json") if not p.name.startswith("."))


# ---------------------------------------------------------------------------------------------------------------
# Records shared with the site


def share(record: EnvRecord, directory: Path) -> Path:
    """A copy of ``record`` in the site's ``directory`` as ``NAME@USER.json`` (mode 0644, written atomically:
    a link planted at that name is replaced, never followed). The directory is the site's: it is not made."""
    import pwd  # noqa: PLC0415 - only sharing names the user

    try:
        user = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        user = f"uid{os.geteuid()}"
    if not directory.is_dir():
        raise StateError(
            f"{directory} is not a directory: records are shared into one the site made",
            hint="ask the site for its directory of shared records (e.g. /shared/envbuilder/records)",
        )
    path = directory / f"{record.name}@{user}.json"
    write_atomic(path, record.dumps(), mode=SHARED_MODE)
    return path


def shared(directory: Path) -> list[tuple[Path, Optional[EnvRecord], str]]:
    """Every ``*.json`` record in ``directory``, each with its record or, where it cannot be read, why not."""
    if not directory.is_dir():
        raise StateError(f"{directory} is not a directory of shared records")
    out: list[tuple[Path, Optional[EnvRecord], str]] = []
    for path in sorted(directory.glob("*.json")):
        if path.name.startswith("."):
            continue  # a writer's temporary file
        if path.is_symlink():
            out.append((path, None, "a symlink: not followed (share writes a file)"))
            continue
        try:
            data = json.loads(read_text(path, MAX_SHARED, "shared record"))
        except UnreadableFile as exc:
            out.append((path, None, exc.reason))
            continue
        except json.JSONDecodeError as exc:
            out.append((path, None, f"not valid JSON: {exc.msg} (line {exc.lineno})"))
            continue
        if not isinstance(data, dict):
            out.append((path, None, "not a JSON object"))
            continue
        version = data.get("version")
        lacks = [k for k in ("name", "recipe", "prefix", "created") if not isinstance(data.get(k), str)]
        if version != RECORD_VERSION or lacks or not isinstance(data.get("plan", {}), dict):
            why = f"lacks {lacks[0]!r}" if version == RECORD_VERSION and lacks else "has another format"
            out.append((path, None, f"not an env record of format version {RECORD_VERSION} (it {why})"))
            continue
        out.append((path, EnvRecord.from_json(data), ""))
    return out


# ---------------------------------------------------------------------------------------------------------------
# One process per env


@contextlib.contextmanager
def mutex(
    root: Path, name: str, timeout: float = 0, on_wait: Optional[Callable[[Owner], None]] = None
) -> Iterator[Mutex]:
    """Hold the mutex of the env ``name`` (waiting up to ``timeout`` seconds for another envbuilder)."""
    record_path(root, name)  # validates the name
    strictmodes.home(root)
    with Mutex(settings.mutex_dir(root) / f"{name}.lock", timeout=timeout, on_wait=on_wait) as held:
        yield held


# ---------------------------------------------------------------------------------------------------------------
# Health


@dataclass(frozen=True)
class Health:
    status: str  # ok | damaged | gone
    detail: str
    missing: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "detail": self.detail, "missing": list(self.missing[:20])}


def health(record: EnvRecord, full: bool = False) -> Health:
    """Whether the env is still whole: the prefix, its python, and the files its record names (one per installed
    package and the purge's first victims: envfiles), or (``full``, or a record without them) every file its
    installed packages listed."""
    prefix = Path(record.prefix)
    if not prefix.is_dir():
        return Health("gone", f"{prefix} does not exist (purged or removed)")
    missing: list[str] = []
    #: What a link of the env leads to that this host lacks (a python built on another host), in words.
    elsewhere = ""
    for rel in _required(record):
        path = prefix / rel
        if not path.exists():
            missing.append(rel)
            if path.is_symlink() and not elsewhere:
                elsewhere = f"{rel} leads to {path.resolve()}, which is not on this host"
    if full or not envfiles.recorded(record.files):
        missing += _unlisted(prefix)
    else:
        missing += [rel for rel in envfiles.checked(record.files) if not (prefix / rel).exists()]
    if missing and elsewhere:
        others = len(missing) - 1
        more = f"; {others} other file(s) missing" if others else ""
        return Health("damaged", elsewhere + more, tuple(missing))
    if missing:
        return Health("damaged", f"{len(missing)} file(s) missing, e.g. {missing[0]}", tuple(missing))
    return Health("ok", "all files present")


def _required(record: EnvRecord) -> tuple[str, ...]:
    """The files an env of its kind cannot work without: its python and activate script, or a container env's
    image file."""
    kind = kinds.kind_info(record.kind)
    if kind.container:
        return (str(record.tools.get("image_file") or "image.sif"),)
    return ("bin/python", "bin/activate") if kind.own_python else ()


def _unlisted(prefix: Path) -> list[str]:
    """Every file the env's installed packages listed in their RECORD that is not there (bytecode aside)."""
    missing = []
    for rec in sorted(prefix.glob("lib/python*/site-packages/*.dist-info/RECORD")):
        site = rec.parent.parent
        for line in rec.read_text(encoding="utf-8", errors="replace").splitlines():
            rel = line.split(",", 1)[0]
            if rel and not (site / rel).exists() and "__pycache__" not in rel:
                missing.append(str((site / rel).relative_to(prefix)) if not rel.startswith("..") else rel)
    return missing
