"""conda envs for real: a local channel of conda packages built here (a python wrapping this machine's interpreter,
pip, a library and a tool that embeds its prefix), indexed by py-rattler and solved and installed by the embedded
engine with no conda binary; pip packages and the machine's CPU torch installed inside; the Zurada recipe on an
emulated Zurada (real Lmod module names, mirrored channel and index); the Polaris overlay on a fixture conda
module; a solver failure; a conda env backed up and restored elsewhere."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from condachannel import (
    LONG_PLACEHOLDER,
    PLACEHOLDER,
    Package,
    build_package,
    conda_function_module,
    conda_shim,
    index,
    pip_package,
    python_package,
)
from helpers import DATA, UserWorld, ok
from wheelindex import build_wheel, mirror_env, serve

from envbuilder import lockfile
from envbuilder.backup import archive
from envbuilder.recipe.catalog import builtin_dir

pytestmark = pytest.mark.integration
rattler = pytest.importorskip("rattler", reason="py-rattler (the embedded conda engine) is not installed")
LMOD_INIT = Path("/usr/share/lmod/lmod/init/bash")
needs_lmod = pytest.mark.skipif(not LMOD_INIT.is_file(), reason="Lmod not installed (.ci/run installs it)")
PY = f"{sys.version_info[0]}.{sys.version_info[1]}"
PYTHON_VERSION = ".".join(str(v) for v in sys.version_info[:3])

RECIPE = """
schema_version = 1
[recipe]
name = "{name}"
[env]
kind = "conda"
prefix = "${{SCRATCH}}/envs/{{name}}"
[conda]
channels = ["conda-forge"]
packages = {conda}
[python]
command = "python"
version = "{py}"
[torch]
install = false
[activate]
env = {{ CDEMO = "it's set" }}
[[packages]]
name = "condademo"
spec = "condademo==1.0"
"""


def hpc_lib(ch: Path, version: str, subdir: str = "linux-64", note: str = "") -> None:
    build_package(
        ch, Package("hpc-lib", version, files={"share/hpc-lib/VERSION": f"{version}{note}\n"}, subdir=subdir)
    )


@pytest.fixture(scope="module")
def channel(tmp_path_factory):
    ch = tmp_path_factory.mktemp("conda-channel")
    python_package(ch)
    python_package(ch, subdir="linux-aarch64")
    pip_package(ch)
    hpc_lib(ch, "1.0")
    hpc_lib(ch, "2.0")
    hpc_lib(ch, "1.5", subdir="linux-aarch64")  # aarch64 nodes get another build of the library
    tool = f'#!/bin/sh\necho "hello from {PLACEHOLDER}: hpc-lib $(cat {PLACEHOLDER}/share/hpc-lib/VERSION)"\n'
    build_package(ch, Package("hpc-hello", "0.1", files={"bin/hpc-hello": tool}, depends=["hpc-lib >=1.0,<2"],
                              prefixed=["bin/hpc-hello"], subdir="noarch"))  # fmt: skip
    # A compiled library that embeds its prefix (an RPATH, say): conda patches such files in place.
    blob = b"\x7fELF\x00\x00" + LONG_PLACEHOLDER.encode() + b"/lib\x00" + b"\x00" * 64
    build_package(ch, Package("hpc-blas", "1.0", files={"lib/libhpcblas.so": blob}, prefixed=["lib/libhpcblas.so"],
                              binary=True, placeholder=LONG_PLACEHOLDER))  # fmt: skip
    index(ch)
    return ch


@pytest.fixture(scope="module")
def wheels(tmp_path_factory, torch_files):
    d = tmp_path_factory.mktemp("conda-wheels")
    for f in torch_files.iterdir():
        os.link(f, d / f.name)
    build_wheel(
        d, "condademo", "1.0", {"condademo/__init__.py": "OK = True\n"}, scripts={"condademo": "condademo:OK"}
    )
    with serve(d) as idx:
        yield idx


@pytest.fixture(scope="module")
def uv_cache(tmp_path_factory) -> Path:
    """uv's cache for the module's envs: torch, from the module's one index, is unpacked once, not per test."""
    return tmp_path_factory.mktemp("conda-uv-cache")


