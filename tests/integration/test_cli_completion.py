"""Completion scripts loaded in the real shells: subcommands, options, and recipe and env names, which the
scripts ask `envbuilder __complete` for as the user presses tab."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from helpers import REPO, run_cli

pytestmark = pytest.mark.integration


@pytest.fixture
def shell_env(tmp_path):
    """A user whose `envbuilder` on PATH is this checkout, with one env recorded (its name is all that is read)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "envbuilder"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m envbuilder "$@"\n')
    shim.chmod(0o755)
    home = tmp_path / "envbuilder-home"
    (home / "envs").mkdir(parents=True)
    (home / "envs" / "my-env.json").write_text("{}")
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": str(tmp_path),
        "ENVBUILDER_HOME": str(home),
        "PYTHONPATH": str(REPO),
    }


def script(tmp_path, shell, env):
    res = run_cli("completion", shell, env=env)
    assert res.returncode == 0, res.stderr
    path = tmp_path / f"envbuilder.{shell}"
    path.write_text(res.stdout)
    return path


def run_shell(argv, env, script_text=None):
    res = subprocess.run(
        argv, input=script_text, env=env, capture_output=True, text=True, timeout=120, cwd=REPO, check=False
    )
    assert res.returncode == 0, res.stderr
    return res


def test_names_for_completion(shell_env):
    recipes = run_cli("__complete", "recipes", env=shell_env)
    assert recipes.returncode == 0, recipes.stderr
    assert {"local", "vista-venv-cu124"} <= set(recipes.stdout.splitlines())
    envs = run_cli("__complete", "envs", env=shell_env)
    assert envs.stdout.splitlines() == ["my-env"]


def test_shell_defaults_from_SHELL_and_unknown_shells_are_refused(shell_env):
    res = run_cli("completion", env={**shell_env, "SHELL": "/usr/bin/fish"})
    assert res.returncode == 0, res.stderr
    assert "complete -c envbuilder" in res.stdout
    res = run_cli("completion", env={**shell_env, "SHELL": "/bin/ksh"})
    assert res.returncode == 2
    assert "ksh" in res.stderr
    assert res.stdout == ""


BASH_DRIVER = """
source "$1"
complete -p envbuilder
words() { COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); _shtab_envbuilder; echo "${COMPREPLY[*]}"; }
words envbuilder cre
words envbuilder create vista-v
words envbuilder create --fo
words envbuilder recipes show lo
words envbuilder activate my-
words envbuilder completion z
"""


def test_bash(tmp_path, shell_env):
    path = script(tmp_path, "bash", shell_env)
    res = run_shell(["bash", "--norc", "-s", str(path)], shell_env, BASH_DRIVER)
    lines = res.stdout.splitlines()
    assert lines[0] == "complete -o bashdefault -F _shtab_envbuilder envbuilder"
    assert lines[1:] == [
        "create",
        "vista-venv-cu124 vista-venv-mpi-cu126",
        "--force",
        "local lonestar6-venv-cu128",
        "my-env",
        "zsh",
    ]


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_loads_both_ways_and_names_complete(tmp_path, shell_env):
    path = script(tmp_path, "zsh", shell_env)
    # eval in .zshrc after compinit
    res = run_shell(
        [
            "zsh",
            "-f",
            "-c",
            'autoload -U compinit; compinit -u; eval "$(cat "$1")"; print -r -- $_comps[envbuilder]',
            "zsh",
            str(path),
        ],
        shell_env,
    )
    assert res.stdout.strip() == "_shtab_envbuilder"
    assert res.stderr == ""
    # or as _envbuilder on $fpath, found by compinit
    fpath = tmp_path / "zfunc"
    fpath.mkdir()
    shutil.copy(path, fpath / "_envbuilder")
    res = run_shell(
        [
            "zsh",
            "-f",
            "-c",
            f"fpath=({fpath} $fpath); autoload -U compinit; compinit -u -d {tmp_path}/zcd; "
            "print -r -- $_comps[envbuilder]",
        ],
        shell_env,
    )
    assert res.stdout.strip() == "_envbuilder"
    # the name completers the script defines, with compadd (a completion-widget builtin) standing in
    res = run_shell(
        [
            "zsh",
            "-f",
            "-c",
            'autoload -U compinit; compinit -u; eval "$(cat "$1")"; '
            'compadd() { print -rl -- "${(@P)${@[-1]}}"; }; _envbuilder_recipes; _envbuilder_envs',
            "zsh",
            str(path),
        ],
        shell_env,
    )
    names = res.stdout.splitlines()
    assert "local" in names
    assert names[-1] == "my-env"


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed (.ci/run installs it)")
def test_fish(tmp_path, shell_env):
    path = script(tmp_path, "fish", shell_env)

    def complete(line):
        res = run_shell(["fish", "--no-config", "-c", f"source {path}; complete -C '{line}'"], shell_env)
        return [row.split("\t")[0] for row in res.stdout.splitlines()]

    assert complete("envbuilder cre") == ["create"]
    assert complete("envbuilder create vista-v") == ["vista-venv-cu124", "vista-venv-mpi-cu126"]
    assert "--force" in complete("envbuilder create --fo")
    assert complete("envbuilder recipes show lo") == ["local", "lonestar6-venv-cu128"]
    assert complete("envbuilder activate my-") == ["my-env"]
