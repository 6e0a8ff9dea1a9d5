"""What tests share besides fixtures: the repository's paths, the user's environment, the CLI run as a user runs it
(in this process, or in a child process where a signal or a process boundary is what is tested), and one
user-world harness (a throwaway home, $SCRATCH, recipes and envbuilder's records under one directory)."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import importlib.util
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, Callable, Optional

import pytest
from wheelindex import mirror_env

from envbuilder import cli
from envbuilder.core.facts import HostFacts, facts_from_json
from envbuilder.resolver import mirror
from envbuilder.system import state, transaction

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data"
FACTS = DATA / "facts"
#: Tcl Environment Modules, private: Debian's package conflicts with lmod, so .ci/run unpacks it here (paths
#: rewritten) without installing it.
ENVMODULES = Path("/opt/envmodules")
ENVMODULES_INIT_DIR = ENVMODULES / "usr" / "share" / "modules" / "init"

#: The environment plans are made in: a user on a cluster with $SCRATCH, $WORK and a project code. Tests talk
#: only to loopback addresses, so plans come from the shipped table here (no read of download.pytorch.org).
PLAN_ENV = {
    "HOME": "/home/u1",
    "USER": "u1",
    "SCRATCH": "/scratch/u1",
    "WORK": "/work/u1",
    "PROJECT": "p01",
    "ENVBUILDER_OFFLINE": "1",
}


def size_now(path: Path) -> int:
    """The size of a file that a running process may rename or remove between a test's glob and this stat (a
    partial file becoming the final one): 0 when it is gone."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


#: After a kill: what the killed process started (tar, zstd, mksquashfs) gets its parent-death signal and ends.
ORPHANS_SETTLE_S = 0.5


def kill_at(
    proc: subprocess.Popen[str],
    point: Callable[[], object],
    what: str,
    timeout: float = 120,
    settle: float = 0.0,
) -> None:
    """SIGKILL ``proc`` as soon as ``point()`` holds, and reap it; then wait ``settle`` seconds (for its children's
    parent-death signal). A wait that ends short of the point (the process ended first, the timeout ran out, the
    point raised) kills and reaps it too, so it never outlives its test (a live one is reported in the next)."""
    deadline = time.monotonic() + timeout
    try:
        while not point():
            if proc.poll() is not None:
                pytest.fail(f"it ended (exit {proc.returncode}) before {what}: {proc.communicate()[1]}")
            if time.monotonic() > deadline:
                pytest.fail(f"{what} never happened")
            time.sleep(0.002)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.communicate()
    time.sleep(settle)


