"""`envbuilder create` for real: uv/virtualenv/pip against a local HTTP index of wheels built here, real Lmod,
real bash; interrupted and concurrent creates; the env commands (list/show/activate/remove/modulefile)."""

from __future__ import annotations

import contextlib
import json
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import testwheels
from helpers import DATA, REPO, Paused, UserWorld, Watched, bash, lmod_vars, ok
from wheelindex import build_sdist, build_wheel, demo_wheels, mirror_env, serve

from envbuilder.backends import installers
from envbuilder.system import transaction

pytestmark = pytest.mark.integration

LMOD_INIT = Path("/usr/share/lmod/lmod/init/bash")
needs_lmod = pytest.mark.skipif(not LMOD_INIT.is_file(), reason="Lmod not installed (.ci/run installs it)")

#: A recipe with no torch: fast envs from the test wheels only.
SMALL = """
schema_version = 1
[recipe]
name = "{name}"
[env]
kind = "{kind}"
installer = "{installer}"
[python]
command = "{python}"
[torch]
install = false
[[packages]]
name = "ebdemo"
spec = "ebdemo==1.0"
{extra}
"""

SETUP_PY = """
import os
from setuptools import setup
os.makedirs("ebprobe", exist_ok=True)
with open("ebprobe/__init__.py", "w") as fh:
    fh.write("FLAG = %r\\n" % os.environ.get("EB_FLAG"))
setup(name="ebprobe", version="1.0", packages=["ebprobe"])
"""


@pytest.fixture(scope="module")
def wheels(tmp_path_factory, setuptools_wheel):
    d = tmp_path_factory.mktemp("files")
    demo_wheels(d)
    build_wheel(d, "ebslow", "1.0", {"ebslow/__init__.py": ""})
    build_sdist(d, "ebprobe", "1.0", SETUP_PY)
    (d / setuptools_wheel.name).write_bytes(setuptools_wheel.read_bytes())
    return d


@pytest.fixture(scope="module")
def setuptools_wheel(tmp_path_factory):
    d = tmp_path_factory.mktemp("setuptools")
    why = testwheels.missing()
    if why:
        pytest.skip(why)
    res = testwheels.fetch(d, "setuptools")
    found = sorted(d.glob("setuptools-*.whl"))
    if res.returncode != 0 or not found:
        pytest.skip(f"no setuptools wheel in {testwheels.CACHE} for the sdist test: {res.stderr[-300:]}")
    return found[0]


@pytest.fixture(scope="module")
def index(wheels):
    with serve(wheels) as idx:
        yield idx


class World(UserWorld):
    """A user's world: recipe dir, envbuilder home, uv cache, and a place for envs."""

    def __init__(self, root: Path, index) -> None:
        super().__init__(root, mirror_env(index), **lmod_vars())
        self.envs = root / "envs"
        self.index = index
        index.requested.clear()  # the index serves the whole module; each test watches its own requests

    def recipe(
        self, name="demo", *, kind="venv", installer="uv", python="python3", extra="", text=None
    ) -> str:
        body = text or SMALL.format(name=name, kind=kind, installer=installer, python=python, extra=extra)
        return self.write_recipe(name, body)

    def prefix(self, name="demo") -> Path:
        return self.envs / name

    def create(self, name="demo", *more: str, **env: str) -> subprocess.CompletedProcess[str]:
        return self.cli("create", name, "--prefix", str(self.prefix(name)), *more, **env)

    def leftovers(self, name="demo") -> list[str]:
        found = sorted(p.name for p in self.envs.glob(f".{name}.*")) if self.envs.exists() else []
        locks = (
            sorted(p.name for p in (self.home / "locks").glob("*")) if (self.home / "locks").exists() else []
        )
        return found + locks


@pytest.fixture
def world(tmp_path, index):
    return World(tmp_path, index)


# ---------------------------------------------------------------------------------------------------------------


