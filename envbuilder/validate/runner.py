"""Run the bundled validation for a built env: here (inside an allocation, or on any host for a CPU run) or as
a batch job (``--submit``), then merge the ranks' records into one report and keep it in the env's record.

Every run gets its own directory under ``<prefix>/envbuilder/validation/``: the payload copied there (compute
nodes see the env's file system, not necessarily where envbuilder is installed), the batch script, the
launcher's output, one event file per rank and the report.

A run here ends with envbuilder, whatever ends envbuilder. Ctrl-C and SIGTERM end the launcher and everything it
started (:func:`proc.end_tree`); on SIGKILL, which nothing can follow, the launcher gets SIGTERM from the kernel
(its parent-death signal: torchrun then ends its workers, srun its step) and every rank on this host sees
envbuilder gone through its lifeline and exits. Ctrl-C or SIGTERM while a submitted job runs cancels the job.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Optional

from envbuilder import payloads, plan
from envbuilder.backends import smoke
from envbuilder.backends.buildlog import build_umask
from envbuilder.core import kinds, launchers, schedulers
from envbuilder.core.errors import CommandFailed, StateError, UsageError, ValidationFailed
from envbuilder.core.facts import HostFacts
from envbuilder.core.structs import dataclass
from envbuilder.plan import container, suite
from envbuilder.plan.activation import Activation, activation_for
from envbuilder.plan.target import target_facts
from envbuilder.recipe.loader import Recipe
from envbuilder.system import fsutil, host, proc, removal, state
from envbuilder.system.modules import ModuleSystem
from envbuilder.validate import report, submit
from envbuilder.validate.report import QUIET, Status

KEEP_RUNS = 5
#: Startup allowance on top of the per-check timeouts (interpreter start, rendezvous, module loads).
SLACK_S = 120.0
#: Between SIGTERM and SIGKILL when a run here is stopped for its time: the ranks record where they were.
GRACE_S = 5.0
#: The payload's lifeline: envbuilder's pid, start time, boot id and pid namespace (payloads/validate.py).
LIFELINE = "ENVBUILDER_VALIDATE_LIFELINE"


class NotHere(ValidationFailed):
    """This host cannot run the checks the env needs (a login node for a GPU env); the hint says where to."""


class NoAllocation(UsageError):
    """A multi-node run started outside the allocation that would name its first host (a usage error for
    ``validate``; after a build, ``create`` runs the smoke check instead)."""


@dataclass(frozen=True)
class Options:
    checks: Optional[tuple[str, ...]] = None
    launcher: Optional[str] = None
    nodes: Optional[int] = None
    nproc_per_node: Optional[int] = None
    cpu: bool = False
    submit: bool = False
    account: Optional[str] = None
    partition: Optional[str] = None
    timeout: Optional[float] = None
    #: How long --submit waits for the job to start and finish (None: until it ends).
    wait: Optional[float] = None
    #: Where the runs' files go (None: the env's envbuilder/validation; an image's read-only mount cannot hold them).
    runs: Optional[str] = None
    #: The ranks write the bytecode of what they import, as the smoke check would (the validation right after a
    #: create, which the smoke check does not precede), and the rest of what it writes is compiled meanwhile
    #: (smoke.warming). Only a run here, in an env that holds its own packages.
    write_bytecode: bool = False


def run(
    record: state.EnvRecord,
    recipe: Recipe,
    host: HostFacts,
    env: Mapping[str, str],
    modules: ModuleSystem,
    *,
    opts: Options,
    live: Status = QUIET,
) -> report.Report:
    """Validate ``record``'s env. Raises ValidationFailed (with the way forward) when this host cannot run it."""
    warnings: list[str] = []
    here = locate(env)
    if opts.submit and here.in_job:
        raise UsageError(
            f"this runs inside {here.scheduler} job {here.job}: --submit would queue a second allocation",
            hint=f"validate here, without --submit (envbuilder validate {record.name})",
        )
    # The partition asked for, else the one the env was built for, else the job's or the recipe's (suite).
    partition = opts.partition or record.plan.get("partition")
    opts = replace(opts, partition=partition if isinstance(partition, str) else None)
    target = target_facts(recipe, host, warnings, [], partition=opts.partition)
    device = suite.device_for(target, opts.cpu)
    reason = suite.where(device, host, target, opts.submit)
    checks = suite.checks_for(recipe, opts.checks)
    prefix = Path(record.prefix)
    # A job script sources the module system's init where its shell has no `module` (this host's: the site's).
    activate = replace(
        Activation.of_record(record.plan) or activation_for(recipe), module_init=modules.init_dir
    )
    timeout = float(opts.timeout or recipe.validation.timeout or suite.DEFAULT_TIMEOUT_S)
    runs = Path(opts.runs) if opts.runs else prefix / "envbuilder" / "validation"
    # To the microsecond: two validations of one env in the same second (a job's own step, a process of another
    # PID namespace with the same number) once met in one directory.
    run_dir = runs / f"run-{datetime.now().strftime('%Y%m%d-%H%M%S-%f')}-{os.getpid()}"
    payload = suite.Payload(
        checks=checks,
        device=device,
        out=str(run_dir / "ranks"),
        fs=suite.filesystems(recipe, env, plan.expand),
        timeout=timeout,
    )
    own_python = kinds.kind_info(record.kind).own_python
    python, wrap = _launched(record, device, run_dir)
    if (
        not opts.submit and not reason
    ):  # an env whose python cannot start here says so before what a job lacks
        python_here(record, python, host)
    the_launch = suite.launch(
        recipe,
        target,
        suite.LaunchedEnv(str(prefix), python, activate, own_python, wrap, container_mpi(record)),
        payload,
        package_dir=str(run_dir),  # the run directory holds a copy of the payloads
        warnings=warnings,
        request=suite.LaunchRequest(
            opts.launcher,
            opts.nodes,
            opts.nproc_per_node,
            opts.account,
            opts.partition,
            here=None if opts.submit else here,
        ),
        workdir=str(run_dir),
    )
    for text in warnings:
        live.note(f"warning: {text}")
    if reason and not opts.submit:
        raise NotHere(
            f"not validating {record.name} here: {reason}",
            hint=_elsewhere_hint(record.name, the_launch),
        )
    _make_run_dir(run_dir)
    budget = timeout * len(checks) + SLACK_S
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    t0 = time.monotonic()
    finished = Finished(run_dir / "ranks", the_launch.world, live, device)
    if opts.submit:
        exit_code, timed_out, where, tail = submit.submit(
            the_launch, run_dir, env, opts.wait, live=live, finished=finished
        )
        stopped_after = budget if timed_out else None
    else:
        run_env = environment(record, recipe, activate, env, modules)
        run_env.setdefault("OMP_NUM_THREADS", str(threads_here(the_launch, here)))
        bytecode = (
            opts.write_bytecode and not wrap and smoke.writes_bytecode(record, None if own_python else python)
        )
        if bytecode:
            run_env.pop("PYTHONDONTWRITEBYTECODE", None)
        with smoke.warming(record, run_env) if bytecode else contextlib.nullcontext():
            exit_code, stopped_after, tail = _here(
                the_launch,
                run_dir,
                run_env,
                timeout=timeout,
                budget=budget,
                live=live,
                finished=finished,
                umask=build_umask() if bytecode else -1,
            )
        where = "here"
    events = _read_events(run_dir / "ranks")
    rows = report.merge(checks, events, the_launch.world, exit_code, stopped_after)
    partition = here.partition or the_launch.partition
    refs = report.references_for(recipe.validation.references, partition, the_launch.world)
    rows = report.apply_references(rows, refs)
    result = report.Report(
        env=record.name,
        launcher=the_launch.launcher,
        device=device,
        world=the_launch.world,
        nodes=the_launch.nodes,
        command=tuple(launchers.plain(the_launch.argv)),
        rows=tuple(rows),
        seconds=time.monotonic() - t0,
        exit_code=exit_code,
        where=where,
        started=started,
        partition=partition,
        stderr_tail=tail,
        hosts=report.hosts_of(events),
        modules=report.modules_of(events),
        node=report.node_of(events),
    )
    fsutil.write_atomic(run_dir / "report.json", (json.dumps(result.to_json(), indent=2) + "\n").encode())
    _prune(run_dir.parent)
    return result


