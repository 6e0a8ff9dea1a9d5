"""The installers that make venvs and install packages: uv, virtualenv, pip. One class each holds what the plan
writes for it (its command lines), how create finds it here, what it falls back to, and its settings.

To add an installer: a class here and its entry in ``INSTALLERS``; the recipe schema, the CLI's ``--installer``,
the plan and the venv backend read it from there. Importing this module runs nothing: the plan, which is pure,
reads the command lines.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar, Optional

from envbuilder.backends import uvcache
from envbuilder.core.errors import BackendError
from envbuilder.core.structs import dataclass

#: Characters that the virtualenv/venv activate templates and pip's script shebangs cannot carry safely.
_PLAIN_PATH = re.compile(r"[A-Za-z0-9._/+@%:,=~-]+")


class Installer:
    """An installer's command lines, as the plan writes them: its own program by name (``program``), which create
    replaces with the one ``find`` found here."""

    name: ClassVar[str]
    #: Tried instead where this one cannot run here (pip, which always can, by default).
    fallback: ClassVar[Optional[str]] = None
    #: Its envs find their prefix from where they are, so one built beside its prefix is renamed as it is. The
    #: others write the build path into activate scripts and script headers, which the venv backend rewrites (so
    #: the prefix must be a plain path).
    relocatable: ClassVar[bool] = False
    #: argv[0] of its command lines, when it is a program of its own (not the env's python).
    program: ClassVar[str] = ""
    #: Flags that install the files named, offline, without any index (a wheelhouse's wheels).
    offline: ClassVar[tuple[str, ...]] = ("--no-index",)
    #: Flags that make a package built for the env (``Package.built_for_env``: no_binary, its own build settings or
    #: modules) be built again, against what this build has, not taken from the installer's cache, where a wheel
    #: built for another env (another MPI, another torch) waits.
    fresh_build: ClassVar[tuple[str, ...]] = ("--no-cache-dir",)
    #: The record keeps its version (uv's behaviour changes between releases).
    records_version: ClassVar[bool] = False
    #: Said in the plan of a user-prefix env, where the installer has no prefix option of its own.
    user_prefix_note: ClassVar[Optional[str]] = None

    def venv(self, prompt: Sequence[str], python: str, options: Sequence[str], prefix: str) -> list[str]:
        """The command that creates a venv at ``prefix`` from ``python``."""
        return [python, "-m", "venv", *prompt, *options, prefix]

    def pip(self, python: str, target: Sequence[str] = ()) -> list[str]:
        """The install command for the env of ``python`` (arguments follow)."""
        return [python, "-m", "pip", "install", *target]

    def user_target(self, prefix: str) -> list[str]:
        """The flags that install into the user prefix ``prefix`` instead of the python's own env."""
        return ["--user"]

    def find(self) -> Optional[list[str]]:
        """How its program runs here ([] where it needs none: the env's python runs it); None if it cannot."""
        return []

    def settings(self, final: Path, env: Mapping[str, str]) -> tuple[dict[str, str], tuple[str, ...]]:
        """Its environment for a build of ``final`` (laid over the modules'), and why, for the log."""
        # The recipe, not a stray pip.conf, decides where packages come from.
        return {"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}, ()


class Uv(Installer):
    name = "uv"
    fallback = "virtualenv"
    relocatable = True
    program = "uv"
    offline = ("--offline", "--no-index")
    # uv keeps the sdist's unpacked tree too, and builds in it again: a cache keyed by config settings would reuse
    # its objects. Only this step's package and its build requirements go uncached.
    fresh_build = ("--no-cache",)
    records_version = True

    def venv(self, prompt: Sequence[str], python: str, options: Sequence[str], prefix: str) -> list[str]:
        # --relocatable: activate and entry points find the env from their own location, so the env can be built
        # beside its prefix and renamed into place.
        return ["uv", "venv", "--relocatable", *prompt, "--python", python, *options, prefix]

    def pip(self, python: str, target: Sequence[str] = ()) -> list[str]:
        return ["uv", "pip", "install", "--python", python, *target]

    def user_target(self, prefix: str) -> list[str]:
        return ["--prefix", prefix]

    def find(self) -> Optional[list[str]]:
        uv = uv_binary()
        return [uv] if uv else None

    def settings(self, final: Path, env: Mapping[str, str]) -> tuple[dict[str, str], tuple[str, ...]]:
        uv = uvcache.uv_settings(final, env)
        return uv.env(), uv.reasons


class Pip(Installer):
    """The standard library's venv, and the env's own pip: always there."""

    name = "pip"
    user_prefix_note = "user-prefix installs run with PYTHONUSERBASE set to the prefix"


class Virtualenv(Pip):
    """virtualenv makes the env (run by envbuilder's python, which has it); the env's pip installs."""

    name = "virtualenv"
    fallback = "pip"
    program = "virtualenv"

    def venv(self, prompt: Sequence[str], python: str, options: Sequence[str], prefix: str) -> list[str]:
        return ["virtualenv", *prompt, "--python", python, *options, prefix]

    def find(self) -> Optional[list[str]]:
        if importlib.util.find_spec("virtualenv") is None:
            return None
        return [sys.executable, "-m", "virtualenv"]


#: Every installer, the preferred first.
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
