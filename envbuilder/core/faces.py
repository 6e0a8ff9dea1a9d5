"""A package's face loaded on first use (PEP 562): ``from envbuilder.plan import build`` still works, while
``import envbuilder.plan.prefix`` (or a command that needs one module of the package) no longer runs every
module the face names. Each name's home is stated in the package, and its ``TYPE_CHECKING`` imports (``X as X``)
show mypy and import-linter the same names where they live."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, Callable


def lazy(package: str, homes: Mapping[str, str]) -> tuple[list[str], Callable[[str], Any]]:
    """The ``__all__`` and ``__getattr__`` of ``package``'s ``__init__``: ``homes`` maps each module of the package
    (its last name) to the names of the face it defines, separated by spaces. A name is imported on first use,
    then kept in the package."""
    where = {name: module for module, names in homes.items() for name in names.split()}

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(importlib.import_module(package), name, value)
        return value

    return sorted(where), __getattr__
