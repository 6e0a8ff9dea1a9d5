"""Nothing is lost: a create or restore killed between putting the env in place and writing its record is
finished by its rerun (a batch job resubmitted after its time limit), and one name has one env unless asked
(``--name`` makes a second, ``--force`` moves it). Real uv against a local index of small wheels; the kill window
is held open by the ENVBUILDER_TEST_PAUSE test hook."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from helpers import Paused, UserWorld, ok, refused
from wheelindex import build_wheel, mirror_env, serve

from envbuilder.system import transaction

pytestmark = pytest.mark.integration

RECIPE = """
schema_version = 1
[recipe]
name = "{name}"
[env]
kind = "venv"
installer = "uv"
[python]
command = "python3"
[torch]
install = false
{packages}
"""


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    d = tmp_path_factory.mktemp("heal-files")
    build_wheel(d, "ebdemo", "1.0", {"ebdemo/__init__.py": "VERSION = '1.0'\n"}, requires=["ebdep"])
    build_wheel(d, "ebdep", "2.0", {"ebdep/__init__.py": "WHO = 'dep'\n"})
    build_wheel(d, "ebtool", "1.0", {"ebtool/__init__.py": ""}, scripts={"ebtool": "ebtool:main"})
    with serve(d) as idx:
        yield idx


class World(UserWorld):
    def __init__(self, root: Path, index: Any) -> None:
        super().__init__(root, mirror_env(index), WORK=str(root / "work"))

    def recipe(self, name: str = "demo", *packages: str) -> str:
        specs = packages or ("ebdemo==1.0",)
        text = "".join(f'[[packages]]\nname = "{s.split("==")[0]}"\nspec = "{s}"\n' for s in specs)
        return self.write_recipe(name, RECIPE.format(name=name, packages=text))

    def prefix(self, name: str = "demo") -> Path:
        """The recipe's default prefix (the loader's ${SCRATCH}/envbuilder/envs/{name})."""
        return self.scratch / "envbuilder" / "envs" / name

    def record(self, name: str = "demo") -> dict[str, Any]:
        return json.loads((self.home / "envs" / f"{name}.json").read_text())

    def killed_at_the_rename(self, target: Path, *args: str, sig: int = signal.SIGKILL) -> None:
        """Run ``envbuilder ARGS`` paused right after it renamed the env into ``target``, and kill it there."""
        proc = self.spawn(*args, extra={transaction.PAUSE_VAR: "after-rename"}, stdout=subprocess.DEVNULL)
        with Paused(proc, "after-rename") as paused:
            paused.wait()
            assert (target / transaction.PENDING).exists()  # the marker is written before the rename
            err = paused.stop(sig)
        if sig == signal.SIGKILL:
            assert proc.returncode == -signal.SIGKILL
        else:
            assert proc.returncode == 130, err
            assert "Traceback" not in err

    def leftovers(self, where: Path) -> list[str]:
        found = sorted(p.name for p in where.parent.glob(f".{where.name}.*")) if where.parent.exists() else []
        locks = (
            sorted(p.name for p in (self.home / "locks").glob("*")) if (self.home / "locks").exists() else []
        )
        return found + locks


@pytest.fixture
def world(tmp_path, index):
    return World(tmp_path, index)


def python(prefix: Path, code: str) -> str:
    res = subprocess.run([str(prefix / "bin" / "python"), "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


# ---------------------------------------------------------------------------------------------------------------
# Killed between the rename and the record


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_create_killed_after_its_rename_is_finished_by_the_rerun(world, sig):
    world.recipe()
    prefix = world.prefix()
    world.killed_at_the_rename(prefix, "create", "demo", "--no-validate", sig=sig)
    # The window: a complete env, and no record of it.
    assert (prefix / "bin" / "python").exists()
    assert not (world.home / "envs" / "demo.json").exists()
    # The rerun (the same command, as a resubmitted job runs it) recognises it and finishes the record.
    res = ok(world.cli("create", "demo", "--no-validate", "--json", "--wait", "0"))
    data = json.loads(res.stdout)["data"]
    assert data["status"] == "created"
    assert any("interrupted create" in n for n in data["notes"]), data["notes"]
    assert world.record()["prefix"] == str(prefix)
    assert not (prefix / transaction.PENDING).exists()
    assert world.leftovers(prefix) == []
    rows = world.data("list")
    assert [(r["name"], r["health"]["status"]) for r in rows] == [("demo", "ok")]
    assert python(prefix, "import ebdemo; print(ebdemo.VERSION)") == "1.0"
    # Nothing more to finish: the next run finds the env recorded.
    assert world.data("create", "demo", "--no-validate")["status"] == "exists"


def test_a_force_killed_after_its_rename_leaves_the_new_env_recorded(world):
    world.recipe()
    ok(world.cli("create", "demo", "--no-validate"))
    world.recipe("demo", "ebdemo==1.0", "ebtool==1.0")  # the recipe changed: --force rebuilds
    world.killed_at_the_rename(world.prefix(), "create", "demo", "--force", "--no-validate")
    # The old record describes an env that is no longer there; the rerun replaces it with the new env's.
    assert "ebtool" not in {p["name"] for p in world.record()["packages"]}
    data = world.data("create", "demo", "--force", "--no-validate")
    assert data["status"] == "replaced"
    assert "ebtool" in {p["name"] for p in data["env"]["packages"]}
    assert "ebtool" in {p["name"] for p in world.record()["packages"]}
    assert world.leftovers(world.prefix()) == []


@pytest.mark.parametrize("mode", ["wheelhouse", "archive"])
def test_a_restore_killed_after_its_rename_is_finished_by_the_rerun(world, mode):
    world.recipe()
    ok(world.cli("create", "demo", "--no-validate"))
    made = world.data("backup", "demo", "--mode", mode)
    target = world.root / "restored" / "demo copy"
    args = ("restore", "demo", "--prefix", str(target), "--name", "demo-r", "--no-validate")
    world.killed_at_the_rename(target, *args)
    assert not (world.home / "envs" / "demo-r.json").exists()
    data = world.data(*args, "--wait", "0")
    assert data["status"] == "restored" and data["backup"] == made["id"]
    assert any("interrupted restore" in n for n in data["notes"]), data["notes"]
    shown = world.data("show", "demo-r")
    assert shown["prefix"] == str(target) and shown["health"]["status"] == "ok"
    assert shown["origin"]["backup"] == made["id"]
    assert not (target / transaction.PENDING).exists()
    assert world.leftovers(target) == []
    assert python(target, "import ebdemo, sys; print(sys.prefix)") == str(target)
    # The marker left no trace: the env's own envbuilder directory holds what the original's does.
    assert sorted(p.name for p in (target / "envbuilder").iterdir()) == sorted(
        p.name for p in (world.prefix() / "envbuilder").iterdir()
    )
    # Running it again is refused as before: the env exists and was restored already.
    refused(world.cli(*args), 9, "--force")


def test_a_marker_of_another_name_is_never_taken_over(world):
    world.recipe()
    target = world.root / "shared"
    world.killed_at_the_rename(target, "create", "demo", "--prefix", str(target), "--no-validate")
    res = world.cli("create", "demo", "--name", "other", "--prefix", str(target), "--force", "--no-validate")
    refused(res, 9, "interrupted envbuilder put in place")
    assert "run the command that built demo again" in res.stderr
    assert (target / "bin" / "python").exists()
    ok(world.cli("create", "demo", "--prefix", str(target), "--no-validate"))
    assert world.record()["prefix"] == str(target)


# ---------------------------------------------------------------------------------------------------------------
# One env per name


def test_create_at_another_prefix_refuses_to_orphan_the_env(world):
    world.recipe()
    ok(world.cli("create", "demo", "--no-validate"))
    elsewhere = world.root / "elsewhere"
    res = world.cli("create", "demo", "--prefix", str(elsewhere), "--no-validate")
    refused(res, 9, f"demo already has an env at {world.prefix()}")
    assert "--name OTHER" in res.stderr and "--force moves demo" in res.stderr
    assert not elsewhere.exists()
    assert world.record()["prefix"] == str(world.prefix())
    # A record whose env is gone (purged) is no env to orphan: the name is rebuilt where asked.
    subprocess.run(["rm", "-rf", str(world.prefix())], check=True)
    ok(world.cli("create", "demo", "--prefix", str(elsewhere), "--no-validate"))
    assert world.record()["prefix"] == str(elsewhere)


def test_name_makes_a_second_env_from_one_recipe(world):
    world.recipe()
    ok(world.cli("create", "demo", "--no-validate"))
    data = world.data("create", "demo", "--name", "demo-b", "--no-validate")
    second = world.prefix("demo-b")  # the recipe's prefix, for the new name
    assert data["status"] == "created" and data["env"]["prefix"] == str(second)
    assert data["env"]["name"] == "demo-b" and data["env"]["recipe"] == "demo"
    rows = {r["name"]: r for r in world.data("list")}
    assert {n: (r["prefix"], r["health"]["status"]) for n, r in rows.items()} == {
        "demo": (str(world.prefix()), "ok"),
        "demo-b": (str(second), "ok"),
    }
    assert world.data("show", "demo-b")["recipe"] == "demo"
    line = ok(world.cli("activate", "demo-b")).stdout.strip()
    assert line == f"source {shlex.quote(str(second / 'bin' / 'activate'))}"
    made = world.data("backup", "demo-b")
    assert made["id"].startswith("demo-b@")
    assert world.data("create", "demo", "--name", "demo-b", "--no-validate")["status"] == "exists"
    ok(world.cli("remove", "demo-b", "--yes"))
    assert not second.exists()
    assert [r["name"] for r in world.data("list")] == ["demo"]
    assert (world.prefix() / "bin" / "python").exists()
    # The second env comes back from its own backup, under its own name.
    restored = world.data("restore", "demo-b", "--no-validate")
    assert restored["env"]["name"] == "demo-b" and restored["env"]["prefix"] == str(second)


@pytest.mark.parametrize("bad", ["../x", ".hidden", "a b", "x" * 101, "-rf", "a\nb"])
def test_a_name_that_is_no_file_name_is_refused(world, bad):
    world.recipe()
    refused(world.cli("create", "demo", f"--name={bad}", "--no-validate"), 2, "is not an env name")
    assert not world.scratch.exists()


def test_an_env_of_another_name_is_never_replaced(world):
    world.recipe()
    ok(world.cli("create", "demo", "--no-validate"))
    (world.prefix() / "marker").write_text("demo's")
    res = world.cli(
        "create", "demo", "--name", "other", "--prefix", str(world.prefix()), "--force", "--no-validate"
    )
    refused(res, 9, "is where the env 'demo' is recorded")
    assert (world.prefix() / "marker").read_text() == "demo's"
    assert not (world.home / "envs" / "other.json").exists()


def test_force_moves_the_env_and_removes_the_old_one_once_the_new_one_is_recorded(world):
    world.recipe()
    ok(world.cli("create", "demo", "--no-validate"))
    old = world.prefix()
    new = world.root / "moved" / "demo"
    data = world.data("create", "demo", "--prefix", str(new), "--force", "--no-validate")
    assert data["status"] == "moved"
    assert any(f"removed the env at {old}" in n for n in data["notes"]), data["notes"]
    assert not old.exists() and world.leftovers(old) == []
    assert world.record()["prefix"] == str(new)
    assert python(new, "import ebdemo, sys; print(sys.prefix)") == str(new)


def test_a_move_killed_after_its_rename_is_finished_by_the_rerun(world):
    world.recipe()
    ok(world.cli("create", "demo", "--no-validate"))
    old = world.prefix()
    new = world.root / "moved" / "demo"
    args = ("create", "demo", "--prefix", str(new), "--force", "--no-validate")
    world.killed_at_the_rename(new, *args)
    # The record still points at the old env, which is still whole: never at a missing one.
    assert world.record()["prefix"] == str(old) and (old / "bin" / "python").exists()
    data = world.data(*args, "--wait", "0")
    assert data["status"] == "moved"
    assert world.record()["prefix"] == str(new)
    assert not old.exists() and world.leftovers(old) == [] and world.leftovers(new) == []


def test_restore_at_another_prefix_refuses_to_orphan_the_env(world):
    world.recipe()
    ok(world.cli("create", "demo", "--no-validate"))
    ok(world.cli("backup", "demo"))
    elsewhere = world.root / "elsewhere"
    res = world.cli("restore", "demo", "--prefix", str(elsewhere), "--no-validate")
    refused(res, 9, "demo already has an env at")
    assert not elsewhere.exists()
    data = world.data("restore", "demo", "--prefix", str(elsewhere), "--force", "--no-validate")
    assert data["status"] == "moved" and not world.prefix().exists()
    assert world.record()["prefix"] == str(elsewhere)