class Watched:
    """A CLI child whose stderr is read in a thread as it comes, so that a test waits for a line the child says
    (the test hook's pause, a "waiting" for another's mutex) rather than for a guess at how long the way there
    takes on a loaded machine (a sleep of 0.2 s after the last file the child wrote was once too short in CI).
    Used as a context manager, it never lets the child outlive its test. The child's stdout is read only by
    :meth:`communicate`: it must not be a pipe that the child fills before then."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None, "spawn it with stderr=subprocess.PIPE"
        self.proc = proc
        self._lines: list[str] = []
        self._said = threading.Condition()
        self._reader = threading.Thread(target=self._read, args=(proc.stderr,), daemon=True)
        self._reader.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            with self._said:
                self._lines.append(line)
                self._said.notify_all()

    @property
    def err(self) -> str:
        with self._said:
            return "".join(self._lines)

    def wait_for(self, said: Callable[[list[str]], bool], what: str, timeout: float = 240) -> None:
        """Return once ``said`` holds for the lines of its stderr so far; fail the test (naming ``what``) if the
        child ends or the timeout runs out first."""
        deadline = time.monotonic() + timeout
        while True:
            with self._said:
                if self._said.wait_for(lambda: said(self._lines), timeout=0.05):
                    return
            if self.proc.poll() is not None:
                self._reader.join(10)
                if said(self._lines):  # its last lines came with its end
                    return
                pytest.fail(f"it ended (exit {self.proc.returncode}) before {what}:\n{self.err}")
            if time.monotonic() > deadline:
                pytest.fail(f"{what} never happened:\n{self.err}")

    def stop(self, sig: int = signal.SIGKILL, timeout: float = 60) -> str:
        """Send ``sig``, reap the child and return all it wrote to stderr."""
        self.proc.send_signal(sig)
        self.proc.wait(timeout)
        self._reader.join(timeout)
        return self.err

    def communicate(self, timeout: float = 120) -> tuple[str, str]:
        """Its whole stdout and stderr once it ends by itself."""
        out = self.proc.stdout.read() if self.proc.stdout is not None else ""
        self.proc.wait(timeout)
        self._reader.join(timeout)
        return out, self.err

    def __enter__(self) -> Watched:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._reader.join(10)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


class Paused(Watched):
    """A CLI child started with the test hook (``transaction.PAUSE_VAR``) set to ``point``."""

    def __init__(self, proc: subprocess.Popen[str], point: str) -> None:
        super().__init__(proc)
        self.point = point

    def wait(self, timeout: float = 240) -> None:
        """Return once the child sits at its pause."""
        line = f"{transaction.PAUSE_VAR}: paused {self.point} ("
        self.wait_for(
            lambda lines: any(s.startswith(line) for s in lines), f"its pause at {self.point}", timeout
        )


def demo_recipe(name: str, prefix: str = "") -> str:
    """A small uv venv recipe without torch that installs ``ebdemo==1.0`` (wheelindex.demo_wheels serves it); its
    env goes to ``prefix`` where one is given (``${SCRATCH}/envs/{name}``), else to the default place."""
    where = f'prefix = "{prefix}"\n' if prefix else ""
    return (
        f'schema_version = 1\n[recipe]\nname = "{name}"\n[env]\nkind = "venv"\ninstaller = "uv"\n{where}'
        '[python]\ncommand = "python3"\n[torch]\ninstall = false\n[[packages]]\nname = "ebdemo"\n'
        'spec = "ebdemo==1.0"\n'
    )


def loopback_only(index_mirror: str) -> bool:
    """Whether every index a plan reads (download.pytorch.org's and PyPI's) is sent to 127.0.0.1 or a directory
    by ``index_mirror``: only then may a test let envbuilder read the indexes."""
    rules = {r.upstream: r.targets for r in mirror.parse(index_mirror)}
    needed = ("https://download.pytorch.org/whl/", mirror.PYPI)
    local = ("http://127.0.0.1", "/", "file://")
    return all(u in rules and all(t.startswith(local) for t in rules[u]) for u in needed)


def load_facts(name: str) -> HostFacts:
    path = FACTS / f"{name}.json"
    return facts_from_json(json.loads(path.read_text()), str(path))


def cli_env(env: Optional[dict[str, str]] = None) -> dict[str, str]:
    """The whole environment the CLI runs in: ``env`` (default PLAN_ENV) with PATH and NO_COLOR, offline unless
    every index it would read is a local one."""
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NO_COLOR": "1", **(env or PLAN_ENV)}
    if not loopback_only(full.get("ENVBUILDER_INDEX_MIRROR", "")):
        full.setdefault("ENVBUILDER_OFFLINE", "1")  # tests reach nothing but loopback addresses
    return full


def cli_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "envbuilder", *args]


def run_cli_process(
    *args: str, env: Optional[dict[str, str]] = None, check: bool = False, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """The real CLI in a child process (python -m envbuilder), as a user runs it."""
    return subprocess.run(
        cli_argv(*args),
        env=cli_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
        cwd=REPO,
    )


def spawn_cli(*args: str, env: Optional[dict[str, str]] = None, **popen: Any) -> subprocess.Popen[str]:
    """The real CLI started in a child process, for tests that signal it or race it (output piped unless
    ``popen`` says otherwise)."""
    popen = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **popen}
    return subprocess.Popen(cli_argv(*args), env=cli_env(env), text=True, cwd=REPO, **popen)


class CliTimeout(BaseException):
    """The in-process CLI ran past its timeout. A BaseException, as KeyboardInterrupt is: the CLI's own handlers
    let it through, and its cleanup (killing the commands it started) runs on the way out."""


def run_cli(
    *args: str,
    env: Optional[dict[str, str]] = None,
    check: bool = False,
    timeout: float = 120,
    cwd: Path = REPO,
) -> subprocess.CompletedProcess[str]:
    """The CLI as ``python -m envbuilder ARGS`` runs it, in this process: ``cli.main`` with the same environment
    (nothing else of the test process's), working directory (the checkout unless ``cwd``: a command that writes
    where it is run, as sbatch's job output, is given the test's own) and stdin, its stdout and stderr captured
    apart at the file descriptors (so the output of the commands it starts is caught too), the exit code it
    returns. Saves the child process's ~0.3 s of imports per call; tests of signals and process boundaries use
    :func:`run_cli_process` or :func:`spawn_cli`."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        with _as_a_child(cli_env(env), out, err, timeout, cwd):
            code = cli.main(list(args))
        res = subprocess.CompletedProcess(cli_argv(*args), code, _text(out), _text(err))
    if check:
        res.check_returncode()
    return res


