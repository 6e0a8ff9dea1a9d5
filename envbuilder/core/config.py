"""The settings a user or a site may write in a config file, and the one place their precedence is decided.

A setting has one name in the files (``home``, ``index_mirror``...) and one ``ENVBUILDER_*`` variable (some also
heed a tool's own variable first: ``UV_CACHE_DIR`` for ``uv_cache``). Where a value comes from, first that has one:

1. a command-line flag (``--offline``);
2. the environment variable;
3. the user file, ``[settings]`` of ``$XDG_CONFIG_HOME/envbuilder/config.toml`` (default ``~/.config``);
4. the site file, ``[settings]`` of ``/etc/envbuilder/config.toml`` (or ``$ENVBUILDER_CONFIG``);
5. the built-in default.

A site locks keys against its users with ``[locked] keys = ["index_mirror", ...]`` in its file: a locked key takes
the site file's value (or, where the site sets none, the default), and a flag, variable or user file value that
differs is ignored with a warning that names the site file.

Pure: the caller reads the files (``system.configfiles``) and hands in their tables and the environment. The
values found in files reach the rest of envbuilder as the environment variables every module already reads
(:meth:`Resolved.environ`), so there is one answer for a command and for the programs it starts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Optional

from envbuilder.core.errors import RecipeError, did_you_mean
from envbuilder.core.structs import dataclass

#: The order in words, for ``envbuilder config --help`` and the man page.
PRECEDENCE = (
    "Each setting comes from the first of: a command-line flag, its environment variable, the user file "
    "($XDG_CONFIG_HOME/envbuilder/config.toml, default ~/.config), the site file (/etc/envbuilder/config.toml "
    "or $ENVBUILDER_CONFIG), the default. Both files hold a [settings] table; the site file's "
    '[locked] keys = ["NAME", ...] makes its value (or the default) the only one for those keys.'
)
#: The table of settings in either file, and the site file's table of locked keys.
SETTINGS_TABLE = "settings"
LOCKED_TABLE = "locked"
#: The kinds of value: an absolute path (``~`` allowed), directories (an array), text, true/false, seconds.
PATH, PATHS, TEXT, BOOL, SECONDS = "path", "paths", "text", "bool", "seconds"
_EXPECTED = {
    PATH: "an absolute path (or ~/...)",
    PATHS: "an array of absolute directories (or ~/...)",
    TEXT: "a string",
    BOOL: "true or false",
    SECONDS: "a positive number of seconds",
}


@dataclass(frozen=True)
class Setting:
    name: str
    #: The variable envbuilder reads and a file's value is passed on as.
    var: str
    kind: str
    #: Variables heeded before ``var`` (a tool's own).
    before: tuple[str, ...] = ()
    #: The command-line flag that sets it, where one does.
    flag: Optional[str] = None

    @property
    def variables(self) -> tuple[str, ...]:
        return (*self.before, self.var)


SETTINGS: tuple[Setting, ...] = (
    Setting("home", "ENVBUILDER_HOME", PATH),
    Setting("recipe_path", "ENVBUILDER_RECIPE_PATH", PATHS),
    Setting("backup_root", "ENVBUILDER_BACKUP_ROOT", PATH),
    Setting("uv_cache", "ENVBUILDER_UV_CACHE", PATH, before=("UV_CACHE_DIR",)),
    Setting("conda_pkgs", "ENVBUILDER_CONDA_PKGS", PATH),
    Setting("index_mirror", "ENVBUILDER_INDEX_MIRROR", TEXT),
    Setting("offline", "ENVBUILDER_OFFLINE", BOOL, flag="--offline"),
    Setting("index_timeout", "ENVBUILDER_INDEX_TIMEOUT", SECONDS),
    Setting("progress_every", "ENVBUILDER_PROGRESS_EVERY", SECONDS),
    Setting("compile_bytecode", "ENVBUILDER_COMPILE_BYTECODE", BOOL),
    Setting("no_fuse", "ENVBUILDER_NO_FUSE", BOOL),
    # python.source = "managed": whether it is allowed (a site forbids it: false, locked), where uv downloads
    # CPython from (replacing python-build-standalone's release URL), and a downloads list in uv's JSON format.
    Setting("managed_python", "ENVBUILDER_MANAGED_PYTHON", BOOL),
    Setting("python_mirror", "ENVBUILDER_PYTHON_MIRROR", TEXT),
    Setting("python_downloads", "ENVBUILDER_PYTHON_DOWNLOADS", TEXT),
    # The site's shared validation history: the runs of envs built from published recipes go there too.
    Setting("history_dir", "ENVBUILDER_HISTORY_DIR", PATH),
    # A site's own failure signatures for `envbuilder explain` (read only where no other user can change them).
    Setting("signatures_dir", "ENVBUILDER_SIGNATURES_DIR", PATH),
)
NAMES = tuple(s.name for s in SETTINGS)
_BY_NAME = {s.name: s for s in SETTINGS}


@dataclass(frozen=True)
class FileSettings:
    """One config file's settings, each as the string its variable would hold, and (site file) its locked keys."""

    path: str
    values: Mapping[str, str]
    locked: frozenset[str] = frozenset()


