"""Output as a user meets it: results on stdout (through a real pipe, redirected to a file, on a terminal), messages
on stderr, --json alone on stdout, colour only on a terminal, and tables that fit 80 and 200 columns without a
value a user must type being cut or wrapped (a pty of that size, or a pipe)."""

from __future__ import annotations

import json
import re
import shlex
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import FACTS, PLAN_ENV, UserWorld, bash, cli_argv, cli_env, ok, on_terminal, run_cli
from wheelindex import build_wheel, mirror_env, serve

pytestmark = pytest.mark.integration

CLI = shlex.join(cli_argv())
CPU = str(FACTS / "cpu-only.json")
#: Any SGR sequence that sets a colour (30-38, 90-97 foreground; 40-48, 100-107 background).
COLOUR = re.compile(r"\x1b\[(?:\d+;)*(?:3[0-8]|9[0-7]|4[0-8]|10[0-7])(?:;\d+)*m")
ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def terminal_env(env: dict[str, str], **extra: str) -> dict[str, str]:
    """``env`` as a user's login shell has it: a TERM, no COLUMNS (the terminal's size is what counts)."""
    full = {k: v for k, v in cli_env(env).items() if k not in ("COLUMNS", "NO_COLOR")}
    return {**full, "TERM": "xterm-256color", **extra}


def piped(args: tuple[str, ...], env: dict[str, str], width: int) -> str:
    """The CLI's stdout through a real pipe (``| cat``), with COLUMNS set to ``width`` unless it is 80 (what a
    pipe gets with no COLUMNS at all)."""
    full = {k: v for k, v in cli_env(env).items() if k != "COLUMNS"}
    if width != 80:
        full["COLUMNS"] = str(width)
    res = bash(f"{CLI} {shlex.join(args)} | cat", full)
    assert res.returncode == 0, res.stderr
    return res.stdout


def shown_whole(text: str, values: list[str], width: int) -> None:
    """Every value stands whole on one line, and no line is wider than ``width``."""
    lines = [ESCAPE.sub("", line).rstrip() for line in text.splitlines()]
    assert lines, text
    for value in values:
        assert any(re.search(rf"(^|\s){re.escape(value)}(\s|$)", line) for line in lines), (value, text)
    assert max(len(line) for line in lines) <= width, text


# ---------------------------------------------------------------------------------------------------------------
# Streams


def test_recipes_list_through_a_pipe_finds_the_recipe():
    res = bash(f"{CLI} recipes list | grep -w vista-venv-cu124", cli_env())
    assert res.returncode == 0, res.stderr
    [line] = res.stdout.splitlines()
    assert line.split()[0] == "vista-venv-cu124"


def test_plan_redirected_to_a_file_writes_the_plan(tmp_path):
    res = bash(
        f"{CLI} plan local --facts {shlex.quote(CPU)} > {shlex.quote(str(tmp_path / 'plan.txt'))}", cli_env()
    )
    assert res.returncode == 0, res.stderr
    plan = (tmp_path / "plan.txt").read_text()
    assert plan.startswith("Plan for local")
    assert "Steps" in plan and "Validation" in plan
    assert "Plan for" not in res.stderr and res.stdout == ""


def test_json_is_alone_on_stdout_and_warnings_go_to_stderr(tmp_path):
    junk = tmp_path / "junk.toml"
    junk.write_bytes(b'schema_version = 1\nx = "\xff"\n')
    env = {**PLAN_ENV, "ENVBUILDER_RECIPE_PATH": str(tmp_path)}
    for args in (("plan", "local", "--facts", CPU), ("recipes", "list"), ("recipes", "show", "local")):
        res = ok(run_cli(*args, "--json", env=env))
        assert json.loads(res.stdout)["status"] == "ok"
        assert any(line.startswith("warning:") and str(junk) in line for line in res.stderr.splitlines())
        human = ok(run_cli(*args, env=env))
        assert human.stdout and not human.stdout.lstrip().startswith("{")
        assert str(junk) not in human.stdout  # the warning stays on stderr


