"""Which backend class builds an env of a kind: the ``Kind`` records of ``core.kinds`` name each backend by module
and class, and ``backend`` imports that module only when it is asked for (backends run tools)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, cast

from envbuilder.core.kinds import KINDS, OVERLAYS

if TYPE_CHECKING:
    from envbuilder.backends.base import Backend

__all__ = ["backend"]


def backend(kind: str, overlay: str = "venv") -> type[Backend]:
    """The backend class that builds an env of ``kind`` (an overlay env: of its way, ``overlay``)."""
    module, name = OVERLAYS[overlay] if KINDS[kind].overlay else KINDS[kind].backend
    return cast("type[Backend]", getattr(importlib.import_module(f"envbuilder.backends.{module}"), name))
