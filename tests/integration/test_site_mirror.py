"""`envbuilder mirror` for real: a recipe locked for x86_64 and aarch64 against a loopback index, its locked files
mirrored into a PEP 503 tree or a wheelhouse, the index stopped, and `create --locked` building the env from the
mirror alone (the ENVBUILDER_INDEX_MIRROR value the command printed, every proxy a dead port, uv's cache empty).
A file the index serves with other bytes than the lock's is refused and never lies under its name; a rerun
downloads nothing; an unreachable index names the file and the lock. A conda lock's packages become a conda
channel in the mirror that create --locked builds from."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from condaworld import World as CondaWorld
from condaworld import conda_meta
from helpers import UserWorld, ok, refused
from wheelindex import build_wheel, mirror_env, serve

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not installed"),
]
X86 = "cp311-cp311-manylinux_2_28_x86_64"
ARM = "cp311-cp311-manylinux_2_28_aarch64"

RECIPE = f"""
schema_version = 1
[recipe]
name = "demo"
description = "mirrored"
[env]
kind = "venv"
installer = "uv"
prefix = "${{SCRATCH}}/envs/{{name}}"
[python]
command = "{sys.executable}"
version = "3.11"
[torch]
install = false
[[packages]]
name = "helper"
spec = "helper==2.0"
"""

#: Where nothing listens: any read of the internet through a proxy fails at once.
DEAD = {"http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9", "no_proxy": ""}


def fastmath(d: Path, version: str, tag: str) -> Path:
    arch = "arm" if "aarch64" in tag else "x86"
    return build_wheel(d, "fastmath", version, {"fastmath/__init__.py": f"X = '{arch} {version}'\n"}, tag=tag)


class World(UserWorld):
    def __init__(self, root: Path, files: Path, index: Any) -> None:
        super().__init__(root, mirror_env(index))
        self.files = files
        self.index = index
        self.write_recipe("demo", RECIPE)
        ok(self.cli("lock", "demo", "--platform", "x86_64", "--platform", "aarch64"))
        self.lock = self.home / "lockfiles" / "demo.lock.toml"

    def mirror(self, to: Path, *more: str) -> subprocess.CompletedProcess[str]:
        return self.cli("mirror", str(self.lock), "--to", str(to), *more)

    def x(self) -> str:
        py = self.scratch / "envs" / "demo" / "bin" / "python"
        return subprocess.run([str(py), "-c", "import fastmath; print(fastmath.X)"], capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip


@contextmanager
def locked(tmp_path: Path) -> Iterator[World]:
    """demo locked against a loopback index, which stops when the block ends. fastmath 1.0 is there for both
    architectures and 1.1 for x86_64 only (so the two platforms lock different files); helper needs fastmath."""
    files = tmp_path / "files"
    fastmath(files, "1.0", X86)
    fastmath(files, "1.0", ARM)
    fastmath(files, "1.1", X86)
    build_wheel(files, "helper", "2.0", {"helper/__init__.py": ""}, requires=["fastmath>=1.0"])
    build_wheel(files, "extra", "1.0", {"extra/__init__.py": ""})
    with serve(files) as index:
        yield World(tmp_path, files, index)


@pytest.fixture
def world(tmp_path):
    with locked(tmp_path) as w:
        yield w


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


LOCKED = {f"fastmath-1.1-{X86}.whl", f"fastmath-1.0-{ARM}.whl", "helper-2.0-py3-none-any.whl"}


@pytest.mark.parametrize("layout", ["simple", "wheelhouse"])
def test_mirror_then_create_from_it_with_the_index_gone(tmp_path, layout):
    to = tmp_path / "site mirror" if layout == "simple" else tmp_path / "wheels"
    with locked(tmp_path) as world:
        data = json.loads(ok(world.mirror(to, "--layout", layout, "--json")).stdout)["data"]
    # The index is stopped: its port refuses connections.
    assert {f["name"] for f in data["files"]} == LOCKED  # both platforms' files, and nothing else
    assert sorted(data["downloaded"]) == sorted(LOCKED) and data["skipped"] == []
    held = to / "files" if layout == "simple" else to
    manifest = {".envbuilder-mirror.json"} if layout == "wheelhouse" else set()  # simple: beside files/
    assert {p.name for p in held.iterdir() if p.is_file()} == LOCKED | manifest
    for name in LOCKED:
        assert sha(held / name) == sha(world.files / name)
    assert data["bytes"] == sum((world.files / n).stat().st_size for n in LOCKED)
    if layout == "simple":
        page = (to / "simple" / "fastmath" / "index.html").read_text()
        assert (
            f'href="../../files/fastmath-1.0-{ARM}.whl#sha256={sha(world.files / f"fastmath-1.0-{ARM}.whl")}"'
            in page
        )
        assert "fastmath-1.0-cp311-cp311-manylinux_2_28_x86_64" not in page  # not locked: not mirrored
        assert data["index_mirror"].startswith("pypi=file://") and "site%20mirror" in data["index_mirror"]
    else:
        assert data["index_mirror"] == f"pypi={to}"

    world.index.requested.clear()
    created = world.data(
        "create", "demo", "--locked", "--no-validate",
        ENVBUILDER_INDEX_MIRROR=data["index_mirror"], UV_CACHE_DIR=str(tmp_path / "fresh-uv-cache"), **DEAD,
    )  # fmt: skip
    assert created["env"]["plan"]["lock"]["status"] == "applies"
    assert world.x() == "x86 1.1"
    assert world.index.requested == []


def test_the_printed_value_is_shown(world, tmp_path):
    res = ok(world.mirror(tmp_path / "m"))
    assert f"export ENVBUILDER_INDEX_MIRROR=pypi=file://{tmp_path}/m/simple/\n" in res.stdout
    assert "3 downloaded" in res.stdout


def test_a_rerun_downloads_nothing_and_mends_a_damaged_file(world, tmp_path):
    to = tmp_path / "m"
    ok(world.mirror(to))
    world.index.requested.clear()
    again = json.loads(ok(world.mirror(to, "--json")).stdout)["data"]
    assert again["downloaded"] == [] and sorted(again["skipped"]) == sorted(LOCKED) and again["bytes"] == 0
    assert not [r for r in world.index.requested if "/files/" in r]
    # A file left with other bytes (a copy cut short) is fetched again; the others are not.
    (to / "files" / "helper-2.0-py3-none-any.whl").write_bytes(b"cut")
    third = json.loads(ok(world.mirror(to, "--json")).stdout)["data"]
    assert third["downloaded"] == ["helper-2.0-py3-none-any.whl"]
    assert sha(to / "files" / "helper-2.0-py3-none-any.whl") == sha(
        world.files / "helper-2.0-py3-none-any.whl"
    )


def test_a_file_served_with_other_bytes_is_refused_and_not_kept(world, tmp_path):
    altered = world.files / f"fastmath-1.0-{ARM}.whl"
    altered.write_bytes(altered.read_bytes() + b"tampered")
    to = tmp_path / "m"
    res = world.mirror(to)
    refused(res, 13, f"fastmath-1.0-{ARM}.whl from {world.index.url}/files/")
    assert str(world.lock) in res.stderr
    assert not (to / "files" / altered.name).exists()
    left = [p.name for p in (to / "files").iterdir()] if (to / "files").exists() else []
    assert not [n for n in left if n.startswith(".")], left  # no temporary left behind either


def test_an_unreachable_index_names_the_file_and_the_lock(tmp_path):
    with locked(tmp_path) as world:
        pass
    res = world.mirror(tmp_path / "m")
    refused(res, 11, "could not download fastmath-")
    assert str(world.lock) in res.stderr and world.index.url in res.stderr
    assert "refused" in res.stderr.lower()
    assert not (tmp_path / "m" / "simple").exists()  # no pages over files that are not there


def test_a_later_run_with_another_lock_adds_to_the_pages(world, tmp_path):
    to = tmp_path / "m"
    ok(world.mirror(to))
    world.write_recipe("other", RECIPE.replace('"demo"', '"other"').replace('"helper"', '"extra"').replace(
        "helper==2.0", "extra==1.0"))  # fmt: skip
    other = tmp_path / "other.lock.toml"
    ok(world.cli("lock", "other", "--platform", "x86_64", "-o", str(other)))
    data = json.loads(ok(world.cli("mirror", str(other), "--to", str(to), "--json")).stdout)["data"]
    assert data["downloaded"] == ["extra-1.0-py3-none-any.whl"] and data["held"] == 4
    root = (to / "simple" / "index.html").read_text()
    assert 'href="extra/"' in root and 'href="helper/"' in root and 'href="fastmath/"' in root
    assert "helper-2.0-py3-none-any.whl" in (to / "simple" / "helper" / "index.html").read_text()
    refused(world.mirror(to, "--layout", "wheelhouse"), 2, "this mirror has the 'simple' layout")


def test_a_conda_lock_is_mirrored_into_a_channel_and_created_from_it(tmp_path, conda_channel):
    """The conda recipe's packages (every platform's) into DIR/conda/<subdir> with repodata.json, its wheel into
    the PEP 503 tree; the channel and the wheel index gone, create --locked builds from the mirror alone."""
    pytest.importorskip(
        "rattler", reason="py-rattler (the embedded conda engine and the channel indexer) is absent"
    )

    own = tmp_path / "channel"
    shutil.copytree(conda_channel, own)
    wheels = tmp_path / "wheels"
    build_wheel(wheels, "condademo", "1.0", {"condademo/__init__.py": "OK = True\n"})
    (tmp_path / "w").mkdir()
    with serve(wheels) as idx:
        world = CondaWorld(tmp_path / "w", own, idx, tmp_path / "uv-cache")
        world.recipe()
        lock = world.data("lock", "cdemo", "--platform", "x86_64", "--platform", "aarch64")["path"]
        to = tmp_path / "m"
        data = json.loads(ok(world.cli("mirror", lock, "--to", str(to), "--json")).stdout)["data"]
    shutil.rmtree(own)
    paths = {f["path"] for f in data["files"]}
    assert "files/condademo-1.0-py3-none-any.whl" in paths
    assert any(p.startswith("conda/linux-aarch64/hpc-lib-1.5-") for p in paths)  # the aarch64 half too
    repodata = json.loads((to / "conda" / "linux-64" / "repodata.json").read_text())
    assert any(name.startswith("hpc-lib-1.0-") for name in repodata["packages"])
    assert f"https://conda.anaconda.org/conda-forge={to}/conda" in data["index_mirror"]

    created = world.data(
        "create", "cdemo", "--locked", "--no-validate",
        ENVBUILDER_INDEX_MIRROR=data["index_mirror"], UV_CACHE_DIR=str(tmp_path / "fresh-uv-cache"), **DEAD,
    )  # fmt: skip
    assert created["env"]["plan"]["lock"]["status"] == "applies"
    prefix = world.scratch / "envs" / "cdemo"
    assert conda_meta(prefix)["hpc-lib"] == "1.0"
    assert (prefix / "bin" / "python").exists()
