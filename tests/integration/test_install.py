"""`pip install .` gives an `envbuilder` command whose built-in recipes travel inside the wheel.

The distribution is `hpc-envbuilder` (PyPI's `envbuilder` is another project); command and import name stay."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile

import pytest
from helpers import FACTS, PLAN_ENV, REPO

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    root = tmp_path_factory.mktemp("install")
    wheels = root / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(wheels), str(REPO)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    # The wheel file name spells the distribution name with an underscore (PEP 491).
    wheel = next(wheels.glob("hpc_envbuilder-*.whl"))
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return wheel, venv


def test_wheel_carries_recipes_matrix_and_payloads(installed):
    wheel, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    assert "envbuilder/_recipes/tacc/vista/vista-venv-cu124.toml" in names
    assert "envbuilder/_recipes/local.toml" in names
    assert "envbuilder/data/torch_matrix.toml" in names
    assert "envbuilder/payloads/validate.py" in names
    assert "envbuilder/payloads/gpu_affinity.sh" in names


def run_installed(argv: list[str], cwd) -> subprocess.CompletedProcess[str]:
    """Run the installed command from outside the repository, with nothing of the repo on PATH."""
    return subprocess.run(
        argv, capture_output=True, text=True, cwd=cwd, env={**PLAN_ENV, "PATH": "/usr/bin:/bin"}, timeout=120
    )


def test_installed_command_plans_vista_outside_the_repo(installed, tmp_path):
    _, venv = installed
    facts = str(FACTS / "gh200-aarch64.json")
    res = run_installed(
        [str(venv / "bin" / "envbuilder"), "plan", "vista-venv-cu124", "--facts", facts, "--json"], tmp_path
    )
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)["data"]
    assert data["index_url"] == "https://download.pytorch.org/whl/cu126"
    assert data["files"][0] == "builtin:tacc/vista/vista-venv-cu124.toml"
    payload = next(a for a in data["launch_command"] if a.endswith("validate.py"))
    # The env's own copy (create writes it), which compute nodes see; never the repo's or the install's.
    assert payload == f"{data['prefix']}/envbuilder/payloads/validate.py", payload


def test_python_dash_m_works_too(installed, tmp_path):
    _, venv = installed
    res = run_installed(
        [str(venv / "bin" / "python"), "-m", "envbuilder", "recipes", "list", "--json"], tmp_path
    )
    assert res.returncode == 0, res.stderr
    assert len(json.loads(res.stdout)["data"]["recipes"]) >= 13


def test_the_distribution_is_hpc_envbuilder(installed, tmp_path):
    wheel, venv = installed
    meta = next(n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".dist-info/METADATA"))
    assert "\nName: hpc-envbuilder\n" in zipfile.ZipFile(wheel).read(meta).decode()
    probe = "import envbuilder, importlib.metadata as m; print(m.version('hpc-envbuilder'), envbuilder.__version__)"
    res = run_installed([str(venv / "bin" / "python"), "-c", probe], tmp_path)
    assert res.returncode == 0, res.stderr
    installed_version, import_version = res.stdout.split()
    assert installed_version == import_version
    version = run_installed([str(venv / "bin" / "envbuilder"), "--version"], tmp_path)
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"envbuilder {import_version}"
