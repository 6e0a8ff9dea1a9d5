"""Activate extensions sourced for real: bash and zsh, real Lmod, a venv at a hostile prefix. After deactivate the
environment must equal the one before activate, variable for variable."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import DATA
from wheelindex import build_wheel, serve

from envbuilder.backends import activation
from envbuilder.core.errors import RecipeError
from envbuilder.plan.activation import Activation
from envbuilder.plan.steps import CONSTRAINTS
from envbuilder.render import activate_scripts, modulefile

pytestmark = pytest.mark.integration

LMOD_INIT_DIR = Path("/usr/share/lmod/lmod/init")
SHELLS = [s for s in ("bash", "zsh") if shutil.which(s)]
HOSTILE = "env dir $(touch PWNED) `touch PWNED2` \"dq\" 'sq'"
# Shell bookkeeping, and PS1: non-interactive test shells have none, and every venv's own deactivate exports it
# (empty) then; interactive shells always have a PS1, which the venv restores.
NOISE = {"_", "PWD", "OLDPWD", "SHLVL", "ZSH_EXECUTION_STRING", "PS1"}

DRIVER = r"""
{init}
dump() {{ env -0 > "$1"; }}
dump "$2/before"
. "$1/bin/activate"
dump "$2/during"
command -v python > "$2/python"
{twice}
deactivate
dump "$2/after"
type deactivate >/dev/null 2>&1 && echo "deactivate still defined" > "$2/leak"
true
"""


def read_env(path: Path) -> dict[str, str]:
    data = path.read_bytes().decode()
    return {k: v for k, v in (kv.split("=", 1) for kv in data.split("\0") if "=" in kv) if k not in NOISE}


@pytest.fixture
def venv(tmp_path):
    if not shutil.which("uv"):
        pytest.skip("uv is not installed (it is a runtime dependency from the create issue on)")
    prefix = tmp_path / HOSTILE
    subprocess.run(["uv", "venv", "--quiet", str(prefix)], check=True, env={**os.environ, "UV_NO_CACHE": "1"})
    return prefix


def run(
    shell: str,
    prefix: Path,
    work: Path,
    *,
    user_has_module: bool = True,
    twice: bool = False,
    extra_env: dict[str, str] | None = None,
) -> tuple[dict, dict, dict]:
    init = f". {LMOD_INIT_DIR}/{shell}" if user_has_module else ""
    script = DRIVER.format(init=init, twice='. "$1/bin/activate"' if twice else "")
    env = {
        "HOME": str(work),
        "PATH": "/usr/bin:/bin",
        "MODULEPATH": str(DATA / "modules" / "site"),
        "LD_LIBRARY_PATH": "/opt/user/lib",
        "NCCL_DEBUG": "WARN",
        **(extra_env or {}),
    }
    argv = (
        [shell, "-c", script, "driver", str(prefix), str(work)]
        if shell == "bash"
        else [shell, "-f", "-c", script, "driver", str(prefix), str(work)]
    )
    res = subprocess.run(argv, env=env, cwd=work, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert not (work / "leak").exists()
    return read_env(work / "before"), read_env(work / "during"), read_env(work / "after")


ACT = Activation(
    module_use=(str(DATA / "modules" / "soft"),),
    modules=("gcc/15.1.0", "python3/3.11.8", "conda/2025-09-25"),
    env={"OMP_NUM_THREADS": "16", "NCCL_NET": "AWS Libfabric", "TRICKY": "$(touch PWNED3) `id` 'x' \"y\""},
    unset=("NCCL_DEBUG",),
    module_init=str(LMOD_INIT_DIR),
    recipe="demo",
)


needs_lmod = pytest.mark.skipif(
    not (LMOD_INIT_DIR / "bash").is_file(), reason="Lmod not installed (.ci/run installs it)"
)


@needs_lmod
@pytest.mark.parametrize("shell", SHELLS)
def test_round_trip_restores_the_environment_exactly(shell, venv, tmp_path):
    activation.install(venv, ACT)
    before, during, after = run(shell, venv, tmp_path)
    assert during["LOADEDMODULES"] == "gcc/15.1.0:python3/3.11.8:conda/2025-09-25"
    assert during["OMP_NUM_THREADS"] == "16"
    assert during["NCCL_NET"] == "AWS Libfabric"
    assert during["TRICKY"] == "$(touch PWNED3) `id` 'x' \"y\""
    assert "NCCL_DEBUG" not in during
    assert during["VIRTUAL_ENV"] == str(venv)
    # The env's python stays first although the modules prepended their own bin directories.
    assert (tmp_path / "python").read_text().strip() == str(venv / "bin" / "python")
    assert after == before
    for marker in ("PWNED", "PWNED2", "PWNED3"):
        assert not (tmp_path / marker).exists()


@needs_lmod
@pytest.mark.parametrize("shell", SHELLS)
def test_shell_without_module_function_gets_it_from_the_init(shell, venv, tmp_path):
    activation.install(venv, ACT)
    _, during, _ = run(shell, venv, tmp_path, user_has_module=False)
    assert during["LOADEDMODULES"] == "gcc/15.1.0:python3/3.11.8:conda/2025-09-25"


@needs_lmod
@pytest.mark.parametrize("shell", SHELLS)
def test_activating_twice_then_deactivating_once(shell, venv, tmp_path):
    activation.install(venv, ACT)
    before, _, after = run(shell, venv, tmp_path, twice=True)
    assert after == before


@needs_lmod
def test_modules_the_user_had_stay_loaded(venv, tmp_path):
    activation.install(venv, ACT)
    script = f"""