def read_table(doc: Mapping[str, Any], file: str, home: str, *, site: bool) -> FileSettings:
    """A parsed config file's ``[settings]`` (and, for the site file, ``[locked]``), checked: every key known
    (did-you-mean where not), every value of its kind. The site file's other tables (``[[registries]]``...) are
    the catalog's and strict modes' to check; the user file holds nothing else. ``home``: what ``~`` stands for."""
    allowed = (SETTINGS_TABLE, LOCKED_TABLE) if site else (SETTINGS_TABLE,)
    if not site:
        for key in doc:
            if key not in allowed:
                hint = f"put it under [{SETTINGS_TABLE}]" if key in _BY_NAME else _hint(key, allowed)
                raise RecipeError(f"unknown key {key!r}", file=file, key=key, hint=hint)
    table = _table(doc, SETTINGS_TABLE, file)
    values = {}
    for key, value in table.items():
        if key not in _BY_NAME:
            raise RecipeError(
                f"unknown setting {key!r}", file=file, key=f"{SETTINGS_TABLE}.{key}", hint=_hint(key, NAMES)
            )
        values[key] = _value(_BY_NAME[key], value, file, home)
    return FileSettings(file, values, _locked(doc, file) if site else frozenset())


def _hint(key: str, choices: Sequence[str]) -> str:
    return did_you_mean(key, choices) or f"expected one of {', '.join(choices)}"


def _table(doc: Mapping[str, Any], name: str, file: str) -> Mapping[str, Any]:
    table = doc.get(name, {})
    if not isinstance(table, dict):
        raise RecipeError(f"expected a table ([{name}])", file=file, key=name)
    return table


def _locked(doc: Mapping[str, Any], file: str) -> frozenset[str]:
    table = _table(doc, LOCKED_TABLE, file)
    for key in table:
        if key != "keys":
            raise RecipeError(
                f"unknown key {key!r}", file=file, key=f"{LOCKED_TABLE}.{key}", hint="expected keys"
            )
    keys = table.get("keys", [])
    where = f"{LOCKED_TABLE}.keys"
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise RecipeError("expected an array of setting names", file=file, key=where)
    for key in keys:
        if key not in _BY_NAME:
            raise RecipeError(f"unknown setting {key!r}", file=file, key=where, hint=_hint(key, NAMES))
    return frozenset(keys)


def _value(setting: Setting, value: object, file: str, home: str) -> str:
    """``value`` as its variable would hold it, or an error naming the file, the key and what was expected."""
    key = f"{SETTINGS_TABLE}.{setting.name}"
    found = _as_variable(setting.kind, value, home)
    if found is None:
        raise RecipeError(f"expected {_EXPECTED[setting.kind]}, found {value!r}", file=file, key=key)
    return found


def _as_variable(kind: str, value: object, home: str) -> Optional[str]:
    if kind == BOOL:
        return ("1" if value else "0") if isinstance(value, bool) else None
    if kind == SECONDS:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
        return str(value) if ok else None
    if kind == PATHS:
        if not isinstance(value, list):
            return None
        parts = [_path(v, home) for v in value]
        return ":".join(p for p in parts if p is not None) if all(p and ":" not in p for p in parts) else None
    if not isinstance(value, str) or not value or "\0" in value or "\n" in value:
        return None
    return _path(value, home) if kind == PATH else value


def _path(value: object, home: str) -> Optional[str]:
    if not isinstance(value, str) or "\0" in value or "\n" in value:
        return None
    if value == "~" or value.startswith("~/"):
        value = home.rstrip("/") + value[1:]
    return value if value.startswith("/") else None


