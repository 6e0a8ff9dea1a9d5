"""A recipe's `conda activate` step (``activate.conda_env``) for real: the activate script sourced in bash and zsh
under real Lmod, with a stand-in site conda module whose load defines a `conda` shell function (no real conda can
be installed here; tests/condachannel.py: conda_function_module); the module adapter's child shell that gives a
validation run the same environment; and the modulefiles, which cannot run conda and say so when loaded."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from condachannel import conda_function_module
from helpers import run_cli

from envbuilder.backends import activation
from envbuilder.core import formats
from envbuilder.core.errors import ModuleSystemError
from envbuilder.plan.activation import Activation
from envbuilder.render import modulefile
from envbuilder.system import modules, state

pytestmark = pytest.mark.integration

LMOD_INIT_DIR = Path("/usr/share/lmod/lmod/init")
SHELLS = [s for s in ("bash", "zsh") if shutil.which(s)]
# Shell bookkeeping, and PS1 (every venv's deactivate exports it, empty, in a shell that had none).
NOISE = {"_", "PWD", "OLDPWD", "SHLVL", "ZSH_EXECUTION_STRING", "PS1"}
needs_lmod = pytest.mark.skipif(
    not (LMOD_INIT_DIR / "bash").is_file(), reason="Lmod not installed (.ci/run installs it)"
)

DRIVER = r"""
. {init}/$3
dump() {{ env -0 > "$1"; }}
dump "$2/before"
. "$1/bin/activate"
echo "activate status $?"
dump "$2/during"
command -v python > "$2/python"
if type deactivate >/dev/null 2>&1; then deactivate; fi
dump "$2/after"
type deactivate >/dev/null 2>&1 && echo "deactivate still defined"
type _envbuilder_undo >/dev/null 2>&1 && echo "undo still defined"
true
"""


def read_env(path: Path) -> dict[str, str]:
    data = path.read_bytes().decode()
    return {k: v for k, v in (kv.split("=", 1) for kv in data.split("\0") if "=" in kv) if k not in NOISE}


@pytest.fixture
def site(tmp_path) -> tuple[Path, Path]:
    """(the module tree, the site conda's base env): conda/2026-10-01 defines `conda`; conda/plain does not."""
    tree, base = tmp_path / "soft modules", tmp_path / "site conda"
    (base / "bin").mkdir(parents=True)
    conda_function_module(tree / "conda" / "2026-10-01.lua", base)
    (tree / "conda" / "plain.lua").write_text(f'prepend_path("PATH", "{base}/bin")\n')
    return tree, base


@pytest.fixture
def venv(tmp_path) -> Path:
    if not shutil.which("uv"):
        pytest.skip("uv is not installed (it is a runtime dependency from the create issue on)")
    prefix = tmp_path / "env $(touch PWNED) 'q'"
    subprocess.run(["uv", "venv", "--quiet", str(prefix)], check=True, env={**os.environ, "UV_NO_CACHE": "1"})
    return prefix


def round_trip(shell: str, prefix: Path, work: Path) -> tuple[dict, dict, dict, str]:
    env = {"HOME": str(work), "PATH": "/usr/bin:/bin", "MODULEPATH": "/nowhere", "CONDA_PROMPT_MODIFIER": ""}
    argv = [shell, *(["-f"] if shell == "zsh" else []), "-c", DRIVER.format(init=LMOD_INIT_DIR)]
    res = subprocess.run(
        [*argv, "driver", str(prefix), str(work), shell], env=env, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    assert "still defined" not in res.stdout
    before, during, after = (read_env(work / n) for n in ("before", "during", "after"))
    return before, during, after, res.stdout + res.stderr


def act(tree: Path, module: str = "conda/2026-10-01", conda_env: str = "base") -> Activation:
    return Activation(
        module_use=(str(tree),),
        modules=(module,),
        conda_env=conda_env,
        env={"NCCL_NET": "AWS Libfabric"},
        prepend={"LD_LIBRARY_PATH": ("/soft/aws-ofi-nccl/lib",)},
        module_init=str(LMOD_INIT_DIR),
        recipe="demo",
    )


@needs_lmod
@pytest.mark.parametrize("shell", SHELLS)
def test_conda_activate_runs_after_the_modules_and_deactivate_gives_everything_back(
    shell, site, venv, tmp_path
):
    tree, base = site
    activation.install(venv, act(tree))
    before, during, after, said = round_trip(shell, venv, tmp_path)
    assert "activate status 0" in said
    assert (during["CONDA_PREFIX"], during["CONDA_DEFAULT_ENV"], during["CONDA_SHLVL"]) == (
        str(base),
        "base",
        "1",
    )
    assert during["LOADEDMODULES"] == "conda/2026-10-01"
    assert during["NCCL_NET"] == "AWS Libfabric"
    # conda activate put the base env first; the env's own python still wins.
    assert (tmp_path / "python").read_text().strip() == str(venv / "bin" / "python")
    assert during["PATH"].split(":")[:2] == [str(venv / "bin"), str(base / "bin")]
    # Exactly as before: CONDA_SHLVL=0, which conda deactivate leaves behind, is gone; the empty prompt modifier
    # the user had is back.
    assert after == before
    assert not list(tmp_path.glob("PWNED*"))


@needs_lmod
@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize(
    ("module", "conda_env", "says"),
    [
        ("conda/plain", "base", "no conda command once the modules are loaded"),
        ("conda/2026-10-01", "other", "conda activate other failed"),
    ],
    ids=["no-conda-function", "activate-fails"],
)
def test_no_conda_or_a_failed_activate_leaves_nothing_applied(
    *, shell, site, venv, tmp_path, module, conda_env, says
):
    tree, _ = site
    activation.install(venv, act(tree, module, conda_env))
    before, during, after, said = round_trip(shell, venv, tmp_path)
    assert "activate status 1" in said
    assert says in said and "the env is not activated" in said
    # Neither the modules, the variables, the list entries nor the venv's own activate are left behind.
    assert during == before
    assert after == before


@needs_lmod
def test_a_validation_run_gets_the_conda_env_through_the_module_adapter(site):
    tree, base = site
    lmod = modules.ModuleSystem("lmod", str(LMOD_INIT_DIR / "bash"))
    env = {"HOME": os.environ["HOME"], "PATH": "/usr/bin:/bin", "MODULEPATH": "/nowhere"}
    delta = lmod.apply([str(tree)], ["conda/2026-10-01"], env, conda_env="base")
    assert (delta.set["CONDA_PREFIX"], delta.set["CONDA_SHLVL"]) == (str(base), "1")
    assert delta.set["PATH"].split(":")[0] == str(base / "bin")
    assert not [k for k in delta.set if k.startswith("BASH_FUNC_")]  # shell code, not settings
    with pytest.raises(ModuleSystemError, match="no conda command once conda/plain loaded"):
        lmod.apply([str(tree)], ["conda/plain"], env, conda_env="base")
    with pytest.raises(
        ModuleSystemError,
        match=r"`conda activate other` \(activate\.conda_env\) failed: EnvironmentNameNotFound",
    ):
        lmod.apply([str(tree)], ["conda/2026-10-01"], env, conda_env="other")
    # The name reaches conda as one argument, never as shell text; a hostile one never gets that far.
    with pytest.raises(ModuleSystemError, match="not a conda env name"):
        lmod.apply([str(tree)], ["conda/2026-10-01"], env, conda_env="base; touch PWNED")


def load_with(system: str, init: Path, mods: Path, fmt: str, work: Path) -> str:
    """What loading (and unloading) the env's modulefile says on stderr."""
    name = "myenv/1.0.lua" if fmt == "lua" else "myenv/1.0"
    (mods / name).parent.mkdir(parents=True, exist_ok=True)
    (mods / name).write_text(
        modulefile.render(
            name="myenv/1.0", prefix="/e", recipe="demo", activate=Activation(conda_env="base"), fmt=fmt
        )
    )
    script = f'. {init}/bash; module load myenv/1.0 && echo "loaded $VIRTUAL_ENV"; module unload myenv/1.0'
    env = {"HOME": str(work), "PATH": "/usr/bin:/bin", "MODULEPATH": str(mods)}
    res = subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60, cwd=work
    )
    assert res.returncode == 0, res.stderr
    assert "loaded /e" in res.stdout, system
    return " ".join(res.stderr.split())  # Lmod wraps its messages


@needs_lmod
@pytest.mark.parametrize("fmt", formats.MODULEFILE_FORMATS)
def test_lmod_says_on_load_what_the_modulefile_cannot_do(fmt, tmp_path):
    said = load_with("lmod", LMOD_INIT_DIR, tmp_path / "mods", fmt, tmp_path)
    assert "run `conda activate base` after `module load`" in said


def test_environment_modules_says_it_too(envmodules_init, tmp_path):
    said = load_with("environment-modules", envmodules_init, tmp_path / "mods", "tcl", tmp_path)
    assert "run `conda activate base` after `module load`" in said


def test_envbuilder_modulefile_warns_that_the_conda_step_is_left_out(tmp_path):
    act = Activation(modules=("conda/2026-10-01",), conda_env="base")
    record = state.EnvRecord(
        "demo", "demo", "sha256:ab", str(tmp_path / "env"), "t", plan={"activate": act.to_json()}
    )
    state.save(tmp_path / "home", record)
    env = {"ENVBUILDER_HOME": str(tmp_path / "home"), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    res = run_cli("modulefile", "demo", "-o", str(tmp_path), env=env)
    assert res.returncode == 0, res.stderr
    assert "warning: this env's activate script also runs `conda activate base`" in " ".join(
        res.stderr.split()
    )
    data = json.loads(run_cli("modulefile", "demo", "--json", env=env).stdout)["data"]
    assert data["warnings"] == [modulefile.conda_step_note(act)]
