"""Lockfiles for real: uv resolves a recipe for x86_64 and aarch64 against a local index holding platform-tagged
wheels for both; create builds from the lock with real uv (and the index gaining newer wheels changes nothing);
the aarch64 half installs for aarch64 with uv's cross-platform install; stale, tampered and unresolvable locks
are refused; a lock published with a recipe is verified and used; and real torch builds from a lock."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import UserWorld, ok, refused, run_cli
from packaging.utils import canonicalize_name
from wheelindex import build_wheel, mirror_env, serve

from envbuilder import lockfile
from envbuilder.core._toml import dumps, loads

pytestmark = pytest.mark.integration
UV = shutil.which("uv")
X86 = "cp311-cp311-manylinux_2_28_x86_64"
ARM = "cp311-cp311-manylinux_2_28_aarch64"

RECIPE = """
schema_version = 1
[recipe]
name = "{name}"
description = "{description}"
[env]
kind = "venv"
installer = "uv"
prefix = "${{SCRATCH}}/envs/{{name}}"
[python]
command = "{python}"
version = "3.11"
[torch]
install = false
{packages}
"""


def fastmath(d: Path, version: str, tag: str) -> Path:
    arch = "arm" if "aarch64" in tag else "x86"
    return build_wheel(d, "fastmath", version, {"fastmath/__init__.py": f"X = '{arch} {version}'\n"}, tag=tag)


@pytest.fixture
def world(tmp_path):
    """fastmath 1.0 for both architectures and 1.1 for x86_64 only; helper (pure) needs fastmath."""
    files = tmp_path / "files"
    fastmath(files, "1.0", X86)
    fastmath(files, "1.0", ARM)
    fastmath(files, "1.1", X86)
    build_wheel(files, "helper", "2.0", {"helper/__init__.py": ""}, requires=["fastmath>=1.0"])
    build_wheel(files, "x86only", "1.0", {"x86only/__init__.py": ""}, tag=X86)
    with serve(files) as index:
        yield World(tmp_path, files, index)


class World(UserWorld):
    def __init__(self, root: Path, files: Path, index: Any) -> None:
        super().__init__(root, mirror_env(index))
        self.files = files
        self.index = index

    def recipe(
        self, name: str = "demo", specs: tuple[str, ...] = ("helper==2.0",), description: str = "x"
    ) -> Path:
        packages = "".join(
            f'[[packages]]\nname = "{s.split("=")[0].rstrip("<>!~")}"\nspec = "{s}"\n' for s in specs
        )
        self.write_recipe(
            name, RECIPE.format(name=name, description=description, python=sys.executable, packages=packages)
        )
        return self.recipes / f"{name}.toml"

    def x(self, name: str = "demo") -> str:
        py = self.scratch / "envs" / name / "bin" / "python"
        return subprocess.run([str(py), "-c", "import fastmath; print(fastmath.X)"], capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------------------------------------


def test_lock_two_platforms_then_create_from_the_lock(world):
    world.recipe()
    data = world.data("lock", "demo", "--platform", "x86_64", "--platform", "aarch64")
    assert data["platforms"] == {"x86_64": 2, "aarch64": 2}
    path = world.home / "lockfiles" / "demo.lock.toml"
    assert data["path"] == str(path)
    lock = lockfile.read(path)
    x86, arm = lock.for_arch("x86_64"), lock.for_arch("aarch64")
    assert x86.versions() == {"fastmath": "1.1", "helper": "2.0"}
    # aarch64 has no fastmath 1.1: its resolution differs, and names the aarch64 file and its hash.
    assert arm.versions() == {"fastmath": "1.0", "helper": "2.0"}
    arm_fm = next(p for p in arm.packages if p.name == "fastmath")
    arm_file = world.files / f"fastmath-1.0-{ARM}.whl"
    assert [f.url.rsplit("/", 1)[1] for f in arm_fm.files] == [arm_file.name]
    assert arm_fm.files[0].sha256 == sha(arm_file)
    assert arm.tag == "aarch64-manylinux_2_28"

    # The index moves on; a build from the lock does not.
    fastmath(world.files, "1.2", X86)
    created = world.data("create", "demo", "--locked", "--no-validate")
    assert created["env"]["plan"]["lock"]["status"] == "applies"
    assert world.x() == "x86 1.1"
    requested = list(world.index.requested)
    assert not any("fastmath-1.2" in r for r in requested)

    ok(world.cli("create", "demo", "--force", "--no-lock", "--no-validate"))
    assert world.x() == "x86 1.2"
    ok(world.cli("create", "demo", "--force", "--locked", "--no-validate"))
    assert world.x() == "x86 1.1"
    # Only an env built from a published version can stamp one (checked before anything runs).
    refused(world.cli("validate", "demo", "--publish-report"), 10, "demo, which is not a published recipe")


@pytest.mark.skipif(UV is None, reason="uv is not installed")
def test_the_aarch64_half_installs_for_aarch64_and_not_the_x86_half(world, tmp_path):
    """No aarch64 machine here (nor on the device): uv's cross-platform install is the aarch64 'create'."""
    world.recipe()
    ok(world.cli("lock", "demo", "--platform", "aarch64", "--platform", "x86_64"))
    lock = lockfile.read(world.home / "lockfiles" / "demo.lock.toml")

    def install(arch: str, target: Path) -> subprocess.CompletedProcess[str]:
        req = tmp_path / f"{arch}.txt"
        req.write_text(lock.for_arch(arch).requirements_txt())
        argv = [UV, "pip", "install", "--python-platform", "aarch64-manylinux_2_28", "--python-version", "3.11",
                "--target", str(target), "--no-deps", "--require-hashes", "-r", str(req),
                "--index-url", f"{world.index.url}/simple/"]  # fmt: skip
        return subprocess.run(argv, capture_output=True, text=True, env={**world.env, "UV_NO_CONFIG": "1"})

    ok(install("aarch64", tmp_path / "arm"))
    assert (tmp_path / "arm" / "fastmath" / "__init__.py").read_text() == "X = 'arm 1.0'\n"
    wheel = (tmp_path / "arm" / "fastmath-1.0.dist-info" / "WHEEL").read_text()
    assert f"Tag: {ARM}" in wheel
    bad = install("x86_64", tmp_path / "x86")
    assert bad.returncode != 0
    assert "fastmath" in bad.stderr


