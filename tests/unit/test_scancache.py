"""The catalog's scan cache (recipe/scancache.py): unchanged files are not parsed again, changed and broken ones
always are, and a bad cache file is only ever ignored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envbuilder.core.errors import RecipeError
from envbuilder.recipe.catalog import Catalog, Layer

RECIPE = '[recipe]\nname = "{name}"\ndescription = "{desc}"\n\n[site]\nname = "demo"\n'


@pytest.fixture
def recipes(tmp_path: Path) -> Path:
    d = tmp_path / "recipes"
    d.mkdir()
    (d / "one.toml").write_text(RECIPE.format(name="one", desc="first"))
    (d / "base.toml").write_text('[env]\nkind = "venv"\n')  # a base file: no [recipe]
    return d


def scan(recipes: Path, cache: Path) -> Catalog:
    return Catalog([Layer("test", recipes)], cache)


def test_an_unchanged_file_is_taken_from_the_cache_and_not_parsed_again(recipes, tmp_path):
    cache = tmp_path / "home" / "cache" / "catalog.json"
    first = scan(recipes, cache)
    assert first.names() == ["one"] and first.get("one").description == "first"
    kept = json.loads(cache.read_text())
    assert sorted(Path(p).name for p in kept["files"]) == ["base.toml", "one.toml"]
    # What the cache says about an unchanged file is what the next scan uses: the file is not read again.
    entry = kept["files"][str(recipes / "one.toml")]
    entry["description"] = "from the cache"
    cache.write_text(json.dumps(kept))
    assert scan(recipes, cache).get("one").description == "from the cache"


def test_a_changed_file_is_parsed_again(recipes, tmp_path):
    cache = tmp_path / "catalog.json"
    scan(recipes, cache)
    (recipes / "one.toml").write_text(RECIPE.format(name="renamed", desc="second"))
    again = scan(recipes, cache)
    assert again.names() == ["renamed"] and again.get("renamed").description == "second"
    assert scan(recipes, cache).names() == ["renamed"]


def test_a_broken_file_is_never_kept_and_stays_its_own_error(recipes, tmp_path):
    cache = tmp_path / "catalog.json"
    (recipes / "bad.toml").write_text("[recipe\n")
    for _ in range(2):
        catalog = scan(recipes, cache)
        with pytest.raises(RecipeError, match="not valid TOML"):
            catalog.get("bad")
    assert str(recipes / "bad.toml") not in json.loads(cache.read_text())["files"]


@pytest.mark.parametrize(
    "text", ["not json", '{"version": 99, "files": {}}', '{"version": 1, "files": {"x": 1}}']
)
def test_a_malformed_cache_is_ignored_and_replaced(recipes, tmp_path, text):
    cache = tmp_path / "catalog.json"
    cache.write_text(text)
    assert scan(recipes, cache).names() == ["one"]
    assert json.loads(cache.read_text())["version"] == 1


def test_a_cache_that_cannot_be_written_costs_nothing_but_time(recipes, tmp_path):
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    assert scan(recipes, blocked / "catalog.json").names() == ["one"]


def test_files_gone_from_the_path_drop_out_of_the_cache(recipes, tmp_path):
    cache = tmp_path / "catalog.json"
    scan(recipes, cache)
    (recipes / "base.toml").unlink()
    scan(recipes, cache)
    assert [Path(p).name for p in json.loads(cache.read_text())["files"]] == ["one.toml"]