def _text(f: IO[bytes]) -> str:
    """What the CLI wrote to ``f``, decoded as subprocess.run(text=True) does here: UTF-8, universal newlines."""
    f.seek(0)
    return f.read().decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")


@contextlib.contextmanager
def _as_a_child(
    env: dict[str, str], out: IO[bytes], err: IO[bytes], timeout: float, cwd: Path
) -> Iterator[None]:
    """This process set up as a child of the test would be (environment, working directory, stdin, stdout and
    stderr going to ``out`` and ``err``), and put back afterwards."""
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    saved_std = (sys.stdin, sys.stdout, sys.stderr)
    for s in saved_std[1:]:
        s.flush()
    saved_fds = (os.dup(1), os.dup(2))
    # As the child's: stdin reads nothing; stdout and stderr are text over file descriptors 1 and 2.
    child_std = (
        open(os.devnull),  # noqa: SIM115 - closed below
        *(open(fd, "w", encoding="utf-8", buffering=1, closefd=False) for fd in (1, 2)),  # noqa: SIM115
    )

    def expired(signum: int, frame: object) -> None:
        raise CliTimeout(f"the CLI ran past {timeout:g} s")

    previous_alarm = signal.signal(signal.SIGALRM, expired)
    try:
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        for fd, f in ((1, out), (2, err)):
            os.dup2(f.fileno(), fd)
        sys.stdin, sys.stdout, sys.stderr = child_std
        signal.setitimer(signal.ITIMER_REAL, timeout)
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_alarm)
        for s in child_std:
            s.close()  # flushes what the CLI wrote
        sys.stdin, sys.stdout, sys.stderr = saved_std
        for fd, saved in zip((1, 2), saved_fds):
            os.dup2(saved, fd)
            os.close(saved)
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


