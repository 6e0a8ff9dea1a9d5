"""The site config and the TOML files envbuilder reads: where the site config is (``ENVBUILDER_CONFIG``, else the
built-in place where a file is there), and reading a TOML file (a recipe, the site config) into a table, with an
error that names the file.

Both the recipe catalog (``[[registries]]``) and the mode checks (``[[shared_roots]]``) read the site config, so it
lives here, below them both."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

from envbuilder.core import settings
from envbuilder.core._toml import TOMLDecodeError, TOMLLimitError, loads
from envbuilder.core.errors import RecipeError
from envbuilder.system import textfile

#: The largest recipe file read (the biggest shipped one is under 10 KiB).
MAX_RECIPE_BYTES = 1024 * 1024


def config_path(env: Mapping[str, str]) -> Optional[Path]:
    if env.get(settings.CONFIG_VAR):
        return Path(env[settings.CONFIG_VAR]).expanduser()
    return settings.SITE_CONFIG if settings.SITE_CONFIG.is_file() else None


def read_toml(path: Path, shown: Optional[str] = None) -> dict[str, Any]:
    try:
        text = textfile.read_text(path, MAX_RECIPE_BYTES, "recipe file")
    except textfile.UnreadableFile as exc:
        raise RecipeError(exc.reason, file=shown or str(path)) from None
    try:
        return loads(text)
    except TOMLLimitError as exc:
        raise RecipeError(str(exc), file=shown or str(path), key=exc.key) from None
    except TOMLDecodeError as exc:
        raise RecipeError(f"not valid TOML: {exc}", file=shown or str(path)) from None