def store(home: Path, record: state.EnvRecord, result: report.Report) -> state.EnvRecord:
    """Keep the report in the env's record (``show`` displays it)."""
    updated = replace(record, validation=result.to_json())
    state.save(home, updated)
    return updated


def environment(
    record: state.EnvRecord,
    recipe: Recipe,
    activate: Activation,
    env: Mapping[str, str],
    modules: ModuleSystem,
) -> dict[str, str]:
    """What an activated env gives a job (as the batch script sets it up): the recipe's modules and its conda env,
    its activate variables, the env's bin first."""
    base = proc.scrubbed_env(env)
    use = list(activate.module_use)
    load = suite.job_modules(recipe, activate)
    out = modules.apply(use, load, base, conda_env=activate.conda_env).apply(base)
    out = activate.apply(out)
    if kinds.kind_info(record.kind).container:  # nothing of it on the host: its programs run in the image
        return out
    if kinds.kind_info(record.kind).own_python:
        out["VIRTUAL_ENV"] = record.prefix
    else:
        out["PYTHONUSERBASE"] = record.prefix
    out["PATH"] = f"{record.prefix}/bin" + (f":{out['PATH']}" if out.get("PATH") else "")
    return out


#: A job's host list is one line per rank slot: a few MB even for the largest jobs.
NODEFILE_LIMIT = 64 * 1024 * 1024


