"""Stopping `envbuilder validate` ends everything it started, on a real env (torch 2.13.0 CPU, MPICH from PyPI):
Ctrl-C, SIGTERM or SIGKILL while the ranks hang leaves no launcher (torchrun's agent, mpiexec and its proxy) and no
rank behind, whichever session or process group they put themselves in; ``--timeout`` stops a python that hangs
before the checks start; a submitted job is cancelled.

Every process of a run carries a token in its environment (envbuilder passes its environment down the launcher
chain), so survivors are found by that, by the sessions and process groups the run's processes had, and by the
heartbeat each rank refreshes while it lives (``ENVBUILDER_VALIDATE_HEARTBEAT``, or the hook below for a rank
that never reached the payload)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Callable, Optional

import pytest
from helpers import CpuTorchWorld, spawn_cli

pytestmark = [pytest.mark.integration, pytest.mark.mpi]

MARK = "EB_KILLTEST_TOKEN"
HANG_RANK = "EB_KILLTEST_HANG_RANK"
BEAT = "ENVBUILDER_VALIDATE_HEARTBEAT"
FAULT = "ENVBUILDER_VALIDATE_FAULT"
#: Until the ranks are up: two busy cores import torch in the agent and in each rank.
UP_S = 300.0
#: Within torchrun's own escalation, with room for two busy cores: its agent gives the workers 30 s after its
#: SIGTERM before it kills them (20 s was once too short in a loaded CI run, the agent the only survivor).
#: Before the fix the ranks lived on until --timeout (600 s).
GONE_S = 45.0
#: The per-check timeout of the hang-before-the-checks test: the run waits it out, so it is short, but still
#: ample for the healthy rank to say hello (the agent and the rank import torch on two busy cores first).
START_LIMIT_S = 30

# A site-packages hook (as a .pth file runs one) that hangs one rank before the payload starts: the python that
# "hangs before the checks", with nothing of envbuilder's running in it. It refreshes that rank's heartbeat.
HOOK = """\
import os
import time


def _hang():
    rank = os.environ.get("RANK", os.environ.get("PMI_RANK"))
    if rank is None or rank != os.environ.get("EB_KILLTEST_HANG_RANK"):
        return
    beat = os.path.join(os.environ["ENVBUILDER_VALIDATE_HEARTBEAT"], "rank-" + rank)
    while True:
        with open(beat, "a"):
            pass
        os.utime(beat)
        time.sleep(0.5)


_hang()
"""


@pytest.fixture(scope="module")
def world(cpu_torch_template, torch_index, torch_uv_cache, tmp_path_factory):
    """An env of its own (the hook below goes into it): a copy of the session's CPU torch env."""
    root = tmp_path_factory.mktemp("validate-kill")
    w = CpuTorchWorld.copy_of(cpu_torch_template, root, torch_index, torch_uv_cache)
    site = next(w.prefix.glob("lib/python*/site-packages"))
    (site / "eb_killtest_hook.py").write_text(HOOK)
    (site / "eb_killtest_hook.pth").write_text("import eb_killtest_hook\n")
    return w


# --- processes ------------------------------------------------------------------------------------------------


def _stat(pid: int) -> Optional[tuple[str, int, int]]:
    """(state, process group, session) of ``pid``; None when it is gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    return fields[0].decode(), int(fields[2]), int(fields[3])


def _live() -> Iterator[tuple[int, tuple[str, int, int]]]:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None and stat[0] not in "ZX":
                yield int(entry.name), stat


def tokened(token: str) -> dict[int, dict[str, object]]:
    """Live processes whose environment carries ``EB_KILLTEST_TOKEN=token``: pid -> process group, session, command."""
    found: dict[int, dict[str, object]] = {}
    needle = f"{MARK}={token}".encode()
    for pid, (_state, pgid, sid) in _live():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found[pid] = {"pgid": pgid, "sid": sid, "cmd": cmd}
    return found


def _doing(pid: int) -> str:
    """What a survivor is doing, for the failure message: its state, signal masks and each thread's wait."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        keep = ("State", "Threads", "SigBlk", "SigIgn", "SigCgt", "PPid")
        lines = [line for line in status.splitlines() if line.split(":")[0] in keep]
        for task in sorted(Path(f"/proc/{pid}/task").iterdir()):
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            lines.append(
                f"thread {task.name} {state} {(task / 'wchan').read_text()} {(task / 'comm').read_text().strip()}"
            )
    except OSError as exc:
        return f"pid {pid}: {exc}"
    return f"pid {pid}: " + "; ".join(lines)


