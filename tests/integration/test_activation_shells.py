"""fish and tcsh activation sourced for real, as tests/integration/test_activation.py does for bash and zsh: real
Lmod, the fixture module tree, a venv at a hostile prefix, hostile values. After deactivate the environment must
equal the one before activate, variable for variable."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import DATA
from test_activation import (
    ACT,
    AWKWARD,
    HOSTILE,
    LMOD_INIT_DIR,
    ODD_DIR,
    PATHS_ACT,
    PATHS_BEFORE,
    SAYS_UNGUARDED,
    needs_lmod,
    pinned,
    read_env,
)

from envbuilder.backends import activation
from envbuilder.core.errors import RecipeError
from envbuilder.core.shells.csh import CSH
from envbuilder.core.shells.fish import FISH
from envbuilder.plan.activation import Activation
from envbuilder.render import activate_scripts

pytestmark = pytest.mark.integration

SHELLS = [s for s in ("fish", "tcsh") if shutil.which(s)]
if not SHELLS:
    pytestmark = [
        pytestmark,
        pytest.mark.skip(reason="neither fish nor tcsh is installed (.ci/run installs both)"),
    ]

#: Each shell's driver: $1 the env, $2 where the dumps go; {init} loads the module system first, {meanwhile} runs
#: between activate and deactivate.
DRIVERS = {
    "fish": """{init}
env -0 > $argv[2]/before
source $argv[1]/bin/activate.fish
{twice}
env -0 > $argv[2]/during
command -v python > $argv[2]/python
{meanwhile}
deactivate
env -0 > $argv[2]/after
functions -q deactivate _envbuilder_undo _envbuilder_path_drop; and echo leak > $argv[2]/leak
true
""",
    "tcsh": """{init}
env -0 > "$argv[2]/before"
source "$argv[1]/bin/activate.csh"
{twice}
env -0 > "$argv[2]/during"
which python > "$argv[2]/python"
{meanwhile}
deactivate
env -0 > "$argv[2]/after"
if ( `alias deactivate | wc -c` > 0 ) then
    echo leak > "$argv[2]/leak"