def test_create_builds_records_and_activates(world):
    world.recipe()
    res = ok(world.create("demo", "--json"))
    data = json.loads(res.stdout)["data"]
    assert data["status"] == "created"
    prefix = world.prefix()
    names = {p["name"]: p for p in data["env"]["packages"] if p["in_env"]}
    assert names["ebdemo"]["version"] == "1.0" and names["ebdep"]["version"] == "2.0"
    assert all(p["record_sha256"] for p in names.values())
    assert names["ebdemo"]["size"] == len("VERSION = '1.0'\n") + sum(
        f.stat().st_size
        for f in next(prefix.glob("lib/python*/site-packages")).glob("ebdemo-1.0.dist-info/*")
        if f.name != "RECORD"
    )
    assert data["env"]["tools"]["installer"] == "uv"
    assert world.leftovers() == []
    # The log holds every command that ran.
    log = Path(data["log"]).read_text()
    assert "uv venv --relocatable" in log and "ebdemo==1.0" in log
    assert oct(Path(data["log"]).stat().st_mode & 0o777) == "0o600"
    # The record survives outside the prefix and the env is usable after activation.
    assert (world.home / "envs" / "demo.json").is_file()
    run = ok(
        bash(
            f"source {shlex.quote(str(prefix))}/bin/activate && python -c 'import ebdemo, ebdep, sys; print(sys.prefix)'",
            world.env,
        )
    )
    assert run.stdout.strip() == str(prefix)
    # Nothing world-writable.
    for p in [prefix, *prefix.rglob("*")]:
        if not p.is_symlink():
            assert not p.stat().st_mode & 0o002, p


def test_second_create_leaves_the_env_alone_and_force_replaces_it(world):
    world.recipe()
    ok(world.create())
    marker = world.prefix() / "marker"
    marker.write_text("old env")
    again = ok(world.create("demo", "--json"))
    assert json.loads(again.stdout)["data"]["status"] == "exists"
    assert marker.exists()
    forced = ok(world.create("demo", "--force", "--json"))
    assert json.loads(forced.stdout)["data"]["status"] == "replaced"
    assert not marker.exists()
    assert (world.prefix() / "bin" / "python").exists()
    assert world.leftovers() == []


def test_create_of_an_edited_recipe_says_what_changed_and_builds_nothing(world):
    """An env that exists is left alone (exit 0, nothing built), but an edit of its recipe since is not met
    with "nothing to do": the keys that differ, with the file that sets each, and that --force rebuilds."""
    world.recipe()
    ok(world.create())
    marker = world.prefix() / "marker"
    marker.write_text("old env")
    same = ok(world.create())
    assert "nothing to do" in same.stdout and "changed" not in same.stderr
    assert (
        world.data("create", "demo", "--prefix", str(world.prefix()))["recipe_edit"]["status"] == "unchanged"
    )
    edited = SMALL.format(name="demo", kind="venv", installer="uv", python="python3", extra="")
    edited = edited.replace("ebdemo==1.0", "ebdemo==2.0") + '[activate.env]\nEB_FLAG = "on"\n'
    world.recipe(text=edited)
    again = ok(world.create())
    recipe_file = str(world.recipes / "demo.toml")
    assert "nothing done" in again.stdout and "nothing to do" not in again.stdout
    assert "the recipe demo changed since demo was built: 2 key(s) differ" in again.stderr, again.stderr
    assert "`envbuilder create demo --force` rebuilds it" in again.stderr
    assert f'activate.env.EB_FLAG unset -> "on" ({recipe_file})' in again.stderr
    assert "ebdemo==2.0" in again.stderr
    res = ok(world.create("demo", "--json"))
    edit = json.loads(res.stdout)["data"]["recipe_edit"]
    assert edit["status"] == "changed" and edit["recorded_digest"] != edit["digest"]
    assert {c["key"]: (c["recorded"], c["now"], c["source"]) for c in edit["changes"]} == {
        "activate.env.EB_FLAG": (None, "on", recipe_file),
        "packages": (
            [{"name": "ebdemo", "spec": "ebdemo==1.0"}],
            [{"name": "ebdemo", "spec": "ebdemo==2.0"}],
            recipe_file,
        ),
    }
    assert "changed since demo was built" in res.stderr  # the note is on stderr under --json too
    assert marker.exists()  # nothing was rebuilt
    # A record without a digest (written by hand or by another tool): nothing to compare, and it says so.
    record = world.home / "envs" / "demo.json"
    data = json.loads(record.read_text())
    del data["recipe_digest"], data["recipe_values"]
    record.write_text(json.dumps(data))
    unknown = ok(world.create())
    assert "keeps no recipe digest: whether its recipe changed cannot be told" in unknown.stderr
    # A record from before the values were kept: it changed, but which keys cannot be told.
    record.write_text(json.dumps({**data, "recipe_digest": "0" * 64}))
    older = ok(world.create("demo", "--json"))
    assert json.loads(older.stdout)["data"]["recipe_edit"] == {
        "status": "changed",
        "recorded_digest": "0" * 64,
        "digest": edit["digest"],
        "changes": None,
    }
    assert "keeps no copy of the values to say which" in older.stderr
    assert marker.exists()


