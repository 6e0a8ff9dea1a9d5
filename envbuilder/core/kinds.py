"""Every env kind, installer and conda engine envbuilder knows, by name, in one place: the recipe schema, the CLI's
choices, the plan, create, restore and lock read them here. Names only: nothing here imports a backend or runs a tool.

- A kind is built by a backend (``backends.base.Backend``), named here as (module in ``envbuilder.backends``,
  class): ``venv`` holds the venv, overlay and user-prefix backends, ``conda`` the conda one and the overlay clone;
  ``backends.lookup.backend`` imports the one asked for. To add a kind: its backend, and its ``Kind`` in ``KINDS``
  (what the plan, backups, validation, doctor and lock ask of it).
- A container env (``container``) is one image file that a runtime of ``core.containers`` fetches and runs.
- An installer is a class in ``plan.installers`` (its command lines) and one in ``backends.installers`` (how it
  is found), named in ``INSTALLER_NAMES`` here; ``tests/unit/test_backends.py`` checks the two agree.
- A conda engine is a conda command line (``CLI_ENGINES``, found on PATH once the recipe's modules are loaded) or
  the embedded py-rattler (``backends/rattler_engine.py``); ``backends.conda.engine_argv`` picks one.
"""

from __future__ import annotations

from envbuilder.core.structs import dataclass

__all__ = [
    "AUTO",
    "CLI_ENGINES",
    "ENGINES",
    "INSTALLER_NAMES",
    "KINDS",
    "OVERLAYS",
    "RATTLER",
    "Kind",
    "kind_info",
]


@dataclass(frozen=True)
class Kind:
    """One env kind: its backend, and what the rest of envbuilder asks of it."""

    #: The backend that builds it, as (module in envbuilder.backends, class).
    backend: tuple[str, str]
    #: It has a ``bin/python`` of its own in its prefix, which runs on the host (VIRTUAL_ENV at the prefix). Else
    #: another python runs its programs: the site python for a user prefix (PYTHONUSERBASE at the prefix), the
    #: image's (or the overlay venv's, on the image's python) through the runtime for a container env.
    own_python: bool = True
    #: A venv the installer makes; its packages are wheels, which a wheelhouse backup holds and restore installs
    #: again (other kinds are archived whole).
    venv: bool = False
    #: A conda env: its engine makes it from the recipe's channels, a conda locker locks it, it has its own lib/.
    conda: bool = False
    #: On top of the site python: a venv that sees its packages, or a copy of its env (``env.overlay``, OVERLAYS).
    overlay: bool = False
    #: One image file a container runtime runs (``[container]``; core.containers): pulled or converted, not built
    #: by an installer, its python the image's own.
    container: bool = False


#: Each kind, by the name recipes give it (``env.kind``).
KINDS: dict[str, Kind] = {
    "venv": Kind(("venv", "VenvBackend"), venv=True),
    "conda": Kind(("conda", "CondaBackend"), conda=True),
    "user-prefix": Kind(("venv", "UserPrefixBackend"), own_python=False),
    "overlay": Kind(("venv", "VenvBackend"), venv=True, overlay=True),
    "container": Kind(("container", "ContainerBackend"), own_python=False, container=True),
}
#: The two ways of an overlay env (``env.overlay``): a venv on top of the site python, or a copy of its env.
OVERLAYS: dict[str, tuple[str, str]] = {"venv": KINDS["overlay"].backend, "clone": ("conda", "CloneBackend")}
#: What is assumed of a kind this release does not know (a hand-edited record, or a newer release's): an env with
#: its own python that is archived whole. It has no backend.
_UNKNOWN = Kind(("", ""))


def kind_info(name: str) -> Kind:
    """The kind ``name`` (a plan's or a record's)."""
    return KINDS.get(name, _UNKNOWN)


#: conda command lines, in the order ``auto`` looks for them.
CLI_ENGINES = ("mamba", "conda", "micromamba")
#: The embedded engine (py-rattler), run as ``python -m envbuilder.backends.rattler_engine``.
RATTLER = "rattler"
#: The first conda command line on PATH, else the embedded engine.
AUTO = "auto"
ENGINES = (AUTO, *CLI_ENGINES, RATTLER)

#: Each installer's name (``env.installer``, ``--installer``), in the order the schema and the CLI offer them: the
#: classes of ``plan.installers`` and ``backends.installers`` carry the same names.
INSTALLER_NAMES = ("uv", "virtualenv", "pip")
