"""proc: a Ctrl-C that lands while a child is being forked is not lost (real fork, real signals, in a child
Python so the test runner's own handlers stay out of it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import REPO

from envbuilder.core.errors import CommandFailed
from envbuilder.system import proc

# The SIGINT is sent from a fork callback in the parent, the moment where Python prints a KeyboardInterrupt as
# "Exception ignored" and drops it. Before the fix, proc.run then waited out the whole child.
SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    from envbuilder.system import proc
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


# A child that starts a grandchild in a session of its own which ignores SIGTERM (torchrun's workers are in
# sessions of their own; a rank blocked in C++ does not act on SIGTERM). The grandchild writes its pid first.
TREE = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    from envbuilder.system import proc
    grandchild = (
        "import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(300)"
    )
    child = (
        "import subprocess, sys, time; "
        f"subprocess.Popen([sys.executable, '-c', {grandchild!r}, sys.argv[1]], start_new_session=True); "
        "time.sleep(300)"
    )
    argv = [sys.executable, "-c", child, sys.argv[2]]
    how = sys.argv[1]
    on_line = (lambda stream, line: None) if sys.argv[3] == "streamed" else None
    try:
        if how == "timeout":
            proc.run(argv, timeout=8, stop=proc.Stop(grace=1, on_line=on_line))
        elif how == "watch":
            proc.run(argv, stop=proc.Stop(watch=lambda: "stopped by the watch" if os.path.exists(sys.argv[2]) else None, grace=1, on_line=on_line))
        else:
            signal.setitimer(signal.ITIMER_REAL, 8)
            signal.signal(signal.SIGALRM, lambda *a: os.kill(os.getpid(), signal.SIGINT))
            proc.run(argv, stop=proc.Stop(on_line=on_line))
    except KeyboardInterrupt:
        print("interrupted")
    except Exception as exc:
        print(type(exc).__name__, str(exc).splitlines()[-1])
    """
)


