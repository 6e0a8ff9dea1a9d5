"""The settings' precedence, decided in one pure place (``core.config``): flag > environment > user file > site
file > default, a site's locked keys, and the config files' checks (file, key, what was expected)."""

from __future__ import annotations

import pytest

from envbuilder.core import config, settings
from envbuilder.core.errors import RecipeError

USER = "/h/.config/envbuilder/config.toml"
SITE = "/etc/envbuilder/config.toml"


def user(**values: str) -> config.FileSettings:
    return config.FileSettings(USER, values)


def site(locked: tuple[str, ...] = (), **values: str) -> config.FileSettings:
    return config.FileSettings(SITE, values, frozenset(locked))


def one(resolved: config.Resolved, name: str) -> config.Effective:
    return next(s for s in resolved.settings if s.setting.name == name)


@pytest.mark.parametrize(
    ("env", "in_user", "in_site", "value", "source"),
    [
        ({"ENVBUILDER_INDEX_TIMEOUT": "3"}, "5", "7", "3", "env ENVBUILDER_INDEX_TIMEOUT"),
        ({}, "5", "7", "5", f"user file {USER}"),
        ({}, None, "7", "7", f"site file {SITE}"),
        ({}, None, None, None, "default"),
        ({"ENVBUILDER_INDEX_TIMEOUT": ""}, None, "7", "7", f"site file {SITE}"),  # empty is unset
    ],
    ids=["env-beats-user", "user-beats-site", "site-beats-default", "default", "empty-env-is-unset"],
)
def test_env_beats_the_user_file_beats_the_site_file_beats_the_default(env, in_user, in_site, value, source):
    env = {"HOME": "/h", **env}
    resolved = config.resolve(
        env,
        user(**({"index_timeout": in_user} if in_user else {})),
        site(**({"index_timeout": in_site} if in_site else {})),
    )
    got = one(resolved, "index_timeout")
    assert (got.value, got.described) == (value, source)
    assert (resolved.environ(env).get("ENVBUILDER_INDEX_TIMEOUT") or None) == value
    assert not resolved.warnings


def test_a_flag_beats_the_environment():
    resolved = config.resolve({"ENVBUILDER_OFFLINE": "0"}, user(offline="0"), flags={"offline": "1"})
    assert one(resolved, "offline").described == "flag --offline"


def test_a_tools_own_variable_is_heeded_first():
    resolved = config.resolve({"UV_CACHE_DIR": "/u"}, user(uv_cache="/f"))
    assert one(resolved, "uv_cache").described == "env UV_CACHE_DIR"


def test_a_locked_key_takes_the_site_value_and_says_what_was_ignored():
    env = {"ENVBUILDER_INDEX_MIRROR": "pypi=/mine"}
    resolved = config.resolve(
        env, user(index_mirror="pypi=/user"), site(("index_mirror",), index_mirror="pypi=/s")
    )
    got = one(resolved, "index_mirror")
    assert (got.value, got.source, got.locked) == ("pypi=/s", "site", True)
    assert len(resolved.warnings) == 2
    assert all(SITE in w and "locks it" in w for w in resolved.warnings)
    assert "$ENVBUILDER_INDEX_MIRROR" in resolved.warnings[0] and USER in resolved.warnings[1]
    assert resolved.environ(env)["ENVBUILDER_INDEX_MIRROR"] == "pypi=/s"


def test_a_locked_key_the_site_does_not_set_is_the_default_for_everyone():
    env = {"UV_CACHE_DIR": "/u", "ENVBUILDER_UV_CACHE": "/e", "PATH": "/bin"}
    resolved = config.resolve(env, site=site(("uv_cache",)))
    got = one(resolved, "uv_cache")
    assert (got.value, got.source) == (None, "default")
    assert SITE in got.where
    assert resolved.environ(env) == {"PATH": "/bin"}  # both variables taken out
    assert len(resolved.warnings) == 1


def test_a_locked_key_given_the_sites_own_value_warns_of_nothing():
    resolved = config.resolve({"ENVBUILDER_OFFLINE": "1"}, site=site(("offline",), offline="1"))
    assert not resolved.warnings


def test_an_existing_dot_envbuilder_is_the_home_where_nothing_names_one():
    legacy = "/h/.envbuilder"
    got = one(config.resolve({"HOME": "/h"}, legacy_home=legacy), "home")
    assert (got.value, got.source) == (legacy, "default")
    assert "kept" in got.where
    assert one(config.resolve({"HOME": "/h", "WORK": "/w"}, legacy_home=legacy), "home").value is None
    assert one(config.resolve({"HOME": "/h"}, user(home="/x"), legacy_home=legacy), "home").value == "/x"


def test_file_values_become_their_variables_strings():
    doc = {
        "settings": {
            "home": "~/eb",
            "recipe_path": ["~/r1", "/r2"],
            "offline": True,
            "progress_every": 2.5,
            "index_mirror": "pypi=/w",
        }
    }
    values = config.read_table(doc, USER, "/h", site=False).values
    assert values == {
        "home": "/h/eb",
        "recipe_path": "/h/r1:/r2",
        "offline": "1",
        "progress_every": "2.5",
        "index_mirror": "pypi=/w",
    }


@pytest.mark.parametrize(
    ("doc", "site_file", "key", "words"),
    [
        ({"settings": {"hmoe": "/x"}}, False, "settings.hmoe", "did you mean 'home'?"),
        ({"home": "/x"}, False, "home", "put it under [settings]"),
        ({"settings": {"home": "rel/dir"}}, False, "settings.home", "expected an absolute path"),
        ({"settings": {"offline": "yes"}}, False, "settings.offline", "expected true or false"),
        ({"settings": {"index_timeout": 0}}, False, "settings.index_timeout", "positive number"),
        ({"settings": {"recipe_path": "/a:/b"}}, False, "settings.recipe_path", "an array"),
        ({"settings": "x"}, False, "settings", "expected a table"),
        ({"locked": {"keys": ["index_mirorr"]}}, True, "locked.keys", "did you mean 'index_mirror'?"),
        ({"locked": {"key": ["home"]}}, True, "locked.key", "expected keys"),
        ({"locked": {"keys": ["home"]}}, False, "locked", "unknown key"),  # a user cannot lock
    ],
    ids=[
        "typo",
        "top-level",
        "relative",
        "bool",
        "seconds",
        "paths",
        "table",
        "locked-typo",
        "locked-key",
        "user-lock",
    ],
)
def test_a_bad_file_names_the_file_the_key_and_what_was_expected(doc, site_file, key, words):
    path = SITE if site_file else USER
    with pytest.raises(RecipeError) as caught:
        config.read_table(doc, path, "/h", site=site_file)
    error = caught.value
    assert (error.file, error.key) == (path, key)
    assert words in f"{error.message} {error.hint}"


def test_xdg_places():
    assert str(settings.user_config({"HOME": "/h"})) == "/h/.config/envbuilder/config.toml"
    assert str(settings.user_config({"HOME": "/h", "XDG_CONFIG_HOME": "/c"})) == "/c/envbuilder/config.toml"
    assert str(settings.data_home({"HOME": "/h"})) == "/h/.local/share/envbuilder"


def test_every_setting_has_its_variable_in_the_help():
    from envbuilder.cli import helptext

    for setting in config.SETTINGS:
        assert setting.var in helptext.VARIABLES or setting.var == "ENVBUILDER_UV_CACHE", setting.name