def test_stale_missing_and_tampered_locks(world):
    world.recipe()
    refused(world.cli("create", "demo", "--locked"), 13, "--locked, but demo has no lock")
    assert not (world.scratch / "envs" / "demo").exists()
    ok(world.cli("lock", "demo"))

    # A change that resolves the same keeps the lock; one that does not makes it stale.
    world.recipe(description="reworded")
    assert world.data("plan", "demo")["lock"]["status"] == "applies"
    world.recipe(specs=("helper>=2.0",))
    res = world.cli("create", "demo", "--locked")
    refused(res, 13, "is stale for demo on x86_64")
    assert "helper>=2.0" in res.stderr
    assert "envbuilder lock demo --platform x86_64" in res.stderr
    assert not (world.scratch / "envs" / "demo").exists()
    res = ok(world.cli("create", "demo", "--no-validate"))
    assert "building without the lock" in res.stderr

    # A lock whose hash was edited: the installer refuses the file, and no env is left behind.
    world.recipe()
    ok(world.cli("lock", "demo"))
    path = world.home / "lockfiles" / "demo.lock.toml"
    real = sha(world.files / f"fastmath-1.1-{X86}.whl")
    path.write_text(path.read_text().replace(real, "0" * 64))
    res = world.cli("create", "demo", "--force", "--locked", "--prefix", str(world.root / "tampered"))
    assert res.returncode == 11, res.stderr
    assert "hash" in res.stderr.lower()
    assert not (world.root / "tampered").exists()
    assert not list(world.root.glob(".tampered*"))

    # A hand-broken lock names the file and the key.
    path.write_text(path.read_text().replace("engine = ", "engin = "))
    refused(world.cli("plan", "demo"), 13, "unknown key 'engin'")


