"""A conda env's portable archive, unpacked with no envbuilder and no conda (tests/condaworld.py's channel: a tool
whose script names its prefix as text, as conda's prefix placeholders leave it, and a library that names it in
binary form)."""

from __future__ import annotations

import subprocess

import pytest
from backupworld import bare_env, extract, pack, unpack
from condaworld import World, sh
from helpers import ok

pytestmark = pytest.mark.integration
rattler = pytest.importorskip("rattler", reason="py-rattler (the embedded conda engine) is not installed")


@pytest.fixture
def world(tmp_path, conda_channel, conda_wheels, conda_uv_cache):
    return World(tmp_path, conda_channel, conda_wheels, conda_uv_cache)


def test_a_portable_conda_env_unpacks_like_conda_unpack(world):
    w = world
    w.recipe(conda=("hpc-hello", "hpc-blas"))
    ok(w.cli("create", "cdemo", "--no-validate"))
    old = w.scratch / "envs" / "cdemo"
    made = pack(w, "cdemo", w.root / "cdemo.portable.tar")
    assert made["kind"] == "conda"
    # Every text file that names the prefix is rewritten (the tool's filled-in placeholder too); the library
    # that names it in binary form is left, and listed.
    assert {"bin/hpc-hello", "bin/activate"} <= set(made["rewrite"])
    assert "lib/libhpcblas.so" in made["left"] and "lib/libhpcblas.so" not in made["rewrite"]
    kit = extract(w.root / "cdemo.portable.tar", w.root / "kit")
    subprocess.run(["rm", "-rf", str(old)], check=True)
    new = w.root / "elsewhere" / "cdemo"
    res = unpack(kit, str(new), w.root / "home")
    assert res.returncode == 0, res.stderr
    run = subprocess.run(
        [str(new / "bin" / "hpc-hello")], capture_output=True, text=True, env=bare_env(w.root / "home")
    )
    assert run.stdout.strip() == f"hello from {new}: hpc-lib 1.0", run.stderr
    out = sh(
        f"source '{new}/bin/activate' && echo \"$CDEMO|$CONDA_PREFIX\" && command -v condademo && "
        'python -c "import condademo; print(condademo.OK)"',
        bare_env(w.root / "home"),
    )
    assert out.splitlines() == [f"it's set|{new}", f"{new}/bin/condademo", "True"]
