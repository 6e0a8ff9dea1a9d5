"""envbuilder's own modules parsed once per test process: the checks that read the package's source (no shell or
scheduler named outside its registry, no verb imported below the CLI, no process started by a pure module) share
the trees, since parsing the whole package takes over a second each time. Callers only read a tree."""

from __future__ import annotations

import ast
import functools
from pathlib import Path


def parse(path: Path) -> ast.Module:
    """The syntax tree of ``path`` as it reads now (keyed by its text, so a file that changes is parsed again)."""
    return _parse(path.read_text(encoding="utf-8"), str(path))


@functools.cache
def _parse(text: str, filename: str) -> ast.Module:
    return ast.parse(text, filename)
