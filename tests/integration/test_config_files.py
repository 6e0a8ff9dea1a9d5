"""The user config file and `envbuilder config` (issue 37, item 4), with real files: a user file at the XDG place,
a site file, the environment, a site's lock, another Unix user's file (tests/sharedfs.py), and the XDG data home
where no variable names the envbuilder home (an existing ~/.envbuilder kept)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from helpers import ok, refused, run_cli
from sharedfs import give_to, other_user

pytestmark = pytest.mark.integration

EXIT_RECIPE = 3
EXIT_STATE = 9  # UnsafePath's family


class Place:
    """A user's HOME with a user config file at the XDG default place, and a site file beside it."""

    def __init__(self, root: Path, home: str = "home") -> None:
        self.home = root / home
        self.user_file = self.home / ".config" / "envbuilder" / "config.toml"
        self.user_file.parent.mkdir(parents=True)
        self.site_file = root / "site" / "config.toml"
        self.site_file.parent.mkdir(exist_ok=True)
        self.env = {"HOME": str(self.home), "COLUMNS": "80"}

    def user(self, text: str) -> None:
        self.user_file.write_text(text, encoding="utf-8")

    def site(self, text: str) -> None:
        self.site_file.write_text(text, encoding="utf-8")
        self.env["ENVBUILDER_CONFIG"] = str(self.site_file)

    def cli(self, *args: str, **extra: str):
        return run_cli(*args, env={**self.env, **extra})

    def settings(self, **extra: str) -> dict[str, dict]:
        data = json.loads(ok(self.cli("config", "list", "--json", **extra)).stdout)["data"]
        return {row["name"]: row for row in data["settings"]}


@pytest.fixture
def place(tmp_path: Path) -> Place:
    return Place(tmp_path)


def test_config_shows_each_value_with_its_source(place):
    place.user('[settings]\nindex_timeout = 5\nprogress_every = 3\nrecipe_path = ["~/recipes"]\n')
    place.site('[settings]\nindex_timeout = 7\nbackup_root = "/srv/backups"\nprogress_every = 9\n')
    rows = place.settings(ENVBUILDER_PROGRESS_EVERY="2")
    assert (rows["progress_every"]["value"], rows["progress_every"]["source"]) == ("2", "env")
    assert (rows["index_timeout"]["value"], rows["index_timeout"]["where"]) == ("5", str(place.user_file))
    assert rows["recipe_path"]["value"] == f"{place.home}/recipes"
    assert (rows["backup_root"]["value"], rows["backup_root"]["where"]) == (
        "/srv/backups",
        str(place.site_file),
    )
    assert rows["no_fuse"]["source"] == "default"
    assert rows["progress_every"]["where"] == "ENVBUILDER_PROGRESS_EVERY"


def test_config_is_a_table_at_80_columns():
    """A pipe's 80 columns hold the table, each source named, the files' paths said once below it."""
    short = Path(tempfile.mkdtemp(prefix="eb", dir="/tmp"))  # a home of a usual length (pytest's are long)
    try:
        place = Place(short, home="")
        place.user("[settings]\nindex_timeout = 5\n")
        place.site("[settings]\nindex_timeout = 7\nprogress_every = 9\n")
        # Empty is unset (the test helpers set ENVBUILDER_OFFLINE=1 where it is absent).
        table = ok(place.cli("config", ENVBUILDER_OFFLINE="")).stdout.splitlines()
    finally:
        shutil.rmtree(short)
    assert table[0].split() == ["SETTING", "VALUE", "SOURCE"], table
    assert all(len(line) <= 80 for line in table), table
    assert next(line for line in table if line.startswith("index_timeout")).split()[1:] == [
        "5",
        "user",
        "file",
    ]
    assert next(line for line in table if line.startswith("progress_every")).split()[1:] == [
        "9",
        "site",
        "file",
    ]
    assert f"user file: {place.user_file}" in table and f"site file: {place.site_file}" in table


def test_the_user_files_recipe_path_is_searched(place):
    recipes = place.home / "recipes"
    recipes.mkdir()
    (recipes / "mine.toml").write_text(
        (Path(__file__).parents[2] / "recipes" / "local.toml").read_text(encoding="utf-8"), encoding="utf-8"
    )
    place.user('[settings]\nrecipe_path = ["~/recipes"]\n')
    listed = json.loads(ok(place.cli("recipes", "list", "--json")).stdout)["data"]
    assert "mine" in json.dumps(listed)