@pytest.mark.integration  # real process trees, stopped after 8 s
@pytest.mark.parametrize("output", ["captured", "streamed"])
@pytest.mark.parametrize("how", ["timeout", "watch", "interrupt"])
def test_a_stopped_run_ends_the_processes_its_child_started_in_other_sessions(how, output, tmp_path):
    marker = tmp_path / "grandchild.pid"
    res = subprocess.run(
        [sys.executable, "-c", TREE, how, str(marker), output],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    expected = {
        "timeout": "CommandFailed (timed out after 8 s)",
        "watch": "CommandFailed (stopped by the watch)",
        "interrupt": "interrupted",
    }[how]
    assert res.stdout.strip() == expected, res.stdout + res.stderr
    pid = int(marker.read_text())
    # Gone, or a zombie of init's for a moment: never still running.
    for _ in range(50):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            break
        if state in ("Z", "X"):
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
        pytest.fail(f"the grandchild {pid} survived ({how})")


def test_streamed_lines_arrive_while_the_child_runs_and_the_result_holds_them_all(tmp_path):
    """Each line reaches on_line as the child writes it (the build log fills while the installer works); the
    child waits for the first one to arrive before it writes the rest, so nothing here waits for its exit."""
    seen: list[tuple[str, str]] = []
    flag = tmp_path / "seen"

    def on_line(stream: str, line: str) -> None:
        seen.append((stream, line))
        flag.touch()

    code = (
        "import os, sys, time\n"
        "print('first', flush=True)\n"
        "deadline = time.monotonic() + 20\n"
        "while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline: time.sleep(0.01)\n"
        "print('arrived' if os.path.exists(sys.argv[1]) else 'never', flush=True)\n"
        "print('oops', file=sys.stderr)\n"
    )
    res = proc.run([sys.executable, "-c", code, str(flag)], stop=proc.Stop(on_line=on_line), input_text="x")
    assert res.stdout == "first\narrived\n"
    assert res.stderr == "oops\n"
    assert sorted(seen) == [("stderr", "oops\n"), ("stdout", "arrived\n"), ("stdout", "first\n")]


def test_a_failing_line_listener_does_not_block_the_child_and_its_error_is_raised():
    """A build log that cannot be written (a full disk): the child still runs to its end (its pipe drained,
    200 kB of output being more than a pipe holds) and the listener's error comes out of run."""

    def on_line(stream: str, line: str) -> None:
        raise OSError(28, "No space left on device")

    code = "import sys\nfor i in range(4000): print('x' * 50)\n"
    with pytest.raises(OSError, match="No space left"):
        proc.run([sys.executable, "-c", code], timeout=60, stop=proc.Stop(on_line=on_line))


def test_a_grandchild_holding_the_streamed_pipes_counts_against_the_timeout(tmp_path):
    """The child ends at once but leaves a grandchild with its stdout: the run is not over until the pipes
    close, so the timeout ends the grandchild too instead of waiting out its 60 s."""
    pid_file = tmp_path / "pid"
    script = f"sleep 60 & echo $! > {pid_file}; echo started"
    lines: list[str] = []
    with pytest.raises(CommandFailed) as info:
        proc.run(["sh", "-c", script], timeout=2, stop=proc.Stop(on_line=lambda s, line: lines.append(line)))
    assert info.value.returncode == 124
    assert lines == ["started\n"]
    grandchild = int(pid_file.read_text())
    for _ in range(50):
        if (
            not Path(f"/proc/{grandchild}").exists()
            or "Z" in Path(f"/proc/{grandchild}/stat").read_text().split()[2]
        ):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the grandchild {grandchild} still runs")


def test_a_background_command_overlaps_and_one_left_uncollected_is_ended(tmp_path):
    with proc.background(["sh", "-c", "echo out; echo err >&2"]) as job:
        res = job.result(timeout=30)
    assert (res.returncode, res.stdout, res.stderr) == (0, "out\n", "err\n")
    with pytest.raises(CommandFailed) as failed, proc.background(["sh", "-c", "exit 3"]) as job:
        job.result(timeout=30)
    assert failed.value.returncode == 3
    pid_file = tmp_path / "pid"
    with pytest.raises(RuntimeError), proc.background(["sh", "-c", f"echo $$ > {pid_file}; exec sleep 60"]):
        while not pid_file.exists() or not pid_file.read_text().strip():
            time.sleep(0.05)
        raise RuntimeError("the block failed")
    pid = int(pid_file.read_text())
    assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


# envbuilder dies by SIGKILL after forking a child and before that child has asked for its parent-death signal: the
# child's fork hook holds it back 0.5 s, and the parent kills itself the moment the fork returns. The child's command
# would write MARKER a second later.
ORPHAN = textwrap.dedent(
    """
    import os, signal, sys, time
    from envbuilder.system import proc
    os.register_at_fork(after_in_child=lambda: time.sleep(0.5))
    os.register_at_fork(after_in_parent=lambda: os.kill(os.getpid(), signal.SIGKILL))
    proc.run(["sh", "-c", 'sleep 1; echo survived > "$0"', sys.argv[1]])
    """
)


#: Runs ORPHAN as its child while it is the subreaper of everything below (prctl PR_SET_CHILD_SUBREAPER): the
#: orphaned installer and whatever it starts come to it, and it waits until none is left, so the test knows when
#: the installer is gone instead of sleeping until its command would have run. Prints ORPHAN's exit status.
REAPER = textwrap.dedent(
    """
    import ctypes, os, sys
    if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:
        sys.exit("prctl(PR_SET_CHILD_SUBREAPER): " + os.strerror(ctypes.get_errno()))
    pid = os.fork()
    if pid == 0:
        os.execv(sys.executable, [sys.executable, "-c", sys.argv[1], sys.argv[2]])
    status = None
    while True:
        try:
            got, code = os.wait()
        except ChildProcessError:
            break
        if got == pid:
            status = os.waitstatus_to_exitcode(code)
    print(status)
    """
)


def test_a_child_whose_parent_died_during_the_fork_ends_instead_of_running_on(tmp_path):
    """Seen on CI: a create SIGKILLed right after `uv venv` left its partial behind the rerun, because the next
    installer, forked in that instant, never got its parent-death signal and went on installing into it."""
    marker = tmp_path / "marker"
    res = subprocess.run(
        [sys.executable, "-c", REAPER, ORPHAN, str(marker)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [str(-signal.SIGKILL)], res.stderr
    # Every process below is gone: the installer's command, had it run, wrote the marker 1 s after it started.
    assert not marker.exists()
