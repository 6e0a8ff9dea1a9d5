"""A real conda env (built by the embedded engine, py-rattler, from a local channel: a python wrapping this
machine's interpreter, pip) and a real user-prefix env, activated in real fish and tcsh with the line `envbuilder
activate --shell` prints: python runs from the env, the recipe's value comes and goes. No conda binary can be
installed here, so `conda activate` itself is not run: the env's bin/activate.fish and bin/activate.csh do what
conda's fish and csh activators do for one env (its variables, then the activate.d scripts of that shell)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from condachannel import index, pip_package, python_package
from helpers import UserWorld, ok
from wheelindex import build_wheel, mirror_env, serve

pytestmark = pytest.mark.integration
pytest.importorskip("rattler", reason="py-rattler (the embedded conda engine) is not installed")

SHELLS = [s for s in ("fish", "tcsh") if shutil.which(s)]
PY = f"{sys.version_info[0]}.{sys.version_info[1]}"
#: The recipe's value: quotes and what a shell would expand, if anything were left unquoted.
VALUE = 'it\'s $HOME `id` "set"'
#: Each shell reading no rc file, running a script file.
ARGV = {"fish": ["fish", "--no-config"], "tcsh": ["tcsh", "-f"]}

CONDA = """
schema_version = 1
[recipe]
name = "{name}"
[env]
kind = "conda"
prefix = "${{SCRATCH}}/envs/{{name}}"
[conda]
channels = ["conda-forge"]
packages = []
[python]
command = "python"
version = "{py}"
[torch]
install = false
[activate]
env = {{ CDEMO = {value} }}
[[packages]]
name = "ebshelldemo"
"""

USER_PREFIX = """
schema_version = 1
[recipe]
name = "{name}"
[env]
kind = "user-prefix"
installer = "pip"
prefix = "${{SCRATCH}}/envs/{{name}}"
[python]
command = "{python}"
[torch]
install = false
[activate]
env = {{ CDEMO = {value} }}
[[packages]]
name = "ebshelldemo"
"""


@pytest.fixture(scope="module")
def channel(tmp_path_factory):
    ch = tmp_path_factory.mktemp("conda-channel")
    python_package(ch)
    pip_package(ch)
    index(ch)
    return ch


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    d = tmp_path_factory.mktemp("shell-wheels")
    build_wheel(d, "ebshelldemo", "1.0", {"ebshelldemo/__init__.py": ""})
    with serve(d) as idx:
        yield idx


@pytest.fixture(scope="module")
def built(tmp_path_factory, channel, wheels):
    """One world with a conda env and a user-prefix env, each built once by the real CLI."""
    root = tmp_path_factory.mktemp("shells-world")
    world = UserWorld(root, f"{mirror_env(wheels)} conda-forge={channel}")
    value = json.dumps(VALUE)
    world.write_recipe("cshell", CONDA.format(name="cshell", py=PY, value=value))
    python = Path(sys.base_prefix) / "bin" / "python3"  # pip --user runs from the site python, not a venv
    world.write_recipe("ushell", USER_PREFIX.format(name="ushell", python=python, value=value))
    for name in ("cshell", "ushell"):
        ok(world.cli("create", name, "--no-validate"))
    return world


@pytest.mark.parametrize("name", ["cshell", "ushell"], ids=["conda", "user-prefix"])
@pytest.mark.parametrize("shell", SHELLS)
def test_the_activate_line_works_in_fish_and_tcsh(built, shell, name, tmp_path):
    world = built
    prefix = world.scratch / "envs" / name
    line = json.loads(ok(world.cli("activate", name, "--shell", shell, "--json")).stdout)["data"]["command"]
    # A user-prefix env runs the site python, which finds the env's packages through PYTHONUSERBASE.
    python = "python" if name == "cshell" else str(Path(sys.base_prefix) / "bin" / "python3")
    script = tmp_path / "run"
    script.write_text(
        f"{line}\n"
        f"{python} -c 'import ebshelldemo, sys; print(sys.prefix); print(ebshelldemo.__file__)'\n"
        "printenv CDEMO\n"
        "deactivate\n"
        "printenv CDEMO || echo unset\n"
    )
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    res = subprocess.run(
        [*ARGV[shell], str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    sys_prefix, module, during, after = res.stdout.splitlines()
    if name == "cshell":
        assert sys_prefix == str(prefix)
    assert module.startswith(str(prefix) + "/")
    assert during == VALUE and after == "unset"
    assert res.stderr == ""