def _edit_lock(path: Path, edit: Any) -> None:
    """Rewrite the lock at ``path`` after ``edit`` (called with the x86_64 platform's package tables)."""
    data = lockfile.read(path).to_data()
    edit(next(p for p in data["platform"] if p["arch"] == "x86_64")["package"])
    path.write_text(dumps(data))


def _site(prefix: Path) -> set[str]:
    return {p.name for p in prefix.glob("lib/python*/site-packages/*.dist-info")}


def test_locked_markers_are_evaluated_for_the_target_and_exactly_what_applies_is_installed(world):
    """A lock entry with an environment marker: evaluated for the lock's target (x86_64 Linux, its python), as
    uv and pip would there; what applies is installed, every one of it, and what does not is left out and said."""
    build_wheel(world.files, "newpy", "1.0", {"newpy/__init__.py": ""})
    build_wheel(
        world.files,
        "needsnew",
        "1.0",
        {"needsnew/__init__.py": ""},
        requires=['newpy; python_version >= "3.10"'],
    )
    world.recipe(specs=("helper==2.0", "needsnew==1.0"))
    ok(world.cli("lock", "demo"))
    path = world.home / "lockfiles" / "demo.lock.toml"
    # uv keeps the marker of a dependency that holds for the python it locked for, as a full-version one.
    markers = {p.name: p.marker for p in lockfile.read(path).for_arch("x86_64").packages}
    assert markers["newpy"] == "python_full_version >= '3.10'"
    winonly = build_wheel(world.files, "winonly", "1.0", {"winonly/__init__.py": ""})
    oldpy = build_wheel(world.files, "oldpy", "1.0", {"oldpy/__init__.py": ""})

    def edit(packages: list[dict[str, Any]]) -> None:
        for pkg in packages:
            if pkg["name"] == "fastmath":
                pkg["marker"] = 'platform_machine == "x86_64" and sys_platform == "linux"'
        for wheel, marker in ((winonly, 'sys_platform == "win32"'), (oldpy, 'python_version < "3.0"')):
            name = wheel.name.split("-")[0]
            url = f"{world.index.url}/files/{wheel.name}"
            packages.append({"name": name, "version": "1.0", "marker": marker, "source": "wheel",
                             "files": [{"url": url, "sha256": sha(wheel)}]})  # fmt: skip

    _edit_lock(path, edit)
    plan = world.data("plan", "demo")
    assert plan["lock"]["status"] == "applies"
    notes = "\n".join(plan["notes"])
    assert 'winonly 1.0 is only for `sys_platform == "win32"`, not this target: left out' in notes
    assert 'oldpy 1.0 is only for `python_version < "3.0"`' in notes
    ok(world.cli("create", "demo", "--locked", "--no-validate"))
    assert world.x() == "x86 1.1"
    installed = {"fastmath-1.1", "helper-2.0", "needsnew-1.0", "newpy-1.0"}
    assert _site(world.scratch / "envs" / "demo") == {f"{d}.dist-info" for d in installed}


def test_a_marker_smuggled_into_a_locked_version_is_refused_not_skipped(world):
    """The probe of issue 32: ``version = "1.1 ; python_version < '3.0'"`` became the requirement line
    ``fastmath==1.1 ; python_version < '3.0' --hash=...``, which the installer skipped, exiting 0 with fastmath
    missing. The lock is refused now, naming the package; and a marker that reads what the target does not fix
    (a kernel release) is an error naming it, not a guess from this host."""
    world.recipe()
    ok(world.cli("lock", "demo"))
    path = world.home / "lockfiles" / "demo.lock.toml"
    clean = path.read_text()

    def smuggle(packages: list[dict[str, Any]]) -> None:
        next(p for p in packages if p["name"] == "fastmath")["version"] = '1.1 ; python_version < "3.0"'

    _edit_lock(path, smuggle)
    res = world.cli("create", "demo", "--locked", "--no-validate")
    refused(res, 13, "fastmath's version '1.1 ; python_version < \"3.0\"' is not a version")
    assert not (world.scratch / "envs" / "demo").exists()

    path.write_text(clean)

    def kernel(packages: list[dict[str, Any]]) -> None:
        next(p for p in packages if p["name"] == "fastmath")["marker"] = 'platform_release >= "5"'

    _edit_lock(path, kernel)
    res = world.cli("create", "demo", "--locked", "--no-validate")
    refused(res, 13, 'fastmath 1.1 is locked for `platform_release >= "5"`, which reads platform_release')
    assert not (world.scratch / "envs" / "demo").exists()


