"""Pure modules stay pure: importing one never brings in ``subprocess``, ``envbuilder.system.proc`` or ``urllib.request``,
directly or through another module.

Each module is imported in a fresh interpreter (the test runner has long since imported everything), with a hook on
``__import__`` that records who imports a banned module; that also sees an import of a module another one loaded
first. The source of every envbuilder module it loaded is then read for banned imports inside functions, which
run later and so never show at import time (``if TYPE_CHECKING:`` blocks excepted: they never run).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

import pytest

from envbuilder.core import _toml

BANNED = ("subprocess", "envbuilder.system.proc", "urllib.request")

ROOT = Path(__file__).resolve().parents[2]


def pure_modules() -> tuple[str, ...]:
    """The pure modules, from the one list of them: the ``pure`` contract of ``[tool.importlinter]`` in
    pyproject.toml (import-linter checks it statically; this imports each one in a fresh interpreter). A package named
    there stands for every module in it."""
    config = _toml.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["id"] == "pure"]
    found: list[str] = []
    for name in contract["source_modules"]:
        path = ROOT.joinpath(*name.split("."))
        if path.is_dir():
            found += [
                ".".join(f.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                for f in sorted(path.rglob("*.py"))
            ]
        else:
            found.append(name)
    return tuple(found)


#: Pure by design, and checked so: they compute, and the caller brings what was probed or read.
PURE = pure_modules()

#: Third-party imports of a banned module, allowed by name of the importer only. packaging.specifiers and
#: packaging.utils (which every version and specifier check uses) import packaging.tags, which imports subprocess at
#: import time to ask macOS its version; nothing here calls it. packaging < 22 did the same from _musllinux.
#: Python 3.9's own platform module imports subprocess at import time too (3.10 moved it into the functions that
#: start a process); the pure modules call only platform.machine() and friends, which start none.
ALLOWED_IMPORTERS = {"subprocess": ("packaging.tags", "packaging._musllinux", "platform")}

_CHILD = textwrap.dedent(
    """
    import builtins, importlib, json, sys

    target, banned, path = sys.argv[1], sys.argv[2].split(","), sys.argv[3:]
    sys.path[:0] = path
    seen = []
    real_import = builtins.__import__

    def absolute(name, globals, level):
        if not level:
            return name
        package = (globals or {}).get("__package__") or ""
        base = package.rsplit(".", level - 1)[0] if level > 1 else package
        return f"{base}.{name}" if name else base

    def hook(name, globals=None, locals=None, fromlist=(), level=0):
        full = absolute(name, globals, level)
        importer = (globals or {}).get("__name__", "?")
        for wanted in [full, *(f"{full}.{item}" for item in fromlist or () if item != "*")]:
            if wanted in banned:
                seen.append([importer, wanted])
        return real_import(name, globals, locals, fromlist, level)

    before = set(sys.modules)
    builtins.__import__ = hook
    try:
        importlib.import_module(target)
    finally:
        builtins.__import__ = real_import
    top = target.partition(".")[0]
    ours = {
        name: getattr(module, "__file__", None)
        for name, module in sys.modules.items()
        if name not in before and (name == target or name.partition(".")[0] in (top, "envbuilder"))
    }
    loaded = [name for name in banned if name in sys.modules and name not in before]
    print(json.dumps({"seen": seen, "loaded": loaded, "ours": ours}))
    """
)


def _banned_in_source(path: Path, module: str) -> list[str]:
    """Banned imports anywhere in a module's source, functions included, outside ``if TYPE_CHECKING:`` blocks."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            names = []
        found.extend(f"{name} imported by {module} (line {node.lineno})" for name in names if name in BANNED)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


def import_violations(module: str, path: Sequence[Path] = ()) -> list[str]:
    """What makes ``module`` impure: each banned module it imports, directly or through another module, named with
    its importer. ``path`` goes in front of sys.path (for modules outside the package)."""
    res = subprocess.run(
        [sys.executable, "-c", _CHILD, module, ",".join(BANNED), *map(str, path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, f"importing {module} failed:\n{res.stderr}"
    report = json.loads(res.stdout.splitlines()[-1])
    problems = [
        f"{name} imported by {importer}"
        for importer, name in report["seen"]
        if importer not in ALLOWED_IMPORTERS.get(name, ())
    ]
    # A banned module that came in without an import statement the hook saw (importlib.import_module, C code).
    seen_names = {name for _, name in report["seen"]}
    problems += [f"{name} loaded, importer unknown" for name in report["loaded"] if name not in seen_names]
    for name, file in sorted(report["ours"].items()):
        if file and file.endswith(".py"):
            # Imports that ran are named above already; this adds the ones that run later (inside functions).
            problems += [
                p for p in _banned_in_source(Path(file), name) if p.partition(" (line")[0] not in problems
            ]
    return sorted(set(problems))


@pytest.mark.parametrize("module", PURE)
def test_pure_module_imports_no_process_or_network(module: str) -> None:
    problems = import_violations(module)
    assert not problems, f"{module} is not pure:\n" + "\n".join(problems)


BAD = {
    "direct": "from envbuilder.system import proc\n",
    "direct_dotted": "import envbuilder.system.proc\n",
    "through_another": "import purity_helper\n",
    "subprocess_after_packaging": "import packaging.specifiers\nimport subprocess\n",
    "network": "from urllib import request\n",
    "inside_a_function": "def later():\n    import subprocess\n    return subprocess\n",
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_checker_flags_a_violation(tmp_path: Path, case: str) -> None:
    (tmp_path / "purity_helper.py").write_text("from envbuilder.system.proc import run\n", encoding="utf-8")
    (tmp_path / "purity_bad.py").write_text(
        "from envbuilder.core.facts import HostFacts\n" + BAD[case], encoding="utf-8"
    )
    problems = import_violations("purity_bad", [tmp_path])
    expected = {
        "direct": "envbuilder.system.proc imported by purity_bad",
        "direct_dotted": "envbuilder.system.proc imported by purity_bad",
        "through_another": "envbuilder.system.proc imported by purity_helper",
        "subprocess_after_packaging": "subprocess imported by purity_bad",
        "network": "urllib.request imported by purity_bad",
        "inside_a_function": "subprocess imported by purity_bad (line 3)",
    }[case]
    assert expected in problems, problems


def test_checker_passes_a_clean_module(tmp_path: Path) -> None:
    # The same harness on a module with only pure imports (packaging's own subprocess import included).
    (tmp_path / "purity_clean.py").write_text(
        "import packaging.specifiers\nfrom envbuilder.core.facts import HostFacts\nfrom envbuilder.resolver import wheels\n",
        encoding="utf-8",
    )
    assert import_violations("purity_clean", [tmp_path]) == []
