"""The installer version a create records (backends/toolversion.py): asked once per program file, asked again once
the file changes, never remembered for a program run through an interpreter, and a bad cache only ignored."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from envbuilder.backends import toolversion
from envbuilder.backends.buildlog import BuildLog

#: A real program standing in for an installer: says its version and counts how often it was asked.
TOOL = """#!/bin/sh
echo asked >> "{count}"
echo "faketool {version}"
"""


def make_tool(tmp_path: Path, version: str) -> tuple[Path, Path]:
    tool, count = tmp_path / "faketool", tmp_path / "asked"
    tool.write_text(TOOL.format(count=count, version=version))
    tool.chmod(0o755)
    return tool, count


def asked(count: Path) -> int:
    return len(count.read_text().splitlines()) if count.exists() else 0


@pytest.fixture
def log(tmp_path: Path):
    build_log = BuildLog(tmp_path / "logs" / "build.log")
    yield build_log
    build_log.close()


def env() -> dict[str, str]:
    return {"PATH": os.environ["PATH"]}


def test_an_unchanged_program_is_asked_once(tmp_path, log):
    tool, count = make_tool(tmp_path, "1.2.3")
    cache = tmp_path / "home" / "cache" / "tools.json"
    assert toolversion.version([str(tool)], env(), log, cache) == "1.2.3"
    assert toolversion.version([str(tool)], env(), log, cache) == "1.2.3"
    assert asked(count) == 1
    assert "remembered: the program is unchanged" in log.path.read_text()  # the log says where it came from
    assert json.loads(cache.read_text())["tools"][str(tool)]["version"] == "1.2.3"


def test_a_replaced_program_is_asked_again(tmp_path, log):
    tool, count = make_tool(tmp_path, "1.2.3")
    cache = tmp_path / "cache.json"
    assert toolversion.version([str(tool)], env(), log, cache) == "1.2.3"
    fresh = tmp_path / "new"
    fresh.write_text(TOOL.format(count=count, version="1.3.0"))
    fresh.chmod(0o755)
    fresh.replace(tool)  # an upgrade: a new file at the same path
    assert toolversion.version([str(tool)], env(), log, cache) == "1.3.0"
    assert asked(count) == 2


def test_a_program_run_through_an_interpreter_is_always_asked(tmp_path, log):
    script = tmp_path / "tool.py"
    script.write_text("import sys; print('tool 4.5'); open(sys.argv[1] + '.n', 'a').write('x')\n")
    # `python -m tool` style: the answer depends on the env the interpreter runs, so nothing is remembered.
    program = [sys.executable, str(script), str(tmp_path / "count")]
    cache = tmp_path / "cache.json"
    toolversion.version(program, env(), log, cache)
    toolversion.version(program, env(), log, cache)
    assert (tmp_path / "count.n").read_text() == "xx"
    assert not cache.exists()


@pytest.mark.parametrize(
    "content", ["not json", '{"version": 99, "tools": {}}', '{"version": 1, "tools": []}']
)
def test_a_bad_cache_is_ignored_and_replaced(tmp_path, log, content):
    tool, count = make_tool(tmp_path, "2.0")
    cache = tmp_path / "cache.json"
    cache.write_text(content)
    assert toolversion.version([str(tool)], env(), log, cache) == "2.0"
    assert asked(count) == 1
    assert json.loads(cache.read_text())["version"] == toolversion.VERSION


def test_a_program_that_cannot_say_gives_none_and_is_not_remembered(tmp_path, log):
    tool = tmp_path / "mute"
    tool.write_text("#!/bin/sh\nexit 3\n")
    tool.chmod(0o755)
    cache = tmp_path / "cache.json"
    assert toolversion.version([str(tool)], env(), log, cache) is None
    assert not cache.exists()
