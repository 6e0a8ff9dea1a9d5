"""Every env kind, installer and conda engine envbuilder knows, by name, in one place: the recipe schema, the CLI's
choices, the plan, create, restore and lock read them here.

- A kind is built by a backend (``base.Backend``): ``venv.py`` holds the venv, overlay and user-prefix backends,
  ``conda.py`` the conda one and the overlay clone. To add a kind: its backend, and its entry in ``KINDS``.
- Installers are ``installers.py``'s classes.
- A conda engine is a conda command line (``CLI_ENGINES``, found on PATH once the recipe's modules are loaded) or
  the embedded py-rattler (``rattler_engine.py``); ``conda.engine_argv`` picks one.

Importing this module runs nothing and imports no backend (they run tools): ``backend`` imports the one asked for.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, cast

from envbuilder.backends.installers import INSTALLERS

if TYPE_CHECKING:
    from envbuilder.backends.base import Backend

__all__ = ["AUTO", "CLI_ENGINES", "ENGINES", "INSTALLERS", "KINDS", "OVERLAYS", "RATTLER", "backend"]

#: Each kind, and its backend as (module in envbuilder.backends, class).
KINDS: dict[str, tuple[str, str]] = {
    "venv": ("venv", "VenvBackend"),
    "conda": ("conda", "CondaBackend"),
    "user-prefix": ("venv", "UserPrefixBackend"),
    "overlay": ("venv", "VenvBackend"),
}
#: The two ways of an overlay env (``env.overlay``): a venv on top of the site python, or a copy of its env.
OVERLAYS: dict[str, tuple[str, str]] = {"venv": KINDS["overlay"], "clone": ("conda", "CloneBackend")}

#: conda command lines, in the order ``auto`` looks for them.
CLI_ENGINES = ("mamba", "conda", "micromamba")
#: The embedded engine (py-rattler), run as ``python -m envbuilder.backends.rattler_engine``.
RATTLER = "rattler"
#: The first conda command line on PATH, else the embedded engine.
AUTO = "auto"
ENGINES = (AUTO, *CLI_ENGINES, RATTLER)


def backend(kind: str, overlay: str = "venv") -> type[Backend]:
    """The backend class that builds an env of ``kind`` (an overlay env: of its way, ``overlay``)."""
    module, name = OVERLAYS[overlay] if kind == "overlay" else KINDS[kind]
    return cast("type[Backend]", getattr(importlib.import_module(f"envbuilder.backends.{module}"), name))
