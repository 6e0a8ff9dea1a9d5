"""Small slips a user makes, answered with help as precise as a recipe typo gets: a close match for a mistyped
flag, command, choice or env name, the help of the command that was typed, `create` for a recipe never built, a
declined `remove` that is no error, `modulefile -o DIR` that makes DIR, and a plan that names the mirror torch
really comes from."""

from __future__ import annotations

import json
import os
import pty
import subprocess
from pathlib import Path

import pytest
from helpers import FACTS, PLAN_ENV, REPO, UserWorld, ok, refused, run_cli

pytestmark = pytest.mark.integration

#: An env with nothing to install: built without any index.
BARE = """
schema_version = 1

[recipe]
name = "bare"

[env]
kind = "venv"
installer = "uv"

[python]
command = "python3"

[torch]
install = false
"""


@pytest.fixture
def world(tmp_path):
    w = UserWorld(tmp_path)
    w.write_recipe("bare", BARE)
    return w


def _said(res: subprocess.CompletedProcess[str]) -> str:
    return res.stdout + res.stderr


def test_a_mistyped_flag_gets_the_option_meant_and_the_commands_help():
    res = run_cli("create", "local", "--froce")
    refused(res, 2, "envbuilder create: unrecognized arguments: --froce")
    assert "hint: did you mean '--force'? See `envbuilder create --help`" in res.stderr
    assert "`envbuilder --help`" not in res.stderr


def test_a_mistyped_command_or_choice_gets_a_close_match():
    res = run_cli("craete", "local")
    refused(res, 2, "invalid choice: 'craete'")
    assert "did you mean 'create'?" in res.stderr
    res = run_cli("recipes", "shwo", "local")
    refused(res, 2, "invalid choice: 'shwo'")
    assert "did you mean 'show'? See `envbuilder recipes --help`" in res.stderr
    res = run_cli("create", "local", "--installer", "uvv")
    refused(res, 2, "invalid choice: 'uvv'")
    assert "did you mean 'uv'? See `envbuilder create --help`" in res.stderr


def test_a_missing_argument_names_the_commands_help():
    res = run_cli("plan")
    refused(res, 2, "the following arguments are required: recipe")
    assert "see `envbuilder plan --help`" in res.stderr


def test_env_names_get_a_close_match_and_a_recipe_never_built_gets_create(world):
    ok(world.cli("create", "bare", "--no-validate"))
    res = world.cli("activate", "baer")
    refused(res, 9, "no env named 'baer'")
    assert "did you mean 'bare'?" in res.stderr
    world.write_recipe("other", BARE.replace('name = "bare"', 'name = "other"'))
    for verb in ("activate", "show"):
        res = world.cli(verb, "other")
        refused(res, 9, "recipe other has not been built yet")
        assert "hint: envbuilder create other" in res.stderr
    res = world.cli("show", "nothing-like-it")
    refused(res, 9, "no env named 'nothing-like-it'")
    assert "envbuilder create" not in res.stderr


def test_declining_remove_keeps_the_env_and_exits_0(world):
    ok(world.cli("create", "bare", "--no-validate"))
    prefix = Path(json.loads(ok(world.cli("show", "bare", "--json")).stdout)["data"]["prefix"])
    # The question is asked on a terminal only: a pty stands in for the user's.
    controller, terminal = pty.openpty()
    try:
        proc = world.spawn("remove", "bare", stdin=terminal)
        os.write(controller, b"n\n")
        out, err = proc.communicate(timeout=120)
    finally:
        os.close(controller)
        os.close(terminal)
    assert proc.returncode == 0, err
    assert f"kept bare ({prefix})" in out + err
    assert "error" not in err
    assert prefix.is_dir()
    ok(world.cli("show", "bare"))


def test_modulefile_output_makes_the_directory_it_names(world):
    ok(world.cli("create", "bare", "--no-validate"))
    made = world.root / "modules" / "new"
    said = _said(ok(world.cli("modulefile", "bare", "-o", str(made))))
    assert (made / "bare.lua").is_file() and f"module use {made}" in said
    tcl = world.root / "tcl-modules"
    ok(world.cli("modulefile", "bare", "--format", "tcl", "-o", f"{tcl}/"))
    assert (tcl / "bare").is_file()
    # A Tcl path without the slash is the file itself; a Lua one ending in .lua too.
    ok(world.cli("modulefile", "bare", "--format", "tcl", "-o", str(world.root / "t" / "bare-1.0")))
    assert (world.root / "t" / "bare-1.0").is_file()
    ok(world.cli("modulefile", "bare", "-o", str(world.root / "l" / "x.lua")))
    assert (world.root / "l" / "x.lua").is_file()


def test_modulefile_json_names_the_file_it_wrote(world):
    ok(world.cli("create", "bare", "--no-validate"))
    made = world.root / "json-modules"
    # -o as a user types it: relative (the CLI runs in REPO), a directory not there yet.
    typed = os.path.relpath(made, REPO)
    data = world.data("modulefile", "bare", "-o", typed)
    assert data["path"] == str((made / "bare.lua").resolve()) and Path(data["path"]).is_file()
    data = world.data("modulefile", "bare", "--format", "tcl", "-o", f"{typed}/tcl/")
    assert data["path"] == str((made / "tcl" / "bare").resolve()) and Path(data["path"]).is_file()


def test_plan_names_the_mirror_torch_comes_from():
    env = {
        **PLAN_ENV,
        "ENVBUILDER_INDEX_MIRROR": "https://download.pytorch.org/whl/=https://mirror.site/torch/",
    }
    res = ok(run_cli("plan", "local", "--facts", str(FACTS / "cpu-only.json"), env=env))
    line = next(li for li in _said(res).splitlines() if li.strip().startswith("torch:"))
    assert "from https://mirror.site/torch/cpu (mirror of https://download.pytorch.org/whl/cpu" in line, line
