"""Pure modules stay pure: importing one never brings in ``subprocess``, ``envbuilder.system.proc`` or ``urllib.request``,
directly or through another module.

The pure modules are imported one after another in one fresh interpreter (the test runner has long since imported
everything), with a hook on ``__import__`` that records every import statement that runs, importer to imported. A
module's body runs once, at its first import, so what one module brings in is read from that graph: every module
reachable from it and the banned ones among their imports (an interpreter per module gave the same answers for
some 45 s more CPU). The source of every envbuilder module reached is then read for banned imports inside
functions, which run later and so never show at import time (``if TYPE_CHECKING:`` blocks excepted: they never
run).
"""

from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import pytest
import sourcetrees

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

    targets, banned, path = sys.argv[1].split(","), sys.argv[2].split(","), sys.argv[3:]
    sys.path[:0] = path
    edges = {}
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
        wanted = [full, *(f"{full}.{item}" for item in fromlist or () if item != "*")]
        parts = full.split(".")
        wanted += [".".join(parts[:i]) for i in range(1, len(parts))]  # `import a.b.c` runs a and a.b too
        edges.setdefault(importer, set()).update(wanted)
        return real_import(name, globals, locals, fromlist, level)

    report = {}
    builtins.__import__ = hook
    for target in targets:
        before = set(sys.modules)
        try:
            importlib.import_module(target)
        finally:
            pass
        report[target] = sorted(name for name in banned if name in sys.modules and name not in before)
    builtins.__import__ = real_import
    files = {name: getattr(module, "__file__", None) for name, module in sys.modules.items()}
    out = {"edges": {k: sorted(v) for k, v in edges.items()}, "loaded": report, "files": files}
    print(json.dumps(out))
    """
)


@functools.cache
def _banned_in_source(path: Path, module: str) -> tuple[str, ...]:
    """Banned imports anywhere in a module's source, functions included, outside ``if TYPE_CHECKING:`` blocks.
    Remembered per file for the run: each pure module's test reads the sources of all it reaches, mostly the same
    ones (parsing them again for each of the 88 was most of this file's CPU)."""
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

    visit(sourcetrees.parse(path))
    return tuple(found)


def import_report(modules: Sequence[str], path: Sequence[Path] = ()) -> dict[str, Any]:
    """Import ``modules`` one after another in one fresh interpreter, recording every import statement that runs
    (importer -> imported), which banned modules each one's import brought in first, and every module's file.
    ``path`` goes in front of sys.path (for modules outside the package)."""
    res = subprocess.run(
        [sys.executable, "-c", _CHILD, ",".join(modules), ",".join(BANNED), *map(str, path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert res.returncode == 0, f"importing {', '.join(modules)} failed:\n{res.stderr}"
    report: dict[str, Any] = json.loads(res.stdout.splitlines()[-1])
    return report


def import_violations(
    module: str, path: Sequence[Path] = (), report: Optional[dict[str, Any]] = None
) -> list[str]:
    """What makes ``module`` impure: each banned module it imports, directly or through another module, named with
    its importer. A module's own imports run once per interpreter (later imports of it find it loaded), so what
    ``module`` brings in is read from the graph of import statements the report recorded: every module reachable
    from it, and the banned ones among their imports. ``report``: one made for several modules at once."""
    report = report or import_report([module], path)
    edges: dict[str, list[str]] = report["edges"]
    reached, todo = {module}, [module]
    problems: list[str] = []
    while todo:
        importer = todo.pop()
        for name in edges.get(importer, ()):
            if name in BANNED:
                if importer not in ALLOWED_IMPORTERS.get(name, ()):
                    problems.append(f"{name} imported by {importer}")
                continue
            if name not in reached and name in report["files"]:
                reached.add(name)
                todo.append(name)
    # A banned module that came in without an import statement the hook saw (importlib.import_module, C code).
    seen = {name for importer in reached for name in edges.get(importer, ()) if name in BANNED}
    problems += [
        f"{name} loaded, importer unknown" for name in report["loaded"].get(module, []) if name not in seen
    ]
    top = module.partition(".")[0]
    for name in sorted(reached):
        file = report["files"].get(name)
        if file and file.endswith(".py") and name.partition(".")[0] in (top, "envbuilder"):
            # Imports that ran are named above already; this adds the ones that run later (inside functions).
            problems += [
                p for p in _banned_in_source(Path(file), name) if p.partition(" (line")[0] not in problems
            ]
    return sorted(set(problems))


@pytest.fixture(scope="module")
def pure_report() -> dict[str, Any]:
    """One interpreter for every pure module (one each cost some 45 s of CPU in all)."""
    return import_report(PURE)


@pytest.mark.parametrize("module", PURE)
def test_pure_module_imports_no_process_or_network(module: str, pure_report: dict[str, Any]) -> None:
    problems = import_violations(module, report=pure_report)
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
