"""conda envs for real: a local channel of conda packages built here (tests/condaworld.py), indexed by py-rattler
and solved and installed by the embedded engine with no conda binary, pip packages installed inside; a site's conda
from its module building beside the prefix; locks for two platforms by py-rattler and by conda-lock; a solver
failure. The envs with the machine's CPU torch inside are in test_conda_torch.py, apart so that xdist can run the
two files on different workers."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from condachannel import Package, build_package, conda_shim, index
from condaworld import PY, PYTHON_VERSION, RECIPE, World, conda_meta, hpc_lib, needs_lmod, sh
from helpers import ok

from envbuilder import lockfile
from envbuilder.recipe.sections import CONDA_PYTHON

pytestmark = pytest.mark.integration
#: Where a conda env's python comes from when the recipe names none.
DEFAULT = "envbuilder's default for a conda env (the recipe sets no [python] version)"
rattler = pytest.importorskip("rattler", reason="py-rattler (the embedded conda engine) is not installed")


@pytest.fixture
def world(tmp_path, conda_channel, conda_wheels, conda_uv_cache):
    return World(tmp_path, conda_channel, conda_wheels, conda_uv_cache)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


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


def test_a_conda_env_without_python_version_is_planned_and_built_for_one_python(world):
    # Without [python] version the plan resolved for the planning host's python while the engine was asked for
    # python=3.12; the build then failed blaming conda.channels and conda.packages alone.
    text = RECIPE.format(name="cnover", conda=json.dumps(["hpc-hello"]), py=PY)
    world.write_recipe("cnover", text.replace(f'version = "{PY}"\n', ""))
    plan = world.data("plan", "cnover")
    assert plan["python"] == {
        "command": "python",
        "version": CONDA_PYTHON,
        "source": DEFAULT,
        "origin": "conda",
        "where": f"python {CONDA_PYTHON} from the recipe's conda channels, in the env",
    }
    assert (
        plan["target"]["python"] == plan["lock_inputs"]["python"] == CONDA_PYTHON
    )  # what torch resolves for
    assert plan["install_commands"][0][8:] == [f"python={CONDA_PYTHON}", "pip", "hpc-hello"]
    res = world.cli("create", "cnover", "--no-validate")
    prefix = world.scratch / "envs" / "cnover"
    if PY == CONDA_PYTHON:  # the tests' channel has a python of this interpreter's version only
        assert res.returncode == 0, res.stderr
        assert conda_meta(prefix)["python"].startswith(f"{CONDA_PYTHON}.")
        return
    assert res.returncode == 7, res.stderr
    assert f"python={CONDA_PYTHON}" in res.stderr and "set [python] version" in res.stderr
    assert not prefix.exists()


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


def test_conda_lock_for_two_platforms_then_create_from_it(
    tmp_path, conda_channel, conda_wheels, conda_uv_cache
):
    own = tmp_path / "channel"
    shutil.copytree(conda_channel, own)
    (tmp_path / "w").mkdir()
    world = World(tmp_path / "w", own, conda_wheels, conda_uv_cache)
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
def test_conda_lock_with_the_sites_conda_then_create_from_it(
    tmp_path, conda_channel, conda_wheels, conda_uv_cache
):
    """With the site's conda on PATH once the recipe's miniforge3 module is loaded (a stand-in: see conda_shim),
    the real conda-lock locks the conda part through it, for two platforms and with the target's virtual
    packages; the lock has the same shape as py-rattler's, and create builds exactly it."""
    pytest.importorskip(
        "conda_lock", reason="conda-lock is not installed (pip install -e '.[test]' brings it)"
    )
    own = tmp_path / "channel"
    shutil.copytree(conda_channel, own)
    # A package for CUDA nodes only: conda-lock's own defaults claim CUDA 11.4 on every linux node.
    build_package(
        own,
        Package("hpc-cuda", "1.0", files={"share/hpc-cuda": "1\n"}, depends=["__cuda >=11"], subdir="noarch"),
    )
    index(own)
    (tmp_path / "w").mkdir()
    world = World(tmp_path / "w", own, conda_wheels, conda_uv_cache)
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


def test_lock_format_conda_lock_writes_one_conda_lock_yml_that_conda_lock_reads(
    tmp_path, conda_channel, conda_wheels, conda_uv_cache
):
    """``lock --format conda-lock``: conda-lock's own entries for each platform joined into one conda-lock.yml,
    with uv's pip part as conda-lock's pip entries; the real conda-lock parses it and renders the explicit files
    its install runs, and ``conda-lock install`` installs it through the stand-in conda (see conda_shim)."""
    pytest.importorskip(
        "conda_lock", reason="conda-lock is not installed (pip install -e '.[test]' brings it)"
    )
    from conda_lock.lockfile import parse_conda_lock_file

    own = tmp_path / "channel"
    shutil.copytree(conda_channel, own)
    (tmp_path / "w").mkdir()
    world = World(tmp_path / "w", own, conda_wheels, conda_uv_cache)
    tree = miniforge_module(tmp_path)
    world.recipe(extra='[modules]\nsystem = "lmod"\nload = ["miniforge3/25.3.1-gcc-11.4.1"]\n')
    args = ("lock", "cdemo", "--platform", "x86_64", "--platform", "aarch64", "--format", "conda-lock")
    data = world.data(*args, MODULEPATH=str(tree))
    assert data["engine"] == "conda-lock"
    out = Path(data["path"]).parent / "cdemo" / "conda-lock.yml"
    assert data["standard_files"] == [str(out)]
    ours = lockfile.read(Path(data["path"]))

    theirs = parse_conda_lock_file(out)  # conda-lock's own reader and its models
    assert sorted(theirs.metadata.platforms) == ["linux-64", "linux-aarch64"]
    for arch, subdir in (("x86_64", "linux-64"), ("aarch64", "linux-aarch64")):
        got = {(p.name, p.version, p.manager, p.hash.sha256) for p in theirs.package if p.platform == subdir}
        want = {(p.name, p.version, "pip" if not p.is_conda else "conda", p.files[0].sha256)
                for p in ours.for_arch(arch).packages}  # fmt: skip
        assert got == want

    subprocess.run([sys.executable, "-m", "conda_lock", "render", "--kind", "explicit", "-p", "linux-64", str(out)],
                   cwd=tmp_path, check=True, capture_output=True)  # fmt: skip
    explicit = (tmp_path / "conda-linux-64.lock").read_text()
    lib = next(p for p in ours.for_arch("x86_64").conda if p.name == "hpc-lib")
    assert f"{lib.files[0].url}#" in explicit
    assert "# pip condademo @ " in explicit

    # The real conda-lock installs it (with the stand-in conda): the locked conda builds and the pip part.
    prefix = tmp_path / "installed"
    shim = next((tmp_path / "miniforge3" / "bin").glob("conda"))
    res = subprocess.run([sys.executable, "-m", "conda_lock", "install", "--conda", str(shim), "-p", str(prefix),
                          str(out)], cwd=tmp_path, capture_output=True, text=True, env={**os.environ, **world.env})  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert conda_meta(prefix)["hpc-lib"] == lib.version
    assert list(prefix.glob("lib/python*/site-packages/condademo*"))

    # A recipe that py-rattler locks (no conda here) has no conda-lock output to write: said before anything is.
    world.recipe(name="rdemo")
    res = world.cli("lock", "rdemo", "--format", "conda-lock", "-o", str(tmp_path / "r" / "rdemo.lock.toml"))
    assert res.returncode == 13, res.stderr
    assert "was locked by rattler for x86_64, not by conda-lock" in res.stderr
    assert not (tmp_path / "r").exists()
