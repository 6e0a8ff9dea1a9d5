"""envbuilder.core.structs.dataclass behaves as the standard library's decorator: each class shape below is made by
both, and what an instance shows, compares and hashes as is the same (or fails the same way)."""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any, Optional

import pytest

from envbuilder.core import structs
from envbuilder.core.structs import dataclass as ours

DECORATORS = {"stdlib": dataclasses.dataclass, "envbuilder": ours}


def shapes(dc: Any) -> dict[str, Any]:
    """The same class shapes, made with the decorator ``dc``."""

    @dc(frozen=True)
    class Frozen:
        a: int
        b: str = "x"
        hidden: int = dataclasses.field(default=0, repr=False)
        loose: int = dataclasses.field(default=0, compare=False)
        unhashed: int = dataclasses.field(default=0, hash=False)

    @dc
    class Plain:
        a: int
        items: list[int] = dataclasses.field(default_factory=list)

    @dc(frozen=True)
    class Child(Frozen):
        c: Optional[int] = None

    @dc(frozen=True)
    class OwnMethods:
        a: int

        def __repr__(self) -> str:
            return "own repr"

        def __hash__(self) -> int:
            return 7

    @dc(frozen=True)
    class OwnEq:  # noqa: PLW1641 - the shape under test: __eq__ without __hash__
        a: int

        def __eq__(self, other: object) -> bool:
            return True

    @dc(frozen=True, order=True)
    class Ordered:
        a: int

    @dc
    class Node:
        name: str
        child: Any = None

    return {k: v for k, v in locals().items() if isinstance(v, type)}


def views(obj: Any) -> dict[str, Any]:
    """What an instance shows, and how it hashes (or that it cannot)."""
    try:
        hashed: Any = hash(obj)
    except TypeError as exc:
        hashed = f"TypeError: {exc}"
    return {"repr": repr(obj), "hash": hashed}


@pytest.fixture(params=sorted(DECORATORS))
def made(request) -> dict[str, Any]:
    return shapes(DECORATORS[request.param])


def test_repr_equality_and_hash_match_the_standard_decorator():
    std, eb = shapes(dataclasses.dataclass), shapes(ours)
    cases = [
        ("Frozen", (1,), {"b": "y", "hidden": 5, "loose": 2, "unhashed": 3}),
        ("Plain", (1,), {"items": [2]}),
        ("Child", (1,), {"c": 4}),
        ("OwnMethods", (1,), {}),
        ("OwnEq", (1,), {}),
        ("Ordered", (1,), {}),
    ]
    for name, args, kwargs in cases:
        a, b = std[name](*args, **kwargs), eb[name](*args, **kwargs)
        left, right = views(a), views(b)
        left["repr"] = left["repr"].replace("shapes.<locals>.", "")
        right["repr"] = right["repr"].replace("shapes.<locals>.", "")
        if isinstance(left["hash"], int) and name not in ("OwnMethods",):
            # Hash values need only agree within a class; compare what equal instances give instead.
            assert views(eb[name](*args, **kwargs))["hash"] == right["hash"]
            left["hash"] = right["hash"] = "hashable"
        assert left == right, name


def test_equality_follows_the_compared_fields_and_the_exact_class(made):
    frozen, child = made["Frozen"], made["Child"]
    assert frozen(1, loose=1) == frozen(1, loose=2)  # compare=False
    assert frozen(1, unhashed=1) != frozen(1, unhashed=2)  # hash=False still compares
    assert hash(frozen(1, unhashed=1)) == hash(frozen(1, unhashed=2))
    assert frozen(1) != child(1)  # a subclass instance is never equal
    assert frozen(1).__eq__(object()) is NotImplemented
    assert made["OwnEq"](1) == made["OwnEq"](2)  # the class's own __eq__ is kept
    assert hash(made["OwnEq"](1)) == hash(made["OwnEq"](1))  # and the class is still hashed by its fields
    assert hash(made["OwnMethods"](1)) == 7 and repr(made["OwnMethods"](1)) == "own repr"
    assert made["Ordered"](1) < made["Ordered"](2)


def test_unfrozen_classes_are_unhashable_and_frozen_ones_refuse_writes(made):
    with pytest.raises(TypeError, match="unhashable"):
        hash(made["Plain"](1))
    with pytest.raises(dataclasses.FrozenInstanceError):
        made["Frozen"](1).a = 2  # type: ignore[misc]


def test_a_recursive_repr_ends(made):
    node = made["Node"]("n")
    node.child = node
    assert repr(node).endswith("(name='n', child=...)")


def test_the_standard_helpers_still_work():
    frozen = shapes(ours)["Frozen"]
    item = frozen(1, b="y")
    assert dataclasses.replace(item, a=2) == frozen(2, b="y")
    assert dataclasses.asdict(item)["b"] == "y"
    assert [f.name for f in dataclasses.fields(item)][:2] == ["a", "b"]
    assert dataclasses.is_dataclass(item)


