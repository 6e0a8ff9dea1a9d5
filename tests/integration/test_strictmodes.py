"""StrictModes for envs (issue 32, finding 4): directories another Unix user owns or can write are refused before
envbuilder builds under them, records in them, backs up to them, reads a registry from them, or hands out a line
that sources a script from them. Real parts: the second Unix user ``ebother`` (tests/sharedfs.py), real modes,
the real CLI building real envs from a local wheel index."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest
from helpers import UserWorld, bash, demo_recipe, ok, refused
from sharedfs import give_to, other_user
from wheelindex import demo_wheels, mirror_env, serve

pytestmark = pytest.mark.integration

#: A small env from the test wheels, at the recipe's default prefix ($SCRATCH/envbuilder/envs/NAME).

#: The exit code of the state family, UnsafePath's.
EXIT_STATE = 9


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    files = tmp_path_factory.mktemp("strict-files")
    demo_wheels(files, tool=False)
    with serve(files) as idx:
        yield idx


class World(UserWorld):
    def __init__(self, root: Path, index) -> None:
        super().__init__(root, mirror_env(index))
        self.scratch.mkdir(parents=True, exist_ok=True)
        self.envs = self.scratch / "envbuilder" / "envs"

    def recipe(self, name: str = "demo") -> str:
        return self.write_recipe(name, demo_recipe(name))

    def create(self, name: str = "demo", **env: str):
        return self.cli("create", self.recipe(name), "--no-validate", **env)


@pytest.fixture
def world(tmp_path, index):
    return World(tmp_path, index)


def test_create_refuses_an_envs_root_another_user_made(world):
    """The finding: $SCRATCH/envbuilder/envs made beforehand by another user; create built there without a word."""
    other = other_user()
    world.envs.mkdir(parents=True)
    give_to(world.envs, other, 0o755)
    res = world.create()
    refused(res, EXIT_STATE, str(world.envs))
    assert "ebother" in res.stderr and "--prefix" in res.stderr
    assert list(world.envs.iterdir()) == []  # nothing was built (or left) in their directory
    # One the user owns (chowned back) is used as it is.
    os.chown(world.envs, os.geteuid(), os.getegid())
    ok(world.create())


@pytest.mark.parametrize("mode", [0o777, 0o775])
def test_create_refuses_an_envs_root_others_can_write(world, mode):
    other = other_user()
    world.envs.mkdir(parents=True)
    # The user's own directory, but others may write it: its group (another user's group) or everyone.
    os.chown(world.envs, os.geteuid(), other.gid)
    world.envs.chmod(mode)
    res = world.create()
    refused(res, EXIT_STATE, str(world.envs))
    assert f"mode {mode:o}" in res.stderr and "chmod go-w" in res.stderr
    assert list(world.envs.iterdir()) == []


def test_a_sticky_shared_scratch_is_fine(world):
    """$SCRATCH itself a /tmp-like 1777 directory: others may add entries, not replace the user's."""
    world.scratch.chmod(0o1777)
    ok(world.create())
    assert (world.envs / "demo" / "bin" / "activate").is_file()
    # Without the sticky bit it is an open directory.
    world.scratch.chmod(0o777)
    refused(world.cli("create", "demo", "--no-validate", "--force"), EXIT_STATE, str(world.scratch))


def test_activate_refuses_a_prefix_or_script_others_can_write(world):
    ok(world.create())
    prefix = world.envs / "demo"
    activate = prefix / "bin" / "activate"
    line = ok(world.cli("activate", "demo")).stdout.strip()
    assert line == f"source {shlex.quote(str(activate))}"

    prefix.chmod(0o777)
    res = world.cli("activate", "demo")
    refused(res, EXIT_STATE, str(prefix))
    assert res.stdout == ""  # no line to source
    refused(world.cli("modulefile", "demo"), EXIT_STATE, str(prefix))
    # Nor does envbuilder run the env's python from it.
    ran = world.cli("run", "demo", "--", "python", "-c", "pass")
    refused(ran, EXIT_STATE, str(prefix))
    assert "writable by everyone" in ran.stderr
    shown = ok(world.cli("show", "demo"))  # show still shows the env, and why there is no line for it
    assert "refused" in shown.stdout and "source " not in shown.stdout
    prefix.chmod(0o755)

    activate.chmod(0o666)
    refused(world.cli("activate", "demo"), EXIT_STATE, str(activate))
    activate.chmod(0o644)
    give_to(activate, other_user(), 0o644)  # another user's script: they could change it at any time
    res = world.cli("activate", "demo")
    refused(res, EXIT_STATE, str(activate))
    assert "ebother" in res.stderr
    # The extension the hook in bin/activate sources counts as much.
    os.chown(activate, os.geteuid(), os.getegid())
    ext = prefix / "envbuilder" / "activate.sh"
    ext.chmod(0o646)
    refused(world.cli("activate", "demo"), EXIT_STATE, str(ext))
    ext.chmod(0o644)
    ok(bash(ok(world.cli("activate", "demo")).stdout.strip() + " && python -c 'import ebdemo'", world.env))