. {LMOD_INIT_DIR}/bash
module load gcc/15.1.0
. "$1/bin/activate"
deactivate
echo "$LOADEDMODULES"
"""
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "MODULEPATH": str(DATA / "modules" / "site")}
    out = subprocess.run(
        ["bash", "-c", script, "d", str(venv)], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "gcc/15.1.0"


@pytest.mark.parametrize("shell", SHELLS)
def test_no_module_system_still_sets_variables_and_says_so(shell, venv, tmp_path):
    activation.install(
        venv, Activation(modules=("gcc/15.1.0",), env={"OMP_PLACES": "cores"}, module_init=None)
    )
    script = '. "$1/bin/activate"; echo "OMP=$OMP_PLACES"; deactivate; echo "after=${OMP_PLACES-unset}"'
    argv = (
        [shell, "-c", script, "d", str(venv)]
        if shell == "bash"
        else [shell, "-f", "-c", script, "d", str(venv)]
    )
    res = subprocess.run(
        argv, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["OMP=cores", "after=unset"]
    assert "no module command here" in res.stderr


def test_pythonpath_unset_stays_unset_no_empty_entry(venv, tmp_path):
    activation.install(venv, Activation(env={"A": "1"}))
    script = '. "$1/bin/activate"; deactivate; echo "${PYTHONPATH-unset}"'
    res = subprocess.run(
        ["bash", "-c", script, "d", str(venv)],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert res.stdout.strip() == "unset"


def test_hook_is_idempotent_and_independent_of_template_wording():
    template = "# you cannot run it directly\nVIRTUAL_ENV='/x'\n"
    once = activate_scripts.with_hook(template)
    assert activate_scripts.with_hook(once) == once
    assert once.count(activate_scripts.BEGIN) == 1
    assert once.startswith(template)


def test_invalid_variable_names_are_refused():
    with pytest.raises(RecipeError, match="not a variable name"):
        Activation(env={"A; rm -rf /": "1"})


# --- conda envs: etc/conda/activate.d + deactivate.d, and envbuilder's bin/activate for shells without conda ---

CONDA_ACT = Activation(
    modules=("miniforge3/25.3.1-gcc-11.4.1",),
    env={"OMP_NUM_THREADS": "16", "TRICKY": "$(touch PWNED3) `id` 'x' \"y\""},
    unset=("NCCL_DEBUG",),
    module_init=str(LMOD_INIT_DIR),
    recipe="zurada-conda",
)

# What `conda activate PREFIX` does for one env, then `conda deactivate`: set CONDA_PREFIX and PATH and source the
# activate.d scripts; source the deactivate.d scripts and put CONDA_PREFIX and PATH back. (No conda binary can be
# installed here; these are the steps conda documents for env hooks.)
CONDA_DRIVER = r"""
{init}
dump() {{ env -0 > "$1"; }}
dump "$2/before"
_old_path="$PATH"
CONDA_PREFIX="$1"; export CONDA_PREFIX
PATH="$1/bin:$PATH"; export PATH
for f in "$1"/etc/conda/activate.d/*.sh; do . "$f"; done
dump "$2/during"
command -v python > "$2/python"
for f in "$1"/etc/conda/deactivate.d/*.sh; do . "$f"; done
unset CONDA_PREFIX f
PATH="$_old_path"; export PATH
unset _old_path
dump "$2/after"
type _envbuilder_undo >/dev/null 2>&1 && echo "undo still defined" > "$2/leak"
true
"""


@pytest.fixture
def conda_prefix(tmp_path):
    prefix = tmp_path / HOSTILE
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "python").symlink_to(os.path.realpath(shutil.which("python3") or "/usr/bin/python3"))
    (prefix / "conda-meta").mkdir()
    return prefix


@needs_lmod
@pytest.mark.parametrize("shell", SHELLS)
def test_conda_hooks_round_trip_the_way_conda_activate_runs_them(shell, conda_prefix, tmp_path):
    activation.install_conda(conda_prefix, str(conda_prefix), CONDA_ACT)
    work = tmp_path / "work"
    work.mkdir()
    script = CONDA_DRIVER.format(init=f". {LMOD_INIT_DIR}/{shell}")
    argv = [shell, "-c", script, "d", str(conda_prefix), str(work)]
    if shell == "zsh":
        argv.insert(1, "-f")
    env = {"HOME": str(work), "PATH": "/usr/bin:/bin", "MODULEPATH": str(DATA / "modules" / "site"),
           "NCCL_DEBUG": "WARN"}  # fmt: skip
    res = subprocess.run(argv, env=env, cwd=work, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert not (work / "leak").exists()
    before, during, after = (read_env(work / n) for n in ("before", "during", "after"))
    assert during["LOADEDMODULES"] == "miniforge3/25.3.1-gcc-11.4.1"
    assert during["CONDA_EXE"] == "/opt/fake/miniforge3-25.3.1/bin/conda"  # set by the fixture module
    assert during["TRICKY"] == "$(touch PWNED3) `id` 'x' \"y\""
    assert "NCCL_DEBUG" not in during
    # The module prepended its bin; the env's python stays first.
    assert (work / "python").read_text().strip() == str(conda_prefix / "bin" / "python")
    assert after == before
    assert not list(work.glob("PWNED*"))


@needs_lmod
@pytest.mark.parametrize("shell", SHELLS)
def test_conda_env_bin_activate_for_shells_without_conda(shell, conda_prefix, tmp_path):
    activation.install_conda(conda_prefix, str(conda_prefix), CONDA_ACT)
    before, during, after = run(shell, conda_prefix, tmp_path)
    assert during["CONDA_PREFIX"] == str(conda_prefix)
    assert during["LOADEDMODULES"] == "miniforge3/25.3.1-gcc-11.4.1"
    assert during["OMP_NUM_THREADS"] == "16"
    assert (tmp_path / "python").read_text().strip() == str(conda_prefix / "bin" / "python")
    assert after == before
    # A conda env that already has bin/activate (conda's base) keeps it.
    (conda_prefix / "bin" / "activate").write_text("# conda's own\n")
    activation.install_conda(conda_prefix, str(conda_prefix), CONDA_ACT)
    assert (conda_prefix / "bin" / "activate").read_text() == "# conda's own\n"


# --- torch pins for pip and uv: PIP_CONSTRAINT and UV_CONSTRAINT name the env's constraints file while active ---

#: Quotes, $, backquotes and a backslash, but no whitespace (${IFS} gives the commands theirs only if evaluated):
#: a prefix whose constraints file can be exported.
AWKWARD = "env$(touch${IFS}PWNED)`touch${IFS}PWNED2`\"dq\"'sq'\\bs"
SAYS_UNGUARDED = "not kept from replacing its torch"
#: What the user had before activating: nothing, an empty value, and a list of two files of their own.
BEFORE = [None, "", "/site/pins.txt /home/u/mine.txt"]


def shell_run(shell: str, script: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    argv = (
        [shell, "-c", script, "driver", *args]
        if shell == "bash"
        else [shell, "-f", "-c", script, "driver", *args]
    )
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


def pinned(prefix: Path) -> Path:
    """Give the env torch pins as create does (envbuilder/constraints.txt); returns the file."""
    path = prefix / CONSTRAINTS
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("torch==1.0\n")
    return path


def user_had(value: str | None) -> dict[str, str]:
    return {} if value is None else {"PIP_CONSTRAINT": value, "UV_CONSTRAINT": value}


def expected_during(value: str | None, pins: Path) -> str:
    return f"{value} {pins}" if value else str(pins)


@pytest.fixture
def awkward_venv(tmp_path):
    if not shutil.which("uv"):
        pytest.skip("uv is not installed (it is a runtime dependency from the create issue on)")
    prefix = tmp_path / AWKWARD
    subprocess.run(["uv", "venv", "--quiet", str(prefix)], check=True, env={**os.environ, "UV_NO_CACHE": "1"})
    return prefix


@pytest.mark.parametrize("before", BEFORE)
@pytest.mark.parametrize("shell", SHELLS)
def test_venv_activation_adds_the_env_pins_and_deactivate_gives_the_lists_back(
    shell, before, awkward_venv, tmp_path
):
    pins = pinned(awkward_venv)
    activation.install(awkward_venv, Activation(env={"OMP_NUM_THREADS": "4"}))
    old, during, after = run(shell, awkward_venv, tmp_path, user_has_module=False, extra_env=user_had(before))
    assert during["PIP_CONSTRAINT"] == expected_during(before, pins)
    assert during["UV_CONSTRAINT"] == expected_during(before, pins)
    assert after == old
    assert ("PIP_CONSTRAINT" in after, "UV_CONSTRAINT" in after) == (before is not None,) * 2
    assert not list(tmp_path.glob("PWNED*"))


@needs_lmod
@pytest.mark.parametrize("shell", SHELLS)
def test_pins_survive_modules_and_a_second_activate(shell, awkward_venv, tmp_path):
    pins = pinned(awkward_venv)
    activation.install(awkward_venv, ACT)
    script = '. "$1/bin/activate"; . "$1/bin/activate"; printf "%s\\n" "$PIP_CONSTRAINT" "$UV_CONSTRAINT"; deactivate'
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "MODULEPATH": str(DATA / "modules" / "site"),
           "PIP_CONSTRAINT": "/site/pins.txt", "UV_CONSTRAINT": "/site/uv.txt"}  # fmt: skip
    res = shell_run(shell, f". {LMOD_INIT_DIR}/{shell}\n{script}", str(awkward_venv), env=env)
    assert res.returncode == 0, res.stderr
    # Sourced twice, the file is in each list once.
    assert res.stdout.splitlines() == [f"/site/pins.txt {pins}", f"/site/uv.txt {pins}"]
    _, _, after = run(shell, awkward_venv, tmp_path, twice=True, extra_env=user_had("/site/pins.txt"))
    assert after["PIP_CONSTRAINT"] == after["UV_CONSTRAINT"] == "/site/pins.txt"


@pytest.mark.parametrize("shell", SHELLS)
def test_an_env_without_pins_exports_none(shell, awkward_venv, tmp_path):
    activation.install(awkward_venv, Activation(env={"A": "1"}))
    assert "CONSTRAINT" not in (awkward_venv / activate_scripts.SCRIPT_REL).read_text()
    _, during, _ = run(shell, awkward_venv, tmp_path, user_has_module=False)
    assert "PIP_CONSTRAINT" not in during and "UV_CONSTRAINT" not in during


@pytest.mark.parametrize("before", [None, "/site/pins.txt"])
@pytest.mark.parametrize("shell", SHELLS)
def test_a_prefix_with_whitespace_exports_nothing_and_says_why(shell, before, venv, tmp_path):
    # pip and uv split these lists on whitespace: "/x/env dir/..." would be two files, and every install would fail.
    pinned(venv)
    activation.install(venv, Activation(env={"A": "1"}))
    script = '. "$1/bin/activate"; echo "pip=${PIP_CONSTRAINT-unset} uv=${UV_CONSTRAINT-unset}"; deactivate'
    res = shell_run(shell, script, str(venv), env={"PATH": "/usr/bin:/bin", **user_had(before)})
    assert res.returncode == 0, res.stderr
    value = before or "unset"
    assert res.stdout.strip() == f"pip={value} uv={value}"
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and SAYS_UNGUARDED in lines[0], res.stderr
    assert not list(tmp_path.glob("PWNED*"))


@pytest.mark.parametrize("shell", SHELLS)
def test_conda_env_pins_through_its_hooks_and_its_bin_activate(shell, tmp_path):
    prefix = tmp_path / AWKWARD
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "python").symlink_to(os.path.realpath(shutil.which("python3") or "/usr/bin/python3"))
    (prefix / "conda-meta").mkdir()
    pins = pinned(prefix)
    activation.install_conda(prefix, str(prefix), Activation(env={"A": "1"}))
    work = tmp_path / "work"
    work.mkdir()
    # As `conda activate` / `conda deactivate` run the env's hooks.
    env = {"HOME": str(work), "PATH": "/usr/bin:/bin", **user_had("/site/pins.txt")}
    res = shell_run(shell, CONDA_DRIVER.format(init=""), str(prefix), str(work), env=env)
    assert res.returncode == 0, res.stderr
    old, during, after = (read_env(work / n) for n in ("before", "during", "after"))
    assert during["PIP_CONSTRAINT"] == during["UV_CONSTRAINT"] == f"/site/pins.txt {pins}"
    assert after == old
    # Envbuilder's bin/activate, for shells without conda.
    old, during, after = run(shell, prefix, work, user_has_module=False)
    assert during["PIP_CONSTRAINT"] == during["UV_CONSTRAINT"] == str(pins)
    assert after == old and "PIP_CONSTRAINT" not in after
    assert not list(tmp_path.glob("PWNED*")) and not list(work.glob("PWNED*"))


@pytest.mark.parametrize("shell", SHELLS)
def test_user_prefix_env_pins_follow_pythonuserbase(shell, tmp_path):
    prefix = tmp_path / AWKWARD
    pins = pinned(prefix)
    activation.install_user_prefix(prefix, str(prefix), Activation(env={"A": "1"}))
    extra = {"PYTHONUSERBASE": "/before", **user_had("/site/pins.txt")}
    old, during, after = run(shell, prefix, tmp_path, user_has_module=False, extra_env=extra)
    assert during["PYTHONUSERBASE"] == str(prefix)
    assert during["PIP_CONSTRAINT"] == during["UV_CONSTRAINT"] == f"/site/pins.txt {pins}"
    assert after == old
    assert not list(tmp_path.glob("PWNED*"))


#: Lmod's own bookkeeping, which module unload rewrites rather than removes (a module system's business).
def user_vars(env: dict[str, str]) -> dict[str, str]:
    lmod = ("__LMOD_", "_ModuleTable", "LMOD_", "_LMFILES_", "LOADEDMODULES", "MODULE", "BASH_FUNC_")
    return {k: v for k, v in env.items() if not k.startswith(lmod)}


MODULE_DRIVER = r"""
. {init}
dump() {{ env -0 > "$1"; }}
dump "$2/before"
module load myenv/1.0
dump "$2/during"
module unload myenv/1.0
dump "$2/after"
"""


def module_round_trip(
    shell: str, prefix: Path, work: Path, before: str | None
) -> tuple[dict, dict, dict, str]:
    mods = work / "mods"
    (mods / "myenv").mkdir(parents=True)
    (mods / "myenv" / "1.0.lua").write_text(
        modulefile.render(
            name="myenv/1.0",
            prefix=str(prefix),
            recipe="demo",
            activate=Activation(env={"A": "1"}),
            constraints=True,
        )
    )
    env = {"HOME": str(work), "PATH": "/usr/bin:/bin", "MODULEPATH": str(mods), **user_had(before)}
    res = shell_run(shell, MODULE_DRIVER.format(init=LMOD_INIT_DIR / shell), str(work), str(work), env=env)
    assert res.returncode == 0, res.stderr
    old, during, after = (user_vars(read_env(work / n)) for n in ("before", "during", "after"))
    return old, during, after, res.stderr


@needs_lmod
@pytest.mark.parametrize("before", [None, "/site/pins.txt /home/u/mine.txt"])
@pytest.mark.parametrize("shell", SHELLS)
def test_modulefile_adds_the_pins_and_unload_gives_the_lists_back(shell, before, tmp_path):
    prefix = tmp_path / AWKWARD
    pins = pinned(prefix)
    work = tmp_path / "work"
    old, during, after, stderr = module_round_trip(shell, prefix, work, before)
    assert during["VIRTUAL_ENV"] == str(prefix)
    assert during["PIP_CONSTRAINT"] == during["UV_CONSTRAINT"] == expected_during(before, pins)
    assert after == old
    assert SAYS_UNGUARDED not in stderr
    assert not list(tmp_path.glob("PWNED*")) and not list(work.glob("PWNED*"))


@needs_lmod
def test_modulefile_for_a_prefix_with_whitespace_exports_nothing_and_says_why(tmp_path):
    prefix = tmp_path / "env dir"
    pinned(prefix)
    old, during, after, stderr = module_round_trip("bash", prefix, tmp_path / "work", "/site/pins.txt")
    assert during["PIP_CONSTRAINT"] == during["UV_CONSTRAINT"] == "/site/pins.txt"
    assert after == old
    assert SAYS_UNGUARDED in " ".join(stderr.split())  # Lmod wraps its messages to the terminal width


def test_modulefile_without_pins_names_no_constraints():
    assert "CONSTRAINT" not in modulefile.render(name="e", prefix="/x", recipe="r")


# --- for real: once activated, pip and uv refuse an install that would replace the env's torch ---


@pytest.fixture
def pip_wheel() -> Path:
    """The pip wheel CPython bundles for ensurepip: a real pip, installable with no network."""
    import ensurepip

    found = sorted(Path(ensurepip.__file__).parent.glob("_bundled/pip-*.whl"))
    if not found:
        pytest.skip("this python bundles no pip wheel (ensurepip/_bundled)")
    return found[-1]


INSTALLS = r"""
. "$1/bin/activate"
uv pip install --index-url "$2" needs-torch2 && echo "uv installed"
pip install --disable-pip-version-check --no-cache-dir --index-url "$2" needs-torch2 && echo "pip installed"
python -c 'import torch; print("torch", torch.__version__)'
deactivate
# Deactivated, the same installs would go through (and bring torch 2.0): the pins alone stopped them.
uv pip install --dry-run --python "$1/bin/python" --index-url "$2" needs-torch2 && echo "uv would install"
"$1/bin/python" -m pip install --dry-run --disable-pip-version-check --no-cache-dir --index-url "$2" needs-torch2 && echo "pip would install"
"""


def test_pip_and_uv_in_the_activated_env_cannot_replace_torch(awkward_venv, pip_wheel, tmp_path):
    wheels = tmp_path / "wheels"
    # Stand-ins for torch (no real torch wheel on a test machine): 1.0 installed and pinned, 2.0 on the index.
    for version in ("1.0", "2.0"):
        build_wheel(wheels, "torch", version, {"torch/__init__.py": f"__version__ = {version!r}\n"})
    build_wheel(wheels, "needs-torch2", "1.0", {"needs_torch2/__init__.py": ""}, requires=["torch>=2"])
    shutil.copy(pip_wheel, wheels)
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "uv").symlink_to(shutil.which("uv") or "uv")
    env = {
        "HOME": str(tmp_path),
        "PATH": f"{tools}:/usr/bin:/bin",
        "UV_CACHE_DIR": str(tmp_path / "uv-cache"),
    }
    pinned(awkward_venv)
    activation.install(awkward_venv, Activation())
    with serve(wheels) as index:
        url = f"{index.url}/simple/"
        python = str(awkward_venv / "bin" / "python")
        subprocess.run(
            ["uv", "pip", "install", "--quiet", "--python", python, "--index-url", url, "torch==1.0", "pip"],
            env=env, check=True, capture_output=True,
        )  # fmt: skip
        res = shell_run("bash", INSTALLS, str(awkward_venv), url, env=env)
    out = res.stdout.splitlines()
    assert "uv installed" not in out and "pip installed" not in out, res.stdout + res.stderr
    assert "torch 1.0" in out
    assert "uv would install" in out and "pip would install" in out, res.stderr
    # Both name the pin as what stopped them.
    assert "depend on torch>=2 and torch==1.0" in res.stderr  # uv
    assert "The user requested (constraint) torch==1.0" in res.stdout  # pip
    assert not list(awkward_venv.glob("lib/python*/site-packages/needs_torch2"))
    assert not list(tmp_path.glob("PWNED*"))