def test_envbuilder_classes_pickle_and_compare():
    from envbuilder.core.facts import Gpu  # a frozen dataclass made by structs

    gpu = Gpu(name="NVIDIA H200", memory_mib=143771)
    assert pickle.loads(pickle.dumps(gpu)) == gpu  # noqa: S301 - its own bytes, just made
    assert "NVIDIA H200" in repr(gpu) and hash(gpu) == hash(dataclasses.replace(gpu))
    assert structs.dataclass is ours


def more_shapes(dc: Any) -> dict[str, Any]:
    """Shapes that bind arguments: factories, ``__post_init__``, and the shapes left to the standard decorator."""

    @dc(frozen=True)
    class Many:
        a: int
        b: str
        c: float
        d: list[int] = dataclasses.field(default_factory=list)
        e: str = "e"

    @dc(frozen=True)
    class Checked:
        a: int

        def __post_init__(self) -> None:
            if self.a < 0:
                raise ValueError("a < 0")
            object.__setattr__(self, "seen", True)

    @dc
    class Hidden:  # a field outside __init__: the standard decorator's own __init__
        a: int
        b: int = dataclasses.field(default=5, init=False)

    return {k: v for k, v in locals().items() if isinstance(v, type)}


CALLS: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("Many", (1, "b", 2.0), {}),
    ("Many", (1,), {"b": "b", "c": 2.0, "e": "x"}),
    ("Many", (), {"c": 1.0, "a": 1, "b": "b"}),
    ("Many", (1, "b", 2.0, [3], "x"), {}),
    ("Many", (1,), {}),  # missing b and c
    ("Many", (), {}),  # missing a, b and c
    ("Many", (1, "b"), {}),  # missing c
    ("Many", (1, "b", 2.0, [], "e", "extra"), {}),
    ("Many", (1, "b", 2.0), {"f": 1}),
    ("Many", (1, "b", 2.0), {"a": 2}),
    ("Checked", (1,), {}),
    ("Checked", (-1,), {}),
    ("Hidden", (1,), {}),
    ("Hidden", (1, 2), {}),
]


def outcome(make: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """What a call gives: the instance's repr and fields, or the exception's type and words."""
    try:
        made = make(*args, **kwargs)
    except (TypeError, ValueError) as exc:
        return type(exc).__name__, str(exc).replace("more_shapes.<locals>.", "")
    return repr(made).replace("more_shapes.<locals>.", ""), vars(made)


@pytest.mark.parametrize(("name", "args", "kwargs"), CALLS)
def test_arguments_bind_and_fail_as_with_the_standard_decorator(name, args, kwargs):
    std, eb = more_shapes(dataclasses.dataclass), more_shapes(ours)
    assert outcome(eb[name], args, kwargs) == outcome(std[name], args, kwargs)


def test_a_default_factory_gives_each_instance_its_own_value():
    many = more_shapes(ours)["Many"]
    first, second = many(1, "b", 2.0), many(1, "b", 2.0)
    assert first.d == second.d == [] and first.d is not second.d


def test_frozen_classes_refuse_every_write_and_delete_as_the_standard_decorator_does():
    for dc in DECORATORS.values():
        frozen = shapes(dc)["Frozen"]
        item = frozen(1)
        for attempt in (
            lambda item=item: setattr(item, "a", 2),
            lambda item=item: setattr(item, "new", 1),
            lambda item=item: delattr(item, "b"),
        ):
            with pytest.raises(dataclasses.FrozenInstanceError):
                attempt()
        params = frozen.__dataclass_params__  # type: ignore[attr-defined]
        assert (params.frozen, params.init) == (True, True)
        assert (shapes(dc)["Plain"].__dataclass_params__.frozen) is False  # type: ignore[attr-defined]


def test_class_errors_are_the_standard_decorators():
    for dc in DECORATORS.values():
        frozen = shapes(dc)["Frozen"]
        with pytest.raises(TypeError, match="cannot inherit non-frozen dataclass from a frozen one"):
            dc(type("Loose", (frozen,), {"__annotations__": {"z": "int"}, "z": 0}))
        with pytest.raises(TypeError, match="non-default argument 'b' follows default argument"):
            dc(type("Order", (), {"__annotations__": {"a": "int", "b": "int"}, "a": 0}))


def test_a_plain_class_compiles_no_method(monkeypatch):
    """The point of this module: up to Python 3.12 the standard decorator compiles each method it makes (``exec``,
    six for a frozen class); for a plain class (no option but frozen, no base) this one compiles none. (3.13's
    compiles a class's methods in one ``exec``, which it then runs for this module's classes too.)"""
    import builtins

    real_exec = builtins.exec

    def compiles(dc: Any) -> int:
        compiled: list[object] = []

        def counting(source: Any, *args: Any) -> Any:
            compiled.append(source)
            return real_exec(source, *args)

        monkeypatch.setattr(builtins, "exec", counting)
        try:
            dc(frozen=True)(type("Bare", (), {"__annotations__": {"a": "int", "b": "str"}, "b": "x"}))
            dc(type("Loose", (), {"__annotations__": {"a": "int"}}))
        finally:
            monkeypatch.setattr(builtins, "exec", real_exec)
        return len(compiled)

    standard, here = compiles(dataclasses.dataclass), compiles(ours)
    assert standard >= 2  # at least one per class
    assert here == (0 if standard > 2 else standard)
