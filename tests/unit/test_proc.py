"""proc: a Ctrl-C that lands while a child is being forked is not lost (real fork, real signals, in a child
Python so the test runner's own handlers stay out of it)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from conftest import REPO

# The SIGINT is sent from a fork callback in the parent, the moment where Python prints a KeyboardInterrupt as
# "Exception ignored" and drops it. Before the fix, proc.run then waited out the whole child.
SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    from envbuilder import proc
    os.register_at_fork(after_in_parent=lambda: os.kill(os.getpid(), signal.SIGINT))
    t = time.monotonic()
    try:
        if sys.argv[1] == "run":
            proc.run(["sleep", "30"])
        else:
            with proc.feeding(["sleep", "30"]) as pipe:
                time.sleep(30)
        print("not interrupted")
    except KeyboardInterrupt:
        print(f"interrupted after {time.monotonic() - t:.1f} s")
    """
)


@pytest.mark.parametrize("how", ["run", "feeding"])
def test_ctrl_c_during_the_fork_interrupts_and_kills_the_child(how):
    res = subprocess.run(
        [sys.executable, "-c", SCRIPT, how], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert res.stdout.startswith("interrupted after "), res.stdout + res.stderr
    assert float(res.stdout.split()[2]) < 10  # not the child's 30 s
    assert "Exception ignored" not in res.stderr
