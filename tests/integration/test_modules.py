"""The module-system adapter against real Lmod (Debian's lmod, installed by .ci/run) and real Tcl Environment
Modules (Debian's package, which conflicts with lmod, unpacked by .ci/run into a private prefix: the
``envmodules_init`` fixture), with a fixture tree that uses the seed sites' module names; and the env's
modulefile, Lua and Tcl, loaded and unloaded by both."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import DATA, ENVMODULES_INIT_DIR, MODULE_BOOKKEEPING

from envbuilder.core.errors import ModuleSystemError
from envbuilder.plan.activation import Activation
from envbuilder.recipe import loader
from envbuilder.recipe.catalog import Catalog
from envbuilder.system import modules

pytestmark = pytest.mark.integration

TREE = DATA / "modules"
LMOD_INIT = "/usr/share/lmod/lmod/init/bash"

needs_lmod = pytest.mark.skipif(
    not Path(LMOD_INIT).is_file(), reason="Lmod not installed (.ci/run installs Debian's lmod)"
)


def base_env(modulepath: Path = TREE / "site") -> dict[str, str]:
    # A clean environment as a batch job or a login shell without modules loaded would have.
    return {"HOME": os.environ["HOME"], "PATH": "/usr/bin:/bin", "MODULEPATH": str(modulepath)}


@pytest.fixture
def lmod() -> modules.ModuleSystem:
    if not Path(LMOD_INIT).is_file():
        pytest.skip("Lmod not installed (.ci/run installs Debian's lmod)")
    return modules.ModuleSystem("lmod", LMOD_INIT)


def test_detect_finds_lmod_from_lmod_cmd():
    if not Path(LMOD_INIT).is_file():
        pytest.skip("Lmod not installed (.ci/run installs Debian's lmod)")
    found = modules.detect({"LMOD_CMD": "/usr/share/lmod/lmod/libexec/lmod"})
    assert found == modules.ModuleSystem("lmod", str(Path(LMOD_INIT).resolve()))


def test_detect_without_any_module_system(tmp_path):
    assert modules.detect({}, locations=[("lmod", str(tmp_path / "no-init"))]).kind == "none"


def test_detect_tcl_from_moduleshome(tmp_path):
    (tmp_path / "init").mkdir()
    (tmp_path / "init" / "bash").write_text("module() { :; }\n")
    found = modules.detect({"MODULESHOME": str(tmp_path)}, locations=[])
    assert found == modules.ModuleSystem("environment-modules", str(tmp_path / "init" / "bash"))


def test_vista_modules_load_in_order(lmod):
    env = base_env()
    delta = lmod.apply([], ["gcc/15.1.0", "python3/3.11.8"], env)
    after = delta.apply(env)
    assert after["GCC_VERSION"] == "15.1.0"
    assert after["TACC_PYTHON_VER"] == "3.11.8"
    assert after["PATH"].split(":")[:2] == ["/opt/fake/python-3.11.8/bin", "/opt/fake/gcc-15.1.0/bin"]
    assert after["LOADEDMODULES"] == "gcc/15.1.0:python3/3.11.8"
    assert "SHLVL" not in delta.set


def test_callers_environment_is_untouched(lmod):
    before = dict(os.environ)
    lmod.apply([], ["gcc/13.2.0"], base_env())
    assert dict(os.environ) == before


def test_module_use_then_load_polaris_conda(lmod):
    env = base_env()
    with pytest.raises(ModuleSystemError):
        lmod.apply([], ["conda/2025-09-25"], env)  # the seed's mistake: no `module use /soft/modulefiles`
    delta = lmod.apply([str(TREE / "soft")], ["conda/2025-09-25"], env)
    assert delta.set["CUDA_HOME"] == "/opt/fake/soft/compilers/cudatoolkit/cuda-12.9.1"
    assert str(TREE / "soft") in delta.set["MODULEPATH"].split(":")


def test_unknown_module_names_it_and_suggests_spider(lmod):
    with pytest.raises(ModuleSystemError) as info:
        lmod.apply([], ["gcc/15.1.0", "python3_mpi/3.11.99"], base_env())
    assert info.value.message.startswith("module python3_mpi/3.11.99 is not available on this system (lmod)")
    assert info.value.hint.startswith("module spider python3_mpi")


def test_missing_prerequisite_is_reported(lmod):
    with pytest.raises(ModuleSystemError) as info:
        lmod.apply([], ["python3_mpi/3.11.8"], base_env())
    assert "without these module(s) loaded" in info.value.message
    assert "gcc" in info.value.message


def test_tcl_modulefile_read_by_lmod(lmod):
    delta = lmod.apply([], ["python/3.12.1-gpu", "cmake/3.25.2"], base_env())
    assert delta.set["MINICONDA3_PYTHON_VERSION"] == "3.12.1"
    assert delta.set["CMAKE_VERSION"] == "3.25.2"


def test_hostile_module_use_path_is_an_argument_not_shell_text(lmod, tmp_path):
    weird = tmp_path / "mods $(touch pwned) `id` 'q' dir"
    shutil.copytree(TREE / "site" / "gcc", weird / "gcc")
    delta = lmod.apply([str(weird)], ["gcc/13.2.0"], {**base_env(tmp_path / "empty")})
    assert delta.set["GCC_VERSION"] == "13.2.0"
    assert not (Path.cwd() / "pwned").exists()
    assert not (tmp_path / "pwned").exists()


def test_emitted_lines_load_the_same_modules_in_a_real_shell(lmod):
    lines = lmod.load_lines([str(TREE / "soft")], ["gcc/15.1.0", "conda/2025-09-25"])
    unload = lmod.unload_lines(["gcc/15.1.0", "conda/2025-09-25"])
    script = "\n".join(
        [
            f"source {LMOD_INIT}",
            *lines,
            'echo "loaded=$LOADEDMODULES"',
            *unload,
            'echo "after=${LOADEDMODULES:-}"',
        ]
    )
    out = subprocess.run(
        ["bash", "--noprofile", "--norc", "-c", script],
        env=base_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert out == ["loaded=gcc/15.1.0:conda/2025-09-25", "after="]


def test_null_system_refuses_modules_but_allows_none():
    null = modules.ModuleSystem("none")
    assert null.apply([], [], {}) == modules.EnvDelta()
    with pytest.raises(ModuleSystemError, match="no module system was found"):
        null.apply([], ["gcc"], {})


@needs_lmod
def test_every_shipped_lmod_recipe_module_exists_in_the_fixture_tree(lmod):
    # The fixture tree mirrors the seed sites' module names: a recipe's modules must load there (emulated sites).
    catalog = Catalog.from_env({})
    env = {**base_env(), "MODULEPATH": f"{TREE / 'site'}"}
    for name in (
        "vista-venv-cu124",
        "vista-venv-mpi-cu126",
        "zurada-conda-cu126",
        "polaris-overlay-conda",
        "cirrus-venv-cu121-horovod",
    ):
        recipe = loader.load(name, catalog)
        use = [str(TREE / "soft") if u == "/soft/modulefiles" else u for u in recipe.get("modules.use")]
        delta = lmod.apply(use, recipe.get("modules.load"), env)
        assert delta.set.get("LOADEDMODULES", "").split(":") == list(recipe.get("modules.load")), name


def test_tcl_environment_modules_status_is_checked(envmodules_init):
    tcl = modules.ModuleSystem("environment-modules", str(envmodules_init / "bash"))
    with pytest.raises(ModuleSystemError):
        tcl.apply([], ["nosuch/1.0"], base_env())
    assert tcl.apply([], ["cmake/3.25.2"], base_env()).set["CMAKE_VERSION"] == "3.25.2"


def test_modulefile_loads_the_env_and_its_modules_with_real_lmod(lmod, tmp_path):
    from envbuilder.plan.activation import Activation
    from envbuilder.render import modulefile

    prefix = tmp_path / "env $(touch PWNED) `id` \"q\" 's' \\back"
    (prefix / "bin").mkdir(parents=True)
    mods = tmp_path / "mods"
    (mods / "myenv").mkdir(parents=True)
    text = modulefile.render(
        name="myenv/1.0",
        prefix=str(prefix),
        recipe="demo",
        activate=Activation(
            modules=("gcc/15.1.0", "conda/2025-09-25"),
            module_use=(str(TREE / "soft"),),
            env={"OMP_NUM_THREADS": "16", "TRICKY": 'a"b\\c $(x) `y`'},
            unset=("NCCL_DEBUG",),
        ),
    )
    (mods / "myenv" / "1.0.lua").write_text(text)
    env = {**base_env(), "MODULEPATH": f"{mods}:{TREE / 'site'}", "NCCL_DEBUG": "INFO"}
    delta = lmod.apply([], ["myenv/1.0"], env)
    after = delta.apply(env)
    assert after["VIRTUAL_ENV"] == str(prefix)
    assert after["PATH"].split(":")[0] == str(prefix / "bin")
    assert after["OMP_NUM_THREADS"] == "16"
    # (Lmod itself cuts a setenv value at a newline, so none here; lua_string's own test covers that escape.)
    assert after["TRICKY"] == 'a"b\\c $(x) `y`'
    assert "NCCL_DEBUG" not in after
    assert after["LOADEDMODULES"].split(":") == ["gcc/15.1.0", "conda/2025-09-25", "myenv/1.0"]
    assert not (tmp_path / "PWNED").exists()
    # module unload takes the dependencies it loaded with it.
    script = f"""
