"""The real CLI in a child process: the JSON contract, exit codes per error family, and the README's promises."""

from __future__ import annotations

import json
import platform
import re
import subprocess
import sys

import pytest
from helpers import FACTS, PLAN_ENV, REPO, cli_argv, cli_env, refused, run_cli

from envbuilder.core import errors

pytestmark = pytest.mark.integration


def envelope(res):
    data = json.loads(res.stdout)
    assert set(data) == {"envbuilder_result_version", "command", "status", "data", "errors"}
    assert data["envbuilder_result_version"] == 1
    return data


def test_plan_vista_prints_the_corrected_procedure():
    res = run_cli("plan", "vista-venv-cu124", "--facts", str(FACTS / "gh200-aarch64.json"))
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "module load gcc/15.1.0 python3/3.11.8" in out
    assert "--index-url https://download.pytorch.org/whl/cu126 -- torch==2.10.0" in out
    assert "idev -p gh-dev -N 1 -n 1 -t 00:30:00" in out
    assert (
        "corrected: pip3 install torch torchvision torchaudio --index-url https://download.pytorch.org/whl/cu124"
        in out
    )
    assert "module load" not in res.stderr  # the plan is the result: stdout, not mixed with messages


def test_plan_json_envelope():
    res = run_cli("plan", "zurada-conda-cu128", "--facts", str(FACTS / "h100.json"), "--json")
    assert res.returncode == 0, res.stderr
    data = envelope(res)
    assert data["command"] == "plan"
    assert data["status"] == "ok"
    assert data["errors"] == []
    assert data["data"]["index_url"] == "https://download.pytorch.org/whl/cu128"
    assert data["data"]["modules"] == ["miniforge3/25.3.1-gcc-11.4.1"]


def test_gate_failure_is_status_error_with_resolver_exit_code(tmp_path):
    facts = json.loads((FACTS / "h100.json").read_text())
    facts["driver_version"] = "470.82.01"  # CUDA 11.4 driver: too old for any cu12x
    facts["max_cuda"] = "11.4"
    path = tmp_path / "old-driver.json"
    path.write_text(json.dumps(facts))
    res = run_cli("plan", "zurada-conda-cu128", "--facts", str(path), "--json")
    assert res.returncode == errors.ResolverError.exit_code == 4
    data = envelope(res)
    assert data["status"] == "error"
    assert data["errors"][0]["gate"] == "driver"
    assert "525.60.13" in data["errors"][0]["message"]
    assert data["errors"][0]["hint"] == "use cu118 with torch 2.7.1"
    assert "Traceback" not in res.stderr


def test_unknown_recipe_exit_code_and_did_you_mean():
    res = run_cli("plan", "vista-venv-cu12")
    assert res.returncode == errors.RecipeError.exit_code == 3
    assert "no recipe named 'vista-venv-cu12'" in res.stderr
    assert "hint: did you mean 'vista-venv-cu124'" in res.stderr
    assert "Traceback" not in res.stderr


def test_bad_facts_file_exit_code(tmp_path):
    path = tmp_path / "f.json"
    path.write_text("{")
    res = run_cli("plan", "local", "--facts", str(path))
    assert res.returncode == errors.HostProbeError.exit_code == 5
    assert "not valid JSON" in res.stderr


def test_usage_error_exit_code():
    res = run_cli("plan")
    assert res.returncode == 2
    assert "the following arguments are required: recipe" in res.stderr
    res = run_cli("plan", "local", "--nodes", "zero")
    assert res.returncode == 2


def test_traceback_flag_shows_the_stack():
    res = run_cli("--traceback", "plan", "no-such-recipe")
    assert res.returncode == 3
    assert "Traceback (most recent call last)" in res.stderr


def test_recipes_list_json_and_show_explain():
    res = run_cli("recipes", "list", "--json")
    assert res.returncode == 0, res.stderr
    rows = envelope(res)["data"]["recipes"]
    names = {r["name"] for r in rows}
    assert {"local", "vista-venv-cu124", "cirrus-venv-cu121-horovod"} <= names
    assert all("error" not in r for r in rows)
    cirrus = next(r for r in rows if r["name"] == "cirrus-venv-cu121-horovod")
    assert cirrus["status"] == "retired"

    res = run_cli("recipes", "show", "vista-venv-cu124", "--explain")
    assert res.returncode == 0, res.stderr
    assert re.search(
        r"torch\.variant\s+= \"cu126\"\s+# builtin:tacc/vista/vista-venv-cu124\.toml", res.stdout
    )
    assert re.search(r"compute\.arch\s+= \"aarch64\"\s+# builtin:tacc/vista/site\.toml", res.stdout)
    assert re.search(r"env\.installer\s+= \"uv\"\s+# <defaults>", res.stdout)