def ok(res: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    """``res``, after asserting that it succeeded (its output in the message when it did not)."""
    assert res.returncode == 0, f"exit {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    return res


def refused(res: subprocess.CompletedProcess[str], code: int, text: str) -> None:
    """The CLI failed with exit ``code``, said ``text``, and showed no traceback."""
    assert res.returncode == code, f"exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    assert text in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


def bash(script: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``script`` in a real bash that reads no profile or rc file."""
    return subprocess.run(
        ["bash", "--noprofile", "--norc", "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def user_env(root: Path, index_mirror: str, **extra: str) -> dict[str, str]:
    """A user's environment for the CLI, every directory a throwaway one under ``root`` (home, $SCRATCH,
    envbuilder's records, uv's cache), its indexes reached through ``index_mirror`` (ENVBUILDER_INDEX_MIRROR).
    envbuilder reads those indexes only where they are all local; otherwise it plans offline."""
    return {
        **({} if loopback_only(index_mirror) else {"ENVBUILDER_OFFLINE": "1"}),
        "PATH": os.environ["PATH"],
        "HOME": str(root / "home"),
        "NO_COLOR": "1",
        "COLUMNS": "200",
        "SCRATCH": str(root / "scratch"),
        "ENVBUILDER_HOME": str(root / "eb-home"),
        "ENVBUILDER_INDEX_MIRROR": index_mirror,
        "UV_CACHE_DIR": str(root / "uv-cache"),
        **extra,
    }


def lmod_vars() -> dict[str, str]:
    """Lmod's variables, where this machine sets them: `module` works in the user's world as in a login shell."""
    return {k: os.environ[k] for k in ("LMOD_CMD", "MODULESHOME", "LMOD_PKG") if k in os.environ}


class UserWorld:
    """A user's world under ``root``: a recipe directory on ENVBUILDER_RECIPE_PATH (``recipes``, under ``root``
    unless absolute) and the throwaway directories of :func:`user_env`, its indexes reached through
    ``index_mirror``; the CLI run in it. Test modules subclass it for their recipes."""

    def __init__(self, root: Path, index_mirror: str = "", recipes: str = "recipes", **extra: str) -> None:
        self.root = root
        self.recipes = root / recipes
        self.recipes.mkdir(parents=True, exist_ok=True)
        self.env = user_env(root, index_mirror, ENVBUILDER_RECIPE_PATH=str(self.recipes), **extra)
        self.home = Path(self.env["ENVBUILDER_HOME"])
        self.scratch = Path(self.env["SCRATCH"])

    def write_recipe(self, name: str, text: str) -> str:
        (self.recipes / f"{name}.toml").write_text(text, encoding="utf-8")
        return name

    def cli(self, *args: str, timeout: float = 900, **extra: str) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, env={**self.env, **extra}, timeout=timeout)

    def data(self, *args: str, **extra: str) -> Any:
        """The ``data`` of a successful ``--json`` run."""
        return json.loads(ok(self.cli(*args, "--json", **extra)).stdout)["data"]

    def spawn(
        self, *args: str, extra: Optional[dict[str, str]] = None, **popen: Any
    ) -> subprocess.Popen[str]:
        """The real CLI started in a child process in this world (for signals and races)."""
        return spawn_cli(*args, env={**self.env, **(extra or {})}, **popen)


#: What CpuTorchWorld runs once in its env so that its bytecode is written: the imports of a validation's agent
#: and ranks, and the DDP check's steps in a world of one rank (its store the file named by argv[1]).
WARM_UP = """
import os, sys
import mpi4py, numpy, torch, torch.distributed as dist, torch.distributed.run
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
data = TensorDataset(torch.randn(8, 4), torch.randn(8, 1))
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(4, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in DataLoader(data, batch_size=4, sampler=DistributedSampler(data)):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)  # as the validation payload ends: gloo sometimes aborts in interpreter finalisation
"""


class CpuTorchWorld(UserWorld):
    """A user's world under ``root`` with the validation suite's recipes, and its vcpu env (CPU torch 2.13.0,
    numpy, mpi4py, MPICH from ``index``) created in it, at ``prefix``."""

    def __init__(self, root: Path, index: Any, uv_cache: Path, *, build: bool = True) -> None:
        recipes = str(DATA / "validate-recipes")
        super().__init__(root, mirror_env(index), recipes, USER="u1", UV_CACHE_DIR=str(uv_cache))
        self.prefix = self.scratch / "envbuilder" / "envs" / "vcpu"
        if build:
            res = self.cli("create", "vcpu", "--no-validate", "--json")
            assert res.returncode == 0, res.stderr
            self._write_bytecode()

    @classmethod
    def copy_of(cls, template: Path, root: Path, index: Any, uv_cache: Path) -> CpuTorchWorld:
        """A world of its own at ``root`` holding what the world built at ``template`` holds, as if built there:
        its $SCRATCH (the env, bytecode included) and envbuilder home copied as hard links, then every text file
        that names ``template`` given a rewritten file of its own (the record, activate.csh, the build log), so
        nothing written through one world reaches the other. Tests only read an env's installed files; a file
        they add (a hook, a validation run) is the copy's alone. Costs a second where a build costs ~22 s of
        CPU: the session builds the env once, not once per xdist worker."""
        world = cls(root, index, uv_cache, build=False)
        root.mkdir(parents=True, exist_ok=True)
        for part in ("scratch", "eb-home"):
            subprocess.run(["cp", "-a", "--link", str(template / part), str(root / part)], check=True)
        _repoint([root / "scratch", root / "eb-home"], str(template), str(root))
        return world

    def _write_bytecode(self) -> None:
        """The bytecode of what a validation's processes load, written once here by a one-rank run of the same
        steps (torchrun's agent module, a gloo group, DDP with SGD over a DataLoader, numpy, mpi4py). The worlds
        leave PYTHONDONTWRITEBYTECODE unset, so the env's first run would write it too, but in all its processes
        side by side: torchrun's agent and every rank (six across two nodes) each compiled torch, sympy and dynamo,
        which cost the first two-node run about 35 s of CPU more than the next one."""
        env = {"PATH": self.env["PATH"], "HOME": self.env["HOME"]}  # no PYTHONDONTWRITEBYTECODE
        res = subprocess.run(
            [str(self.prefix / "bin" / "python"), "-c", WARM_UP, str(self.root / "warm-up-store")],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert res.returncode == 0, res.stderr


def share_bytecode(site_packages: Path, cache: Path) -> int:
    """Hard links in uv's ``cache`` to the bytecode an import wrote under ``site_packages``, each beside its source
    file there (the same inode: uv linked that file into the env), so an env uv links from ``cache`` later gets
    it too: uv links every file of a package's directory in its cache. Python checks a .pyc against its source's
    size and mtime, which a hard link shares, and recompiles where they differ (a copy). The number linked."""
    wanted: dict[tuple[int, int], Path] = {}
    for pyc in site_packages.rglob("__pycache__/*.pyc"):
        try:
            st = os.stat(importlib.util.source_from_cache(str(pyc)))
        except (OSError, ValueError):  # no source beside it, or not a name the import system writes
            continue
        if st.st_nlink > 1:
            wanted[(st.st_dev, st.st_ino)] = pyc
    linked = 0
    for top, _dirs, names in os.walk(cache):
        for name in names:
            if not name.endswith(".py"):
                continue
            st = os.stat(os.path.join(top, name))
            pyc = wanted.pop((st.st_dev, st.st_ino), None)
            if pyc is None:
                continue
            target = Path(top) / "__pycache__" / pyc.name
            target.parent.mkdir(exist_ok=True)
            with contextlib.suppress(FileExistsError):
                os.link(pyc, target)
                linked += 1
    return linked


def _repoint(dirs: list[Path], old: str, new: str) -> None:
    """``old`` replaced by ``new`` in the text files under ``dirs`` that name it, each written as a new file
    (a hard link to the original is left as it was). Bytecode is left: only its tracebacks name a path. Not
    envbuilder.system.relocate: it rewrites in place, which would reach the template through the hard links, and only the
    files an env's move needs (not the home's records and logs)."""
    found = subprocess.run(
        ["grep", "-rlF", "--exclude=*.pyc", "--", old, *map(str, dirs)], capture_output=True, text=True
    )
    assert found.returncode in (0, 1), found.stderr  # 1: no file names it
    for name in found.stdout.splitlines():
        path = Path(name)
        data = path.read_bytes()
        if b"\0" in data:
            continue  # not text
        fresh = path.with_name(path.name + ".repoint")
        fresh.write_bytes(data.replace(old.encode(), new.encode()))
        shutil.copymode(path, fresh)
        os.replace(fresh, path)


#: A small DDP program for the `envbuilder run` tests (train.py): gloo on CPU, each rank adds rank + 1 and prints
#: "rank R/WORLD sum=S omp=THREADS"; exits with its first argument, if given.
TRAIN = """\
import os, sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
line = f"rank {dist.get_rank()}/{dist.get_world_size()} sum={t.item():g} omp={os.environ['OMP_NUM_THREADS']}"
sys.stdout.write(line + "\\n")  # one write: the ranks share the pipe
sys.stdout.flush()
dist.barrier()  # no rank tears gloo down while another still talks to it
dist.destroy_process_group()
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""