def locate(env: Mapping[str, str]) -> schedulers.Where:
    """Where this process runs (:func:`schedulers.locate`), with the job's host list file read where its
    scheduler keeps one (a PBS job's $PBS_NODEFILE, which alone tells its node count; unreadable: unknown)."""
    text = None
    adapter = schedulers.detect(env)
    hosts = adapter.hosts(env) if adapter else None
    path = hosts.path if hosts else None
    if path:
        with contextlib.suppress(OSError, UnicodeDecodeError), Path(path).open(encoding="utf-8") as fh:
            text = fh.read(NODEFILE_LIMIT)
    return schedulers.locate(env, nodefile=text, usable_cpus=host.usable_cpus())


def threads_here(the_launch: suite.Launch, here: schedulers.Where) -> int:
    """OMP threads per rank for a launch on this node: the CPUs the job holds here (else those this process
    may run on) divided among the node's ranks. The activation's or the user's own value wins."""
    cpus = here.cpus_per_node if here.in_job and here.cpus_per_node else host.usable_cpus()
    return suite.omp_threads(cpus, the_launch.nproc_per_node)


def python_here(record: state.EnvRecord, python: str, host: HostFacts) -> None:
    """Refuses a run here where the env's own python is a link to an interpreter this host does not have (the
    env was built on another host, such as a login node whose Python the compute nodes lack)."""
    link = Path(python)
    if not kinds.kind_info(record.kind).own_python or link.exists() or not link.is_symlink():
        return
    built = record.facts or {}
    where = f" on {built['hostname']}" if built.get("hostname") else ""
    made = f"; it was built{where} with Python {(record.tools or {}).get('python') or built.get('python') or '?'}"
    raise StateError(
        f"{record.name}'s python {python} does not run on this host ({host.hostname or 'here'}): it leads to "
        f"{link.resolve()}, which is not here{made}",
        hint=f"build it where it runs: envbuilder create {record.name} --force on a compute node, with a Python "
        "the nodes have ([python] version, or compute.python in the site file)",
    )


def _launched(record: state.EnvRecord, device: str, run_dir: Path) -> tuple[str, tuple[str, ...]]:
    """The python the ranks run, and the runtime's argv before it where they run inside a container env's image
    (the payload bound in)."""
    if kinds.kind_info(record.kind).container:
        box = (record.plan or {}).get("container") or {}
        return container.box_python(box), in_image(record, device == "cuda", run_dir)
    if kinds.kind_info(record.kind).own_python:
        return str(Path(record.prefix) / "bin" / "python"), ()
    return _site_python(record), ()


def container_mpi(record: state.EnvRecord) -> str:
    """A container env's ``container.mpi`` (where its ranks' MPI comes from); "" for any other env."""
    return str(((record.plan or {}).get("container") or {}).get("mpi") or "")


def in_image(record: state.EnvRecord, gpu: bool, run_dir: Optional[Path] = None) -> tuple[str, ...]:
    """The runtime's argv that runs the rest inside a container env's image; ``run_dir`` (a validation's) bound
    in: its payloads read-only, its ranks' directory for their records."""
    box = record.plan.get("container") or {}
    if run_dir is None:
        return container.exec_prefix(box, container.image_path(record.prefix, record.tools), gpu=gpu)
    return container.exec_prefix(
        box,
        container.image_path(record.prefix, record.tools),
        binds=[str(run_dir / "ranks")],
        read_only=[str(run_dir / "payloads")],
        gpu=gpu,
    )


def _site_python(record: state.EnvRecord) -> str:
    return str(record.tools.get("python_path") or "python3")


def _elsewhere_hint(name: str, the_launch: suite.Launch) -> str:
    parts = []
    if the_launch.interactive:
        parts.append(f"get a compute node ({launchers.display(the_launch.interactive)}) and run it there")
    parts.append(f"or submit it: envbuilder validate {name} --submit")
    parts.append(f"or check everything but the GPUs here: envbuilder validate {name} --cpu")
    return "; ".join(parts)


