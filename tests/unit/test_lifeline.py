"""A validation rank's lifeline (envbuilder/payloads/validate.py: Lifeline) against real processes: it knows
envbuilder by the start time envbuilder gave itself, which under qemu-user (an aarch64 node emulated through
binfmt_misc, as tests/armtwin.py does) is qemu's own, a few ticks after the one every other process reads."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from typing import Any

from helpers import REPO

PAYLOADS = REPO / "envbuilder" / "payloads"
sys.path.insert(0, str(PAYLOADS))
_spec = importlib.util.spec_from_file_location("payload_validate", PAYLOADS / "validate.py")
assert _spec is not None and _spec.loader is not None
payload: Any = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(payload)


def watching(pid: int, given: int) -> Any:
    """A rank's Lifeline watching ``pid`` as the lifeline gave it (its watcher thread not started)."""
    line = object.__new__(payload.Lifeline)
    line.parent, line.beat = None, None
    line.envbuilder = payload._seen((pid, given))
    return line


def test_a_start_time_qemu_gave_envbuilder_for_itself_is_not_taken_for_a_gone_process() -> None:
    real = payload._start_time(os.getpid())
    assert real is not None
    assert watching(os.getpid(), real + 6).gone() is None  # 6 ticks late, as measured under qemu-aarch64
    assert watching(os.getpid(), real).gone() is None


def test_a_pid_now_held_by_another_process_is_gone() -> None:
    real = payload._start_time(os.getpid())
    assert real is not None
    gone = watching(os.getpid(), real - 10 * payload.START_SKEW_TICKS).gone()
    assert gone is not None and f"envbuilder (pid {os.getpid()})" in gone


def test_an_exited_process_is_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    started = payload._start_time(child.pid)
    line = watching(child.pid, started + 3)
    assert line.gone() is None
    child.kill()
    child.wait()
    assert line.gone() is not None
