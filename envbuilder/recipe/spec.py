"""The schema's building blocks: a key's value (``Field``), a table of named keys (``Table``), a table of free-form
names (``MapOf``) and an array of tables (``ArrayOf``). recipe.schema spells every recipe key with them; recipe.schemacheck
walks a document against them and recipe.schemajson renders them for editors."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any, Callable, Optional, Union

from envbuilder.core.structs import dataclass
from envbuilder.core.values import Rule


@dataclass(frozen=True)
class Field:
    types: Union[type, tuple[type, ...]]
    doc: str = ""
    choices: tuple[str, ...] = ()
    pattern: Optional[str] = None
    items: Optional[type] = None  # for lists: the element type
    required: bool = False
    example: str = ""  # shown when a value does not match ``pattern``
    rule: Optional[Rule] = None  # for a string, or for each string of an array
    prose: bool = False  # free text for people (descriptions, notes): may span lines
    #: For integers: the allowed range, both ends included. No machine has a negative GPU count or 2**63 nodes.
    minimum: Optional[int] = None
    maximum: Optional[int] = None
    #: For a list that is one value (an argv template), not a list of items: under ``extends`` a child's
    #: replaces its parent's instead of adding to it.
    whole: bool = False


@dataclass(frozen=True)
class Table:
    fields: Mapping[str, Union[Field, Table, MapOf, ArrayOf]]
    doc: str = ""
    required: bool = False
    #: A rule across the table's keys: (key, message, hint) of the first problem, or None.
    check: Optional[Callable[[Mapping[str, Any]], Optional[tuple[str, str, Optional[str]]]]] = None


@dataclass(frozen=True)
class MapOf:
    """A table whose keys are free-form names (partitions, file systems, profiles) and whose values share a spec."""

    value: Union[Field, Table]
    doc: str = ""
    key_pattern: Optional[str] = None
    required: bool = False


@dataclass(frozen=True)
class ArrayOf:
    """An array of tables ([[packages]])."""

    item: Table
    doc: str = ""
    required: bool = False
    #: What names an entry: under ``extends`` a child's entry with a parent's key takes that entry's place
    #: (None: entries only add up).
    key: Optional[Callable[[Mapping[str, Any]], Hashable]] = None


Spec = Union[Field, Table, MapOf, ArrayOf]


_TYPE_NAMES = {
    str: "a string",
    int: "an integer",
    bool: "a boolean",
    float: "a number",
    list: "an array",
    dict: "a table",
}


def type_name(t: Union[type, tuple[type, ...]]) -> str:
    if isinstance(t, tuple):
        return " or ".join(_TYPE_NAMES.get(x, x.__name__) for x in t)
    return _TYPE_NAMES.get(t, t.__name__)


def join_key(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