def run_in(
    world: UserWorld,
    argv: list[str],
    *,
    cwd: Path,
    extra: Optional[dict[str, str]] = None,
    timeout: float = 240,
) -> subprocess.CompletedProcess[str]:
    """``argv`` (the CLI, or a Slurm command wrapping it) in ``world``'s environment, run from ``cwd``."""
    return subprocess.run(
        argv,
        env=cli_env({**world.env, **(extra or {})}),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )


def rank_lines(stdout: str) -> list[str]:
    """The lines TRAIN's ranks printed, sorted."""
    return sorted(line for line in stdout.splitlines() if line.startswith("rank "))


class ValidateWorld:
    """The session's CPU torch env (``cpu_torch_world``), validated in its user's world (test_validate*.py)."""

    def __init__(self, base: CpuTorchWorld) -> None:
        self.root = base.root
        self.env = base.env
        self.prefix = base.prefix
        self.variants: list[str] = []

    def cli(
        self, *args: str, extra: Optional[dict[str, str]] = None, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, env={**self.env, **(extra or {})}, timeout=timeout)

    def validate(
        self, *args: str, extra: Optional[dict[str, str]] = None, timeout: float = 600
    ) -> tuple[subprocess.CompletedProcess[str], Any]:
        """``validate vcpu --json ARGS``: the result and its JSON envelope."""
        res = self.cli("validate", "vcpu", "--json", *args, extra=extra, timeout=timeout)
        try:
            envelope = json.loads(res.stdout)
        except ValueError:
            pytest.fail(f"no JSON (rc {res.returncode}): {res.stderr[-2000:]}")
        return res, envelope

    def variant(self, name: str, edit: Callable[[str], str]) -> str:
        """The vcpu env recorded again under ``name``, with a recipe that ``edit`` derives from vcpu's; returns
        the recipe path to use."""
        home = Path(self.env["ENVBUILDER_HOME"])
        recipes = self.root / f"{name}-recipes"
        recipes.mkdir(exist_ok=True)
        text = (
            (DATA / "validate-recipes" / "vcpu.toml").read_text().replace('name = "vcpu"', f'name = "{name}"')
        )
        (recipes / f"{name}.toml").write_text(edit(text))
        record = state.load(home, "vcpu")
        state.save(home, dataclasses.replace(record, name=name, recipe=name))
        self.variants.append(name)
        return f"{DATA / 'validate-recipes'}:{recipes}"

    def forget_variants(self) -> None:
        """Drop the variants' records: the session's env is vcpu's alone again (a later `create vcpu` finds no
        other env recorded at its prefix)."""
        home = Path(self.env["ENVBUILDER_HOME"])
        for name in self.variants:
            state.record_path(home, name).unlink(missing_ok=True)


