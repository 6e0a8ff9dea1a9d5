"""Thin package faces: every ``__init__.py`` under envbuilder/ describes its package and re-exports at most. The
logic lives in named modules, so a reader finds a function in the module its name says, and importing one module
of a package does not run another's code by surprise."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import envbuilder

PACKAGE = Path(envbuilder.__file__).resolve().parent
#: Under this many lines: a docstring, the imports it re-exports and ``__all__``.
MAX_LINES = 60


def face_problems(init: Path) -> list[str]:
    """What makes ``init`` more than a face: too many lines, or a function or class defined in it."""
    text = init.read_text(encoding="utf-8")
    where = init.relative_to(PACKAGE.parent)
    problems = []
    lines = len(text.splitlines())
    if lines >= MAX_LINES:
        problems.append(f"{where}: {lines} lines (a face stays under {MAX_LINES})")
    problems += [
        f"{where}:{node.lineno}: defines the {kind} {node.name} (move it to a named module)"
        for node, kind in _definitions(ast.parse(text, str(init)))
    ]
    return problems


def _definitions(node: ast.AST) -> list[tuple[ast.AST, str]]:
    """The functions and classes ``node`` defines, at any depth (under an ``if`` or a ``try`` too), each named once:
    a class's methods and a function's inner functions are its own."""
    found: list[tuple[ast.AST, str]] = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.ClassDef):
            found.append((child, "class"))
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.append((child, "function"))
        else:
            found += _definitions(child)
    return found


def test_every_package_face_only_describes_and_re_exports() -> None:
    inits = sorted(PACKAGE.rglob("__init__.py"))
    assert len(inits) > 5, inits  # the walk found the packages
    problems = [p for init in inits for p in face_problems(init)]
    assert not problems, "\n".join(problems)


def test_the_check_sees_a_fat_face(tmp_path: Path, monkeypatch) -> None:
    fat = tmp_path / "envbuilder" / "fat" / "__init__.py"
    fat.parent.mkdir(parents=True)
    fat.write_text(
        '"""A face."""\n\nclass Thing:\n    pass\n\n\nasync def later():\n    def inner():\n        pass\n'
        + "try:\n    import x\nexcept ImportError:\n    def x(): ...\n"
        + "\n" * MAX_LINES,
        encoding="utf-8",
    )
    monkeypatch.setattr(f"{__name__}.PACKAGE", tmp_path / "envbuilder")
    assert face_problems(fat) == [
        f"envbuilder/fat/__init__.py: {MAX_LINES + 13} lines (a face stays under {MAX_LINES})",
        "envbuilder/fat/__init__.py:3: defines the class Thing (move it to a named module)",
        "envbuilder/fat/__init__.py:7: defines the function later (move it to a named module)",
        "envbuilder/fat/__init__.py:13: defines the function x (move it to a named module)",
    ]


#: The packages whose face is loaded on first use (core.faces.lazy).
LAZY_FACES = ("envbuilder.plan", "envbuilder.backup")


def _fresh(code: str) -> list[str]:
    """What a fresh interpreter prints for ``code`` (one module name a line): sys.modules of this one already
    holds everything the suite imported."""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return res.stdout.split()


def test_a_module_of_a_lazy_package_loads_without_the_rest_of_its_face() -> None:
    """Importing plan.prefix (what backends.base needs) runs none of the planner, and backup.catalog none of the
    writer or upkeep: the reason the faces are lazy (a restore no longer imports the planner)."""
    loaded = _fresh(
        "import sys, envbuilder.plan.prefix, envbuilder.backup.catalog\n"
        "print(*[m for m in sys.modules if m.startswith(('envbuilder.plan', 'envbuilder.backup'))], sep='\\n')"
    )
    assert "envbuilder.plan.prefix" in loaded and "envbuilder.backup.catalog" in loaded
    for heavy in ("envbuilder.plan.planning", "envbuilder.plan.record", "envbuilder.backup.writer"):
        assert heavy not in loaded, loaded
    assert "envbuilder.backup.upkeep" not in loaded, loaded


@pytest.mark.parametrize("package", LAZY_FACES)
def test_a_lazy_face_gives_what_its_type_checking_imports_name(package: str) -> None:
    """Each name the face's ``TYPE_CHECKING`` block imports (what mypy and import-linter see) is, at run time,
    the very object of the module named there, and ``__all__`` lists exactly those and the eager names."""
    module = importlib.import_module(package)
    tree = ast.parse(Path(module.__file__ or "").read_text(encoding="utf-8"))
    checked = [
        (imp.module or "", alias.name, alias.asname)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for imp in node.body
        if isinstance(imp, ast.ImportFrom)
        for alias in imp.names
    ]
    assert checked and all(name == asname for _, name, asname in checked), (
        checked
    )  # re-exported as mypy wants
    for home, name, _ in checked:
        assert getattr(module, name) is getattr(importlib.import_module(home), name), (package, name)
    eager = {n for n in module.__all__ if n in vars(module)} - {name for _, name, _ in checked}
    assert sorted(module.__all__) == sorted({name for _, name, _ in checked} | eager)
    with pytest.raises(AttributeError, match="has no attribute 'nothing_here'"):
        module.nothing_here  # noqa: B018
