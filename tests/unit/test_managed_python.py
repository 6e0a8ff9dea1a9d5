"""python.source = "managed" (issue 37 item 7), the pure half: the recipe key's checks, what the plan says of
where the python comes from (module, system, managed with its directory and download source), the mirror rules
for Python downloads, and the refusals (no version, a kind that stands on the site's python, a site that forbids
managed Pythons through its locked setting). The build half is tests/integration/test_managed_cpython.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import PLAN_ENV

from envbuilder import plan
from envbuilder.core import config
from envbuilder.core.errors import BackendError, RecipeError, UsageError
from envbuilder.core.facts import HostFacts
from envbuilder.recipe import loader
from envbuilder.recipe.catalog import Catalog
from envbuilder.resolver import mirror

HOST = HostFacts(arch="x86_64", glibc="2.36", python="3.9.18", gpus=(), hostname="login1")
RECIPE = """schema_version = 1
[recipe]
name = "mp"
[env]
kind = "{kind}"
[python]
{python}
[torch]
install = false
{extra}
"""
PBS = "https://github.com/astral-sh/python-build-standalone/releases/download"


def load(tmp_path: Path, python: str, *, kind: str = "venv", extra: str = "") -> loader.Recipe:
    (tmp_path / "mp.toml").write_text(RECIPE.format(kind=kind, python=python, extra=extra))
    return loader.load("mp", Catalog.from_env({"ENVBUILDER_RECIPE_PATH": str(tmp_path)}))


def make(tmp_path: Path, python: str, env: dict[str, str] | None = None, **kw: str) -> plan.Plan:
    return plan.build(load(tmp_path, python, **kw), HOST, {**PLAN_ENV, **(env or {})})


MANAGED = 'version = "3.12"\nsource = "managed"'


def test_a_managed_python_is_planned_in_the_homes_pythons_with_uvs_default_downloads(tmp_path):
    p = make(tmp_path, MANAGED)
    py = p.python
    assert py["origin"] == "managed" and py["version"] == "3.12" and p.target.python == "3.12"
    # The home is $WORK/.envbuilder in PLAN_ENV; the managed Pythons are its pythons/.
    assert py["managed"]["dir"] == "/work/u1/.envbuilder/pythons"
    assert py["managed"]["mirror"] == "" and "python-build-standalone" in py["managed"]["mirror_source"]
    assert "uv-managed CPython 3.12 in /work/u1/.envbuilder/pythons" in py["where"]
    # The venv step names the managed CPython as uv requests it; create puts the installed path in its place.
    create = p.install_steps[0]
    assert create.creates_env and create.site_python
    assert create.argv[create.argv.index("--python") + 1] == "cpython@3.12"
    assert p.to_json()["python"]["origin"] == "managed"


def test_the_site_python_is_a_modules_or_the_systems(tmp_path):
    system = make(tmp_path, 'command = "python3"').python
    assert system["origin"] == "system" and system["where"] == "python3 on the PATH (no modules load)"
    assert "managed" not in system
    module = make(
        tmp_path,
        'command = "python3"',
        extra='[modules]\nsystem = "lmod"\nload = ["python/3.12"]',
    ).python
    assert module["origin"] == "module" and module["where"] == "python3 on the PATH after loading python/3.12"


def test_a_python_mirror_and_an_index_mirror_rule_send_the_download(tmp_path):
    given = make(tmp_path, MANAGED, {"ENVBUILDER_PYTHON_MIRROR": "https://m.site/pbs/"}).python["managed"]
    assert (given["mirror"], given["mirror_source"]) == ("https://m.site/pbs", "ENVBUILDER_PYTHON_MIRROR")
    # The wheels' rules, for the release URL: a directory target becomes a file:// URL for uv.
    rule = {"ENVBUILDER_INDEX_MIRROR": f"{PBS}/=/srv/pbs pypi=/srv/wheels"}
    ruled = make(tmp_path, MANAGED, rule).python["managed"]
    assert ruled["mirror"] == "file:///srv/pbs" and PBS in ruled["mirror_source"]
    # ENVBUILDER_PYTHON_MIRROR wins over a rule; the newer release URL uv uses is matched too.
    both = mirror.python_downloads({**rule, "ENVBUILDER_PYTHON_MIRROR": "/opt/pbs"})
    assert both.mirror == "file:///opt/pbs"
    newer = mirror.python_downloads({"ENVBUILDER_INDEX_MIRROR": f"{mirror.PYTHON_UPSTREAMS[1]}=https://x/y"})
    assert newer.mirror == "https://x/y"


def test_a_python_mirror_that_is_neither_a_url_nor_a_directory_is_refused():
    with pytest.raises(
        UsageError, match=re.escape("ENVBUILDER_PYTHON_MIRROR: 'mirror.site/pbs' is neither a URL")
    ):
        mirror.python_downloads({"ENVBUILDER_PYTHON_MIRROR": "mirror.site/pbs"})


def test_an_unknown_source_is_a_recipe_error_with_did_you_mean(tmp_path):
    with pytest.raises(RecipeError) as err:
        load(tmp_path, 'version = "3.12"\nsource = "manged"')
    assert "python.source: expected one of site, managed, found string 'manged'" in str(err.value)
    assert err.value.hint == "did you mean 'managed'?"


def test_managed_without_a_version_is_refused_naming_the_key(tmp_path):
    with pytest.raises(RecipeError, match=re.escape("needs python.version")) as err:
        make(tmp_path, 'source = "managed"')
    assert err.value.key == "python.source" and str(tmp_path / "mp.toml") in str(err.value)


@pytest.mark.parametrize("kind", ["conda", "overlay", "user-prefix"])
def test_managed_for_a_kind_that_is_not_a_plain_venv_is_refused(tmp_path, kind):
    with pytest.raises(RecipeError, match=f'venv envs only, not env.kind = "{kind}"'):
        make(
            tmp_path,
            MANAGED,
            kind=kind,
            extra='[conda]\nchannels = ["conda-forge"]' if kind == "conda" else "",
        )


def test_a_site_that_locks_managed_python_off_refuses_the_plan_whatever_the_user_says(tmp_path):
    site = config.FileSettings("/etc/envbuilder/config.toml", {"managed_python": "0"}, frozenset())
    locked = config.FileSettings(site.path, site.values, frozenset({"managed_python"}))
    user_env = {**PLAN_ENV, "ENVBUILDER_MANAGED_PYTHON": "1"}
    # Unlocked, the user's variable wins over the site's default...
    assert make(tmp_path, MANAGED, config.resolve(user_env, site=site).environ(user_env)).python[
        "origin"
    ] == ("managed")
    # ...locked, it is set aside with a warning, and the plan refuses with the reason and the way out.
    resolved = config.resolve(user_env, site=locked)
    assert any("managed_python" in w and "locks it" in w for w in resolved.warnings)
    with pytest.raises(RecipeError, match="this site does not allow uv-managed Pythons") as err:
        make(tmp_path, MANAGED, resolved.environ(user_env))
    assert err.value.key == "python.source" and "envbuilder config" in (err.value.hint or "")
    # The site's python is not affected.
    assert make(tmp_path, 'command = "python3"', resolved.environ(user_env)).python["origin"] == "system"


def test_the_site_file_setting_is_checked_as_a_boolean():
    doc = {"settings": {"managed_python": "no"}}
    with pytest.raises(RecipeError, match="expected true or false"):
        config.read_table(doc, "/etc/envbuilder/config.toml", "/h", site=True)
    ok = config.read_table({"settings": {"managed_python": False}}, "/etc/x.toml", "/h", site=True)
    assert ok.values == {"managed_python": "0"}


@pytest.mark.parametrize("version", ["--help", "3.12; rm", ""])
def test_a_record_whose_managed_version_is_not_a_version_never_reaches_uv(tmp_path, version):
    from envbuilder.backends import managedpython
    from envbuilder.backends.buildlog import BuildLog

    log = BuildLog(tmp_path / "build.log")
    recorded = {"origin": "managed", "version": version, "managed": {"version": version}}
    said: list[str] = []
    try:
        with pytest.raises(BackendError, match=re.escape("is not X.Y or X.Y.Z")):
            managedpython.interpreter(recorded, {"ENVBUILDER_HOME": str(tmp_path)}, log, said.append)
    finally:
        log.close()
    assert said == [] and "+ " not in (tmp_path / "build.log").read_text()  # no command ran
    assert managedpython.interpreter({"origin": "module"}, {}, log, said.append) is None


def test_a_python_module_still_loaded_beside_a_managed_python_is_warned_about(tmp_path):
    modules = '[modules]\nsystem = "lmod"\nload = ["gcc/13.2.0", "python3/3.9.2", "cuda/12.4"]'
    p = make(tmp_path, MANAGED, extra=modules)
    said = [w for w in p.warnings if "a python module" in w]
    assert said == [
        "modules.load loads python3/3.9.2, a python module, though the env's python is the managed CPython 3.12: "
        "drop it unless the env needs it (its PYTHONPATH would reach the env)"
    ]
    assert not [
        w for w in make(tmp_path, 'version = "3.9"', extra=modules).warnings if "a python module" in w
    ]
