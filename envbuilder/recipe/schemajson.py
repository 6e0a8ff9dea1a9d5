"""The recipe schema as a JSON schema, for editors (``envbuilder recipes schema``); made from recipe.schema, so the
two never disagree."""

from __future__ import annotations

from typing import Any

from envbuilder.recipe.schema import SCHEMA
from envbuilder.recipe.spec import ArrayOf, Field, MapOf, Spec, Table


def json_schema() -> dict[str, Any]:
    out = _json(SCHEMA)
    out["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    out["title"] = "envbuilder recipe"
    out["required"] = ["schema_version"]
    return out


def _json(spec: Spec, in_array: bool = False) -> dict[str, Any]:
    # Like validate(): one file may hold part of a table its parent started, so only array items require keys.
    if isinstance(spec, Table):
        out: dict[str, Any] = {
            "type": "object",
            "additionalProperties": False,
            "properties": {k: _json(v) for k, v in spec.fields.items()},
        }
        required = [k for k, v in spec.fields.items() if getattr(v, "required", False)]
        if required and in_array:
            out["required"] = required
    elif isinstance(spec, MapOf):
        out = {"type": "object", "additionalProperties": _json(spec.value)}
        if spec.key_pattern:
            out["propertyNames"] = {"pattern": f"^({spec.key_pattern})$"}
    elif isinstance(spec, ArrayOf):
        out = {"type": "array", "items": _json(spec.item, in_array=True)}
    else:
        out = _json_field(spec)
    doc = spec.doc
    if isinstance(spec, Field) and spec.rule and spec.rule.doc:
        doc = f"{doc}: {spec.rule.doc}" if doc else spec.rule.doc
    if doc:
        out["description"] = doc
    return out


_JSON_TYPES = {str: "string", int: "integer", bool: "boolean", float: "number", list: "array", dict: "object"}


def _json_field(spec: Field) -> dict[str, Any]:
    types = spec.types if isinstance(spec.types, tuple) else (spec.types,)
    names = [_JSON_TYPES[t] for t in types]
    out: dict[str, Any] = {"type": names[0] if len(names) == 1 else names}
    if spec.items is not None:
        out["items"] = {"type": _JSON_TYPES[spec.items]}
        if spec.rule and spec.rule.pattern:
            out["items"]["pattern"] = f"^({spec.rule.pattern})$"
    elif spec.rule and spec.rule.pattern and not spec.pattern:
        out["pattern"] = f"^({spec.rule.pattern})$"
    if spec.choices:
        out["enum"] = list(spec.choices)
    if spec.pattern:
        out["pattern"] = f"^({spec.pattern})$"
    if spec.minimum is not None:
        out["minimum"] = spec.minimum
    if spec.maximum is not None:
        out["maximum"] = spec.maximum
    return out
