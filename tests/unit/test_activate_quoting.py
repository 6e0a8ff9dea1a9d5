"""How the activate renderers quote a recipe's values for fish and csh, and which line `envbuilder activate` prints
for each shell. Where the shell is installed, each quoted value is also read back by it."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from envbuilder.backends import activation
from envbuilder.core.shells.csh import CSH
from envbuilder.core.shells.fish import FISH
from envbuilder.plan.activation import Activation
from envbuilder.render import activate_scripts

#: Quotes, $, backquotes, a backslash, a history `!`, spaces, globs: what a value or prefix may hold.
HOSTILE = [
    "plain",
    "",
    "two words",
    "it's",
    "$(touch PWNED) `touch PWNED2` \"dq\" 'sq'",
    "back\\slash\\",
    "\\'",
    "!bang !! !$",
    "* ? [a] {b,c} ~ #",
]


def test_fish_single_quotes_escape_only_backslash_and_quote():
    assert FISH.quote("a b") == "'a b'"
    assert FISH.quote("it's") == "'it\\'s'"
    assert FISH.quote("a\\b") == "'a\\\\b'"
    assert FISH.quote("$x `y` (z)") == "'$x `y` (z)'"


def test_fish_double_quotes_escape_dollar_quote_and_backslash():
    assert FISH.dquote('$(id) "q" \\') == '\\$(id) \\"q\\" \\\\'


def test_csh_single_quotes_put_quote_and_bang_outside():
    assert CSH.quote("a b") == "'a b'"
    assert CSH.quote("it's") == "'it'\\''s'"
    assert CSH.quote("!x") == "''\\!'x'"
    assert CSH.quote("$x `y` \\") == "'$x `y` \\'"
    # Inside double quotes: the quote closed around a single-quoted piece.
    assert CSH.dquote("a!b") == "\"'a'\\!'b'\""


@pytest.mark.parametrize("value", HOSTILE)
def test_fish_reads_back_what_was_quoted(value, tmp_path):
    if not shutil.which("fish"):
        pytest.skip("fish is not installed (.ci/run installs it)")
    script = f"printf '%s' {FISH.quote(value)}; printf '|'; printf '%s' \"{FISH.dquote(value)}\""
    out = subprocess.run(
        ["fish", "--no-config", "-c", script], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout
    assert out == f"{value}|{value}"
    assert not list(tmp_path.glob("PWNED*"))


@pytest.mark.parametrize("value", HOSTILE)
def test_tcsh_reads_back_what_was_quoted(value, tmp_path):
    if not shutil.which("tcsh"):
        pytest.skip("tcsh is not installed (.ci/run installs it)")
    script = tmp_path / "q.csh"
    script.write_text(f"setenv V {CSH.quote(value)}\nprintenv V\nprintf '%s\\n' \"{CSH.dquote(value)}\"\n")
    out = subprocess.run(
        ["tcsh", "-f", str(script)], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout
    assert out == f"{value}\n{value}\n"
    assert not list(tmp_path.glob("PWNED*"))


def test_rendered_fish_and_csh_quote_every_value():
    act = Activation(
        env={"TRICKY": "$(id) 'q'"},
        prepend={"LD_LIBRARY_PATH": ("/a b",)},
        modules=("gcc/15.1.0",),
        recipe="r",
    )
    fish = activate_scripts.render_script(act, shell=FISH)
    assert "set -gx TRICKY '$(id) \\'q\\''" in fish
    assert "'/a b'" in fish
    csh = activate_scripts.render_own_venv(act, "/envs/it's", CSH)
    assert "setenv VIRTUAL_ENV '/envs/it'\\''s'" in csh["bin/activate.csh"]
    assert "setenv TRICKY '$(id) '\\''q'\\'''" in csh["envbuilder/activate.csh"]
    assert "module unload" in csh["envbuilder/deactivate.csh"]


def test_conda_env_is_named_but_not_run_from_fish_and_csh():
    act = Activation(modules=("conda/2025-09-25",), conda_env="base", module_init="/lmod/init")
    for text in (
        activate_scripts.render_script(act, shell=FISH),
        activate_scripts.render_own_venv(act, "/e", CSH)["envbuilder/activate.csh"],
    ):
        assert "runs from bash and zsh only" in text and "conda activate" in text and "base" in text


@pytest.mark.parametrize(
    ("shell", "script"),
    [("bash", "activate"), ("zsh", "activate"), ("fish", "activate.fish"), ("tcsh", "activate.csh")],
)
def test_the_activate_line_sources_that_shells_script(shell, script, tmp_path):
    (tmp_path / "it's").mkdir()
    (tmp_path / "it's" / "bin").mkdir()
    (tmp_path / "it's" / "bin" / script).write_text("")
    line = activation.activate_line(str(tmp_path / "it's"), shell)
    assert line.startswith("source ") and line.endswith(f"/bin/{script}'")


@pytest.mark.parametrize(
    ("shell", "expected"),
    [("/usr/bin/fish", "fish"), ("/bin/tcsh", "tcsh"), ("/bin/csh", "tcsh"), ("/bin/zsh", "zsh"), ("/bin/ksh", "bash"),
     ("", "bash")],
)  # fmt: skip
def test_the_default_shell_comes_from_shell(shell, expected):
    assert activation.default_shell({"SHELL": shell} if shell else {}) == expected