endif
""",
}
INITS = {"fish": f"source {LMOD_INIT_DIR}/fish", "tcsh": f"source {LMOD_INIT_DIR}/tcsh"}
SOURCE_AGAIN = {"fish": "source $argv[1]/bin/activate.fish", "tcsh": 'source "$argv[1]/bin/activate.csh"'}
#: What the user does while the env is active: add to the list variables activate added to.
MEANWHILE = {
    "fish": "set -gx LD_LIBRARY_PATH /mine:(string join : $LD_LIBRARY_PATH):/soft/aws-ofi/lib\n"
    "set -gx LIBRARY_PATH (string join : $LIBRARY_PATH):/mine",
    "tcsh": 'setenv LD_LIBRARY_PATH "/mine:${LD_LIBRARY_PATH}:/soft/aws-ofi/lib"\n'
    'setenv LIBRARY_PATH "${LIBRARY_PATH}:/mine"',
}


def shell_argv(shell: str, script: Path, *args: str) -> list[str]:
    """The shell reading no rc file, running ``script`` with ``args``."""
    return [shell, "--no-config" if shell == "fish" else "-f", str(script), *args]


def run(
    shell: str,
    prefix: Path,
    work: Path,
    *,
    user_has_module: bool = True,
    twice: bool = False,
    meanwhile: bool = False,
    extra_env: dict[str, str] | None = None,
) -> tuple[dict, dict, dict, str]:
    """Activate and deactivate the env in ``shell``: the environments before, during and after, and stderr."""
    script = work / f"driver.{shell}"
    script.write_text(
        DRIVERS[shell].format(
            init=INITS[shell] if user_has_module else "",
            twice=SOURCE_AGAIN[shell] if twice else "",
            meanwhile=MEANWHILE[shell] if meanwhile else "",
        )
    )
    env = {
        "HOME": str(work),
        "PATH": "/usr/bin:/bin",
        "MODULEPATH": str(DATA / "modules" / "site"),
        "LD_LIBRARY_PATH": "/opt/user/lib",
        "NCCL_DEBUG": "WARN",
        **(extra_env or {}),
    }
    res = subprocess.run(
        shell_argv(shell, script, str(prefix), str(work)),
        env=env, cwd=work, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert not (work / "leak").exists()
    assert not list(work.glob("PWNED*"))
    return read_env(work / "before"), read_env(work / "during"), read_env(work / "after"), res.stderr


@pytest.fixture(params=[True, False], ids=["relocatable", "plain"])
def venv(request, tmp_path):
    """A uv venv at the hostile prefix: relocatable (as create makes it: no activate.csh of its own) and plain
    (with uv's activate.csh, which envbuilder's replaces)."""
    if not shutil.which("uv"):
        pytest.skip("uv is not installed (it is a runtime dependency from the create issue on)")
    prefix = tmp_path / HOSTILE
    argv = ["uv", "venv", "--quiet", *(["--relocatable"] if request.param else []), str(prefix)]
    subprocess.run(argv, check=True, env={**os.environ, "UV_NO_CACHE": "1"})
    return prefix


@needs_lmod
@pytest.mark.parametrize("shell", SHELLS)
def test_round_trip_restores_the_environment_exactly(shell, venv, tmp_path):
    activation.install(venv, ACT)
    before, during, after, stderr = run(shell, venv, tmp_path)
    assert during["LOADEDMODULES"] == "gcc/15.1.0:python3/3.11.8:conda/2025-09-25"
    assert during["OMP_NUM_THREADS"] == "16"
    assert during["NCCL_NET"] == "AWS Libfabric"
    assert during["TRICKY"] == ACT.env["TRICKY"]
    assert "NCCL_DEBUG" not in during
    assert during["VIRTUAL_ENV"] == str(venv)
    assert during["MODULEPATH"].split(":")[0] == str(DATA / "modules" / "soft")
    # The env's python stays first although the modules prepended their own bin directories.
    assert (tmp_path / "python").read_text().strip() == str(venv / "bin" / "python")
    assert after == before
    assert stderr == ""


@needs_lmod
@pytest.mark.parametrize("shell", SHELLS)
def test_shell_without_module_command_gets_it_from_the_init(shell, venv, tmp_path):
    activation.install(venv, ACT)
    _, during, _, _ = run(shell, venv, tmp_path, user_has_module=False)
    assert during["LOADEDMODULES"] == "gcc/15.1.0:python3/3.11.8:conda/2025-09-25"


@needs_lmod
@pytest.mark.parametrize("shell", SHELLS)
def test_activating_twice_then_deactivating_once(shell, venv, tmp_path):
    activation.install(venv, ACT)
    before, during, after, _ = run(shell, venv, tmp_path, twice=True)
    assert during["LOADEDMODULES"] == "gcc/15.1.0:python3/3.11.8:conda/2025-09-25"
    assert after == before


@pytest.mark.parametrize("shell", SHELLS)
def test_no_module_system_still_sets_variables_and_says_so(shell, venv, tmp_path):
    activation.install(venv, Activation(modules=("gcc/15.1.0",), env={"OMP_PLACES": "cores"}))
    before, during, after, stderr = run(shell, venv, tmp_path, user_has_module=False)
    assert during["OMP_PLACES"] == "cores"
    assert after == before
    assert "no module command here" in stderr


@needs_lmod
@pytest.mark.parametrize("shell", SHELLS)
def test_list_entries_are_added_and_deactivate_takes_exactly_them_out(shell, venv, tmp_path):
    activation.install(venv, PATHS_ACT)
    before, during, after, _ = run(shell, venv, tmp_path, extra_env=PATHS_BEFORE)
    assert during["LD_LIBRARY_PATH"].split(":") == [
        ODD_DIR, "/soft/aws-ofi/lib", "/opt/fake/gcc-15.1.0/lib64", "/opt/user/lib", "/soft/last"
    ]  # fmt: skip
    assert during["LIBRARY_PATH"] == "/stubs"  # unset before: no empty entry (the current directory)
    assert during["CMAKE_PREFIX_PATH"] == "/soft/cmake"  # empty before: likewise
    assert after == before


@needs_lmod
@pytest.mark.parametrize("shell", SHELLS)
def test_what_the_user_added_meanwhile_stays_after_deactivate(shell, venv, tmp_path):
    activation.install(venv, PATHS_ACT)
    before, _, after, _ = run(shell, venv, tmp_path, meanwhile=True, extra_env=PATHS_BEFORE)
    # One entry out per entry activate added (first for prepends, last for appends); the rest in order.
    assert after["LD_LIBRARY_PATH"] == "/mine:/opt/user/lib:/soft/aws-ofi/lib"
    assert after["LIBRARY_PATH"] == "/mine"
    lists = {*PATHS_ACT.prepend, *PATHS_ACT.append}
    assert {k: v for k, v in after.items() if k not in lists} == {
        k: v for k, v in before.items() if k not in lists
    }


@pytest.mark.parametrize("before", [None, "/site/pins.txt /home/u/mine.txt"])
@pytest.mark.parametrize("shell", SHELLS)
def test_pins_are_added_and_deactivate_gives_the_lists_back(shell, before, tmp_path):
    if not shutil.which("uv"):
        pytest.skip("uv is not installed")
    prefix = tmp_path / AWKWARD
    subprocess.run(["uv", "venv", "--quiet", "--relocatable", str(prefix)], check=True)
    pins = pinned(prefix)
    activation.install(prefix, Activation(env={"A": "1"}))
    extra = {} if before is None else {"PIP_CONSTRAINT": before, "UV_CONSTRAINT": before}
    old, during, after, stderr = run(shell, prefix, tmp_path, user_has_module=False, extra_env=extra)
    expected = f"{before} {pins}" if before else str(pins)
    assert during["PIP_CONSTRAINT"] == during["UV_CONSTRAINT"] == expected
    assert after == old
    assert SAYS_UNGUARDED not in stderr


@pytest.mark.parametrize("shell", SHELLS)
def test_a_prefix_with_whitespace_exports_no_pins_and_says_why(shell, venv, tmp_path):
    pinned(venv)
    activation.install(venv, Activation(env={"A": "1"}))
    old, during, after, stderr = run(shell, venv, tmp_path, user_has_module=False)
    assert "PIP_CONSTRAINT" not in during and "UV_CONSTRAINT" not in during
    assert after == old
    assert stderr.count(SAYS_UNGUARDED) == 1


@pytest.mark.parametrize("shell", SHELLS)
def test_the_line_envbuilder_activate_prints_works_in_that_shell(shell, venv, tmp_path):
    activation.install(venv, Activation(env={"TRICKY": ACT.env["TRICKY"]}))
    line = activation.activate_line(str(venv), shell)
    script = tmp_path / "line"
    script.write_text(f"{line}\nprintenv TRICKY\ndeactivate\n")
    res = subprocess.run(
        shell_argv(shell, script), env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 0 and res.stdout.strip() == ACT.env["TRICKY"], res.stderr
    assert not list(tmp_path.glob("PWNED*"))


#: How create writes each kind's activation into an env (``build``, for ``prefix``), and the variable naming it.
KINDS = {
    "user-prefix": (activation.install_user_prefix, "PYTHONUSERBASE"),
    "conda": (activation.install_conda, "CONDA_PREFIX"),
}
#: Another conda package's hooks (conda runs every activate.d script of the shell's suffix), for each shell.
OTHER_HOOKS = {
    "fish": ("set -gx OTHER_HOOK 'on'\n", "set -e OTHER_HOOK\n"),
    "tcsh": ("setenv OTHER_HOOK 'on'\n", "unsetenv OTHER_HOOK\n"),
}


@needs_lmod
@pytest.mark.parametrize("twice", [False, True], ids=["once", "twice"])
@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("shell", SHELLS)
def test_user_prefix_and_conda_envs_round_trip(shell, kind, twice, tmp_path):
    """bin/activate.fish and bin/activate.csh of a user-prefix env and of a conda env (for shells without conda
    activate; they run the activate.d scripts as conda's fish and csh activators do) at the hostile prefix: the
    recipe's modules and values on, then exactly the environment from before."""
    prefix = tmp_path / HOSTILE
    (prefix / "bin").mkdir(parents=True)
    install, var = KINDS[kind]
    install(prefix, str(prefix), ACT)
    suffix = "fish" if shell == "fish" else "csh"
    if kind == "conda":
        for when, text in zip(("activate", "deactivate"), OTHER_HOOKS[shell]):
            (prefix / "etc" / "conda" / f"{when}.d" / f"zz-other.{suffix}").write_text(text)
    before, during, after, stderr = run(shell, prefix, tmp_path, twice=twice)
    assert during[var] == str(prefix)
    assert during["PATH"].split(":")[0] == str(prefix / "bin")
    assert during["LOADEDMODULES"] == "gcc/15.1.0:python3/3.11.8:conda/2025-09-25"
    assert during["TRICKY"] == ACT.env["TRICKY"] and "NCCL_DEBUG" not in during
    assert during.get("OTHER_HOOK") == ("on" if kind == "conda" else None)
    assert after == before
    assert stderr == ""


@pytest.mark.parametrize("shell", SHELLS)
def test_a_user_prefix_env_imports_from_its_prefix_in_that_shell(shell, tmp_path):
    """The line `envbuilder activate` prints for a user-prefix env: the site python finds the env's packages
    through PYTHONUSERBASE, and deactivate gives the user's own PYTHONUSERBASE back."""
    python = Path(sys.base_prefix) / "bin" / "python3"
    prefix = tmp_path / HOSTILE
    site = prefix / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    site.mkdir(parents=True)
    (site / "ebuserdemo.py").write_text("")
    (prefix / "bin").mkdir()
    activation.install_user_prefix(prefix, str(prefix), Activation(env={"TRICKY": ACT.env["TRICKY"]}))
    line = activation.activate_line(str(prefix), shell)
    script = tmp_path / "line"
    script.write_text(
        f"{line}\n{python} -c 'import ebuserdemo; print(ebuserdemo.__file__)'\nprintenv TRICKY\ndeactivate\n"
        "printenv PYTHONUSERBASE\n"
    )
    res = subprocess.run(
        shell_argv(shell, script), env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "PYTHONUSERBASE": "/mine"},
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [str(site / "ebuserdemo.py"), ACT.env["TRICKY"], "/mine"]
    assert not list(tmp_path.glob("PWNED*"))


def test_an_env_without_the_shells_script_says_so(tmp_path):
    (tmp_path / "bin").mkdir()
    with pytest.raises(activation.StateError, match=r"no activate\.fish"):
        activation.activate_line(str(tmp_path), "fish")
    assert activation.activate_line(str(tmp_path), "zsh").endswith("/bin/activate")


def test_the_hook_in_activate_fish_is_idempotent():
    once = activate_scripts.with_hook("function deactivate\nend\n", FISH)
    assert activate_scripts.with_hook(once, FISH) == once
    assert once.count(activate_scripts.BEGIN) == 1 and "envbuilder/activate.fish" in once


@pytest.mark.parametrize("bad", ["1\n/tmp/evil.sh", "a\x00b"], ids=["LF", "NUL"])
def test_the_fish_and_csh_renderers_refuse_what_they_cannot_carry(bad):
    for shell in (FISH, CSH):
        with pytest.raises(RecipeError):
            activate_scripts.render_user_prefix(Activation(), "/p" + bad, shell)
        with pytest.raises(RecipeError):
            activate_scripts.render_conda(Activation(), "/p" + bad, shell)
        with pytest.raises(RecipeError):
            activate_scripts.render_image_activate("/node" + bad, "/usr/bin/fusermount3", shell)
