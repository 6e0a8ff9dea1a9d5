"""The registry of names (``core.kinds``: one source of kind, installer and engine names), the backends and
installers that carry those names, and the backend protocol's dispatch: each
kind gets its backend, and a backend builds with the installer it is handed (real uv, offline)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from wheelindex import build_wheel

from envbuilder import cli
from envbuilder.backends import base, buildlog, conda, container, installers, lookup, venv
from envbuilder.cli import parser as cliparser
from envbuilder.core import kinds, settings
from envbuilder.core.errors import EXIT_USAGE
from envbuilder.plan import installers as commands
from envbuilder.plan.steps import InstallStep
from envbuilder.recipe import schemajson
from envbuilder.system import proc

#: Prints the envbuilder.backends modules that importing core.kinds loads.
_LOADED_BY_KINDS = "import sys, envbuilder.core.kinds; print(*sorted(m for m in sys.modules if m.startswith('envbuilder.backends')))"
PLANNED = "/scratch/u1/envs/t"  # the prefix the plan's commands name; the build happens elsewhere


def test_every_kind_and_overlay_way_has_its_backend():
    expected = {
        "venv": venv.VenvBackend,
        "overlay": venv.VenvBackend,
        "user-prefix": venv.UserPrefixBackend,
        "conda": conda.CondaBackend,
        "container": container.ContainerBackend,
    }
    assert {kind: lookup.backend(kind) for kind in kinds.KINDS} == expected
    assert lookup.backend("overlay", "clone") is conda.CloneBackend
    assert lookup.backend("overlay", "venv") is venv.VenvBackend
    assert all(issubclass(cls, base.Backend) for cls in expected.values())


def test_the_names_in_core_kinds_are_the_names_of_the_classes_that_build(tmp_path):
    # core.kinds names installers and backends without importing them; each name must reach its class: the
    # plan's (command lines) and create's (found here), which adds the machine to the plan's of the same name.
    assert tuple(commands.INSTALLERS) == tuple(installers.INSTALLERS) == kinds.INSTALLER_NAMES
    assert all(i.name == name for name, i in commands.INSTALLERS.items())
    assert all(isinstance(i, type(commands.INSTALLERS[name])) for name, i in installers.INSTALLERS.items())
    assert {i.fallback for i in commands.INSTALLERS.values()} - {None} <= set(kinds.INSTALLER_NAMES)
    named = {*(k.backend for k in kinds.KINDS.values()), *kinds.OVERLAYS.values()}
    modules = {"venv": venv, "conda": conda, "container": container}
    assert all(issubclass(getattr(modules[module], cls), base.Backend) for module, cls in named)
    # core.kinds stays below the backends: importing it alone loads none of them.
    out = proc.run([sys.executable, "-c", _LOADED_BY_KINDS], env=dict(os.environ), cwd=str(tmp_path)).stdout
    assert out.split() == []


def test_the_schema_and_the_cli_offer_the_registrys_names(capsys):
    props = schemajson.json_schema()["properties"]
    assert props["env"]["properties"]["kind"]["enum"] == list(kinds.KINDS)
    assert props["env"]["properties"]["installer"]["enum"] == list(kinds.INSTALLER_NAMES)
    assert props["env"]["properties"]["overlay"]["enum"] == list(kinds.OVERLAYS)
    assert props["conda"]["properties"]["engine"]["enum"] == list(kinds.ENGINES)
    assert (
        cliparser.build_parser().parse_args(["create", "x", "--installer", "virtualenv"]).installer
        == "virtualenv"
    )
    assert cli.main(["create", "x", "--installer", "conda"]) == EXIT_USAGE
    assert "invalid choice: 'conda' (choose from 'uv', 'virtualenv', 'pip')" in capsys.readouterr().err


def test_each_installer_writes_its_own_command_lines():
    prompt, ssp = ["--prompt", "t"], ["--system-site-packages"]
    uv, virtualenv, pip = (commands.INSTALLERS[n] for n in ("uv", "virtualenv", "pip"))
    assert uv.venv(prompt, "python3", ssp, PLANNED) == [
        "uv", "venv", "--relocatable", "--prompt", "t", "--python", "python3", "--system-site-packages", PLANNED,
    ]  # fmt: skip
    assert virtualenv.venv(prompt, "python3", ssp, PLANNED) == [
        "virtualenv", "--prompt", "t", "--python", "python3", "--system-site-packages", PLANNED,
    ]  # fmt: skip
    assert pip.venv(prompt, "python3", (), PLANNED) == ["python3", "-m", "venv", "--prompt", "t", PLANNED]
    assert uv.pip("py", uv.user_target(PLANNED)) == [
        "uv",
        "pip",
        "install",
        "--python",
        "py",
        "--prefix",
        PLANNED,
    ]
    assert virtualenv.pip("py", virtualenv.user_target(PLANNED)) == ["py", "-m", "pip", "install", "--user"]
    assert [i.relocatable for i in commands.INSTALLERS.values()] == [True, False, False]


def test_conda_and_user_prefix_backends_say_where_their_python_and_settings_come_from(tmp_path):
    final, partial = tmp_path / "env", tmp_path / ".env.partial-1"
    env = {"SCRATCH": str(tmp_path / "scratch"), "PATH": os.environ["PATH"]}
    condas = lookup.backend("conda")()
    assert condas.python("python3", env, final) == str(final / "bin" / "python")  # the env's own
    assert condas.own_env(partial, env) == {
        settings.CONDA_CACHE_VAR: str(tmp_path / "scratch/envbuilder/conda-pkgs")
    }
    user = lookup.backend("user-prefix")()
    assert user.python(sys.executable, env, final) == sys.executable  # the site's
    assert user.own_env(partial, env) == {"PYTHONUSERBASE": str(partial)}
    assert user.needs_parent() and not lookup.backend("venv")().needs_parent()


def _build(tmp_path: Path, name: str) -> base.Build:
    choice = installers.choose(name, str(tmp_path / "env"), "test")
    env = {**proc.scrubbed_env(os.environ), "UV_CACHE_DIR": str(tmp_path / "uv-cache")}
    tool_env, _ = choice.installer.settings(tmp_path / "env", env)
    return base.Build(
        PLANNED,
        tmp_path / "env",
        tmp_path / ".env.partial-1",
        choice.installer,
        choice.program,
        sys.executable,
        env,
        {**env, **tool_env},
        tool_env,
        buildlog.BuildLog(tmp_path / "build.log"),
    )


@pytest.mark.integration
def test_the_venv_backend_builds_beside_with_the_installer_it_is_handed(tmp_path):
    build = _build(tmp_path, "uv")
    backend = lookup.backend("venv")()
    step = InstallStep(
        tuple(build.installer.venv(["--prompt", "t"], "python3", [], PLANNED)),
        site_python=True,
        creates_env=True,
    )
    try:
        # The plan's prefix becomes the partial, and python3 the python found; uv itself, the one found.
        backend.create(build, step, build.env)
        assert (build.partial / "pyvenv.cfg").is_file()
        wheel = build_wheel(tmp_path / "wheels", "demo-pkg", "1.0", {"demo_pkg.py": "X = 1\n"})
        backend.install_files(build, [str(wheel)])  # offline, from the file alone
        [demo] = [p for p in backend.inventory(build) if p["name"] == "demo-pkg"]
        assert (demo["version"], demo["installer"]) == ("1.0", "uv")
        tools = backend.tools(build)
    finally:
        build.log.close()
    assert (tools["installer"], tools["python_path"]) == ("uv", sys.executable)
    assert tools["python"] == "{}.{}.{}".format(*sys.version_info[:3])
    assert tools["uv"][0].isdigit()


@pytest.mark.parametrize("name", ["uv", "pip"])
def test_moving_in_rewrites_the_build_path_only_where_the_installer_wrote_it(tmp_path, name):
    build = _build(tmp_path, name)
    (build.partial / "bin").mkdir(parents=True)
    (build.partial / "bin" / "activate").write_text(f"VIRTUAL_ENV='{build.partial}'\n")
    try:
        lookup.backend("venv")().move_in(build)
    finally:
        build.log.close()
    moved = f"VIRTUAL_ENV='{build.final}'\n"
    assert ((build.partial / "bin" / "activate").read_text() == moved) == (name == "pip")


def test_the_build_log_says_how_long_each_command_took(tmp_path):
    """A create's time is read phase by phase from its build log: a streamed command ends with its time, and so
    does a command logged whole (the smoke check) where it was timed."""
    log = buildlog.BuildLog(tmp_path / "build.log")
    res = proc.run([sys.executable, "-c", "print('ok')"])
    log.command(res.argv, {}, res, seconds=3.25)
    log.command(res.argv, {}, res)
    buildlog.run_logged([sys.executable, "-c", "pass"], dict(os.environ), log)
    log.close()
    lines = (tmp_path / "build.log").read_text().splitlines()
    timed = [line for line in lines if "(exit 0" in line]
    assert timed[0].endswith("(exit 0, 3.2 s)") and timed[1].endswith("(exit 0)"), lines
    assert timed[2].split("] ", 1)[1].startswith("(exit 0, ") and timed[2].endswith(" s)"), lines


@pytest.mark.parametrize(
    ("env", "cpus", "imports_next", "compiles", "why"),
    [
        ({}, 2, True, False, "2 usable CPUs; fewer than 8"),
        ({}, 8, True, True, "8 usable CPUs; at least 8"),
        ({}, 64, False, False, "nothing imports the env in this command"),
        ({"ENVBUILDER_COMPILE_BYTECODE": "1"}, 2, False, True, "ENVBUILDER_COMPILE_BYTECODE=1"),
        ({"ENVBUILDER_COMPILE_BYTECODE": "0"}, 64, True, False, "ENVBUILDER_COMPILE_BYTECODE=0"),
        ({"ENVBUILDER_COMPILE_BYTECODE": "yes"}, 2, True, False, "2 usable CPUs"),  # not 0 or 1: the rule
    ],
)
def test_uv_compiles_the_bytecode_at_install_where_cpus_are_many(env, cpus, imports_next, compiles, why):
    """Compiling all of torch costs about a second on a node's many CPUs and more than it saves on a few, and
    nothing for a command that imports nothing after its install (--no-validate); the build log says which and
    why."""
    decided, said = settings.compiles_at_install(env, cpus, imports_next)
    assert decided is compiles
    assert said.startswith(f"bytecode at install: {'yes' if compiles else 'no'} (") and why in said


def test_usable_cpus_are_this_process_affinity():
    """A job step's share of a node, not the node's count (os.cpu_count)."""
    from envbuilder.system import host

    assert host.usable_cpus() == len(os.sched_getaffinity(0))
    child = subprocess.run(
        [
            "taskset",
            "-c",
            "0",
            sys.executable,
            "-c",
            "from envbuilder.system import host; print(host.usable_cpus())",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert child.stdout.strip() == "1"
