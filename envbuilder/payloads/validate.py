"""Validation payload: run by the env's own python, one process per rank, under any launcher.

Each rank appends JSON lines to ``--out/rank-<R>.jsonl``: ``hello``, then ``start``/``result`` per check, then
``end``. A rank that dies or hangs leaves a ``start`` without a ``result``; the CLI turns that into a FAIL naming
the rank and the check. Every check runs under a watchdog: past ``--timeout`` the rank records a timeout and
exits, so a hung collective never hangs the run. The process ends with ``os._exit`` after the process group is
destroyed: interpreter finalisation is where gloo sometimes aborts ("terminate called without an active
exception") after the work is done.

The cyclic garbage collector is off for the rank's whole life: importing torch makes some hundred thousand objects
and the collector walked them again and again as they were made (10 % of ``import torch``'s CPU time, and 23 % of
the DDP check's, whose constructor imports ``torch._dynamo``). A rank is a probe of a few seconds that ends with
``os._exit``; what it frees is freed by reference counting, tensors included.

Standard library and torch only (mpi4py and horovod when present). Without ``--out`` the record of a single
process is printed as one JSON line (the quick check ``create`` runs).

A rank never outlives the run that started it. ``ENVBUILDER_VALIDATE_LIFELINE`` names envbuilder's process
(pid, start time, boot id, pid namespace): a rank on the same host watches it and ends when it is gone, even by
SIGKILL, which no cleanup can follow. A rank started by torchrun also ends when its agent is gone: the agent
starts each worker in a session of its own, out of reach of a signal to the agent's group (a scheduler's
``scancel`` on a node without cgroup tracking, say).

Fault injection for tests: ``ENVBUILDER_VALIDATE_FAULT="RANK:CHECK:ACTION[,...]"`` where ACTION is ``exit``
(the rank ends abruptly when the check starts), ``hang`` (it sleeps) or ``arch=sm_80+sm_86`` (the arch list the
arch check sees); CHECK ``start`` is the moment the payload starts, before it says hello (a python that hangs
before the checks). ``ENVBUILDER_VALIDATE_HEARTBEAT=DIR``: each rank refreshes ``DIR/rank-R`` every
``WATCH_S`` while it lives, so a test can tell that no rank of a killed run is still running.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import os
import re
import signal
import socket
import sys
import threading
import time
from typing import Any, Callable, Optional

# The payload directory is sys.path[0] when this file runs as a script.
from envbuilder_checks import DIST_CHECKS, GPU_CHECKS, Suite, faults, inject

LIFELINE = "ENVBUILDER_VALIDATE_LIFELINE"
HEARTBEAT = "ENVBUILDER_VALIDATE_HEARTBEAT"
#: How far apart (clock ticks) envbuilder's start time as it read it and as a rank reads it may be. Under
#: qemu-user (an aarch64 machine emulated on x86_64 through binfmt_misc) a process's reads of its own
#: /proc/PID/stat are answered by qemu, whose start time is qemu's own startup, a few ticks after the kernel's.
START_SKEW_TICKS = 100
#: How often a rank looks whether what started it is still there.
WATCH_S = 0.5

_MPI_MARKERS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PALS_RANKID", "MV2_COMM_WORLD_RANK")
# torchrun's variables first, then the MPI launchers', then srun's (which also describe a torchrun agent's task).
_RANK_VARS = ("RANK", *_MPI_MARKERS, "SLURM_PROCID")
_SIZE_VARS = (
    "WORLD_SIZE",
    "PMI_SIZE",
    "OMPI_COMM_WORLD_SIZE",
    "PALS_SIZE",
    "MV2_COMM_WORLD_SIZE",
    "SLURM_NTASKS",
)
_LOCAL_VARS = (
    "LOCAL_RANK",
    "MPI_LOCALRANKID",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "PALS_LOCAL_RANKID",
    "PMI_LOCAL_RANK",
    "MV2_COMM_WORLD_LOCAL_RANK",
    "SLURM_LOCALID",
)


def _first_int(names: tuple[str, ...], default: int) -> int:
    for name in names:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return default


class Rank:
    def __init__(self) -> None:
        self.rank = _first_int(_RANK_VARS, 0)
        self.world = _first_int(_SIZE_VARS, 1)
        self.local = _first_int(_LOCAL_VARS, 0)
        self.torchrun = "TORCHELASTIC_RUN_ID" in os.environ or "GROUP_RANK" in os.environ
        self.mpi = not self.torchrun and any(v in os.environ for v in _MPI_MARKERS)


class Log:
    """This rank's event file (or, without --out, an in-memory record printed at the end)."""

    def __init__(self, out: Optional[str], rank: Rank) -> None:
        self.rank = rank
        self.results: dict[str, dict[str, Any]] = {}
        self.current: Optional[str] = None
        self.started = time.monotonic()
        #: Collectives this rank entered in the current check: when several ranks time out, the
        #: one that got least far is the one the others were waiting for.
        self.progress = 0
        self.lock = threading.RLock()
        self.fh = None
        if out:
            os.makedirs(out, exist_ok=True)
            self.fh = open(os.path.join(out, f"rank-{rank.rank}.jsonl"), "a", encoding="utf-8")  # noqa: SIM115

    def event(self, kind: str, sync: bool = False, **data: Any) -> None:
        with self.lock:
            if self.fh is not None:
                self.fh.write(json.dumps({"event": kind, "t": round(time.time(), 3), **data}) + "\n")
                self.fh.flush()
                if sync:  # seen at once by envbuilder on another node of a shared file system
                    os.fsync(self.fh.fileno())

    def start(self, check: str) -> None:
        self.current = check
        self.progress = 0
        self.started = time.monotonic()
        self.event("start", check=check)

    def advance(self) -> None:
        """About to enter a collective. The first one of a check is recorded, so a rank that dies blocked in
        it can be told from the rank it was waiting for."""
        self.progress += 1
        if self.progress == 1:
            self.event("entered", check=self.current)

    def result(self, check: str, status: str, **data: Any) -> dict[str, Any]:
        record = {"status": status, "seconds": round(time.monotonic() - self.started, 3), **data}
        self.results[check] = record
        self.current = None
        self.event("result", check=check, **record)
        return record


