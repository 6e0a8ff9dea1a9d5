"""``dataclass`` as the standard library's, with its methods made without compiling.

Why it exists: on Python 3.11 and 3.12 the standard decorator compiles source for each method it adds (``exec``,
about 0.13 ms each, six for a frozen class), and a create imports some 150 dataclasses before it starts. Here no
method of a plain class is compiled: the standard decorator only collects the fields (``init``, ``repr``, ``eq``
and ``frozen`` off), and the methods are closures over the field names, with the same behaviour: ``__init__``
binds its arguments as the compiled one does (defaults, default factories, ``__post_init__``, and the same
TypeError in the same words for a missing, unexpected, repeated or surplus argument), a frozen class's
``__setattr__`` and ``__delattr__`` raise FrozenInstanceError as the standard ones do, the repr ``Name(a=1,
b='x')`` covers the fields shown in it, equality holds only with an instance of the very same class over the
compared fields, a frozen class is hashed over its hashed fields and an unfrozen one is unhashable; a method the
class defines itself is kept, and ``__dataclass_params__`` says what was asked. A plain class has no option but
``frozen``, no base but ``object``, and only ordinary fields; any other (a dataclass base, ``init=False`` fields,
``kw_only``, ``InitVar``) gets ``__init__``, ``__setattr__`` and ``__delattr__`` from the standard decorator. Options
this module does not speak for (``order``, ``unsafe_hash``, ``eq=False``, ``repr=False``) get the standard
decorator whole. Instances made with every field given by position (a restore's 15,000 RECORD entries) cost what
the compiled ``__init__`` costs; keyword calls about 4 us more (a create makes some 500).

What it saves (issue 35/36, 2026-11-29, the 2-core VM, ``scripts/bench_startup.py --against DIR``, minima of 20
fresh processes): a create's imports (``import envbuilder.cli, envbuilder.commands.create,
envbuilder.build.create``) 311 ms against 480 ms with the standard decorator (0.65x) and 440 ms with only the three
reading methods made here (0.74x); a restore's imports 0.64x and 0.73x; ``envbuilder plan local --json`` 0.67x and
0.76x. The CLI's own imports hold no dataclass, so ``--help`` is the same either way. How it is checked:
behaviour, by tests/unit/test_structs.py, which makes each class shape with both decorators and compares what
instances show, compare and hash, and what calls bind or raise, and counts that a plain class compiles nothing;
the saving, by ``scripts/bench_startup.py --only create-imports restore-imports plan --against DIR``, with DIR a
copy of the package whose ``structs.dataclass`` is the standard one. Drop this module when that saving is gone
(a Python whose decorator no longer compiles each method on its own).

Type checkers see the standard decorator (``TYPE_CHECKING``), so they check these classes as dataclasses.
"""

from __future__ import annotations

import dataclasses
import reprlib
import sys
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
#: The only options under which this module also makes ``__init__`` (and a frozen class's ``__setattr__`` and
#: ``__delattr__``): any other (``kw_only``, ``slots``, ``init=False``, ...) gets them from the standard decorator.
_OWN_INIT_OPTIONS = frozenset({"frozen"})


def _make(cls: type, options: dict[str, Any]) -> type:
    if (
        any(options.get(name) for name in _WHOLE)
        or options.get("eq") is False
        or options.get("repr") is False
    ):
        return dataclasses.dataclass(cls, **options)
    explicit_hash = _explicit_hash(cls)
    frozen = bool(options.get("frozen"))
    own_init = _plain(cls, options)
    if own_init:
        body = cls.__dict__
        if not body.get("__doc__"):  # else the standard decorator asks inspect for a signature
            cls.__doc__ = f"{cls.__name__}({', '.join(body.get('__annotations__', ()))})"
        # Fields only: the standard decorator compiles nothing for this class.
        cls = dataclasses.dataclass(
            cls, **{**options, "init": False, "repr": False, "eq": False, "frozen": False}
        )
    else:
        cls = dataclasses.dataclass(cls, **{**options, "repr": False, "eq": False})
    fields = dataclasses.fields(cls)
    own = cls.__dict__
    if own_init:
        _add_init(cls, fields, frozen)
    if "__repr__" not in own:
        cls.__repr__ = _repr_of(tuple(f.name for f in fields if f.repr))  # type: ignore[method-assign,assignment]
    if "__eq__" not in own:
        cls.__eq__ = _eq_of(tuple(f.name for f in fields if f.compare))  # type: ignore[method-assign,assignment]
    if not explicit_hash:
        hashed = tuple(f.name for f in fields if (f.compare if f.hash is None else f.hash))
        cls.__hash__ = _hash_of(hashed) if frozen else None  # type: ignore[method-assign,assignment]
    return cls