OVERLAY = """
schema_version = 1
[recipe]
name = "demo"
[env]
kind = "venv"
installer = "pip"
system_site_packages = true
prefix = "${{SCRATCH}}/envs/{{name}}"
[python]
command = "{python}"
version = "3.11"
[torch]
install = false
[[packages]]
name = "helper"
spec = "helper==2.0"
"""


@pytest.mark.skipif(UV is None, reason="uv is not installed")
def test_a_locked_package_the_installer_leaves_out_fails_the_create_naming_it(world):
    """An env that sees its parent python's packages, where the locked fastmath 1.1 is installed already: pip
    takes it as satisfied and installs only helper, exiting 0, so the env would hold less than the lock (and a
    fastmath whose hash nothing checked). The create fails naming it, and no env is put in place."""
    base = world.root / "base"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(base)], check=True)
    subprocess.run([str(UV), "pip", "install", "--python", str(base / "bin" / "python"), "--index-url",
                    f"{world.index.url}/simple/", "fastmath==1.1"], check=True, capture_output=True,
                   env={**world.env, "UV_NO_CONFIG": "1"})  # fmt: skip
    world.write_recipe("demo", OVERLAY.format(python=base / "bin" / "python"))
    ok(world.cli("lock", "demo"))
    assert lockfile.read(world.home / "lockfiles" / "demo.lock.toml").for_arch("x86_64").versions() == {
        "fastmath": "1.1",
        "helper": "2.0",
    }
    res = world.cli("create", "demo", "--locked", "--no-validate")
    refused(res, 13, "the installer left out 1 locked package(s): fastmath==1.1")
    assert not (world.scratch / "envs" / "demo").exists()
    assert not list((world.scratch / "envs").glob(".demo*"))


def test_unresolvable_platform_and_unknown_platform(world):
    world.recipe(specs=("x86only==1.0",))
    res = world.cli("lock", "demo", "--platform", "x86_64", "--platform", "aarch64")
    refused(res, 13, "uv could not resolve the recipe for aarch64")
    assert "x86only" in res.stderr
    assert not (world.home / "lockfiles" / "demo.lock.toml").exists()
    res = world.cli("lock", "demo", "--platform", "aarch46")
    refused(res, 13, "unknown platform 'aarch46'")
    assert "did you mean 'aarch64'?" in res.stderr


def test_a_lock_published_with_its_recipe_is_verified_and_used(world, tmp_path):
    admin_lock = tmp_path / "demo.lock.toml"
    registry = tmp_path / "registry"
    world.recipe()
    ok(world.cli("lock", "demo", "-o", str(admin_lock), "--platform", "x86_64", "--platform", "aarch64"))
    pub = world.data("publish", "demo", "--registry", str(registry), "--lock", str(admin_lock))
    assert pub["recipes"][0]["lock"] == str(registry / "recipes" / "demo" / "1.lock.toml")
    assert stat.S_IMODE((registry / "recipes" / "demo" / "1.lock.toml").stat().st_mode) == 0o444
    again = world.data("publish", "demo", "--registry", str(registry), "--lock", str(admin_lock))
    assert again["recipes"][0]["status"] == "unchanged"

    user = {"ENVBUILDER_RECIPE_PATH": str(registry), "ENVBUILDER_HOME": str(tmp_path / "user-home")}
    fastmath(world.files, "1.2", X86)
    plan = world.data("plan", "demo", **user)
    assert plan["lock"]["origin"] == "published"
    assert plan["lock"]["status"] == "applies"
    ok(world.cli("create", "demo", "--locked", "--no-validate", **user))
    assert world.x() == "x86 1.1"

    # A lock made from another version of the recipe is not shipped with this one.
    world.recipe(specs=("helper>=2.0",))
    res = world.cli("publish", "demo", "--registry", str(registry), "--lock", str(admin_lock))
    refused(res, 10, "was made from another version of demo")

    # Tampering with the published lock: refused before anything is built.
    lock_file = registry / "recipes" / "demo" / "1.lock.toml"
    lock_file.chmod(0o644)
    lock_file.write_text(lock_file.read_text().replace('"1.1"', '"1.0"'))
    res = world.cli("create", "demo", "--force", "--prefix", str(tmp_path / "t"), **user)
    refused(res, 10, "does not match the sha256")
    assert not (tmp_path / "t").exists()


