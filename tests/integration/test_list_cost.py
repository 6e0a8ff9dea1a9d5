"""`list`, `show` and `doctor` read the records and stat a few files per env: they never walk an env. Seen through
an audit hook on the in-process CLI: every directory listed and every file opened inside an env's tree is caught
(a stat raises no audit event; its count is the bench's business, scripts/bench_list.py)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import UserWorld, ok
from wheelindex import build_wheel, mirror_env
from wheelindex import serve as serve_wheels

RECIPE = """schema_version = 1
[recipe]
name = "{name}"
[env]
kind = "venv"
installer = "uv"
prefix = "${{SCRATCH}}/envs/{{name}}"
[python]
command = "python3"
[torch]
install = false
[[packages]]
name = "ebdemo"
spec = "ebdemo==1.0"
[filesystems.scratch]
path = "${{SCRATCH}}"
purge_days = 10
touch_allowed = false
"""

#: What the hook records into, while `watching` holds it (an audit hook cannot be removed).
_watch: list[list[tuple[str, str]]] = []


def _hook(event: str, args: tuple[Any, ...]) -> None:
    watched = event in ("open", "os.listdir", "os.scandir") and args
    if _watch and watched and isinstance(args[0], (str, bytes, os.PathLike)):
        _watch[0].append((event, os.path.abspath(os.fsdecode(args[0]))))


sys.addaudithook(_hook)


@contextlib.contextmanager
def watching() -> Iterator[list[tuple[str, str]]]:
    seen: list[tuple[str, str]] = []
    _watch.append(seen)
    try:
        yield seen
    finally:
        _watch.clear()


def inside(seen: list[tuple[str, str]], prefix: Path) -> list[tuple[str, str]]:
    return [(event, path) for event, path in seen if Path(path).is_relative_to(prefix)]


@pytest.fixture(scope="module")
def small_index(tmp_path_factory):
    d = tmp_path_factory.mktemp("small")
    build_wheel(d, "ebdemo", "1.0", {"ebdemo/__init__.py": "VERSION = '1.0'\n"})
    with serve_wheels(d) as idx:
        yield idx


def test_list_show_and_doctor_never_walk_an_env(tmp_path, small_index):
    site = UserWorld(tmp_path, mirror_env(small_index), ENVBUILDER_OFFLINE="1")
    site.write_recipe("big", RECIPE.format(name="big"))
    ok(site.cli("create", "big", "--no-validate", timeout=300))
    prefix = site.scratch / "envs" / "big"
    # A real env holds thousands of files in hundreds of directories: a walk would list each of these.
    bulk = next(prefix.glob("lib/python*/site-packages")) / "bulk"
    for i in range(200):
        (bulk / f"d{i}").mkdir(parents=True)
        (bulk / f"d{i}" / "m.py").write_text("")

    with watching() as seen:
        [row] = site.data("list")
    assert row["health"]["status"] == "ok" and 9.9 < row["purge"]["days_left"] <= 10
    assert inside(seen, prefix) == []

    with watching() as seen:
        shown = site.data("show", "big")
    assert shown["health"]["status"] == "ok"
    assert inside(seen, prefix) == []

    with watching() as seen:
        res = ok(site.cli("doctor", "--json"))
    assert json.loads(res.stdout)["data"]["envs"] == ["big"]
    # The doctor lists what it must (where the env keeps CUDA libraries: site-packages' nvidia/*/lib): a few
    # directories, whatever the env holds.
    listed = sorted({path for event, path in inside(seen, prefix) if event != "open"})
    assert len(listed) <= 4, listed
    assert not any("bulk" in path for path in listed)


def test_the_purge_and_damage_are_still_seen_without_a_walk(tmp_path, small_index):
    site = UserWorld(tmp_path, mirror_env(small_index), ENVBUILDER_OFFLINE="1")
    site.write_recipe("old", RECIPE.format(name="old"))
    ok(site.cli("create", "old", "--no-validate", timeout=300))
    prefix = site.scratch / "envs" / "old"
    module = next(prefix.glob("lib/python*/site-packages/ebdemo/__init__.py"))
    # Unread for 9 of its 10 days: found as the least recently read file (the purge's first victim).
    old = module.stat().st_atime - 9 * 86400
    os.utime(module, (old, module.stat().st_mtime))
    [row] = site.data("list")
    assert row["purge"]["days_left"] < 1.1 and row["purge"]["oldest"].endswith("ebdemo/__init__.py")
    module.unlink()
    [row] = site.data("list")
    assert row["health"]["status"] == "damaged" and "ebdemo/__init__.py" in row["health"]["detail"]
