"""The shells' registry is the one extension point for a shell: a shell registered there (here a throwaway one,
for this test only) gets its activate scripts in every kind of env, its activate line (from a real venv, sourced
by a real shell), its image scripts, the CLI's ``--shell`` and ``completion`` choices and its name completer,
without another module naming it. And no module outside ``envbuilder/core/shells/`` names a shell."""

from __future__ import annotations

import ast
import re
import shlex
import shutil
import subprocess
import sys

import pytest
import sourcetrees
from helpers import REPO, run_cli

from envbuilder.backends import activation
from envbuilder.cli import completion
from envbuilder.cli.helptext import subcommands
from envbuilder.cli.parser import build_parser
from envbuilder.core.errors import StateError
from envbuilder.core.shells import registry
from envbuilder.core.shells.base import IF_PRESENT, Shell, Syntax
from envbuilder.plan.activation import Activation
from envbuilder.render import activate_scripts
from envbuilder.scale import image

#: A throwaway POSIX dialect: the POSIX template under its own suffix and activate script, read with `.`.
EBT = Syntax(
    "posix.sh",
    shlex.quote,
    lambda text: re.sub(r'(["\\$`])', r"\\\1", text),
    "ebt",
    "activate.ebt",
    venv=IF_PRESENT,
    added_later=True,
    source=".",
)
EBTEST = Shell(
    "ebtest",
    EBT,
    aliases=("ebtest-login",),
    comments=False,
    completer=lambda function, ask: (f"({ask})", None),
    completion_file="~/.ebtest_completion",
)
VALUE = "it's $x `y`"


@pytest.fixture
def ebtest(monkeypatch):
    """EBTEST registered for this test only (the registry's tables are copies, put back afterwards)."""
    monkeypatch.setattr(registry, "SHELLS", dict(registry.SHELLS))
    monkeypatch.setattr(registry, "COMPLETED", dict(registry.COMPLETED))
    registry.register(EBTEST)
    return EBTEST


def test_the_cli_offers_a_registered_shell(ebtest, tmp_path):
    env = {"ENVBUILDER_HOME": str(tmp_path)}
    res = run_cli("activate", "nosuch", "--shell", "ebtest", env=env)
    assert "invalid choice" not in res.stderr and "nosuch" in res.stderr  # parsed: the env is what is missing
    assert "bash, zsh, fish, tcsh, ebtest:" in run_cli("activate", "--help", env=env).stdout
    shown = run_cli("completion", "--help", env=env).stdout
    assert (
        "bash, zsh, fish, tcsh, ebtest" in shown
        and "envbuilder completion ebtest > ~/.ebtest_completion" in shown
    )
    assert "for bash, zsh, fish, tcsh or ebtest" in " ".join(run_cli("--help", env=env).stdout.split())
    # Its name completer is attached where shtab reads it, beside the others'.
    parser = build_parser()
    completion.script(parser, "bash")
    activate = next(sub for name, _, sub in subcommands(parser) if name == "activate")
    env_arg = next(action for action in activate._actions if action.dest == "env")
    marked = getattr(env_arg, "complete")  # noqa: B009 - set by completion, read by shtab
    # (the command as given: silencing its stderr is each adapter's, where its shell can)
    assert marked["ebtest"] == "(envbuilder __complete envs)" and "bash" in marked


def test_a_registered_shell_activates_a_real_venv(ebtest, tmp_path):
    venv = tmp_path / "v env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    with pytest.raises(StateError, match=r"no activate\.ebt"):  # a venv tool wrote none for it: said
        activation.activate_line(str(venv), "ebtest")
    shutil.copy(venv / "bin" / "activate", venv / "bin" / "activate.ebt")
    activation.install(venv, Activation(env={"EBT": VALUE}, recipe="r"))
    assert activate_scripts.BEGIN in (venv / "bin" / "activate.ebt").read_text()
    line = activation.activate_line(str(venv), "ebtest")
    assert line == f". {shlex.quote(str(venv / 'bin' / 'activate.ebt'))}"
    script = f'{line}\nprintf "%s\\n" "$EBT" "$VIRTUAL_ENV"\ndeactivate\nprintf "%s\\n" "${{EBT-unset}}"\n'
    out = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", script], capture_output=True, text=True, check=True
    )
    assert out.stdout.splitlines() == [VALUE, str(venv), "unset"]
    assert activation.default_shell({"SHELL": "/usr/bin/ebtest-login"}) == "ebtest"


