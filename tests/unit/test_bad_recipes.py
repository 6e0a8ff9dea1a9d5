"""Every way a recipe can be wrong, and the exact message (and hint) the user gets for it.

Each directory under tests/data/recipes/bad-*/ is one failure mode: the recipe file(s), and expected.txt with
line 1 the recipe name to load, line 2 the exact message (``{dir}`` stands for the case directory) and an
optional line 3 ``hint: ...``. No hint line means the error must carry no hint.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional

import pytest

from envbuilder import plan
from envbuilder.core.errors import RecipeError, RecipeNotFound
from envbuilder.core.facts import HostFacts
from envbuilder.recipe.catalog import Catalog, Layer
from envbuilder.recipe.loader import Recipe, load

DATA = Path(__file__).resolve().parent.parent / "data" / "recipes"
CASES = sorted(p for p in DATA.iterdir() if p.is_dir() and p.name.startswith("bad-"))

#: Bugs found and not yet fixed (strict xfail); expected.txt holds the message the user should get.
KNOWN_BUGS: dict[str, str] = {}
#: Of those, the ones where no RecipeError is raised at all.
UNCAUGHT: set[str] = set()
#: A TOML syntax error has no key path; its location is the line and column in the message. So for a file that
#: is not UTF-8, and for brackets nested too deeply.
NO_KEY = {"bad-invalid-toml", "bad-invalid-toml-in-parent", "bad-not-utf8"}
NOT_FOUND = "bad-recipe-not-found"


def _params(cases: list[Path], xfail: set[str]) -> list[Any]:
    return [
        pytest.param(
            case,
            id=case.name,
            marks=[pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[case.name])]
            if case.name in xfail
            else [],
        )
        for case in cases
    ]


def _expected(case: Path) -> tuple[str, str, Optional[str]]:
    lines = case.joinpath("expected.txt").read_text(encoding="utf-8").splitlines()
    assert len(lines) in (2, 3), f"{case.name}/expected.txt: want 2 or 3 lines, found {len(lines)}"
    name, message = lines[0], lines[1].replace("{dir}", str(case))
    hint = None
    if len(lines) == 3:
        assert lines[2].startswith("hint: "), f"{case.name}/expected.txt: line 3 must start with 'hint: '"
        hint = lines[2][len("hint: ") :]
    return name, message, hint


def _load_error(case: Path) -> RecipeError:
    name, _, _ = _expected(case)
    with pytest.raises(RecipeError) as info:
        load(name, Catalog([Layer("test", case)]))
    return info.value


def test_cases_exist() -> None:
    # A glob that finds nothing would make the parametrized tests vanish silently.
    assert len(CASES) >= 25
    for case in CASES:
        assert case.joinpath("expected.txt").is_file(), case.name
        assert list(case.glob("*.toml")), case.name
    assert set(KNOWN_BUGS) <= {c.name for c in CASES}


@pytest.mark.parametrize("case", _params(CASES, set(KNOWN_BUGS)))
def test_bad_recipe_message(case: Path) -> None:
    _, message, hint = _expected(case)
    exc = _load_error(case)
    assert exc.message == message
    assert str(exc) == message
    assert exc.hint == hint


@pytest.mark.parametrize("case", _params([c for c in CASES if c.name != NOT_FOUND], UNCAUGHT))
def test_bad_recipe_names_file_and_key(case: Path) -> None:
    exc = _load_error(case)
    assert not isinstance(exc, RecipeNotFound)
    assert exc.file, "the error must name the file"
    assert Path(exc.file).parent == case, "the file must be one of the case's own files"
    assert exc.message.startswith(f"{exc.file}: ")
    if case.name in NO_KEY:
        assert exc.key is None
        assert re.search(r"\(at line \d+, column \d+\)$", exc.message), (
            "a syntax error must give line and column"
        )
    else:
        assert exc.key, "the error must name the key path"
        assert exc.message.startswith(f"{exc.file}: {exc.key}: ")


def test_recipe_not_found_has_no_file() -> None:
    exc = _load_error(DATA / NOT_FOUND)
    assert isinstance(exc, RecipeNotFound)
    assert exc.file is None
    assert exc.key is None


GRES_RECIPE = """\
schema_version = 1

[recipe]
name = "gres-site"

[scheduler]
type = "slurm"
gpu_request = "gres"
{forbidden}

[compute]
gpus_per_node = 1
"""
HOST = HostFacts(arch="x86_64", python="3.11.7", gpus=())
ENV = {"SCRATCH": "/s", "HOME": "/h"}


def _gres_recipe(tmp_path: Path, forbidden: str) -> tuple[Path, Recipe]:
    path = tmp_path / "gres-site.toml"
    path.write_text(GRES_RECIPE.format(forbidden=forbidden), encoding="utf-8")
    return path, load("gres-site", Catalog([Layer("test", tmp_path)]))


def test_forbidden_flag_fails_at_plan_time(tmp_path: Path) -> None:
    path, recipe = _gres_recipe(tmp_path, 'forbidden_flags = ["--gres"]')
    with pytest.raises(RecipeError) as info:
        plan.build(recipe, HOST, ENV)
    exc = info.value
    assert exc.file == str(path)
    assert exc.key == "scheduler.forbidden_flags"
    assert exc.message == (
        f"{path}: scheduler.forbidden_flags: the batch script would pass --gres, which this site rejects"
    )
    assert exc.hint == "change scheduler.gpu_request or scheduler.required_flags"


def test_same_recipe_without_forbidden_flags_plans(tmp_path: Path) -> None:
    # The control for the test above: the flag really is in the script when nothing forbids it.
    _, recipe = _gres_recipe(tmp_path, "")
    built = plan.build(recipe, HOST, ENV)
    assert built.batch_script is not None
    assert "#SBATCH --gres=gpu:1\n" in built.batch_script


VARIANT_RECIPE = 'schema_version = 1\n[recipe]\nname = "variant"\n[torch]\nvariant = {value}\n'


@pytest.mark.parametrize(
    "value",
    [
        '"cu130; rm -rf ~"',
        '"$(id)"',
        '"`id`"',
        '"-cu130"',
        '"cu130\\n"',
        '"cu130\\u0000"',
        '"rocm6.2/../x"',
        '"cu"',
    ],
)
def test_a_hostile_torch_variant_is_refused_by_name(tmp_path: Path, value: str) -> None:
    """torch.variant takes the names an index page may have (cuNNN, rocmX.Y, xpu, cpu, auto) and nothing that a
    URL, a shell or a command line could read as more."""
    (tmp_path / "variant.toml").write_text(VARIANT_RECIPE.format(value=value), encoding="utf-8")
    with pytest.raises(RecipeError) as info:
        load("variant", Catalog([Layer("test", tmp_path)]))
    assert info.value.key == "torch.variant"


@pytest.mark.parametrize("value", ["cu140", "rocm6.2", "rocm6.2.4", "xpu", "cpu", "auto"])
def test_index_shaped_torch_variants_are_taken(tmp_path: Path, value: str) -> None:
    (tmp_path / "variant.toml").write_text(VARIANT_RECIPE.format(value=f'"{value}"'), encoding="utf-8")
    assert load("variant", Catalog([Layer("test", tmp_path)])).torch.variant == value