# ---------------------------------------------------------------------------------------------------------------
# Precedence


@dataclass(frozen=True)
class Effective:
    """A setting's value (as its variable holds it; None: the default applies) and where it came from."""

    setting: Setting
    value: Optional[str]
    #: ``flag``, ``env``, ``user``, ``site`` or ``default``.
    source: str
    #: The flag, the variable or the file; for a default, why (empty where plain).
    where: str = ""
    #: Whether the site file locks it (its other variables are then taken out of the environment).
    locked: bool = False

    @property
    def described(self) -> str:
        """The source in words: ``env ENVBUILDER_HOME``, ``user file PATH``, ``default``..."""
        label = {"user": "user file", "site": "site file"}.get(self.source, self.source)
        return f"{label} {self.where}".strip()

    @property
    def brief(self) -> str:
        """The source in a table's few columns: the files' paths are said once, below it."""
        if self.source in ("user", "site"):
            return f"{self.source} file{', locked' if self.locked else ''}"
        return self.described


@dataclass(frozen=True)
class Resolved:
    settings: tuple[Effective, ...]
    #: One line per value that a site lock set aside.
    warnings: tuple[str, ...]

    def environ(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` as the rest of envbuilder reads it: each value from a file (or a lock) put in its variable; a
        locked key's other variables taken out. Values from the environment and flags stay where they are."""
        out = dict(env)
        for one in self.settings:
            if one.source == "flag":
                continue
            if one.locked:
                for var in one.setting.variables:
                    out.pop(var, None)
            if one.value is not None and one.source != "env":
                out[one.setting.var] = one.value
        return out


def resolve(
    env: Mapping[str, str],
    user: Optional[FileSettings] = None,
    site: Optional[FileSettings] = None,
    flags: Optional[Mapping[str, str]] = None,
    legacy_home: Optional[str] = None,
) -> Resolved:
    """Each setting's value and source, by the order in this module's docstring. ``flags``: setting name to the
    value the command line gave. ``legacy_home``: an existing ``~/.envbuilder``, the home where nothing names one
    and ``$WORK`` is unset (records made before the XDG data home stay found)."""
    results, warnings = [], []
    for setting in SETTINGS:
        given = _given(setting, env, user, flags or {})
        site_value = site.values.get(setting.name) if site else None
        if site and setting.name in site.locked:
            warnings += [
                f"{setting.name}: {one.value!r} from {_said[one.source]}{one.where} is ignored: the site file "
                f"{site.path} locks it"
                for one in given
                if one.value != site_value
            ]
            results.append(
                Effective(setting, site_value, "site", f"{site.path} (locked)", locked=True)
                if site_value is not None
                else replace(_default(setting, env, legacy_home, f"locked by {site.path}"), locked=True)
            )
        elif given:
            results.append(given[0])
        elif site and site_value is not None:
            results.append(Effective(setting, site_value, "site", site.path))
        else:
            results.append(_default(setting, env, legacy_home, ""))
    return Resolved(tuple(results), tuple(warnings))


#: How a warning names where a value came from, before the flag, the variable or the file.
_said = {"flag": "the flag ", "env": "$", "user": "the user file "}


def _given(
    setting: Setting, env: Mapping[str, str], user: Optional[FileSettings], flags: Mapping[str, str]
) -> list[Effective]:
    """What the user gave, highest first: a flag, a variable (empty is unset), the user file."""
    out = []
    if setting.name in flags:
        out.append(Effective(setting, flags[setting.name], "flag", setting.flag or ""))
    var = next((v for v in setting.variables if env.get(v)), None)
    if var is not None:
        out.append(Effective(setting, env[var], "env", var))
    if user is not None and setting.name in user.values:
        out.append(Effective(setting, user.values[setting.name], "user", user.path))
    return out


def _default(setting: Setting, env: Mapping[str, str], legacy_home: Optional[str], why: str) -> Effective:
    """The built-in default; for the home where neither ``$WORK`` nor a setting names one, an existing
    ``~/.envbuilder`` (kept) before the XDG data home."""
    if setting.name == "home" and legacy_home and not env.get("WORK"):
        reason = "an existing ~/.envbuilder, kept"
        return Effective(setting, legacy_home, "default", f"({why}; {reason})" if why else f"({reason})")
    return Effective(setting, None, "default", f"({why})" if why else "")