def test_a_registered_shell_gets_its_scripts_in_every_kind_of_env(ebtest, tmp_path):
    act = Activation(env={"EBT": VALUE}, recipe="r")
    user, conda = tmp_path / "user", tmp_path / "conda"
    activation.install_user_prefix(user, "/envs/u ser", act)
    activation.install_conda(conda, "/envs/conda", act)
    assert "PYTHONUSERBASE" in (user / "envbuilder" / "activate.ebt").read_text()
    assert ". '/envs/u ser/envbuilder/activate.ebt'" in (user / "bin" / "activate.ebt").read_text()
    for rel in (
        "etc/conda/activate.d/envbuilder.ebt",
        "etc/conda/deactivate.d/envbuilder.ebt",
        "bin/activate.ebt",
    ):
        assert (conda / rel).is_file(), rel
    used = image.InUse("e", user, "unpacked", False)
    line = image.activate_line(used, "ebtest")
    assert line == f". {shlex.quote(str(user) + '.activate.ebt')}"  # comments=False: no `# image ...`
    assert (tmp_path / "user.activate.ebt").is_file()
    assert ".activate.ebt" in activate_scripts.image_script_tails()


def test_a_name_is_registered_once():
    with pytest.raises(ValueError, match="zsh is registered already"):
        registry.register(Shell("zsh", EBT))
    with pytest.raises(ValueError, match="venv must be one of"):
        registry.register(Shell("ebbad", Syntax("posix.sh", str, str, "x", "activate.x", venv="sometimes")))


#: Modules that run bash themselves (not a user's shell): a child bash reads the module system's init for bash;
#: batch scripts are bash scripts. Each may name bash, and no other shell.
OWN_BASH = {"envbuilder/system/modules.py", "envbuilder/plan/batch.py"}


def _docstrings(tree: ast.AST) -> set[int]:
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, kinds) and node.body and isinstance(node.body[0], ast.Expr)
    }


def _words(node: ast.AST, docstrings: set[int]) -> list[str]:
    """The names and string values (docstrings and comments aside: they are prose) a node holds."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
        return [node.value]
    if isinstance(node, ast.alias):
        return [node.name, node.asname or ""]
    for field in ("id", "attr", "name", "arg"):  # Name, Attribute, def/class, argument and keyword names
        value = getattr(node, field, None)
        if isinstance(value, str):
            return [value]
    return []


def test_no_module_outside_the_registry_names_a_shell():
    names = sorted({n for shell in registry.SHELLS.values() for n in (shell.name, *shell.aliases)}, key=len)
    assert {"bash", "zsh", "fish", "tcsh", "csh"} <= set(names)
    # As a word of its own: `_fish_quote`, `activate.csh`, `"tcsh"`; `csh` inside `tcsh` is tcsh.
    named = re.compile(r"(?i)(?<![a-z])(" + "|".join(names[::-1]) + r")(?![a-z])")
    found = []
    for path in sorted((REPO / "envbuilder").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith("envbuilder/core/shells/"):
            continue
        tree = sourcetrees.parse_if(path, named)
        if tree is None:
            continue
        docstrings = _docstrings(tree)
        for node in ast.walk(tree):
            for word in _words(node, docstrings):
                for match in named.finditer(word):
                    if not (rel in OWN_BASH and match.group(1).lower() == "bash"):
                        found.append(f"{rel}:{getattr(node, 'lineno', '?')}: {word[:60]!r}")
    assert not found, "a shell named outside envbuilder/core/shells/ (ask the registry):\n" + "\n".join(found)