def test_existing_directory_that_is_not_an_env_is_refused(world):
    world.recipe()
    world.prefix().mkdir(parents=True)
    (world.prefix() / "thesis.tex").write_text("precious")
    res = world.create("demo", "--force")
    assert res.returncode == 9, res.stderr
    assert "is not an environment" in res.stderr
    assert (world.prefix() / "thesis.tex").read_text() == "precious"


def test_install_failure_leaves_nothing_and_names_the_command(world):
    world.recipe(extra='[[packages]]\nname = "does-not-exist-anywhere"\n')
    res = world.create()
    assert res.returncode == 11, res.stderr
    assert "does-not-exist-anywhere" in res.stderr
    assert "Traceback" not in res.stderr
    assert not world.prefix().exists()
    assert world.leftovers() == []


@pytest.mark.parametrize("installer", ["virtualenv", "pip"])
def test_fallback_installers_build_a_working_env_at_the_final_prefix(world, installer):
    world.recipe(installer=installer, extra='[[packages]]\nname = "ebtool"\n')
    res = ok(world.create("demo", "--json"))
    data = json.loads(res.stdout)["data"]
    assert data["env"]["tools"]["installer"] == installer
    prefix = world.prefix()
    # Console scripts and activate were written in the build directory and now point at the prefix.
    run = ok(bash(f"source {prefix}/bin/activate && ebtool && echo VENV=$VIRTUAL_ENV", world.env))
    assert f"ebtool from {prefix}" in run.stdout
    assert f"VENV={prefix}" in run.stdout
    assert ".partial-" not in (prefix / "bin" / "activate").read_text()


def test_installer_flag_overrides_the_recipe(world):
    world.recipe(installer="uv")
    data = json.loads(ok(world.create("demo", "--installer", "virtualenv", "--json")).stdout)["data"]
    assert data["env"]["tools"]["installer"] == "virtualenv"


def test_pip_installer_refuses_a_prefix_it_cannot_quote(world):
    world.recipe(installer="pip")
    res = world.cli("create", "demo", "--prefix", str(world.envs / "a $(touch pwned) b"))
    assert res.returncode == 7, res.stderr
    assert "use the uv installer" in res.stderr
    assert not (Path(REPO) / "pwned").exists()


def test_uv_builds_at_a_hostile_prefix_and_activation_round_trips(world):
    world.recipe()
    prefix = world.envs / "sp ace 'q' \"dq\" $(touch pwned) `x`"
    ok(world.cli("create", "demo", "--prefix", str(prefix)))
    # Non-interactive bash has no PS1, and every venv's own deactivate exports an empty one then: not ours.
    env = world.env
    before = ok(bash("env | sort", env)).stdout
    script = f"source {shlex.quote(str(prefix))}/bin/activate && python -c 'import ebdemo,sys; print(sys.prefix)' && deactivate && env | sort"
    run = ok(bash(script, env))
    first, _, after = run.stdout.partition("\n")
    assert first == str(prefix)

    def strip(text):
        return [line for line in text.splitlines() if not line.startswith("PS1=")]

    assert strip(after) == strip(before)
    assert not (world.root / "pwned").exists() and not (Path(REPO) / "pwned").exists()


