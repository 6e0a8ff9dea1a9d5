"""A real one-node Slurm cluster for tests. munged, slurmctld and slurmd run in the foreground as children of the
test process; their config, keys, sockets, state and logs all live in one directory, on ports picked at random,
so nothing under /etc, /run or /var is read or changed. The node offers every CPU of this machine and two fake
GPUs (character devices with /dev/null's numbers), enough for real sbatch/srun/squeue/scontrol round trips."""

from __future__ import annotations

import ctypes
import os
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from types import TracebackType
from typing import IO, Optional

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo")
#: Daemons live in sbin, which a non-login PATH may not list.
SBIN = "/usr/local/sbin:/usr/sbin:/sbin"
#: Variables that tie a Slurm client to the cluster (or job) it was started from; a test run inside a real
#: batch job must not send the mini cluster's clients to that job.
INHERITED_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "SQUEUE_", "SINFO_", "SCONTROL_")
#: A unix socket path has to fit in sockaddr_un.sun_path (108 bytes with the NUL).
MAX_SOCKET_PATH = 100
STOP_WAIT = 10.0


def which(name: str) -> Optional[str]:
    return shutil.which(name) or shutil.which(name, path=SBIN)


def available() -> Optional[str]:
    """None when a MiniCluster can run here, otherwise why not."""
    missing = [name for name in (*DAEMONS, *CLIENTS) if which(name) is None]
    if missing:
        return f"{', '.join(missing)} not installed (.ci/run installs Debian's slurm-wlm and munge)"
    if not sys.platform.startswith("linux"):
        return f"needs Linux, this is {sys.platform}"
    if os.geteuid() != 0:
        return "needs root (slurmd runs jobs as root and the fake GPUs are made with mknod)"
    with tempfile.TemporaryDirectory() as tmp:
        try:
            _fake_device(Path(tmp) / "probe")
        except OSError as exc:
            return f"cannot mknod a character device: {exc}"
    return None


def _fake_device(path: Path) -> None:
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))