def test_real_torch_from_a_published_lock_then_a_published_report(
    torch_files, torch_index, torch_uv_cache, tmp_path
):
    """The embedded recipe `local` (torch 2.13.0 CPU): an admin locks it for x86_64 through the torch index and
    publishes it with the lock; a user builds from that lock (the hashes of the real wheels) and torch imports; the
    admin's passing validation is stamped on the version. aarch64 cannot be planned here (the index has no such torch file)."""
    registry = tmp_path / "registry"
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path / "home"),
        "SCRATCH": str(tmp_path / "scratch"),
        "NO_COLOR": "1",
        "ENVBUILDER_HOME": str(tmp_path / "admin"),
        "ENVBUILDER_INDEX_MIRROR": mirror_env(torch_index),
        "UV_CACHE_DIR": str(torch_uv_cache),  # torch linked from the session's cache, not unpacked again
    }
    user = {"ENVBUILDER_HOME": str(tmp_path / "user"), "ENVBUILDER_RECIPE_PATH": str(registry)}

    def run(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, env={**env, **extra}, timeout=900)

    lock_path = tmp_path / "local.lock.toml"
    ok(run("lock", "local", "--platform", "x86_64", "--python", "3.11", "-o", str(lock_path)))
    lock = lockfile.read(lock_path)
    versions = lock.for_arch("x86_64").versions()
    assert versions["torch"] == "2.13.0+cpu"
    torch_file = next(torch_files.glob("torch-2.13.0*cpu*.whl"))
    torch_pkg = next(p for p in lock.for_arch("x86_64").packages if p.name == "torch")
    assert [f.sha256 for f in torch_pkg.files] == [sha(torch_file)]
    ok(run("publish", "local", "--registry", str(registry), "--lock", str(lock_path)))
    res = ok(run("create", "local", "--locked", "--json", **user))
    # The index read at plan time already shows there is no aarch64 torch file: a resolver error, before uv.
    refused(run("lock", "local", "--platform", "aarch64", "--python", "3.11"), 4, "file for aarch64")
    data = json.loads(res.stdout)["data"]
    assert data["env"]["plan"]["lock"]["status"] == "applies"
    assert data["env"]["plan"]["lock"]["origin"] == "published"
    installed = {canonicalize_name(p["name"]): p["version"] for p in data["env"]["packages"] if p["in_env"]}
    assert installed == {canonicalize_name(k): v for k, v in versions.items()}
    assert data["env"]["validation"]["checks"]["import"]["status"] == "pass"

    shown = json.loads(ok(run("recipes", "show", "local", "--json", **user)).stdout)["data"]
    assert shown["published"]["validations"] == []
    res = ok(
        run("validate", "local", "--cpu", "--checks", "import,ddp", "--publish-report", "--json", **user)
    )
    stamp = json.loads(res.stdout)["data"]["published_report"]
    assert stamp["recipe"] == "local@1"
    assert stamp["checks"] == {"import": "pass", "ddp": "pass"}
    assert stamp["ranks"] >= 1
    index_doc = json.loads((registry / "index.json").read_text())
    assert index_doc["recipes"]["local"]["1"]["validations"][0]["checks"] == stamp["checks"]
    res = ok(run("recipes", "show", "local", **user))
    assert "last validated" in res.stdout
    assert "not yet validated" not in res.stdout
    log = [json.loads(line) for line in (registry / "publish.log").read_text().splitlines()]
    assert [e["action"] for e in log] == ["publish", "validation"]


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="ssh-keygen is not installed (openssh-client)")
def test_a_signed_registry_signs_the_lock_and_refuses_it_unsigned(world, tmp_path):
    keygen = str(shutil.which("ssh-keygen"))
    key = tmp_path / "admin"
    subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-C", "admin", "-f", str(key)], check=True)
    allowed = tmp_path / "allowed_signers"
    allowed.write_text(f"admin@site {(tmp_path / 'admin.pub').read_text().strip()}\n")
    registry = tmp_path / "registry"
    world.recipe()
    ok(world.cli("lock", "demo", "-o", str(tmp_path / "demo.lock.toml")))
    # Published without a lock first; the lock is added to that version later (once), signed.
    ok(world.cli("publish", "demo", "--registry", str(registry), "--sign-key", str(key),
                 "--allowed-signers", str(allowed), "--require-signatures"))  # fmt: skip
    res = ok(world.cli("publish", "demo", "--registry", str(registry), "--sign-key", str(key),
                       "--lock", str(tmp_path / "demo.lock.toml")))  # fmt: skip
    assert "demo@1: lock added" in res.stdout
    sig = registry / "recipes" / "demo" / "1.lock.toml.sig"
    assert sig.is_file()
    user = {"ENVBUILDER_RECIPE_PATH": str(registry), "ENVBUILDER_HOME": str(tmp_path / "user-home")}
    assert world.data("plan", "demo", "--locked", **user)["lock"]["origin"] == "published"
    shown = world.data("recipes", "show", "demo", **user)
    assert shown["lock"]["platforms"] == {"x86_64": 2}
    assert shown["published"]["lock_file"] == "recipes/demo/1.lock.toml"
    log = [json.loads(line) for line in (registry / "publish.log").read_text().splitlines()]
    assert [e["action"] for e in log] == ["publish", "lock"]

    # A newer lock for the same recipe: that version's lock never changes, so it becomes version 2.
    fastmath(world.files, "1.2", X86)
    ok(world.cli("lock", "demo", "-o", str(tmp_path / "newer.lock.toml")))
    res = ok(world.cli("publish", "demo", "--registry", str(registry), "--sign-key", str(key),
                       "--lock", str(tmp_path / "newer.lock.toml")))  # fmt: skip
    assert "published demo@2, signed by admin@site, with its lock" in res.stdout
    plan = world.data("plan", "demo", "--locked", **user)
    assert plan["recipe_version"] == "2"
    published = lockfile.read(registry / "recipes" / "demo" / "2.lock.toml")
    assert published.recipe_version == "2"
    assert published.for_arch("x86_64").versions()["fastmath"] == "1.2"
    ok(world.cli("create", "demo", "--locked", "--no-validate", **user))
    assert world.x() == "x86 1.2"
    # An unsigned lock in a registry that requires signatures is not used.
    sig2 = registry / "recipes" / "demo" / "2.lock.toml.sig"
    sig2.chmod(0o644)
    sig2.unlink()
    refused(world.cli("plan", "demo", **user), 10, "the lock of demo@2 is not signed")