class Watchdog:
    """Ends the rank when a check outlives its deadline; the record says which check and after how long."""

    def __init__(self, log: Log) -> None:
        self.log = log
        self.deadline: Optional[float] = None
        self.seconds = 0.0
        self.cond = threading.Condition()
        threading.Thread(target=self._run, daemon=True).start()

    def arm(self, seconds: float) -> None:
        with self.cond:
            self.seconds = seconds
            self.deadline = time.monotonic() + seconds
            self.cond.notify()

    def disarm(self) -> None:
        with self.cond:
            self.deadline = None

    def _run(self) -> None:
        with self.cond:
            while True:
                if self.deadline is None:
                    self.cond.wait()
                    continue
                left = self.deadline - time.monotonic()
                if left > 0:
                    self.cond.wait(left)
                    continue
                check = self.log.current or "?"
                self.log.result(
                    check,
                    "fail",
                    cause=f"timed out after {self.seconds:.0f} s (a hung collective, rank or file system)",
                    timeout=True,
                    progress=self.log.progress,
                )
                _finish(self.log, ok=False, code=124)


#: Signals the lifeline thread takes for the rank (see Lifeline).
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


class Lifeline:
    """Ends this rank when the run that started it is gone: envbuilder's process (when it runs on this host,
    in this pid namespace) or, under torchrun, the agent (this process's parent when it started).

    It also takes SIGTERM and SIGINT for the rank (blocked in every other thread, waited for here): a Python
    signal handler runs only when the main thread returns to the interpreter, and a rank blocked in a
    rendezvous or a collective never does, so it died without recording where it was."""

    def __init__(self, log: Log, torchrun: bool) -> None:
        self.log = log
        self.parent = os.getppid() if torchrun else None
        self.envbuilder = _seen(_watched(os.environ.get(LIFELINE, "")))
        beat = os.environ.get(HEARTBEAT)
        self.beat = os.path.join(beat, f"rank-{log.rank.rank}") if beat else None
        # Blocked before any other thread starts, so that every thread (torch's too) inherits the mask.
        signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        threading.Thread(target=self._run, daemon=True, name="lifeline").start()

    def gone(self) -> Optional[str]:
        if self.parent is not None and os.getppid() != self.parent:
            return f"the torchrun agent that started this rank (pid {self.parent}) is gone"
        if self.envbuilder is not None and _start_time(self.envbuilder[0]) != self.envbuilder[1]:
            return f"envbuilder (pid {self.envbuilder[0]}), which started this run, is gone"
        return None

    def _run(self) -> None:
        while True:
            why = self.gone()
            if why is not None:
                self._last_word("abandoned", reason=why, check=self.log.current)
                _finish(self.log, ok=False, code=129, record=False)
            if self.beat:
                with contextlib.suppress(OSError):
                    with open(self.beat, "a", encoding="utf-8"):
                        pass
                    os.utime(self.beat)
            signum = signal.sigtimedwait(_STOP_SIGNALS, WATCH_S)
            if signum is not None:
                self._last_word(
                    "killed", signal=signum.si_signo, check=self.log.current, progress=self.log.progress
                )
                _finish(self.log, ok=False, code=128 + signum.si_signo, record=False)

    def _last_word(self, kind: str, **data: Any) -> None:
        """Record why the rank ends; a rank stuck writing to a hung file system (holding the log) ends anyway."""
        if self.log.lock.acquire(timeout=1):
            try:
                self.log.event(kind, **data)
            finally:
                self.log.lock.release()