#: The module systems' own bookkeeping, which unload rewrites rather than removes (Tcl Environment Modules leave
#: LOADEDMODULES empty, say): their business, not the activation's, so round trips leave it out.
MODULE_BOOKKEEPING = (
    "__LMOD_",
    "_ModuleTable",
    "LMOD_",
    "__MODULES_",
    "MODULES_",
    "_LMFILES_",
    "LOADEDMODULES",
    "BASH_FUNC_",
)


def on_terminal(
    args: tuple[str, ...], env: dict[str, str], width: int, stderr_too: bool = False
) -> tuple[int, str, str]:
    """The CLI with a terminal of ``width`` columns as its stdin and stdout (stderr piped apart, unless
    ``stderr_too``): exit code, what the terminal showed (newlines as written, escape codes kept), stderr."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, width, 0, 0))
    proc = subprocess.Popen(
        cli_argv(*args),
        stdin=slave,
        stdout=slave,
        stderr=slave if stderr_too else subprocess.PIPE,
        env=env,
        cwd=REPO,
        text=True,
    )
    os.close(slave)
    shown = b""
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child is gone and the terminal closed
            break
        if not data:
            break
        shown += data
    os.close(master)
    _, err = proc.communicate(timeout=120)
    err = err or ""
    return proc.returncode, shown.decode().replace("\r\n", "\n"), err
