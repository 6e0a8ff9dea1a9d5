"""conda envs with the machine's CPU torch inside, for real (the channel and index of tests/condaworld.py): torch from
the wheel index inside a conda env, backed up as an exact archive and restored elsewhere; the Zurada recipe on an
emulated Zurada (real Lmod module names, mirrored channel and index); the Polaris overlay on a fixture conda
module."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from condachannel import conda_function_module
from condaworld import LMOD_INIT, PY, PYTHON_VERSION, World, conda_meta, needs_lmod, sh
from helpers import ok

from envbuilder.backup import archive
from envbuilder.recipe.catalog import builtin_dir

pytestmark = pytest.mark.integration
rattler = pytest.importorskip("rattler", reason="py-rattler (the embedded conda engine) is not installed")


@pytest.fixture
def world(tmp_path, conda_channel, conda_wheels, conda_uv_cache):
    return World(tmp_path, conda_channel, conda_wheels, conda_uv_cache)


def files_of(prefix: Path) -> list[dict[str, Any]]:
    """Every file with its hash, less Python's bytecode caches (a read-only site env has none written)."""
    return [e for e in archive.hash_tree(prefix) if "__pycache__" not in e["path"]]


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


@pytest.fixture(scope="module")
def site_conda_module(tmp_path_factory, conda_channel, conda_wheels, conda_uv_cache) -> tuple[Path, Path]:
    """A site conda env with torch inside (built here by the embedded engine), and a `conda/2026-10-01` module that
    puts it on PATH and defines a stand-in `conda` shell function (no real conda here) whose `conda activate base`
    enters it, as ALCF's does: (the env, the module tree). Built once for the module: the overlays over it only
    read it (each checks that)."""
    tmp_path = tmp_path_factory.mktemp("site-conda")
    world = World(tmp_path / "w", conda_channel, conda_wheels, conda_uv_cache)
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
def test_polaris_overlay_on_a_fixture_conda_module(world, tmp_path, site_conda_module, overlay):
    """polaris-overlay-conda over a site conda env that a `conda/2026-10-01` module puts on PATH: as a venv on top
    (the recipe's way) it sees the site's torch; as a clone it has its own copy; either adds its own package, and
    the site env is not written."""
    site_env, modules = site_conda_module
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
