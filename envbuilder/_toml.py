"""TOML reading on every supported Python (tomllib from 3.11, the tomli backport before)."""

from __future__ import annotations

import sys
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib as _toml  # novermin - guarded by the version check above
else:  # pragma: no cover - exercised on Python < 3.11 only
    import tomli as _toml  # type: ignore[import-not-found,no-redef,unused-ignore]

TOMLDecodeError = _toml.TOMLDecodeError


def loads(text: str) -> dict[str, Any]:
    data: dict[str, Any] = _toml.loads(text)
    return data
