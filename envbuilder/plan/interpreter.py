"""Where an env's interpreter comes from, decided once for the plan (pure): the site's (``python.command`` on the
PATH the modules give: a module's python, or the system's), or a uv-managed CPython of ``python.version``
(``python.source = "managed"``) that create installs under the envbuilder home when it is not there yet,
downloading it from where the mirror rules send uv (``resolver.mirror.python_downloads``). A site forbids
managed Pythons with the ``managed_python`` setting (false, locked in its config file)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Optional

from envbuilder.core import settings
from envbuilder.core.errors import RecipeError
from envbuilder.core.kinds import kind_info
from envbuilder.core.records import RecordedManaged, RecordedPython
from envbuilder.resolver import mirror

if TYPE_CHECKING:
    from envbuilder.recipe.loader import Recipe

MANAGED = "managed"
#: The setting that allows managed Pythons (``managed_python``), and what turns it off.
ALLOW_VAR = "ENVBUILDER_MANAGED_PYTHON"
_OFF = ("0", "false", "no", "off")
#: The setting that lists Python downloads in uv's JSON format instead of uv's own list.
DOWNLOADS_JSON_VAR = "ENVBUILDER_PYTHON_DOWNLOADS"


def managed_request(version: str) -> str:
    """How the plan's commands name a managed CPython (a request uv understands); the build puts the
    interpreter's path in its place."""
    return f"cpython@{version}"


def plan_python(
    recipe: Recipe, env: Mapping[str, str], version: Optional[str], source: str
) -> RecordedPython:
    """The plan's python: the command its steps name, the version and where it came from (``source``), and where
    the interpreter comes from. Raises RecipeError where a managed python cannot be had."""
    py = recipe.python
    if py.managed:
        managed = _managed(recipe, env)
        downloads = mirror.python_downloads(env)
        return {
            "command": managed_request(managed["version"]),
            "version": managed["version"],
            "source": source,
            "origin": MANAGED,
            "where": (
                f"uv-managed CPython {managed['version']} in {managed['dir']}; create installs it where "
                f"missing, downloading from {downloads.shown}"
            ),
            "managed": managed,
        }
    if kind_info(recipe.env.kind).conda:
        return {
            "command": py.command,
            "version": version,
            "source": source,
            "origin": "conda",
            "where": f"python {version or '(the engine picks)'} from the recipe's conda channels, in the env",
        }
    loads = recipe.modules.load if recipe.modules.system != "none" else ()
    where = (
        f"{py.command} on the PATH after loading {', '.join(loads)}"
        if loads
        else f"{py.command} on the PATH (no modules load)"
    )
    return {
        "command": py.command,
        "version": version,
        "source": source,
        "origin": "module" if loads else "system",
        "where": where,
    }


def allowed(env: Mapping[str, str]) -> bool:
    return env.get(ALLOW_VAR, "").strip().lower() not in _OFF


def _managed(recipe: Recipe, env: Mapping[str, str]) -> RecordedManaged:
    file, key = recipe.source_of("python.source"), "python.source"
    if not recipe.python.version:
        raise RecipeError(
            'python.source = "managed" needs python.version: the CPython to install',
            file=file,
            key=key,
            hint='set python.version (e.g. "3.12") in the recipe',
        )
    kind = recipe.env.kind
    if not kind_info(kind).venv or kind_info(kind).overlay:
        raise RecipeError(
            f'python.source = "managed" makes venv envs only, not env.kind = "{kind}" (an overlay and a user '
            "prefix stand on the site's python; a conda env brings its own)",
            file=file,
            key=key,
            hint='use env.kind = "venv", or drop python.source',
        )
    if not allowed(env):
        raise RecipeError(
            f"this site does not allow uv-managed Pythons (managed_python is off: {ALLOW_VAR}="
            f"{env.get(ALLOW_VAR)}); the env would run a python the site does not provide",
            file=file,
            key=key,
            hint="use the site's python (drop python.source; load a python module in modules.load), or ask "
            "the admins; `envbuilder config` shows where the setting comes from",
        )
    downloads = mirror.python_downloads(env)
    return {
        "version": recipe.python.version,
        "dir": str(settings.pythons_dir(settings.home(env))),
        "mirror": downloads.mirror or "",
        "mirror_source": downloads.why,
        "downloads_json": env.get(DOWNLOADS_JSON_VAR, "").strip(),
    }


def managed_remarks(recipe: Recipe) -> list[str]:
    """Warnings for a managed python: a python module the recipe still loads (a site python's PYTHONPATH or
    PYTHONHOME would reach an env of another Python)."""
    if not recipe.python.managed or recipe.modules.system == "none":
        return []
    return [
        f"modules.load loads {mod}, a python module, though the env's python is the managed CPython "
        f"{recipe.python.version}: drop it unless the env needs it (its PYTHONPATH would reach the env)"
        for mod in recipe.modules.load
        if mod.split("/")[0].lower().rstrip("0123456789.") == "python"
    ]
