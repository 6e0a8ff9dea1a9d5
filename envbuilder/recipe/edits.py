"""What changed in a recipe since an env was built from it. An env's record keeps the recipe's digest and a copy
of its resolved values (the chain merged over the defaults); ``create`` of an env that exists compares them with
the recipe as it loads now and names the keys whose values differ, so an edit is never met with a silent
"nothing to do". A record older than the copy has only the digest: it tells that the recipe changed, not where."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from envbuilder.core.structs import dataclass
from envbuilder.recipe.loader import DEFAULTS_SOURCE, Recipe

#: A value longer than this is shortened where a change is shown (a package list can be long).
SHOWN = 60


def values(recipe: Recipe) -> dict[str, Any]:
    """The recipe's resolved values as JSON holds them (what a record keeps; TOML dates become strings)."""
    copy: dict[str, Any] = json.loads(json.dumps(recipe.data, default=str))
    return copy


def digest(recipe: Recipe) -> str:
    return hashlib.sha256(json.dumps(recipe.data, sort_keys=True, default=str).encode()).hexdigest()


@dataclass(frozen=True)
class Change:
    """One key whose value differs: ``recorded`` and ``now`` are None where it was or is unset."""

    key: str
    recorded: Any
    now: Any
    #: The file (or ``<defaults>``) that gives the new value; "" where the key is unset now.
    source: str

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "recorded": self.recorded, "now": self.now, "source": self.source}

    def shown(self) -> str:
        if self.now is None:
            return f"{self.key} {_short(self.recorded)} -> unset"
        where = "envbuilder's default" if self.source == DEFAULTS_SOURCE else self.source
        was = "unset" if self.recorded is None else _short(self.recorded)
        return f"{self.key} {was} -> {_short(self.now)} ({where})"


@dataclass(frozen=True)
class Edit:
    """``unchanged``, ``changed`` (with the ``changes`` where the record keeps the values to tell them), or
    ``unknown`` (a record with no digest to compare)."""

    status: str
    recorded_digest: str
    digest: str
    changes: tuple[Change, ...] = ()
    #: The record keeps the recipe's values, so ``changes`` lists every key that differs.
    described: bool = True

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "recorded_digest": self.recorded_digest,
            "digest": self.digest,
            "changes": [c.to_json() for c in self.changes] if self.described else None,
        }


def compare(recorded_digest: str, recorded_values: Mapping[str, Any], recipe: Recipe) -> Edit:
    """The recipe now against the one an env's record was built from (its digest, and its values where the
    record keeps them: empty where it does not)."""
    now = digest(recipe)
    if not recorded_digest:
        return Edit("unknown", "", now, described=False)
    if recorded_digest == now:
        return Edit("unchanged", recorded_digest, now)
    if not recorded_values:
        return Edit("changed", recorded_digest, now, described=False)
    old, new = _flat(recorded_values), _flat(values(recipe))
    changes = tuple(
        Change(key, old.get(key), new.get(key), recipe.source_of(key) if key in new else "")
        for key in sorted(old.keys() | new.keys())
        if old.get(key) != new.get(key)
    )
    return Edit("changed", recorded_digest, now, changes)


def _flat(node: Mapping[str, Any], path: str = "") -> dict[str, Any]:
    """Dotted key -> value; a list is one value (its items have no name to say which changed), and an empty
    table none (its keys are the values)."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        dotted = f"{path}.{key}" if path else str(key)
        if isinstance(value, Mapping):
            out.update(_flat(value, dotted))
        else:
            out[dotted] = value
    return out


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= SHOWN else text[: SHOWN - 3] + "..."