# --- list variables: activate puts directories first or last, deactivate takes out exactly those entries ---

#: sh as well: a conda env's hooks are sourced by conda's POSIX activator, whatever the shell.
HOOK_SHELLS = [s for s in ("bash", "zsh", "sh") if shutil.which(s)]
ODD_DIR = "/soft/odd dir $(touch PWNED) `touch PWNED2` 'sq' \"dq\" * \\bs"
PATHS_ACT = Activation(
    modules=("gcc/15.1.0",),  # prepends its own lib64 to LD_LIBRARY_PATH
    env={"A": "1"},
    prepend={"LD_LIBRARY_PATH": (ODD_DIR, "/soft/aws-ofi/lib"), "LIBRARY_PATH": ("/stubs",)},
    append={"LD_LIBRARY_PATH": ("/soft/last",), "CMAKE_PREFIX_PATH": ("/soft/cmake",)},
    module_init=str(LMOD_INIT_DIR),
    recipe="paths",
)
#: Before activate: a value, an empty value, and no value at all (LIBRARY_PATH).
PATHS_BEFORE = {"LD_LIBRARY_PATH": "/opt/user/lib", "CMAKE_PREFIX_PATH": ""}
PATHS_DRIVER = r"""
. {init}
dump() {{ env -0 > "$1"; }}
dump "$2/before"
. "$1/etc/conda/activate.d/envbuilder.sh"
dump "$2/during"
{meanwhile}
. "$1/etc/conda/deactivate.d/envbuilder.sh"
dump "$2/after"
type _envbuilder_path_drop >/dev/null 2>&1 && echo "path_drop still defined" > "$2/leak"
true
"""


