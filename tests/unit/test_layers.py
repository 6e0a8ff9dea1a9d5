"""The layer map is a contract: ``[tool.importlinter]`` in pyproject.toml lists envbuilder's packages from the top
(the commands) to the bottom (``core``), and import-linter, the real tool, checks that no module imports from a
package above its own (imports inside functions and under ``if TYPE_CHECKING:`` count too), that every package has
a place, and that the pure modules start no process. docs/architecture.md draws the same map."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from envbuilder.core import _toml

pytest.importorskip(
    "importlinter",
    reason="import-linter runs on Python >= 3.11 only; the Python 3.11 run of the suite checks it",
)

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "envbuilder"


def contracts() -> dict[str, dict[str, object]]:
    config = _toml.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    return {contract["id"]: contract for contract in config["contracts"]}


def lint_imports(root: Path, config: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on the package under ``root`` (the checkout, or a copy of it) with ``config``."""
    program = Path(sys.executable).with_name("lint-imports")
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(program), "--no-cache", "--no-logo", str(config)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_contracts_hold() -> None:
    res = lint_imports(ROOT, ROOT / "pyproject.toml")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Contracts: 2 kept, 0 broken." in res.stdout


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        # An arrow back up: the bottom layer reaching for the terminal's tables.
        (
            "core/errors.py",
            "from envbuilder.cli import parser",
            "envbuilder.core is not allowed to import envbuilder.cli",
        ),
        # A type-only arrow back up counts as well.
        (
            "lockfile/model.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from envbuilder.recipe.loader import Recipe",
            "envbuilder.lockfile is not allowed to import envbuilder.recipe",
        ),
        # A pure module that starts a process, inside a function.
        (
            "plan/steps.py",
            "def _later():\n    import subprocess",
            "envbuilder.plan is not allowed to import subprocess",
        ),
    ],
)
def test_a_copy_that_breaks_the_map_is_refused(tmp_path: Path, module: str, line: str, broken: str) -> None:
    shutil.copytree(PACKAGE, tmp_path / "envbuilder", ignore=shutil.ignore_patterns("__pycache__"))
    path = tmp_path / "envbuilder" / module
    path.write_text(path.read_text(encoding="utf-8") + "\n" + line + "\n", encoding="utf-8")
    res = lint_imports(tmp_path, ROOT / "pyproject.toml")
    assert res.returncode != 0, res.stdout
    assert broken in " ".join(res.stdout.split()), res.stdout


def test_a_package_without_a_place_is_refused(tmp_path: Path) -> None:
    shutil.copytree(PACKAGE, tmp_path / "envbuilder", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "envbuilder" / "newthing").mkdir()
    (tmp_path / "envbuilder" / "newthing" / "__init__.py").write_text('"""A package with no layer."""\n')
    res = lint_imports(tmp_path, ROOT / "pyproject.toml")
    assert res.returncode != 0, res.stdout
    assert "envbuilder.newthing" in res.stdout


def test_the_top_level_holds_only_the_faces_and_packages() -> None:
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert modules == ["__init__.py", "__main__.py"], modules
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert packages == set(contracts()["layers"]["layers"]), (
        "every package has a layer, every layer a package"
    )


def test_the_architecture_note_draws_the_contracts_map() -> None:
    note = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = re.search(r"```text\n(.*?)```", note, re.S)
    assert block, "docs/architecture.md has the layer map in a ```text block"
    drawn = re.findall(r"^\s*([a-z_]+)/", block.group(1), re.M)
    assert drawn == contracts()["layers"]["layers"]
