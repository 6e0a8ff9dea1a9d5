"""``dataclass`` as the standard library's, with ``__repr__``, ``__eq__`` and ``__hash__`` made without compiling.

Why it exists: on Python 3.11 the standard decorator compiles source for each method it adds (``exec``, about
0.13 ms each, six for a frozen class), and a create imports 94 of envbuilder's ~127 dataclasses before it starts.
Here the standard decorator still makes ``__init__`` and the frozen class's ``__setattr__`` and ``__delattr__``
(they are the class's contract), and the three methods that only read fields are plain closures over the field
names, with the same behaviour: the repr ``Name(a=1, b='x')`` over the fields shown in it, equality only with an
instance of the very same class over the compared fields, a frozen class hashed over its hashed fields, and an
unfrozen one left unhashable; a method the class defines itself is kept. Options this module does not speak for
(``order``, ``unsafe_hash``, ``eq=False``, ``repr=False``) get the standard decorator whole.

What it saves, measured again for issue 35 (2026-11-28, the 2-core VM, BENCHMARKS.md "Start-up (issue 35)"),
against the same tree with the standard decorator, minima of 30 fresh processes: a create's imports (``import
envbuilder.cli, envbuilder.commands.create, envbuilder.build.create``) 191 against 295 ms, ``envbuilder plan local
--json`` 154 against 330 ms (the CLI's own imports hold no dataclass, so ``--help`` is the same either way). How it is checked: behaviour, by
tests/unit/test_structs.py, which makes each class shape with both decorators and compares what instances show,
compare and hash; the saving, by ``scripts/bench_startup.py --only create-imports plan --against DIR``, with DIR a
copy of the package whose ``structs.dataclass`` is the standard one. Drop this module when that saving is gone
(a Python whose decorator no longer compiles).

Type checkers see the standard decorator (``TYPE_CHECKING``), so they check these classes as dataclasses.
"""

from __future__ import annotations

import dataclasses
import reprlib
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from dataclasses import dataclass as dataclass  # noqa: PLC0414 - re-exported for mypy's strict mode
else:

    def dataclass(cls: Any = None, /, **options: Any) -> Any:
        """``@dataclass`` or ``@dataclass(frozen=True)``, as the standard decorator behaves."""

        def wrap(cls: type) -> type:
            return _make(cls, options)

        return wrap if cls is None else wrap(cls)


#: Options whose methods the standard decorator must make itself.
_WHOLE = ("order", "unsafe_hash")


def _make(cls: type, options: dict[str, Any]) -> type:
    if (
        any(options.get(name) for name in _WHOLE)
        or options.get("eq") is False
        or options.get("repr") is False
    ):
        return dataclasses.dataclass(cls, **options)
    explicit_hash = _explicit_hash(cls)
    cls = dataclasses.dataclass(cls, **{**options, "repr": False, "eq": False})
    fields = dataclasses.fields(cls)
    own = cls.__dict__
    if "__repr__" not in own:
        cls.__repr__ = _repr_of(tuple(f.name for f in fields if f.repr))  # type: ignore[method-assign,assignment]
    if "__eq__" not in own:
        cls.__eq__ = _eq_of(tuple(f.name for f in fields if f.compare))  # type: ignore[method-assign,assignment]
    if not explicit_hash:
        hashed = tuple(f.name for f in fields if (f.compare if f.hash is None else f.hash))
        cls.__hash__ = _hash_of(hashed) if options.get("frozen") else None  # type: ignore[method-assign,assignment]
    return cls


def _explicit_hash(cls: type) -> bool:
    """Whether the class body set ``__hash__`` itself (defining ``__eq__`` alone sets it to None, which is not)."""
    own = cls.__dict__.get("__hash__", dataclasses.MISSING)
    return not (own is dataclasses.MISSING or (own is None and "__eq__" in cls.__dict__))


def _values(self: Any, names: tuple[str, ...]) -> tuple[Any, ...]:
    return tuple(getattr(self, name) for name in names)


def _repr_of(names: tuple[str, ...]) -> Callable[[Any], str]:
    @reprlib.recursive_repr()
    def __repr__(self: Any) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in names)
        return f"{type(self).__qualname__}({shown})"

    return __repr__


def _eq_of(names: tuple[str, ...]) -> Callable[[Any, Any], Any]:
    def __eq__(self: Any, other: Any) -> Any:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return _values(self, names) == _values(other, names)

    return __eq__


def _hash_of(names: tuple[str, ...]) -> Callable[[Any], int]:
    def __hash__(self: Any) -> int:
        return hash(_values(self, names))

    return __hash__