def test_results_are_coloured_only_on_a_terminal_and_never_under_no_color():
    args = ("plan", "local", "--facts", CPU)
    code, shown, _ = on_terminal(args, terminal_env(PLAN_ENV), 120)
    assert code == 0 and COLOUR.search(shown), shown
    code, shown, _ = on_terminal(args, terminal_env(PLAN_ENV, NO_COLOR="1"), 120)
    assert code == 0 and "Plan for local" in shown and not COLOUR.search(shown), shown
    res = bash(f"{CLI} {shlex.join(args)} | cat", terminal_env(PLAN_ENV))
    assert res.returncode == 0 and "Plan for local" in res.stdout and "\x1b[" not in res.stdout


def test_messages_are_coloured_only_on_a_terminal_and_never_under_no_color(tmp_path):
    (tmp_path / "junk.toml").write_bytes(b'schema_version = 1\nx = "\xff"\n')
    env = {**PLAN_ENV, "ENVBUILDER_RECIPE_PATH": str(tmp_path)}
    args = ("plan", "local", "--facts", CPU)
    code, shown, err = on_terminal(args, terminal_env(env), 120)  # stderr is a pipe here
    assert code == 0 and "warning:" in err and "\x1b[" not in err, err
    assert "warning:" not in shown
    code, shown, _ = on_terminal(args, terminal_env(env), 120, stderr_too=True)
    [warning] = [line for line in shown.splitlines() if "warning:" in line]
    assert code == 0 and COLOUR.search(warning), shown
    code, shown, _ = on_terminal(args, terminal_env(env, NO_COLOR="1"), 120, stderr_too=True)
    assert code == 0 and "warning:" in shown and not COLOUR.search(shown), shown


# ---------------------------------------------------------------------------------------------------------------
# Tables that fit


@pytest.mark.parametrize("width", [80, 200])
@pytest.mark.parametrize("where", ["pipe", "terminal"])
def test_recipes_list_fits_with_every_name_whole(where, width):
    names = [
        r["name"] for r in json.loads(ok(run_cli("recipes", "list", "--json")).stdout)["data"]["recipes"]
    ]
    if where == "pipe":
        text = piped(("recipes", "list"), PLAN_ENV, width)
    else:
        code, text, err = on_terminal(("recipes", "list"), terminal_env(PLAN_ENV), width)
        assert code == 0, err
    shown_whole(text, names, width)
    header = ESCAPE.sub("", text.splitlines()[0]).split()
    assert ("from" in header) == (width == 200)  # optional: left out at 80


@pytest.fixture(scope="module")
def world() -> Iterator[UserWorld]:
    """An env with a long name, built from a local index and backed up, in a short root (so that its prefix fits
    80 columns whole)."""
    with tempfile.TemporaryDirectory(prefix="ebt") as tmp:
        root = Path(tmp)
        files = root / "files"
        files.mkdir()
        build_wheel(files, "ebtiny", "1.0", {"ebtiny/__init__.py": ""})
        with serve(files) as index:
            w = UserWorld(root, mirror_env(index), WORK=str(root / "work"))
            w.write_recipe(
                "tables",
                'schema_version = 1\n[recipe]\nname = "tables"\n[env]\nkind = "venv"\ninstaller = "uv"\n'
                'prefix = "${SCRATCH}/envs/{name}"\n[python]\ncommand = "python3"\n[torch]\ninstall = false\n'
                '[[packages]]\nname = "ebtiny"\nspec = "ebtiny==1.0"\n',
            )
            ok(w.cli("create", "tables", "--name", "a-rather-long-env-name-for-tables", "--no-validate"))
            ok(w.cli("backup", "a-rather-long-env-name-for-tables"))
            yield w


@pytest.mark.parametrize("width", [80, 200])
@pytest.mark.parametrize("where", ["pipe", "terminal"])
def test_list_and_backups_fit_with_names_prefixes_and_ids_whole(world, where, width):
    [env] = world.data("list")
    [made] = world.data("backups")
    for args, values in (
        (("list",), [env["name"], env["prefix"]]),
        (("backups",), [made["id"]]),
    ):
        if where == "pipe":
            text = piped(args, world.env, width)
        else:
            code, text, err = on_terminal(args, terminal_env(world.env), width)
            assert code == 0, err
        shown_whole(text, values, width)
