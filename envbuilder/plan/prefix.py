"""Where an env goes (pure): ``${VAR}`` expansion, the env's prefix (with the fallback when $SCRATCH is unset), and
the file system that holds it."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import fields
from typing import TYPE_CHECKING, Any, Optional

from envbuilder.core.errors import UsageError
from envbuilder.core.structs import dataclass
from envbuilder.recipe import sections

if TYPE_CHECKING:
    from envbuilder.recipe.loader import Recipe

FALLBACK_ROOT = "${HOME}/.local/share/envbuilder/envs/{name}"


@dataclass(frozen=True)
class PrefixFilesystem:
    """The [filesystems] entry the env's prefix lives on, and its name."""

    name: str
    spec: sections.Filesystem

    def to_json(self) -> dict[str, Any]:
        values = ((f.name, getattr(self.spec, f.name)) for f in fields(self.spec))
        return {"name": self.name, **{key: value for key, value in values if value is not None}}


_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def expand(text: str, env: Mapping[str, str], name: str) -> tuple[str, list[str]]:
    """Expand ${VAR}/$VAR from ``env`` and {name}; returns the text and the variables that were unset."""
    missing: list[str] = []

    def sub(match: re.Match[str]) -> str:
        var = match.group(1) or match.group(2)
        if env.get(var):
            return env[var]
        missing.append(var)
        return match.group(0)

    return _VAR_RE.sub(sub, text).replace("{name}", name), missing


def prefix_for(
    recipe: Recipe, env: Mapping[str, str], explicit: Optional[str], warnings: list[str]
) -> tuple[str, list[str]]:
    """The env's prefix (``explicit``, from --prefix, else env.prefix expanded), and the variables it needs that
    are unset here."""
    if explicit:
        return _carriable(explicit, "--prefix"), []
    text, missing = expand(recipe.env.prefix, env, recipe.name)
    if not missing:
        return _carriable(text, "env.prefix (expanded)"), []
    if missing == ["SCRATCH"] and env.get("HOME"):
        fallback, _ = expand(FALLBACK_ROOT, env, recipe.name)
        warnings.append(f"$SCRATCH is unset; the env goes to {fallback} (pass --prefix to choose)")
        return fallback, []
    warnings.append(
        f"env.prefix needs {', '.join('$' + m for m in missing)}, unset here; create will stop (pass --prefix)"
    )
    return text, missing


def _carriable(prefix: str, source: str) -> str:
    """A prefix every activate script, modulefile and batch script can carry: no line break, NUL or control
    character (a ${VAR} or --prefix can bring one in after the recipe's own checks)."""
    bad = next((c for c in prefix if ord(c) < 32 or ord(c) == 127), None)
    if bad is not None:
        raise UsageError(
            f"{source} {prefix!r} holds the control character {bad!r}, which no activate script or modulefile "
            "can carry",
            hint="choose a prefix without line breaks or control characters",
        )
    return prefix


def filesystem_for(
    recipe: Recipe, prefix: str, env: Mapping[str, str], warnings: list[str]
) -> Optional[PrefixFilesystem]:
    """The file system env.filesystem names, else the one whose path holds the prefix."""
    filesystems = recipe.filesystems
    name = recipe.env.filesystem
    if not name:
        roots = ((n, expand(fs.path, env, recipe.name)[0]) for n, fs in filesystems.items())
        name = next((n for n, root in roots if prefix.startswith(root.rstrip("/") + "/")), None)
    if name is None:
        return None
    fs = filesystems[name]
    if fs.purge_days:
        warnings.append(
            f"{name} purges files unread for {fs.purge_days} days: back this env up "
            "(envbuilder backup) or expect to rebuild it"
        )
    if fs.visible_on_compute is False:
        warnings.append(f"{name} is not visible on compute nodes: jobs cannot use an env there")
    return PrefixFilesystem(name, fs)