source {LMOD_INIT}
module load myenv/1.0
module unload myenv/1.0
echo "loaded=${{LOADEDMODULES:-}} venv=${{VIRTUAL_ENV:-none}} nccl=$NCCL_DEBUG omp=${{OMP_NUM_THREADS-unset}}"
"""
    out = subprocess.run(
        ["bash", "--noprofile", "--norc", "-c", script], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "loaded= venv=none nccl=INFO omp=unset"


def test_lua_string_escapes():
    from envbuilder.render.modulefile import lua_string

    assert lua_string('a"b\\c\nd\x01') == '"a\\"b\\\\c\\nd\\001"'


# --- the env's modulefile, Lua for Lmod and Tcl for Environment Modules: load, then unload exactly ---

SHELLS = [s for s in ("bash", "zsh") if shutil.which(s)]
#: Everything Tcl substitutes or groups by ($, [], {}, backslash, quotes), and what a shell would run.
HOSTILE_VALUE = 'a"b\\c $(touch PWNED) `touch PWNED2` [exec touch PWNED3] {x} $HOME \\'
ODD_DIR = "/soft/odd dir $(touch PWNED) [exec touch PWNED3] {b} \\x"
ENV_ACT = Activation(
    modules=("cmake/3.25.2",),  # a Tcl modulefile, which Lmod reads too
    env={"OMP_NUM_THREADS": "16", "TRICKY": HOSTILE_VALUE},
    unset=("NCCL_DEBUG",),
    prepend={"LD_LIBRARY_PATH": (ODD_DIR, "/soft/aws-ofi/lib")},
    append={"CMAKE_PREFIX_PATH": ("/soft/cmake",)},
)
ROUND_TRIP = r"""
. "$INIT"
dump() {{ env -0 > "$1"; }}
dump "$WORK/before"
module load myenv/1.0
dump "$WORK/during"
{meanwhile}
module unload myenv/1.0
dump "$WORK/after"
"""


def read_vars(path: Path) -> dict[str, str]:
    pairs = (kv.split("=", 1) for kv in path.read_bytes().decode().split("\0") if "=" in kv)
    noise = {"_", "PWD", "OLDPWD", "SHLVL", "ZSH_EXECUTION_STRING", "PS1"}
    return {k: v for k, v in pairs if k not in noise and not k.startswith(MODULE_BOOKKEEPING)}


def module_systems() -> list[tuple[str, Path]]:
    return [("lua", Path(LMOD_INIT).parent), ("tcl", ENVMODULES_INIT_DIR)]


def env_module_round_trip(
    fmt: str, shell: str, tmp_path: Path, prefix: Path, meanwhile: str = ""
) -> tuple[dict[str, str], dict[str, str], dict[str, str], str]:
    """Write the env's modulefile in ``fmt``, load it and unload it in ``shell``; the variables before, during and
    after, and what the module system said."""
    from envbuilder.render import modulefile

    init_dir = dict(module_systems())[fmt]
    if not (init_dir / shell).is_file():
        pytest.skip(
            f"no {fmt} module system here ({init_dir}: Lmod and the Tcl prefix are set up by .ci/run)"
        )
    mods, work = tmp_path / "mods", tmp_path / "work"
    (mods / "myenv").mkdir(parents=True)
    work.mkdir()
    text = modulefile.render(
        name="myenv/1.0", prefix=str(prefix), recipe="demo", activate=ENV_ACT, constraints=True, fmt=fmt
    )
    (mods / "myenv" / ("1.0.lua" if fmt == "lua" else "1.0")).write_text(text)
    env = {
        **base_env(),
        "MODULEPATH": f"{mods}:{TREE / 'site'}",
        "NCCL_DEBUG": "INFO",
        "LD_LIBRARY_PATH": "/opt/user/lib",
        "INIT": str(init_dir / shell),
        "WORK": str(work),
    }
    script = ROUND_TRIP.format(meanwhile=meanwhile)
    argv = [shell, *(["-f"] if shell == "zsh" else []), "-c", script]
    res = subprocess.run(argv, env=env, cwd=work, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    for root in (work, tmp_path, Path.cwd()):
        assert not list(root.glob("PWNED*")), root
    before, during, after = (read_vars(work / n) for n in ("before", "during", "after"))
    return before, during, after, res.stderr


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("fmt", ["lua", "tcl"])
def test_env_modulefile_loads_and_unloads_exactly(fmt, shell, tmp_path):
    from envbuilder.plan.steps import CONSTRAINTS

    prefix = tmp_path / "env$(touch${IFS}PWNED)`id`[exec${IFS}touch${IFS}PWNED3]{b}'q'\"d\"\\bs"
    (prefix / "bin").mkdir(parents=True)
    before, during, after, _ = env_module_round_trip(fmt, shell, tmp_path, prefix)
    assert during["VIRTUAL_ENV"] == str(prefix)
    assert during["PATH"].split(":")[0] == str(prefix / "bin")
    assert during["CMAKE_VERSION"] == "3.25.2"  # the recipe's module came along
    assert during["OMP_NUM_THREADS"] == "16"
    assert during["TRICKY"] == HOSTILE_VALUE
    assert "NCCL_DEBUG" not in during
    assert during["LD_LIBRARY_PATH"].split(":") == [ODD_DIR, "/soft/aws-ofi/lib", "/opt/user/lib"]
    assert during["CMAKE_PREFIX_PATH"] == "/soft/cmake"  # unset before: no empty entry
    assert during["PIP_CONSTRAINT"] == during["UV_CONSTRAINT"] == f"{prefix}/{CONSTRAINTS}"
    assert after == before


@pytest.mark.parametrize("fmt", ["lua", "tcl"])
def test_env_modulefile_unload_keeps_what_the_user_added_meanwhile(fmt, tmp_path):
    meanwhile = 'LD_LIBRARY_PATH="/mine:$LD_LIBRARY_PATH"; export LD_LIBRARY_PATH'
    _, _, after, _ = env_module_round_trip(fmt, "bash", tmp_path, tmp_path / "env", meanwhile)
    assert after["LD_LIBRARY_PATH"] == "/mine:/opt/user/lib"
    assert after["NCCL_DEBUG"] == "INFO"


@pytest.mark.parametrize("fmt", ["lua", "tcl"])
def test_env_modulefile_at_a_prefix_with_whitespace_says_why_it_exports_no_pins(fmt, tmp_path):
    before, during, after, said = env_module_round_trip(fmt, "bash", tmp_path, tmp_path / "env dir")
    assert "PIP_CONSTRAINT" not in during
    assert "not kept from replacing its torch" in " ".join(said.split())
    assert after == before


def test_tcl_string_escapes_everything_tcl_substitutes():
    from envbuilder.render.modulefile import tcl_string

    assert tcl_string('a"b\\c$d[e]{f}\tg') == '"a\\"b\\\\c\\$d\\[e\\]\\{f\\}\\u0009g"'