def test_a_locked_key_ignores_the_users_value_and_names_the_site_file(place):
    place.site('[settings]\nindex_mirror = "pypi=/srv/wheels"\n[locked]\nkeys = ["index_mirror"]\n')
    place.user('[settings]\nindex_mirror = "pypi=/home/mine"\n')
    res = ok(place.cli("config", "--json", ENVBUILDER_INDEX_MIRROR="pypi=/env/wheels"))
    rows = {r["name"]: r for r in json.loads(res.stdout)["data"]["settings"]}
    assert (rows["index_mirror"]["value"], rows["index_mirror"]["locked"]) == ("pypi=/srv/wheels", True)
    warnings = [line for line in res.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2, res.stderr
    assert all(str(place.site_file) in w and "locks it" in w for w in warnings)


def test_a_bad_user_file_names_file_key_and_a_close_name(place):
    place.user('[settings]\nindex_mirorr = "pypi=/x"\n')
    res = place.cli("config")
    refused(res, EXIT_RECIPE, f"{place.user_file}: settings.index_mirorr: unknown setting")
    assert "did you mean 'index_mirror'?" in res.stderr


@pytest.mark.parametrize("how", ["owned-by-another", "others-can-write"])
def test_a_user_file_another_user_can_change_is_refused(place, how):
    place.user("[settings]\nindex_timeout = 5\n")
    if how == "owned-by-another":
        give_to(place.user_file, other_user(), 0o644)
    else:
        place.user_file.chmod(0o646)
    res = place.cli("config")
    refused(res, EXIT_STATE, str(place.user_file))
    assert "your config file" in res.stderr


def test_a_site_file_others_can_write_is_refused(place):
    place.site("[settings]\nindex_timeout = 5\n")
    place.site_file.chmod(0o646)
    refused(place.cli("config"), EXIT_STATE, "the site config")


def test_the_home_defaults_to_the_xdg_data_home(place):
    assert place.settings()["home"]["value"] == f"{place.home}/.local/share/envbuilder"
    assert place.settings(XDG_DATA_HOME="/d")["home"]["value"] == "/d/envbuilder"
    assert place.settings(WORK="/w")["home"]["value"] == "/w/.envbuilder"
    place.user('[settings]\nhome = "~/eb"\n')
    assert place.settings(WORK="/w")["home"]["value"] == f"{place.home}/eb"


def test_an_existing_dot_envbuilder_stays_the_home(place):
    """Records made before the XDG home are still found: `list` reads them from ~/.envbuilder."""
    old = place.home / ".envbuilder"
    (old / "envs").mkdir(parents=True)
    row = place.settings()["home"]
    assert (row["value"], row["source"]) == (str(old), "default")
    assert "kept" in row["where"]
    assert f"no envs recorded in {old} " in ok(place.cli("list")).stderr
    assert not (place.home / ".local" / "share" / "envbuilder").exists()


def test_the_user_files_home_reaches_the_commands(place):
    """The value from the file is where a command looks for its records."""
    place.user('[settings]\nhome = "~/eb"\n')
    assert f"no envs recorded in {place.home}/eb " in ok(place.cli("list")).stderr
    assert f"no envs recorded in {place.home}/eb " in ok(place.cli("list", WORK="/w")).stderr


def test_a_locked_key_sets_a_flag_aside(place):
    """A site that locks ``offline`` off: ``--offline`` is ignored, with a warning, and the indexes are read (here
    a loopback port where nothing listens, so every read fails and the plan falls back to the shipped table)."""
    place.site('[settings]\noffline = false\n[locked]\nkeys = ["offline"]\n')
    dead = "http://127.0.0.1:9/"
    res = ok(
        place.cli(
            "recipes",
            "show",
            "local",
            "--offline",
            "--explain",
            ENVBUILDER_INDEX_MIRROR=f"https://download.pytorch.org/whl/={dead} pypi={dead}",
        )
    )
    assert f"the flag --offline is ignored: the site file {place.site_file} locks it" in res.stderr
    assert "every index read failed" in res.stdout and "127.0.0.1:9" in res.stdout
