"""The top of the layers, read from the source: one module per verb in ``commands/``, and no verb module imports
another (what two verbs share lives below them: host facts in ``system.host``, the index read in
``resolver.indexread``, a validation run as the verbs show it in ``validate.session``); nothing below ``cli`` and
``commands`` imports either of them (``__main__`` is the one module above both).

Every import statement counts, those inside functions and ``if TYPE_CHECKING:`` blocks too (the layers contract
sees them all), as does ``importlib.import_module`` with a literal name.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import sourcetrees

import envbuilder

PACKAGE = Path(envbuilder.__file__).parent
TOP = ("envbuilder.cli", "envbuilder.commands")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, module: str) -> Iterator[tuple[int, str]]:
    """(line, module) for every module ``path`` (the module ``module``) imports: ``from X import Y`` gives ``X.Y``
    (Y may be a submodule), relative imports resolved against the module's package."""
    tree = sourcetrees.parse(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            yield from ((node.lineno, f"{base}.{alias.name}") for alias in node.names)
        elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("import_module") and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                yield node.lineno, first.value
            elif (
                isinstance(first, ast.JoinedStr)
                and first.values
                and isinstance(first.values[0], ast.Constant)
            ):
                yield (
                    node.lineno,
                    str(first.values[0].value),
                )  # f"envbuilder.commands.{name}": its fixed start


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "payloads" not in p.relative_to(PACKAGE).parts[:1])


def test_the_scan_sees_every_kind_of_import(tmp_path: Path) -> None:
    """The scanner's own check: plain, from, relative, function-level, TYPE_CHECKING and import_module imports."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from typing import TYPE_CHECKING\n"
        "import importlib\n"
        "import envbuilder.commands.plan\n"
        "from envbuilder.commands import lock\n"
        "from . import create\n"
        "from .validate import handle\n"
        "if TYPE_CHECKING:\n"
        "    from envbuilder.commands.run import handle as run\n"
        "def f(name):\n"
        "    from envbuilder.commands import doctor\n"
        "    importlib.import_module(f'envbuilder.commands.{name}')\n",
        encoding="utf-8",
    )
    found = {name for _, name in imported(probe, "envbuilder.commands.probe")}
    assert {
        "envbuilder.commands.plan",
        "envbuilder.commands.lock",
        "envbuilder.commands.create",
        "envbuilder.commands.validate.handle",
        "envbuilder.commands.run.handle",
        "envbuilder.commands.doctor",
        "envbuilder.commands.",
    } <= found


def test_no_verb_imports_another_verb() -> None:
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}"
        for path in modules()
        if within(module_name(path), "envbuilder.commands")
        for line, name in imported(path, module_name(path))
        if within(name, "envbuilder.commands")
    ]
    assert not found, (
        "a verb uses another verb's module; move what they share below commands/:\n" + "\n".join(found)
    )


def test_nothing_below_the_cli_imports_the_cli_or_the_commands() -> None:
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}"
        for path in modules()
        if not any(within(module_name(path), top) for top in (*TOP, "envbuilder.__main__"))
        for line, name in imported(path, module_name(path))
        if any(within(name, top) for top in TOP)
    ]
    assert not found, "a module below cli/ and commands/ reaches up into them:\n" + "\n".join(found)
