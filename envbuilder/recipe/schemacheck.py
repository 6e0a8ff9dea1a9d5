"""The strict validator: a parsed recipe file walked against the schema (recipe.schema), the first problem raised as
a RecipeError naming the file, the dotted key and what was expected."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Callable, Optional, Union

from envbuilder.core.errors import RecipeError, did_you_mean
from envbuilder.core.values import control_problem, found
from envbuilder.recipe.schema import SCHEMA, SCHEMA_VERSION
from envbuilder.recipe.spec import (
    ArrayOf,
    Field,
    MapOf,
    Spec,
    Table,
    join_key,
    type_name,
)


def validate(doc: Mapping[str, Any], file: str) -> None:
    """Raise RecipeError for the first problem in one file: unknown key, wrong type, bad choice.

    Required keys of tables are checked on the merged recipe (:func:`check_required`), because a variant may
    add to a table its parent started; required keys of array items ([[packages]]) are checked here.
    """
    version = doc.get("schema_version")
    if version is None:
        raise RecipeError(
            "missing schema_version",
            file=file,
            key="schema_version",
            hint=f"every recipe file starts with schema_version = {SCHEMA_VERSION}",
        )
    if not isinstance(version, int) or isinstance(version, bool):
        raise RecipeError(f"expected an integer, found {found(version)}", file=file, key="schema_version")
    if version != SCHEMA_VERSION:
        raise RecipeError(
            f"this envbuilder reads schema_version {SCHEMA_VERSION}, found {version!r}",
            file=file,
            key="schema_version",
            hint="upgrade envbuilder" if isinstance(version, int) and version > SCHEMA_VERSION else None,
        )
    # The version is checked first: a newer recipe's new keys must say "upgrade", not "unknown key".
    _walk(SCHEMA, doc, file, "", required=False)


def check_required(doc: Mapping[str, Any], source_of: Callable[[str], str]) -> None:
    """Required keys on a merged recipe; ``source_of(table path)`` names the file to blame."""
    _walk(SCHEMA, doc, "", "", required=True, source_of=source_of)


def _walk(
    spec: Spec,
    value: Any,
    file: str,
    path: str,
    *,
    required: bool,
    source_of: Optional[Callable[[str], str]] = None,
) -> None:
    if isinstance(spec, Table):
        _walk_table(spec, value, file, path, required=required, source_of=source_of)
        return
    if isinstance(spec, MapOf):
        if not isinstance(value, dict):
            raise RecipeError(f"expected a table, found {found(value)}", file=file, key=path)
        for key, sub in value.items():
            bad = control_problem(key)
            if bad is not None:
                raise RecipeError(
                    f"{bad[0]} is not allowed in a name, found {found(key)}",
                    file=file,
                    key=join_key(path, key),
                    hint=bad[1],
                )
            if spec.key_pattern and not re.fullmatch(spec.key_pattern, key):
                raise RecipeError(
                    f"invalid name {key!r} (expected to match {spec.key_pattern})",
                    file=file,
                    key=join_key(path, key),
                )
            _walk(spec.value, sub, file, join_key(path, key), required=required, source_of=source_of)
        return
    if isinstance(spec, ArrayOf):
        if not isinstance(value, list):
            raise RecipeError(f"expected an array of tables, found {found(value)}", file=file, key=path)
        for i, item in enumerate(value):
            _walk(spec.item, item, file, f"{path}[{i}]", required=True, source_of=source_of)
        return
    _check_field(spec, value, file, path)


def _walk_table(
    spec: Table,
    value: Any,
    file: str,
    path: str,
    *,
    required: bool,
    source_of: Optional[Callable[[str], str]],
) -> None:
    """One table: known keys only, each value against its spec, then the table's own check and (``required``)
    its required keys."""
    if not isinstance(value, dict):
        raise RecipeError(f"expected a table, found {found(value)}", file=file, key=path or "(top level)")
    for key, sub in value.items():
        if key not in spec.fields:
            raise RecipeError(
                f"unknown key {key!r}" + (f" in [{path}]" if path else ""),
                file=file,
                key=join_key(path, key),
                hint=did_you_mean(key, spec.fields) or f"known keys here: {', '.join(spec.fields)}",
            )
        _walk(spec.fields[key], sub, file, join_key(path, key), required=required, source_of=source_of)
    if spec.check is not None:
        problem = spec.check(value)
        if problem is not None:
            key, message, hint = problem
            raise RecipeError(message, file=file, key=join_key(path, key), hint=hint)
    for key, sub_spec in spec.fields.items():
        if required and getattr(sub_spec, "required", False) and key not in value:
            expected = f"expected {type_name(sub_spec.types)}" if isinstance(sub_spec, Field) else ""
            doc = f" ({sub_spec.doc})" if sub_spec.doc else ""
            raise RecipeError(
                f"missing required key: {expected}{doc}",
                file=source_of(path) if source_of else file,
                key=join_key(path, key),
            )


def _check_number(spec: Field, value: Union[int, float], file: str, path: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise RecipeError(f"expected a finite number, found {found(value)}", file=file, key=path)
    low, high = spec.minimum, spec.maximum
    if (low is None or value >= low) and (high is None or value <= high):
        return
    if low is not None and high is not None:
        allowed = f"from {low} to {high}"
    else:
        allowed = f"of at least {low}" if low is not None else f"of at most {high}"
    raise RecipeError(
        f"expected {type_name(spec.types)} {allowed}, found {found(value)}", file=file, key=path
    )


def _check_field(spec: Field, value: Any, file: str, path: str) -> None:
    types = spec.types if isinstance(spec.types, tuple) else (spec.types,)
    # bool is an int subclass in Python; TOML keeps them apart, so do we.
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if not ok:
        raise RecipeError(f"expected {type_name(spec.types)}, found {found(value)}", file=file, key=path)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        _check_number(spec, value, file, path)
    if spec.items is not None:
        for i, item in enumerate(value):
            if not isinstance(item, spec.items) or isinstance(item, bool):
                raise RecipeError(
                    f"expected {type_name(spec.items)}, found {found(item)}", file=file, key=f"{path}[{i}]"
                )
            if isinstance(item, str):
                _check_text(spec, item, file, f"{path}[{i}]")
    if isinstance(value, str):
        _check_text(spec, value, file, path)
    if spec.choices and value not in spec.choices:
        raise RecipeError(
            f"expected one of {', '.join(spec.choices)}, found {found(value)}",
            file=file,
            key=path,
            hint=did_you_mean(str(value), spec.choices),
        )
    if spec.pattern and isinstance(value, str) and not re.fullmatch(spec.pattern, value):
        like = f"a value like {spec.example!r}" if spec.example else f"a value matching {spec.pattern}"
        raise RecipeError(f"expected {like}, found {found(value)}", file=file, key=path)


def _check_text(spec: Field, value: str, file: str, path: str) -> None:
    """Every string: nothing a script, argument or variable cannot carry; then the field's own rule."""
    bad = control_problem(value, prose=spec.prose)
    if bad is not None:
        what, hint = bad
        raise RecipeError(
            f"{what} is not allowed in this value, found {found(value)}", file=file, key=path, hint=hint
        )
    problem = spec.rule.check(value) if spec.rule else None
    if problem is not None:
        message, hint = problem
        raise RecipeError(message, file=file, key=path, hint=hint)