def test_overlay_on_a_python_that_is_itself_a_venv_sees_the_parent_packages(world, tmp_path):
    uv = installers.uv_binary()
    parent = tmp_path / "parent"
    env = {**world.env}
    ok(
        subprocess.run(
            [uv, "venv", "-q", "--python", sys.executable, str(parent)],
            env=env,
            capture_output=True,
            text=True,
        )
    )
    ok(
        subprocess.run(
            [
                uv,
                "pip",
                "install",
                "-q",
                "--python",
                str(parent / "bin" / "python"),
                "--index-url",
                f"{world.index.url}/simple/",
                "ebtool",
                "ebdep",
            ],
            env=env,
            capture_output=True,
            text=True,
        )
    )
    world.recipe(kind="overlay", python=str(parent / "bin" / "python"))
    ok(world.create("demo", "--no-validate"))  # no torch anywhere here; the next test covers that
    py = world.prefix() / "bin" / "python"
    run = ok(
        subprocess.run(
            [str(py), "-c", "import ebtool, ebdep, ebdemo; print(ebtool.__file__); print(ebdemo.__file__)"],
            capture_output=True,
            text=True,
        )
    )
    tool_file, demo_file = run.stdout.split()
    assert tool_file.startswith(str(parent))  # from the parent venv, through the .pth
    assert demo_file.startswith(str(world.prefix()))  # the env's own package


def test_overlay_whose_site_python_has_no_torch_fails_its_smoke_check(world):
    world.recipe(kind="overlay")
    res = world.create("demo", "--json")
    assert res.returncode == 8, res.stderr
    assert "smoke check failed: import" in res.stderr
    data = json.loads(res.stdout)["data"]
    assert data["env"]["validation"]["checks"]["import"]["status"] == "fail"
    assert "torch" in data["env"]["validation"]["checks"]["import"]["cause"]
    # The env is built and recorded (its packages are fine); the user is told what is missing.
    assert (world.prefix() / "bin" / "python").exists()
    shown = json.loads(ok(world.cli("show", "demo", "--json")).stdout)["data"]
    assert shown["validation"]["checks"]["import"]["status"] == "fail"


@needs_lmod
def test_modules_are_applied_for_the_build_and_per_package_build_env_is_expanded(world):
    extra = """
[[packages]]
name = "setuptools"
[[packages]]
name = "ebprobe"
spec = "ebprobe==1.0"
no_build_isolation = true
build_modules = ["cmake/3.25.2"]
build_env = { EB_FLAG = "cmake=${CMAKE_VERSION}" }
"""
    text = SMALL.format(name="demo", kind="venv", installer="uv", python="python3", extra=extra)
    text = text.replace(
        "[python]",
        f'[modules]\nsystem = "lmod"\nuse = ["{DATA}/modules/site"]\nload = ["gcc/13.2.0"]\n\n[python]',
    )
    world.recipe(text=text)
    data = json.loads(ok(world.create("demo", "--json")).stdout)["data"]
    delta = data["env"]["modules"]["delta_set"]
    assert delta["GCC_VERSION"] == "13.2.0"
    assert delta["PATH"].startswith("/opt/fake/gcc-13.2.0/bin:")
    assert "CMAKE_VERSION" not in delta  # a build module of one package only, not of the env
    py = world.prefix() / "bin" / "python"
    run = ok(
        subprocess.run([str(py), "-c", "import ebprobe; print(ebprobe.FLAG)"], capture_output=True, text=True)
    )
    assert run.stdout.strip() == "cmake=3.25.2"


# uv from the loopback index is left out: that index sends no caching headers, so uv fetches the sdist again and
# builds it again anyway (PyPI's headers let uv keep it; a wheelhouse's unchanged file does too).
@pytest.mark.parametrize(
    ("installer", "source"), [("uv", "wheelhouse"), ("pip", "index"), ("pip", "wheelhouse")]
)
def test_a_package_with_its_own_build_settings_is_built_again_for_each_env(world, wheels, installer, source):
    """Two envs build ebprobe (an sdist) with their own build_env, one installer cache between them (the user's):
    the second env gets a build made with its value, not the wheel the cache kept from the first env's build."""
    if source == "wheelhouse":
        world.env["ENVBUILDER_INDEX_MIRROR"] = f"pypi={wheels}"
    for name, flag in (("first", "one"), ("second", "two")):
        extra = (
            f'[[packages]]\nname = "ebprobe"\nspec = "ebprobe==1.0"\nbuild_env = {{ EB_FLAG = "{flag}" }}\n'
        )
        world.recipe(name, installer=installer, extra=extra)
        ok(world.create(name))
        py = world.prefix(name) / "bin" / "python"
        run = ok(subprocess.run([str(py), "-c", "import ebprobe; print(ebprobe.FLAG)"], capture_output=True,
                                text=True))  # fmt: skip
        assert run.stdout.strip() == flag, name


