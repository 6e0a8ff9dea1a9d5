"""Activate extensions sourced for real: bash and zsh, real Lmod, a venv at a hostile prefix. After deactivate the
environment must equal the one before activate, variable for variable."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import DATA

from envbuilder import activation
from envbuilder.activation import Activation

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
    once = activation.with_hook(template)
    assert activation.with_hook(once) == once
    assert once.count(activation.BEGIN) == 1
    assert once.startswith(template)


def test_invalid_variable_names_are_refused():
    with pytest.raises(ValueError):
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
