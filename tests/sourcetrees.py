"""envbuilder's own modules parsed once per test process: the checks that read the package's source (no shell or
scheduler named outside its registry, no verb imported below the CLI, no process started by a pure module) share
the trees, since parsing the whole package takes over a second each time. Callers only read a tree."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path
from typing import Optional


def parse(path: Path) -> ast.Module:
    """The syntax tree of ``path`` as it reads now (keyed by its text, so a file that changes is parsed again)."""
    return _parse(path.read_text(encoding="utf-8"), str(path))


@functools.cache
def _parse(text: str, filename: str) -> ast.Module:
    return ast.parse(text, filename)


def parse_if(path: Path, pattern: re.Pattern[str]) -> Optional[ast.Module]:
    """The syntax tree of ``path`` where its text matches ``pattern``, else None: for checks that look for a name
    or a value in the code, which a module can hold only where its text spells it (a string built from escapes or
    from adjacent literals aside, which no module here does). Most modules name no shell or scheduler at all, and
    parsing and walking them was most of those checks' time."""
    text = path.read_text(encoding="utf-8")
    return _parse(text, str(path)) if pattern.search(text) else None