class World(UserWorld):
    def __init__(self, root: Path, channel: Path, idx: Any, uv_cache: Path) -> None:
        super().__init__(
            root,
            f"{mirror_env(idx)} conda-forge={channel}",
            ENVBUILDER_HOME=str(root / "eb"),
            MODULEPATH=str(DATA / "modules" / "site"),
            UV_CACHE_DIR=str(uv_cache),
        )
        self.channel = channel

    def recipe(self, name: str = "cdemo", conda: tuple[str, ...] = ("hpc-hello",), extra: str = "") -> None:
        self.write_recipe(name, RECIPE.format(name=name, conda=json.dumps(list(conda)), py=PY) + extra)


def sh(cmd: str, env: dict[str, str]) -> str:
    return ok(subprocess.run(["bash", "--noprofile", "--norc", "-c", cmd], env=env, capture_output=True,
                             text=True, timeout=120)).stdout  # fmt: skip


@pytest.fixture
def world(tmp_path, channel, wheels, uv_cache):
    return World(tmp_path, channel, wheels, uv_cache)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def files_of(prefix: Path) -> list[dict[str, Any]]:
    """Every file with its hash, less Python's bytecode caches (a read-only site env has none written)."""
    return [e for e in archive.hash_tree(prefix) if "__pycache__" not in e["path"]]


def conda_meta(prefix: Path) -> dict[str, str]:
    out = {}
    for f in (prefix / "conda-meta").glob("*.json"):
        rec = json.loads(f.read_text())
        out[rec["name"]] = rec["version"]
    return out


# ---------------------------------------------------------------------------------------------------------------