def _make_run_dir(run_dir: Path) -> None:
    """The run's directory, with its rank directory and a copy of the payload."""
    run_dir.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    run_dir.mkdir(mode=0o755)
    try:
        (run_dir / "ranks").mkdir(mode=0o755)
        payloads.copy_to(run_dir / "payloads")
    except BaseException:
        removal.remove_tree(run_dir, ignore_errors=True)  # a full disk leaves no half-made run behind
        raise


#: A run directory without its report is a validation still at work (another process's), or one killed before it
#: wrote its report: removed only once it is this old.
STALE_RUN_S = 86400.0


def _prune(root: Path) -> None:
    """Keep the KEEP_RUNS newest finished runs (those with their report). A run without one is left alone, unless
    it is a day old: two validations of one env at once must not remove each other's directory mid-run."""
    runs = sorted(root.glob("run-*"))
    finished = [r for r in runs if (r / "report.json").is_file()]
    now = time.time()
    doomed = finished[:-KEEP_RUNS] + [r for r in runs if r not in finished and _age(r, now) > STALE_RUN_S]
    for old in doomed:
        removal.remove_tree(old, ignore_errors=True)


def _age(path: Path, now: float) -> float:
    try:
        return now - path.stat().st_mtime
    except OSError:
        return 0.0


def _read_events(ranks: Path) -> dict[int, list[dict[str, object]]]:
    events: dict[int, list[dict[str, object]]] = {}
    for path in ranks.glob("rank-*.jsonl"):
        with contextlib.suppress(ValueError, OSError):
            events[int(path.stem.split("-", 1)[1])] = report.parse_events(path.read_text(encoding="utf-8"))
    return events


# --- here -----------------------------------------------------------------------------------------------------


