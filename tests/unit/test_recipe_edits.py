"""recipe.edits: a recipe now against the values an env's record kept, loaded from real files (an extends chain
over the defaults)."""

from __future__ import annotations

from pathlib import Path

from envbuilder.recipe import edits
from envbuilder.recipe.catalog import Catalog, Layer
from envbuilder.recipe.loader import load

BASE = """schema_version = 1
[recipe]
name = "base"
[env]
kind = "venv"
[python]
command = "python3"
[torch]
install = false
"""

CHILD = """schema_version = 1
extends = "base"
[recipe]
name = "demo"
[[packages]]
name = "ebdemo"
spec = "ebdemo==1.0"
"""


def recipes(tmp_path: Path, base: str = BASE, child: str = CHILD):
    (tmp_path / "base.toml").write_text(base)
    (tmp_path / "demo.toml").write_text(child)
    return load("demo", Catalog([Layer("test", tmp_path)]))


def test_the_same_recipe_is_unchanged_and_an_edit_names_its_key_and_file(tmp_path):
    before = recipes(tmp_path)
    recorded = (edits.digest(before), edits.values(before))
    assert edits.compare(*recorded, recipes(tmp_path)).status == "unchanged"
    after = recipes(tmp_path, base=BASE.replace('command = "python3"', 'command = "python3.11"'))
    edit = edits.compare(*recorded, after)
    assert edit.status == "changed" and edit.digest == edits.digest(after) != recorded[0]
    assert [c.shown() for c in edit.changes] == [
        f'python.command "python3" -> "python3.11" ({after.source_of("python.command")})'
    ]
    assert after.source_of("python.command").endswith("base.toml")


def test_a_default_that_changed_is_named_as_the_default_and_a_removed_key_as_unset(tmp_path):
    now = recipes(tmp_path)
    old = edits.values(now)
    old["validation"]["nodes"] = 2  # an older envbuilder's default
    old["env"]["filesystem"] = "scratch"  # a key the recipe has dropped since
    edit = edits.compare("0" * 64, old, now)
    assert [c.shown() for c in edit.changes] == [
        'env.filesystem "scratch" -> unset',
        "validation.nodes 2 -> 1 (envbuilder's default)",
    ]


def test_records_without_values_or_digest_say_what_they_cannot_tell(tmp_path):
    now = recipes(tmp_path)
    assert edits.compare("", {}, now).to_json() == {
        "status": "unknown",
        "recorded_digest": "",
        "digest": edits.digest(now),
        "changes": None,
    }
    older = edits.compare("0" * 64, {}, now)
    assert (older.status, older.described, older.changes) == ("changed", False, ())


def test_a_long_value_is_shortened_where_it_is_shown(tmp_path):
    now = recipes(tmp_path, child=CHILD.replace("ebdemo==1.0", "ebdemo==1.0" + ",!=0.1" * 40))
    edit = edits.compare("0" * 64, edits.values(recipes(tmp_path)), now)
    (change,) = edit.changes
    assert change.key == "packages" and len(change.now[0]["spec"]) > edits.SHOWN
    shown_now = change.shown().split(" -> ")[1].split(" (")[0]
    assert shown_now.endswith("...") and len(shown_now) == edits.SHOWN
