"""The installers on this machine: how create finds uv, virtualenv and pip here, which one it takes (or falls back
to), and each one's settings for a build. Each class adds that to its command lines, which the plan writes from
``plan.installers`` (pure); create runs them with the program found here.

Importing this module runs nothing.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Callable, Optional

from envbuilder.backends import uvcache
from envbuilder.core import kinds, settings
from envbuilder.core.errors import BackendError
from envbuilder.core.structs import dataclass
from envbuilder.plan import installers as planned
from envbuilder.system import host

#: Characters that the virtualenv/venv activate templates and pip's script shebangs cannot carry safely.
_PLAIN_PATH = re.compile(r"[A-Za-z0-9._/+@%:,=~-]+")


class Installer(planned.Installer):
    """An installer as create runs it: its command lines (``plan.installers``), how it is found here (``find``)
    and its environment for a build (``settings``)."""

    def find(self) -> Optional[list[str]]:
        """How its program runs here ([] where it needs none: the env's python runs it); None if it cannot."""
        return []

    def settings(self, final: Path, env: Mapping[str, str]) -> tuple[dict[str, str], tuple[str, ...]]:
        """Its environment for a build of ``final`` (laid over the modules'), and why, for the log."""
        # The recipe, not a stray pip.conf, decides where packages come from.
        return {"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}, ()


class Uv(planned.Uv, Installer):
    def find(self) -> Optional[list[str]]:
        uv = uv_binary()
        return [uv] if uv else None

    def settings(self, final: Path, env: Mapping[str, str]) -> tuple[dict[str, str], tuple[str, ...]]:
        uv = uvcache.uv_settings(final, env)
        return uv.env(), uv.reasons


class Pip(planned.Pip, Installer):
    """The standard library's venv, and the env's own pip: always there."""


class Virtualenv(planned.Virtualenv, Pip):
    """virtualenv makes the env (run by envbuilder's python, which has it); the env's pip installs."""

    def find(self) -> Optional[list[str]]:
        if importlib.util.find_spec("virtualenv") is None:
            return None
        return [sys.executable, "-m", "virtualenv"]


#: Every installer, the preferred first (the order of ``plan.installers.INSTALLERS``).
INSTALLERS: dict[str, Installer] = {i.name: i for i in (Uv(), Virtualenv(), Pip())}


def uv_binary() -> Optional[str]:
    """The uv that came with envbuilder (the ``uv`` PyPI package), else one on PATH."""
    try:
        from uv import find_uv_bin  # noqa: PLC0415 - optional: only the uv installer needs it

        return str(find_uv_bin())
    except (ImportError, FileNotFoundError):
        return shutil.which("uv")


@dataclass(frozen=True)
class Choice:
    installer: Installer
    #: How its program runs here (Installer.find).
    program: tuple[str, ...]
    reason: str

    @property
    def name(self) -> str:
        return self.installer.name


def choose(wanted: str, prefix: str, source: str) -> Choice:
    """The installer that will build the env at ``prefix``: ``wanted`` (named by ``source``), or what it falls back
    to where it cannot run here."""
    installer = INSTALLERS[wanted]
    program = installer.find()
    while program is None:
        source = f"{source}; {installer.name} is not installed"
        installer = INSTALLERS[installer.fallback or Pip.name]  # pip comes with every python
        program = installer.find()
    if not installer.relocatable and not _PLAIN_PATH.fullmatch(prefix):
        raise BackendError(
            f"the {installer.name} installer cannot build at {prefix!r}: its activate script and pip's script "
            "headers would carry the path unquoted",
            hint="use the uv installer (relocatable, quotes every path), or a prefix of letters, digits and ._/-",
        )
    return Choice(installer, tuple(program), f"{installer.name} ({source})")


def bytecode_env(
    installer: Installer,
    kind: str,
    system_site_packages: bool,
    env: Mapping[str, str],
    log: Callable[[str], None],
    *,
    imports_next: bool,
) -> dict[str, str]:
    """``UV_COMPILE_BYTECODE=1`` where uv installs an env that holds its own packages (``kind`` with its own
    python, no system site packages) on a machine with many CPUs, for a command that imports them next
    (``imports_next``: its smoke check or validation; :func:`settings.compiles_at_install`, whose reason goes to
    ``log``). Nothing where it does not apply: pip compiles at install anyway, and an overlay's or a user prefix's
    python imports packages that are not the env's."""
    if not isinstance(installer, Uv) or not kinds.kind_info(kind).own_python or system_site_packages:
        return {}
    compiles, why = settings.compiles_at_install(env, host.usable_cpus(), imports_next)
    log(why)
    return {"UV_COMPILE_BYTECODE": "1"} if compiles else {}
