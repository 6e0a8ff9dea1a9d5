"""A compute node without a network (a network namespace with loopback only, tests/offline_node.py): create
against an upstream index stops with envbuilder's own error, naming the URL, the cause and the way out; against a
mirror on the node's loopback it works; an env backed up as a wheelhouse comes back there from its backup alone."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers import UserWorld, cli_argv, demo_recipe
from offline_node import run_offline, why_not
from wheelindex import demo_wheels

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(why_not() is not None, reason=f"no network namespace: {why_not()}"),
]


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("files")
    demo_wheels(d, tool=False)
    return d


def test_create_without_network_names_the_url_the_cause_and_the_way_out(tmp_path):
    world = UserWorld(tmp_path)  # no mirror: PyPI itself, which nothing in the namespace reaches
    world.write_recipe("offline", demo_recipe("offline"))
    res = run_offline(cli_argv("create", "offline", "--no-validate"), world.env)
    assert res.returncode == 11, res.stderr
    err = res.stderr
    assert "could not reach https://pypi.org/simple" in err, err
    assert "does not resolve here" in err or "no network route" in err, err
    assert "ENVBUILDER_INDEX_MIRROR" in err and "wheelhouse" in err and "envbuilder restore" in err, err
    assert "Traceback" not in err
    envs = world.scratch / "envbuilder" / "envs"
    assert not envs.exists() or list(envs.iterdir()) == [], "a failed create left something behind"


def test_create_without_network_in_json_names_the_url(tmp_path):
    world = UserWorld(tmp_path)
    world.write_recipe("offline", demo_recipe("offline"))
    res = run_offline(cli_argv("create", "offline", "--no-validate", "--json"), world.env)
    assert res.returncode == 11, res.stderr
    error = json.loads(res.stdout)["errors"][0]
    assert error["type"] == "NetworkError" and error["family"] == "command", error
    assert error["url"].startswith("https://pypi.org/simple"), error
    assert error["argv"][0].endswith("uv"), error


def test_create_without_network_works_from_a_mirror_on_the_node(tmp_path, wheels):
    world = UserWorld(tmp_path)
    world.write_recipe("offline", demo_recipe("offline"))
    res = run_offline(cli_argv("create", "offline", "--no-validate"), world.env, serve=wheels)
    assert res.returncode == 0, res.stderr
    assert list((world.scratch / "envbuilder" / "envs").glob("offline/lib/python*/site-packages/ebdemo"))


def test_create_says_up_front_that_the_plan_could_not_read_the_index(tmp_path):
    world = UserWorld(tmp_path)
    env = {k: v for k, v in world.env.items() if k != "ENVBUILDER_OFFLINE"}  # let the plan read the index
    res = run_offline(cli_argv("create", "local", "--no-validate"), env)
    assert res.returncode == 11, res.stderr
    err = res.stderr
    _, _, rest = err.partition("the plan could not read the wheel index")
    assert rest, err
    assert "download.pytorch.org" in rest.splitlines()[0], err
    # Said before the build started, and again in the error.
    assert "could not reach https://download.pytorch.org/whl/" in rest, err
    assert "ENVBUILDER_INDEX_MIRROR" in rest, err


def test_lock_without_network_names_the_url_and_the_way_out(tmp_path):
    world = UserWorld(tmp_path)
    world.write_recipe("offline", demo_recipe("offline"))
    res = run_offline(cli_argv("lock", "offline"), world.env)
    assert res.returncode == 11, res.stderr
    assert "uv could not reach https://pypi.org/simple" in res.stderr, res.stderr
    assert "ENVBUILDER_INDEX_MIRROR" in res.stderr, res.stderr


def test_restore_without_network_rebuilds_from_the_wheelhouse_backup(tmp_path, wheels):
    """The way out the error names: an env backed up as a wheelhouse where an index was reachable comes back on a
    node without a network (after the purge took it) from the backup alone, and its python imports what it held."""
    world = UserWorld(tmp_path, ENVBUILDER_BACKUP_ROOT=str(tmp_path / "backups"))
    world.write_recipe("offline", demo_recipe("offline"))
    res = run_offline(cli_argv("create", "offline", "--no-validate"), world.env, serve=wheels)
    assert res.returncode == 0, res.stderr
    res = run_offline(cli_argv("backup", "offline", "--mode", "wheelhouse"), world.env)
    assert res.returncode == 0, res.stderr
    prefix = world.scratch / "envbuilder" / "envs" / "offline"
    subprocess.run(["rm", "-rf", str(prefix)], check=True)  # the scratch purge
    res = run_offline(cli_argv("restore", "offline"), world.env)
    assert res.returncode == 0, res.stderr
    assert "could not reach" not in res.stderr
    used = run_offline(
        ["bash", "-c", f"source {prefix}/bin/activate && python -c 'import ebdemo; print(ebdemo.__file__)'"],
        world.env,
    )
    assert used.returncode == 0, used.stderr
    assert used.stdout.startswith(str(prefix)), used.stdout