def test_recipes_list_reports_a_broken_user_recipe(tmp_path):
    (tmp_path / "mine.toml").write_text(
        'schema_version = 1\n[recipe]\nname = "mine"\n[torch]\nversoin = "2.7.1"\n'
    )
    res = run_cli("recipes", "list", "--json", env={**PLAN_ENV, "ENVBUILDER_RECIPE_PATH": str(tmp_path)})
    assert res.returncode == 0
    row = next(r for r in envelope(res)["data"]["recipes"] if r["name"] == "mine")
    assert "unknown key 'versoin'" in row["error"]


def test_recipes_schema_is_json():
    res = run_cli("recipes", "schema")
    assert res.returncode == 0
    assert json.loads(res.stdout)["properties"]["torch"]["properties"]["variant"]["type"] == "string"


def test_probe_json_replays_into_plan(tmp_path):
    res = run_cli("probe", "--json")
    assert res.returncode == 0, res.stderr
    facts = envelope(res)["data"]
    path = tmp_path / "me.json"
    path.write_text(json.dumps(facts))
    res = run_cli("plan", "local", "--facts", str(path), "--json")
    assert res.returncode == 0, res.stderr
    assert envelope(res)["data"]["target"]["arch"] == facts["arch"]


def test_no_color_output_has_no_escape_codes():
    res = run_cli("plan", "local", "--facts", str(FACTS / "cpu-only.json"))
    assert "\x1b[" not in res.stderr
    assert "\x1b[" not in res.stdout


def test_version():
    res = subprocess.run(
        [sys.executable, "-m", "envbuilder", "--version"], capture_output=True, text=True, check=True
    )
    assert res.stdout.startswith("envbuilder ")


# --- the README's promises ------------------------------------------------------------------------------------


def test_readme_exit_code_table_matches_the_error_tree():
    readme = (REPO / "README.md").read_text()
    table = dict(re.findall(r"^\| (\d+) \| ([a-z—]+) \|", readme, re.MULTILINE))
    for family in errors.FAMILIES:
        assert table.get(str(family.exit_code)) == family.family, family.__name__
    codes = [f.exit_code for f in errors.FAMILIES]
    assert len(codes) == len(set(codes)), "every family has its own exit code"


@pytest.mark.parametrize("args", [("recipes", "list"), ("__complete", "recipes"), ("plan", "local")])
def test_a_reader_that_leaves_ends_the_command_quietly(args):
    """`envbuilder recipes list | head -1`: the reader closes the pipe; the command stops with 141 (as a writer
    killed by SIGPIPE) and says nothing, instead of an internal error or rich's exit 1."""
    child = subprocess.Popen(
        cli_argv(*args), env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stderr is not None
    child.stdout.close()  # gone before the first line is written
    with child.stderr:
        err = child.stderr.read()
    assert child.wait(timeout=60) == errors.EXIT_PIPE, err
    assert err == ""


def test_readme_setup_commands_are_the_ones_ci_runs():
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    main_job = (
        "pip install . && ENVBUILDER_INDEX_MIRROR='https://download.pytorch.org/whl/=/opt/wheels,pypi' "
        "envbuilder create local"
    )
    assert main_job in readme
    assert main_job in ci
    assert "pip install -e '.[test]' && python tests/prepare.py && python -m pytest" in readme
    assert "python -m pip install -e '.[test]' && python tests/prepare.py && python -m pytest" in ci


@pytest.mark.skipif(
    platform.machine() != "x86_64", reason="checks an x86_64 machine refusing an aarch64 build"
)
def test_create_for_nodes_of_another_architecture_is_refused_before_anything_is_built(tmp_path):
    # Vista's compute nodes are aarch64 GH200s: an env built on this x86_64 machine would hold x86_64 wheels.
    env = {**PLAN_ENV, "SCRATCH": str(tmp_path / "scratch"), "ENVBUILDER_HOME": str(tmp_path / "home")}
    res = run_cli("create", "vista-venv-cu124", env=env)
    refused(res, 4, "vista-venv-cu124 is for aarch64 nodes, and this machine is x86_64")
    assert "on an aarch64 node of" in res.stderr and "lock vista-venv-cu124 --platform aarch64" in res.stderr
    assert not (tmp_path / "scratch").exists()
    assert not (tmp_path / "home" / "logs").exists()