def paths_round_trip(shell: str, prefix: Path, work: Path, meanwhile: str = "") -> tuple[dict, dict, dict]:
    activation.install_conda(prefix, str(prefix), PATHS_ACT)
    work.mkdir()
    script = PATHS_DRIVER.format(init=LMOD_INIT_DIR / shell, meanwhile=meanwhile)
    env = {
        "HOME": str(work),
        "PATH": "/usr/bin:/bin",
        "MODULEPATH": str(DATA / "modules" / "site"),
        **PATHS_BEFORE,
    }
    res = subprocess.run(
        [shell, *(["-f"] if shell == "zsh" else []), "-c", script, "d", str(prefix), str(work)],
        env=env, cwd=work, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert not (work / "leak").exists()
    assert not list(work.glob("PWNED*"))
    return tuple(read_env(work / n) for n in ("before", "during", "after"))  # type: ignore[return-value]


@needs_lmod
@pytest.mark.parametrize("shell", HOOK_SHELLS)
def test_list_entries_are_added_and_deactivate_takes_exactly_them_out(shell, conda_prefix, tmp_path):
    before, during, after = paths_round_trip(shell, conda_prefix, tmp_path / "work")
    assert during["LD_LIBRARY_PATH"].split(":") == [
        ODD_DIR, "/soft/aws-ofi/lib", "/opt/fake/gcc-15.1.0/lib64", "/opt/user/lib", "/soft/last"
    ]  # fmt: skip
    assert during["LIBRARY_PATH"] == "/stubs"  # unset before: no empty entry (the current directory)
    assert during["CMAKE_PREFIX_PATH"] == "/soft/cmake"  # empty before: likewise
    assert "LIBRARY_PATH" not in before
    assert after == before


@needs_lmod
@pytest.mark.parametrize("shell", HOOK_SHELLS)
def test_what_the_user_added_meanwhile_stays_after_deactivate(shell, conda_prefix, tmp_path):
    meanwhile = (
        'LD_LIBRARY_PATH="/mine:$LD_LIBRARY_PATH:/soft/aws-ofi/lib"; export LD_LIBRARY_PATH\n'
        'LIBRARY_PATH="$LIBRARY_PATH:/mine"; export LIBRARY_PATH\n'
        "CMAKE_PREFIX_PATH=/soft/cmake:/soft/cmake; export CMAKE_PREFIX_PATH"
    )
    before, _, after = paths_round_trip(shell, conda_prefix, tmp_path / "work", meanwhile)
    # One entry out per entry activate added (its own, first for prepends, last for appends); the rest in order.
    assert after["LD_LIBRARY_PATH"] == "/mine:/opt/user/lib:/soft/aws-ofi/lib"
    assert after["LIBRARY_PATH"] == "/mine"
    assert after["CMAKE_PREFIX_PATH"] == "/soft/cmake"
    assert {k: v for k, v in after.items() if k not in PATHS_ACT.prepend and k not in PATHS_ACT.append} == {
        k: v for k, v in before.items() if k not in PATHS_ACT.prepend and k not in PATHS_ACT.append
    }


@needs_lmod
@pytest.mark.parametrize("shell", SHELLS)
def test_venv_activate_adds_list_entries_and_deactivate_gives_the_values_back(shell, venv, tmp_path):
    activation.install(venv, PATHS_ACT)
    before, during, after = run(shell, venv, tmp_path, twice=True)
    assert during["LD_LIBRARY_PATH"].split(":")[:2] == [ODD_DIR, "/soft/aws-ofi/lib"]
    assert during["LIBRARY_PATH"] == "/stubs"
    assert after == before
    assert not list(tmp_path.glob("PWNED*"))


def test_a_list_variable_is_added_to_or_set_never_both():
    with pytest.raises(RecipeError, match="both set"):
        Activation(env={"LD_LIBRARY_PATH": "/x"}, prepend={"LD_LIBRARY_PATH": ("/y",)})
    with pytest.raises(RecipeError, match="one directory"):
        Activation(append={"PATH": ("/a:/b",)})
    with pytest.raises(RecipeError, match="not a variable name"):
        Activation(prepend={"PATH; id": ("/a",)})
