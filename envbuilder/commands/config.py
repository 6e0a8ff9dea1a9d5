"""`envbuilder config` (`config list`): every setting's effective value and where it came from: a flag, an
environment variable, the user file, the site file or the default (``core.config`` decides; the CLI resolved it
before the command ran)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from envbuilder.core import config, settings
from envbuilder.resolver.indexread import TIMEOUT_S
from envbuilder.system import configfiles, progress
from envbuilder.system.console import Out
from envbuilder.system.tables import Column

_COLUMNS = (Column("SETTING"), Column("VALUE"), Column("SOURCE", text=True))


def handle_list(args: argparse.Namespace, out: Out) -> dict[str, Any]:
    resolved: config.Resolved = getattr(args, "settings", None) or configfiles.effective(os.environ)
    defaults = _defaults(os.environ)
    values = [one.value if one.value is not None else defaults[one.setting.name] for one in resolved.settings]
    rows = [
        {
            "name": one.setting.name,
            "value": value,
            "source": one.source,
            "where": one.where,
            "variable": one.setting.var,
            "locked": one.locked,
        }
        for one, value in zip(resolved.settings, values)
    ]
    files = {"user": str(settings.user_config(os.environ)), "site": _site_file(os.environ)}
    if not args.json:
        cells = [
            (one.setting.name, value or "(none)", one.brief) for one, value in zip(resolved.settings, values)
        ]
        out.result.table(_COLUMNS, cells)
        user = "" if Path(files["user"]).exists() else " (none there)"
        out.result.line(f"user file: {files['user']}{user}")
        out.result.line(f"site file: {files['site'] or f'none ({settings.SITE_CONFIG} is absent)'}")
    return {"settings": rows, "files": files}


def _site_file(env: Mapping[str, str]) -> str:
    from envbuilder.system import siteconfig  # noqa: PLC0415

    path = siteconfig.config_path(env)
    return str(path) if path is not None else ""


def _defaults(env: Mapping[str, str]) -> dict[str, str]:
    """What each setting is when nothing sets it, in ``env`` (the effective environment: a default that follows
    another setting, as the backup root follows the home, follows its effective value)."""
    bare = {k: v for k, v in env.items() if k not in {var for s in config.SETTINGS for var in s.variables}}
    return {
        "home": str(settings.home(bare)),
        "recipe_path": "",
        "backup_root": str(settings.backup_root({**bare, **_only(env, "ENVBUILDER_HOME")})[0]),
        "uv_cache": str(settings.uv_cache(bare)[0]),
        "conda_pkgs": str(settings.conda_cache(bare)),
        "index_mirror": "",
        "offline": "0",
        "index_timeout": f"{TIMEOUT_S:g}",
        "progress_every": f"{progress.EVERY_S:g}",
        "compile_bytecode": f"with {settings.COMPILE_MIN_CPUS}+ usable CPUs",
        "no_fuse": "0",
        "managed_python": "1",
        "python_mirror": "",
        "python_downloads": "",
        "history_dir": "",
        "signatures_dir": "",
    }


def _only(env: Mapping[str, str], var: str) -> dict[str, str]:
    return {var: env[var]} if env.get(var) else {}