def _plain(cls: type, options: dict[str, Any]) -> bool:
    """Whether this module makes the class's ``__init__`` (and, frozen, its ``__setattr__``/``__delattr__``): no
    option but ``frozen``, no base but ``object``, none of those methods or ``__slots__`` in the class body, and
    every field an ordinary one (no ``init=False``, ``kw_only``, ``InitVar`` or ``KW_ONLY``). Every other class gets
    them from the standard decorator, as before."""
    if not set(options) <= _OWN_INIT_OPTIONS or cls.__bases__ != (object,):
        return False
    body = cls.__dict__
    if any(name in body for name in ("__init__", "__setattr__", "__delattr__", "__slots__")):
        return False
    for value in body.values():
        if isinstance(value, dataclasses.Field) and (
            not value.init or getattr(value, "kw_only", None) is True
        ):
            return False
    # A string annotation or the object itself: str() of either names InitVar or KW_ONLY.
    return not any(
        "InitVar" in str(kind) or "KW_ONLY" in str(kind) for kind in body.get("__annotations__", {}).values()
    )


def _add_init(cls: type, fields: tuple[dataclasses.Field[Any], ...], frozen: bool) -> None:
    names = tuple(f.name for f in fields)
    defaults = {f.name: f.default for f in fields if f.default is not dataclasses.MISSING}
    factories = {f.name: f.default_factory for f in fields if f.default_factory is not dataclasses.MISSING}
    optional = [name in defaults or name in factories for name in names]
    if any(optional[i] and not optional[i + 1] for i in range(len(names) - 1)):
        follows = names[optional.index(False, optional.index(True))]
        raise TypeError(f"non-default argument {follows!r} follows default argument")
    init = _init_fn(cls.__qualname__, names, defaults, factories, hasattr(cls, "__post_init__"))
    cls.__init__ = init  # type: ignore[misc]
    if frozen:
        cls.__setattr__, cls.__delattr__ = _frozen_fns(cls, frozenset(names))  # type: ignore[method-assign]
    params = cls.__dataclass_params__  # type: ignore[attr-defined]
    params.init, params.frozen = True, frozen  # as declared: a frozen subclass checks its base's


def _init_fn(
    qualname: str,
    names: tuple[str, ...],
    defaults: dict[str, Any],
    factories: dict[str, Callable[[], Any]],
    post_init: bool,
) -> Callable[..., None]:
    """``__init__`` over ``names``, binding its arguments as the standard decorator's compiled one does (the same
    errors, in the same words). Every field given by position, in order, takes the fast path: a restore makes
    15,000 RECORD entries so, as fast as the compiled method."""
    count, known = len(names), frozenset(names)
    title = f"{qualname}.__init__()" if sys.version_info >= (3, 10) else "__init__()"  # as CPython names it
    required = sum(name not in defaults and name not in factories for name in names)
    takes = f"{count + 1}" if required == count else f"from {required + 1} to {count + 1}"

    def bound(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        if len(args) > count:
            raise TypeError(f"{title} takes {takes} positional arguments but {len(args) + 1} were given")
        values = dict(zip(names, args))
        for key in kwargs:
            if key not in known:
                raise TypeError(f"{title} got an unexpected keyword argument {key!r}")
            if key in values:
                raise TypeError(f"{title} got multiple values for argument {key!r}")
        values.update(kwargs)
        missing = [
            name for name in names if name not in values and name not in defaults and name not in factories
        ]
        if missing:
            raise TypeError(f"{title} missing {_arguments(missing)}")
        return {
            name: values[name]
            if name in values
            else defaults[name]
            if name in defaults
            else factories[name]()
            for name in names
        }

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if not kwargs and len(args) == count:
            self.__dict__.update(zip(names, args))
        else:
            self.__dict__.update(bound(args, kwargs))
        if post_init:
            self.__post_init__()

    __init__.__qualname__ = f"{qualname}.__init__"
    return __init__


def _arguments(missing: list[str]) -> str:
    """``1 required positional argument: 'a'``, ``2 ...: 'a' and 'b'``, ``3 ...: 'a', 'b', and 'c'`` (CPython's)."""
    quoted = [repr(name) for name in missing]
    said = (
        quoted[0]
        if len(quoted) == 1
        else f"{', '.join(quoted[:-1])}{',' if len(quoted) > 2 else ''} and {quoted[-1]}"
    )
    return f"{len(missing)} required positional argument{'s' if len(missing) > 1 else ''}: {said}"


def _frozen_fns(cls: type[Any], names: frozenset[str]) -> tuple[Callable[..., None], Callable[..., None]]:
    """A frozen class's ``__setattr__`` and ``__delattr__``, as the standard decorator makes them."""

    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)

    return __setattr__, __delattr__


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
