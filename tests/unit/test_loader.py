"""Loading: extends merging, provenance, the recipe search path and its overrides."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from envbuilder.core._toml import MAX_DEPTH, TOMLDecodeError, loads
from envbuilder.core._toml import _toml as toml_parser  # tomllib, or tomli before 3.11
from envbuilder.core.errors import RecipeError
from envbuilder.recipe import loader, schema, sections
from envbuilder.recipe.catalog import Catalog, Layer, layers
from envbuilder.recipe.spec import Field, Table


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
    # Asking for the name is the error; every other recipe still loads (one careless file breaks nothing else).
    write(site_dir, "sub/dup.toml", 'schema_version = 1\n[recipe]\nname = "my-venv"\n')
    write(site_dir, "other.toml", 'schema_version = 1\n[recipe]\nname = "other"\n')
    catalog = Catalog([Layer("test", site_dir)])
    with pytest.raises(RecipeError, match="defined twice in one directory") as info:
        loader.load("my-venv", catalog)
    assert info.value.key == "recipe.name"
    assert loader.load("other", catalog).name == "other"
    assert any("defined twice" in line for line in catalog.warnings)


def test_leaves_list_every_effective_value(site_dir):
    recipe = loader.load("my-venv", Catalog([Layer("test", site_dir)]))
    keys = {k for k, _, _ in recipe.leaves()}
    assert {"compute.gpus_per_node", "torch.version", "env.prefix", "filesystems.scratch.quota"} <= keys


def test_views_read_the_merged_values_and_the_defaults(site_dir):
    recipe = loader.load("my-venv", Catalog([Layer("test", site_dir)]))
    assert (recipe.compute.gpus_per_node, recipe.compute.arch) == (4, "x86_64")
    assert recipe.filesystems["scratch"] == sections.Filesystem("${SCRATCH}", purge_days=14, quota="none")
    assert [c.seed for c in recipe.corrections] == ["site seed", "variant seed"]
    assert (recipe.torch.version, recipe.torch.channel, recipe.torch.allow) == ("2.7.1", "stable", ())
    # Defaults that apply only where a recipe leaves the key out: not among the values show lists.
    assert (recipe.site.status, recipe.conda.engine, recipe.scheduler.gpu_request) == (
        "active",
        "auto",
        "gpus-per-node",
    )
    assert recipe.get("conda.engine") is None


def test_every_recipe_starts_from_the_seeded_defaults():
    # What `show` lists as <defaults>: changing it changes every recipe's values.
    assert sections.seed() == {
        "env": {
            "kind": "venv",
            "installer": "uv",
            "prefix": "${SCRATCH}/envbuilder/envs/{name}",
            "system_site_packages": False,
        },
        "python": {"command": "python3"},
        "modules": {"system": "none", "use": [], "load": [], "build_only": []},
        "scheduler": {"type": "none"},
        "torch": {
            "install": True,
            "version": "latest",
            "variant": "auto",
            "channel": "stable",
            "packages": ["torch", "torchvision", "torchaudio"],
            "allow": [],
        },
        "launcher": {"default": "torchrun", "gpu_affinity": "none"},
        "activate": {"modules": [], "env": {}, "profiles": []},
        "validation": {
            "checks": ["import", "gpu", "arch", "cuda", "libraries", "affinity", "nccl", "ddp", "filesystem"],
            "nodes": 1,
        },
    }


def _views() -> dict[str, type]:
    """Each table of the schema and the view that reads it."""
    return {
        "recipe": sections.About,
        "corrections": sections.Correction,
        "site": sections.Site,
        "compute": sections.Compute,
        "scheduler": sections.Scheduler,
        "scheduler.partitions": sections.Partition,
        "modules": sections.Modules,
        "filesystems": sections.Filesystem,
        "env_profiles": sections.Profile,
        "launcher": sections.Launcher,
        "env": sections.Env,
        "container": sections.Container,
        "python": sections.Python,
        "conda": sections.Conda,
        "torch": sections.Torch,
        "packages": sections.Package,
        "activate": sections.Activate,
        "validation": sections.Validation,
    }


def _table(dotted: str) -> Table:
    spec: object = schema.SCHEMA
    for part in dotted.split("."):
        assert isinstance(spec, Table)
        spec = spec.fields[part]
        spec = getattr(spec, "item", None) or getattr(spec, "value", None) or spec
    assert isinstance(spec, Table)
    return spec


def test_every_schema_table_has_a_view_with_its_keys():
    tables = {k for k, v in schema.SCHEMA.fields.items() if not isinstance(v, Field)}
    assert tables == {k for k in _views() if "." not in k}
    for dotted, view in _views().items():
        # Sets: a view lists its seeded defaults in the order show has always listed them.
        assert {f.name for f in dataclasses.fields(view)} == set(_table(dotted).fields), dotted


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


# ---------------------------------------------------------------------------------------------------------------
# A broken file on the path: its own name is its error; everything else is a warning


LOCAL = 'schema_version = 1\n[recipe]\nname = "local"\n[torch]\nversion = "2.8.0"\n'


def test_a_broken_file_takes_the_place_of_the_builtin_of_its_name(tmp_path):
    write(tmp_path, "local.toml", LOCAL.replace("[torch]", "[torch"))
    catalog = Catalog.from_env({"ENVBUILDER_RECIPE_PATH": str(tmp_path)})
    with pytest.raises(RecipeError) as info:
        loader.load("local", catalog)
    assert info.value.file == str(tmp_path / "local.toml")
    assert info.value.message.startswith(f"{tmp_path}/local.toml: not valid TOML")
    assert "local" not in catalog.names()


def test_a_broken_file_in_an_earlier_layer_is_replaced_by_a_later_one(tmp_path):
    write(tmp_path, "a/local.toml", "[broken")
    write(tmp_path, "b/local.toml", LOCAL)
    catalog = Catalog([Layer("a", tmp_path / "a"), Layer("b", tmp_path / "b")])
    assert loader.load("local", catalog).get("torch.version") == "2.8.0"
    assert catalog.warnings == [
        f"skipped {tmp_path}/a/local.toml: not valid TOML: Expected ']' at the end of a table declaration "
        "(at end of document)"
    ]


def test_a_broken_file_beside_a_good_one_of_its_name_holds_the_name(tmp_path):
    # Two files for one name in one directory: which was meant cannot be known, so neither is used.
    write(tmp_path, "a/local.toml", LOCAL)
    write(tmp_path, "b/local.toml", "[broken")
    with pytest.raises(RecipeError, match="not valid TOML"):
        loader.load("local", Catalog([Layer("test", tmp_path)]))


def test_warnings_are_said_once_on_first_use_without_the_asked_for_error(tmp_path):
    write(tmp_path, "local.toml", "[broken")
    write(tmp_path, "junk.toml", "x = [")
    said: list[str] = []
    catalog = Catalog.from_env({"ENVBUILDER_RECIPE_PATH": str(tmp_path)}, warn=said.append)
    assert said == []  # nothing until the catalog is used
    with pytest.raises(RecipeError, match=r"local\.toml: not valid TOML"):
        loader.load("local", catalog)
    assert [line.split(":")[0] for line in said] == [f"skipped {tmp_path}/junk.toml"]
    catalog.names()
    assert len(said) == 1


def test_skipped_paths_are_warnings(tmp_path):
    write(tmp_path, "ok.toml", 'schema_version = 1\n[recipe]\nname = "ok"\n')
    (tmp_path / "fifo.toml").parent.mkdir(exist_ok=True)
    os.mkfifo(tmp_path / "fifo.toml")
    (tmp_path / "dir.toml").symlink_to(tmp_path)  # a symlinked directory is not entered, and is no recipe
    (tmp_path / "loop.toml").symlink_to("loop.toml")
    (tmp_path / "zero.toml").symlink_to("/dev/zero")
    (tmp_path / "bom.toml").write_bytes(b'\xef\xbb\xbfschema_version = 1\r\n[recipe]\r\nname = "bom"\r\n')
    not_a_dir = write(tmp_path, "file", "")
    catalog = Catalog([Layer("test", tmp_path), Layer("file", not_a_dir), Layer("gone", tmp_path / "gone")])
    assert catalog.names() == ["bom", "ok"]
    assert sorted(catalog.warnings) == [
        f"skipped {tmp_path}/dir.toml: not a regular file (a directory)",
        f"skipped {tmp_path}/fifo.toml: not a regular file (a FIFO)",
        f"skipped {tmp_path}/file on the recipe path: not a directory",
        f"skipped {tmp_path}/loop.toml: a symlink loop",
        f"skipped {tmp_path}/zero.toml: not a regular file (a character device)",
    ]
    assert loader.load("bom", catalog).name == "bom"


def test_a_broken_parent_named_in_extends_is_its_own_error(tmp_path):
    write(tmp_path, "a/local.toml", "[broken")
    write(tmp_path, "a/mine.toml", 'schema_version = 1\nextends = "local"\n[recipe]\nname = "mine"\n')
    with pytest.raises(RecipeError) as info:
        loader.load("mine", Catalog.from_env({"ENVBUILDER_RECIPE_PATH": str(tmp_path / "a")}, warn=print))
    assert info.value.file == str(tmp_path / "a" / "local.toml")


def test_a_fifo_named_as_a_parent_file_is_not_read(tmp_path):
    os.mkfifo(tmp_path / "site.toml")
    write(tmp_path, "mine.toml", 'schema_version = 1\nextends = "site.toml"\n[recipe]\nname = "mine"\n')
    with pytest.raises(RecipeError, match=r"site.toml: not a regular file \(a FIFO\)"):
        loader.load("mine", Catalog([Layer("test", tmp_path)]))


# ---------------------------------------------------------------------------------------------------------------
# TOML reading: the nesting limit counts only real brackets


@pytest.mark.parametrize(
    "text",
    [
        'a = "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["',
        "a = '[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[['",
        'a = """\n[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\\"""\n"""',
        "a = '''\n[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\n'''",
        "# [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\na = 1",
        'a = "\\"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["',
        'a = """x"""""\nb = [[[1]]]',
        "a = " + "[" * MAX_DEPTH + "]" * MAX_DEPTH,
        ".".join("k" * 1 for _ in range(MAX_DEPTH)) + " = 1",
    ],
    ids=[
        "basic",
        "literal",
        "multiline-basic",
        "multiline-literal",
        "comment",
        "escaped-quote",
        "quotes",
        "limit",
        "dotted-limit",
    ],
)
def test_brackets_in_strings_and_comments_do_not_count(text):
    assert loads(text) == toml_parser.loads(text)