def in_groups(groups: set[int]) -> dict[int, tuple[str, int, int]]:
    """Live processes in one of these process groups or sessions."""
    return {pid: stat for pid, stat in _live() if stat[1] in groups or stat[2] in groups}


class Run:
    """`envbuilder validate vcpu --cpu ARGS` in the background, with its own token and heartbeat directory."""

    def __init__(
        self, world: CpuTorchWorld, tmp: Path, *args: str, extra: Optional[dict[str, str]] = None
    ) -> None:
        self.world = world
        self.token = uuid.uuid4().hex
        self.beat = tmp / "beat"
        self.beat.mkdir()
        self.out = tmp / "stdout"
        self.err = tmp / "stderr"
        env = {**world.env, MARK: self.token, BEAT: str(self.beat), **(extra or {})}
        # Run directories are named after envbuilder's pid, which an earlier run may have had.
        self.earlier = set(world.prefix.glob("envbuilder/validation/run-*"))
        with self.out.open("w") as out, self.err.open("w") as err:
            # Its own session: the signals are the test's, never a terminal's.
            self.proc = spawn_cli(
                "validate", "vcpu", "--cpu", *args, env=env, stdout=out, stderr=err, start_new_session=True
            )

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        # Whatever the test found, nothing of this run may go on loading the machine.
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pid in tokened(self.token):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    @property
    def stderr(self) -> str:
        return self.err.read_text()

    def events(self) -> dict[int, list[dict[str, object]]]:
        """Each rank's events so far."""
        out: dict[int, list[dict[str, object]]] = {}
        for path in self.world.prefix.glob(f"envbuilder/validation/run-*-{self.proc.pid}/ranks/rank-*.jsonl"):
            if path.parent.parent in self.earlier:
                continue
            lines = path.read_text().splitlines()
            out[int(path.stem.split("-")[1])] = [json.loads(line) for line in lines if line.endswith("}")]
        return out

    def wait_for(self, what: str, ready: Callable[[dict[int, list[dict[str, object]]]], bool]) -> None:
        deadline = time.monotonic() + UP_S
        while not ready(self.events()):
            assert self.proc.poll() is None, f"validate ended ({self.proc.returncode}): {self.stderr[-2000:]}"
            assert time.monotonic() < deadline, f"{what}: not within {UP_S:g} s; {self.events()}"
            time.sleep(0.5)

    def beats(self) -> dict[str, float]:
        return {p.name: p.stat().st_mtime for p in self.beat.iterdir()}

    def assert_beating(self, ranks: int = 2) -> None:
        """Every rank refreshes its heartbeat: the check after the kill means something."""
        deadline = time.monotonic() + UP_S
        while len(self.beats()) < ranks:
            assert time.monotonic() < deadline, f"heartbeats: {self.beats()}"
            time.sleep(0.5)
        first = self.beats()
        deadline = time.monotonic() + 30
        while any(self.beats()[name] == t for name, t in first.items()):
            assert time.monotonic() < deadline, f"a heartbeat does not move: {first}"
            time.sleep(0.5)

    def assert_all_gone(self, before: dict[int, dict[str, object]]) -> None:
        """No process of the run is left, by token, by session and process group, by heartbeat."""
        deadline = time.monotonic() + GONE_S
        while tokened(self.token) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = tokened(self.token)
        assert not left, f"survivors {GONE_S:g} s after the kill: {left}\n" + "\n".join(map(_doing, left))
        groups = {int(p["pgid"]) for p in before.values()} | {int(p["sid"]) for p in before.values()}
        # Within the same deadline: a process without the token (srun's, say) may still be on its way out.
        while in_groups(groups) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not in_groups(groups), in_groups(groups)
        still = self.beats()
        time.sleep(2.0)  # four heartbeat periods
        assert self.beats() == still, "a rank still refreshes its heartbeat"


def _at(check: str, ranks: tuple[int, ...]) -> Callable[[dict[int, list[dict[str, object]]]], bool]:
    def ready(events: dict[int, list[dict[str, object]]]) -> bool:
        return all(
            any(ev["event"] == "start" and ev.get("check") == check for ev in events.get(r, ()))
            for r in ranks
        )

    return ready


def _pids(run: Run) -> dict[int, int]:
    return {r: int(evs[0]["pid"]) for r, evs in run.events().items() if evs and evs[0]["event"] == "hello"}


