"""The registry of failure signatures ``envbuilder explain`` matches a job's output against (pure): the format of its
files, the checks that keep a site's own patterns safe to run, and the matching.

A registry file is TOML: ``schema_version = 1`` and ``[[signature]]`` entries, each with

- ``id``: a name (lower case, digits, ``-``), unique across every file read;
- ``contains``: plain strings, any of which found in a line is a match (case as written), and/or ``regex``:
  simple patterns searched line by line (:func:`pattern_problem` says which are refused);
- ``means``: the fact the message implies; ``fix``: what to do; ``source``: where the message is explained (a
  public URL, and the date it was read);
- optional ``summary`` (one line), ``doctor = true`` (the env itself may be at fault: ``envbuilder doctor ENV``
  is offered) and ``[signature.facts]``: name = a pattern with one group, searched in the matched lines (then the
  whole output) for a value the explanation names (:data:`KNOWN_FACTS` are the ones it ties to the env).

``{name}`` in ``means`` and ``fix`` is replaced by that fact where it was found. Input is bounded: the caller
hands at most :data:`MAX_TEXT` characters, each line is cut at :data:`MAX_LINE`, and a pattern may not nest
repetitions, repeat a group or an alternation, refer back or look around (no catastrophic backtracking)."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Optional

from envbuilder.core.errors import RecipeError, did_you_mean
from envbuilder.core.structs import dataclass

if sys.version_info >= (3, 11):
    from re import _parser as _sre  # type: ignore[attr-defined,unused-ignore]
else:  # pragma: no cover - Python < 3.11 only
    import sre_parse as _sre  # novermin - deprecated only from 3.11, where the branch above is taken

SCHEMA_VERSION = 1
#: The characters of a job's output that are matched (its end, where a failure is): the caller cuts it.
MAX_TEXT = 16 * 1024 * 1024
#: A line is matched up to this many characters (a progress bar's line can be megabytes long).
MAX_LINE = 4096
MAX_PATTERN = 300
#: Repetitions one pattern may hold (each may scan a line once more).
MAX_REPEATS = 3
#: Facts the explanation ties to the env: the job's GPU architecture, a Python module, a shared library, the
#: driver's CUDA version.
KNOWN_FACTS = ("gpu_sm", "wheel_sms", "module", "library", "driver_cuda")
_FIELDS = ("id", "summary", "contains", "regex", "means", "fix", "source", "doctor", "facts")
_REQUIRED = ("id", "means", "fix", "source")
_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
_FACT = re.compile(r"[a-z][a-z0-9_]{0,31}")
#: ``{fact}`` or ``{fact|words for when the output did not tell it}`` in ``means`` and ``fix``.
_PLACEHOLDER = re.compile(r"\{([a-z][a-z0-9_]{0,31})(?:\|([^{}]*))?\}")


@dataclass(frozen=True)
class Signature:
    id: str
    means: str
    fix: str
    source: str
    contains: tuple[str, ...] = ()
    regex: tuple[str, ...] = ()
    summary: str = ""
    doctor: bool = False
    facts: tuple[tuple[str, str], ...] = ()
    #: The file it came from (a site's, or the shipped one's name).
    file: str = ""


@dataclass(frozen=True)
class Match:
    signature: Signature
    #: The first matching lines (1-based number, text cut to one screen line).
    lines: tuple[tuple[int, str], ...]
    count: int
    facts: tuple[tuple[str, str], ...] = ()

    @property
    def fact(self) -> dict[str, str]:
        return dict(self.facts)

    def text(self, field: str) -> str:
        """``means`` or ``fix`` with each ``{fact}`` filled in; where the output did not tell it, the words after
        a bar (``{gpu_sm|the GPU's}``), else "?"."""
        found = dict(self.facts)
        declared = {name for name, _ in self.signature.facts}

        def fill(match: re.Match[str]) -> str:
            name, fallback = match.group(1), match.group(2)
            if name not in declared:
                return match.group(0)
            return found.get(name, "?" if fallback is None else fallback)

        return _PLACEHOLDER.sub(fill, str(getattr(self.signature, field)))


# ---------------------------------------------------------------------------------------------------------------
# Reading a registry file


def parse(doc: Mapping[str, Any], file: str) -> list[Signature]:
    """The signatures of one parsed registry file, each field checked; errors name the file and the entry."""
    version = doc.get("schema_version")
    if version != SCHEMA_VERSION:
        raise RecipeError(
            f"expected schema_version = {SCHEMA_VERSION}, found {version!r}", file=file, key="schema_version"
        )
    for key in doc:
        if key not in ("schema_version", "signature"):
            raise RecipeError(
                f"unknown key {key!r}", file=file, key=key, hint="expected [[signature]] entries"
            )
    entries = doc.get("signature", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise RecipeError("expected [[signature]] tables", file=file, key="signature")
    return [_signature(entry, file, f"signature[{i}]") for i, entry in enumerate(entries)]


def _signature(entry: Mapping[str, Any], file: str, where: str) -> Signature:
    for key in entry:
        if key not in _FIELDS:
            hint = did_you_mean(key, _FIELDS) or f"expected one of {', '.join(_FIELDS)}"
            raise RecipeError(f"unknown key {key!r}", file=file, key=f"{where}.{key}", hint=hint)
    for key in _REQUIRED:
        if not isinstance(entry.get(key), str) or not entry[key].strip():
            raise RecipeError("expected a non-empty string", file=file, key=f"{where}.{key}")
    sid = entry["id"]
    if not _ID.fullmatch(sid):
        raise RecipeError(
            f"id {sid!r}: expected lower-case letters, digits and '-'", file=file, key=f"{where}.id"
        )
    where = f"signature {sid!r}"
    contains, regex = _patterns(entry, file, where)
    doctor = entry.get("doctor", False)
    if not isinstance(doctor, bool):
        raise RecipeError("expected true or false", file=file, key=f"{where}.doctor")
    summary = entry.get("summary", "")
    if not isinstance(summary, str):
        raise RecipeError("expected a string", file=file, key=f"{where}.summary")
    return Signature(
        id=sid,
        means=entry["means"].strip(),
        fix=entry["fix"].strip(),
        source=entry["source"].strip(),
        contains=contains,
        regex=regex,
        summary=summary.strip(),
        doctor=doctor,
        facts=_facts_table(entry.get("facts", {}), file, where),
        file=file,
    )


def _patterns(entry: Mapping[str, Any], file: str, where: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    contains = _strings(entry.get("contains", []), file, f"{where}.contains")
    regex = _strings(entry.get("regex", []), file, f"{where}.regex")
    if not contains and not regex:
        raise RecipeError("expected contains or regex (what to look for)", file=file, key=where)
    for text in contains:
        if "\n" in text or len(text) > MAX_PATTERN:
            raise RecipeError(
                f"{text[:40]!r}: expected one line of at most {MAX_PATTERN} characters",
                file=file,
                key=f"{where}.contains",
            )
    for pattern in regex:
        _require_safe(pattern, file, f"{where}.regex")
    return contains, regex


def _facts_table(facts: object, file: str, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(facts, dict):
        raise RecipeError("expected a table of name = pattern", file=file, key=f"{where}.facts")
    for name, pattern in facts.items():
        key = f"{where}.facts.{name}"
        if not _FACT.fullmatch(name) or not isinstance(pattern, str):
            raise RecipeError('expected name = "pattern" (a lower-case name)', file=file, key=key)
        _require_safe(pattern, file, key)
        if re.compile(pattern).groups != 1:
            raise RecipeError(f"{pattern!r}: expected exactly one (group), the value", file=file, key=key)
    return tuple(facts.items())


def _strings(value: object, file: str, key: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise RecipeError("expected an array of non-empty strings", file=file, key=key)
    return tuple(value)


def _require_safe(pattern: str, file: str, key: str) -> None:
    problem = pattern_problem(pattern)
    if problem is not None:
        raise RecipeError(
            f"{pattern!r}: {problem}",
            file=file,
            key=key,
            hint="use a plain string in contains, or a simpler pattern (a literal part anchors it)",
        )


def pattern_problem(pattern: str) -> Optional[str]:
    """Why ``pattern`` is refused (None where it may run): too long, not a pattern, or one whose time could grow
    faster than its input (a repetition of anything but one character or class, back references, look-around),
    or with more than :data:`MAX_REPEATS` repetitions."""
    if len(pattern) > MAX_PATTERN:
        return f"longer than {MAX_PATTERN} characters"
    try:
        parsed = _sre.parse(pattern)
    except re.error as exc:
        return f"not a regular expression: {exc}"
    repeats: list[int] = []
    problem = _walk(parsed.data, repeats)
    if problem is None and len(repeats) > MAX_REPEATS:
        problem = f"more than {MAX_REPEATS} repetitions (+, *, {{m,n}})"
    return problem


_ATOMS = frozenset(
    str(n) for n in ("LITERAL", "NOT_LITERAL", "IN", "ANY", "CATEGORY", "AT", "RANGE", "NEGATE", "CHARSET")
)


_REPEATS = frozenset({"MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"})
_REFUSED = {
    "GROUPREF": "a back reference",
    "GROUPREF_EXISTS": "a back reference",
    "ASSERT": "a look-around or atomic group",
    "ASSERT_NOT": "a look-around or atomic group",
    "ATOMIC_GROUP": "a look-around or atomic group",
}


def _walk(items: Iterable[Any], repeats: list[int]) -> Optional[str]:
    for op, arg in items:
        problem = _problem(str(op), arg, repeats)
        if problem:
            return problem
    return None


def _problem(name: str, arg: Any, repeats: list[int]) -> Optional[str]:
    if name in _REPEATS:
        repeats.append(1)
        body = list(arg[2])
        if len(body) == 1 and str(body[0][0]) in _ATOMS:
            return None
        return "a repetition of more than one character or class (nested or grouped repeats backtrack)"
    if name in ("SUBPATTERN", "BRANCH"):
        children = [arg[-1]] if name == "SUBPATTERN" else list(arg[1])
        return next((p for p in (_walk(c, repeats) for c in children) if p), None)
    if name in _REFUSED:
        return _REFUSED[name]
    return None if name in _ATOMS else f"an unsupported construct ({name.lower()})"


def merge(shipped: Sequence[Signature], site: Sequence[Signature]) -> list[Signature]:
    """One registry: a site's entry replaces the shipped one of its id (the site knows its machines better);
    two of one id within the site's own files are an error naming both."""
    seen: dict[str, Signature] = {}
    for sig in site:
        if sig.id in seen:
            raise RecipeError(
                f"signature {sig.id!r} is defined twice (also in {seen[sig.id].file})",
                file=sig.file,
                key=sig.id,
            )
        seen[sig.id] = sig
    return [*seen.values(), *(s for s in shipped if s.id not in seen)]


# ---------------------------------------------------------------------------------------------------------------
# Matching

#: Matching lines kept per signature for the report.
SHOWN_LINES = 3


def match(text: str, registry: Sequence[Signature]) -> list[Match]:
    """The signatures found in ``text`` (already cut to :data:`MAX_TEXT`), in the order their first line comes."""
    lines = [line[:MAX_LINE] for line in text[-MAX_TEXT:].splitlines()]
    compiled = [(sig, [re.compile(p) for p in sig.regex]) for sig in registry]
    found: dict[str, tuple[Signature, list[int]]] = {}
    for number, line in enumerate(lines, 1):
        for sig, patterns in compiled:
            if any(s in line for s in sig.contains) or any(p.search(line) for p in patterns):
                found.setdefault(sig.id, (sig, []))[1].append(number)
    matches = []
    for sig, numbers in found.values():
        shown = tuple((n, _shown(lines[n - 1])) for n in numbers[:SHOWN_LINES])
        matches.append(Match(sig, shown, len(numbers), _facts(sig, numbers, lines)))
    return sorted(matches, key=lambda m: m.lines[0][0])


#: Lines after the last matching line, and before the first, where a fact is looked for next.
NEAR = 12


def _facts(sig: Signature, numbers: Sequence[int], lines: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """Each fact from the nearest line that tells it: the matching lines, then the lines right after the last
    (a block the message heads), then those right before the first (nearest first), then anywhere."""
    first, last = numbers[0], numbers[-1]
    order = [
        *(lines[n - 1] for n in numbers),
        *lines[last : last + NEAR],
        *reversed(lines[max(0, first - 1 - NEAR) : first - 1]),
        *lines,
    ]
    out = []
    for name, pattern in sig.facts:
        compiled = re.compile(pattern)
        value = next((m.group(1) for m in map(compiled.search, order) if m and m.group(1)), None)
        if value is not None:
            out.append((name, value.strip()[:200]))
    return tuple(out)


def _shown(line: str) -> str:
    line = line.strip()
    return line if len(line) <= 200 else line[:197] + "..."