def bind_here(the_launch: suite.Launch, env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """The launch's argv with the values only a job knows bound for a run on this node, and its environment:
    the allocation's first host as the rendezvous of a multi-node run, a free local port for MPI-started ranks
    (they rendezvous through torch's TCP store on this node), this process's lifeline for the ranks."""
    env = dict(env)
    values = schedulers.bound_values(env)
    if the_launch.nodes > 1:
        values["MASTER_ADDR"] = _first_host(env)
        env.setdefault("MASTER_ADDR", values["MASTER_ADDR"])
        env.setdefault("MASTER_PORT", str(the_launch.port or schedulers.job_port(env)))
        values["MASTER_PORT"] = env["MASTER_PORT"]
    elif not launchers.get(the_launch.launcher).agent:
        env["MASTER_ADDR"] = "127.0.0.1"
        env["MASTER_PORT"] = str(_free_port())
    line = lifeline()
    if line:
        env[LIFELINE] = line
    return launchers.bind(the_launch.argv, values), env


def _here(
    the_launch: suite.Launch,
    run_dir: Path,
    env: dict[str, str],
    *,
    timeout: float,
    budget: float,
    live: Status,
    finished: Finished,
    umask: int = -1,
) -> tuple[Optional[int], Optional[float], str]:
    """Run the launch here; returns the launcher's exit status, after how many seconds the run was stopped
    (None when it ended by itself) and the tail of its output."""
    argv, env = bind_here(the_launch, env)
    live.status(f"running {the_launch.launcher} with {the_launch.world} rank(s)")
    startup = Startup(run_dir / "ranks", the_launch.world, timeout)
    stopped_after: Optional[float] = None
    try:
        res = proc.run(
            argv,
            env=env,
            cwd=str(run_dir),
            timeout=budget,
            check=False,
            umask=umask,
            stop=proc.Stop(watch=lambda: finished() or startup(), grace=GRACE_S, parent_death=signal.SIGTERM),
        )
        code: Optional[int] = res.returncode
        out, err = res.stdout, res.stderr
    except CommandFailed as exc:
        if exc.returncode != 124:
            raise
        stopped_after = timeout if startup.late else budget
        code, out, err = None, "", exc.stderr_tail
    except FileNotFoundError as exc:
        raise UsageError(
            f"the launcher {argv[0]!r} is not on PATH here",
            hint="load the site's MPI module, or pick another --launcher",
        ) from exc
    finished()  # what the ranks wrote after the last look
    (run_dir / "launcher.log").write_text(out + err, encoding="utf-8")
    return code, stopped_after, proc.tail(err)


class Startup:
    """The start-up phase under the per-check timeout: every rank must say hello (the payload's first event)
    within ``limit`` seconds of the launch. A python that hangs before the checks (a site-packages hook, a
    ``sitecustomize``, a file system that stalls the interpreter's start) has no watchdog of its own yet."""

    def __init__(self, ranks: Path, world: int, limit: float) -> None:
        self.ranks = ranks
        self.limit = limit
        self.t0 = time.monotonic()
        self.waiting = set(range(world))
        #: The ranks that never started, once the limit has passed.
        self.late: list[int] = []

    def __call__(self) -> Optional[str]:
        if not self.waiting:
            return None
        self.waiting = {r for r in self.waiting if not _said_hello(self.ranks / f"rank-{r}.jsonl")}
        if not self.waiting or time.monotonic() - self.t0 <= self.limit:
            return None
        self.late = sorted(self.waiting)
        who = ", ".join(map(str, self.late))
        return (
            f"rank(s) {who} did not start within {self.limit:g} s (--timeout): the python hung before the "
            "checks (a site-packages hook, sitecustomize, a stalled file system)"
        )


class Finished:
    """Each check's line as soon as every rank has written its result (the ranks' event files, read as they
    grow, each time proc.run's watch comes round): ``live.note`` for a finished check, ``live.status`` for the
    one rank 0 has started. The table at the end still merges everything (report.merge)."""

    def __init__(self, ranks: Path, world: int, live: Status, device: str) -> None:
        self.ranks = ranks
        self.world = world
        self.live = live
        self.device = device
        self.t0 = time.monotonic()
        #: How much of each rank's file was read; each check's result per rank; the checks already shown.
        self.offsets: dict[int, int] = {}
        self.results: dict[str, dict[int, dict[str, object]]] = {}
        self.shown: set[str] = set()

    def __call__(self) -> Optional[str]:
        for rank in range(self.world):
            for event in self._new_events(rank):
                self._take(rank, event)
        return None

    def _new_events(self, rank: int) -> list[dict[str, object]]:
        try:
            with (self.ranks / f"rank-{rank}.jsonl").open("rb") as fh:
                fh.seek(self.offsets.get(rank, 0))
                data = fh.read()
        except OSError:  # not written yet
            return []
        whole = data[: data.rfind(b"\n") + 1]  # a line still being written is read next time
        self.offsets[rank] = self.offsets.get(rank, 0) + len(whole)
        return report.parse_events(whole.decode("utf-8", errors="replace"))

    def _take(self, rank: int, event: dict[str, object]) -> None:
        check = event.get("check")
        if not isinstance(check, str):
            return
        if event.get("event") == "start" and rank == 0:
            self.live.status(f"{report.check_label(check, self.device)} ({time.monotonic() - self.t0:.0f} s)")
        elif event.get("event") == "result":
            got = self.results.setdefault(check, {})
            got[rank] = event
            if len(got) == self.world and check not in self.shown:
                self.shown.add(check)
                self.live.note(finished_line(report.check_label(check, self.device), got))


def finished_line(check: str, results: Mapping[int, Mapping[str, object]]) -> str:
    """``  ✓ check: pass  1.2 s`` (the slowest rank's time; fail when any rank failed)."""
    statuses = [str(r.get("status")) for r in results.values()]
    status = "fail" if "fail" in statuses else statuses[0]
    seconds = max(float(str(r.get("seconds") or 0)) for r in results.values())
    mark = {"pass": "✓", "fail": "✗"}.get(status, "·")
    return f"  {mark} {check}: {status}  {seconds:.1f} s"


def _said_hello(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            first = fh.readline(1 << 16)
        return bool(json.loads(first).get("event") == "hello")
    except (OSError, ValueError, AttributeError):
        return False


def lifeline() -> Optional[str]:
    """What a rank needs to recognise this process, and to tell whether it runs on the same host and sees the
    same pids: ``PID START_TIME BOOT_ID PID_NAMESPACE``. None where /proc does not tell (not Linux)."""
    start = proc.start_time(os.getpid())
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
        pidns = Path("/proc/self/ns/pid").stat().st_ino
    except OSError:
        return None
    if start is None or not boot:
        return None
    return f"{os.getpid()} {start} {boot} {pidns}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _first_host(env: Mapping[str, str]) -> str:
    """The allocation's first host, where its scheduler lists them (:meth:`schedulers.Scheduler.hosts`)."""
    hosts = schedulers.host_list(env)
    if hosts is None:
        raise NoAllocation(
            f"a multi-node run needs an allocation ({schedulers.hosts_vars()}) to find its first host",
            hint="run inside the job, or pass --submit",
        )
    if hosts.path is not None:
        return Path(hosts.path).read_text(encoding="utf-8").split()[0]
    return proc.run(list(hosts.argv), env=dict(env)).stdout.split()[0]
