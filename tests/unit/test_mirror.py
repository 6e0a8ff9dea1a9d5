"""Index mirror remapping: parsing ENVBUILDER_INDEX_MIRROR and rewriting install commands (pure)."""

from __future__ import annotations

import pytest
from helpers import PLAN_ENV, load_facts

from envbuilder import plan
from envbuilder.core.errors import UsageError
from envbuilder.recipe import loader
from envbuilder.recipe.catalog import Catalog
from envbuilder.resolver import mirror

TORCH = [
    "uv",
    "pip",
    "install",
    "--python",
    "/e/bin/python",
    "--index-url",
    "https://download.pytorch.org/whl/cu126",
    "torch==2.10.0",
]
EXTRA = ["uv", "pip", "install", "--python", "/e/bin/python", "--constraint", "/e/c.txt", "numpy"]


def test_prefix_rule_maps_every_variant():
    rules = mirror.parse("https://download.pytorch.org/whl/=http://127.0.0.1:8080/torch/")
    cmds, notes = mirror.remap([TORCH], rules)
    assert cmds[0][5:7] == ["--index-url", "http://127.0.0.1:8080/torch/cu126"]
    assert notes == [
        "index https://download.pytorch.org/whl/cu126 -> http://127.0.0.1:8080/torch/cu126 (ENVBUILDER_INDEX_MIRROR)"
    ]


def test_longest_prefix_wins():
    rules = mirror.parse(
        "https://download.pytorch.org/whl/=http://m/all/ ; https://download.pytorch.org/whl/cu126=http://m/special"
    )
    assert mirror.remap([TORCH], rules)[0][0][6] == "http://m/special"


def test_wheelhouse_directory_means_no_index_and_find_links():
    rules = mirror.parse("https://download.pytorch.org/whl/cu126=/opt/wheels pypi=/opt/wheels")
    cmds, _ = mirror.remap([TORCH, EXTRA], rules)
    assert cmds[0] == [*TORCH[:5], "--no-index", "--find-links", "/opt/wheels", "torch==2.10.0"]
    assert cmds[1] == [*EXTRA[:3], "--no-index", "--find-links", "/opt/wheels", *EXTRA[3:]]


def test_default_index_untouched_without_a_pypi_rule():
    rules = mirror.parse("https://download.pytorch.org/whl/=http://m/")
    assert mirror.remap([EXTRA], rules)[0][0] == EXTRA


def test_non_install_commands_are_left_alone():
    create = ["uv", "venv", "--python", "python3", "/e"]
    assert mirror.remap([create], mirror.parse("pypi=/w"))[0] == [create]


@pytest.mark.parametrize("bad", ["no-equals-sign", "=http://x", "https://a=relative/dir"])
def test_bad_specs_are_usage_errors(bad):
    with pytest.raises(UsageError, match="ENVBUILDER_INDEX_MIRROR"):
        mirror.parse(bad)


def test_plan_applies_the_mirror_and_says_so():
    env = {
        **PLAN_ENV,
        "ENVBUILDER_INDEX_MIRROR": "https://download.pytorch.org/whl/=http://127.0.0.1:9/torch/",
    }
    p = plan.build(loader.load("zurada-conda-cu128", Catalog.from_env({})), load_facts("h100"), env)
    torch_cmd = next(c for c in p.install_commands if "torch==2.7.1" in c)
    assert "http://127.0.0.1:9/torch/cu128" in torch_cmd
    assert (
        p.resolution.index_url == "https://download.pytorch.org/whl/cu128"
    )  # the plan still names the upstream
    assert any("ENVBUILDER_INDEX_MIRROR" in n for n in p.notes)


def test_wheelhouse_plus_pypi_keeps_pypi_as_the_index():
    rules = mirror.parse("https://download.pytorch.org/whl/cu126=/opt/wheels,pypi")
    cmds, notes = mirror.remap([TORCH], rules)
    assert cmds[0] == [
        *TORCH[:5],
        "--index-url",
        "https://pypi.org/simple",
        "--find-links",
        "/opt/wheels",
        "torch==2.10.0",
    ]
    assert "-> https://pypi.org/simple, /opt/wheels" in notes[0]


def test_several_urls_become_index_then_extra_indexes():
    rules = mirror.parse("https://download.pytorch.org/whl/=http://a/torch/,http://b/torch/")
    cmds, _ = mirror.remap([TORCH], rules)
    assert cmds[0][5:9] == [
        "--index-url",
        "http://a/torch/cu126",
        "--extra-index-url",
        "http://b/torch/cu126",
    ]


def test_pypi_listed_after_a_torch_mirror_is_only_the_fallback():
    # uv searches extra indexes before the main one and stops at the first that has the package: PyPI must be
    # the main index here, or its own torch build wins over the mirror's (the `URL,pypi` form of the README).
    rules = mirror.parse("https://download.pytorch.org/whl/=http://m/torch/,pypi")
    cmd = mirror.remap([TORCH], rules)[0][0]
    assert cmd[5:9] == ["--index-url", mirror.PYPI, "--extra-index-url", "http://m/torch/cu126"]
    # A mirror target list without PyPI keeps its order: the first URL is the index.
    two = mirror.parse("https://download.pytorch.org/whl/=http://m/a/,http://m/b/")
    assert mirror.remap([TORCH], two)[0][0][5:9] == [
        "--index-url",
        "http://m/a/cu126",
        "--extra-index-url",
        "http://m/b/cu126",
    ]


def test_pypi_in_a_torch_mirror_list_is_pypi_as_the_pypi_rule_reaches_it():
    rules = mirror.parse("https://download.pytorch.org/whl/=http://m/torch/,pypi pypi=http://m/simple/")
    cmd = mirror.remap([TORCH], rules)[0][0]
    assert cmd[5:9] == ["--index-url", "http://m/simple/", "--extra-index-url", "http://m/torch/cu126"]
    # The README's form: a wheel directory for torch, PyPI for the rest.
    readme = mirror.parse("https://download.pytorch.org/whl/=/opt/wheels,pypi")
    assert mirror.remap([TORCH], readme)[0][0][5:9] == [
        "--index-url",
        mirror.PYPI,
        "--find-links",
        "/opt/wheels",
    ]
