"""The conda backend's pure parts: the create command in a plan, channels through the mirror rules, the PyTorch
conda-channel gate, and which engine runs (the engines themselves run in tests/integration/test_conda.py)."""

from __future__ import annotations

import stat
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from envbuilder import plan
from envbuilder.backends import conda
from envbuilder.build import lockers
from envbuilder.core.errors import BackendError, LockError, ResolverErrors
from envbuilder.core.facts import HostFacts
from envbuilder.recipe.catalog import Catalog, Layer, builtin_dir
from envbuilder.recipe.loader import load
from envbuilder.resolver import mirror
from envbuilder.system import modules

HOST = HostFacts(arch="x86_64", python="3.11.7", glibc="2.34", gpus=())
ENV = {"SCRATCH": "/scratch/u", "HOME": "/home/u", "USER": "u"}

RECIPE = """
schema_version = 1
[recipe]
name = "c"
[env]
kind = "conda"
prefix = "${{SCRATCH}}/envs/{{name}}"
[conda]
channels = {channels}
packages = {packages}
engine = "{engine}"
[python]
command = "python"
version = "3.12"
[torch]
install = {install}
version = "{version}"
variant = "cpu"
"""


def recipe(
    tmp_path: Path, *, channels=("conda-forge",), packages=(), engine="auto", install=True, version="2.7.1"
):
    text = RECIPE.format(
        channels=list(channels).__repr__().replace("'", '"'),
        packages=list(packages).__repr__().replace("'", '"'),
        engine=engine,
        install=str(install).lower(),
        version=version,
    )
    (tmp_path / "c.toml").write_text(text)
    return load("c", Catalog([Layer("t", tmp_path)]))


def test_the_create_step_puts_python_and_pip_in_the_env(tmp_path):
    p = plan.build(recipe(tmp_path, packages=("hdf5",)), HOST, ENV)
    create = p.install_steps[0]
    assert create.engine == "auto"
    assert create.argv == (
        "conda", "create", "--yes", "--prefix", "/scratch/u/envs/c", "--override-channels",
        "--channel", "https://conda.anaconda.org/conda-forge", "python=3.12", "pip", "hdf5",
    )  # fmt: skip
    # torch then comes from the wheel index, with the env's own pip (uv) into the env's python.
    assert p.install_steps[1].argv[:5] == ("uv", "pip", "install", "--python", "/scratch/u/envs/c/bin/python")
    assert any("else the embedded py-rattler" in n for n in p.notes)


def test_without_python_version_torch_and_the_env_get_one_python_and_the_plan_says_whose(tmp_path):
    # torch 2.5.1 has wheels for 3.9-3.13: planned for the env's 3.12 it passes, where the planning host's 3.14
    # failed the gate for a python the env never runs (and a 3.11 host planned cp311 wheels for a 3.12 env).
    (tmp_path / "c.toml").write_text(
        RECIPE.format(
            channels='["conda-forge"]', packages="[]", engine="auto", install="true", version="2.5.1"
        ).replace('version = "3.12"\n', "")
    )
    p = plan.build(load("c", Catalog([Layer("t", tmp_path)])), replace(HOST, python="3.14.0"), ENV)
    assert p.target.python == "3.12" == p.lock_inputs["python"]
    assert "python=3.12" in p.install_steps[0].argv
    assert p.python["source"] == "envbuilder's default for a conda env (the recipe sets no [python] version)"
    venv = RECIPE.replace('kind = "conda"', 'kind = "venv"').replace('version = "3.12"\n', "")
    (tmp_path / "c.toml").write_text(
        venv.format(channels="[]", packages="[]", engine="auto", install="false", version="2.5.1")
    )
    v = plan.build(load("c", Catalog([Layer("t", tmp_path)])), HOST, ENV)
    assert (v.target.python, v.python["source"]) == (
        "3.11.7",
        "this host's python (the recipe sets no [python] version)",
    )


