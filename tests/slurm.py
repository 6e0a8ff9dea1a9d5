"""A real Slurm cluster for tests. munged, slurmctld and slurmd run in the foreground as children of the test
process; their config, keys, sockets, state and logs all live in one directory, on ports picked at random, so
nothing under /etc, /run or /var is read or changed.

:class:`MiniCluster` has one node, "localhost", which offers every CPU of this machine and two fake GPUs
(character devices with /dev/null's numbers), enough for real sbatch/srun/squeue/scontrol round trips.

:class:`MultiNodeCluster` has N nodes n1..nN on this one machine. Each node's slurmd runs in a UTS namespace of
its own, with that host name, so Slurm, torch and MPI see N hosts (everything the node's jobs start inherits the
name), and in a mount namespace of its own where /etc/hosts is a copy of the machine's that gives node nK the
loopback address 127.0.1.K. Distinct addresses make names and addresses agree both ways: torch's agent on n1
tells its workers the address it finds for itself by reverse lookup, which would be "localhost" were every node
127.0.0.1. Every daemon stays on the loopback network (one network namespace: the addresses are names, not
isolation), each slurmd on a port of its own. Each node claims every CPU of the machine (Slurm does not know
they are shared), so two ranks per node fit on a 2-core machine.

:class:`ConfinedCluster` is a MiniCluster run as sites run Slurm: every step confined to the CPUs it was
allocated, by cgroups (``TaskPlugin=task/cgroup,task/affinity``, ``ProctrackType=proctrack/cgroup``,
``ConstrainCores=yes``) where this machine's cgroup v1 cpuset hierarchy can be written, else by CPU binding alone
(``task/affinity``), so what a step's ranks may run on is real."""

from __future__ import annotations

import ctypes
import errno
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
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
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


