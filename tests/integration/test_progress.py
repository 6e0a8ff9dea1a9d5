"""Progress on long work, as a user sees it. In a batch job's output: a create from a local index throttled to
2 MB/s shows bytes and rate on stderr while uv downloads, beside the total uv announced, each step line says how
long it took, and the build log fills as uv works (stderr read line by line from a spawned CLI, each line marked with whether the index was still
sending the wheel when it arrived). On a terminal: a live row with bytes and rate, colour only without NO_COLOR.
And validation shows each check as the ranks finish it."""

from __future__ import annotations

import base64
import json
import os
import re
import threading
import time
from pathlib import Path

import pytest
from helpers import UserWorld, cli_env, ok, on_terminal, spawn_cli
from wheelindex import build_wheel, mirror_env, serve

pytestmark = pytest.mark.integration

RECIPE = """
schema_version = 1
[recipe]
name = "big"
[env]
kind = "venv"
installer = "uv"
[python]
command = "python3"
[torch]
install = false
[[packages]]
name = "ebbig"
spec = "ebbig==1.0"
"""

WHEEL = "ebbig-1.0-py3-none-any.whl"
#: Bytes a second: the ~6 MB wheel takes about three seconds.
RATE = 2_000_000
#: A progress line in a log: ``    installing ebbig: 2.1 MB written, 1.9 MB/s, 1 s``, and once uv has announced its
#: downloads ``; downloads 0 of 1 done (0 bytes of 6.0 MB)``.
PROGRESS = re.compile(
    r"^    installing [^:]+: [\d.]+ [kMG]?B written, [\d.]+ [kMG]?B/s, \d+ s(; downloads .+)?$"
)
#: The wheel's size as uv announced it (``Downloading ebbig (5.7MiB)``), none of it finished yet.
TOTAL = re.compile(r"; downloads 0 of 1 done \(0 bytes of [5-7]\.\d MB\)$")


@pytest.fixture(scope="module")
def slow_index(tmp_path_factory):
    files = tmp_path_factory.mktemp("big")
    # base64 of random bytes: deflate gets it down to about 6 MB and no further.
    blob = base64.b64encode(os.urandom(6_000_000)).decode()
    build_wheel(files, "ebbig", "1.0", {"ebbig/__init__.py": "", "ebbig/blob.txt": blob})
    with serve(files, rate=RATE) as index:
        yield index