def test_channels_go_through_the_mirror_rules(tmp_path):
    env = {
        **ENV,
        mirror.VAR: "conda-forge=/srv/conda/cf https://conda.anaconda.org/=https://mirror.example/conda/",
    }
    p = plan.build(recipe(tmp_path, channels=("conda-forge", "bioconda", "file:///opt/own")), HOST, env)
    argv = p.install_steps[0].argv
    channels = [argv[i + 1] for i, a in enumerate(argv) if a == "--channel"]
    assert channels == ["file:///srv/conda/cf", "https://mirror.example/conda/bioconda", "file:///opt/own"]
    assert any("channel https://conda.anaconda.org/conda-forge -> file:///srv/conda/cf" in n for n in p.notes)


@pytest.mark.parametrize(
    ("channels", "packages", "install", "version", "refused"),
    [
        (("pytorch", "conda-forge"), (), True, "2.7.1", True),
        (("https://conda.anaconda.org/pytorch-nightly",), (), True, "2.6.0", True),
        (("conda-forge",), ("pytorch",), False, "2.7.1", True),  # unpinned: today's would be >= 2.6
        (("pytorch",), ("pytorch=2.7.0",), False, "2.7.1", True),
        (("pytorch",), ("pytorch=2.5.1",), False, "2.7.1", False),  # the last builds there still install
        (("pytorch",), (), True, "2.5.1", False),
        (("conda-forge",), ("numpy",), True, "2.7.1", False),
    ],
)
def test_pytorchs_conda_channel_gate(*, tmp_path, channels, packages, install, version, refused):
    r = recipe(tmp_path, channels=channels, packages=packages, install=install, version=version)
    if not refused:
        plan.build(r, HOST, ENV)
        return
    with pytest.raises(ResolverErrors) as info:
        plan.build(r, HOST, ENV)
    assert info.value.gate == "conda-pytorch-channel"
    assert "deprecated with 2.5" in info.value.message
    assert "torch.install = true" in (info.value.hint or "")


def test_shipped_zurada_recipe_plans_the_corrected_conda_create():
    catalog = Catalog([Layer("builtin", builtin_dir())])
    p = plan.build(load("zurada-conda-cu126", catalog), HOST, ENV)
    assert p.install_steps[0].argv[-2:] == ("python=3.12", "pip")
    assert p.prefix == "/work/u/envbuilder/envs/zurada-conda-cu126"