# --- the ranks hang in a check --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("launcher", "sig"),
    [
        ("torchrun", signal.SIGINT),
        ("torchrun", signal.SIGTERM),
        ("torchrun", signal.SIGKILL),
        ("mpiexec", signal.SIGTERM),
        ("mpiexec", signal.SIGKILL),
    ],
    ids=lambda v: v.name if isinstance(v, signal.Signals) else v,
)
def test_no_process_of_a_stopped_validate_survives(world, tmp_path, launcher, sig):
    # Rank 1 hangs (in Python) when the nccl check starts; rank 0 waits for it in the rendezvous (in C++).
    # Nothing would end them before --timeout.
    with Run(
        world,
        tmp_path,
        "--launcher",
        launcher,
        "--checks",
        "import,nccl",
        "--timeout",
        "600",
        extra={FAULT: "1:nccl:hang"},
    ) as run:
        run.wait_for("both ranks in the nccl check", _at("nccl", (0, 1)))
        run.assert_beating()
        before = tokened(run.token)
        ranks = _pids(run)
        assert set(ranks.values()) <= set(before), (ranks, before)
        commands = " ".join(str(p["cmd"]) for p in before.values())
        assert ("envbuilder_torchrun.py" if launcher == "torchrun" else "hydra_pmi_proxy") in commands
        if launcher == "torchrun":
            # What made the ranks outlive a kill of the launcher's group: each worker has a session of its own.
            assert all(before[pid]["sid"] == pid for pid in ranks.values()), before

        os.kill(run.proc.pid, sig)
        code = run.proc.wait(timeout=60)
        run.assert_all_gone(before)
        if sig == signal.SIGKILL:
            assert code == -signal.SIGKILL
        else:
            assert code == 130, run.stderr
            assert "interrupted" in run.stderr and "Traceback" not in run.stderr


# --- a python that hangs before the checks --------------------------------------------------------------------


@pytest.mark.parametrize("launcher", ["torchrun", "mpiexec"])
def test_sigkill_while_a_rank_hangs_before_the_payload_leaves_nothing(world, tmp_path, launcher):
    # Rank 1 never reaches the payload, so no watch of envbuilder's runs in it: the launcher, told by the
    # kernel that envbuilder died (its parent-death signal), must end it.
    with Run(
        world,
        tmp_path,
        "--launcher",
        launcher,
        "--checks",
        "import,nccl",
        "--timeout",
        "600",
        extra={HANG_RANK: "1"},
    ) as run:
        run.wait_for("rank 0 in the nccl check", _at("nccl", (0,)))
        run.assert_beating()
        assert 1 not in run.events()  # rank 1 hangs in the hook: it never said hello
        before = tokened(run.token)
        os.kill(run.proc.pid, signal.SIGKILL)
        run.proc.wait(timeout=60)
        run.assert_all_gone(before)


def test_timeout_covers_a_python_that_hangs_before_the_checks(world, tmp_path):
    with Run(
        world,
        tmp_path,
        "--json",
        "--checks",
        "import,nccl",
        "--timeout",
        str(START_LIMIT_S),
        extra={HANG_RANK: "1"},
    ) as run:
        code = run.proc.wait(timeout=600)
        envelope = json.loads(run.out.read_text())
        assert code == 8, run.stderr
        checks = envelope["data"]["checks"]
        # The per-check timeout, not the run's whole budget (2 checks x the timeout + 120 s).
        assert checks["import"]["status"] == "fail"
        assert f"rank 1: the rank never started within {START_LIMIT_S} s" in checks["import"]["cause"], (
            checks["import"]
        )
        # The launcher's output in the report says why the run was stopped.
        assert f"rank(s) 1 did not start within {START_LIMIT_S} s" in envelope["data"]["stderr_tail"]
        # Stopped, the run left nothing running.
        deadline = time.monotonic() + GONE_S
        while tokened(run.token) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not tokened(run.token)


# --- a submitted job ------------------------------------------------------------------------------------------


@pytest.mark.slurm
def test_sigterm_while_a_submitted_job_runs_cancels_it(world, tmp_path, slurm_cluster):
    with Run(
        world,
        tmp_path,
        "--submit",
        "--checks",
        "import,nccl",
        "--timeout",
        "600",
        extra={**slurm_cluster.env, FAULT: "1:nccl:hang"},
    ) as run:
        run.wait_for("both ranks of the job in the nccl check", _at("nccl", (0, 1)))
        run.assert_beating()
        job = next(
            line.split()[2].rstrip(":")
            for line in run.stderr.splitlines()
            if line.startswith("submitted job ")
        )
        before = tokened(run.token)
        os.kill(run.proc.pid, signal.SIGTERM)
        assert run.proc.wait(timeout=120) == 130, run.stderr
        run.assert_all_gone(before)
        queue = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%T"],
            env={**os.environ, **slurm_cluster.env},
            capture_output=True,
            text=True,
        )
        assert queue.stdout.strip() in ("", "CANCELLED", "COMPLETING"), queue.stdout