def _watched(value: str) -> Optional[tuple[int, int]]:
    """(pid, start time) of envbuilder from ``ENVBUILDER_VALIDATE_LIFELINE``, when that process is visible here:
    the same boot of the same host, the same pid namespace. Elsewhere (another node of the run, a container with
    its own pids) there is nothing to watch."""
    parts = value.split()
    if len(parts) != 4 or not (parts[0].isdigit() and parts[1].isdigit() and parts[3].isdigit()):
        return None
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            boot = fh.read().strip()
        pidns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
    if boot != parts[2] or pidns != int(parts[3]):
        return None
    return int(parts[0]), int(parts[1])


def _seen(watched: Optional[tuple[int, int]]) -> Optional[tuple[int, int]]:
    """The watched process with its start time as this rank reads it, where that is within START_SKEW_TICKS of
    the one it gave itself (qemu-user answers a process's reads of its own stat); later looks compare with this
    reading exactly. A process that is gone, or a pid taken by a later process, keeps the given time: gone."""
    if watched is None:
        return None
    pid, given = watched
    seen = _start_time(pid)
    if seen is not None and abs(seen - given) <= START_SKEW_TICKS:
        return pid, seen
    return watched


def _start_time(pid: int) -> Optional[int]:
    """The start time of process ``pid``; None when it is gone (or a zombie: killed, not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    if len(fields) < 20 or fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def _driver_version() -> Optional[str]:
    """The NVIDIA kernel module's version on this node (``550.54.14``); None without one."""
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8", errors="replace") as fh:
            first = fh.readline(4096)
    except OSError:
        return None
    found = re.search(r"Kernel Module(?: for \S+)?\s+([0-9]+(?:\.[0-9]+)+)", first)
    return found.group(1) if found else None


def _glibc_version() -> Optional[str]:
    """This node's glibc (``2.36``); None on another C library."""
    with contextlib.suppress(ValueError, OSError):
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""
        if text.startswith("glibc "):
            return text.split()[1]
    return None


def _started_at(pid: int) -> Optional[float]:
    """When process ``pid`` started, in epoch seconds (to a clock tick); None where /proc does not tell."""
    ticks = _start_time(pid)
    try:
        with open("/proc/uptime", encoding="ascii") as fh:
            uptime = float(fh.read().split()[0])
        hz = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    if ticks is None or hz <= 0:
        return None
    return round(time.time() - uptime + ticks / hz, 3)


def _finish(log: Log, ok: bool, code: Optional[int] = None, record: bool = True) -> None:
    """End the process now. ``record=False``: the rank was stopped (its last word is written); nothing more is
    written, as stdout may lead nowhere any more (a pipe to an envbuilder that is gone)."""
    if record:
        log.event("end", ok=ok)
        if log.fh is None:
            print(json.dumps(_summary(log)), flush=True)
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code if code is not None else (0 if ok else 1))


def _summary(log: Log) -> dict[str, Any]:
    return {"rank": log.rank.rank, "host": socket.gethostname(), "checks": log.results}