def test_a_home_another_user_owns_is_refused(world):
    home = world.home
    home.mkdir(parents=True)
    give_to(home, other_user(), 0o755)
    res = world.create()
    refused(res, EXIT_STATE, str(home))
    assert "ENVBUILDER_HOME" in res.stderr
    assert not (world.envs / "demo").exists()


def test_a_record_directory_another_user_owns_is_refused(world):
    ok(world.create())
    give_to(world.home / "envs", other_user(), 0o755)  # who owns it could point the record at their env
    res = world.cli("activate", "demo")
    refused(res, EXIT_STATE, str(world.home / "envs"))
    assert res.stdout == ""


def _site_config(world: World, root: Path, group: str) -> Path:
    config = world.root / "site.toml"
    config.write_text(f'[[shared_roots]]\npath = "{root}"\ngroup = "{group}"\n')
    return config


def test_a_group_writable_backup_root_needs_the_site_to_say_so(world):
    other = other_user()
    ok(world.create())
    root = world.root / "project-backups"
    root.mkdir()
    os.chown(root, os.geteuid(), other.gid)  # the project's group (here ebother's) writes it
    root.chmod(0o2770)
    res = world.cli("backup", "demo", "--to", str(root))
    refused(res, EXIT_STATE, str(root))
    assert "shared_roots" in res.stderr and "--to" in res.stderr
    assert list(root.iterdir()) == []

    # The site says that this root is the group's to write: backups go there, and come back.
    config = _site_config(world, root, other.name)
    ok(world.cli("backup", "demo", "--to", str(root), ENVBUILDER_CONFIG=str(config)))
    made = root / "envs" / "demo"
    assert made.is_dir()
    # A colleague's directory in it (another member of the group) is still the group's.
    give_to(made, other, 0o2770)
    ok(
        world.cli(
            "restore", "demo", "--from", str(root), "--force", "--no-validate", ENVBUILDER_CONFIG=str(config)
        )
    )
    refused(
        world.cli("restore", "demo", "--from", str(root), "--force", "--no-validate"), EXIT_STATE, str(root)
    )
    # Only that group's: the colleague's directory with another group is theirs alone.
    os.chown(made, other.uid, 0)
    restore = ("restore", "demo", "--from", str(root), "--force", "--no-validate")
    refused(world.cli(*restore, ENVBUILDER_CONFIG=str(config)), EXIT_STATE, str(made))
    os.chown(made, other.uid, other.gid)

    # Never a root everyone can write, whatever the site says; nor a site config someone else could edit.
    root.chmod(0o2777)
    refused(
        world.cli("backup", "demo", "--to", str(root), ENVBUILDER_CONFIG=str(config)), EXIT_STATE, str(root)
    )
    root.chmod(0o2770)
    config.chmod(0o666)
    refused(
        world.cli("backup", "demo", "--to", str(root), ENVBUILDER_CONFIG=str(config)), EXIT_STATE, str(config)
    )


def test_a_registry_in_a_directory_others_can_write_is_refused(world):
    admin = world.root / "admin-recipes"
    admin.mkdir()
    (admin / "regdemo.toml").write_text(demo_recipe("regdemo"))
    shared = world.root / "shared"
    registry = shared / "registry"
    ok(world.cli("publish", "regdemo", "--registry", str(registry), ENVBUILDER_RECIPE_PATH=str(admin)))
    ok(world.cli("plan", "regdemo", ENVBUILDER_RECIPE_PATH=str(registry)))
    # Whoever can write the directory that holds the registry can put another registry in its place.
    shared.chmod(0o777)
    res = world.cli("plan", "regdemo", ENVBUILDER_RECIPE_PATH=str(registry))
    refused(res, EXIT_STATE, str(shared))
    shared.chmod(0o755)
    give_to(shared, other_user(), 0o755)
    refused(world.cli("plan", "regdemo", ENVBUILDER_RECIPE_PATH=str(registry)), EXIT_STATE, "ebother")
    refused(
        world.cli("publish", "regdemo", "--registry", str(registry), ENVBUILDER_RECIPE_PATH=str(admin)),
        EXIT_STATE,
        str(shared),
    )