@needs_lmod
def test_unknown_module_fails_with_spider_hint_and_leaves_nothing(world):
    text = SMALL.format(name="demo", kind="venv", installer="uv", python="python3", extra="")
    text = text.replace(
        "[python]",
        f'[modules]\nsystem = "lmod"\nuse = ["{DATA}/modules/site"]\nload = ["gcc/99.9"]\n\n[python]',
    )
    world.recipe(text=text)
    res = world.create()
    assert res.returncode == 6, res.stderr
    assert "module spider gcc" in res.stderr
    assert not world.prefix().exists() and world.leftovers() == []


def test_build_env_variable_missing_from_modules_is_a_clear_error(world):
    extra = '[[packages]]\nname = "ebdep"\nbuild_env = { X = "${NOT_SET_BY_ANY_MODULE}/lib" }\n'
    world.recipe(extra=extra)
    res = world.create()
    assert res.returncode == 7, res.stderr
    assert "NOT_SET_BY_ANY_MODULE" in res.stderr
    assert world.leftovers() == [] and not world.prefix().exists()


# ---------------------------------------------------------------------------------------------------------------
# Interrupted and concurrent creates


def _wait_for(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("point", ["env-created", "downloading"])
def test_interrupted_create_leaves_no_half_env_and_reruns_cleanly(world, sig, point):
    world.recipe(extra='[[packages]]\nname = "ebslow"\n')
    gate = world.index.hold("ebslow") if point == "downloading" else None
    proc = world.spawn("create", "demo", "--prefix", str(world.prefix()))
    try:
        if point == "env-created":
            hit = _wait_for(
                lambda: any(world.envs.glob(".demo.partial-*/pyvenv.cfg")) if world.envs.exists() else False
            )
        else:
            hit = _wait_for(lambda: any(r.startswith("GET /files/ebslow") for r in world.index.requested))
        assert hit, "the create never reached the point to interrupt"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if gate is not None:
            gate.set()
            world.index.gate.clear()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    if sig == signal.SIGKILL:
        assert proc.returncode == -signal.SIGKILL
    else:
        assert proc.returncode == 130, err
        assert "Traceback" not in err
        assert world.leftovers() == []  # cleaned up on the way out
    assert not world.prefix().exists()
    # The next run breaks the stale mutex, removes the partial build and succeeds.
    ok(world.create())
    assert world.leftovers() == []
    assert (world.prefix() / "bin" / "python").exists()


def test_a_force_interrupted_between_its_renames_is_repaired(world, tmp_path):
    final = tmp_path / "env"
    (tmp_path / ".env.old-123").mkdir()
    (tmp_path / ".env.old-123" / "pyvenv.cfg").write_text("home = /x\n")
    (tmp_path / ".env.partial-123").mkdir()
    notes = transaction.recover(final)
    assert (final / "pyvenv.cfg").exists()
    assert not list(tmp_path.glob(".env.*"))
    assert any("restored the previous env" in n for n in notes)


def test_concurrent_creates_of_one_env_build_it_once(world):
    world.recipe(extra='[[packages]]\nname = "ebslow"\n')
    gate = world.index.hold("ebslow")
    procs = [world.spawn("create", "demo", "--prefix", str(world.prefix()), "--json") for _ in range(3)]
    with contextlib.ExitStack() as stack:
        watched = [stack.enter_context(Watched(p)) for p in procs]
        try:
            assert _wait_for(lambda: any(r.startswith("GET /files/ebslow") for r in world.index.requested))
            # The other two say that they wait at the env's mutex (however long their start took here).
            assert _wait_for(lambda: sum("; waiting" in w.err for w in watched) == 2, timeout=240), [
                w.err for w in watched
            ]
            gate.set()
            outs = [w.communicate(timeout=120) for w in watched]
        finally:
            gate.set()
            world.index.gate.clear()
    assert [p.returncode for p in procs] == [0, 0, 0], [o[1] for o in outs]
    statuses = sorted(json.loads(o[0])["data"]["status"] for o in outs)
    assert statuses == ["created", "exists", "exists"]
    assert sum("waiting" in o[1] for o in outs) == 2
    assert world.leftovers() == []


def test_no_wait_fails_clearly_while_another_create_holds_the_env(world):
    world.recipe(extra='[[packages]]\nname = "ebslow"\n')
    gate = world.index.hold("ebslow")
    first = world.spawn("create", "demo", "--prefix", str(world.prefix()))
    try:
        assert _wait_for(lambda: any(r.startswith("GET /files/ebslow") for r in world.index.requested))
        second = world.create("demo", "--wait", "0")
        assert second.returncode == 9, second.stderr
        assert f"process {first.pid}" in second.stderr
    finally:
        gate.set()
        world.index.gate.clear()
        first.communicate(timeout=120)
    assert first.returncode == 0


# ---------------------------------------------------------------------------------------------------------------
# list / show / activate / remove / modulefile


def test_env_commands_round_trip(world):
    world.recipe()
    ok(world.create())
    rows = json.loads(ok(world.cli("list", "--json")).stdout)["data"]
    assert [(r["name"], r["health"]["status"]) for r in rows] == [("demo", "ok")]
    shown = json.loads(ok(world.cli("show", "demo", "--json")).stdout)["data"]
    assert shown["prefix"] == str(world.prefix())
    line = ok(world.cli("activate", "demo")).stdout.strip()
    assert line == f"source {shlex.quote(str(world.prefix() / 'bin' / 'activate'))}"
    assert ok(bash(f"{line} && python -c 'import ebdemo'", world.env))
    # fish's line with --shell, tcsh's from $SHELL; each works in its shell.
    fish = ok(world.cli("activate", "demo", "--shell", "fish")).stdout.strip()
    tcsh = ok(world.cli("activate", "demo", SHELL="/bin/tcsh")).stdout.strip()
    assert fish.endswith("/bin/activate.fish'") and tcsh.endswith("/bin/activate.csh'")
    for shell, flags, line in (("fish", "--no-config", fish), ("tcsh", "-f", tcsh)):
        if shutil.which(shell):
            res = subprocess.run([shell, flags, "-c", f"{line}; python -c 'import ebdemo'"], env=world.env)
            assert res.returncode == 0, shell

    # A purge that took some files: damaged, named.
    victim = next(world.prefix().glob("lib/python*/site-packages/ebdep/__init__.py"))
    victim.unlink()
    rows = json.loads(ok(world.cli("list", "--json")).stdout)["data"]
    assert rows[0]["health"]["status"] == "damaged"
    assert any("ebdep/__init__.py" in m for m in rows[0]["health"]["missing"])

    refused = world.cli("remove", "demo")
    assert refused.returncode == 2 and "--yes" in refused.stderr
    ok(world.cli("remove", "demo", "--yes"))
    assert not world.prefix().exists()
    assert json.loads(ok(world.cli("list", "--json")).stdout)["data"] == []
    gone = world.cli("show", "demo")
    assert gone.returncode == 9 and "envbuilder list" in gone.stderr


def test_gone_env_is_reported(world):
    world.recipe()
    ok(world.create())
    import shutil

    shutil.rmtree(world.prefix())
    rows = json.loads(ok(world.cli("list", "--json")).stdout)["data"]
    assert rows[0]["health"]["status"] == "gone"


@needs_lmod
def test_modulefile_loads_the_env_with_real_lmod(world):
    text = SMALL.format(name="demo", kind="venv", installer="uv", python="python3", extra="")
    text = text.replace(
        "[python]",
        f'[modules]\nsystem = "lmod"\nuse = ["{DATA}/modules/site"]\nload = ["gcc/13.2.0"]\n\n'
        '[activate]\nmodules = ["gcc/13.2.0"]\nenv = { OMP_NUM_THREADS = "8" }\n\n[python]',
    )
    world.recipe(text=text)
    ok(world.create())
    mdir = world.root / "modulefiles"
    mdir.mkdir()
    ok(world.cli("modulefile", "demo", "-o", str(mdir)))
    env = {**world.env, "MODULEPATH": str(DATA / "modules" / "site")}
    script = (
        f"source {LMOD_INIT}; module use {shlex.quote(str(mdir))}; module load demo; "
        "python -c 'import ebdemo, sys; print(sys.prefix)'; echo OMP=$OMP_NUM_THREADS; module -t list 2>&1; "
        "module unload demo; echo AFTER=${OMP_NUM_THREADS:-unset}; module -t list 2>&1"
    )
    run = ok(bash(script, env))
    assert str(world.prefix()) in run.stdout
    assert "OMP=8" in run.stdout and "AFTER=unset" in run.stdout
    loaded, _, after = run.stdout.partition("AFTER=")
    assert "gcc/13.2.0" in loaded and "gcc" not in after


def test_tcl_modulefile_loads_the_env_with_environment_modules(world, envmodules_init):
    text = SMALL.format(name="demo", kind="venv", installer="uv", python="python3", extra="")
    text = text.replace(
        "[python]", '[activate]\nmodules = ["cmake/3.25.2"]\nenv = { OMP_NUM_THREADS = "8" }\n\n[python]'
    )
    world.recipe(text=text)
    ok(world.create())
    mdir = world.root / "modulefiles"
    mdir.mkdir()
    said = ok(world.cli("modulefile", "demo", "--format", "tcl", "-o", str(mdir))).stdout
    assert "`module load demo`" in said  # Environment Modules takes the file's name as it is: no .lua
    assert (mdir / "demo").read_text().startswith("#%Module")
    env = {**world.env, "MODULEPATH": str(DATA / "modules" / "site")}
    script = (
        f"source {envmodules_init / 'bash'}; module use {shlex.quote(str(mdir))}; module load demo; "
        "python -c 'import ebdemo, sys; print(sys.prefix)'; echo OMP=$OMP_NUM_THREADS CMAKE=$CMAKE_VERSION; "
        "module unload demo; echo AFTER=${OMP_NUM_THREADS:-unset} ${CMAKE_VERSION:-unset} ${VIRTUAL_ENV:-unset}"
    )
    run = ok(bash(script, env))
    assert str(world.prefix()) in run.stdout
    assert "OMP=8 CMAKE=3.25.2" in run.stdout
    assert "AFTER=unset unset unset" in run.stdout


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_user_prefix_env_works_through_pythonuserbase(world, installer):
    # The site python itself (a user-prefix env is not a venv; pip --user refuses to run inside one).
    base_python = str(Path(sys.base_prefix) / "bin" / "python3")
    world.recipe(
        kind="user-prefix", installer=installer, python=base_python, extra='[[packages]]\nname = "ebtool"\n'
    )
    data = json.loads(ok(world.create("demo", "--json")).stdout)["data"]
    in_env = sorted(p["name"] for p in data["env"]["packages"] if p["in_env"])
    assert in_env == ["ebdemo", "ebdep", "ebtool"]
    prefix = world.prefix()
    env = {**world.env, "PYTHONUSERBASE": "/before"}
    script = (
        f"before=$(env | sort); source {shlex.quote(str(prefix))}/bin/activate && "
        f"{base_python} -c 'import ebdemo; print(ebdemo.__file__)' && ebtool && echo UB=$PYTHONUSERBASE && "
        'deactivate && [ "$(env | sort)" = "$before" ] && echo RESTORED'
    )
    run = ok(bash(script, env))
    assert str(prefix) in run.stdout.splitlines()[0]
    assert f"UB={prefix}" in run.stdout
    assert run.stdout.strip().endswith("RESTORED")
    assert world.leftovers() == []


@needs_lmod
def test_a_package_with_build_modules_keeps_the_installer_settings(world):
    # The step's own module environment must still carry PYTHONUSERBASE (and pip's settings): without them
    # pip --user would install into the user's real ~/.local.
    base_python = str(Path(sys.base_prefix) / "bin" / "python3")
    extra = '[[packages]]\nname = "ebtool"\nbuild_modules = ["cmake/3.25.2"]\n'
    text = SMALL.format(name="demo", kind="user-prefix", installer="pip", python=base_python, extra=extra)
    text = text.replace("[python]", f'[modules]\nsystem = "lmod"\nuse = ["{DATA}/modules/site"]\n\n[python]')
    world.recipe(text=text)
    data = json.loads(ok(world.create("demo", "--json")).stdout)["data"]
    in_env = sorted(p["name"] for p in data["env"]["packages"] if p["in_env"])
    assert in_env == ["ebdemo", "ebdep", "ebtool"]
    assert not (Path(world.env["HOME"]) / ".local").exists()


# --- torch imported once per create; --force removes the old env after the swap (issue 36) ----------------------


def _payload_runs(world, log: str) -> tuple[int, int]:
    """How often a create ran the payload (an import of torch): smoke checks in its build log, validation runs in
    the env."""
    smokes = sum("payloads/validate.py" in line for line in Path(log).read_text().splitlines())
    return smokes, len(list((world.prefix() / "envbuilder" / "validation").glob("run-*")))


def test_a_validation_after_create_whose_import_fails_ends_as_its_smoke_check_did(world):
    # An overlay: the validation (and the smoke check) import torch from the site python, which has none here.
    world.recipe(kind="overlay")
    res = world.create("demo", "--json")
    assert res.returncode == 8, res.stderr
    data = json.loads(res.stdout)["data"]
    # The validation ran first, in place of the smoke check; its import failed (its launcher could not even
    # start), so the smoke check ran after it to say why, and the create ends as when it failed first.
    assert _payload_runs(world, data["log"]) == (1, 1)
    assert data["validation"]["checks"]["import"]["status"] == "fail"
    assert data["env"]["validation"]["kind"] == "smoke"
    assert "torch" in data["env"]["validation"]["checks"]["import"]["cause"]
    assert "smoke check failed: import" in res.stderr and "Traceback" not in res.stderr


def test_where_the_validation_cannot_run_here_create_runs_the_smoke_check(world):
    # An env for GPU nodes, built on this host without GPUs: the validation cannot run here, the smoke check does.
    gpus = '[compute]\ngpus_per_node = 2\ngpu = "NVIDIA H100"\ncompute_capability = "9.0"\n'
    world.recipe(kind="overlay", extra=gpus)
    res = world.create("demo")
    assert res.returncode == 8, res.stderr
    said = res.stdout + res.stderr
    assert "has no GPU; the env is for 2× NVIDIA H100" in said
    assert "smoke check failed: import" in said and "Traceback" not in said
    (log,) = (world.home / "logs").glob("demo-*.log")
    assert _payload_runs(world, str(log)) == (1, 0)
    shown = json.loads(ok(world.cli("show", "demo", "--json")).stdout)["data"]
    assert shown["validation"]["kind"] == "smoke"


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_force_removes_the_old_env_after_the_swap_and_a_stopped_removal_is_swept(world, sig):
    world.recipe(kind="overlay")
    ok(world.create("demo", "--no-validate"))
    (world.prefix() / "marker").write_text("old env")
    record = world.home / "envs" / "demo.json"
    assert json.loads(record.read_text())["validation"] is None
    # Its removal stopped for good at its start (the test hook), so that it can be caught while it runs.
    proc = world.spawn(
        "create",
        "demo",
        "--prefix",
        str(world.prefix()),
        "--force",
        extra={transaction.PAUSE_VAR: "removing-old"},
        stdout=subprocess.DEVNULL,
    )
    with Paused(proc, "removing-old") as paused:
        # The new env is in place and recorded, and its checks ran (their report is in the record) while the old
        # env, moved aside, was still being removed: the removal is off the critical path.
        def validated() -> bool:
            return json.loads(record.read_text()).get("validation") is not None

        paused.wait(timeout=120)
        assert _wait_for(validated, timeout=120), proc.poll()
        aside = list(world.envs.glob(".demo.old-*"))
        assert len(aside) == 1 and (aside[0] / "marker").read_text() == "old env"
        assert not (world.prefix() / "marker").exists()
        assert proc.poll() is None  # it waits for the removal before it ends
        err = paused.stop(sig)
    assert f"{transaction.PAUSE_VAR}: paused removing-old" in err
    assert proc.returncode == (-signal.SIGKILL if sig == signal.SIGKILL else 130), err
    assert "Traceback" not in err
    assert [p.name for p in world.envs.glob(".demo.*")] == [aside[0].name]  # left for the next run
    # The next run for the env sweeps what the stopped removal left, and leaves the new env alone.
    again = ok(world.create("demo", "--force", "--no-validate", "--json"))
    notes = json.loads(again.stdout)["data"]["notes"]
    assert any(f"removed {aside[0].name}, the env a finished --force replaced" in n for n in notes), notes
    assert world.leftovers() == []
    assert (world.prefix() / "bin" / "python").exists()
