"""What the recipe loader reads: one recipe file as its supplier (the catalog) found, parsed and verified it, and
the protocol of that supplier. Apart from the loader, so that finding recipes (listing them, completing their
names) does not import the schema and everything the loader checks against."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from envbuilder.core.structs import dataclass


@dataclass(frozen=True)
class Document:
    """One recipe file as read, parsed and (when published) verified by whoever supplies it, with the names the
    loader needs to trace its values and to say where a problem is."""

    path: Path  # the file as reached (through the recipe path, or a child's extends)
    label: str  # how messages and provenance name it ("builtin:cscs/site.toml", or the path)
    data: Mapping[str, Any]  # the parsed TOML, not yet validated
    real: Path  # the file's resolved path: one file reached by two routes has one, so a cycle shows
    real_label: str  # how messages name ``real``
    name: str = ""  # the recipe name it was asked for by (the chain's first document only)
    version: str = ""  # a published recipe's registry version
    #: A published recipe: bytes matched to the registry's index and signature, and it extends nothing.
    published: bool = False


class Documents(Protocol):
    """Where the loader's documents come from (the catalog). Each call raises the error of a document that cannot
    be had: not found, unreadable, broken, or a published recipe that does not verify."""

    def recipe_document(self, ref: str) -> Document:
        """The recipe ``ref`` names (``NAME`` or ``NAME@VERSION``)."""
        ...

    def parent_document(self, child: Document, extends: str) -> Document:
        """The file ``child``'s ``extends`` names: a ``.toml`` path beside it, else a recipe by name."""
        ...