@pytest.mark.parametrize(
    "text",
    [
        "a = " + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1),
        "a = " + "{b = " * (MAX_DEPTH + 1),
        "[" * 100_000,
    ],
    ids=["arrays", "inline-tables", "unclosed"],
)
def test_nesting_past_the_limit_is_an_error_with_a_position(text):
    with pytest.raises(
        TOMLDecodeError, match=rf"nested more than {MAX_DEPTH} levels deep \(at line 1, column \d+\)"
    ):
        loads(text)


def test_crlf_and_a_byte_order_mark_read_as_plain_text():
    assert loads("\ufeffa = 1\r\nb = [\r\n  2,\r\n]\r\n") == {"a": 1, "b": [2]}


def test_a_long_dotted_key_is_refused_by_the_scan_naming_the_key_and_the_limit():
    """200,000 parts (400 KB): the scan refuses the 33rd, before the parser (whose work on a key grows with the
    square of its parts) sees the text."""
    from envbuilder.core._toml import MAX_KEY_PARTS, TOMLLimitError

    text = "[site]\n" + ".".join(["k"] * 200_000) + " = 1\n"
    with pytest.raises(TOMLLimitError) as info:
        loads(text)
    assert info.value.limit == MAX_KEY_PARTS
    assert info.value.key == "site." + ".".join(["k"] * 26) + "..."
    assert f"a dotted key of more than {MAX_KEY_PARTS} parts (at line 2, column 1)" in str(info.value)
    # A key of exactly the limit is fine, and dots in values (floats, times, strings) are no key parts.
    ok = (
        "a = [1.5, 2.5]\nt = 07:32:00.999\ns = '"
        + "x." * 100
        + "'\n"
        + ".".join(["k"] * MAX_KEY_PARTS)
        + " = 1\n"
    )
    assert loads(ok)["s"] == "x." * 100


