"""The installers' command lines (pure): uv, virtualenv, pip. One class each holds what the plan writes for it: the
venv and install commands, the flags for offline, fresh-build and user-prefix installs, what it falls back to and
whether its envs are relocatable. It needs no file system, no PATH and no process: how create finds and sets up each
installer on the machine is ``backends.installers``, whose classes add that to these.

To add an installer: a class here, its machine half in ``backends.installers``, and its name in
``core.kinds.INSTALLER_NAMES``; the recipe schema and the CLI's ``--installer`` read the names from there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Optional


class Installer:
    """An installer's command lines, as the plan writes them: its own program by name (``program``), which create
    replaces with the one it found here."""

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


#: Every installer's command lines, the preferred first.
INSTALLERS: dict[str, Installer] = {i.name: i for i in (Uv(), Virtualenv(), Pip())}