def _free_ports(count: int) -> list[int]:
    # All sockets stay open until every port is known, so the ports differ from each other.
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def _real_memory_mb() -> int:
    """Well under what the machine has: a node configured with more memory than slurmd finds is drained."""
    try:
        total_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    except (ValueError, OSError):
        return 512
    return max(1, min(1024, total_mb // 2))


PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def _supervise(argv: list[str]) -> int:
    """Runs argv as a child and reaps every process orphaned below it (slurmd double-forks each slurmstepd, and
    PID 1 on a bare VM or container may never wait for them, leaving zombies). SIGTERM/SIGINT/SIGHUP go on to
    the child; once it is gone, leftovers get a few seconds and then SIGKILL. Exits with the child's status.
    Dies with the test process, so an aborted run leaves no daemon behind."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() == 1:  # the test process is already gone
        return 1
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    pid = os.fork()
    if pid == 0:
        try:
            _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
            os.execv(argv[0], argv)  # noqa: S606 (an argv list from MiniCluster, no shell)
        except OSError as exc:
            print(f"cannot run {argv[0]}: {exc}", file=sys.stderr, flush=True)
        finally:
            os._exit(127)
    main_done = False

    def forward(signum: int, _frame: object) -> None:
        if not main_done:
            os.kill(pid, signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    status = 0
    while not main_done:
        done, status = os.wait()
        main_done = done == pid
    deadline = time.monotonic() + 5
    while True:
        try:
            done, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if done == 0:
            if time.monotonic() > deadline:
                _kill_all(_descendants(os.getpid()))
            time.sleep(0.05)
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def _descendants(root: int) -> list[int]:
    """Every process below root, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with suppress(OSError, IndexError, ValueError):
                # The command name in field 2 may hold spaces and parentheses; fields after its last ")" are plain.
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def clean_environ() -> dict[str, str]:
    """os.environ without the variables that point Slurm clients at another cluster or job."""
    return {k: v for k, v in os.environ.items() if not k.startswith(INHERITED_PREFIXES)}


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"    ({exc.strerror})"
    kept = text.splitlines()[-lines:]
    return "\n".join(f"    {line}" for line in kept) if kept else "    (empty)"


class ClusterError(RuntimeError):
    pass


class MiniCluster:
    """``with MiniCluster(tmp_dir) as cluster:`` gives a cluster whose node is idle; run clients with
    ``env=cluster.environ()`` (or overlay ``cluster.env`` on an environment of your own)."""

    partition = "debug"
    node = "localhost"
    gpus = 2

    def __init__(self, root: Path, *, timeout: float = 30.0) -> None:
        self.root = Path(root).resolve()
        self.timeout = timeout
        self.conf = self.root / "slurm.conf"
        self.env = {"SLURM_CONF": str(self.conf)}
        self.logs = self.root / "log"
        self.munge_socket = self.root / "munge.sock"
        self.cpus = os.cpu_count() or 1
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._outputs: list[IO[bytes]] = []
        #: Seconds start() and stop() took, for reports.
        self.start_seconds: Optional[float] = None
        self.stop_seconds: Optional[float] = None

    def __enter__(self) -> MiniCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.stop()

    def environ(self) -> dict[str, str]:
        """A full environment for Slurm clients of this cluster."""
        return {**clean_environ(), **self.env}

    # -- start ---------------------------------------------------------------------------------------------

    def start(self) -> None:
        began = time.monotonic()
        if len(str(self.munge_socket)) > MAX_SOCKET_PATH:
            raise ClusterError(f"{self.root} is too deep for munged's unix socket; use a shorter directory")
        try:
            self._write_files()
            self._spawn(
                "munged",
                "--foreground",
                # pytest's temporary directories are private (0700) and munged wants the socket's directory
                # searchable by everyone; --force turns that check into a warning. Every client here is root.
                "--force",
                f"--key-file={self.root / 'munge.key'}",
                f"--socket={self.munge_socket}",
                f"--pid-file={self.root / 'munged.pid'}",
                f"--log-file={self.logs / 'munged.log'}",
                f"--seed-file={self.root / 'munged.seed'}",
            )
            self._wait_until(self.munge_socket.exists, "munged to open its socket", began)
            self._spawn("slurmctld", "-D", "-i", "-f", str(self.conf))
            self._spawn("slurmd", "-D", "-N", self.node, "-f", str(self.conf))
            self._wait_until(lambda: self._node_state() == "idle", "the node to be idle", began)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - began

    def _write_files(self) -> None:
        for sub in ("log", "state", "spool", "dev"):
            (self.root / sub).mkdir(mode=0o755, parents=True, exist_ok=True)
        # munged refuses a key that others can read.
        key = self.root / "munge.key"
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(secrets.token_bytes(1024))
        os.chmod(key, 0o600)

        devices = [self.root / "dev" / f"nvidia{i}" for i in range(self.gpus)]
        for dev in devices:
            if not dev.exists():
                _fake_device(dev)

        ctld_port, slurmd_port = _free_ports(2)
        r = self.root
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=envbuilder-test",
                    f"SlurmctldHost={self.node}",
                    "SlurmUser=root",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={self.munge_socket}",
                    f"StateSaveLocation={r / 'state'}",
                    f"SlurmdSpoolDir={r / 'spool'}",
                    f"SlurmctldPidFile={r / 'slurmctld.pid'}",
                    f"SlurmdPidFile={r / 'slurmd.pid'}",
                    f"SlurmctldLogFile={self.logs / 'slurmctld.log'}",
                    f"SlurmdLogFile={self.logs / 'slurmd.log'}",
                    f"SlurmctldPort={ctld_port}",
                    f"SlurmdPort={slurmd_port}",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core",
                    "ReturnToService=2",
                    "MpiDefault=none",
                    "KillWait=2",
                    "SchedulerParameters=batch_sched_delay=0",
                    "GresTypes=gpu",
                    f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} "
                    f"RealMemory={_real_memory_mb()} Gres=gpu:{self.gpus} State=UNKNOWN",
                    f"PartitionName={self.partition} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )
        # slurmd reads gres.conf from the directory slurm.conf is in.
        (self.root / "gres.conf").write_text(
            f"NodeName={self.node} Name=gpu File={r / 'dev'}/nvidia[0-{self.gpus - 1}]\n"
        )

    def _spawn(self, name: str, *args: str) -> None:
        exe = which(name)
        if exe is None:
            raise ClusterError(f"{name} not found")
        out = (self.logs / f"{name}.out").open("wb")
        self._outputs.append(out)
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-I", __file__, exe, *args],
            env=self.environ(),
            cwd=self.root,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def _wait_until(self, ready: Callable[[], bool], what: str, began: float) -> None:
        while True:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise ClusterError(
                        f"{name} exited with {proc.returncode} while waiting for {what}\n" + self.log_tails()
                    )
            if ready():
                return
            if time.monotonic() - began > self.timeout:
                raise ClusterError(
                    f"gave up after {self.timeout:g} s waiting for {what}\n" + self.log_tails()
                )
            time.sleep(0.05)

    def _node_state(self) -> str:
        proc = self.client("sinfo", "-h", "-N", "-o", "%T", timeout=10)
        return proc.stdout.strip() if proc.returncode == 0 else ""

    def log_tails(self) -> str:
        parts = []
        for name in DAEMONS:
            for path in (self.logs / f"{name}.log", self.logs / f"{name}.out"):
                if path.exists():
                    parts.append(f"--- {path}\n{_tail(path)}")
        return "\n".join(parts)

    # -- use -----------------------------------------------------------------------------------------------

    def client(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Runs a Slurm client command against this cluster; never raises on its exit status."""
        return subprocess.run(
            [which(argv[0]) or argv[0], *argv[1:]],
            env=self.environ(),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.root,
        )

    def alive(self) -> bool:
        return bool(self.procs) and all(p.poll() is None for p in self.procs.values())

    # -- stop ----------------------------------------------------------------------------------------------

    def stop(self, drain_timeout: float = 30.0) -> None:
        """Cancels every job, waits (bounded) for the queue to empty, then stops slurmd, slurmctld and munged.
        Safe to call twice and after a failed start."""
        began = time.monotonic()
        try:
            if self.alive():
                self._cancel_all(drain_timeout)
        finally:
            for name in reversed(DAEMONS):
                proc = self.procs.pop(name, None)
                if proc is not None:
                    _stop(proc)
            for out in self._outputs:
                out.close()
            self._outputs.clear()
        self.stop_seconds = time.monotonic() - began

    def _cancel_all(self, drain_timeout: float) -> None:
        # Jobs go before slurmd: a slurmstepd whose slurmd is gone is left over and ignores SIGTERM.
        with suppress(subprocess.TimeoutExpired):
            self.client("scancel", f"--partition={self.partition}", timeout=15)
        deadline = time.monotonic() + drain_timeout
        while time.monotonic() < deadline:
            with suppress(subprocess.TimeoutExpired):
                proc = self.client("squeue", "-h", "-o", "%i", timeout=10)
                if proc.returncode == 0 and not proc.stdout.strip():
                    return
            time.sleep(0.05)


#: Job states after which a job never runs again.
ENDED = (
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
)


def job_record(job_id: str, env: dict[str, str]) -> dict[str, str]:
    """The job's record from scontrol as key=value pairs (empty once the controller has forgotten it)."""
    show = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=env, capture_output=True, text=True)
    return dict(re.findall(r"(\w+)=(\S*)", show.stdout)) if show.returncode == 0 else {}


def sbatch_wait(
    args: list[str], *, env: dict[str, str], timeout: float, cwd: Optional[Path] = None
) -> subprocess.CompletedProcess[str]:
    """``sbatch --wait ARGS`` as the user would type it, with the job's exit status as the return code; but the
    job's end is read from scontrol every 0.2 s, where ``sbatch --wait`` sleeps up to 10 s between its polls
    (no accounting here, so scontrol is where the end state lives)."""
    sub = subprocess.run(
        ["sbatch", "--parsable", *args], env=env, capture_output=True, text=True, timeout=60, cwd=cwd
    )
    if sub.returncode != 0:
        return sub
    job_id = sub.stdout.strip().split(";")[0]
    deadline = time.monotonic() + timeout
    while (record := job_record(job_id, env)).get("JobState") not in ENDED:
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job_id], env=env, capture_output=True)
            raise subprocess.TimeoutExpired(["sbatch", "--wait", *args], timeout)
        time.sleep(0.2)
    status = int(record.get("ExitCode", "1:0").split(":")[0])
    return subprocess.CompletedProcess(sub.args, status, sub.stdout, sub.stderr)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to a supervised daemon; if it is still there after STOP_WAIT, SIGKILL to everything below the
    supervisor (which then reaps them and exits), and last to the supervisor itself."""
    if proc.poll() is None:
        proc.terminate()
    with suppress(subprocess.TimeoutExpired):
        proc.wait(STOP_WAIT)
        return
    _kill_all(_descendants(proc.pid))
    try:
        proc.wait(STOP_WAIT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    sys.exit(_supervise(sys.argv[1:]))