# --- main -----------------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checks", default="import,gpu,arch")
    parser.add_argument("--out", help="directory for the per-rank event files")
    parser.add_argument("--expect-gpus", type=int, default=None, help="GPUs each rank should see")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--fs", action="append", default=[], help="directory for the file system check")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per check")
    parser.add_argument("--sweep-max", type=int, default=1 << 30, help="largest all_reduce message, bytes")
    parser.add_argument("--matmul-n", type=int, default=4096)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument(
        "--warm",
        action="append",
        default=[],
        help="a module imported after the checks only so that its bytecode is written (errors ignored)",
    )
    parser.add_argument(
        "--horovod-gpu-ops",
        help="the tensor operations the recipe builds Horovod with (HOROVOD_GPU_OPERATIONS)",
    )
    return parser


def main(argv: list[str]) -> None:
    gc.disable()  # before torch is imported: see the module's docstring
    args = _parser().parse_args(argv)
    rank = Rank()
    planned = faults(rank.rank)
    inject(planned.get("start"), rank.rank)
    log = Log(args.out, rank)
    log.event(
        "hello",
        sync=True,
        rank=rank.rank,
        world=rank.world,
        local_rank=rank.local,
        host=socket.gethostname(),
        pid=os.getpid(),
        launched_by="torchrun" if rank.torchrun else ("mpi" if rank.mpi else "direct"),
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        # Where the ranks meet (torchrun's rendezvous store, or the TCP store of MPI-started ranks).
        master_addr=os.environ.get("MASTER_ADDR"),
        # When this process and its torchrun agent started (epoch seconds): the run's start-up, part by part
        # (scripts/bench_validate.py).
        started=_started_at(os.getpid()),
        agent_started=_started_at(os.getppid()) if rank.torchrun else None,
        # The modules loaded where the rank runs (a job loads its own): the run's history records their versions.
        modules=os.environ.get("LOADEDMODULES"),
        driver=_driver_version(),
        glibc=_glibc_version(),
    )
    Lifeline(log, rank.torchrun)
    watchdog = Watchdog(log)
    suite = Suite(args, log, rank)
    checks = [c for c in args.checks.split(",") if c]
    if "import" not in checks:
        checks.insert(0, "import")
    ok = True
    for check in checks:
        log.start(check)
        watchdog.arm(args.timeout)
        inject(planned.get(check), rank.rank)
        result = _run_one(suite, check, rank)
        watchdog.disarm()
        ok = ok and result["status"] != "fail"
        if check == "import" and result["status"] == "fail":
            break

    if suite.dist_ready:
        import torch.distributed as dist

        watchdog.arm(args.timeout)
        # The results are recorded; a failing teardown must not change them.
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    if ok:
        _warm(args.warm)
    _finish(log, ok)


def _warm(modules: list[str]) -> None:
    """Import what later runs of the env will (DDP's constructor imports torch._dynamo), after every check and
    outside any timing, so that its bytecode is written once now instead of compiled by each rank of each run. A
    module that fails to import here is not this run's finding."""
    for name in modules:
        with contextlib.suppress(Exception):
            importlib.import_module(name)


def _run_one(suite: Suite, check: str, rank: Rank) -> dict[str, Any]:
    method: Optional[Callable[[], dict[str, Any]]] = getattr(suite, f"check_{check}", None)
    if method is None:
        return suite.log.result(check, "skip", reason=f"unknown check {check!r}")
    if check in GPU_CHECKS and suite.args.device == "cpu":
        return suite.log.result(check, "skip", reason="CPU run: no GPU checks")
    if check in DIST_CHECKS:
        if rank.world < 2 and not rank.torchrun:
            return suite.log.result(check, "skip", reason="a single process: launch with 2 or more ranks")
        if suite.dist_broken:
            return suite.log.result(check, "fail", cause=f"no process group: {suite.dist_broken}")
    try:
        return method()
    except Exception as exc:  # any error in a check is that check's FAIL, never a crash of the rank
        if check in DIST_CHECKS:  # a failed collective leaves the group unusable: later ones fail fast
            suite.dist_broken = f"{check} failed: {type(exc).__name__}: {str(exc)[:200]}"
        return suite.log.result(check, "fail", cause=f"{type(exc).__name__}: {str(exc)[:400]}")


if __name__ == "__main__":
    main(sys.argv[1:])
