"""python.source = "managed" for real (issue 37 item 7): the real uv installs a CPython from a loopback stand-in
of python-build-standalone's download index (tests/standinpython.py: the real archive where its host was reachable
when the machine was prepared, else one made here; uv's mirror setting sends the download to loopback either
way) into the envbuilder home, and `envbuilder create` makes the env from it; restore installs it again where it
is gone; offline without a mirror, and on a site that forbids managed Pythons, the refusals are clear."""

from __future__ import annotations

import functools
import http.server
import json
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import standinpython
from helpers import UserWorld, ok
from wheelindex import build_wheel, mirror_env, serve

pytestmark = pytest.mark.integration

EXIT_RECIPE, EXIT_BACKEND = 3, 7
RECIPE = """schema_version = 1
[recipe]
name = "{name}"
[env]
kind = "venv"
installer = "{installer}"
[python]
version = "{version}"
source = "managed"
[torch]
install = false
[[packages]]
name = "ebmanaged"
spec = "ebmanaged==1.0"
"""
SHOW = (
    "import ebmanaged, json, sys; print(json.dumps([sys.base_prefix, sys.version.split()[0], ebmanaged.WHO]))"
)


class Downloads:
    """A loopback server of the download tree: ``<release>/<file>`` and the downloads list."""

    def __init__(self, root: Path) -> None:
        self.requested: list[str] = []
        seen = self.requested

        class Handler(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                seen.append(self.path)

        handler = functools.partial(Handler, directory=str(root))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def archives(self) -> list[str]:
        return [r for r in self.requested if ".tar." in r]


@pytest.fixture(scope="module")
def downloads() -> Iterator[tuple[Downloads, dict]]:
    manifest, why = standinpython.load()
    if manifest is None:
        pytest.skip(why)
    server = Downloads(standinpython.DIR)
    yield server, manifest
    server.server.shutdown()
    server.server.server_close()


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    d = tmp_path_factory.mktemp("files")
    build_wheel(d, "ebmanaged", "1.0", {"ebmanaged/__init__.py": "WHO = 'ebmanaged 1.0'\n"})
    with serve(d) as idx:
        yield idx


class World(UserWorld):
    def __init__(self, root: Path, index, downloads: Downloads, manifest: dict) -> None:
        super().__init__(root, mirror_env(index))
        self.downloads = downloads
        self.version = manifest["version"]
        self.mirror = {"ENVBUILDER_PYTHON_MIRROR": downloads.url}
        if manifest["listing"]:
            self.mirror["ENVBUILDER_PYTHON_DOWNLOADS"] = f"{downloads.url}/{manifest['listing']}"
        downloads.requested.clear()

    @property
    def minor(self) -> str:
        return ".".join(self.version.split(".")[:2])

    def recipe(self, name: str = "mp", installer: str = "uv") -> str:
        return self.write_recipe(name, RECIPE.format(name=name, version=self.minor, installer=installer))

    def prefix(self, name: str = "mp") -> Path:
        return self.root / "envs" / name

    def create(self, name: str = "mp", *more: str, **env: str) -> subprocess.CompletedProcess[str]:
        return self.cli("create", name, "--prefix", str(self.prefix(name)), *more, **env)

    @property
    def pythons(self) -> Path:
        return self.home / "pythons"

    def shown(self, name: str = "mp") -> list[str]:
        python = self.prefix(name) / "bin" / "python"
        res = subprocess.run(
            [str(python), "-c", SHOW], capture_output=True, text=True, env={"PATH": "/usr/bin"}
        )
        assert res.returncode == 0, res.stderr
        return list(json.loads(res.stdout))


@pytest.fixture
def world(tmp_path, index, downloads):
    server, manifest = downloads
    return World(tmp_path, index, server, manifest)


def test_create_makes_the_env_from_a_managed_cpython_downloaded_from_the_mirror(world):
    w = world
    w.recipe()
    planned = w.data("plan", "mp", **w.mirror)["python"]
    assert planned["origin"] == "managed" and planned["managed"]["dir"] == str(w.pythons)
    assert planned["managed"]["mirror"] == w.downloads.url
    text = ok(w.cli("plan", "mp", COLUMNS="250", **w.mirror)).stdout
    assert (
        f"python from: uv-managed CPython {w.minor} in {w.pythons}; create installs it where missing, "
        f"downloading from {w.downloads.url} (ENVBUILDER_PYTHON_MIRROR)"
    ) in text
    assert f"--python cpython@{w.minor} " in text
    data = w.data("create", "mp", "--prefix", str(w.prefix()), **w.mirror)
    assert len(w.downloads.archives()) == 1  # the archive came from the loopback mirror, once
    # The env's python is the managed one: its base is under the home's pythons, at the version downloaded.
    base, version, who = w.shown()
    assert Path(base).resolve().is_relative_to(w.pythons.resolve()) and version == w.version
    assert who == "ebmanaged 1.0"
    cfg = (w.prefix() / "pyvenv.cfg").read_text()
    assert f"home = {w.pythons}/" in cfg
    # The record says so: the plan's python is managed, and the interpreter it was built from is that one.
    record = json.loads((w.home / "envs" / "mp.json").read_text())
    assert record["plan"]["python"]["origin"] == "managed"
    assert (
        record["tools"]["python_path"].startswith(f"{w.pythons}/") and record["tools"]["python"] == w.version
    )
    assert data["env"]["tools"]["python_path"] == record["tools"]["python_path"]
    shown = ok(w.cli("show", "mp", COLUMNS="200")).stdout
    assert f"python from: uv-managed CPython {w.minor} in {w.pythons}" in shown
    # A second env of the same version finds it installed: nothing is downloaded again, even offline.
    w.recipe("mp2")
    ok(w.create("mp2", ENVBUILDER_OFFLINE="1"))
    assert len(w.downloads.archives()) == 1 and w.shown("mp2")[0] == base
    # uv put no python3.X shim in the user's ~/.local/bin (uv's default place for them): only the home's pythons.
    shims = Path(w.env["HOME"]) / ".local" / "bin"
    assert not shims.exists() or list(shims.iterdir()) == []


@pytest.mark.parametrize("installer", ["pip", "virtualenv"])
def test_the_other_installers_make_the_venv_from_the_managed_python_too(world, installer):
    w = world
    w.recipe(installer=installer)
    ok(w.create("mp", "--no-validate", **w.mirror))
    base, version, who = w.shown()
    assert Path(base).resolve().is_relative_to(w.pythons.resolve()) and version == w.version
    assert who == "ebmanaged 1.0"


def test_an_index_mirror_rule_for_the_release_url_sends_the_download_as_for_wheels(world):
    w = world
    w.recipe()
    rules = f"{w.env['ENVBUILDER_INDEX_MIRROR']} {standinpython.UPSTREAM}/={w.downloads.url}/"
    env = {k: v for k, v in w.mirror.items() if k != "ENVBUILDER_PYTHON_MIRROR"}
    planned = w.data("plan", "mp", ENVBUILDER_INDEX_MIRROR=rules, **env)["python"]["managed"]
    assert planned["mirror"] == w.downloads.url and "ENVBUILDER_INDEX_MIRROR rule" in planned["mirror_source"]
    ok(w.create("mp", "--no-validate", ENVBUILDER_INDEX_MIRROR=rules, **env))
    assert len(w.downloads.archives()) == 1 and w.shown()[2] == "ebmanaged 1.0"


def test_a_python_mirror_that_cannot_be_reached_is_a_network_error_naming_it(world):
    w = world
    w.recipe()
    refused = "http://127.0.0.1:9"  # the discard port: nothing listens on loopback
    res = w.create("mp", **{**w.mirror, "ENVBUILDER_PYTHON_MIRROR": refused})
    assert res.returncode == 11, res.stderr  # a command that failed: the network family
    assert f"uv could not reach {refused}/" in res.stderr and "the connection was refused" in res.stderr
    assert f"this node cannot download Pythons from {refused}: set ENVBUILDER_PYTHON_MIRROR" in res.stderr
    assert "Traceback" not in res.stderr and not w.prefix().exists()


def test_offline_without_a_mirror_and_without_the_python_is_a_clear_error(world):
    w = world
    w.recipe()
    res = w.create("mp", ENVBUILDER_OFFLINE="1")
    assert res.returncode == EXIT_BACKEND, res.stderr
    assert f"CPython {w.minor} is not installed in {w.pythons}" in res.stderr
    assert (
        "ENVBUILDER_OFFLINE=1 forbids downloading it" in res.stderr
        and "ENVBUILDER_PYTHON_MIRROR" in res.stderr
    )
    assert "Traceback" not in res.stderr and not w.prefix().exists()
    assert w.downloads.archives() == []


@pytest.mark.parametrize("mode", ["wheelhouse", "archive"])
def test_restore_installs_the_managed_python_again_where_it_is_gone(world, mode):
    w = world
    w.recipe()
    ok(w.create("mp", "--no-validate", **w.mirror))
    ok(w.cli("backup", "mp", "--mode", mode))
    shutil.rmtree(w.prefix())
    shutil.rmtree(w.pythons)
    ok(w.cli("restore", "mp", **w.mirror))
    assert len(w.downloads.archives()) == 2  # once for create, once for restore
    base, version, who = w.shown()
    assert Path(base).resolve().is_relative_to(w.pythons.resolve()) and version == w.version
    assert who == "ebmanaged 1.0"


def test_a_site_that_forbids_managed_pythons_refuses_the_plan_and_the_create(world):
    w = world
    w.recipe()
    site = w.root / "site" / "config.toml"
    site.parent.mkdir()
    site.write_text('[settings]\nmanaged_python = false\n[locked]\nkeys = ["managed_python"]\n')
    forbid = {"ENVBUILDER_CONFIG": str(site), "ENVBUILDER_MANAGED_PYTHON": "1", **w.mirror}
    for verb in (("plan", "mp"), ("create", "mp", "--prefix", str(w.prefix()))):
        res = w.cli(*verb, **forbid)
        assert res.returncode == EXIT_RECIPE, res.stderr
        assert "python.source: this site does not allow uv-managed Pythons" in res.stderr
        assert f"the site file {site} locks it" in res.stderr  # the user's variable is set aside, and said so
    assert not w.prefix().exists() and not w.pythons.exists() and w.downloads.archives() == []