def test_an_array_past_the_limit_names_its_key():
    from envbuilder.core._toml import MAX_ARRAY, TOMLLimitError

    with pytest.raises(TOMLLimitError, match=rf"an array of {MAX_ARRAY + 1} items; the limit is {MAX_ARRAY}"):
        loads("[site]\nnotes = [" + "1," * (MAX_ARRAY + 1) + "]\n")


def test_an_extends_chain_past_the_limit_names_the_file_and_key(tmp_path):
    for i in range(loader.MAX_EXTENDS + 2):
        parent = f'extends = "b{i + 1}.toml"\n' if i < loader.MAX_EXTENDS + 1 else ""
        write(tmp_path, f"b{i}.toml", f"schema_version = 1\n{parent}")
    write(tmp_path, "long.toml", 'schema_version = 1\nextends = "b0.toml"\n[recipe]\nname = "long"\n')
    with pytest.raises(RecipeError, match=rf"extends reaches more than {loader.MAX_EXTENDS} files") as info:
        loader.load("long", Catalog([Layer("test", tmp_path)]))
    assert info.value.key == "extends" and info.value.file and info.value.file.endswith(".toml")
    assert f"the limit is {loader.MAX_EXTENDS}" in info.value.message


def test_the_shipped_tables_pass_the_limits_scan_that_their_parse_skips():
    """core._toml.loads_shipped parses the package's own torch table without the scan: it must stay within every
    limit, and read the same either way."""
    from importlib.resources import files

    from envbuilder.core._toml import loads_shipped

    for name in ("torch_matrix.toml", "container_images.toml"):
        text = files("envbuilder").joinpath(f"data/{name}").read_text(encoding="utf-8")
        assert loads(text) == loads_shipped(text), name
