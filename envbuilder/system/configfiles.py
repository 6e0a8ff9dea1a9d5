"""The config files' settings read from disk: the user's (``$XDG_CONFIG_HOME/envbuilder/config.toml``) and the
site's (``siteconfig.config_path``), each refused where another user could change it (``strictmodes``), handed to
``core.config.resolve``, which alone decides the precedence. A missing file is no file: nothing is imported or
parsed for it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Optional

from envbuilder.core import config, settings


def effective(env: Mapping[str, str], flags: Optional[Mapping[str, str]] = None) -> config.Resolved:
    """Every setting's value and source for a command run in ``env`` with ``flags`` (setting name: value)."""
    legacy = settings.legacy_home(env)
    return config.resolve(
        env,
        user=read_user(env),
        site=read_site(env),
        flags=flags,
        legacy_home=str(legacy) if legacy.is_dir() else None,
    )


def read_user(env: Mapping[str, str]) -> Optional[config.FileSettings]:
    path = settings.user_config(env)
    if not _there(path):
        return None
    return _read(path, env, site=False, elsewhere="set XDG_CONFIG_HOME elsewhere")


def read_site(env: Mapping[str, str]) -> Optional[config.FileSettings]:
    from envbuilder.system import siteconfig  # noqa: PLC0415 - its TOML reader comes with it, where a file is

    path = siteconfig.config_path(env)  # ENVBUILDER_CONFIG naming no file is an error, as for the catalog
    if path is None:
        return None
    return _read(path, env, site=True, elsewhere="ask the admins to fix its mode, or unset ENVBUILDER_CONFIG")


def _read(path: Path, env: Mapping[str, str], *, site: bool, elsewhere: str) -> config.FileSettings:
    from envbuilder.system import siteconfig, strictmodes  # noqa: PLC0415 - only where a file is

    what = "the site config" if site else "your config file"
    strictmodes.check(path, what=what, elsewhere=elsewhere)
    doc = siteconfig.read_toml(path)
    return config.read_table(doc, str(path), str(settings.user_home(env)), site=site)


def _there(path: Path) -> bool:
    """Something is at ``path`` (a dangling link too: reading it says what is wrong)."""
    return path.is_symlink() or path.exists()