def multinode_available() -> Optional[str]:
    """None when a MultiNodeCluster can run here, otherwise why not: besides a MiniCluster's needs, each slurmd
    needs a UTS and a mount namespace of its own (root, and a kernel or sandbox that allows unshare)."""
    reason = available()
    if reason is not None:
        return reason
    probe = subprocess.run(
        [sys.executable, "-I", __file__, "--host", "eb-probe", "/etc/hosts", which("hostname") or "hostname"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if probe.returncode != 0 or probe.stdout.strip() != "eb-probe":
        return f"no UTS and mount namespace for a node's slurmd here: {probe.stderr.strip()[-300:]}"
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
CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
MS_BIND = 4096
MS_REC = 1 << 14
MS_PRIVATE = 1 << 18


def _prctl(option: int, value: int) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def _libc_call(name: str, *args: object) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{name}: {os.strerror(code)} ({errno.errorcode.get(code, code)})")


def _enter_host(name: str, hosts: str, local: tuple[str, ...] = ()) -> None:
    """Makes this process a host of its own: new UTS and mount namespaces, the host name ``name``, and ``hosts``
    bind-mounted on /etc/hosts; ``local`` (SOURCE, TARGET): SOURCE bind-mounted on TARGET, the node's own local
    storage at a path every node names alike. The mounts are made private first, so the binds never reach the
    machine's namespace. (Python 3.12 has os.unshare; 3.11 and older need libc.)"""
    _libc_call("unshare", CLONE_NEWUTS | CLONE_NEWNS)
    socket.sethostname(name)
    _libc_call("mount", b"none", b"/", None, MS_REC | MS_PRIVATE, None)
    _libc_call("mount", os.fsencode(hosts), b"/etc/hosts", None, MS_BIND, None)
    if local:
        _libc_call("mount", os.fsencode(local[0]), os.fsencode(local[1]), None, MS_BIND, None)


def _supervise(argv: list[str], host: Optional[tuple[str, ...]] = None) -> int:
    """Runs argv as a child and reaps every process orphaned below it (slurmd double-forks each slurmstepd, and
    PID 1 on a bare VM or container may never wait for them, leaving zombies). SIGTERM/SIGINT/SIGHUP go on to
    the child; once it is gone, leftovers get a few seconds and then SIGKILL. Exits with the child's status.
    Dies with the test process, so an aborted run leaves no daemon behind. ``host`` (name, hosts file[, local
    source, local target]): the child runs as that host (:func:`_enter_host`)."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() == 1:  # the test process is already gone
        return 1
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    pid = os.fork()
    if pid == 0:
        try:
            _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
            if host is not None:
                _enter_host(host[0], host[1], host[2:])
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


#: Slurm's own processes on a node, by their /proc comm.
DAEMON_COMMS = ("slurmd", "slurmstepd")


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _parent(pid: int) -> Optional[int]:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, IndexError, ValueError):
        return None


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


@dataclass(frozen=True)
class Node:
    name: str
    gpus: int = 0
    #: Runs as a host of its own (UTS and mount namespaces, see :func:`_enter_host`); else as this machine.
    own_host: bool = False
    addr: str = "127.0.0.1"


class MiniCluster:
    """``with MiniCluster(tmp_dir) as cluster:`` gives a cluster whose node is idle; run clients with
    ``env=cluster.environ()`` (or overlay ``cluster.env`` on an environment of your own)."""

    partition = "debug"
    node = "localhost"
    gpus = 2

    def __init__(self, root: Path, *, timeout: float = 30.0) -> None:
        self.nodes: tuple[Node, ...] = (Node(self.node, gpus=self.gpus),)
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
            for node in self.nodes:
                host = (
                    ("--host", node.name, str(self.root / "hosts"), *self._local(node))
                    if node.own_host
                    else ()
                )
                self._spawn("slurmd", "-D", "-N", node.name, "-f", str(self.conf), key=node.name, host=host)
            self._wait_until(self._all_idle, "every node to be idle", began)
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

        for node in self.nodes:
            for i in range(node.gpus):
                dev = self.root / "dev" / f"{node.name}-nvidia{i}"
                if not dev.exists():
                    _fake_device(dev)
        if any(n.own_host for n in self.nodes):
            # The /etc/hosts of the nodes that are hosts of their own: the machine's, and every node.
            (self.root / "hosts").write_text(
                Path("/etc/hosts").read_text() + "".join(f"{n.addr} {n.name}\n" for n in self.nodes)
            )

        ctld_port, *slurmd_ports = _free_ports(1 + len(self.nodes))
        r = self.root
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=envbuilder-test",
                    "SlurmctldHost=localhost",  # slurmctld runs as this machine
                    "SlurmUser=root",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={self.munge_socket}",
                    f"StateSaveLocation={r / 'state'}",
                    # %n is the node's name: each slurmd keeps its own spool, pid file and log.
                    f"SlurmdSpoolDir={r / 'spool' / '%n'}",
                    f"SlurmctldPidFile={r / 'slurmctld.pid'}",
                    f"SlurmdPidFile={r / 'slurmd-%n.pid'}",
                    f"SlurmctldLogFile={self.logs / 'slurmctld.log'}",
                    f"SlurmdLogFile={self.logs / 'slurmd-%n.log'}",
                    f"SlurmctldPort={ctld_port}",
                    f"SlurmdPort={slurmd_ports[0]}",
                    *self._task_lines(),
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core",
                    "ReturnToService=2",
                    "MpiDefault=none",
                    "KillWait=2",
                    "SchedulerParameters=batch_sched_delay=0",
                    "GresTypes=gpu",
                    *(
                        f"NodeName={node.name} NodeHostname={node.name} NodeAddr={node.addr} Port={port} "
                        f"CPUs={self.cpus} RealMemory={_real_memory_mb()}"
                        + (f" Gres=gpu:{node.gpus}" if node.gpus else "")
                        + " State=UNKNOWN"
                        for node, port in zip(self.nodes, slurmd_ports)
                    ),
                    f"PartitionName={self.partition} Nodes={','.join(n.name for n in self.nodes)} Default=YES "
                    "MaxTime=INFINITE State=UP",
                    # A partition whose time limit no validation job fits in: such a job waits for ever
                    # (reason PartitionTimeLimit), as on a site whose short queue a recipe's time outgrew.
                    f"PartitionName=short Nodes={','.join(n.name for n in self.nodes)} Default=NO MaxTime=1 State=UP",
                    "",
                ]
            )
        )
        # slurmd reads gres.conf from the directory slurm.conf is in.
        (self.root / "gres.conf").write_text(
            "".join(
                f"NodeName={n.name} Name=gpu File={r / 'dev'}/{n.name}-nvidia[0-{n.gpus - 1}]\n"
                for n in self.nodes
                if n.gpus
            )
        )

    def _local(self, node: Node) -> tuple[str, ...]:
        """The supervisor's ``--local SOURCE TARGET`` for ``node`` (none: nodes share this machine's storage)."""
        return ()

    def _task_lines(self) -> list[str]:
        """How slurmd tracks and places a step's processes: by process tree, unconfined (every step may run on
        every CPU of the machine, whatever it was allocated)."""
        return ["ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none"]

    def _spawn(self, name: str, *args: str, key: str = "", host: tuple[str, ...] = ()) -> None:
        """Starts daemon ``name`` under the supervisor. ``key`` tells several of one daemon apart (one slurmd
        per node); ``host`` is the supervisor's ``--host NAME HOSTS_FILE`` for a node that is a host of its own."""
        exe = which(name)
        if exe is None:
            raise ClusterError(f"{name} not found")
        label = f"{name}-{key}" if key else name
        out = (self.logs / f"{label}.out").open("wb")
        self._outputs.append(out)
        self.procs[label] = subprocess.Popen(
            [sys.executable, "-I", __file__, *host, *self._argv(name, exe, args)],
            env=self.environ(),
            cwd=self.root,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def _argv(self, name: str, exe: str, args: Sequence[str]) -> list[str]:
        """What the supervisor runs for daemon ``name`` found at ``exe`` (a subclass may wrap it)."""
        return [exe, *args]

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

    def node_states(self) -> dict[str, str]:
        """Each node's state, as sinfo tells (empty when it does not answer)."""
        proc = self.client("sinfo", "-h", "-N", "-o", "%N %T", timeout=10)
        if proc.returncode != 0:
            return {}
        return dict(line.split(None, 1) for line in proc.stdout.splitlines() if " " in line)

    def _all_idle(self) -> bool:
        states = self.node_states()
        return len(states) == len(self.nodes) and set(states.values()) == {"idle"}

    def log_tails(self) -> str:
        parts = []
        for name in DAEMONS:
            for path in sorted(self.logs.glob(f"{name}*.log")) + sorted(self.logs.glob(f"{name}*.out")):
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
            for name in reversed(list(self.procs)):  # slurmds first, munged last
                _stop(self.procs.pop(name))
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


class MultiNodeCluster(MiniCluster):
    """``with MultiNodeCluster(tmp_dir, nodes=2) as cluster:``: nodes n1..nN, each slurmd a host of its own
    (module docstring); no GPUs. Skip where :func:`multinode_available` says why not."""

    def __init__(self, root: Path, *, nodes: int = 2, timeout: float = 30.0) -> None:
        super().__init__(root, timeout=timeout)
        if not 1 <= nodes <= 254:
            raise ValueError(f"1 to 254 nodes (one address 127.0.1.K each), not {nodes}")
        self.nodes = tuple(Node(f"n{i}", own_host=True, addr=f"127.0.1.{i}") for i in range(1, nodes + 1))
        #: Each node's own local storage: empty as this machine sees it, node_local(NAME) as node NAME sees it
        #: (point TMPDIR here for what must land on every node apart, as sbcast's copies).
        self.local = root / "node-local"

    def node_local(self, name: str) -> Path:
        """What node ``name`` sees at :attr:`local`."""
        return self.root / "node-local-of" / name

    def _local(self, node: Node) -> tuple[str, ...]:
        for path in (self.local, self.node_local(node.name)):
            path.mkdir(mode=0o755, parents=True, exist_ok=True)
        return ("--local", str(self.node_local(node.name)), str(self.local))

    def job_pids(self, name: str) -> list[int]:
        """The processes jobs run on node ``name``: everything below its slurmd but the slurmd and its
        slurmstepds (killing those would take the node down, not a job's step)."""
        return [
            pid for pid in _descendants(self.procs[f"slurmd-{name}"].pid) if _comm(pid) not in DAEMON_COMMS
        ]

    def host_pid(self, name: str) -> int:
        """A process that runs as node ``name`` (``nsenter --target PID --uts --mount`` runs a command there): its
        slurmd, the supervisor's child that is a slurmd (the supervisor also adopts the node's slurmstepds)."""
        supervisor = self.procs[f"slurmd-{name}"].pid
        for pid in _descendants(supervisor):
            if _comm(pid) == "slurmd" and _parent(pid) == supervisor:
                return pid
        raise ClusterError(f"the slurmd of {name} is not running")


#: The cgroup v1 controllers Slurm's cgroup plugins use here: cpuset confines cores, freezer tracks processes.
CGROUP_V1 = Path("/sys/fs/cgroup")
CGROUP_CONTROLLERS = ("cpuset", "freezer")


def cgroup_confinement_available() -> Optional[str]:
    """None where Slurm 22.05's cgroup/v1 plugin can confine steps here, otherwise why not: it needs the cpuset
    and freezer controllers mounted as cgroup v1 hierarchies under /sys/fs/cgroup, and to make groups in them
    (root, and a container that lets it write there). On a cgroup v2-only host Slurm 22.05's cgroup/v2 plugin
    needs systemd to hand slurmd a delegated scope, which a test's slurmd does not have."""
    for name in CGROUP_CONTROLLERS:
        root = CGROUP_V1 / name
        if not (root / "cgroup.procs").is_file() or (root / "cgroup.subtree_control").exists():
            return f"no cgroup v1 {name} hierarchy at {root} (Slurm 22.05 confines by cgroup v1 here)"
        probe = root / f"envbuilder-probe-{os.getpid()}"
        try:
            probe.mkdir()
            probe.rmdir()
        except OSError as exc:
            return f"cannot make a cgroup in {root}: {exc.strerror}"
    return None


class ConfinedCluster(MiniCluster):
    """A MiniCluster whose steps run only on the CPUs they were allocated (module docstring): by cgroups where
    :func:`cgroup_confinement_available` says they can be had (``confinement`` is then "cgroup"), else by
    binding each task to its CPUs ("affinity"). Its node has a name of its own, so its slurmd's groups
    (``slurm_NODE/uid_U/job_J`` in each controller) never meet another test cluster's jobs of the same id; they
    are removed at stop."""

    def __init__(self, root: Path, *, timeout: float = 30.0) -> None:
        super().__init__(root, timeout=timeout)
        self.node = f"eb{secrets.token_hex(4)}"
        self.nodes = (Node(self.node, gpus=self.gpus),)
        self.cgroup_problem = cgroup_confinement_available()
        self.confinement = "affinity" if self.cgroup_problem else "cgroup"

    def _task_lines(self) -> list[str]:
        if self.confinement == "affinity":
            return ["ProctrackType=proctrack/linuxproc", "TaskPlugin=task/affinity"]
        # slurmd reads cgroup.conf from the directory slurm.conf is in.
        (self.root / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nConstrainCores=yes\n")
        return ["ProctrackType=proctrack/cgroup", "TaskPlugin=task/cgroup,task/affinity"]

    def _write_files(self) -> None:
        super()._write_files()
        # The node answers at this machine's loopback address under its own name.
        text = self.conf.read_text()
        self.conf.write_text(text.replace(f"NodeHostname={self.node} ", "NodeHostname=localhost "))

    def stop(self, drain_timeout: float = 30.0) -> None:
        try:
            super().stop(drain_timeout)
        finally:
            if self.confinement == "cgroup":
                for name in CGROUP_CONTROLLERS:
                    _remove_cgroups(CGROUP_V1 / name / f"slurm_{self.node}")


def _remove_cgroups(top: Path) -> None:
    """rmdir every group below ``top`` and ``top`` itself, deepest first (a group's files go with it; a group
    that still holds a process stays)."""
    if not top.is_dir():
        return
    groups = sorted((Path(d) for d, _, _ in os.walk(top)), key=lambda p: len(p.parts), reverse=True)
    for group in groups:
        with suppress(OSError):
            group.rmdir()


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


def _main(args: list[str]) -> int:
    """``[--host NAME HOSTS_FILE [--local SOURCE TARGET]] EXE ARGS...``: supervise EXE (as host NAME)."""
    if args[:1] == ["--host"] and args[3:4] == ["--local"]:
        return _supervise(args[6:], host=(args[1], args[2], args[4], args[5]))
    if args[:1] == ["--host"]:
        return _supervise(args[3:], host=(args[1], args[2]))
    return _supervise(args)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
