"""Flags that work everywhere (issue 37): global options before or after the command, JSON for usage errors,
one name for ranks per node, a program typed without `--`, and tcsh completion in the real tcsh."""

from __future__ import annotations

import json
import os
import pty
import select
import shutil
import subprocess
import time

import pytest
import test_cli_completion
from helpers import run_cli, run_cli_process

from envbuilder.cli import manpage, parts
from envbuilder.cli import parser as cliparser

pytestmark = pytest.mark.integration


def parsed(*argv):
    args = cliparser.build_parser().parse_args(list(argv))
    parts.merge_global_options(args)
    return args


def test_verbose_and_quiet_go_anywhere_and_add_up():
    assert parsed("-v", "plan", "local", "-v").verbose == 2
    assert parsed("plan", "-vv", "local").verbose == 2
    assert parsed("-v", "recipes", "-v", "show", "local", "-v").verbose == 3
    assert parsed("list").verbose == 0 and parsed("list").quiet == 0
    assert parsed("validate", "x", "-q").quiet == 1 and parsed("-q", "create", "x").quiet == 1
    assert parsed("doctor", "--traceback").traceback and not parsed("doctor").traceback
    assert parsed("--json", "list").json and parsed("list", "--json").json


def test_global_options_in_a_real_process():
    res = run_cli_process("plan", "local", "--offline", "-q", "-v")  # -q was create's, lock's, backup's only
    assert res.returncode == 0, res.stderr
    assert "Plan for local" in res.stdout
    res = run_cli_process("--json", "recipes", "list")  # --json before the command
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["command"] == "recipes list"


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (("--json", "plan"), "plan"),
        (("plan", "local", "--nodes", "zero", "--json"), "plan"),
        (("--json", "man"), "man"),  # man has no JSON output: said so, as JSON
        (("list", "--json", "--no-such"), "list"),
    ],
)
def test_usage_errors_under_json_print_the_envelope(argv, command):
    res = run_cli_process(*argv)
    assert res.returncode == 2
    document = json.loads(res.stdout)
    assert document["command"] == command and document["status"] == "error" and document["data"] is None
    [error] = document["errors"]
    assert error["family"] == "usage" and error["exit_code"] == 2
    assert res.stderr.startswith("error: ") and "{" not in res.stderr
    assert error["message"] in res.stderr


def test_a_usage_error_without_json_prints_no_json():
    res = run_cli_process("plan")
    assert res.returncode == 2 and res.stdout == ""


def test_one_name_for_ranks_per_node_on_every_command():
    for command in ("plan", "validate", "run", "sbatch"):
        for flag in ("--ranks-per-node", "--nproc-per-node", "--gpus-per-node"):
            assert parsed(command, "x", flag, "3").ranks_per_node == 3, (command, flag)
    res = run_cli("run", "--help")
    assert "--ranks-per-node N" in res.stdout
    assert "--gpus-per-node" not in res.stdout and "--nproc-per-node" not in res.stdout
    page = manpage.render(cliparser.build_parser())
    assert "\\-\\-ranks\\-per\\-node N, \\-\\-nproc\\-per\\-node N, \\-\\-gpus\\-per\\-node N" in page


@pytest.mark.parametrize("command", ["run", "sbatch"])
def test_a_program_without_dashes_shows_the_corrected_line(command):
    res = run_cli(command, "--nodes", "2", "vcpu", "train.py", "--epochs", "3", "-v")
    assert res.returncode == 2
    assert "must come after `--`" in res.stderr and "'train.py'" in res.stderr
    assert f"hint: everything after `--` is the program's: envbuilder {command} --nodes 2 vcpu -- train.py " \
        "--epochs 3 -v" in res.stderr  # fmt: skip
    assert res.stdout == ""


#: The user of the other shells' completion tests: `envbuilder` on PATH is this checkout, one env recorded.
shell_env = test_cli_completion.shell_env

TCSH = shutil.which("tcsh")
needs_tcsh = pytest.mark.skipif(TCSH is None, reason="tcsh is not installed")


@pytest.fixture
def tcsh_script(tmp_path, shell_env):
    res = run_cli("completion", "tcsh", env=shell_env)
    assert res.returncode == 0, res.stderr
    path = tmp_path / "envbuilder.tcsh"
    path.write_text(res.stdout)
    return path


@needs_tcsh
def test_tcsh_loads_the_rules(tcsh_script, shell_env):
    res = subprocess.run(
        [TCSH, "-f", "-c", f"source {tcsh_script} && complete envbuilder"],
        env=shell_env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""
    verbs = res.stdout.split("p/1/(", 1)[1].split(")", 1)[0].split()  # the first word: every command
    assert {"plan", "lock", "create", "validate", "mirror", "config", "completion"} <= set(verbs), verbs
    assert "n/activate/`envbuilder __complete envs`/" in res.stdout
    assert "N/recipes/`envbuilder __complete recipes`/" in res.stdout


def typed(shell_env, script, line):
    """What an interactive tcsh shows after ``line`` and a tab, in a real terminal (a pty)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: the user's shell
        os.execve(TCSH, [TCSH, "-f", "-i"], {**shell_env, "TERM": "dumb"})  # noqa: S606 - tcsh is the test
    os.write(fd, f"set edit; set prompt='> '; source {script}\n".encode())
    time.sleep(1)
    os.write(fd, f"{line}\t".encode())
    seen, end = b"", time.monotonic() + 8  # the names come from a python process: a second or two
    try:
        while time.monotonic() < end:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if ready:
                seen += os.read(fd, 4096)
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    return seen.decode(errors="replace")


@needs_tcsh
@pytest.mark.parametrize(
    ("line", "completed"),
    [
        ("envbuilder cre", "envbuilder create "),
        ("envbuilder activate my-", "envbuilder activate my-env "),
        ("envbuilder recipes show lonestar", "envbuilder recipes show lonestar6-venv-cu128 "),
        ("envbuilder completion tc", "envbuilder completion tcsh "),
    ],
)
def test_tcsh_completes_verbs_and_names(tcsh_script, shell_env, line, completed):
    assert completed in typed(shell_env, tcsh_script, line)