def test_embedded_engine_builds_a_conda_env_with_python_and_pip_inside(world):
    world.recipe()
    plan = world.data("plan", "cdemo")
    create_cmd = plan["install_commands"][0]
    assert create_cmd[:6] == ["conda", "create", "--yes", "--prefix", plan["prefix"], "--override-channels"]
    assert create_cmd[6:8] == ["--channel", f"file://{world.channel}"]  # conda-forge, mirrored
    assert create_cmd[8:] == [f"python={PY}", "pip", "hpc-hello"]

    data = world.data("create", "cdemo", "--no-validate")
    prefix = world.scratch / "envs" / "cdemo"
    assert data["env"]["prefix"] == str(prefix)
    assert any("conda engine: rattler" in line for line in Path(data["log"]).read_text().splitlines())
    meta = conda_meta(prefix)
    assert meta["python"] == ".".join(str(v) for v in sys.version_info[:3])
    assert meta["hpc-lib"] == "1.0"  # hpc-hello's <2 pin held against the newer 2.0
    assert set(meta) == {"python", "pip", "hpc-hello", "hpc-lib"}
    # Built beside its prefix, the env names its final prefix: the engine patched it, not the build path.
    out = subprocess.run(
        [str(prefix / "bin" / "hpc-hello")], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == f"hello from {prefix}: hpc-lib 1.0"
    assert not list(prefix.parent.glob(".cdemo*"))
    assert str(prefix.parent / ".cdemo") not in (prefix / "bin" / "condademo").read_text()
    # pip is the env's own (the Zurada seed's conda create without python used the base env's pip).
    pip = sh(f"source '{prefix}/bin/activate' && command -v pip && pip --version", world.env)
    assert pip.splitlines()[0] == str(prefix / "bin" / "pip")
    assert f"from {prefix}/lib/python{PY}/site-packages/pip" in pip
    versions = {p["name"]: p["version"] for p in data["env"]["packages"] if p["in_env"]}
    assert versions["condademo"] == "1.0"
    # Activation: bin/activate for shells without conda, and the variables come and go.
    out = sh(f"source '{prefix}/bin/activate' && echo \"$CDEMO|$CONDA_PREFIX\" && deactivate && "
             'echo "${CDEMO-unset}|${CONDA_PREFIX-unset}"', world.env)  # fmt: skip
    assert out.splitlines() == [f"it's set|{prefix}", "unset|unset"]


def test_an_unsatisfiable_request_is_a_solver_error_and_leaves_nothing(world):
    world.recipe(conda=("hpc-hello", "hpc-lib>=2"))
    res = world.cli("create", "cdemo")
    assert res.returncode == 7, res.stderr
    assert "rattler could not create the conda env" in res.stderr
    assert "hpc-lib" in res.stderr
    assert "Traceback" not in res.stderr
    assert not (world.scratch / "envs" / "cdemo").exists()
    assert not list((world.scratch / "envs").glob(".cdemo*"))
    world.recipe(conda=("no-such-package",))
    res = world.cli("create", "cdemo")
    assert res.returncode == 7
    assert "no-such-package" in res.stderr


def test_pytorchs_conda_channel_is_refused_for_current_torch(world):
    world.recipe()
    text = (world.recipes / "cdemo.toml").read_text()
    text = text.replace('channels = ["conda-forge"]', 'channels = ["pytorch", "conda-forge"]')
    text = text.replace("install = false", 'install = true\nversion = "2.7.1"\nvariant = "cpu"')
    (world.recipes / "cdemo.toml").write_text(text)
    res = world.cli("plan", "cdemo")
    assert res.returncode == 4, res.stderr
    assert "PyTorch's conda channel (channel pytorch)" in res.stderr
    assert "torch.install = true" in res.stderr


def test_torch_from_the_index_inside_a_conda_env(world):
    world.recipe(name="ctorch", extra="")
    text = (world.recipes / "ctorch.toml").read_text()
    text = text.replace(
        "install = false", 'install = true\nversion = "2.13.0"\nvariant = "cpu"\npackages = ["torch"]'
    )
    (world.recipes / "ctorch.toml").write_text(text)
    data = world.data("create", "ctorch", "--no-validate")
    prefix = world.scratch / "envs" / "ctorch"
    out = sh(f"source '{prefix}/bin/activate' && python -c 'import sys, torch; "
             "print(torch.__version__, sys.prefix, torch.__file__)'", world.env)  # fmt: skip
    version, sys_prefix, torch_file = out.split()
    assert version == "2.13.0+cpu"
    assert sys_prefix == str(prefix)
    assert torch_file.startswith(f"{prefix}/lib/python{PY}/site-packages/torch")
    assert data["env"]["plan"]["torch"]["index_url"] == "https://download.pytorch.org/whl/cpu"

    # Backups of conda envs are exact archives, restored (and relocated) elsewhere.
    backup = world.data("backup", "ctorch")
    assert backup["mode"] == "archive"
    dest = world.root / "restored" / "ctorch"
    ok(world.cli("restore", "ctorch", "--prefix", str(dest), "--name", "ctorch2", "--no-validate"))
    out = subprocess.run([str(dest / "bin" / "hpc-hello")], capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"hello from {dest}: hpc-lib 1.0"
    out = sh(f"source '{dest}/bin/activate' && python -c 'import sys, torch; print(sys.prefix)'", world.env)
    assert out.strip() == str(dest)


@needs_lmod
def test_zurada_recipe_on_an_emulated_zurada(world, tmp_path):
    """zurada-conda-cu126 itself, on Zurada's module names (the fixture tree has miniforge3/25.3.1-gcc-11.4.1,
    without a conda binary, so the embedded engine builds) with conda-forge and the wheel index mirrored. This
    machine has neither Python 3.12 nor a cu126 torch 2.7.1 wheel (nor torchvision/torchaudio), so a recipe layer
    changes only those (and the prefix); everything else is the shipped recipe's."""
    shipped = builtin_dir() / "zurada" / "zurada-conda-cu126.toml"
    rel = os.path.relpath(shipped, world.recipes)
    # The layer extends the shipped file by path and takes its name (it shadows the built-in recipe).
    (world.recipes / "zurada-conda-cu126.toml").write_text(
        f'schema_version = 1\nextends = "{rel}"\n[recipe]\nname = "zurada-conda-cu126"\n'
        f'[env]\nprefix = "${{SCRATCH}}/envs/{{name}}"\n[python]\nversion = "{PY}"\n'
        '[torch]\nversion = "2.13.0"\nvariant = "cpu"\npackages = ["torch"]\n'
    )
    plan = world.data("plan", "zurada-conda-cu126")
    assert plan["modules"] == ["miniforge3/25.3.1-gcc-11.4.1"]
    assert plan["install_commands"][0][-2:] == [f"python={PY}", "pip"]
    data = world.data("create", "zurada-conda-cu126", USER="tester")
    prefix = Path(data["env"]["prefix"])
    assert data["env"]["modules"]["delta_set"]["LOADEDMODULES"] == "miniforge3/25.3.1-gcc-11.4.1"
    assert data["env"]["validation"]["checks"]["import"]["status"] == "pass"
    # The env's activate.d loads the site's conda module and the recipe's OpenMP placement (no thread count: the
    # launches set that from the job's CPUs); deactivate undoes both.
    out = sh(
        f"source {LMOD_INIT}; source '{prefix}/bin/activate'; "
        'echo "$LOADEDMODULES|$OMP_PLACES|${OMP_NUM_THREADS:-unset}|$(command -v python)"; deactivate; '
        'echo "${LOADEDMODULES:-none}|${OMP_PLACES:-unset}"',
        world.env,
    )
    assert out.splitlines() == [f"miniforge3/25.3.1-gcc-11.4.1|cores|unset|{prefix}/bin/python", "none|unset"]


def site_conda_module(world: World, tmp_path: Path) -> tuple[Path, Path]:
    """A site conda env with torch inside (built here by the embedded engine), and a `conda/2026-10-01` module that
    puts it on PATH and defines a stand-in `conda` shell function (no real conda here) whose `conda activate base`
    enters it, as ALCF's does: (the env, the module tree)."""
    world.recipe(name="site-conda", conda=())
    text = (world.recipes / "site-conda.toml").read_text()
    text = text.replace(
        "install = false", 'install = true\nversion = "2.13.0"\nvariant = "cpu"\npackages = ["torch"]'
    )
    text = text.replace('[[packages]]\nname = "condademo"\nspec = "condademo==1.0"\n', "")
    (world.recipes / "site-conda.toml").write_text(text)
    site_env = tmp_path / "soft" / "datascience" / "conda" / "2026-10-01"
    ok(world.cli("create", "site-conda", "--prefix", str(site_env), "--no-validate"))
    modules = tmp_path / "modulefiles"
    conda_function_module(modules / "conda" / "2026-10-01.lua", site_env)
    return site_env, modules


def polaris_layer(world: World, modules: Path, overlay: str) -> None:
    """polaris-overlay-conda as shipped, with the fixture module tree in place of /soft/modulefiles."""
    rel = os.path.relpath(builtin_dir() / "alcf" / "polaris" / "polaris-overlay-conda.toml", world.recipes)
    (world.recipes / "polaris-overlay-conda.toml").write_text(
        f'schema_version = 1\nextends = "{rel}"\nreplace = ["modules.use"]\n[recipe]\nname = "polaris-overlay-conda"\n'
        f'[modules]\nuse = ["{modules}"]\n[env]\nprefix = "${{SCRATCH}}/envs/{{name}}"\noverlay = "{overlay}"\n'
        '[[packages]]\nname = "condademo"\nspec = "condademo==1.0"\n'
    )


@needs_lmod
@pytest.mark.parametrize("overlay", ["venv", "clone"])
def test_polaris_overlay_on_a_fixture_conda_module(world, tmp_path, overlay):
    """polaris-overlay-conda over a site conda env that a `conda/2026-10-01` module puts on PATH: as a venv on top
    (the recipe's way) it sees the site's torch; as a clone it has its own copy; either adds its own package, and
    the site env is not written."""
    site_env, modules = site_conda_module(world, tmp_path)
    before = files_of(site_env)
    polaris_layer(world, modules, overlay)
    data = world.data("create", "polaris-overlay-conda", PROJECT="p")
    prefix = Path(data["env"]["prefix"])
    assert data["env"]["validation"]["checks"]["import"]["status"] == "pass"
    out = sh(f"source {LMOD_INIT}; source '{prefix}/bin/activate'; python -c 'import sys, torch, condademo; "
             "print(sys.prefix, torch.__file__, condademo.__file__)'; echo $LOADEDMODULES; deactivate", world.env)  # fmt: skip
    sys_prefix, torch_file, demo_file, loaded = out.split()
    assert sys_prefix == str(prefix)
    assert demo_file.startswith(str(prefix))  # the user's own package, in the overlay
    assert loaded == "conda/2026-10-01"
    if overlay == "venv":
        assert torch_file.startswith(str(site_env))  # the site's torch, through the overlay
    else:
        assert torch_file.startswith(str(prefix))  # the clone's own copy
        assert conda_meta(prefix)["python"] == PYTHON_VERSION
        assert (prefix / "etc" / "conda" / "activate.d" / "envbuilder.sh").is_file()
    assert files_of(site_env) == before  # nothing was written into the site env
    # ALCF's `conda activate` after the module load: the venv enters the site's base env (the clone is a conda env
    # of its own, which takes base's place); deactivate gives the shell back exactly.
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    sh(f"source {LMOD_INIT}; env -0 > {dumps}/before; source '{prefix}/bin/activate'; "
       f'echo "$CONDA_PREFIX" > {dumps}/during; deactivate; env -0 > {dumps}/after', world.env)  # fmt: skip
    assert (dumps / "during").read_text().strip() == str(site_env if overlay == "venv" else prefix)
    assert env_dump(dumps / "after") == env_dump(dumps / "before")
    # A validation run gets the same: the runner's module child runs conda activate base.
    if overlay == "venv":
        checks = world.data("validate", "polaris-overlay-conda", "--cpu", "--launcher", "torchrun",
                            "--nproc-per-node", "1", "--checks", "import", PROJECT="p")["checks"]  # fmt: skip
        assert checks["import"]["status"] == "pass"


def env_dump(path: Path) -> dict[str, str]:
    """An ``env -0`` dump, without what bash changes by itself (and PS1, which a venv's deactivate exports)."""
    pairs = (kv.split("=", 1) for kv in path.read_text().split("\0") if "=" in kv)
    return {k: v for k, v in pairs if k not in ("_", "SHLVL", "PS1")}


def test_conda_lock_for_two_platforms_then_create_from_it(tmp_path, channel, wheels, uv_cache):
    own = tmp_path / "channel"
    shutil.copytree(channel, own)
    (tmp_path / "w").mkdir()
    world = World(tmp_path / "w", own, wheels, uv_cache)
    world.recipe()
    data = world.data("lock", "cdemo", "--platform", "x86_64", "--platform", "aarch64")
    assert data["engine"] == "rattler"
    lock = lockfile.read(Path(data["path"]))
    x86, arm = lock.for_arch("x86_64"), lock.for_arch("aarch64")
    assert {p.name: p.version for p in x86.conda} == {
        "python": PYTHON_VERSION, "pip": x86.versions()["pip"], "hpc-hello": "0.1", "hpc-lib": "1.0",
    }  # fmt: skip
    assert {p.name: p.version for p in arm.conda}["hpc-lib"] == "1.5"
    arm_python = next(p for p in arm.conda if p.name == "python")
    assert arm_python.files[0].url.endswith(
        f"/linux-aarch64/python-{PYTHON_VERSION}-h0_envbuilder_tests.tar.bz2"
    )
    assert arm_python.files[0].sha256 == sha(own / "linux-aarch64" / Path(arm_python.files[0].url).name)
    assert [p.name for p in x86.wheels] == ["condademo"]

    # The channel moves on (hpc-lib 1.9 fits hpc-hello's <2): a locked build keeps 1.0, an unlocked one takes 1.9.
    hpc_lib(own, "1.9")
    index(own)
    ok(world.cli("create", "cdemo", "--locked", "--no-validate"))
    prefix = world.scratch / "envs" / "cdemo"
    assert conda_meta(prefix)["hpc-lib"] == "1.0"
    ok(world.cli("create", "cdemo", "--force", "--no-lock", "--no-validate"))
    assert conda_meta(prefix)["hpc-lib"] == "1.9"

    # The channel now serves other bytes for the locked build: refused, and the existing env is untouched.
    for f in (own / "linux-64").glob("hpc-lib-1.0-*"):
        f.unlink()
    hpc_lib(own, "1.0", note=" rebuilt")
    index(own)
    res = world.cli("create", "cdemo", "--force", "--locked")
    assert res.returncode == 7, res.stderr
    assert "does not match the lock (hpc-lib: locked" in res.stderr
    assert conda_meta(prefix)["hpc-lib"] == "1.9"
    assert not list(prefix.parent.glob(".cdemo*"))


def miniforge_module(root: Path) -> Path:
    """A miniforge3 module whose PATH holds the conda stand-in; returns the module tree."""
    shim = conda_shim(root / "miniforge3" / "bin")
    tree = root / "modulefiles"
    (tree / "miniforge3").mkdir(parents=True)
    (tree / "miniforge3" / "25.3.1-gcc-11.4.1.lua").write_text(f'prepend_path("PATH", "{shim.parent}")\n')
    return tree


@needs_lmod
def test_a_conda_from_the_sites_module_builds_and_its_env_is_moved_into_place(world, tmp_path):
    """engine auto with a miniforge3 module that puts a `conda` on PATH (a stand-in: see conda_shim): that conda
    builds beside the prefix, and envbuilder repoints the scripts it wrote. A package whose binary embeds the
    build path cannot be moved: refused with the hint to use the embedded engine, which then builds it."""
    tree = miniforge_module(tmp_path)
    shim = tree.parent / "miniforge3" / "bin" / "conda"
    modules = '[modules]\nsystem = "lmod"\nload = ["miniforge3/25.3.1-gcc-11.4.1"]\n'
    world.recipe(extra=modules)
    data = world.data("create", "cdemo", "--no-validate", MODULEPATH=str(tree))
    prefix = Path(data["env"]["prefix"])
    log = Path(data["log"]).read_text()
    assert "conda engine: conda" in log
    assert f"+ {shim} create --yes --prefix {prefix.parent}/.cdemo.partial-" in log
    out = subprocess.run(
        [str(prefix / "bin" / "hpc-hello")], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == f"hello from {prefix}: hpc-lib 1.0"  # the build path, rewritten in the script
    assert conda_meta(prefix)["hpc-hello"] == "0.1"

    world.recipe(name="cblas", conda=("hpc-blas",), extra=modules)
    res = world.cli("create", "cblas", MODULEPATH=str(tree))
    assert res.returncode == 7, res.stderr
    assert "cannot be moved into place" in res.stderr
    assert "lib/libhpcblas.so" in res.stderr
    assert "conda.engine = 'rattler'" in res.stderr
    assert not (world.scratch / "envs" / "cblas").exists()
    assert not list((world.scratch / "envs").glob(".cblas*"))
    text = (
        (world.recipes / "cblas.toml")
        .read_text()
        .replace('channels = ["conda-forge"]', 'channels = ["conda-forge"]\nengine = "rattler"')
    )
    (world.recipes / "cblas.toml").write_text(text)
    ok(world.cli("create", "cblas", "--no-validate", MODULEPATH=str(tree)))
    blob = (world.scratch / "envs" / "cblas" / "lib" / "libhpcblas.so").read_bytes()
    assert f"{world.scratch}/envs/cblas/lib".encode() in blob
    assert b".cblas.partial" not in blob


@needs_lmod
def test_conda_lock_with_the_sites_conda_then_create_from_it(tmp_path, channel, wheels, uv_cache):
    """With the site's conda on PATH once the recipe's miniforge3 module is loaded (a stand-in: see conda_shim),
    the real conda-lock locks the conda part through it, for two platforms and with the target's virtual
    packages; the lock has the same shape as py-rattler's, and create builds exactly it."""
    pytest.importorskip(
        "conda_lock", reason="conda-lock is not installed (pip install -e '.[test]' brings it)"
    )
    own = tmp_path / "channel"
    shutil.copytree(channel, own)
    # A package for CUDA nodes only: conda-lock's own defaults claim CUDA 11.4 on every linux node.
    build_package(
        own,
        Package("hpc-cuda", "1.0", files={"share/hpc-cuda": "1\n"}, depends=["__cuda >=11"], subdir="noarch"),
    )
    index(own)
    (tmp_path / "w").mkdir()
    world = World(tmp_path / "w", own, wheels, uv_cache)
    tree = miniforge_module(tmp_path)
    modules = '[modules]\nsystem = "lmod"\nload = ["miniforge3/25.3.1-gcc-11.4.1"]\n'
    world.recipe(extra=modules)
    data = world.data("lock", "cdemo", "--platform", "x86_64", "--platform", "aarch64", MODULEPATH=str(tree))
    assert data["engine"] == "conda-lock", data
    lock = lockfile.read(Path(data["path"]))
    x86, arm = lock.for_arch("x86_64"), lock.for_arch("aarch64")
    assert {p.name: p.version for p in x86.conda} == {
        "python": PYTHON_VERSION, "pip": x86.versions()["pip"], "hpc-hello": "0.1", "hpc-lib": "1.0",
    }  # fmt: skip
    assert {p.name: p.version for p in arm.conda}["hpc-lib"] == "1.5"
    for pkg in (*x86.conda, *arm.conda):  # every file named by its real sha256, and its build from its name
        path = own / Path(pkg.files[0].url).parent.name / Path(pkg.files[0].url).name
        assert pkg.files[0].sha256 == sha(path), pkg
        assert Path(pkg.files[0].url).name.startswith(f"{pkg.name}-{pkg.version}-{pkg.build}.")
    assert [p.name for p in x86.wheels] == ["condademo"]

    hpc_lib(own, "1.9")
    index(own)
    data = world.data("create", "cdemo", "--locked", "--no-validate", MODULEPATH=str(tree))
    prefix = world.scratch / "envs" / "cdemo"
    assert conda_meta(prefix)["hpc-lib"] == "1.0"
    lib = next(p for p in x86.conda if p.name == "hpc-lib")
    log = Path(data["log"]).read_text()
    assert "conda engine: conda" in log  # the site's conda built it, from the locked builds
    assert f"hpc-lib=1.0={lib.build}" in log

    # The target's CUDA, not conda-lock's default: this machine's plan has no GPU, so hpc-cuda does not resolve;
    # a site whose compute nodes have CUDA 12.4 gets it.
    world.recipe(name="ccuda", conda=("hpc-hello", "hpc-cuda"), extra=modules)
    res = world.cli("lock", "ccuda", "--platform", "x86_64", MODULEPATH=str(tree))
    assert res.returncode == 13, res.stderr
    assert "conda-lock could not lock the conda packages for x86_64 (linux-64)" in res.stderr
    assert "__cuda" in res.stderr
    assert not (world.root / "eb" / "lockfiles" / "ccuda.lock.toml").exists()
    world.recipe(
        name="ccuda", conda=("hpc-hello", "hpc-cuda"), extra=modules + '[compute]\nmax_cuda = "12.4"\n'
    )
    data = world.data("lock", "ccuda", "--platform", "x86_64", MODULEPATH=str(tree))
    assert data["engine"] == "conda-lock"
    assert "hpc-cuda" in {p.name for p in lockfile.read(Path(data["path"])).for_arch("x86_64").conda}