# ---------------------------------------------------------------------------------------------------------------
# PEP 751: pylock.ARCH.toml beside the lock, installed by the real uv, and taken back by create


def _uv_installs(pylock: Path, venv: Path) -> dict[str, str]:
    """What the real uv installs from ``pylock`` into a fresh venv (name -> version), envbuilder not involved."""
    subprocess.run([UV, "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    py = str(venv / "bin" / "python")
    subprocess.run([UV, "pip", "install", "-q", "--python", py, "--no-index", "-r", str(pylock)], check=True,
                   capture_output=True, text=True)  # fmt: skip
    listed = subprocess.run([UV, "pip", "list", "--python", py, "--format", "json"], check=True,
                            capture_output=True, text=True).stdout  # fmt: skip
    return {p["name"]: p["version"] for p in json.loads(listed)}


@pytest.mark.skipif(UV is None, reason="uv is not installed")
def test_lock_format_pylock_writes_pep751_files_that_uv_installs_and_create_takes(world, tmp_path):
    world.recipe()
    data = world.data("lock", "demo", "--platform", "x86_64", "--platform", "aarch64", "--format", "pylock")
    where = world.home / "lockfiles" / "demo"
    assert data["standard_files"] == [str(where / "pylock.x86_64.toml"), str(where / "pylock.aarch64.toml")]
    assert (world.home / "lockfiles" / "demo.lock.toml").is_file()  # ours stays, with the plan's inputs
    # With -o, beside the lock given.
    mine = tmp_path / "locks" / "demo.lock.toml"
    data = world.data("lock", "demo", "-o", str(mine), "--format", "pylock")
    assert data["standard_files"] == [str(mine.parent / "pylock.x86_64.toml")] and mine.is_file()

    for arch, tag, fm in (("x86_64", X86, "1.1"), ("aarch64", ARM, "1.0")):
        doc = loads((where / f"pylock.{arch}.toml").read_text())
        assert doc["lock-version"] == "1.0" and doc["created-by"] == "uv"
        pkgs = {p["name"]: p for p in doc["packages"]}
        assert {n: p["version"] for n, p in pkgs.items()} == {"fastmath": fm, "helper": "2.0"}
        wheel = world.files / f"fastmath-{fm}-{tag}.whl"
        [entry] = pkgs["fastmath"]["wheels"]
        assert entry["url"].endswith("/" + wheel.name) and entry["hashes"]["sha256"] == sha(wheel)
        assert doc["tool"]["envbuilder"]["arch"] == arch

    # The real uv installs the x86_64 file as it stands (its tool table ignored): the locked versions.
    fastmath(world.files, "1.2", X86)
    assert _uv_installs(where / "pylock.x86_64.toml", tmp_path / "uvenv") == {
        "fastmath": "1.1",
        "helper": "2.0",
    }
    assert (tmp_path / "uvenv" / "lib").exists()

    # create --lock takes the pylock (its tool table keeps the inputs: it applies, and stays checked for staleness).
    created = world.data(
        "create", "demo", "--lock", str(where / "pylock.x86_64.toml"), "--locked", "--no-validate"
    )
    assert created["env"]["plan"]["lock"]["status"] == "applies"
    assert world.x() == "x86 1.1"
    world.recipe(specs=("helper>=2.0",))
    refused(
        world.cli("plan", "demo", "--lock", str(where / "pylock.x86_64.toml"), "--locked"), 13, "is stale"
    )
    # A registry ships envbuilder's own lock (all platforms, the provenance), not a pylock.
    registry = str(tmp_path / "registry")
    res = world.cli("publish", "demo", "--registry", registry, "--lock", str(where / "pylock.x86_64.toml"))
    refused(res, 10, "is a PEP 751 pylock file: a recipe is published with envbuilder's own lock")

    # A pylock from elsewhere (no tool table) is taken as is, for the arch its wheels are built for.
    world.recipe()
    theirs = tmp_path / "pylock.toml"
    text = (where / "pylock.x86_64.toml").read_text()
    theirs.write_text(text[: text.index("[tool.envbuilder]")])
    ok(world.cli("create", "demo", "--force", "--lock", str(theirs), "--locked", "--no-validate"))
    assert world.x() == "x86 1.1"
    # ... and refused where it does not hold what the recipe pins.
    theirs.write_text(
        theirs.read_text().replace('name = "helper"\nversion = "2.0"', 'name = "helper"\nversion = "1.9"')
    )
    res = world.cli("create", "demo", "--force", "--lock", str(theirs), "--no-validate")
    refused(res, 13, f"{theirs} has helper 1.9, but the plan installs helper==2.0")
    assert world.x() == "x86 1.1"


def test_lock_format_pylock_refuses_a_conda_recipe(world):
    world.write_recipe("cdemo", CONDA_RECIPE)
    res = world.cli("lock", "cdemo", "--format", "pylock")
    refused(res, 2, "--format pylock does not fit cdemo, a conda recipe (conda packages)")
    assert not (world.home / "lockfiles").exists()


CONDA_RECIPE = """
schema_version = 1
[recipe]
name = "cdemo"
[env]
kind = "conda"
prefix = "${SCRATCH}/envs/{name}"
[conda]
channels = ["conda-forge"]
packages = []
[python]
command = "python"
version = "3.11"
[torch]
install = false
"""
