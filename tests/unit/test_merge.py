"""How ``extends`` merges lists: a child adds to its parent's lists, replaces one only when it says so, and every
item keeps the file it came from (what ``recipes show --explain`` prints)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers import PLAN_ENV, cli_argv, cli_env, load_facts

from envbuilder import plan
from envbuilder.recipe import loader
from envbuilder.recipe.catalog import Catalog, Layer

SITE = """schema_version = 1
[site]
name = "mysite"
[scheduler]
type = "slurm"
interactive = ["salloc", "-N", "{nodes}"]
forbidden_flags = ["--mem"]
[modules]
load = ["gcc/13.2.0", "cuda/12.6"]
[recipe]
name = "site"
description = "the site's own words"
[[packages]]
name = "numpy"
[[packages]]
name = "scipy"
[activate]
modules = ["gcc/13.2.0"]
[validation]
checks = ["import", "gpu"]
[[validation.references]]
figure = "nccl.busbw"
value = 100
[[validation.references]]
figure = "nccl.busbw"
value = 80
partition = "small"
"""

CHILD = """schema_version = 1
extends = "site.toml"
{extra}
[recipe]
name = "child"
[scheduler]
interactive = ["idev", "-N", "{{nodes}}"]
forbidden_flags = ["--gres", "--mem"]
[modules]
load = ["cuda/12.6", "nccl/2.21"]
[[packages]]
name = "NumPy"
spec = "numpy<2"
[[packages]]
name = "einops"
[activate]
modules = ["cuda/12.6"]
[validation]
checks = ["nccl"]
[[validation.references]]
figure = "nccl.busbw"
value = 120
"""


def _load(tmp_path: Path, extra: str = "") -> loader.Recipe:
    (tmp_path / "site.toml").write_text(SITE)
    (tmp_path / "child.toml").write_text(CHILD.format(extra=extra))
    return loader.load("child", Catalog([Layer("test", tmp_path)]))


def _names(recipe: loader.Recipe) -> list[str]:
    return [p.name for p in recipe.packages]


def test_a_child_adds_to_its_parents_lists(tmp_path):
    recipe = _load(tmp_path)
    # Strings already there keep their place; the child's new ones follow.
    assert recipe.modules.load == ("gcc/13.2.0", "cuda/12.6", "nccl/2.21")
    assert recipe.scheduler.forbidden_flags == ("--mem", "--gres")
    assert recipe.validation.checks == ("import", "gpu", "nccl")
    assert recipe.activate.modules == ("gcc/13.2.0", "cuda/12.6")


def test_a_package_of_the_same_name_takes_the_parents_place(tmp_path):
    recipe = _load(tmp_path)
    assert _names(recipe) == ["NumPy", "scipy", "einops"]
    assert recipe.packages[0].requirement == "numpy<2"


def test_a_reference_for_the_same_figure_and_partition_takes_the_parents_place(tmp_path):
    refs = _load(tmp_path).validation.references
    assert [(r["value"], r.get("partition")) for r in refs] == [(120, None), (80, "small")]


def test_corrections_still_add_up(tmp_path):
    site = SITE + '[[corrections]]\nseed = "a"\nfix = "b"\n'
    (tmp_path / "site.toml").write_text(site)
    (tmp_path / "child.toml").write_text(CHILD.format(extra="") + '[[corrections]]\nseed = "c"\nfix = "d"\n')
    recipe = loader.load("child", Catalog([Layer("test", tmp_path)]))
    assert [c.seed for c in recipe.corrections] == ["a", "c"]


def test_replace_takes_the_childs_lists_alone(tmp_path):
    recipe = _load(tmp_path, 'replace = ["packages", "modules.load"]')
    assert _names(recipe) == ["NumPy", "einops"]
    assert recipe.modules.load == ("cuda/12.6", "nccl/2.21")
    assert recipe.validation.checks == ("import", "gpu", "nccl")  # not named: still added to


def test_replace_with_an_empty_list_drops_the_parents(tmp_path):
    (tmp_path / "site.toml").write_text(SITE)
    (tmp_path / "child.toml").write_text(
        'schema_version = 1\nextends = "site.toml"\nreplace = ["packages"]\npackages = []\n[recipe]\nname = "child"\n'
    )
    recipe = loader.load("child", Catalog([Layer("test", tmp_path)]))
    assert recipe.packages == ()
    assert recipe.get("replace") is None  # the merged recipe (and a published one) carries no replace


def test_an_argv_is_one_value_and_the_childs_replaces_it(tmp_path):
    assert _load(tmp_path).scheduler.interactive == ("idev", "-N", "{nodes}")


def test_a_files_list_replaces_the_built_in_default(tmp_path):
    (tmp_path / "solo.toml").write_text(
        'schema_version = 1\n[recipe]\nname = "solo"\n[validation]\nchecks = ["gpu"]\n'
    )
    assert loader.load("solo", Catalog([Layer("test", tmp_path)])).validation.checks == ("gpu",)


def test_a_child_does_not_inherit_its_parents_description(tmp_path):
    recipe = _load(tmp_path)
    assert recipe.recipe.description == ""
    assert recipe.get("recipe.description") is None


def test_each_list_item_names_the_file_it_came_from(tmp_path):
    recipe = _load(tmp_path)
    site, child = str(tmp_path / "site.toml"), str(tmp_path / "child.toml")
    sources = {key: source for key, _, source in recipe.leaves()}
    assert sources["modules.load[0]"] == site
    assert sources["modules.load[1]"] == child  # restated by the child
    assert sources["modules.load[2]"] == child
    assert [sources[f"packages[{i}]"] for i in range(3)] == [child, site, child]
    assert sources["env.installer"] == "<defaults>"
    assert recipe.source_of("validation.checks[0]") == site


def test_recipes_show_explain_prints_each_item_with_its_file(tmp_path):
    _load(tmp_path)
    env = cli_env({**PLAN_ENV, "ENVBUILDER_RECIPE_PATH": str(tmp_path)})
    res = subprocess.run(
        cli_argv("recipes", "show", "child", "--explain", "--json"), env=env, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    sources = json.loads(res.stdout)["data"]["sources"]
    assert sources["packages[1]"] == str(tmp_path / "site.toml")
    assert sources["packages[2]"] == str(tmp_path / "child.toml")


@pytest.fixture
def mine(tmp_path):
    """The issue's example: a recipe that extends the built-in ``local`` to add einops."""
    (tmp_path / "mine.toml").write_text(
        'schema_version = 1\nextends = "local"\n[recipe]\nname = "mine"\n[[packages]]\nname = "einops"\n'
    )
    return loader.load("mine", Catalog.from_env({"ENVBUILDER_RECIPE_PATH": str(tmp_path)}))


def test_extending_local_to_add_einops_keeps_numpy(mine):
    assert _names(mine) == ["numpy", "einops"]
    commands = plan.build(mine, load_facts("cpu-only"), PLAN_ENV, plan.Options()).install_commands
    assert {"numpy", "einops"} <= {arg for command in commands for arg in command}
    assert mine.recipe.description == ""