def _exe(d: Path, name: str) -> Path:
    """An executable file of that name: only where PATH lookup finds it matters here, it is never run."""
    d.mkdir(exist_ok=True)
    path = d / name
    path.write_text("#!/bin/sh\nexit 99\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_engine_choice(tmp_path, monkeypatch):
    argv = ["conda", "create", "--yes", "--prefix", "/b", "python=3.12"]
    final = Path("/final")
    site = tmp_path / "site-bin"
    conda_exe = _exe(site, "conda")
    env = {"PATH": f"{site}:/usr/bin"}
    assert conda.engine_argv(argv, "auto", env, "x86_64", final) == ([str(conda_exe), *argv[1:]], "conda")
    _exe(site, "mamba")
    assert conda.engine_argv(argv, "auto", env, "x86_64", final)[1] == "mamba"
    assert conda.engine_argv(argv, "conda", env, "x86_64", final)[0][0] == str(conda_exe)
    # Nothing on PATH: the embedded engine, with the target's subdir and the final prefix to write into files.
    if conda.rattler_available():
        cmd, name = conda.engine_argv(argv, "auto", {"PATH": "/nonexistent"}, "aarch64", final)
        assert name == "rattler"
        assert cmd[:3] == [sys.executable, "-m", "envbuilder.backends.rattler_engine"]
        assert cmd[-3:] == ["--platform", "linux-aarch64", "--final-prefix=/final"]
    else:  # Python 3.9, where py-rattler does not install (it needs 3.10): the error says what to do instead
        with pytest.raises(BackendError, match="no conda engine"):
            conda.engine_argv(argv, "auto", {"PATH": "/nonexistent"}, "aarch64", final)
    with pytest.raises(BackendError, match="micromamba is not on PATH"):
        conda.engine_argv(argv, "micromamba", env, "x86_64", final)
    monkeypatch.setattr(conda, "rattler_available", lambda: False)
    with pytest.raises(BackendError, match="no conda engine") as info:
        conda.engine_argv(argv, "auto", {"PATH": "/nonexistent"}, "x86_64", final)
    assert "module spider miniforge3" in (info.value.hint or "")


def test_which_locker_a_conda_recipe_gets(tmp_path, monkeypatch):
    """conda-lock through the site's conda when one is found as create would find it; py-rattler otherwise."""
    site = tmp_path / "site-bin"
    conda_exe = _exe(site, "conda")
    none = modules.ModuleSystem("none")

    def locker(engine: str, path: str):
        p = plan.build(recipe(tmp_path, engine=engine, install=False), HOST, ENV)
        return lockers.conda_locker(p, {**ENV, "PATH": path}, "uv", none, lambda _: None)

    monkeypatch.setattr(lockers, "conda_lock_command", lambda: ["conda-lock"])
    found, warnings = locker("auto", f"{site}:/usr/bin")
    assert isinstance(found, lockers.CondaLockLocker) and warnings == []
    argv = found.argv(Path("env.yml"), Path("vp.yml"), "linux-64", Path("out.yml"))
    assert argv[:6] == ["conda-lock", "lock", "--conda", str(conda_exe), "--no-mamba", "--no-micromamba"]
    assert argv[argv.index("--platform") + 1] == "linux-64"
    assert argv[argv.index("--virtual-package-spec") + 1] == "vp.yml"
    micromamba = _exe(tmp_path / "mm-bin", "micromamba")
    found, _ = locker("micromamba", str(micromamba.parent))
    assert "--micromamba" in found.argv(Path("e"), Path("v"), "linux-64", Path("o"))

    assert (
        type(locker("rattler", f"{site}:/usr/bin")[0]) is lockers.RattlerLocker
    )  # not its conda-lock subclass
    assert type(locker("auto", "/nonexistent")[0]) is lockers.RattlerLocker
    with pytest.raises(LockError, match="'mamba', but mamba is not on PATH"):
        locker("mamba", f"{site}:/usr/bin")
    monkeypatch.setattr(lockers, "conda_lock_command", lambda: [])
    found, warnings = locker("auto", f"{site}:/usr/bin")
    assert type(found) is lockers.RattlerLocker
    assert warnings == [
        "conda-lock is not installed, so c was locked with py-rattler, not conda "
        "(pip install 'hpc-envbuilder[conda-lock]' to lock with the site's conda)"
    ]


def test_the_embedded_engine_imports_envbuilder_and_rattler_from_where_this_process_does(tmp_path):
    """The engine is a child python with a scrubbed environment; run from a checkout (PYTHONPATH), envbuilder is
    not installed where that python looks. A bare venv's python stands in for such an interpreter here."""
    pytest.importorskip("rattler", reason="py-rattler (the embedded conda engine) is not installed")
    import subprocess
    import venv

    venv.create(tmp_path / "bare", with_pip=False)
    bare = str(tmp_path / "bare" / "bin" / "python")
    probe = [bare, "-c", "import envbuilder.backends.rattler_engine, rattler"]
    env = {"PATH": "/usr/bin:/bin"}
    assert subprocess.run(probe, env=env, capture_output=True).returncode != 0  # the bare python alone cannot
    engine_env = conda.engine_env("rattler", env)
    assert subprocess.run(probe, env=engine_env, capture_output=True, text=True).returncode == 0
    assert conda.engine_env("conda", env) == env  # a site conda gets no python path of envbuilder's
