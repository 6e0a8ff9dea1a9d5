"""Loading: extends merging, provenance, the recipe search path and its overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from envbuilder import loader
from envbuilder.catalog import Catalog, Layer, layers
from envbuilder.errors import RecipeError


def write(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


SITE = """schema_version = 1
[site]
name = "mysite"
[compute]
arch = "x86_64"
gpus_per_node = 2
[filesystems.scratch]
path = "${SCRATCH}"
purge_days = 14
[[corrections]]
seed = "site seed"
fix = "site fix"
"""

VARIANT = """schema_version = 1
extends = "site.toml"
[recipe]
name = "my-venv"
[compute]
gpus_per_node = 4
[filesystems.scratch]
quota = "none"
[torch]
version = "2.7.1"
variant = "cu126"
[[corrections]]
seed = "variant seed"
fix = "variant fix"
"""


@pytest.fixture
def site_dir(tmp_path):
    write(tmp_path, "site.toml", SITE)
    write(tmp_path, "my-venv.toml", VARIANT)
    return tmp_path


def test_extends_merges_tables_and_records_provenance(site_dir):
    recipe = loader.load("my-venv", Catalog([Layer("test", site_dir)]))
    assert recipe.get("compute.gpus_per_node") == 4
    assert recipe.get("compute.arch") == "x86_64"
    # A variant adds to a table its parent started.
    assert recipe.get("filesystems.scratch") == {"path": "${SCRATCH}", "purge_days": 14, "quota": "none"}
    assert recipe.source_of("compute.gpus_per_node") == str(site_dir / "my-venv.toml")
    assert recipe.source_of("compute.arch") == str(site_dir / "site.toml")
    assert recipe.source_of("env.installer") == "<defaults>"
    assert recipe.chain == (str(site_dir / "my-venv.toml"), str(site_dir / "site.toml"))


def test_corrections_accumulate_parent_first(site_dir):
    recipe = loader.load("my-venv", Catalog([Layer("test", site_dir)]))
    assert [c["seed"] for c in recipe.get("corrections")] == ["site seed", "variant seed"]
    assert recipe.source_of("corrections[0]") == str(site_dir / "site.toml")


def test_base_files_are_not_listed(site_dir):
    assert Catalog([Layer("test", site_dir)]).names() == ["my-venv"]


def test_extends_by_recipe_name(site_dir):
    write(
        site_dir,
        "other/my-venv-big.toml",
        'schema_version = 1\nextends = "my-venv"\n[recipe]\nname = "my-venv-big"\n[compute]\ngpus_per_node = 8\n',
    )
    recipe = loader.load("my-venv-big", Catalog([Layer("test", site_dir)]))
    assert recipe.get("compute.gpus_per_node") == 8
    assert recipe.get("torch.version") == "2.7.1"
    assert len(recipe.chain) == 3


def test_recipe_path_later_layers_override_earlier(site_dir, tmp_path_factory):
    override = tmp_path_factory.mktemp("override")
    write(
        override,
        "my-venv.toml",
        VARIANT.replace('extends = "site.toml"', f'extends = "{site_dir / "site.toml"}"').replace(
            '"2.7.1"', '"2.7.0"'
        ),
    )
    catalog = Catalog([Layer("a", site_dir), Layer("b", override)])
    entry = catalog.entries["my-venv"]
    assert entry.path == override / "my-venv.toml"
    assert entry.shadows == (site_dir / "my-venv.toml",)
    assert loader.load("my-venv", catalog).get("torch.version") == "2.7.0"


def test_environment_variable_search_path(tmp_path):
    found = layers({"ENVBUILDER_RECIPE_PATH": f"{tmp_path}/a::{tmp_path}/b"})
    assert [la.label for la in found] == ["builtin", f"{tmp_path}/a", f"{tmp_path}/b"]


def test_builtin_recipe_can_be_overridden_by_user_path(tmp_path):
    write(
        tmp_path, "local.toml", 'schema_version = 1\n[recipe]\nname = "local"\n[torch]\nversion = "2.8.0"\n'
    )
    catalog = Catalog.from_env({"ENVBUILDER_RECIPE_PATH": str(tmp_path)})
    recipe = loader.load("local", catalog)
    assert recipe.get("torch.version") == "2.8.0"
    assert catalog.entries["local"].shadows[0].name == "local.toml"


def test_overrides_win_and_name_their_source(site_dir):
    recipe = loader.load(
        "my-venv",
        Catalog([Layer("test", site_dir)]),
        overrides={"env.prefix": ("/x", "command line (--prefix)")},
    )
    assert recipe.get("env.prefix") == "/x"
    assert recipe.source_of("env.prefix") == "command line (--prefix)"


def test_two_recipes_with_one_name_in_one_directory(site_dir):
    write(site_dir, "sub/dup.toml", 'schema_version = 1\n[recipe]\nname = "my-venv"\n')
    with pytest.raises(RecipeError, match="defined twice"):
        Catalog([Layer("test", site_dir)])


def test_leaves_list_every_effective_value(site_dir):
    recipe = loader.load("my-venv", Catalog([Layer("test", site_dir)]))
    keys = {k for k, _, _ in recipe.leaves()}
    assert {"compute.gpus_per_node", "torch.version", "env.prefix", "filesystems.scratch.quota"} <= keys


def test_broken_base_files_do_not_poison_the_catalog(tmp_path):
    write(tmp_path, "a/site.toml", "schema_version = 1\n[site\n")
    write(tmp_path, "b/site.toml", "schema_version = 1\n[site\n")
    write(tmp_path, "a/ok.toml", 'schema_version = 1\nextends = "site.toml"\n[recipe]\nname = "ok"\n')
    write(tmp_path, "b/fine.toml", 'schema_version = 1\n[recipe]\nname = "fine"\n')
    catalog = Catalog([Layer("test", tmp_path)])
    assert catalog.names() == ["fine", "ok"]
    assert loader.load("fine", catalog).name == "fine"
    with pytest.raises(RecipeError) as info:
        loader.load("ok", catalog)
    assert info.value.message.startswith(f"{tmp_path}/a/site.toml: not valid TOML")


def test_loading_a_base_file_by_name_says_what_it_is(site_dir):
    with pytest.raises(RecipeError) as info:
        loader.load("site", Catalog([Layer("test", site_dir)]))
    assert "has no [recipe] table" in info.value.message
    assert info.value.hint == "add [recipe] with name = 'site' to make it a recipe"


def test_loading_by_file_name_when_the_name_differs(tmp_path):
    write(tmp_path, "mine.toml", 'schema_version = 1\n[recipe]\nname = "yours"\n')
    with pytest.raises(RecipeError) as info:
        loader.load("mine", Catalog([Layer("test", tmp_path)]))
    assert "recipe.name 'yours' does not match the file name 'mine.toml'" in info.value.message


def test_empty_extends_is_an_error(tmp_path):
    write(tmp_path, "e.toml", 'schema_version = 1\nextends = " "\n[recipe]\nname = "e"\n')
    with pytest.raises(RecipeError, match="extends is empty"):
        loader.load("e", Catalog([Layer("test", tmp_path)]))