def _wait_for(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_a_slow_install_shows_its_progress_and_fills_its_log_while_it_runs(tmp_path, slow_index):
    world = UserWorld(tmp_path, mirror_env(slow_index), ENVBUILDER_PROGRESS_EVERY="0.5")
    world.write_recipe("big", RECIPE)
    child = world.spawn("create", "big", "--prefix", str(tmp_path / "envs" / "big"), "--no-validate")
    seen: list[tuple[str, bool]] = []  # each stderr line, and whether the wheel was still on its way

    def read() -> None:
        assert child.stderr is not None
        for line in child.stderr:
            seen.append((line.rstrip("\n"), WHEEL in slow_index.sending))

    reader = threading.Thread(target=read, daemon=True)
    logs = world.home / "logs"
    with child:  # closes the pipes on the way out
        reader.start()
        try:
            assert _wait_for(lambda: WHEEL in slow_index.sending), "the wheel was never requested"
            # While the wheel is still on its way, the log already holds what uv said so far.
            log_then = next(logs.glob("big-*.log")).read_text()
            still_sending = WHEEL in slow_index.sending
            child.wait(timeout=120)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        reader.join(10)
        assert child.stdout is not None
        out = child.stdout.read()  # a few lines: the pipe never filled (stderr has its reader)
    err = "\n".join(line for line, _ in seen)
    assert child.returncode == 0, err

    assert still_sending
    assert "uv pip install" in log_then
    assert re.search(r"\] (out|err)\| \S", log_then), log_then

    during = [line for line, sending in seen if sending and PROGRESS.match(line)]
    assert during, err  # bytes and rate on stderr while the download ran, not only after
    assert any(TOTAL.search(line) for line in during), err  # and the total to read them against
    assert "→ installing" in err  # each step's start, in a log
    took = [float(m.group(1)) for m in re.finditer(r"✓ installing \S.* (\d+\.\d) s", err)]
    assert took and max(took) >= 2.0, err  # the throttled install's duration, not when it started
    assert re.search(r"✓ creating the env  \d+\.\d s", err), err

    # Progress is for people: nothing on stdout, no escape codes in a log.
    assert "→" not in out and "✓" not in out and "MB/s" not in out
    assert "\x1b[" not in err
    # The whole uv output was streamed, line by line, with its exit status and time.
    log = next(Path(logs).glob("big-*.log")).read_text()
    assert re.search(r"\(exit 0, \d+\.\d s\)", log), log


def test_create_json_keeps_its_progress_on_stderr_and_quiet_silences_it(tmp_path, slow_index):
    """A batch job's `create --json`: the JSON alone on stdout, the steps and bytes on stderr; -q: nothing."""
    world = UserWorld(tmp_path, mirror_env(slow_index), ENVBUILDER_PROGRESS_EVERY="0.5")
    world.write_recipe("big", RECIPE)
    res = ok(world.cli("create", "big", "--prefix", str(tmp_path / "big"), "--no-validate", "--json"))
    assert json.loads(res.stdout)["data"]["env"]["name"] == "big"
    lines = res.stderr.splitlines()
    assert any(PROGRESS.match(line) for line in lines), res.stderr
    assert re.search(r"✓ installing ebbig==1\.0  \d+\.\d s", res.stderr), res.stderr
    quiet = ("create", "big", "--name", "big2", "--prefix", str(tmp_path / "big2"), "--no-validate")
    res = ok(world.cli(*quiet, "--json", "-q"))
    assert json.loads(res.stdout)["data"]["env"]["name"] == "big2"
    assert "✓" not in res.stderr and "→" not in res.stderr and "MB/s" not in res.stderr, res.stderr


def test_backup_and_restore_show_the_bytes_each_step_wrote(tmp_path, slow_index):
    world = UserWorld(tmp_path, mirror_env(slow_index))
    world.write_recipe("big", RECIPE)
    made = world.cli("create", "big", "--prefix", str(tmp_path / "big"), "--no-validate")
    assert made.returncode == 0, made.stderr
    backed = world.cli("backup", "big", "--mode", "archive", "--to", str(tmp_path / "backups"))
    assert backed.returncode == 0, backed.stderr
    # The archive of ~8 MB of random text: zstd leaves about 6 MB.
    assert re.search(r"✓ archiving \S+ \(tar\)  \d+\.\d s  [5-9]\.\d MB$", backed.stderr, re.M), backed.stderr
    assert "✓" not in backed.stdout
    target = ("--prefix", str(tmp_path / "big2"), "--name", "big2")
    restored = world.cli("restore", "big", "--from", str(tmp_path / "backups"), *target, "--no-validate")
    assert restored.returncode == 0, restored.stderr
    assert re.search(r"✓ extracting env\.tar\.zst  \d+\.\d s  [7-9]\.\d MB$", restored.stderr, re.M), (
        restored.stderr
    )


#: Any SGR sequence that sets a colour (30-38, 90-97 foreground; 40-48, 100-107 background).
COLOUR = re.compile(r"\x1b\[(?:\d+;)*(?:3[0-8]|9[0-7]|4[0-8]|10[0-7])(?:;\d+)*m")


@pytest.mark.parametrize("no_color", [False, True])
def test_on_a_terminal_the_install_is_a_live_row_with_bytes_and_rate(tmp_path, slow_index, no_color):
    world = UserWorld(tmp_path, mirror_env(slow_index))
    world.write_recipe("big", RECIPE)
    env = {k: v for k, v in cli_env(world.env).items() if k != "NO_COLOR"}
    env.update(TERM="xterm-256color", **({"NO_COLOR": "1"} if no_color else {}))
    code, shown, _ = on_terminal(
        ("create", "big", "--prefix", str(tmp_path / "big"), "--no-validate"), env, 100, stderr_too=True
    )
    assert code == 0, shown
    frames = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown).replace("\r\n", "\n").split("\r")
    row = re.compile(r"installing ebbig==1\.0 +[\d.]+ [kM]B written, [\d.]+ [kM]B/s")
    assert any(row.search(f) for f in frames), shown
    assert re.search(r"✓ installing ebbig==1\.0  \d+\.\d s  [\d.]+ MB\n", "".join(frames)), shown
    assert "→" not in shown  # the live row stands for the start line
    assert bool(COLOUR.search(shown)) is not no_color


def test_validation_shows_each_check_as_the_ranks_finish_it(cpu_torch_world):
    """rank 1 hangs in ddp until the per-check timeout: import's line is on stderr long before the run ends. (30 s:
    on a loaded 2-core machine two ranks' `import torch` alone took more than 15 s.)"""
    env = {**cpu_torch_world.env, "ENVBUILDER_VALIDATE_FAULT": "1:ddp:hang"}
    child = spawn_cli("validate", "vcpu", "--checks", "import,ddp", "--timeout", "30", env=env)
    arrived: dict[str, float] = {}
    with child:
        assert child.stderr is not None
        for line in child.stderr:
            arrived.setdefault(line.strip(), time.monotonic())
        child.wait(timeout=300)
        ended = time.monotonic()
    lines = list(arrived)
    assert child.returncode == 8, lines
    done = next((line for line in lines if line.startswith("✓ import: pass")), None)
    assert done is not None, lines
    assert ended - arrived[done] > 5, lines  # shown as it finished, not with the report
